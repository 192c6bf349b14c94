"""A partition's run on a Dask worker: the local engine over its rows, reporting to the job.

The play and its options arrive pickled once per job (``payload``); providers in it arrive with
their limits shared at the job's Redis (see :func:`playbook.providers.sharing_limits`), so every
worker paces one account together.  Each worker thread keeps one event loop and one store per
Redis URL across partitions, as a script's thread does across ``map()`` calls.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid
from typing import Any, NamedTuple

import pandas as pd

from .._loop import run_sync
from ..models import RowFinished, RowHeld, RowParked, RowRequeued, RowResumed, RowSleeping, RunFinished
from ..runtime.run import Run
from ..runtime.state import RunEvent, RunState
from ..store import ReceiptStore
from .budget import SharedCostBudget
from .wire import COUNTERS, Channel, encode_label

__all__ = ["Failure", "Part", "run_partition"]

_INTERVAL = 0.25  # seconds between a partition's reports


class Part(NamedTuple):
    """One partition's task: its place in the job and what of it to run."""

    job: str
    part: int  # the partition's number
    offset: int  # the job-wide position of its first row
    store: str  # the job's Redis URL: receipts, memos, limits and reports
    limit: int | None  # run only its first N rows (the job's limit= reaches into it)
    positions: tuple[int, ...] | None  # a retry: only these rows (positions in the partition)


class Failure(NamedTuple):
    """What a partition's run raised (a 401, a row's error under ``on_error="raise"``), given back
    instead of raised: Dask logs a task that raises as a failed computation, a traceback per
    partition on every worker, where the client says it once."""

    error: BaseException
    worker: str


class _Local(threading.local):
    def __init__(self) -> None:
        self.stores: dict[str, ReceiptStore] = {}


_local = _Local()
_channels: dict[tuple[str, str], Channel] = {}
_channels_lock = threading.Lock()


def run_partition(frame: pd.DataFrame, payload: bytes, part: Part, previous: pd.DataFrame | None = None) -> pd.DataFrame | Failure:
    """Run the job's play over ``frame`` (one partition) and return its result; a retry runs
    ``part.positions`` only and returns ``previous`` with those rows replaced."""
    import cloudpickle

    try:
        play, options = cloudpickle.loads(payload)
        if options.get("max_cost") is not None:  # the job's budget, which every partition spends from
            options = {**options, "max_cost": SharedCostBudget(options["max_cost"], part.store, part.job)}
        rows = frame if part.positions is None else frame.iloc[list(part.positions)]
        if part.limit is not None:
            rows = rows.iloc[: part.limit]
        result = run_sync(_drive(rows, play, options, _store(part.store), _channel(part), part))
    except Exception as exc:
        return Failure(exc, worker_name())
    return result if previous is None or part.positions is None else _merged(previous, result, part.positions)


async def _drive(rows: pd.DataFrame, play: Any, options: dict[str, Any], store: ReceiptStore, channel: Channel, part: Part) -> pd.DataFrame:
    run: Run = await rows.play.arun(play, **options, store=store, progress=False, background=True)
    relay = _Relay(run.state, part)
    finished = asyncio.Event()
    unsubscribe = run.state.subscribe(lambda _: finished.set(), kinds=(RunFinished,))
    try:
        while True:
            if channel.report(relay.report()) and not run.state.stopping:
                run.stop()
            if finished.is_set():
                break
            try:
                await asyncio.wait_for(finished.wait(), _INTERVAL)
            except TimeoutError:
                pass
        result = await run
        channel.report(relay.report(final=True))
    finally:
        unsubscribe()
        relay.close()
    return result


def _store(url: str) -> ReceiptStore:
    store = _local.stores.get(url)
    if store is None:
        store = _local.stores[url] = ReceiptStore(url)
    return store


def _channel(part: Part) -> Channel:
    with _channels_lock:
        found = _channels.get((part.store, part.job))
        if found is None:
            found = _channels[(part.store, part.job)] = Channel(part.store, part.job)
    return found


def worker_name() -> str:
    """The Dask worker's address, else this host and process."""
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return f"{socket.gethostname()}:{os.getpid()}"


def _merged(previous: pd.DataFrame, again: pd.DataFrame, positions: tuple[int, ...]) -> pd.DataFrame:
    """``previous`` with the rows at ``positions`` taken from ``again`` (a retry of those rows)."""
    out = previous.copy()
    for column in again.columns:
        values = out[column].tolist() if column in out.columns else [None] * len(out)
        for position, value in zip(positions, again[column].tolist()):
            values[position] = value
        out[column] = pd.Series(values, index=out.index, dtype=object).infer_objects()
    return out


class _Relay:
    """What a partition's run reports: its counters, providers, and rows whose state changed."""

    def __init__(self, state: RunState, part: Part) -> None:
        self.state = state
        self.part = part
        self.attempt = uuid.uuid4().hex[:12]  # a partition run again (its worker died) is a new attempt
        self.worker = worker_name()
        self.finished: dict[int, list[Any]] = {}  # position -> [status, error, copies, reason, provider, ready_at]
        self.parking: dict[int, tuple[str, str | None, float | None]] = {}
        self.held: dict[int, list[Any]] = {}  # position -> [kind, provider, until, status]
        self.dirty: set[int] = set()
        self.told = 0  # notices sent
        kinds = (RowFinished, RowParked, RowRequeued, RowHeld, RowSleeping, RowResumed)
        self._unsubscribe = state.subscribe(self.on_event, kinds=kinds)

    def close(self) -> None:
        self._unsubscribe()

    def on_event(self, event: RunEvent) -> None:
        kind = type(event)
        position: int = event.position  # type: ignore[union-attr]  # every kind subscribed has one
        if kind is RowFinished:
            assert isinstance(event, RowFinished)
            if event.status in ("failed", "parked"):
                reason, provider, ready = self.parking.pop(position, ("", None, None))
                self.finished[position] = [event.status, event.error, event.copies, reason, provider, ready]
            elif position not in self.finished and position not in self.held:
                return  # most rows: ok or reused, counted by the counters alone
            else:
                self.finished.pop(position, None)
            self.held.pop(position, None)
        elif kind is RowParked:
            assert isinstance(event, RowParked)
            self.parking[position] = (event.reason, event.provider, event.ready_at)
            return
        elif kind is RowHeld:
            assert isinstance(event, RowHeld)
            self.held[position] = ["provider", event.provider, event.until, event.status]
        elif kind is RowSleeping:
            assert isinstance(event, RowSleeping)
            self.held[position] = ["sleep", None, event.until, None]
        elif kind is RowResumed:
            self.held.pop(position, None)
        elif kind is RowRequeued:
            self.finished.pop(position, None)
        self.dirty.add(position)

    def report(self, *, final: bool = False) -> dict[str, Any]:
        state, part = self.state, self.part
        rows = []
        for position in sorted(self.dirty):
            local = position if part.positions is None else part.positions[position]
            rows.append([part.offset + local, encode_label(state.label(position)), self.finished.get(position), self.held.get(position)])
        self.dirty.clear()
        notices = state.notices[self.told :]
        self.told = len(state.notices)
        return {
            "part": part.part, "attempt": self.attempt, "worker": self.worker, "final": final,
            "counts": [getattr(state, name) for name in COUNTERS], "rows": rows, "notices": notices,
            "providers": [list(view) for view in state.provider_views().values()], "phase": state.phase,
        }  # fmt: skip
