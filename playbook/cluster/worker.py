"""A partition's run on a Dask worker: the local engine over its rows, reporting to the job.

The play and its options arrive pickled once per job (``payload``); providers in it arrive with
their limits shared at the job's Redis (see :func:`playbook.providers.provider.sharing_limits`), so every
worker paces one account together.  Each worker thread keeps one event loop and one store per
Redis URL across partitions, as a script's thread does across ``map()`` calls.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid
from dataclasses import replace
from typing import Any, NamedTuple

import pandas as pd

from playbook._internal.loop import run_sync
from playbook.cluster.budget import SharedCostBudget
from playbook.cluster.results import reassembled
from playbook.cluster.wire import COUNTERS, Channel, encode_label
from playbook.errors import PlaybookError, RunFatal
from playbook.events import (
    Event,
    RowFinished,
    RowHeld,
    RowParked,
    RowRequeued,
    RowResumed,
    RowSleeping,
    RunFinished,
)
from playbook.plays.play import Play, as_play
from playbook.runtime.options import RunOptions
from playbook.runtime.run import begin_background, start
from playbook.runtime.state.reading import RunState
from playbook.store import StoreEngine

__all__ = ["Failure", "Part", "partition_error", "run_partition"]

_INTERVAL = 0.25  # seconds between a partition's reports


class Part(NamedTuple):
    """One partition's task: its place in the job and what of it to run."""

    job: str
    part: int  # the partition's number
    offset: int  # the job-wide position of its first row
    store: str  # the job's Redis URL: receipts, memos, limits and reports
    limit: int | None  # run only its first N rows (the job's limit= reaches into it)
    positions: tuple[int, ...] | None  # a retry: only these rows (positions in the partition)
    trace: dict[str, str] | None = (
        None  # the job's run span as W3C trace headers: the partition's continue it
    )


class Failure(NamedTuple):
    """What a partition's run raised (a 401, a row's error under ``on_error="raise"``), given back
    instead of raised: Dask logs a task that raises as a failed computation, a traceback per
    partition on every worker, where the client says it once."""

    error: BaseException
    worker: str


def partition_error(
    play: str, part: int, exc: BaseException | None, on_error: str, worker: str = ""
) -> BaseException:
    """What the client raises for partition ``part`` that could not finish (``exc``: what it raised,
    if known)."""
    if isinstance(exc, RunFatal):
        # what stops a local run too (a 401, a missing secret): said where it was met
        return RunFatal(f"{exc} (on the Dask worker at {worker}: it reads its own environment)")
    if exc is not None and (on_error == "raise" or isinstance(exc, PlaybookError)):
        return exc  # a row's own error (on_error="raise")
    name = type(exc).__name__
    return RunFatal(
        f"play {play!r}: partition {part} could not be run on the cluster ({name}: {exc}); the other partitions were "
        "stopped. What finished is saved in Redis: running the same map again pays only for what is missing"
    )


class _Local(threading.local):
    def __init__(self) -> None:
        self.stores: dict[str, StoreEngine] = {}


_local = _Local()
_channels: dict[tuple[str, str], Channel] = {}
_channels_lock = threading.Lock()


def run_partition(
    frame: pd.DataFrame, payload: bytes, part: Part, previous: pd.DataFrame | None = None
) -> pd.DataFrame | Failure:
    """Run the job's play over ``frame`` (one partition) and return its result.  A retry
    (``part.positions``, with the partition's ``previous`` result) runs those rows and the rows
    done before, which come back from their memos; rows failed or parked and not retried keep
    their previous outcome."""
    import cloudpickle

    try:
        play, options = cloudpickle.loads(payload)
        opts = RunOptions.parse({**options, "progress": False, "background": True})
        if opts.max_cost is not None:  # the job's budget, which every partition spends from
            opts = replace(opts, budget=SharedCostBudget(opts.max_cost, part.store, part.job))
        ran: list[int] | None = None
        if part.positions is not None and previous is not None:
            chosen = set(part.positions)
            done = previous["play_status"].isin(("ok", "reused")).tolist()
            ran = [p for p in range(len(frame)) if p in chosen or done[p]]
        rows = frame if ran is None else frame.iloc[ran]
        if part.limit is not None:
            rows = rows.iloc[: part.limit]
        result = run_sync(_drive(rows, as_play(play), opts, _store(part.store), _channel(part), part, ran))
        if ran is not None and previous is not None and part.positions is not None:
            result = reassembled(previous, result, ran, part.positions, list(frame.columns))
    except Exception as exc:
        return Failure(_portable(exc), worker_name())
    return result


