"""``df.play``: run a play over a DataFrame's rows.  Keeps no state (pandas' accessor contract).

This is where a run is put together, in the order data flows: options are checked, the store
opened, the scheduler built over the rows, and the view (widget, text or none) attached to the
run's state.  The runtime below knows nothing of views.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Unpack

import pandas as pd

from playbook._internal.loop import run_sync
from playbook.errors import PlayDefinitionError, interrupted
from playbook.frontends.asking import go_on
from playbook.frontends.signature import run_signature
from playbook.plays.play import PlayLike, as_play
from playbook.records import STATUS_COLUMNS, STATUSES
from playbook.runtime.estimate.projection import PILOT_ROWS, Estimate, declined, pilot_estimate
from playbook.runtime.options import RunOptions
from playbook.runtime.run import Run, begin_background, execute, start
from playbook.tools import Tool, engine_of
from playbook.ui import Controls, attach_view
from playbook.ui.html import run_html

if TYPE_CHECKING:
    from playbook.frontends._kwargs import MapKwargs, RunKwargs

__all__ = ["PlayAccessor", "check_columns", "refuse_background"]


class PlayAccessor:
    """``df.play.map(play)`` → DataFrame; ``df.play.run(play)`` → Run; ``amap`` / ``arun`` await."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._frame = frame

    @run_signature("map")
    def map(self, play: PlayLike, **options: Unpack[MapKwargs]) -> pd.DataFrame:
        """Run ``play`` over every row and return the result DataFrame (blocking).

        ``play``: a ``@pb.play``, an ``async def (row, ctx)``, or a tool (inputs bound from
        same-named columns).  The result has the input rows in order, the play's output columns,
        ``play_status`` and ``play_error``.
        """
        refuse_background(
            options,
            "map() returns the finished DataFrame; for a background run use df.play.run(play, background=True)",
        )
        return self.run(play, **options).result

    @run_signature("run")
    def run(self, play: PlayLike, **options: Unpack[RunKwargs]) -> Run:
        """Run ``play`` and return the :class:`Run`; with ``background=True``, return at once
        (the run goes on in the kernel's loop)."""
        if options.get("estimate"):
            return self._asked(play, dict(options))
        run, opts = self._start(play, options)
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

    @run_signature("map")
    async def amap(self, play: PlayLike, **options: Unpack[MapKwargs]) -> pd.DataFrame:
        """Async form of :meth:`map`, except that ``progress="auto"`` outside Jupyter shows text
        only when stderr is a terminal (a server's log stays clean)."""
        refuse_background(
            options,
            "amap() returns the finished DataFrame; for a background run use df.play.arun(play, background=True)",
        )
        return (await self.arun(play, **options)).result

    @run_signature("run")
    async def arun(self, play: PlayLike, **options: Unpack[RunKwargs]) -> Run:
        """Async form of :meth:`run`, except that ``progress="auto"`` outside Jupyter shows text
        only when stderr is a terminal (a server's log stays clean)."""
        run, opts = self._start(play, options, awaited=True)
        if opts.background:
            return begin_background(run)
        await execute(run)
        return run

    @run_signature("map")
    def estimate(
        self,
        play: PlayLike,
        sample: int = 20,
        *,
        seed: int | None = 0,
        first: bool = False,
        precision: float | None = None,
        **options: Unpack[MapKwargs],
    ) -> Estimate:
        """Run a pilot of ``play`` on ``sample`` of the rows a run would run, and project what the
        run will pay and take for the rest: an :class:`~playbook.Estimate`.

        The sample is drawn at random (``seed``), or is the first rows (``first=True``); rows
        answered by their memos are left out and count as done.  The pilot's calls are paid for
        and become receipts, and its finished rows memos: the run reuses them.  With
        ``precision`` (0.15: ±15%), the pilot goes on, ``sample`` rows at a time (up to ten times
        as many), while the money's interval is wider than that.  Options are ``map()``'s
        (``concurrency`` sets the rows in flight the projection assumes).
        """
        refuse_background(
            options,
            "estimate() runs a pilot and returns its Estimate; run the play with df.play.run(play, background=True)",
        )
        if options.get("estimate"):
            raise PlayDefinitionError(
                "estimate(..., estimate=True): estimate() is the pilot already; estimate=True is map()'s and run()'s"
            )
        return self._pilot(play, options, sample, seed=seed, first=first, precision=precision)[1]

    def _pilot(
        self,
        play: PlayLike,
        options: Mapping[str, Any],
        sample: int,
        *,
        seed: int | None = 0,
        first: bool = False,
        precision: float | None = None,
    ) -> tuple[Run, Estimate]:
        if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
            raise PlayDefinitionError(
                f"estimate(sample={sample!r}): the rows to run as a pilot, a whole number >= 1"
            )
        if precision is not None and (
            isinstance(precision, bool) or not isinstance(precision, (int, float)) or not 0 < precision < 1
        ):
            raise PlayDefinitionError(
                f"estimate(precision={precision!r}): how close the money's interval must come, a share such as 0.15"
            )
        run, opts = self._start(play, options)
        try:
            return run, run_sync(
                pilot_estimate(run, opts.rows_at_once(), sample, seed=seed, first=first, precision=precision)
            )
        except KeyboardInterrupt:
            raise interrupted(
                "interrupted: the pilot stopped; what it paid for is saved and reused by the run"
            ) from None

    def _asked(self, play: PlayLike, options: dict[str, Any]) -> Run:
        """``estimate=True``: the pilot, its estimate shown, then the question; the run goes on
        if the answer is yes, else the pilot's run is returned (the rows it did not run skipped).
        With nothing left to run, the pilot's run is returned: it settled every row."""
        options.pop("estimate")
        background = options.pop("background", False)
        pilot, estimate = self._pilot(play, options, PILOT_ROWS)
        rest = go_on(estimate, options)
        if rest is not None and not estimate.rows_left:
            # every row is done (by memos, or by the pilot): the pilot's run is the whole run, already shown
            return pilot
        if rest is not None:
            return self.run(play, **rest, background=background)
        declined(pilot)
        return pilot

    def _start(
        self, play: PlayLike, options: Mapping[str, Any], *, awaited: bool = False
    ) -> tuple[Run, RunOptions]:
        opts = RunOptions.parse(options)
        the_play = as_play(play)
        check_columns(self._frame, play, opts)
        # the first N rows, as head(N)
        frame = self._frame if opts.limit is None else self._frame.iloc[: opts.limit]
        run = start(frame, the_play, opts, opts.open_store(), html=run_html)
        controls = _controls(run) if opts.background else None
        run.view = attach_view(
            run.state, opts.progress, background=opts.background, controls=controls, awaited=awaited
        )
        return run, opts


