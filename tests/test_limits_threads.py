"""One provider, many threads: each thread running a blocking ``map()`` has an event loop of its
own, and a module-level ``pb.Provider`` is shared by all of them, with one rate and one bound on
calls in flight for the process (or, with ``shared=``, for every process on the account).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
from provider_state import hold

import playbook as pb
from playbook.events import ProviderHoldLifted, ProviderHoldSet
from playbook.providers.provider import governor

THREADS = 6


class InFlight:
    """A tool's calls across threads: how many at once at most, and when each started (monotonic)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.started: list[float] = []

    def tool(self, provider: pb.Provider) -> pb.Tool:
        async def slow(x: str) -> str:
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
                self.started.append(time.monotonic())
            await asyncio.sleep(0.05)
            with self.lock:
                self.now -= 1
            return x + "!"

        return pb.tool(slow, provider=provider)


def map_in_threads(tool: pb.Tool) -> list[list[str]]:
    """Thread i maps 5 + i rows (so threads end at different times); returns each thread's statuses."""

    @pb.play
    async def play(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"y": await ctx.tool(tool, x=row.x)}

    statuses: list[list[str]] = [[] for _ in range(THREADS)]

    def work(i: int) -> None:
        frame = pd.DataFrame({"x": [f"{i}-{j}" for j in range(5 + i)]})
        statuses[i] = frame.play.map(play, progress=False)["play_status"].tolist()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not [thread.name for thread in threads if thread.is_alive()], "map() hung in these threads"
    return statuses


def everything_ok(statuses: list[list[str]]) -> bool:
    return all(s == ["ok"] * (5 + i) for i, s in enumerate(statuses))


@pytest.fixture(params=["local", "shared", "cluster"])
def shared(request: pytest.FixtureRequest) -> str | None:
    """Limits kept in this process, in Redis, or in a Redis Cluster (each thread's loop its own
    cluster client)."""
    where = {"local": None, "shared": "redis_url", "cluster": "cluster_url"}[request.param]
    return None if where is None else str(request.getfixturevalue(where))


def test_threads_mapping_over_one_provider_all_finish_within_its_concurrency(shared: str | None) -> None:
    """Six threads map over one provider with concurrency=4: every row of every thread is ok, and
    never more than 4 calls are in flight across them."""
    calls = InFlight()
    provider = pb.Provider("p", concurrency=4, shared=shared)
    statuses = map_in_threads(calls.tool(provider))
    assert everything_ok(statuses)
    assert len(calls.started) == sum(5 + i for i in range(THREADS)) and calls.most <= 4


def test_threads_mapping_over_one_provider_all_finish_at_its_one_rate(shared: str | None) -> None:
    """Six threads map over one provider with rps=100: every row is ok, and the calls of all the
    threads together are paced at that one rate (each thread pacing alone would be 6 times faster).
    In real time: each thread's loop has its own clock, so no virtual one spans them; only a lower
    bound on the spacing is checked, which a loaded machine (it only delays calls) cannot break."""
    calls = InFlight()
    provider = pb.Provider("p", rps=100, shared=shared)
    statuses = map_in_threads(calls.tool(provider))
    assert everything_ok(statuses)
    started = sorted(calls.started)
    assert started[-1] - started[0] >= 0.9 * (len(started) - 1) / 100


def test_a_hold_set_from_another_thread_is_told_and_lifted_on_the_listeners_loop() -> None:
    """A listener subscribed on one thread's loop hears a hold set by a call on another thread there,
    and hears it lifted when it ends, though the loop that set it has closed meanwhile."""
    provider = pb.Provider("p", max_wait=0)  # the refused call gives up at once: its loop closes
    heard: list[tuple[str, int | None]] = []
    lifted = threading.Event()

    def listener(event: Any) -> None:
        if isinstance(event, (ProviderHoldSet, ProviderHoldLifted)):
            heard.append((type(event).__name__, threading.get_ident()))
        if isinstance(event, ProviderHoldLifted):
            lifted.set()

    with LoopThread() as (loop, thread):
        asyncio.run_coroutine_threadsafe(subscribe(provider, listener), loop).result(5)
        hold(provider, 0.2)
        assert lifted.wait(10), f"the hold was never lifted: {provider!r}"
    assert heard == [("ProviderHoldSet", thread.ident), ("ProviderHoldLifted", thread.ident)]


def test_calls_waiting_for_a_probe_on_several_loops_all_hear_its_word() -> None:
    """Calls on two threads' loops that wait for the probe of a down provider are all told when it lands."""
    health = governor(pb.Provider("p")).health
    for i in range(health.DOWN_AFTER * 2):
        health.failure(float(i))
    assert health.down and health.may_probe(1e9)
    with LoopThread() as (one, _), LoopThread() as (two, _):
        asking = [threading.Event(), threading.Event()]
        waiting = [
            asyncio.run_coroutine_threadsafe(outcome(health, loop, asked), loop)
            for loop, asked in zip((one, two), asking)
        ]
        assert all(asked.wait(10) for asked in asking)  # both wait before the probe lands
        assert health.success(sent_at=1e9) and not health.down
        assert [future.result(10) for future in waiting] == ["heard", "heard"]


async def subscribe(provider: pb.Provider, listener: Callable[[Any], None]) -> None:
    governor(provider).subscribe(listener)


async def outcome(health: Any, loop: asyncio.AbstractEventLoop, asked: threading.Event) -> str:
    word = health.outcome(loop)
    asked.set()
    await word
    return "heard"


class LoopThread:
    """A loop running in a thread of its own, stopped and closed on exit."""

    def __enter__(self) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self.loop, self.thread

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
