"""``df.play``: run a play over a DataFrame's rows.  Keeps no state (pandas' accessor contract).

This is where a run is put together, in the order data flows: options are checked, the store
opened, the scheduler built over the rows, and the view (widget, text or none) attached to the
run's state.  The runtime below knows nothing of views.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

import pandas as pd

from ._loop import run_sync
from .errors import PlayDefinitionError, interrupted
from .plays import as_play
from .runtime.options import RunOptions
from .runtime.run import Run, begin_background, execute, start
from .store import ReceiptStore
from .store.fixtures import Fixtures
from .tools import Tool
from .ui import Controls, attach_view
from .ui.html import run_html

__all__ = ["PlayAccessor", "called_options", "check_columns"]


@pd.api.extensions.register_dataframe_accessor("play")
class PlayAccessor:
    """``df.play.map(play)`` → DataFrame; ``df.play.run(play)`` → Run; ``amap`` / ``arun`` await."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._frame = frame

    def map(
        self,
        play: Any,
        *,
        concurrency: int = 16,
        on_error: Literal["isolate", "raise"] = "isolate",
        refresh: bool | Literal["rows"] = False,
        max_cost: float | None = None,
        limit: int | None = None,
        key: str | Sequence[str] | None = None,
        progress: Literal["auto", "widget", "text"] | bool = "auto",
        store: ReceiptStore | str | os.PathLike[str] | None = None,
        max_wait: float | None = None,
        overwrite: bool = False,
        fixtures: Fixtures | str | os.PathLike[str] | None = None,
        **unknown: Any,
    ) -> pd.DataFrame:
        """Run ``play`` over every row and return the result DataFrame (blocking).

        ``play``: a ``@pb.play``, an ``async def (row, ctx)``, or a tool (inputs bound from
        same-named columns).
        ``concurrency``: rows in flight at once.
        ``on_error``: ``"isolate"`` (a failed row is data in the result) or ``"raise"``.
        ``refresh``: ``"rows"`` runs finished rows again (reusing receipts); ``True`` pays for
        every call again.
        ``max_cost``: stop paying past this total cost; the rows that would pass it park.
        ``limit``: only the first N rows (the result has N rows).
        ``key``: column(s) naming a row's identity (default: all input values).
        ``progress``: ``"auto"`` (a widget in Jupyter, text elsewhere), ``"widget"``, ``"text"``
        or ``False``.
        ``store``: a ``pb.ReceiptStore``, a directory, or a ``redis://`` URL (default:
        ``$PLAYBOOK_HOME``, else ``.playbook/`` at the top of the project).
        ``max_wait``: seconds a row may wait on provider holds before it parks (default: each
        provider's own).
        ``overwrite``: an output named like an input column replaces it in the rows that return
        it (by default such a row fails, saying so: the input would be lost).
        ``fixtures``: answer every tool call from this fixture file (JSON Lines, from
        ``pb.fixtures(path, mode="record")``) with no network and no pacing; a call it lacks fails
        its row.  A ``pb.fixtures(...)`` object records or replays as its mode says.
        """
        if unknown.get("background"):
            raise PlayDefinitionError("map() returns the finished DataFrame; for a background run use df.play.run(play, background=True)")
        options = called_options(locals())
        return self.run(play, **options).result

    def run(
        self,
        play: Any,
        *,
        concurrency: int = 16,
        on_error: Literal["isolate", "raise"] = "isolate",
        refresh: bool | Literal["rows"] = False,
        max_cost: float | None = None,
        limit: int | None = None,
        key: str | Sequence[str] | None = None,
        progress: Literal["auto", "widget", "text"] | bool = "auto",
        background: bool = False,
        store: ReceiptStore | str | os.PathLike[str] | None = None,
        max_wait: float | None = None,
        overwrite: bool = False,
        fixtures: Fixtures | str | os.PathLike[str] | None = None,
        **unknown: Any,
    ) -> Run:
        """Run ``play`` and return the :class:`Run`; with ``background=True``, return at once
        (the run goes on in the kernel's loop).  The other options are :meth:`map`'s."""
        run, opts = self._start(play, called_options(locals()))
        if opts.background:
            return begin_background(run)
        try:
            run_sync(execute(run))
        except KeyboardInterrupt:
            # Ctrl-C stops the run, not the work: calls in flight land their receipts, finished
            # rows are on disk, the rest are skipped.  The interrupt goes on (a script exits
            # non-zero, Run All stops); pb.last_run() holds the partial run, and a rerun resumes.
            s = run.stats
            raise interrupted(
                f"interrupted: {s.ok + s.reused} of {s.total} rows done, {s.skipped} skipped. What finished is saved: "
                "pb.last_run().result has the partial result, and running the same map again resumes it"
            ) from None
        return run

    async def amap(
        self,
        play: Any,
        *,
        concurrency: int = 16,
        on_error: Literal["isolate", "raise"] = "isolate",
        refresh: bool | Literal["rows"] = False,
        max_cost: float | None = None,
        limit: int | None = None,
        key: str | Sequence[str] | None = None,
        progress: Literal["auto", "widget", "text"] | bool = "auto",
        store: ReceiptStore | str | os.PathLike[str] | None = None,
        max_wait: float | None = None,
        overwrite: bool = False,
        fixtures: Fixtures | str | os.PathLike[str] | None = None,
        **unknown: Any,
    ) -> pd.DataFrame:
        """Async form of :meth:`map` (the same options), except that ``progress="auto"`` outside
        Jupyter shows text only when stderr is a terminal (a server's log stays clean)."""
        if unknown.get("background"):
            raise PlayDefinitionError("amap() returns the finished DataFrame; for a background run use df.play.arun(play, background=True)")
        options = called_options(locals())
        return (await self.arun(play, **options)).result

    async def arun(
        self,
        play: Any,
        *,
        concurrency: int = 16,
        on_error: Literal["isolate", "raise"] = "isolate",
        refresh: bool | Literal["rows"] = False,
        max_cost: float | None = None,
        limit: int | None = None,
        key: str | Sequence[str] | None = None,
        progress: Literal["auto", "widget", "text"] | bool = "auto",
        background: bool = False,
        store: ReceiptStore | str | os.PathLike[str] | None = None,
        max_wait: float | None = None,
        overwrite: bool = False,
        fixtures: Fixtures | str | os.PathLike[str] | None = None,
        **unknown: Any,
    ) -> Run:
        """Async form of :meth:`run` (the same options), except that ``progress="auto"`` outside
        Jupyter shows text only when stderr is a terminal (a server's log stays clean)."""
        run, opts = self._start(play, called_options(locals()), awaited=True)
        if opts.background:
            return begin_background(run)
        await execute(run)
        return run

    def _start(self, play: Any, options: dict[str, Any], *, awaited: bool = False) -> tuple[Run, RunOptions]:
        opts = RunOptions.parse(options)
        the_play = as_play(play)
        check_columns(self._frame, play, opts)
        frame = self._frame if opts.limit is None else self._frame.iloc[: opts.limit]  # the first N rows, as head(N)
        run = start(frame, the_play, opts, opts.open_store(), html=run_html)
        controls = _controls(run) if opts.background else None
        run.view = attach_view(run.state, opts.progress, background=opts.background, controls=controls, awaited=awaited)
        return run, opts


