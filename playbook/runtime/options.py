"""The options of a run, checked once, before any row runs; each error names its option."""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import pandas as pd

from ..errors import PlayDefinitionError, ReceiptError
from ..store import ReceiptStore, default_store
from ..store.fixtures import Fixtures, active
from ..tools.transport import warn_past_file_limit
from .scope import CostBudget

__all__ = ["RunOptions"]


@dataclass(frozen=True, slots=True)
class RunOptions:
    concurrency: int = 16
    on_error: Literal["isolate", "raise"] = "isolate"
    refresh: bool | Literal["rows"] = False
    max_cost: float | CostBudget | None = None  # a CostBudget: one kept elsewhere (a cluster job's, in Redis)
    limit: int | None = None
    key: str | Sequence[str] | None = None
    progress: Literal["auto", "widget", "text"] | bool = "auto"
    background: bool = False
    store: ReceiptStore | str | os.PathLike[str] | None = None
    max_wait: float | None = None
    overwrite: bool = False  # an output may replace the input column of its name (else the row fails, saying so)
    # A fixture file to replay, or a pb.fixtures(...); after parse(), the Fixtures the run uses
    # (its own, the ``with pb.fixtures()`` around it, or $PLAYBOOK_FIXTURES) or None.
    fixtures: Any = None

    @classmethod
    def parse(cls, opts: dict[str, Any]) -> RunOptions:
        names = [f.name for f in fields(cls)]
        for name in opts:
            if name not in names:
                near = difflib.get_close_matches(name, names, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else f"; options are {', '.join(names)}"
                raise PlayDefinitionError(f"unknown run option {name!r}{hint}")
        for name in ("concurrency", "limit"):
            if _whole(opts.get(name)):
                opts = {**opts, name: int(opts[name])}  # numpy's ints too, e.g. limit=df.n.max()
        found = active(opts.get("fixtures"))
        if found is not None and found.mode == "record" and not opts.get("refresh"):
            # A row reused from its memo makes no calls, so none would be recorded: rows run
            # again, from their receipts (which costs nothing).
            opts = {**opts, "refresh": "rows"}
        made = cls(**{**opts, "fixtures": found})
        made._check()
        return made

    def _check(self) -> None:
        def bad(option: str, want: str) -> PlayDefinitionError:
            return PlayDefinitionError(f"{option}={getattr(self, option)!r}: {option} must be {want}")

        if not _whole(self.concurrency) or self.concurrency < 1:
            raise bad("concurrency", "a whole number >= 1")
        warn_past_file_limit(self.concurrency)  # allowed (calls queue for connections), but slower than asked
        if self.on_error not in ("isolate", "raise"):
            raise bad("on_error", "'isolate' (a failed row is data in the result) or 'raise'")
        if not (isinstance(self.refresh, bool) or self.refresh == "rows"):
            raise bad("refresh", "False, 'rows' (run rows again, reuse receipts) or True (pay for every call again)")
        if self.max_cost is not None and not isinstance(self.max_cost, CostBudget) and (not _number(self.max_cost) or self.max_cost < 0):
            raise bad("max_cost", "a number >= 0 or None")
        if self.limit is not None and (not _whole(self.limit) or self.limit < 0):
            raise bad("limit", "a whole number >= 0 or None")
        if not (isinstance(self.progress, bool) or self.progress in ("auto", "widget", "text")):
            raise bad("progress", "'auto', 'widget', 'text', True or False")
        if not isinstance(self.background, bool):
            raise bad("background", "True or False")
        if self.max_wait is not None and (not _number(self.max_wait) or self.max_wait < 0):
            raise bad("max_wait", "a number of seconds >= 0 or None")
        if self.store is not None and not isinstance(self.store, (ReceiptStore, str, os.PathLike)):
            raise bad("store", "a pb.ReceiptStore, a directory path, a redis:// URL or None")

    def key_columns(self, frame: pd.DataFrame) -> list[Any] | None:
        """The key columns, checked against the frame."""
        if self.key is None:
            return None
        labels: set[Any] = set(frame.columns)  # any hashable labels, whatever the stubs infer
        # A tuple that is itself a label (MultiIndex columns) names one column, not several.
        one = isinstance(self.key, str) or not isinstance(self.key, Sequence) or (isinstance(self.key, tuple) and self.key in labels)
        cols = [self.key] if one else list(self.key)
        if not cols:
            raise PlayDefinitionError("key=[]: name at least one column, or pass key=None to use every column")
        missing = [c for c in cols if c not in labels]  # exact labels: "a" is not ("a", "x")
        if missing:
            raise PlayDefinitionError(f"key={self.key!r}: no column {missing[0]!r} in the DataFrame; columns: {list(frame.columns)}")
        return cols

    def open_store(self) -> ReceiptStore:
        """The store to run on; ``ReceiptError`` before anything is paid when it lost its receipts."""
        store = self._store()
        if store.lost is not None:
            raise ReceiptError(store.lost)
        return store

    def _store(self) -> ReceiptStore:
        fixtures: Fixtures | None = self.fixtures
        if self.store is None and fixtures is not None and fixtures.mode == "replay":
            return fixtures.store  # a replay leaves nothing in the project's store
        if isinstance(self.store, ReceiptStore):
            return self.store.for_thread()
        if self.store is None:
            return default_store()
        return ReceiptStore(self.store)


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
