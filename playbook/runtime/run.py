"""``Run``: the handle a user holds on one run: its result, counters, errors; wait, stop, retry."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pandas as pd

from .._loop import run_sync, running_loop
from ..errors import PlayDefinitionError
from ..models import ProviderHold, RunStats
from ..plays import Play
from ..store import ReceiptStore
from ..ui import attach_view
from .options import RunOptions
from .scheduler import MapRun
from .state import LEG_COLUMNS

__all__ = ["Run", "last_run", "start"]

_last: Run | None = None


def last_run() -> Run | None:
    """The most recently started run in this process, or ``None``."""
    return _last


class Run:
    """One run of a play over a DataFrame.  ``run.result``, ``run.stats``, ``run.errors``..."""

    def __init__(self, maprun: MapRun) -> None:
        self._maprun = maprun
        self._task: asyncio.Task[None] | None = None
        self._result: pd.DataFrame | None = None
        self.view = attach_view(self, maprun.opts.progress)

    def __repr__(self) -> str:
        s = self._maprun.state
        state = "running" if self.running else ("stopped" if s.stopped else "finished")
        return (
            f"<Run {self._maprun.play.name!r} {state}: {s.total} rows, ok={s.ok} reused={s.reused} "
            f"failed={s.failed} parked={s.parked} skipped={s.skipped}, calls {s.calls_executed} paid "
            f"/ {s.calls_reused} reused / {s.calls_local} local>"
        )

    def _repr_html_(self) -> str:
        """The run as static HTML (counters, providers, parked rows, errors, waterfalls): what a
        saved or exported notebook keeps of it."""
        from ..ui.html import run_html

        return run_html(self)

    @property
    def run_id(self) -> str:
        return self._maprun.run_id

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def state(self) -> Any:
        """The live counters (a ``RunState``); views subscribe to it."""
        return self._maprun.state

    @property
    def stats(self) -> RunStats:
        return self._maprun.state.stats()

    @property
    def result(self) -> pd.DataFrame:
        """The result so far: input rows, output columns, ``play_status``, ``play_error``."""
        if self._result is None or self.running:
            frame = self._maprun.result()
            if self.running:
                return frame
            self._result = frame
        return self._result

    @property
    def holds(self) -> list[ProviderHold]:
        """Providers holding rows back: until when, how many rows wait (held or parked), last status;
        a provider that is down too (``reason="down"``, ``until`` its next probe, ``error`` why)."""
        m = self._maprun
        now = time.time()
        held = Counter(m._held.waiting_on.values())
        parked = Counter(m.park_provider[p] for p, s in enumerate(m.status) if s == "parked" and m.park_provider[p])
        out = []
        for name, provider in m.state.providers.items():
            if provider.down:
                reason, until, error = "down", provider.probe_at or None, provider.down_error
            else:
                reason, until, error = "hold", provider.hold_wall if provider.hold_wall > now else None, None
            if held[name] or parked[name] or until is not None or reason == "down":
                out.append(
                    ProviderHold(
                        provider=name,
                        until=until,
                        waiting_rows=held[name] + parked[name],
                        parked_rows=parked[name],
                        last_status=provider.last_status,
                        reason=reason,
                        error=error,
                    )
                )
        return out

    @property
    def notices(self) -> list[str]:
        """What went wrong with the run as a whole, in words: the store failed or was replaced,
        paid calls whose receipts could not be written (also counted in ``stats.receipts_lost``)."""
        return list(self._maprun.state.notices)

    @property
    def waterfalls(self) -> pd.DataFrame:
        """Per waterfall leg: hits, misses, unavailable, errors and how often it was never reached."""
        return pd.DataFrame(self._maprun.state.leg_rows(), columns=LEG_COLUMNS)

    @property
    def errors(self) -> pd.DataFrame:
        """Failed rows: index label, position, error message."""
        m = self._maprun
        rows = [(m._labels[p], p, m.errors[p]) for p, s in enumerate(m.status) if s == "failed"]
        return pd.DataFrame(rows, columns=["row", "position", "error"])

    @property
    def parked(self) -> pd.DataFrame:
        """Parked rows: index label, position, why (``hold``, ``down``, ``budget``), the provider, when
        it expects to take calls again (UTC; for a down provider, its next probe), and the message."""
        m = self._maprun
        rows = [
            (m._labels[p], p, m.park_reason[p], m.park_provider[p], m.park_ready[p], m.errors[p])
            for p, s in enumerate(m.status)
            if s == "parked"
        ]
        frame = pd.DataFrame(rows, columns=["row", "position", "reason", "provider", "ready_at", "message"])
        frame["ready_at"] = pd.to_datetime(frame["ready_at"], unit="s", utc=True)
        return frame

    def wait(self) -> pd.DataFrame:
        """Block until a background run finishes; returns the result."""
        if self._task is not None and not self._task.done():
            run_sync(_await(self._task))
        if self._task is not None and self._task.done() and not self._task.cancelled():
            exc = self._task.exception()
            if exc is not None:
                raise exc
        return self.result

    def stop(self) -> None:
        """Stop starting rows: calls already sent land their receipts (a few seconds at most),
        the rows not finished are settled as skipped; finished work stays on disk."""
        self._maprun.stop()

    def retry(self, *, statuses: tuple[str, ...] = ("failed", "parked")) -> Run:
        """Run the failed and parked rows (or those with ``statuses``) again: blocking, or in the
        background if this run was; while a background run goes on, they join it."""
        if not statuses or any(s not in ("failed", "parked") for s in statuses):
            raise PlayDefinitionError(f"retry(statuses={statuses!r}): retry 'failed' and/or 'parked' rows")
        again = self._maprun.requeue(statuses)
        self._result = None
        if self.running:
            self._maprun.admit(again)
        elif self._task is not None:
            self._task = _schedule(self._maprun.execute(again))
        else:
            run_sync(self._maprun.execute(again))
        return self

    async def _execute(self) -> None:
        await self._maprun.execute()


async def _await(task: asyncio.Task[None]) -> None:
    await asyncio.wait([task])


def _schedule(coro: Any) -> asyncio.Task[None]:
    loop = running_loop()
    if loop is None:
        coro.close()
        raise PlayDefinitionError(
            "background=True needs a running event loop (a Jupyter kernel or async code); "
            "in a script, use df.play.map(...) or await df.play.arun(...)"
        )
    return loop.create_task(coro)


def start(frame: pd.DataFrame, play: Play, opts: RunOptions) -> Run:
    """Create a run (not yet executing) and remember it as ``last_run()``."""
    global _last
    store: ReceiptStore = opts.open_store()
    run = Run(MapRun(frame, play, opts, store))
    _last = run
    return run


def begin_background(run: Run) -> Run:
    run._task = _schedule(run._execute())
    return run
