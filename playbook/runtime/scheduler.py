"""MapRun: runs a play over the rows of a DataFrame.

Rows are identified by a digest of their key values; rows with the same key run once and share
the outcome.  A row whose memo exists (same play fingerprint, same key) is settled as
``reused`` without running.  The rest run on ``concurrency`` worker tasks.  Every settled row
emits an event; views subscribe to :class:`RunState`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pandas as pd

from ..context import Context
from ..errors import ProviderExhausted, RunFatal
from ..keys import memo_key, row_key
from ..models import (
    CallFinished, ProviderUp, RowFinished, RowHeld, RowParked, RowRequeued, RowResumed, RowStarted, RunFinished, RunNotice,
    RunStarted, Status, WaterfallFinished,
)  # fmt: skip
from ..plays import Play
from ..providers import Provider, Ticket
from ..signals import Held, Parked, Sleeping, Suspend, WaitBudget
from ..store import ReceiptStore
from ..store.records import OUTPUT_TAGGED, memo_tools
from ..tagged import dumps
from ..tools import current_fingerprint
from ..tools.transport import default_client
from .batching import Batcher
from .options import RunOptions
from .recovery import DownRows
from .retry_queue import RetryQueue
from .rows import OutputError, Row, error_line, error_message, output_columns, result_frame, stored_output
from .state import RunState

if TYPE_CHECKING:
    from ..context import Call
    from ..tools import Tool

__all__ = ["MapRun"]

_MEMO_CHUNK = 512
SLEEP = "sleep"  # what a row in ctx.sleep waits for, where a held row names its provider
GRACE = 5.0  # seconds a stopped run gives calls already sent to land their receipts
_logger = logging.getLogger("playbook")


class MapRun:
    """One run of a play over a frame.  Create, then ``await execute()``; read ``result()``."""

    def __init__(self, frame: pd.DataFrame, play: Play, opts: RunOptions, store: ReceiptStore) -> None:
        self.run_id = uuid.uuid4().hex[:12]
        self.frame = frame
        self.play = play
        self.opts = opts
        self.store = store
        self.store_clock = store.clock
        self.force_all = opts.refresh is True
        self.state = RunState()
        n = len(frame)
        self.status: list[Status | None] = [None] * n
        self.outputs: list[dict[str, Any] | None] = [None] * n
        self.errors: list[str | None] = [None] * n
        self.park_reason: list[str | None] = [None] * n
        self.park_provider: list[str | None] = [None] * n
        self.park_ready: list[float | None] = [None] * n  # epoch seconds
        self.attempts: list[int] = [0] * n
        self.keys: list[str | None] = [None] * n
        self.fatal: BaseException | None = None
        self._forced: set[str] = set()
        self._copies: dict[int, list[int]] = {}  # first row of a key -> later rows with it
        self._dups: set[int] = set()
        self._cols = {c: i for i, c in enumerate(frame.columns)}
        self._vals: list[tuple[Any, ...]] = []
        self._pending: deque[int] = deque()
        self._workers: list[asyncio.Task[None]] = []
        self._positions: list[int] = []  # the rows this execution settles
        self._held = RetryQueue()
        self._tickets: dict[str, Ticket] = {}  # logical call -> its standing with the provider
        self._budgets: dict[int, dict[str, WaitBudget]] = {}  # row -> provider -> wait left, until it settles
        self._watching: dict[str, Callable[[], None]] = {}  # provider -> unsubscribe, while this execution runs
        self._client: httpx.AsyncClient | None = None
        self._committed_cost = 0.0
        self._stopping = False
        self._labels: list[Any] = []
        self._started: set[int] = set()  # rows running now
        self._batchers: dict[str, Batcher] = {}
        self._memo_keys: dict[int, str] = {}  # computed while checking for memos, used on success
        self._landing: set[asyncio.Task[Any]] = set()  # workers whose call is sent: landing its receipt
        self._woken: asyncio.Future[None] | None = None
        self._batches: set[asyncio.Task[Any]] = set()  # batches sent, landing their members' receipts
        self._notices_seen = len(store.notices)
        self._executing = False  # workers are being waited for: rows may still join
        self._down = DownRows(self._readmit, lambda: self._executing and not self._stopping)

    # -- what ctx.tool needs -----------------------------------------------------------

    def must_force(self, logical: str) -> bool:
        """True until a forced logical call has been paid for in this run: a row replayed after
        a hold does not pay for it again, and one held before it was paid still forces it."""
        return logical not in self._forced

    def forced(self, logical: str) -> None:
        self._forced.add(logical)

    def http_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = default_client()
        return self._client

    def batcher(self, tool: Tool) -> Batcher:
        """The batcher that coalesces this run's calls to a batch tool."""
        found = self._batchers.get(tool.name)
        if found is None:
            found = self._batchers[tool.name] = Batcher(tool, self._track_batch)
        return found

    def _track_batch(self, task: asyncio.Task[Any]) -> None:
        """A batch sent: a stop waits for it to record its members' receipts (up to ``GRACE``)."""
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    @contextlib.contextmanager
    def landing(self) -> Iterator[None]:
        """Around a call that is being sent and recorded: :meth:`stop` leaves this row's task to
        land the receipt, then the row stops here (it is settled as skipped)."""
        task = asyncio.current_task()
        self._landing.add(task)  # type: ignore[arg-type]
        try:
            yield
        finally:
            self._landing.discard(task)  # type: ignore[arg-type]
            del task
        if self._stopping:
            raise asyncio.CancelledError("the run was stopped; this call's receipt is written")

    def label(self, pos: int) -> Any:
        """The index label of the row at ``pos``."""
        return self._labels[pos]

    def call_reused(self, tool: Tool) -> None:
        self.state.emit(CallFinished(tool.name, _provider(tool), True, tool.cost))

    def reserve(self, tool: Tool) -> None:
        """Count a paid call against ``max_cost`` before dispatch; park the row if it won't fit."""
        if tool.cost and self.opts.max_cost is not None:
            if self._committed_cost + tool.cost > self.opts.max_cost + 1e-9:
                raise Parked("budget", f"budget: calling {tool.name!r} (cost {tool.cost:g}) would pass max_cost={self.opts.max_cost:g}")
            self._committed_cost += tool.cost

    def refund(self, tool: Tool) -> None:
        """A reserved call did not complete: give its cost back to the budget."""
        if tool.cost and self.opts.max_cost is not None:
            self._committed_cost -= tool.cost

    def call_executed(self, tool: Tool) -> None:
        local = tool.provider is None and not tool.cost and not tool.remote
        self.state.emit(CallFinished(tool.name, _provider(tool), False, tool.cost, local))

    def ticket(self, call_id: str, tool: Tool, pos: int) -> Ticket:
        """The standing of one logical call with its provider; the same object across replays."""
        found = self._tickets.get(call_id)
        if found is None:
            provider = tool.provider
            assert provider is not None
            self._watch(provider)
            budgets = self._budgets.get(pos)
            if budgets is None:
                budgets = self._budgets[pos] = {}
            budget = budgets.get(provider.name)
            if budget is None:
                wait = self.opts.max_wait if self.opts.max_wait is not None else provider.max_wait
                budget = budgets[provider.name] = WaitBudget(wait)
            found = self._tickets[call_id] = Ticket(tool.name, budget)
        return found

    def ticket_done(self, call_id: str) -> None:
        self._tickets.pop(call_id, None)

    def _watch(self, provider: Provider) -> None:
        """Forward a provider's hold and rate events to this run's views while it runs."""
        if provider.name not in self._watching:
            self.state.providers[provider.name] = provider
            self._watching[provider.name] = provider.subscribe(self._provider_event)
            provider.health.retest()  # a rerun or run.retry() tries a down provider again at once

    def _provider_event(self, event: Any) -> None:
        self.state.emit(event)
        if type(event) is ProviderUp:
            self._down.up(event.provider)

    def fatal_stop(self, exc: BaseException, pos: int) -> None:
        """A fatal error (bad credentials, no credit): dispatch nothing more, stop the other rows now."""
        if self.fatal is None:
            self.fatal = exc
        self.stop(keep=asyncio.current_task())

    def waterfall_done(self, key: str, legs: list[Call], outcomes: list[str]) -> None:
        outcomes = outcomes + ["never"] * (len(legs) - len(outcomes))
        self.state.emit(WaterfallFinished(key, tuple(leg.tool.name for leg in legs), tuple(outcomes)))

    # -- the run -----------------------------------------------------------------------

    async def execute(self, positions: list[int] | None = None) -> None:
        """Run the given rows (default: all); settle every one of them.

        Cancelled (Ctrl-C, or the caller's cancel), it stops as :meth:`stop` does: calls already
        sent land their receipts (up to ``GRACE`` seconds), then the rest settle as skipped and
        the cancellation goes on.  Cancelled again meanwhile, it stops at once.
        """
        frame, opts = self.frame, self.opts
        first = positions is None
        if first:
            self._vals = list(frame.itertuples(index=False, name=None))
            self._labels = list(frame.index)
            positions = list(range(len(frame)))
        self.state.emit(RunStarted(self.run_id, self.play.name, len(frame)))
        self._stopping = False
        try:
            self._positions = positions
            runnable = positions
            if first:
                runnable = self._identify(positions, opts.key_columns(frame))
                if opts.refresh is False:
                    runnable = self._reuse(runnable)
            self._pending.extend(runnable)
            self._workers = []
            self._spawn(min(opts.concurrency, len(self._pending)))
            self._executing = True
            try:
                # Workers join while the run goes (a row that steps aside may need a fresh one), so
                # wait until none is left, or until a stop (which then gives them GRACE, below).
                while (live := [t for t in self._workers if not t.done()]) and not self._stopping:
                    self._woken = asyncio.get_running_loop().create_future()  # stop() wakes us
                    await asyncio.wait([*live, self._woken], return_when=asyncio.FIRST_COMPLETED)
                self._executing = False
            except asyncio.CancelledError:
                self._executing = False
                self.stop()
                await self._unwind()
                raise
            await self._unwind()
            for task in self._workers:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self._executing = False
            for task in [*self._workers, *self._batches]:
                task.cancel()  # past the grace, or cancelled twice: now
            self._settle_unfinished(self._positions)
            self._finish_store()
            await self.store.leases.settle()
            for unsubscribe in self._watching.values():
                unsubscribe()
            self._watching.clear()
            self._down.close()
            if self._client is not None:
                await self._client.aclose()
                self._client = None
            self.state.emit(RunFinished(self.run_id, self._stopping))
        if self.fatal is not None:
            raise self.fatal

    async def _unwind(self) -> None:
        """Let cancelled rows unwind, and calls already sent land their receipts (up to ``GRACE``)."""
        busy = [t for t in (*self._workers, *self._batches) if not t.done()]
        if busy:
            await asyncio.wait(busy, timeout=GRACE)

    def _finish_store(self) -> None:
        """Write what the store still owes (memos; receipts that failed to be written) and say
        out loud what could not be."""
        store = self.store
        store.flush()
        owed = store.unwritten()
        if owed:
            lost = store.write_unwritten()
            if lost:
                note = (
                    f"{lost} paid calls could not be recorded in the receipt store at {store.path} (their rows failed, "
                    "saying why). Their answers are kept in memory and written when the store takes writes again, at "
                    "the end of the next run in this process; if the process ends first, a rerun pays for them again"
                )
            else:
                note = f"{owed} receipts of paid calls that could not be written before were written at the end of this run: a rerun reuses them"
            self.state.emit(RunNotice(note, lost))
            _logger.warning("%s", note)
        for note in store.notices[self._notices_seen :]:
            self.state.emit(RunNotice(note, 0))
        self._notices_seen = len(store.notices)

    def stop(self, keep: asyncio.Task[Any] | None = None) -> None:
        """Settle the rows in flight as skipped and start no more (``keep``: the caller's own worker).
        A row whose call is being sent lands its receipt first (see :meth:`landing`)."""
        self._stopping = True
        self._pending.clear()
        self._held.clear()
        for task in self._workers:
            if task is not keep and task not in self._landing:
                task.cancel()
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(None)  # execute() stops waiting for the rows: it gives them GRACE

    def admit(self, positions: list[int]) -> None:
        """Add requeued rows to the execution under way (a retry while the run goes on)."""
        self._positions = self._positions + positions
        self._pending.extend(positions)
        live = sum(not t.done() for t in self._workers)
        self._spawn(max(0, min(self.opts.concurrency - live, len(self._pending))))

    def requeue(self, statuses: tuple[str, ...] = ("failed", "parked")) -> list[int]:
        """Admit rows with these statuses again; returns the positions to execute."""
        again = []
        for pos, status in enumerate(self.status):
            if status in statuses and self.keys[pos] is not None and pos not in self._dups:
                self._unsettle(pos, status)
                again.append(pos)
        return again

    def _unsettle(self, pos: int, status: Status) -> None:
        group = [pos, *self._copies.get(pos, ())]
        for p in group:
            self.status[p] = self.errors[p] = self.outputs[p] = self.park_reason[p] = None
            self.park_provider[p] = self.park_ready[p] = None
        self.state.emit(RowRequeued(pos, status, len(group)))

    def _readmit(self, positions: list[int]) -> None:
        """Rows parked on a down provider go back into this execution (it is back, or due a probe)."""
        again = [p for p in positions if self.status[p] == "parked" and self.park_reason[p] == "down"]
        for pos in again:
            self._unsettle(pos, "parked")
        if again:
            self.admit(again)

    def _identify(self, positions: list[int], key_cols: list[Any] | None) -> list[int]:
        """Key each row; group duplicates under their first position."""
        key_idx = [self._cols[c] for c in key_cols] if key_cols is not None else None
        seen: dict[str, int] = {}
        runnable: list[int] = []
        for pos in positions:
            vals = self._vals[pos]
            try:
                key = row_key(list(vals) if key_idx is None else [vals[i] for i in key_idx])
            except TypeError as exc:
                self._settle(pos, "failed", None, f"cannot identify the row: {exc}; pass key=COLUMNS naming the columns that identify a row", ran=False)
                continue
            self.keys[pos] = key
            lead = seen.get(key)
            if lead is None:
                seen[key] = pos
                runnable.append(pos)
            else:
                self._copies.setdefault(lead, []).append(pos)
                self._dups.add(pos)
        return runnable

    def _reuse(self, runnable: list[int]) -> list[int]:
        """Settle rows whose memo exists as ``reused``; return the rest."""
        fp = self.play.fingerprint
        rest: list[int] = []
        for start in range(0, len(runnable), _MEMO_CHUNK):
            chunk = runnable[start : start + _MEMO_CHUNK]
            mkeys = [memo_key(fp, self.keys[p]) for p in chunk]  # type: ignore[arg-type]
            found = self.store.memos(mkeys)
            for pos, mk in zip(chunk, mkeys):
                memo = found.get(mk)
                if memo is None or not _tools_unchanged(memo["tools"]):
                    self._memo_keys[pos] = mk
                    rest.append(pos)
                else:
                    self._settle(pos, "reused", memo["output"], None, ran=False, calls=memo["calls"], cost=memo["cost"])
        return rest

    def _spawn(self, count: int) -> None:
        for _ in range(count):
            self._workers.append(asyncio.ensure_future(self._worker()))

    async def _worker(self) -> None:
        pending, held = self._pending, self._held
        loop = asyncio.get_running_loop()
        while True:
            pos = held.due(loop.time()) if held else None
            if pos is not None:  # a held row comes back ahead of fresh rows
                self.state.emit(RowResumed(pos))
                await self._run_row(pos)
            elif pending:
                await self._run_row(pending.popleft())
            elif held:
                await held.nap(held.next_at())  # type: ignore[arg-type]
            else:
                return

    def _hold(self, pos: int, until: float, wall: float, waits_for: str, status: int | None) -> None:
        """Take a held (or sleeping) row off its worker; it waits in the retry queue until ``until``."""
        self._held.push(pos, until, waits_for)
        self._started.discard(pos)
        self.state.emit(RowHeld(pos, waits_for, wall, status))
        if sum(not t.done() for t in self._workers) < self.opts.concurrency:
            self._spawn(1)  # this worker takes another row; the held one must not lack a worker

    async def _run_row(self, pos: int) -> None:
        attempt = self.attempts[pos] = self.attempts[pos] + 1
        ctx = Context(self, self.keys[pos], pos, attempt)  # type: ignore[arg-type]
        self.state.emit(RowStarted(pos))
        self._started.add(pos)
        name = self.play.name
        try:
            value = await self.play.fn(Row(self._cols, self._vals[pos], self._labels[pos]), ctx)
            if ctx._signal is not None:
                raise ctx._signal  # the play caught a suspension or a fatal error: it still counts
            output, stored = stored_output(output_columns(value, name, ctx.forgotten_await), name, ctx.forgotten_await)
            advice = ctx.never_awaited()
            if advice is not None:
                raise OutputError(f"play {name!r} made a ctx call that it never awaited, so it never ran: {advice}")
        except Held as held:
            held.budget.left -= max(0.0, held.until - asyncio.get_running_loop().time())
            self._hold(pos, held.until, held.wall, held.provider.name, held.status)
        except Sleeping as sleeping:
            self._hold(pos, sleeping.until, sleeping.wall, SLEEP, None)
        except Parked as park:
            self._park(pos, park.reason, str(park), park.provider, park.ready_at)
        except ProviderExhausted as exc:
            self._park(pos, exc.reason, error_message(exc), exc.provider, exc.retry_at)
        except RunFatal as exc:
            self._settle(pos, "failed", None, error_message(exc))
            self.fatal_stop(exc, pos)
        except Suspend:  # pragma: no cover - every signal is handled above
            raise
        except Exception as exc:
            self._settle(pos, "failed", None, error_message(exc) + error_line(exc, self.play.fn))
            if self.opts.on_error == "raise":
                exc.add_note(f"in row {self._labels[pos]!r} (position {pos}) of play {name!r}")
                self.fatal = exc
                self.stop(keep=asyncio.current_task())
        else:
            self._settle(pos, "ok", output, None)
            if stored is not None:
                self._remember(pos, ctx, output, stored)
        finally:
            ctx.close()

    def _remember(self, pos: int, ctx: Context, output: dict[str, Any], stored: Any) -> None:
        """Write the row's memo: its output, its calls and their cost, the tools it used."""
        mk = self._memo_keys.pop(pos, None) or memo_key(self.play.fingerprint, self.keys[pos])  # type: ignore[arg-type]
        flags = OUTPUT_TAGGED if output is not stored else 0
        self.store.add_memo(mk, self.play.name, memo_tools(ctx.tools), ctx.calls, ctx.cost, flags, dumps(stored))

    def _park(self, pos: int, reason: str, message: str, provider: str | None, ready_at: float | None) -> None:
        for p in (pos, *self._copies.get(pos, ())):
            self.park_reason[p], self.park_provider[p], self.park_ready[p] = reason, provider, ready_at
        self.state.emit(RowParked(pos, reason, provider, ready_at))
        self._settle(pos, "parked", None, message)
        if reason == "down" and provider in self.state.providers:
            self._down.parked(pos, self.state.providers[provider])

    def _settle(
        self, pos: int, status: Status, output: dict[str, Any] | None, error: str | None, *, ran: bool = True, held: bool = False,
        calls: int = 0, cost: float = 0.0,
    ) -> None:
        self._started.discard(pos)
        # Settled: its wait budgets go (a retried row waits afresh: max_wait counts from then).
        self._budgets.pop(pos, None)
        copies = self._copies.get(pos)
        for p in (pos, *copies) if copies else (pos,):
            self.status[p] = status
            self.outputs[p] = output
            self.errors[p] = error
        self.state.emit(RowFinished(pos, status, error, 1 + len(copies) if copies else 1, ran, held, calls, cost))

    def _settle_unfinished(self, positions: list[int]) -> None:
        why = "not run: " + (str(self.fatal).split("\n")[0] if self.fatal is not None else "the run was stopped")
        for pos in positions:  # a duplicate comes after its lead, so settling the lead settles it
            if self.status[pos] is None:
                held = self._held.waiting_on.pop(pos, None) is not None
                self._settle(pos, "skipped", None, why, ran=pos in self._started, held=held)
        self._held.clear()

    # -- the result --------------------------------------------------------------------

    def result(self) -> pd.DataFrame:
        """Input rows in input order and index, the output columns, ``play_status``, ``play_error``."""
        return result_frame(self.frame, self.outputs, self.status, self.errors)


def _tools_unchanged(tools: dict[str, str]) -> bool:
    """True when no tool a memo used has been redefined (edited) in this process since."""
    for name, fingerprint in tools.items():
        now = current_fingerprint(name)
        if now is not None and now != fingerprint:
            return False
    return True


def _provider(tool: Tool) -> str | None:
    return tool.provider.name if tool.provider is not None else None
