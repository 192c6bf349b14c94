"""MapRun: runs a play over the rows of a DataFrame.

Rows are identified by a digest of their key values; rows with the same key run once and share
the outcome.  A row whose memo exists (same play fingerprint, same key) is settled as
``reused`` without running.  The rest run on ``concurrency`` worker tasks.  Every settled row
emits an event; views subscribe to :class:`RunState`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

import httpx
import pandas as pd

from ..context import Context
from ..errors import PlayDefinitionError, RunFatal
from ..keys import memo_key, row_key
from ..models import CallFinished, RowFinished, RowRequeued, RowStarted, RunFinished, RunStarted, Status
from ..plays import Play
from ..receipts import ReceiptStore
from .batching import Batcher
from .options import RunOptions
from .rows import Row, output_columns
from .state import RunState

if TYPE_CHECKING:
    from ..tools import Tool

__all__ = ["MapRun"]

_MEMO_CHUNK = 512


class Parked(BaseException):
    """A row stepping out of this run (budget, long hold).  Not an Exception: plays can't catch it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class MapRun:
    """One run of a play over a frame.  Create, then ``await execute()``; read ``result()``."""

    def __init__(self, frame: pd.DataFrame, play: Play, opts: RunOptions, store: ReceiptStore) -> None:
        self.run_id = uuid.uuid4().hex[:12]
        self.frame = frame
        self.play = play
        self.opts = opts
        self.store = store
        self.store_clock = store._clock
        self.force_all = opts.refresh is True
        self.state = RunState()
        n = len(frame)
        self.status: list[Status | None] = [None] * n
        self.outputs: list[dict[str, Any] | None] = [None] * n
        self.errors: list[str | None] = [None] * n
        self.park_reason: list[str | None] = [None] * n
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
        self._client: httpx.AsyncClient | None = None
        self._committed_cost = 0.0
        self._stopping = False
        self._labels: list[Any] = []
        self._started: set[int] = set()  # rows running now
        self._batchers: dict[str, Batcher] = {}
        self._memo_keys: dict[int, str] = {}  # computed while checking for memos, used on success

    # -- what ctx.tool needs -----------------------------------------------------------

    def claim_force(self, logical: str) -> bool:
        """True the first time a logical call is forced in this run: replays don't pay again."""
        if logical in self._forced:
            return False
        self._forced.add(logical)
        return True

    def http_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = _default_client(self.opts.concurrency)
        return self._client

    def batcher(self, tool: Tool) -> Batcher:
        """The batcher that coalesces this run's calls to a batch tool."""
        found = self._batchers.get(tool.name)
        if found is None:
            found = self._batchers[tool.name] = Batcher(tool)
        return found

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
        self.state.emit(CallFinished(tool.name, _provider(tool), False, tool.cost))

    # -- the run -----------------------------------------------------------------------

    async def execute(self, positions: list[int] | None = None) -> None:
        """Run the given rows (default: all); settle every one of them."""
        frame, opts = self.frame, self.opts
        first = positions is None
        if first:
            self._vals = list(frame.itertuples(index=False, name=None))
            self._labels = list(frame.index)
            positions = list(range(len(frame)))
        self.state.emit(RunStarted(self.run_id, self.play.name, len(frame)))
        self._stopping = False
        try:
            runnable = positions
            if first:
                runnable = self._identify(positions, opts.key_columns(frame))
                if opts.refresh is False:
                    runnable = self._reuse(runnable)
            self._pending.extend(runnable)
            count = min(opts.concurrency, len(self._pending))
            self._workers = [asyncio.ensure_future(self._worker()) for _ in range(count)]
            # return_exceptions: a worker we cancel ourselves (stop, fatal) must not end the
            # wait before the others have unwound; the caller cancelling us still propagates.
            for outcome in await asyncio.gather(*self._workers, return_exceptions=True):
                if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
                    raise outcome
        finally:
            for task in self._workers:
                task.cancel()
            self._settle_unfinished(positions)
            self.store.flush()
            if self._client is not None:
                await self._client.aclose()
                self._client = None
            self.state.emit(RunFinished(self.run_id, self._stopping))
        if self.fatal is not None:
            raise self.fatal

    def stop(self) -> None:
        """Finish the rows in flight as skipped and start no more."""
        self._stopping = True
        self._pending.clear()
        for task in self._workers:
            task.cancel()

    def requeue(self, statuses: tuple[str, ...] = ("failed", "parked")) -> list[int]:
        """Admit rows with these statuses again; returns the positions to execute."""
        again = []
        for pos, status in enumerate(self.status):
            if status in statuses and self.keys[pos] is not None and pos not in self._dups:
                group = [pos, *self._copies.get(pos, ())]
                for p in group:
                    self.status[p] = self.errors[p] = self.outputs[p] = self.park_reason[p] = None
                self.state.emit(RowRequeued(pos, status, len(group)))  # type: ignore[arg-type]
                again.append(pos)
        return again

    def _identify(self, positions: list[int], key_cols: list[Any] | None) -> list[int]:
        """Key each row; group duplicates under their first position; apply ``limit``."""
        limit = self.opts.limit
        key_idx = [self._cols[c] for c in key_cols] if key_cols is not None else None
        seen: dict[str, int] = {}
        runnable: list[int] = []
        for pos in positions:
            if limit is not None and pos >= limit:
                self._settle(pos, "skipped", None, f"not run: limit={limit}", ran=False)
                continue
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
            mkeys = ["m" + memo_key(fp, self.keys[p]) for p in chunk]  # type: ignore[arg-type]
            found = self.store.memos(mkeys)
            for pos, mk in zip(chunk, mkeys):
                memo = found.get(mk)
                if memo is None:
                    self._memo_keys[pos] = mk
                    rest.append(pos)
                else:
                    self._settle(pos, "reused", memo, None, ran=False)
        return rest

    async def _worker(self) -> None:
        pending = self._pending
        while pending:
            await self._run_row(pending.popleft())

    async def _run_row(self, pos: int) -> None:
        attempt = self.attempts[pos] = self.attempts[pos] + 1
        ctx = Context(self, self.keys[pos], pos, attempt)  # type: ignore[arg-type]
        self.state.emit(RowStarted(pos))
        self._started.add(pos)
        try:
            value = await self.play.fn(Row(self._cols, self._vals[pos], self._labels[pos]), ctx)
            output = output_columns(value, self.play.name)
        except Parked as park:
            self.park_reason[pos] = park.reason
            self._settle(pos, "parked", None, str(park))
        except RunFatal as exc:
            self._settle(pos, "failed", None, _message(exc))
            self.fatal = exc
            self.stop()
        except Exception as exc:
            self._settle(pos, "failed", None, _message(exc))
            if self.opts.on_error == "raise":
                exc.add_note(f"in row {self._labels[pos]!r} (position {pos}) of play {self.play.name!r}")
                self.fatal = exc
                self.stop()
        else:
            self._settle(pos, "ok", output, None)
            mk = self._memo_keys.pop(pos, None) or "m" + memo_key(self.play.fingerprint, self.keys[pos])  # type: ignore[arg-type]
            self.store.add_memo(mk, output, self.play.name)

    def _settle(self, pos: int, status: Status, output: dict[str, Any] | None, error: str | None, *, ran: bool = True) -> None:
        self._started.discard(pos)
        copies = self._copies.get(pos)
        for p in (pos, *copies) if copies else (pos,):
            self.status[p] = status
            self.outputs[p] = output
            self.errors[p] = error
        self.state.emit(RowFinished(pos, status, error, 1 + len(copies) if copies else 1, ran))

    def _settle_unfinished(self, positions: list[int]) -> None:
        why = "not run: " + (str(self.fatal).split("\n")[0] if self.fatal is not None else "the run was stopped")
        for pos in positions:  # a duplicate comes after its lead, so settling the lead settles it
            if self.status[pos] is None:
                self._settle(pos, "skipped", None, why, ran=pos in self._started)

    # -- the result --------------------------------------------------------------------

    def result(self) -> pd.DataFrame:
        """Input rows in input order and index, the output columns, ``play_status``, ``play_error``."""
        frame = self.frame
        outputs = [o if o is not None else {} for o in self.outputs]
        out = pd.DataFrame.from_records(outputs, index=frame.index) if any(outputs) else pd.DataFrame(index=frame.index)
        keep = [c for c in frame.columns if c not in out.columns]
        result = pd.concat([frame[keep], out], axis=1) if len(out.columns) else frame.copy()
        result["play_status"] = pd.Series(self.status, index=frame.index, dtype=object)
        result["play_error"] = pd.Series(self.errors, index=frame.index, dtype=object)
        return result


