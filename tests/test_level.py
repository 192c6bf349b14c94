"""The rows a run keeps in flight: with no ``concurrency`` given, the level grows while the
providers the rows call have room, and stops where a provider is the bound; a ``concurrency``
given is a hard cap.  Real runs in virtual time: async tools play the provider, with a latency."""

from __future__ import annotations

import asyncio
from typing import Any

import pandas as pd
from vtime import run_virtual

import playbook as pb

RATE = 40.0  # calls a second the provider allows
LATENCY = 0.5  # seconds a call takes: 16 rows in flight send 32 a second, under the rate


class Flight:
    """Rows in flight, counted by the play itself: the most at once, and when the run ended."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    def play(self, tool: pb.Tool) -> pb.Play:
        async def play(row: Any, ctx: pb.Context) -> dict[str, Any]:
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                return {"v": await ctx.tool(tool, n=row.n)}
            finally:
                self.now -= 1

        return pb.play(play, name=f"flight_{tool.name}")


def slow_tool(name: str, provider: pb.Provider | None) -> pb.Tool:
    async def fn(n: int) -> int:
        await asyncio.sleep(LATENCY)
        return n

    return pb.tool(fn, name=name, provider=provider)


def timed_run(rows: int, tool: pb.Tool, store: pb.ReceiptStore, **opts: Any) -> tuple[float, int, pb.Run]:
    """Map a play of one ``tool`` call per row in virtual time: seconds, most rows in flight, the run."""
    flight = Flight()

    async def main() -> tuple[float, pb.Run]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        run = await pd.DataFrame({"n": range(rows)}).play.arun(
            flight.play(tool), store=store, progress=False, **opts
        )
        return loop.time() - start, run

    elapsed, run = run_virtual(main())
    assert run.result["play_status"].eq("ok").all()
    return elapsed, flight.most, run


def test_default_level_grows_until_the_provider_is_the_bound(store: pb.ReceiptStore) -> None:
    """With no concurrency given, rows in flight grow past 16 while a rate-limited provider has room, and stop near its bound."""
    rows = 1000
    elapsed, most, _ = timed_run(rows, slow_tool("paced", pb.Provider("paced", rps=RATE)), store)
    bound = rows / RATE  # the provider's own bound: 25 s (16 rows in flight would take 31.25 s)
    assert elapsed <= 1.1 * bound
    # Little's law: RATE x LATENCY = 20 rows keep the provider busy; the level stops soon after.
    assert 16 < most <= 2 * RATE * LATENCY


def test_level_stays_at_the_start_where_no_limit_is_known(store: pb.ReceiptStore) -> None:
    """A provider with no known limit, or no provider, keeps the default at 16 rows in flight, while a limited one lets it grow."""
    _, unknown, _ = timed_run(300, slow_tool("open", pb.Provider("open")), store)
    _, local, _ = timed_run(300, slow_tool("local", None), store)
    _, known, _ = timed_run(300, slow_tool("known", pb.Provider("known", rps=RATE)), store)
    assert (unknown, local) == (16, 16)
    assert known > 16


def test_a_concurrency_given_is_a_hard_cap(store: pb.ReceiptStore) -> None:
    """concurrency=N is never exceeded, where the default level grows past it on the same provider."""
    provider = pb.Provider("roomy", rps=200.0)
    _, grown, _ = timed_run(400, slow_tool("roomy_a", provider), store)
    for cap in (16, 24):
        _, most, _ = timed_run(400, slow_tool(f"roomy_{cap}", provider), store, concurrency=cap)
        assert most == cap
    assert grown > 24


def test_rows_held_by_a_provider_do_not_count_against_the_level(store: pb.ReceiptStore) -> None:
    """Rows set aside on a long hold give their places up: while they wait, the other rows run at a level past 16."""
    refused: set[int] = set()

    async def stalled(n: int) -> int:
        if not refused:  # the first call is refused: the provider holds all eight rows' calls for 30 s
            refused.add(n)
            raise pb.ToolError("slow down", status=429, retry_after=30.0)
        return n

    stall = pb.tool(stalled, name="stalled", provider=pb.Provider("stalled", rps=RATE))
    paced = slow_tool("paced_on", pb.Provider("paced_on", rps=RATE))
    in_flight = 0
    starts: list[tuple[float, int]] = []  # (loop time, rows in flight) as each row attempt starts

    async def play(row: Any, ctx: pb.Context) -> dict[str, Any]:
        nonlocal in_flight
        in_flight += 1
        starts.append((asyncio.get_running_loop().time(), in_flight))
        try:
            return {"v": await ctx.tool(stall if row.n < 8 else paced, n=row.n)}
        finally:
            in_flight -= 1

    async def main() -> pb.Run:
        frame = pd.DataFrame({"n": range(600)})
        return await frame.play.arun(pb.play(play, name="held_level"), store=store, progress=False)

    run = run_virtual(main())
    assert run.result["play_status"].eq("ok").all()
    assert (
        max(n for t, n in starts if 1 < t < 29) > 16
    )  # the eight held rows wait meanwhile, holding no place
