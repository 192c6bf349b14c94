"""``Run``: the handle a user holds on one run: its result, counters, errors; wait, stop, retry."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from collections.abc import Callable, Coroutine, Generator
from html import escape
from typing import Any

import pandas as pd

from playbook._internal.chain import Chain
from playbook._internal.loop import check_blocking, finished, run_sync, schedule
from playbook._internal.renamed import old_attribute, renamed
from playbook.errors import PlayDefinitionError
from playbook.plays.play import Play
from playbook.records import ProviderWait, RunStats
from playbook.runtime.calls.observed import joined
from playbook.runtime.calls.telemetry import Telemetry, telemetry
from playbook.runtime.options import RunOptions
from playbook.runtime.schedule.scheduler import Scheduler
from playbook.runtime.state.eventlog import EventLog
from playbook.runtime.state.reading import ERROR_COLUMNS, LEG_COLUMNS, RunState
from playbook.store import StoreEngine

__all__ = ["Run", "begin_background", "events_of", "execute", "last_run", "remember", "scheduler", "start"]

# The latest run: per task (two runs started in concurrent tasks each see their own), else per
# thread (two threads each blocking on map() each see theirs), else the latest in the process (code
# that started none).  The task's is held weakly: every task and timer the run makes copies the
# context, and a strong reference there would keep a dropped run alive in a cycle through its own
# worker tasks.  The thread's is held strongly, as the process's is: one run per thread at most.
_current: contextvars.ContextVar[weakref.ref[Any] | None] = contextvars.ContextVar(
    "playbook_last_run", default=None
)
_last: Any = None  # a Run, or a cluster's job (a ClusterRun)


class _ThreadRun(threading.local):
    run: Any = None


_thread = _ThreadRun()


def last_run() -> Run | None:
    """The run most recently started in this task, else in this thread, else in this process
    (a ``Run``, or a Dask DataFrame's ``ClusterRun``); ``None`` if none.  Code that starts runs
    concurrently should keep the ``Run`` each returns."""
    if _last is None:  # no run yet (or forgotten, as a test's fixture does): no thread has one either
        return None
    ref = _current.get()
    mine = ref() if ref is not None else None
    if mine is None:
        mine = _thread.run
    latest: Run = mine if mine is not None else _last  # a cluster's job reads as a Run does
    return latest


def remember(run: Any) -> None:
    """``run`` (a ``Run``, or a cluster's ``ClusterRun``, whose reading API is the same) is the
    latest: :func:`last_run` gives it in this task, thread and process."""
    global _last
    _last = run
    _thread.run = run
    if _in_task():
        _current.set(weakref.ref(run))


def _in_task() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:  # no running loop
        return False


_WAIT_INSTEAD = "await df.play.arun(...) without background=True: it returns once the run is done"
_RETRY_INSTEAD = "await df.play.arun(...) again: a rerun runs the failed and parked rows and reuses the rest"


class Run:
    """One run of a play over a DataFrame.  ``run.result``, ``run.stats``, ``run.errors``...

    ``run.retry()`` gives another ``Run``: its ``stats`` count the retry alone (the rows it ran,
    its calls, money and time), ``previous`` is the run it retried (whose stats stay as they
    ended), and its ``result`` has every row, as every run of the chain gives it.  A retry's
    ``errors`` and ``parked`` are the rows it ran; a first run's, any row, as it stands now.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        html: Callable[[RunState], str] | None = None,
        previous: Run | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._state = scheduler.state  # this run's counters: a retry's are its own
        self._task: asyncio.Task[None] | None = None
        self._result: pd.DataFrame | None = None
        self._html = html
        self.previous = previous  # the run this one retried; None for a first run
        # the runs over this frame
        self._chain: Chain[Run] = Chain(self) if previous is None else previous._chain
        self._chain.follow(self)
        self._execution = 0  # which execution of the run this is: 1 for its first retry...
        self.view: Any = None  # the live view the caller attached, if any
        self.log: EventLog | None = None  # where its events go (events=), if anywhere
        self.telemetry: Telemetry | None = None  # its spans and metrics (OpenTelemetry), if configured

    def __repr__(self) -> str:
        s = self.state
        state = "running" if self.running else ("stopped" if s.stopped else "finished")
        return (
            f"<Run {s.play!r} {state}: {s.total} rows, ok={s.ok} reused={s.reused} "
            f"failed={s.failed} parked={s.parked} skipped={s.skipped}, calls {s.calls_executed} paid "
            f"/ {s.calls_shared} shared / {s.calls_reused} from receipts / {s.calls_local} local>"
        )

    def _repr_html_(self) -> str:
        """The run as static HTML (counters, providers, parked rows, errors, waterfalls): what a
        saved or exported notebook keeps of it."""
        if self._html is None:
            return f"<pre>{escape(repr(self))}</pre>"
        return self._html(self.state)

    @property
    def run_id(self) -> str:
        return self._scheduler.run_id

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def state(self) -> RunState:
        """The live counters and the read API views use; views subscribe to it."""
        return self._state

    @property
    def stats(self) -> RunStats:
        return self.state.stats()

    @property
    def result(self) -> pd.DataFrame:
        """The result so far: input rows, output columns, ``play_status``, ``play_error``.  Every
        row, as it stands now: after a retry, each run of the chain gives the same frame."""
        latest = self._chain.latest(self)
        if latest is not self:
            return latest.result
        if self._result is None or self.running:
            frame = self._scheduler.result()
            if self.running:
                return frame
            self._result = frame
        return self._result

    @property
    def waiting_on(self) -> list[ProviderWait]:
        """The providers rows wait on: held (until when) or down (``reason="down"``, ``until`` its
        next probe, ``error`` why); how many rows wait (waiting now, or parked), last status."""
        return self.state.holds()

    def __getattr__(self, name: str) -> Any:
        return old_attribute(self, name, _OLD)

    @property
    def notices(self) -> list[str]:
        """What went wrong with the run as a whole, in words: the store failed or was replaced,
        paid calls whose receipts could not be written (also counted in ``stats.receipts_lost``)."""
        return list(self.state.notices)

    @property
    def waterfalls(self) -> pd.DataFrame:
        """Per waterfall leg: hits, misses, unavailable, errors and how often it was never reached."""
        return pd.DataFrame(self.state.leg_rows(), columns=LEG_COLUMNS)

    @property
    def errors(self) -> pd.DataFrame:
        """Failed rows: index label, position, error message, and its ``group``: the error with the
        values it names masked and where it happened (the play's line, or the tool and HTTP
        status), so ``run.errors.groupby("group")`` counts the rows each bug failed."""
        return pd.DataFrame(self.state.failed_rows(), columns=ERROR_COLUMNS)

    @property
    def parked(self) -> pd.DataFrame:
        """Parked rows: index label, position, why (``hold``, ``down``, ``budget``, ``store``), the
        provider, when it expects to take calls again (UTC; for a down provider, its next probe),
        and the message."""
        frame = pd.DataFrame(
            self.state.parked_rows(), columns=["row", "position", "reason", "provider", "ready_at", "message"]
        )
        frame["ready_at"] = pd.to_datetime(frame["ready_at"], unit="s", utc=True)
        return frame

    def events(self) -> list[dict[str, Any]]:
        """What happened in this run, as it was kept with ``events=``: every call, hold, park and
        row outcome, one dict each, in order (see :mod:`playbook.runtime.state.eventlog` for the
        kinds and fields).  A retry's are its own; ``run.previous.events()``, the run's before."""
        return events_of(self.log, self.run_id, self._execution, "run")

    def wait(self) -> pd.DataFrame:
        """Block until a background run finishes; returns the result."""
        if self._task is not None and not self._task.done():
            check_blocking("run.wait()", _WAIT_INSTEAD)
            run_sync(finished(self._task))
        if self._task is not None and self._task.done() and not self._task.cancelled():
            exc = self._task.exception()
            if exc is not None:
                raise exc
        return self.result

    def __await__(self) -> Generator[Any, None, pd.DataFrame]:
        """``await run``: wait for a background run in async code; gives the result."""
        return self._finish().__await__()

    async def _finish(self) -> pd.DataFrame:
        if self._task is not None and not self._task.done():
            await finished(self._task)
        return self.wait()

    def stop(self) -> None:
        """Stop starting rows: calls already sent land their receipts (a few seconds at most),
        the rows not finished are settled as skipped; finished work stays on disk."""
        self._scheduler.stop()

    def retry(self, *, statuses: tuple[str, ...] = ("failed", "parked")) -> Run:
        """Run the failed and parked rows (or those with ``statuses``) again: blocking, or in the
        background if this run was.  Returns the retry's own :class:`Run`: its ``stats`` count
        what the retry did, its ``previous`` is the run before, its ``result`` has every row.
        While a background run goes on, the rows join it instead, and it is returned; with no
        such rows, the run is returned as it is."""
        if not statuses or any(s not in ("failed", "parked") for s in statuses):
            raise PlayDefinitionError(f"retry(statuses={statuses!r}): retry 'failed' and/or 'parked' rows")
        # a retry follows the latest run over the frame, whichever run was asked
        latest = self._chain.latest(self)
        if latest.running:
            latest._scheduler.admit(latest._scheduler.requeue(statuses))
            latest._result = None
            return latest
        background = latest._task is not None
        if not background:
            check_blocking("run.retry()", _RETRY_INSTEAD)  # before any row is requeued
        again = latest._scheduler.retry(statuses)
        if not again:  # nothing failed or parked: nothing to retry
            return latest
        run = Run(latest._scheduler, html=latest._html, previous=latest)
        if latest.view is not None:
            # the view shows the retry (its own counters) where it showed the run
            latest.view.follow(run.state)
            run.view = latest.view
        if latest.telemetry is not None:
            latest.telemetry.follow(run.state)
            run.telemetry = latest.telemetry
        if latest.log is not None:
            latest.log.follow(run.state)  # the same file, the next execution
            run.log = latest.log
            run._execution = latest.log.execution
        remember(run)
        if background:
            run._task = schedule(run._scheduler.execute(again))
        else:
            run_sync(run._scheduler.execute(again))
        return run


def execute(run: Run) -> Coroutine[Any, Any, None]:
    """The run's first execution, over every row (awaited by ``map``/``amap``)."""
    return run._scheduler.execute()


def scheduler(run: Run) -> Scheduler:
    """The scheduler behind ``run``: what a pilot drives (see :mod:`playbook.runtime.estimate.pilot`)."""
    return run._scheduler


def start(
    frame: pd.DataFrame,
    play: Play,
    opts: RunOptions,
    store: StoreEngine,
    *,
    html: Callable[[RunState], str] | None = None,
    trace: dict[str, str] | None = None,
) -> Run:
    """Create a run (not yet executing) and remember it as ``last_run()``; ``trace``: the trace
    context its spans continue (a cluster job's, for one of its partitions)."""
    run = Run(Scheduler(frame, play, opts, store), html=html)
    if opts.events not in (None, False):
        run.log = EventLog(run.state, opts.events)
    run.telemetry = telemetry(run.state, trace)
    if run.telemetry is not None:
        scope = run._scheduler.scope
        scope.observer = joined(scope.observer, run.telemetry)
    remember(run)
    return run


def begin_background(run: Run) -> Run:
    """Schedule the run's execution on the running loop and return at once."""
    run._task = schedule(execute(run))
    return run


def _holds(run: Run) -> list[ProviderWait]:
    renamed("Run.holds", "Run.waiting_on")  # a down provider is not a hold
    return run.waiting_on


# Deprecated names, served by __getattr__: they work (warning) and dir(run) leaves them out.
_OLD: dict[str, Callable[[Any], Any]] = {"holds": _holds}


def events_of(log: EventLog | None, run_id: str, execution: int, what: str) -> list[dict[str, Any]]:
    """``run.events()`` of a run (or a cluster job) whose events go to ``log``."""
    if log is None:
        raise PlayDefinitionError(
            f"{what}.events(): this run kept no events; start it with events='run.jsonl' (appended to "
            "that file as it goes) or events=True (kept in memory)"
        )
    return log.events(run_id, execution)
