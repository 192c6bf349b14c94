"""The scheduler: runs a play over the rows of a DataFrame, on the local event loop.

Rows are identified by a digest of their key values; rows with the same key run once and share
the outcome.  A row whose memo exists (same play fingerprint, same key) is settled as
``reused`` without running.  The rest run on workers, as many as the run's level of rows in
flight (``level``: the ``concurrency`` given, or one found while the run goes).  Every change of
a row is an event; :class:`~playbook.runtime.state.reading.RunState` counts them and views
subscribe to it.

The pieces, each in its module: the rows table (``rows.table``) and memos (``rows.memos``); in
this room the waiting queue (``retry_queue``), the workers (``workers``), one row's attempt
(``attempt``), how it ends (``outcomes``) and rows parked on a down provider coming back
(``recovery``); what a row's calls may use of the run (``calls.scope``), the call pipeline
(``calls.pipeline``) and the level of rows in flight (``calls.level``).  This class wires them and
runs executions: the first over every row, then any ``run.retry()``, each counted by a
:class:`RunState` of its own (:meth:`Scheduler.retry`).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from playbook._internal.collection import fewer_collections
from playbook._internal.flow import WaitBudget
from playbook.events import Event, ProviderUp, RunCounted, RunFinished, RunNotice, RunStarted
from playbook.plays.play import Play
from playbook.runtime.calls.level import Level
from playbook.runtime.calls.scope import RunScope, Tickets
from playbook.runtime.options import RunOptions
from playbook.runtime.rows.memos import finish_store, reuse
from playbook.runtime.rows.table import RowTable
from playbook.runtime.schedule.attempt import RowRunner
from playbook.runtime.schedule.outcomes import Outcomes
from playbook.runtime.schedule.recovery import DownRows
from playbook.runtime.schedule.retry_queue import RetryQueue
from playbook.runtime.schedule.workers import Workers
from playbook.runtime.state.reading import RunState
from playbook.runtime.state.upstream import watch

if TYPE_CHECKING:
    from playbook.providers.provider import Provider
    from playbook.store import StoreEngine

__all__ = ["GRACE", "Scheduler"]

GRACE = 5.0  # seconds a stopped run gives calls already sent to land their receipts


class Scheduler:
    """One run of a play over a frame.  Create, then ``await execute()``; read ``result()``."""

    def __init__(self, frame: pd.DataFrame, play: Play, opts: RunOptions, store: StoreEngine) -> None:
        self.run_id = uuid.uuid4().hex[:12]
        self.frame, self.play, self.opts, self.store = frame, play, opts, store
        self.table = table = RowTable(frame)
        self.state = RunState(play=play.name)
        self.state.attach(table)
        self.fatal: BaseException | None = None
        queue = RetryQueue()
        self.outcomes = Outcomes(table, queue, self.state, self._parked_down)
        self.outcomes.play = play.name
        if not opts.overwrite and "play_status" not in frame.columns:
            # a result run again: its outputs are refreshed
            self.outcomes.guarded = frozenset(frame.columns)
        self.scope = RunScope(
            run_id=self.run_id,
            play=play.name,
            store=store,
            refresh_all=opts.refresh is True,
            rerun_rows=opts.refresh is not False,
            emit=self.state.emit,
            costs=opts.cost_budget(),
            tickets=Tickets(table, opts.max_wait, self._watch),
            label=table.label,
            fatal=self._fatal,
            fixtures=opts.replaying,
            fresh=self._fresh,
            level=(level := Level(opts.concurrency)),
        )
        for (
            value,
            note,
        ) in play.notes.items():  # what the play reads that its fingerprint cannot count, said once
            if value not in self.scope.said:
                self.state.emit(RunNotice(note, 0))
        self.scope.said.update(play.notes)
        runner = RowRunner(
            play, self.scope, self.outcomes, store, on_error=opts.on_error, fail_run=self._fail_run
        )
        self.workers = Workers(level, queue, runner, self.outcomes.resume, self._revisit)
        self._positions: Sequence[int] = []  # the rows this execution settles
        self._watching: dict[str, Callable[[], None]] = {}  # provider -> unsubscribe, while an execution runs
        self._woken: asyncio.Future[None] | None = None
        self._notices_seen = store.told
        self._executing = False  # workers are being waited for: rows may still join
        self._first = True
        self._scattered = False  # the rows not started yet were rotated once another process showed up
        self._down = DownRows(self._readmit, lambda: self._executing and not self.stopping)

    def __repr__(self) -> str:
        return f"<Scheduler {self.play.name!r} {self.run_id} {self.state.phase} {self.workers!r}>"

    @property
    def stopping(self) -> bool:
        return self.scope.landing.stopping

    def _emit(self, event: Event) -> None:
        """Count ``event`` in the state of the execution under way (a retry has its own)."""
        self.state.emit(event)

    # -- an execution ------------------------------------------------------------------

    async def execute(
        self,
        positions: list[int] | None = None,
        *,
        choose: Callable[[Sequence[int]], list[int]] | None = None,
    ) -> None:
        """Run the given rows (default: all); settle every one of them.  ``choose``: of the rows
        a run would run (memos reused), run only those it returns (a pilot: the rest stay unsettled).

        Cancelled (Ctrl-C, or the caller's cancel), it stops as :meth:`stop` does: calls already
        sent land their receipts (up to ``GRACE`` seconds), then the rest settle as skipped and
        the cancellation goes on.  Cancelled again meanwhile, it stops at once.
        """
        self._positions = range(len(self.frame)) if positions is None else positions
        total = len(self.frame) if positions is None else self._rows(positions)
        self.state.emit(RunStarted(self.run_id, self.play.name, total))
        self.scope.landing.stopping = False
        for note in self.store.standing:  # what the store cannot promise, said by every run on it
            self.state.emit(RunNotice(note, 0))
        for note in self.store.untold():  # what it is, said by the first run in this process
            self.state.emit(RunNotice(note, 0))
        self._store_notices()
        loop = asyncio.get_running_loop()

        def heard() -> None:  # said as the store notices it, from whichever thread that is
            loop.call_soon_threadsafe(self._store_notices)

        self.store.heard = heard
        try:
            with fewer_collections(len(self._positions)):
                self.workers.tasks = []
                runnable = self._runnable(self._positions)
                if choose is not None:
                    chosen = self._positions = choose(runnable)
                    # the rows not chosen are not this run's
                    self.state.emit(RunCounted(self._rows(chosen) - self._rows(runnable)))
                    runnable = chosen
                self.workers.admit(runnable)
                await self._run_workers()
            failure = self.workers.failure()
            if failure is not None:
                raise failure
        finally:
            await self._end()
        if self.fatal is not None:
            raise self.fatal

    def _rows(self, positions: Sequence[int]) -> int:
        """The rows ``positions`` settle: each with the rows that share its key."""
        if not self.table.copies:
            return len(positions)
        group = self.table.group
        return sum(len(group(p)) for p in positions)

    def _store_notices(self) -> None:
        """Say what the store noticed since it last was (opened with a warning, evicting keys)."""
        notices = self.store.notices
        for note in notices[self._notices_seen :]:
            self.state.emit(RunNotice(note, 0))
        self._notices_seen = self.store.told = len(notices)

    def _runnable(self, positions: Sequence[int]) -> Sequence[int]:
        """The rows to run: on the first execution, those not identified fail and those whose
        memo exists are reused."""
        if not self._first:
            return positions
        self._first = False
        key = self.opts.row_id_columns(self.frame)
        # A play that reads row.index makes the label part of a row's identity, unless id_columns=
        # says what is.
        runnable, unkeyed = self.table.identify(
            positions, key, labelled=key is None and self.play.reads_index
        )
        for pos, why in unkeyed:
            self.outcomes.finish(pos, "failed", None, why, ran=False)
        if self.opts.refresh is False:
            runnable = reuse(self.store, self.play, self.table, runnable, self.outcomes.reused)
        return runnable

    async def _run_workers(self) -> None:
        """Wait for the workers while rows may join (a row that steps aside may need a fresh one),
        until none is left or a stop; then give the rows in flight ``GRACE`` to land."""
        self._executing = True
        try:
            while (live := [t for t in self.workers.tasks if not t.done()]) and not self.stopping:
                self._woken = asyncio.get_running_loop().create_future()  # stop() wakes us
                await asyncio.wait([*live, self._woken], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._executing = False
            self.stop()
            await self._unwind()
            raise
        self._executing = False
        await self._unwind()

    async def _unwind(self) -> None:
        """Let cancelled rows unwind, and calls already sent land their receipts (up to ``GRACE``)."""
        busy = [t for t in (*self.workers.tasks, *self.scope.batches.tasks) if not t.done()]
        if busy:
            await asyncio.wait(busy, timeout=GRACE)

    async def _end(self) -> None:
        """Past the grace, or cancelled twice: cancel what is left, settle the rest, let go."""
        self._executing = False
        for task in [*self.workers.tasks, *self.scope.batches.tasks]:
            task.cancel()
        why = "not run: " + (
            str(self.fatal).split("\n")[0] if self.fatal is not None else "the run was stopped"
        )
        self.outcomes.unfinished(self._positions, why)
        # A run that says it finished has its memos and receipts in the store (a stopped run waits less).
        wait = 1.0 if self.stopping else GRACE
        self.store.heard = None
        self.store.add_spend(self.state.take_spend(), self.store.clock())
        try:
            self._notices_seen = await finish_store(self.store, self._emit, self._notices_seen, wait)
            await self.store.leases.stop_renewing()
        finally:
            # Cancelled again meanwhile, this run still stops listening: a pool's next run counts its
            # runs by it.
            for unsubscribe in self._watching.values():
                unsubscribe()
            self._watching.clear()
        self._down.close()
        await self.scope.close()
        if self.scope.recorder is not None:
            self.scope.recorder.flush()
        self.state.emit(RunFinished(self.run_id, self.stopping))

    # -- stop, fatal errors, retries -----------------------------------------------------

    def stop(self, keep: asyncio.Task[Any] | None = None) -> None:
        """Settle the rows in flight as skipped and start no more (``keep``: the caller's own worker).
        A row whose call is being sent lands its receipt first."""
        self.scope.landing.stopping = True
        self.state.stop_requested()
        self.workers.cancel(keep, self.scope.landing.tasks)
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(None)  # execute() stops waiting for the rows: it gives them GRACE

    def _fresh(self, pos: int) -> bool:
        """Row ``pos`` met a call another process is paying for: may it step back for a fresh row?"""
        pending = self.workers.pending
        if not pending or not self.workers.queue.may_step_back(pos):
            return False
        if not self._scattered:
            # Another process runs these rows too, in the same order: start elsewhere in them, so
            # the processes meet at a few rows instead of taking turns at every one.
            self._scattered = True
            pending.rotate(random.randrange(len(pending)))
        return True

    def _revisit(self, rows: list[int]) -> Sequence[int]:
        """Rows that stepped back for another process's lease: those it finished meanwhile are
        reused from its memos (one read for all of them); the rest run again."""
        if self.opts.refresh is not False or self.stopping:
            return rows
        return reuse(self.store, self.play, self.table, rows, self.outcomes.reused)

    def _fatal(self, exc: BaseException) -> None:
        """A fatal error (bad credentials, no credit): dispatch nothing more, stop the other rows now."""
        if self.fatal is None:
            self.fatal = exc
        self.stop(keep=asyncio.current_task())

    def _fail_run(self, exc: BaseException) -> None:
        """``on_error="raise"``: a row failed, so the run stops and raises its error."""
        self.fatal = exc
        self.stop(keep=asyncio.current_task())

    def admit(self, positions: list[int]) -> None:
        """Add requeued rows to the execution under way (a retry while the run goes on)."""
        self._positions = [*self._positions, *positions]
        self.workers.admit(positions)

    def requeue(self, statuses: tuple[str, ...] = ("failed", "parked")) -> list[int]:
        """Admit rows with these statuses again into the execution under way; returns their positions."""
        again = self._settled_as(statuses)
        table = self.table
        for pos in again:
            self.outcomes.requeue(pos, table.status(pos))  # type: ignore[arg-type]  # settled_as: settled
        return again

    def retry(self, statuses: tuple[str, ...] = ("failed", "parked")) -> list[int]:
        """A retry of rows with these statuses, once the last execution is over: the positions to
        execute, and a fresh :attr:`state` counts them (rows, calls, money, time: its own; the rows
        table stays the run's).  The state before is left as it ended.  No such rows: no retry."""
        again = self._settled_as(statuses)
        if not again:
            return again
        table = self.table
        for pos in again:
            table.unsettle(pos)  # no event: the state that counted the row keeps it, the new one never had it
        self.state = RunState(play=self.play.name)
        self.state.attach(table, frozenset(p for pos in again for p in table.group(pos)))
        # the events of its rows and their calls go to it straight (one call less each)
        self.outcomes.count_in(self.state)
        self.scope.emit = self.state.emit
        # what the run before paid for is a receipt to the retry, not shared in it
        self.scope.started = self.scope.clock()
        return again

    def _settled_as(self, statuses: tuple[str, ...]) -> list[int]:
        if self.fatal is not None:
            # the last execution stopped on a fatal error (a refused key): the rows it skipped go too
            statuses, self.fatal = (*statuses, "skipped"), None
        return self.table.settled_as(statuses)

    def skip_rest(self, why: str) -> None:
        """Settle every row not settled yet as skipped (a declined estimate): they join this run's count."""
        left = [pos for pos in range(len(self.frame)) if not self.table.statuses[pos]]
        self.state.emit(RunCounted(len(left)))
        self.outcomes.unfinished(left, why)

    # -- providers -----------------------------------------------------------------------

    def _watch(self, provider: Provider) -> None:
        """Forward a provider's hold and rate events to this run's views while it runs."""
        if provider.name not in self._watching:
            self.state.providers[provider.name] = provider
            self.state.sample()  # its counters as the run found them: the timeline counts from here
            self._watching[provider.name] = watch(provider, self._provider_event)

    def _provider_event(self, event: Any) -> None:
        self._emit(event)
        if type(event) is ProviderUp:
            self._down.up(event.provider)

    def _parked_down(self, pos: int, provider: str) -> None:
        found = self.state.providers.get(provider)
        if found is not None:
            self._down.parked(pos, found)

    def _readmit(self, positions: list[int], probe: str | None) -> None:
        """Rows parked on a down provider go back into this execution: it is back, or due a probe
        (``probe``: the provider; the row goes as its probe with no time to wait for it again)."""
        table = self.table
        again = [
            p
            for p in positions
            if table.status(p) == "parked" and (parking := table.parkings.get(p)) and parking.reason == "down"
        ]
        for pos in again:
            self.outcomes.requeue(pos, "parked")
            if probe is not None:
                table.budgets[pos] = {probe: WaitBudget(0.0)}
        if again:
            self.admit(again)

    def result(self) -> pd.DataFrame:
        """Input rows in input order and index, the output columns, ``play_status``, ``play_error``."""
        return self.table.result(self.frame, self.play.output)
