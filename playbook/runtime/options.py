"""The options of a run: declared once here, checked once, before any row runs; each error names
its option.

:class:`RunOptions` is the one declaration.  Each field carries its help text and how it is
spelled as a flag (:class:`Option`); every surface is derived from it
(:mod:`playbook.frontends.signature`): the keyword arguments of ``df.play.map`` and its siblings
on pandas, Polars and Dask frames, the ``%%play`` flags and the command line's, with the same help
everywhere.  A test fails when a surface drifts.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import pandas as pd

from playbook._internal.argtypes import amount, cap, columns, place, whole
from playbook._internal.renamed import renamed
from playbook.errors import PlayDefinitionError, ReceiptError
from playbook.runtime.calls.level import START
from playbook.runtime.calls.scope import CostBudget
from playbook.store import ReceiptStore, StoreEngine, default_store, engine
from playbook.store.fixtures import Fixtures, active
from playbook.tools.transport import warn_past_file_limit

__all__ = ["RENAMED", "SURFACES", "Option", "RunOptions", "options"]

# Where an option is offered: map()/amap() (and their Polars and Dask forms), run()/arun(), the
# %%play magic, the command line.
SURFACES = ("map", "run", "magic", "cli")

# Options that were renamed: the old name still works for one release, with a DeprecationWarning
# naming the new one (a flag's old spelling too: signature.flags).
RENAMED = {"key": "id_columns"}


@dataclass(frozen=True, slots=True)
class Option:
    """How a run option is described and spelled outside Python."""

    help: str
    metavar: str | None = None  # None: a switch (--overwrite), or an optional value (see ``bare``)
    # the flag's text to a value; argparse names the flag when it fails
    text: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    bare: str | None = None  # the value of the flag given alone (--refresh means --refresh rows)
    surfaces: tuple[str, ...] = SURFACES


def _option(default: Any, help: str, **spelling: Any) -> Any:
    return field(default=default, metadata={"option": Option(help, **spelling)})


@dataclass(frozen=True, slots=True)
class RunOptions:
    concurrency: int | None = _option(
        None,
        "rows in flight at once, at most (default: 16, growing while every provider the rows call has room, up to 256)",
        metavar="N",
        text=whole(1),
    )
    on_error: Literal["isolate", "raise"] = _option(
        "isolate",
        "isolate: a failed row is data in the result; raise: the first failure stops the run",
        choices=("isolate", "raise"),
    )
    refresh: bool | Literal["rows", "all"] = _option(
        False,
        "run finished rows again: rows reuses their receipts, all pays for every call again",
        choices=("rows", "all"),
        bare="rows",
    )
    max_cost: float | None = _option(
        None, "stop paying past this total cost; the rows that would pass it park", metavar="X", text=cap
    )
    limit: int | None = _option(
        None, "run only the first N rows (the result has N rows)", metavar="N", text=whole(0)
    )
    id_columns: str | Sequence[str] | None = _option(
        None,
        "the column(s) whose values are a row's identity, its row id (default: all its values)",
        metavar="COLS",
        text=columns,
    )
    progress: Literal["auto", "widget", "text", "none"] | bool = _option(
        "auto",
        "auto (a widget in Jupyter or marimo, text elsewhere), widget, text or none",
        choices=("auto", "widget", "text", "none"),
    )
    background: bool = _option(
        False, "return at once; the run goes on in the kernel's loop", surfaces=("run", "magic")
    )
    store: ReceiptStore | str | os.PathLike[str] | None = _option(
        None,
        "where receipts are kept: a directory or a redis:// URL (default: $PLAYBOOK_HOME, else .playbook/ in the project)",
        metavar="PATH|URL",
        text=place,
    )
    max_wait: float | None = _option(
        None,
        "seconds a row may wait on provider holds before it parks (default: each provider's own)",
        metavar="S",
        text=amount,
    )
    overwrite: bool = _option(
        False, "an output named like an input column replaces it (else its rows fail, saying so)"
    )
    fixtures: Fixtures | str | os.PathLike[str] | None = _option(
        None, "answer every tool call from this fixture file: no network, no pacing", metavar="FILE"
    )
    estimate: bool = _option(
        False,
        "first run a pilot on 20 rows, show what the rest will cost and take, and ask before going on (--yes on the command line)",
    )
    events: str | os.PathLike[str] | bool | Callable[[dict[str, Any]], Any] | None = _option(
        None,
        "keep every call, hold and row outcome as JSON Lines: appended to this file as the run goes (True in Python: kept in memory; a function: handed each one); run.events() reads them back",
        metavar="FILE",
    )
    # Not options: what parse() makes of them.  The cost budget the run spends from: its own, or
    # one kept elsewhere (a cluster job's, in Redis).
    budget: CostBudget | None = None
    # The fixtures the run answers from: its own, the ``with pb.fixtures()`` around it, or
    # $PLAYBOOK_FIXTURES; None when there are none.
    replaying: Fixtures | None = None

    @classmethod
    def parse(cls, given: Mapping[str, Any]) -> RunOptions:
        opts = _new_names(given)
        names = [f.name for f in options()]
        for name in opts:
            if name not in names:
                near = difflib.get_close_matches(name, names, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else f"; options are {', '.join(names)}"
                raise PlayDefinitionError(f"unknown run option {name!r}{hint}")
        for name in ("concurrency", "limit"):
            if _whole(opts.get(name)):
                opts = {**opts, name: int(opts[name])}  # numpy's ints too, e.g. limit=df.n.max()
        # The words a flag takes are values here too: refresh="all" is True, progress="none" False.
        if opts.get("refresh") == "all":
            opts = {**opts, "refresh": True}
        if opts.get("progress") == "none":
            opts = {**opts, "progress": False}
        found = active(opts.get("fixtures"))
        if found is not None and found.mode == "record" and not opts.get("refresh"):
            # A row reused from its memo makes no calls, so none would be recorded: rows run
            # again, from their receipts (which costs nothing).
            opts = {**opts, "refresh": "rows"}
        made = cls(**opts, replaying=found)
        made._check()
        return made

    def _check(self) -> None:
        def bad(option: str, want: str) -> PlayDefinitionError:
            return PlayDefinitionError(f"{option}={getattr(self, option)!r}: {option} must be {want}")

        if self.concurrency is not None:
            if not _whole(self.concurrency) or self.concurrency < 1:
                raise bad("concurrency", "a whole number >= 1 or None (the run finds its level)")
            # allowed (calls queue for connections), but slower than asked
            warn_past_file_limit(self.concurrency)
        if self.on_error not in ("isolate", "raise"):
            raise bad("on_error", "'isolate' (a failed row is data in the result) or 'raise'")
        if not (isinstance(self.refresh, bool) or self.refresh == "rows"):
            raise bad(
                "refresh",
                "False, 'rows' (run rows again, reuse receipts) or 'all' / True (pay for every call again)",
            )
        if self.max_cost is not None and (not _number(self.max_cost) or self.max_cost < 0):
            raise bad("max_cost", "a number >= 0 or None (None: no limit)")
        if self.limit is not None and (not _whole(self.limit) or self.limit < 0):
            raise bad("limit", "a whole number >= 0 or None")
        if not (isinstance(self.progress, bool) or self.progress in ("auto", "widget", "text")):
            raise bad("progress", "'auto', 'widget', 'text', 'none', True or False")
        if not isinstance(self.background, bool):
            raise bad("background", "True or False")
        if not isinstance(self.estimate, bool):
            raise bad("estimate", "True or False")
        events = self.events
        kept = events is None or isinstance(events, (bool, str, os.PathLike))
        if not kept and not callable(events):
            raise bad(
                "events",
                "a file to append JSON Lines to ('run.jsonl'), True (kept in memory), a function "
                "handed each event, or None",
            )
        if isinstance(events, str) and not events.strip():
            raise bad("events", "a file name, not empty")
        if self.max_wait is not None and (not _number(self.max_wait) or self.max_wait < 0):
            raise bad("max_wait", "a number of seconds >= 0 or None")
        # would be the current directory, unasked
        empty = isinstance(self.store, str) and not self.store.strip()
        if empty or (self.store is not None and not isinstance(self.store, (ReceiptStore, str, os.PathLike))):
            raise bad(
                "store",
                "a pb.ReceiptStore, a directory path, a redis:// URL or None (the default store), not empty",
            )

    def rows_at_once(self) -> int:
        """The rows in flight a run starts with: the ``concurrency`` given, else the level it starts at."""
        return self.concurrency if self.concurrency is not None else START

    def cost_budget(self) -> CostBudget:
        """What the run's paid calls are counted against: the budget given, else one of ``max_cost``."""
        return self.budget if self.budget is not None else CostBudget(self.max_cost)

    def row_id_columns(self, frame: pd.DataFrame) -> list[Any] | None:
        """The columns of the row id (``id_columns``), checked against the frame; ``None``: all."""
        given = self.id_columns
        if given is None:
            return None
        labels: set[Any] = set(frame.columns)  # any hashable labels, whatever the stubs infer
        # A tuple that is itself a label (MultiIndex columns) names one column, not several.
        one = (
            isinstance(given, str)
            or not isinstance(given, Sequence)
            or (isinstance(given, tuple) and given in labels)
        )
        cols = [given] if one else list(given)
        if not cols:
            raise PlayDefinitionError(
                "id_columns=[]: name at least one column, or pass id_columns=None to use every column"
            )
        missing = [c for c in cols if c not in labels]  # exact labels: "a" is not ("a", "x")
        if missing:
            raise PlayDefinitionError(
                f"id_columns={given!r}: no column {missing[0]!r} in the DataFrame; columns: {list(frame.columns)}"
            )
        return cols

    def open_store(self) -> StoreEngine:
        """The store to run on; ``ReceiptError`` before anything is paid when it lost its receipts.
        Checked at each run, not only when the store was opened: a store kept open (the default
        one, a kernel's ``ReceiptStore``) may have lost its receipts since its last run, or been
        reset from another process (``cache accept-loss``)."""
        store = self._store()
        if not store.backend.readonly:
            store.lost = store.check_mark()
        if store.lost is not None:
            raise ReceiptError(store.lost)
        return store

    def _store(self) -> StoreEngine:
        fixtures = self.replaying
        if self.store is None and fixtures is not None and fixtures.mode == "replay":
            return fixtures.store  # a replay leaves nothing in the project's store
        if isinstance(self.store, ReceiptStore):
            return engine(self.store).for_thread()
        if self.store is None:
            return default_store()
        return StoreEngine(self.store)


def _new_names(given: Mapping[str, Any]) -> dict[str, Any]:
    """The options under their names now: an old name warns (naming the new one) and is read as
    the new; both given at once is an error."""
    opts = dict(given)
    for old, new in RENAMED.items():
        if old not in opts:
            continue
        if new in opts:
            raise PlayDefinitionError(f"{old}= and {new}= name one option: pass only {new}=")
        renamed(f"the run option {old}=", f"{new}=")
        opts[new] = opts.pop(old)
    return opts


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def options(surface: str | None = None) -> list[Any]:
    """The run options (dataclass fields with their :class:`Option`), in declared order; those
    offered on ``surface`` when one is named."""
    found = [f for f in fields(RunOptions) if "option" in f.metadata]
    return [f for f in found if surface is None or surface in f.metadata["option"].surfaces]
