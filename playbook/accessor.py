"""``df.play``: run a play over a DataFrame's rows.  Keeps no state (pandas' accessor contract)."""

from __future__ import annotations

import sys
from typing import Any

import pandas as pd

from ._loop import run_sync
from .errors import PlayDefinitionError
from .plays import as_play
from .runtime.options import RunOptions
from .runtime.run import Run, begin_background, start
from .runtime.scheduler import check_columns
from .tools import Tool

__all__ = ["PlayAccessor"]


@pd.api.extensions.register_dataframe_accessor("play")
class PlayAccessor:
    """``df.play.map(play)`` → DataFrame; ``df.play.run(play)`` → Run; ``amap`` / ``arun`` await."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._frame = frame

    def map(self, play: Any, **options: Any) -> pd.DataFrame:
        """Run ``play`` over every row and return the result DataFrame (blocking)."""
        if options.get("background"):
            raise PlayDefinitionError("map() returns the finished DataFrame; for a background run use df.play.run(play, background=True)")
        return self.run(play, **options).result

    def run(self, play: Any, **options: Any) -> Run:
        """Run ``play`` and return the :class:`Run`; with ``background=True``, return at once."""
        run = self._start(play, options)
        if run._maprun.opts.background:
            return begin_background(run)
        try:
            run_sync(run._execute())
        except KeyboardInterrupt:
            # Ctrl-C stops the run, not the work: what finished is on disk and comes back as
            # the partial result, with every other row marked skipped.  A rerun resumes.
            s = run.stats
            print(
                f"interrupted: {s.ok + s.reused} of {s.total} rows done, {s.skipped} skipped; "
                "finished work is saved, and running the same map again resumes it",
                file=sys.stderr,
            )
        return run

    async def amap(self, play: Any, **options: Any) -> pd.DataFrame:
        """Async form of :meth:`map`."""
        if options.get("background"):
            raise PlayDefinitionError("amap() returns the finished DataFrame; for a background run use df.play.arun(play, background=True)")
        return (await self.arun(play, **options)).result

    async def arun(self, play: Any, **options: Any) -> Run:
        """Async form of :meth:`run`."""
        run = self._start(play, options)
        if run._maprun.opts.background:
            return begin_background(run)
        await run._execute()
        return run

    def _start(self, play: Any, options: dict[str, Any]) -> Run:
        opts = RunOptions.parse(options)
        the_play = as_play(play)
        columns = self._frame.columns
        if not columns.is_unique:
            # row.<name> and the result's columns would be ambiguous: say so before anything runs.
            twice = list(dict.fromkeys(columns[columns.duplicated()]))
            raise PlayDefinitionError(
                f"the DataFrame has more than one column named {', '.join(map(repr, twice))}, so row[...] would be "
                "ambiguous; rename them (df.columns = [...]) or drop the copies (df.loc[:, ~df.columns.duplicated()])"
            )
        if isinstance(play, Tool):
            check_columns(self._frame, play)
        opts.key_columns(self._frame)
        return start(self._frame, the_play, opts)