def _message(exc: BaseException) -> str:
    text = str(exc)
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    notes = getattr(exc, "__notes__", None)
    return f"{message} ({'; '.join(notes)})" if notes else message


def _provider(tool: Tool) -> str | None:
    return tool.provider.name if tool.provider is not None else None


def _default_client(concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max(100, 4 * concurrency), max_keepalive_connections=max(100, 4 * concurrency))
    try:
        from httpx_aiohttp import AiohttpTransport
    except ImportError:  # the plain httpx pool works, only slower at high concurrency
        return httpx.AsyncClient(limits=limits)
    return httpx.AsyncClient(transport=AiohttpTransport(limits=limits))


def check_columns(frame: pd.DataFrame, tool: Any) -> None:
    """A tool mapped directly needs a column per parameter."""
    if tool.batch_size is not None:
        raise PlayDefinitionError(
            f"batch tool {tool.name!r} takes free-form inputs, so it cannot bind them from columns: "
            f"call it from a play, e.g. await ctx.tool({tool.name}, domain=row.domain)"
        )
    missing = [p for p in tool.params if p not in frame.columns]
    if missing:
        raise PlayDefinitionError(
            f"tool {tool.name!r} binds its inputs from columns, but the DataFrame has no column "
            f"{', '.join(repr(m) for m in missing)}; columns: {list(frame.columns)}"
        )