def refuse_background(options: Mapping[str, Any], message: str) -> None:
    """``map()`` and ``amap()`` return the finished frame: ``background=True`` is for ``run()``."""
    if options.get("background"):
        raise PlayDefinitionError(message)


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
    _check_reserved(frame)
    if isinstance(play, Tool):
        _check_tool(columns, play)
    opts.row_id_columns(frame)


def _check_reserved(frame: Any) -> None:
    """A frame with a column playbook writes is an earlier run's result (both columns, every
    status one playbook gives; a Dask frame's values are not read for this), or the user's column
    would be silently replaced: refused, naming it."""
    present = [name for name in STATUS_COLUMNS if name in frame.columns]
    if not present:
        return
    if len(present) == len(STATUS_COLUMNS):
        if not isinstance(frame, pd.DataFrame):
            return
        odd = frame["play_status"][~frame["play_status"].isin(STATUSES) & frame["play_status"].notna()]
        if odd.empty:
            return
        why = f"its value {odd.iloc[0]!r} in row {odd.index[0]!r} is not a status playbook gives"
    else:
        why = f"without {', '.join(repr(n) for n in STATUS_COLUMNS if n not in present)} it is not an earlier run's result"
    name = present[0]
    raise PlayDefinitionError(
        f"the DataFrame has a column {name!r}, which playbook writes (each row's status and error), and {why}: rename it, "
        f"e.g. df.rename(columns={{{name!r}: 'my_{name.removeprefix('play_')}'}}) (an earlier run's result, with both "
        "play_status and play_error as playbook wrote them, may be run again as it is)"
    )


def _check_tool(columns: Any, tool: Tool[Any]) -> None:
    """A tool mapped directly needs a column per input (one with a default aside)."""
    engine = engine_of(tool)
    if engine.batch_size is not None:
        raise PlayDefinitionError(
            f"batch tool {tool.name!r} takes free-form inputs, so it cannot bind them from columns: "
            f"call it from a play, e.g. await ctx.tool({tool.name}, domain=row.domain)"
        )
    missing = [p for p in tool.inputs if p not in columns and p not in engine.defaults]
    if missing:
        raise PlayDefinitionError(
            f"tool {tool.name!r} binds its inputs from columns, but the DataFrame has no column "
            f"{', '.join(repr(m) for m in missing)}; columns: {list(columns)}"
        )