def called_options(given: dict[str, Any]) -> dict[str, Any]:
    """The run options a method was called with: its keyword parameters, and any unknown ones
    (RunOptions names those, with a "did you mean")."""
    options = {name: value for name, value in given.items() if name not in ("self", "play", "unknown", "options", "given")}
    return {**options, **given["unknown"]}


def _controls(run: Run) -> Controls:
    """What a background run's buttons do.  A blocking run keeps the kernel busy, so a click would
    only be handled after it: its view gets none."""
    return Controls(stop=run.stop, retry=lambda status: run.retry(statuses=(status,)))


def check_columns(frame: Any, play: Any, opts: RunOptions) -> None:
    """Before anything runs: the frame's columns (a pandas or a Dask frame's) name each one
    column, hold every input a tool mapped directly binds, and the ``key`` columns."""
    columns = frame.columns
    if not columns.is_unique:
        # row.<name> and the result's columns would be ambiguous: say so before anything runs.
        twice = list(dict.fromkeys(columns[columns.duplicated()]))
        raise PlayDefinitionError(
            f"the DataFrame has more than one column named {', '.join(map(repr, twice))}, so row[...] would be "
            "ambiguous; rename them (df.columns = [...]) or drop the copies (df.loc[:, ~df.columns.duplicated()])"
        )
    if isinstance(play, Tool):
        _check_tool(columns, play)
    opts.key_columns(frame)


def _check_tool(columns: Any, tool: Tool) -> None:
    """A tool mapped directly needs a column per parameter."""
    if tool.batch_size is not None:
        raise PlayDefinitionError(
            f"batch tool {tool.name!r} takes free-form inputs, so it cannot bind them from columns: "
            f"call it from a play, e.g. await ctx.tool({tool.name}, domain=row.domain)"
        )
    missing = [p for p in tool.params if p not in columns]
    if missing:
        raise PlayDefinitionError(
            f"tool {tool.name!r} binds its inputs from columns, but the DataFrame has no column "
            f"{', '.join(repr(m) for m in missing)}; columns: {list(columns)}"
        )