def _portable(exc: BaseException) -> BaseException:
    """``exc``, if it survives the trip to the client; else a PlaybookError saying what it was
    (an exception whose constructor takes keyword-only arguments cannot be unpickled)."""
    import cloudpickle

    try:
        cloudpickle.loads(cloudpickle.dumps(exc))
    except Exception:
        return PlaybookError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
    return exc


async def _drive(
    rows: pd.DataFrame,
    play: Play,
    opts: RunOptions,
    store: StoreEngine,
    channel: Channel,
    part: Part,
    ran: list[int] | None,
) -> pd.DataFrame:
    attempt = uuid.uuid4().hex[:12]  # a partition run again (its worker died) is a new attempt
    # Its paid calls are counted with their receipts, where the client reads them if this
    # worker dies before its last report (the calls it paid since the one before are then in
    # no report).
    store.tally = (channel.paid, attempt)
    try:
        return await _run(rows, play, opts, store, channel, part, ran, attempt)
    finally:
        store.tally = None


async def _run(
    rows: pd.DataFrame,
    play: Play,
    opts: RunOptions,
    store: StoreEngine,
    channel: Channel,
    part: Part,
    ran: list[int] | None,
    attempt: str,
) -> pd.DataFrame:
    run = begin_background(start(rows, play, opts, store, trace=part.trace))
    relay = _Relay(run.state, part, ran, attempt)
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


def _store(url: str) -> StoreEngine:
    store = _local.stores.get(url)
    if store is None:
        store = _local.stores[url] = StoreEngine(url)
        store.lost = None  # the job's client checked the store's mark before it sent anything (frames.py)
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


class _Relay:
    """What a partition's run reports: its counters, providers, and rows whose state changed."""

    def __init__(self, state: RunState, part: Part, ran: list[int] | None, attempt: str) -> None:
        self.state = state
        self.part = part
        self.ran = ran  # a retry: the partition's position of each row run
        chosen = set(part.positions or ())
        # A retry's rows that were done before: they count in the job as they did, not again.
        self.carried = {j for j, p in enumerate(ran or ()) if p not in chosen}
        self.carried_counts = [0.0] * len(COUNTERS)
        self.attempt = attempt
        self.worker = worker_name()
        # position -> [status, error, copies, reason, provider, ready_at, group]
        self.finished: dict[int, list[Any]] = {}
        self.parking: dict[int, tuple[str, str | None, float | None]] = {}
        self.held: dict[int, list[Any]] = {}  # position -> [kind, provider, until, status]
        self.dirty: set[int] = set()
        self.told = 0  # notices sent
        kinds = (RowFinished, RowParked, RowRequeued, RowHeld, RowSleeping, RowResumed)
        self._unsubscribe = state.subscribe(self.on_event, kinds=kinds)

    def close(self) -> None:
        self._unsubscribe()

    def on_event(self, event: Event) -> None:
        kind = type(event)
        position: int = event.position  # type: ignore[union-attr]  # every kind subscribed has one
        if kind is RowFinished:
            assert isinstance(event, RowFinished)
            if position in self.carried:
                self._carry(event)
                return
            if event.status in ("failed", "parked"):
                reason, provider, ready = self.parking.pop(position, ("", None, None))
                self.finished[position] = [
                    event.status,
                    event.error,
                    event.copies,
                    reason,
                    provider,
                    ready,
                    event.group,
                    event.cost_failed,
                ]
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

    def _carry(self, event: RowFinished) -> None:
        counts = self.carried_counts
        counts[COUNTERS.index("total")] += event.copies
        counts[COUNTERS.index(event.status)] += event.copies
        if event.status == "reused":
            counts[COUNTERS.index("calls_reused")] += event.calls
            counts[COUNTERS.index("cost_saved")] += event.cost
            counts[COUNTERS.index("reused_unpriced")] += event.unpriced

    def report(self, *, final: bool = False) -> dict[str, Any]:
        state, part = self.state, self.part
        rows = []
        for position in sorted(self.dirty):
            local = position if self.ran is None else self.ran[position]
            rows.append(
                [
                    part.offset + local,
                    encode_label(state.label(position)),
                    self.finished.get(position),
                    self.held.get(position),
                ]
            )
        self.dirty.clear()
        notices = state.notices[self.told :]
        self.told = len(state.notices)
        return {
            "part": part.part,
            "attempt": self.attempt,
            "worker": self.worker,
            "final": final,
            "counts": [
                getattr(state, name) - carried for name, carried in zip(COUNTERS, self.carried_counts)
            ],
            "rows": rows,
            "notices": notices,
            "waterfalls": state.leg_rows(),
            "providers": [list(view) for view in state.provider_views().values()],
            "phase": state.phase,
        }
