"""Held rows, parking, sticky suspension, waterfalls, fatal errors and budget: real runs in virtual time.

Tools are async Python functions that play the provider: they raise 429s with ``retry_after``,
503s or ``RunFatal``, and log the loop time of every invocation.  ``vtime`` makes an hour-long
hold pass at once, so each test asserts the times the governor and the retry queue chose.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb
from playbook.events import ProviderDown, RowFinished, RowHeld, RowParked, RowResumed, RowStarted
from playbook.providers.limits import Backoff
from playbook.providers.provider import governor

Calls = list[tuple[float, int]]  # (loop time, n) per invocation
Events = list[tuple[float, Any]]  # (loop time, event)


def now() -> float:
    return asyncio.get_running_loop().time()


def counted(
    name: str,
    answer: Callable[[int, int], Any] = lambda n, k: n,
    *,
    provider: pb.Provider | None = None,
    latency: float = 0.0,
    cost: float = 0.0,
) -> tuple[pb.Tool, Calls]:
    """An async tool ``name(n)`` that logs each invocation and returns ``answer(n, k)`` (k: its
    k-th invocation for this n) after ``latency`` seconds; ``answer`` may raise."""
    calls: Calls = []

    async def fn(n: int) -> Any:
        calls.append((now(), n))
        await asyncio.sleep(latency)
        return answer(n, sum(m == n for _, m in calls))

    return pb.tool(fn, name=name, provider=provider, cost=cost), calls


def limited(seconds: float) -> pb.ToolError:
    return pb.ToolError("slow down", status=429, retry_after=seconds)


def unavailable() -> Any:
    raise pb.ToolError("service unavailable", status=503, retryable=True)


def refuse_first(seconds: float, times: int = 1) -> Callable[[int, int], Any]:
    """An answer that is a 429 with Retry-After ``seconds`` for the first ``times`` calls per n."""

    def answer(n: int, k: int) -> Any:
        if k <= times:
            raise limited(seconds)
        return f"found{n}"

    return answer


def down_until(moment: float) -> Callable[[int, int], Any]:
    """An answer that is a 429 holding the provider until loop time ``moment`` for rows n >= 5."""

    def answer(n: int, k: int) -> Any:
        if n >= 5 and now() < moment:
            raise limited(moment - now())
        return n * 10

    return answer


def calling(tool: pb.Tool) -> pb.Play:
    async def play(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"v": await ctx.tool(tool, n=row.n)}

    return pb.play(play, name=f"call_{tool.name}")


async def start(frame: pd.DataFrame, play: Any, store: pb.ReceiptStore, **opts: Any) -> tuple[pb.Run, Events]:
    """Start a background run and record its events with their loop times (before any is emitted)."""
    run = await frame.play.arun(play, store=store, progress=False, background=True, **opts)
    events: Events = []
    run.state.subscribe(lambda event: events.append((now(), event)))
    return run, events


async def launch(
    frame: pd.DataFrame, play: Any, store: pb.ReceiptStore, **opts: Any
) -> tuple[pb.Run, Events]:
    """Start a run and wait for it; returns the run and its timed events."""
    run, events = await start(frame, play, store, **opts)
    await run._task
    return run, events


def statuses(run: pb.Run) -> list[str]:
    return run.result["play_status"].tolist()


def of(kind: type, events: Events) -> Events:
    return [(t, e) for t, e in events if isinstance(e, kind)]


def rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({"n": range(n)})


# -- held rows ---------------------------------------------------------------------------


def test_long_hold_steps_aside_and_resumes_ahead_of_fresh_rows(store: pb.ReceiptStore) -> None:
    """A row held 30 s releases its slot, the others run on, and it resumes ahead of fresh rows, replaying its receipts."""
    first, first_calls = counted("first")
    lookup, lookup_calls = counted("lookup", refuse_first(30), provider=pb.Provider("slow"))
    work, _ = counted("work", provider=pb.Provider("fast"), latency=4.0)

    @pb.play
    async def play(row, ctx):
        a = await ctx.tool(first, n=row.n)
        return {"a": a, "b": await ctx.tool(lookup if row.n == 0 else work, n=row.n)}

    run, events = run_virtual(launch(rows(21), play, store, concurrency=2))
    assert statuses(run) == ["ok"] * 21
    assert run.result["b"].tolist() == ["found0", *range(1, 21)]
    assert sorted(n for _, n in first_calls) == list(range(21))  # row 0's first call hit its receipt
    assert lookup_calls == [(0.0, 0), (32.0, 0)]
    [(held_at, held)] = of(RowHeld, events)
    assert (held_at, held.position, held.provider, held.status) == (0.0, 0, "slow", 429)
    # Rows 1-16 fill both slots in pairs of 4 s; at 32 the first slot free after the 30 s deadline
    # goes to row 0, before the fresh rows 17-20.
    assert [(t, e.position) for t, e in of(RowResumed, events)] == [(32.0, 0)]
    assert [e.position for _, e in of(RowStarted, events)] == [0, *range(1, 17), 0, *range(17, 21)]
    finished = [e.position for _, e in of(RowFinished, events)]
    assert set(finished[: finished.index(0)]) == set(range(1, 17))
    assert run.stats.waiting == 0 and all(h.waiting_rows == 0 for h in run.waiting_on)


def test_short_hold_is_waited_out_in_place(store: pb.ReceiptStore) -> None:
    """A hold under a second is waited out by the call itself: no RowHeld, the retry comes 0.5 s later."""
    lookup, calls = counted("lookup", refuse_first(0.5), provider=pb.Provider("p"))
    run, events = run_virtual(launch(rows(1), calling(lookup), store))
    assert statuses(run) == ["ok"] and run.result["v"].tolist() == ["found0"]
    assert calls == [(0.0, 0), (0.5, 0)]
    assert of(RowHeld, events) == [] and of(RowResumed, events) == []


def test_hold_past_max_wait_parks_rows_quickly(store: pb.ReceiptStore) -> None:
    """A one-hour hold parks every row at once with reason 'hold', and run.waiting_on says who holds how many."""
    lookup, calls = counted("lookup", refuse_first(3600, times=99), provider=pb.Provider("p"), latency=0.1)

    async def main() -> tuple[pb.Run, float]:
        run, _ = await launch(rows(10), calling(lookup), store, concurrency=4)
        return run, now()

    run, elapsed = run_virtual(main())
    assert statuses(run) == ["parked"] * 10
    assert len(calls) == 4 and elapsed < 1  # only the rows in flight reached the provider
    parked = run.parked
    assert parked["reason"].tolist() == ["hold"] * 10 and parked["provider"].tolist() == ["p"] * 10
    ahead = (parked["ready_at"] - pd.Timestamp.now(tz="UTC")).dt.total_seconds()
    assert ahead.between(3500, 3700).all()
    assert all("ProviderExhausted" in m and "'p'" in m for m in parked["message"])
    [hold] = run.waiting_on
    assert (hold.provider, hold.waiting_rows, hold.parked_rows, hold.last_status) == ("p", 10, 10, 429)
    assert hold.until is not None and hold.until > time.time() + 3500
    assert (run.stats.parked, run.stats.waiting) == (10, 0)


@pytest.mark.parametrize(
    ("provider_wait", "run_wait", "expected", "call_times"),
    [(10, 100, "ok", [0.0, 30.0]), (100, 10, "parked", [0.0])],
    ids=["map-waits-longer", "map-waits-shorter"],
)
def test_map_max_wait_overrides_the_providers(
    provider_wait: float, run_wait: float, expected: str, call_times: list[float], store: pb.ReceiptStore
) -> None:
    """map(max_wait=...) decides whether a 30 s hold is waited for (resuming at its deadline) or parks the row."""
    lookup, calls = counted("lookup", refuse_first(30), provider=pb.Provider("p", max_wait=provider_wait))
    run, _ = run_virtual(launch(rows(1), calling(lookup), store, max_wait=run_wait))
    assert statuses(run) == [expected]
    assert [t for t, _ in calls] == call_times


def test_holds_that_add_up_past_max_wait_park_the_row(store: pb.ReceiptStore) -> None:
    """Successive 40 s holds are waited for until their sum would pass max_wait=100; then the row parks."""
    lookup, calls = counted("lookup", refuse_first(40, times=3), provider=pb.Provider("p", max_wait=100))
    run, events = run_virtual(launch(rows(1), calling(lookup), store))
    assert statuses(run) == ["parked"] and run.parked["reason"].tolist() == ["hold"]
    assert [t for t, _ in calls] == [0.0, 40.0, 80.0]
    assert len(of(RowHeld, events)) == 2
    assert [t for t, _ in of(RowFinished, events)] == [80.0]


def test_retry_after_the_hold_readmits_parked_rows(store: pb.ReceiptStore) -> None:
    """run.retry() once the hold has passed runs the parked rows again, and they finish ok."""
    lookup, calls = counted("lookup", down_until(3600), provider=pb.Provider("p"))

    async def main() -> tuple[list[str], pb.Run]:
        run, _ = await launch(rows(10), calling(lookup), store, concurrency=1)
        before = statuses(run)
        await asyncio.sleep(3600)
        again = run.retry()
        await again._task
        return before, again

    before, run = run_virtual(main())
    assert before == ["ok"] * 5 + ["parked"] * 5
    assert statuses(run) == ["ok"] * 10 and run.result["v"].tolist() == [n * 10 for n in range(10)]
    assert sorted(n for _, n in calls) == sorted([*range(10), 5])  # row 5 met the hold; 6-9 never called
    assert (run.stats.total, run.stats.ok, run.stats.parked, len(run.parked)) == (
        5,
        5,
        0,
        0,
    )  # the retry's own rows
    assert (run.previous.stats.ok, run.previous.stats.parked) == (5, 5)


def test_retry_gives_parked_rows_a_fresh_wait_budget(store: pb.ReceiptStore) -> None:
    """A row parked because its holds added up gets max_wait again when run.retry() re-admits it."""
    lookup, calls = counted("lookup", refuse_first(40, times=4), provider=pb.Provider("p", max_wait=100))

    async def main() -> tuple[list[str], pb.Run]:
        run, _ = await launch(rows(1), calling(lookup), store)
        before = statuses(run)
        await asyncio.sleep(3600)
        again = run.retry()  # one more 40 s hold, well within a fresh max_wait of 100 s
        await again._task
        return before, again

    before, run = run_virtual(main())
    assert before == ["parked"]
    assert statuses(run) == ["ok"] and len(calls) == 5


def test_rerun_runs_only_the_parked_rows(store: pb.ReceiptStore) -> None:
    """A new map over the same frame and store reuses finished rows and runs the parked ones."""
    lookup, calls = counted("lookup", down_until(3600), provider=pb.Provider("p"))
    play = calling(lookup)

    async def main() -> tuple[pb.Run, pb.Run]:
        first, _ = await launch(rows(10), play, store, concurrency=1)
        await asyncio.sleep(3600)
        again, _ = await launch(rows(10), play, store, concurrency=1)
        return first, again

    first, again = run_virtual(main())
    assert statuses(first) == ["ok"] * 5 + ["parked"] * 5
    assert statuses(again) == ["reused"] * 5 + ["ok"] * 5
    assert sorted(n for _, n in calls) == sorted([*range(10), 5])
    assert again.result["v"].tolist() == [n * 10 for n in range(10)]


# -- sticky suspension -------------------------------------------------------------------


@pytest.mark.parametrize("caught", [BaseException, Exception], ids=["BaseException", "Exception"])
def test_a_caught_hold_still_suspends_the_row(caught: type[BaseException], store: pb.ReceiptStore) -> None:
    """A play that swallows what ctx.tool raises is still held and replayed, ending with the real value."""
    lookup, calls = counted("lookup", refuse_first(30), provider=pb.Provider("p"))

    @pb.play
    async def swallowing(row, ctx):
        try:
            return {"x": await ctx.tool(lookup, n=row.n)}
        except caught:
            return {"x": "swallowed"}

    run, events = run_virtual(launch(rows(2), swallowing, store))
    assert statuses(run) == ["ok", "ok"] and run.result["x"].tolist() == ["found0", "found1"]
    assert len(of(RowHeld, events)) == 2 and len(of(RowResumed, events)) == 2
    assert min(t for t, _ in calls[2:]) >= 30.0


def test_the_next_call_after_a_swallowed_hold_is_not_dispatched(store: pb.ReceiptStore) -> None:
    """After a play swallows a hold, its next ctx call re-raises it instead of paying for the call."""
    lookup, _ = counted("lookup", refuse_first(30), provider=pb.Provider("p"))
    other, other_calls = counted("other")

    @pb.play
    async def carry_on(row, ctx):
        try:
            x = await ctx.tool(lookup, n=row.n)
        except BaseException:
            x = None
        return {"x": x, "y": await ctx.tool(other, n=row.n)}

    run, _ = run_virtual(launch(rows(1), carry_on, store))
    assert statuses(run) == ["ok"] and run.result["x"].tolist() == ["found0"]
    assert other_calls == [(30.0, 0)]


# -- waterfalls ----------------------------------------------------------------------------


def test_waterfall_takes_the_first_accepted_leg_and_counts_every_leg(store: pb.ReceiptStore) -> None:
    """Legs run in order; misses and falsy values pass on; run.waterfalls counts each leg's outcomes."""

    def a_answer(n: int, k: int) -> Any:
        if n == 4:
            raise ValueError("leg a broke")
        return "a0" if n == 0 else None

    a, a_calls = counted("a", a_answer)
    b, b_calls = counted("b", lambda n, k: {1: "", 2: "b2"}.get(n))
    c, c_calls = counted("c", lambda n, k: {1: "c1", 3: "c3"}.get(n))

    @pb.play
    async def play(row, ctx):
        legs = [ctx.leg(a, n=row.n), ctx.leg(b, n=row.n), ctx.leg(c, n=row.n)]
        value, source = await ctx.waterfall("email", legs, with_source=True)
        return {"value": value, "source": source}

    run, _ = run_virtual(launch(rows(6), play, store))
    out = run.result
    assert statuses(run) == ["ok", "ok", "ok", "ok", "failed", "ok"]
    assert out["value"].tolist()[:4] == ["a0", "c1", "b2", "c3"]
    assert out["source"].tolist()[:4] == ["a", "c", "b", "c"]
    assert out.loc[5, ["value", "source"]].isna().all()  # nothing accepted: (None, None)
    assert "leg a broke" in out.loc[4, "play_error"]
    assert (len(a_calls), sorted(n for _, n in b_calls), sorted(n for _, n in c_calls)) == (
        6,
        [1, 2, 3, 5],
        [1, 3, 5],
    )
    table = run.waterfalls.set_index("tool")[["hits", "misses", "unavailable", "errors", "never_reached"]]
    assert table.loc["a"].tolist() == [1, 4, 0, 1, 0]
    assert table.loc["b"].tolist() == [1, 3, 0, 0, 2]
    assert table.loc["c"].tolist() == [2, 1, 0, 0, 3]
    assert run.waterfalls["leg"].tolist() == [0, 1, 2] and set(run.waterfalls["waterfall"]) == {"email"}


def test_waterfall_accept_predicate_decides_the_winner(store: pb.ReceiptStore) -> None:
    """accept= replaces truthiness: a falsy 0 can win and an unaccepted value passes to the next leg."""
    low, _ = counted("low")
    high, high_calls = counted("high", lambda n, k: 100)

    @pb.play
    async def play(row, ctx):
        legs = [ctx.leg(low, n=row.n), ctx.leg(high, n=row.n)]
        return {"v": await ctx.waterfall("score", legs, accept=lambda v: v % 2 == 0)}

    run, _ = run_virtual(launch(rows(4), play, store))
    assert run.result["v"].tolist() == [0, 100, 2, 100]
    assert sorted(n for _, n in high_calls) == [1, 3]


def test_waterfall_leg_held_past_max_wait_falls_through_at_once(store: pb.ReceiptStore) -> None:
    """A leg whose provider holds past max_wait is unavailable at once: no waiting, the next leg answers."""
    held, held_calls = counted("held", refuse_first(3600, times=99), provider=pb.Provider("slow"))
    backup, _ = counted("backup", lambda n, k: f"b{n}")

    @pb.play
    async def play(row, ctx):
        return {"v": await ctx.waterfall("w", [ctx.leg(held, n=row.n), ctx.leg(backup, n=row.n)])}

    async def main() -> tuple[pb.Run, float]:
        run, _ = await launch(rows(4), play, store, concurrency=1)
        return run, now()

    run, elapsed = run_virtual(main())
    assert statuses(run) == ["ok"] * 4 and run.result["v"].tolist() == ["b0", "b1", "b2", "b3"]
    assert elapsed < 0.01 and len(held_calls) == 1  # later rows see the hold without calling
    table = run.waterfalls.set_index("tool")
    assert table.loc["held", ["hits", "unavailable"]].tolist() == [0, 4]
    assert table.loc["backup", "hits"] == 4


def test_waterfall_leg_unavailable_after_retries_falls_through(store: pb.ReceiptStore) -> None:
    """A leg answering 503 until its retries run out counts as unavailable and the next leg answers."""
    down, down_calls = counted("down", lambda n, k: unavailable(), provider=pb.Provider("down", retries=2))
    backup, _ = counted("backup", lambda n, k: f"b{n}")

    @pb.play
    async def play(row, ctx):
        return {"v": await ctx.waterfall("w", [ctx.leg(down, n=row.n), ctx.leg(backup, n=row.n)])}

    run, _ = run_virtual(launch(rows(3), play, store, concurrency=1))
    assert statuses(run) == ["ok"] * 3 and run.result["v"].tolist() == ["b0", "b1", "b2"]
    # Each row tries the leg three times; a row waiting to retry gives its worker to the next row.
    assert sorted(n for _, n in down_calls) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    table = run.waterfalls.set_index("tool")
    assert table.loc["down", ["hits", "misses", "unavailable", "errors"]].tolist() == [0, 0, 3, 0]


def test_waterfall_leg_must_be_a_call(store: pb.ReceiptStore) -> None:
    """A leg that is not ctx.leg(...) raises PlayDefinitionError before any leg is called."""
    backup, calls = counted("backup")

    @pb.play
    async def play(row, ctx):
        try:
            await ctx.waterfall("w", [ctx.leg(backup, n=row.n), backup])
        except pb.PlayDefinitionError as exc:
            return {"error": str(exc)}
        return {"error": None}

    run, _ = run_virtual(launch(rows(1), play, store))
    assert "leg 1 is Tool" in run.result.loc[0, "error"] and calls == []


# -- failures, fatal errors, budget, stats -----------------------------------------------


def test_503s_past_retries_fail_the_row_with_provider_unavailable(store: pb.ReceiptStore) -> None:
    """With retries=2 a provider answering 503 is tried 3 times, then the row fails naming the provider."""
    down, calls = counted("down", lambda n, k: unavailable(), provider=pb.Provider("flaky", retries=2))
    run, _ = run_virtual(launch(rows(1), calling(down), store))
    assert statuses(run) == ["failed"] and len(calls) == 3
    error = run.result.loc[0, "play_error"]
    assert error.startswith("ProviderUnavailable") and "'flaky'" in error


def test_a_row_whose_call_fails_on_its_own_retries_after_the_fresh_rows(store: pb.ReceiptStore) -> None:
    """Row 0's request always gets a 503 while the others are answered: once it has failed again
    after others were answered, it fails on its own, and its next tries wait for every fresh row
    to start (the provider's calls go to rows that may succeed first); then it fails after its
    retries, saying so and naming the tool, and the provider is neither held nor down."""
    solo = pb.Provider("solo")

    async def fn(n: int) -> int:
        if n == 0:
            await asyncio.sleep(0.05)
            raise pb.ToolError("HTTP 503 (GET /status/503)", status=503, retryable=True)
        await asyncio.sleep(1.0)
        return n

    run, events = run_virtual(
        launch(rows(21), calling(pb.tool(fn, name="lookup", provider=solo)), store, concurrency=2)
    )
    assert statuses(run) == ["failed"] + ["ok"] * 20
    error = run.result.loc[0, "play_error"]
    assert error.startswith(
        "ProviderUnavailable: tool 'lookup': this request fails on its own (provider 'solo' answers other calls)"
    )
    assert error.endswith("(gave up after 5 tries)")
    started = [e.position for _, e in of(RowStarted, events)]
    assert started.count(0) == 5
    last_fresh = started.index(20)
    assert [i for i, pos in enumerate(started) if pos == 0][-2:] > [
        last_fresh
    ] * 2  # its last two tries come after
    assert not solo.status().down and not run.waiting_on


def every_tenth_fails(
    name: str, provider: pb.Provider, *, passing: bool = False
) -> tuple[pb.Tool, Calls, list[float]]:
    """A tool whose request for every tenth row gets a 503 at once (a path built from the row that
    always answers 503; ``passing``: only its first try does), while the others are answered in
    20 ms.  It logs each invocation, and the loop time of each answer that went through."""
    calls: Calls = []
    through: list[float] = []

    async def fn(n: int) -> int:
        calls.append((now(), n))
        if n % 10 == 9 and (not passing or sum(m == n for _, m in calls) == 1):
            await asyncio.sleep(0.002)
            raise pb.ToolError(f"HTTP 503 (GET /status/503?row={n})", status=503, retryable=True)
        await asyncio.sleep(0.02)
        through.append(now())
        return n

    governor(provider).backoff = Backoff(rng=random.Random(0))
    return pb.tool(fn, name=name, provider=provider), calls, through


@pytest.mark.parametrize(
    ("size", "concurrency", "max_wait"),
    [(300, 32, 120.0), (300, 4, 120.0), (600, 32, 8.0)],
    ids=["300 rows", "300 rows, 4 in flight", "600 rows, max_wait 8s"],
)
def test_rows_whose_calls_fail_on_their_own_cost_the_others_little(
    store: pb.ReceiptStore, size: int, concurrency: int, max_wait: float
) -> None:
    """One row in ten always gets a 503, at 40 requests a second, 32 (or 4) rows in flight: once
    the provider's failed calls have gone on to fail on their own, a failing call's first failure
    already sends its row behind the rows not started yet, so the healthy rows are done within
    1.2 x the run without the failing rows.  The failing rows still fail after their retries,
    saying so, and none parks: the time a row waits behind the fresh rows (here, for 600 rows,
    longer than max_wait) is not taken from its wait budget, only its backoff is."""
    clean, _, clean_through = every_tenth_fails("clean", pb.Provider("clean", rps=40))
    clean_frame = rows(size)[lambda f: f["n"] % 10 != 9].reset_index(drop=True)
    options = {"concurrency": concurrency, "max_wait": max_wait}
    clean_run, _ = run_virtual(launch(clean_frame, calling(clean), store, **options))
    assert statuses(clean_run) == ["ok"] * len(clean_frame)
    provider = pb.Provider("failing", rps=40)
    tool, calls, through = every_tenth_fails("failing", provider)
    run, events = run_virtual(launch(rows(size), calling(tool), store, **options))
    assert statuses(run) == ["failed" if n % 10 == 9 else "ok" for n in range(size)]
    assert max(through) <= 1.2 * max(clean_through), (max(through), max(clean_through))
    errors = run.result.loc[run.result["play_status"] == "failed", "play_error"]
    assert (
        sum("this request fails on its own (provider 'failing' answers other calls)" in e for e in errors)
        >= size // 10 - 2
    )
    assert all(e.endswith("(gave up after 5 tries)") for e in errors)
    tries = {n: [t for t, m in calls if m == n] for n in range(9, size, 10)}
    assert all(len(t) == 5 for t in tries.values()) and not of(RowParked, events)
    if size > 300:  # most failing rows waited behind the fresh rows longer than their whole budget
        assert sum(t[-1] - t[0] > max_wait for t in tries.values()) >= size // 20
    assert not provider.status().down and not run.waiting_on


def test_retrying_rows_whose_calls_failed_on_their_own_does_not_take_the_provider_down(
    store: pb.ReceiptStore,
) -> None:
    """run.retry() of the rows whose requests failed on their own sends only those, with no other
    call answered between: the provider remembers them, so they fail on their own from their
    first failure (after their retries, saying so), none parks, and the provider is never held
    or down.  A request that always failed but now goes through is forgotten."""
    provider = pb.Provider("remembers", rps=40)
    calls: Calls = []
    failing = [n for n in range(200) if n % 10 == 9 and n < 150]  # the run's tail goes through

    async def fn(n: int) -> int:
        calls.append((now(), n))
        if n in failing:
            await asyncio.sleep(0.002)
            raise pb.ToolError(f"HTTP 503 (GET /status/503?row={n})", status=503, retryable=True)
        await asyncio.sleep(0.02)
        return n

    governor(provider).backoff = Backoff(rng=random.Random(0))
    tool = pb.tool(fn, name="remembers", provider=provider)

    async def main() -> tuple[pb.Run, pb.Run, Events]:
        run, first = await launch(rows(200), calling(tool), store, concurrency=32)
        assert not of(ProviderDown, first)
        calls.clear()
        again = run.retry()
        events: Events = []
        again.state.subscribe(lambda event: events.append((now(), event)))
        await again._task
        return run, again, events

    run, again, events = run_virtual(main())
    expected = ["failed" if n in failing else "ok" for n in range(200)]
    assert statuses(run) == expected and statuses(again) == expected
    errors = again.result.loc[again.result["play_status"] == "failed", "play_error"]
    assert len(errors) == 15 and all(
        "this request fails on its own (provider 'remembers' answers other calls)" in e for e in errors
    )
    assert all(e.endswith("(gave up after 5 tries)") for e in errors)
    assert len(calls) == 75 and not of(RowParked, events) and not of(ProviderDown, events)
    assert not provider.status().down and not again.waiting_on


def test_a_provider_whose_503s_pass_keeps_retrying_at_once(store: pb.ReceiptStore) -> None:
    """One row in ten gets a 503 on its first try only (a provider with passing 503s): its retry
    goes at once (after its backoff), ahead of the rows not started yet, as every retry that went
    through says the provider's failures are the moment's; every row is done."""
    tool, calls, _ = every_tenth_fails("passing", pb.Provider("passing", rps=40), passing=True)
    run, _ = run_virtual(launch(rows(300), calling(tool), store, concurrency=32))
    assert statuses(run) == ["ok"] * 300
    tries = {n: [t for t, m in calls if m == n] for n in range(9, 300, 10)}
    assert all(len(t) == 2 and t[1] - t[0] <= 1.5 for t in tries.values()), tries


def test_a_provider_learns_again_that_its_503s_pass(store: pb.ReceiptStore) -> None:
    """Rows 0-149: one in ten always gets a 503, so the provider learns that its failed calls fail
    on their own and sends them behind the fresh rows at once; rows 150-449: one in ten gets a
    503 on its first try only.  The few of those sent behind before one retry went through (one
    in Health.SAMPLE goes at once, to find out) do not stop the rest from retrying at once."""
    provider = pb.Provider("mixed", rps=40)
    tool, calls, _ = every_tenth_fails("mixed.always", provider)
    passing, passing_calls, _ = every_tenth_fails("mixed.passing", provider, passing=True)

    @pb.play
    async def play(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"v": await ctx.tool(tool if row.n < 150 else passing, n=row.n)}

    run, _ = run_virtual(launch(rows(450), play, store, concurrency=32))
    assert statuses(run) == ["failed" if n < 150 and n % 10 == 9 else "ok" for n in range(450)]
    first = {n: [t for t, m in calls if m == n] for n in range(9, 150, 10)}
    # Learnt from rows 9 and 19 (their retries failed on their own): most failing rows after them
    # (but those that failed before it was learnt, and one in Health.SAMPLE) waited for the fresh rows.
    assert sum(t[1] - t[0] > 1.5 for t in first.values()) >= 6
    tries = {n: [t for t, m in passing_calls if m == n] for n in range(159, 450, 10)}
    assert sum(t[1] - t[0] <= 1.5 for t in tries.values()) >= 24, tries


def test_run_fatal_stops_the_run(store: pb.ReceiptStore) -> None:
    """RunFatal from a tool stops the run at once: it is raised, nothing more is dispatched, calls already
    sent land (here: fail as the first did), the rest is skipped."""

    def bad_key(n: int, k: int) -> Any:
        raise pb.RunFatal("bad key", provider="p", status=401)

    keyed, calls = counted("keyed", bad_key, provider=pb.Provider("p"), latency=1.0)

    async def main() -> pb.Run:
        with pytest.raises(pb.RunFatal, match="bad key"):
            await launch(rows(50), calling(keyed), store, concurrency=4)
        return pb.last_run()

    run = run_virtual(main())
    assert 1 <= len(calls) <= 4
    result = statuses(run)
    assert result.count("failed") == len(calls) and result.count("skipped") == 50 - len(calls)
    assert set(run.result.loc[[s == "failed" for s in result], "play_error"]) == {"RunFatal: bad key"}
    assert set(run.result.loc[[s == "skipped" for s in result], "play_error"]) == {"not run: bad key"}
    with pytest.raises(pb.RunFatal, match="bad key"):  # the blocking map() raises it too
        rows(5).play.map(calling(keyed), store=store, progress=False, concurrency=4)


@pytest.mark.parametrize("status", [401, 402, 403])
def test_a_python_tools_credential_error_is_fatal_too(status: int, store: pb.ReceiptStore) -> None:
    """A Python tool raising ToolError with 401/402/403 stops the run like an HTTP tool's does."""

    def refused(n: int, k: int) -> Any:
        raise pb.ToolError("unauthorized", status=status)

    keyed, calls = counted("sdk", refused, latency=1.0)

    async def main() -> pb.Run:
        with pytest.raises(pb.RunFatal, match=f"'sdk'.*status {status}"):
            await launch(rows(20), calling(keyed), store, concurrency=4)
        return pb.last_run()

    run = run_virtual(main())
    assert 1 <= len(calls) <= 4
    assert statuses(run).count("skipped") >= 16


def test_budget_parks_rows_past_max_cost(store: pb.ReceiptStore) -> None:
    """With cost=1 and max_cost=3, three rows pay and finish; the rest park with reason 'budget'."""
    paid, calls = counted("paid", provider=pb.Provider("p"), latency=1.0, cost=1.0)
    run, _ = run_virtual(launch(rows(6), calling(paid), store, concurrency=4, max_cost=3))
    assert sorted(statuses(run)) == ["ok"] * 3 + ["parked"] * 3 and len(calls) == 3
    assert run.parked["reason"].tolist() == ["budget"] * 3
    assert run.stats.cost_spent == 3.0 and run.waiting_on == []


def test_stats_count_held_rows_while_they_wait_and_parked_rows_at_the_end(store: pb.ReceiptStore) -> None:
    """stats.waiting counts rows in the retry queue while they wait and is 0 at the end; stats.parked matches run.parked."""

    def short(n: int, k: int) -> Any:
        if now() < 30:
            raise limited(30 - now())
        return n

    brief, _ = counted("brief", short, provider=pb.Provider("a"))
    long, _ = counted("long", refuse_first(3600, times=99), provider=pb.Provider("b"))

    @pb.play
    async def play(row, ctx):
        return {"v": await ctx.tool(brief if row.n % 2 == 0 else long, n=row.n)}

    async def main() -> tuple[pb.Run, list[int]]:
        run, _ = await start(rows(6), play, store, concurrency=2)
        held: list[int] = []
        run.state.subscribe(lambda e: held.append(run.stats.waiting) if isinstance(e, RowHeld) else None)
        await run._task
        return run, held

    run, held = run_virtual(main())
    assert statuses(run) == ["ok", "parked"] * 3
    assert held == [1, 2, 3]
    assert (run.stats.waiting, run.stats.ok, run.stats.parked, len(run.parked)) == (0, 3, 3, 3)


def test_a_held_batch_suspends_every_member_and_replays_them(store: pb.ReceiptStore) -> None:
    """A batch call held by its provider suspends each member row; they come back and finish."""
    batches: list[tuple[float, list[int]]] = []

    @pb.tool(provider=pb.Provider("bulk"), batch_size=10)
    async def lookup(items: list[int]) -> list[int]:
        batches.append((now(), list(items)))
        if len(batches) == 1:
            raise limited(30)
        return [n * 10 for n in items]

    async def play(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"v": await ctx.tool(lookup, row.n)}

    run, events = run_virtual(launch(rows(4), pb.play(play), store))
    assert statuses(run) == ["ok"] * 4
    assert run.result["v"].tolist() == [0, 10, 20, 30]
    assert len(of(RowHeld, events)) == 4
    assert [sorted(items) for _, items in batches] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert batches[1][0] == pytest.approx(30.0, abs=0.01)


def test_stop_settles_held_rows_as_skipped(store: pb.ReceiptStore) -> None:
    """run.stop() while rows wait in the retry queue settles them as skipped; nothing stays held."""
    slow, _ = counted("slow", refuse_first(600), provider=pb.Provider("p", max_wait=3600))

    async def main() -> pb.Run:
        run, _ = await start(rows(3), calling(slow), store)
        await asyncio.sleep(5)
        assert run.stats.waiting == 3
        run.stop()
        await run._task
        return run

    run = run_virtual(main())
    assert statuses(run) == ["skipped"] * 3
    assert run.stats.waiting == 0 and run.stats.skipped == 3


@pytest.mark.parametrize(
    ("latency", "landed"), [(3.0, 4), (60.0, 0)], ids=["within the grace", "past the grace"]
)
def test_stop_lets_calls_in_flight_land_their_receipts(
    store: pb.ReceiptStore, latency: float, landed: int
) -> None:
    """run.stop() starts nothing more, lets the calls already sent land their receipts (up to the
    grace), settles every unfinished row as skipped; a rerun pays only for what never landed."""
    slow, calls = counted("slow", latency=latency, provider=pb.Provider("p", concurrency=4))

    async def main() -> pb.Run:
        run, _ = await start(rows(20), calling(slow), store, concurrency=4)
        await asyncio.sleep(1.0)  # four calls are on the wire
        run.stop()
        await run._task
        return run

    run = run_virtual(main())
    assert len(calls) == 4 and statuses(run) == ["skipped"] * 20
    assert store.stats()["receipts"] == landed
    again = run_virtual(launch(rows(20), calling(slow), store))[0]
    assert again.stats.calls_executed == 20 - landed and again.stats.calls_reused == landed


def test_waterfall_passes_a_down_provider_at_once(store: pb.ReceiptStore) -> None:
    """Once a leg's provider is down (connections refused), later rows' waterfalls go straight to
    the next leg: no call to it, no waiting, every row answered by the backup."""

    def refused(n: int, k: int) -> Any:
        raise ConnectionRefusedError("connection refused")

    dead, dead_calls = counted("dead", refused, provider=pb.Provider("dead", retries=1))
    backup, _ = counted("backup", lambda n, k: f"b{n}")

    @pb.play
    async def play(row, ctx):
        return {"v": await ctx.waterfall("w", [ctx.leg(dead, n=row.n), ctx.leg(backup, n=row.n)])}

    run, events = run_virtual(launch(rows(60), play, store, concurrency=4))
    assert statuses(run) == ["ok"] * 60 and run.result["v"].tolist() == [f"b{n}" for n in range(60)]
    assert len(dead_calls) <= 16  # a few failures took it down; the other rows never called it
    assert events[-1][0] < 5.0  # no row waited out a backoff per try
    assert run.waterfalls.loc[0, "unavailable"] == 60


def test_rows_parked_on_a_down_provider_come_back_in_the_run_when_it_does(store: pb.ReceiptStore) -> None:
    """A provider down for its first 3 s, with a wait budget shorter than its first probe, parks
    its rows; while other rows keep the run going, one parked row probes it when due, and once a
    probe goes through every parked row runs again: the run ends with all rows ok, nothing left parked."""

    def flaky(n: int, k: int) -> Any:
        if now() < 3.0:
            raise ConnectionRefusedError("connection refused")
        return f"e{n}"

    email, email_calls = counted("email", flaky, provider=pb.Provider("mail", retries=1, max_wait=0.5))
    slow, _ = counted("slow", lambda n, k: n, latency=20.0)

    @pb.play
    async def play(row, ctx):
        if row.n < 2:
            return {"v": await ctx.tool(slow, n=row.n)}  # keeps the run going for 20 s
        return {"v": await ctx.tool(email, n=row.n)}

    run, events = run_virtual(launch(rows(40), play, store, concurrency=8))
    assert statuses(run) == ["ok"] * 40
    parked = [e for _, e in of(RowParked, events)]
    assert parked and {e.reason for e in parked} == {"down"}
    assert len(email_calls) <= 38 + 16  # each row at most once more than its success, a few probes
    assert run.waiting_on == [] and run.parked.empty


@pytest.mark.parametrize(
    ("outage", "max_wait"), [(5.0, 60.0), (30.0, 4.0)], ids=["outage within the budget", "outage past it"]
)
def test_a_down_provider_holds_its_rows_within_their_wait_budget(
    store: pb.ReceiptStore, outage: float, max_wait: float
) -> None:
    """A provider that answers 503 without a hint while it restarts goes down; its rows wait for
    the next probe (held, not parked) while that falls within their max_wait, and finish when it is
    back, each answered once.  With a budget the probes outgrow, the rows park "down" instead, no
    row fails, and the run ends: a provider that stays down does not keep it going."""

    def restarting(n: int, k: int) -> Any:
        if now() < outage:
            raise pb.ToolError("service unavailable", status=503, retryable=True)
        return f"e{n}"

    email, calls = counted("email", restarting, provider=pb.Provider("mail", max_wait=max_wait), latency=0.05)
    run, events = run_virtual(launch(rows(100), calling(email), store, concurrency=16))
    held = {e.provider for _, e in of(RowHeld, events)}
    if outage < max_wait:
        assert statuses(run) == ["ok"] * 100 and run.parked.empty
        assert held == {"mail"} and not of(RowParked, events)
        assert events[-1][0] < outage + 3  # probes 1, 1.5, 2.25... s apart: one soon after it is back
        assert sum(t + 0.05 >= outage for t, _ in calls) == 100  # each row answered once, once it was back
        assert (
            len(calls) <= 100 + 32 + 5
        )  # failures: those that took it down, and the probes; no row retried alone
    else:
        assert set(statuses(run)) == {"parked"} and set(run.parked["reason"]) == {"down"}
        assert "past this row's wait budget" in run.parked["message"].iloc[0]
        assert events[-1][0] < max_wait + 5


def test_a_provider_named_sleep_is_not_confused_with_sleeping_rows(tmp_path: Path) -> None:
    """Rows held by a user's provider named "sleep" and rows in ctx.sleep are told apart: run.waiting_on and
    the live tally count only the held ones against the provider; the state counts the sleepers apart."""
    from playbook.ui.tally import KINDS, Tally

    napping = pb.Provider("sleep", max_wait=3600)
    tool, _ = counted("nap_tool", refuse_first(60), provider=napping)

    @pb.play
    async def play(row, ctx):
        if row.n % 2:
            await ctx.sleep(100)
            return {"v": row.n}
        return {"v": await ctx.tool(tool, n=row.n)}

    # The store's clock is the virtual loop's, so a sleep's stored wake time passes in virtual time.
    store = pb.ReceiptStore(tmp_path / "store", clock=lambda: 1_800_000_000.0 + now())

    async def main() -> tuple[pb.Run, list[Any]]:
        run, _ = await start(rows(6), play, store)
        tally = Tally(run.state.label)
        run.state.subscribe(tally.on_event, kinds=KINDS)
        await asyncio.sleep(10)
        state = run.state
        kinds = sorted(w.kind for w in state.waiting_rows().values())
        seen = [
            run.waiting_on,
            state.waiting,
            state.sleeping,
            kinds,
            tally.waiting(),
            Tally.of(state).waiting(),
        ]
        await run._task
        return run, seen

    run, (holds, held, sleeping, kinds, live, scanned) = run_virtual(main())
    assert [(h.provider, h.waiting_rows, h.parked_rows) for h in holds] == [("sleep", 3, 0)]
    assert (held, sleeping, kinds) == (6, 3, ["provider"] * 3 + ["sleep"] * 3)
    assert live == scanned == {"sleep": 3}
    assert statuses(run) == ["ok"] * 6


def test_a_provider_that_stays_down_ends_the_run_with_its_rows_parked(store: pb.ReceiptStore) -> None:
    """More rows than workers on a provider that never comes back: the rows wait for its probes
    up to max_wait, then park; a parked row taken back as a later probe does not wait again, so
    the run ends (it used to go round for ever, each probe row waiting afresh)."""

    def refused(n: int, k: int) -> Any:
        raise ConnectionRefusedError("connection refused")

    gone, calls = counted("gone", refused, provider=pb.Provider("gone", max_wait=120))

    async def staggered(n: int) -> int:
        await asyncio.sleep(n * 5.0)  # the rows reach the provider over four minutes
        return n

    @pb.play
    async def play(row, ctx):
        await ctx.tool(pb.tool(staggered, version="1"), n=row.n)
        return {"v": await ctx.tool(gone, n=row.n)}

    run, events = run_virtual(launch(rows(50), play, store, concurrency=16))
    assert statuses(run) == ["parked"] * 50 and set(run.parked["reason"]) == {"down"}
    # The last rows reach the provider after ~6 minutes (16 workers, each row's wait of n * 5 s first),
    # then wait their two minutes; without the fix it went round for hours of probes.
    assert events[-1][0] < 900
    assert len(calls) <= 50 + 60  # the failures that took it down, then one probe at a time


def test_a_mistaken_ctx_call_fails_its_row_even_inside_a_broad_except(store: pb.ReceiptStore) -> None:
    """ctx.tool(..., on_exhausted="ignore") is the play's mistake, not the row's: the row fails
    with it even when the play catches everything, instead of storing the fallback as its answer."""
    lookup, calls = counted("lookup")

    @pb.play
    async def careless(row, ctx):
        try:
            return {"v": await ctx.tool(lookup, n=row.n, on_exhausted="ignore")}
        except Exception:
            return {"v": "fallback"}

    run, _ = run_virtual(launch(rows(3), careless, store))
    assert statuses(run) == ["failed"] * 3 and calls == []
    assert run.result["play_error"].str.contains("on_exhausted must be 'park' or 'raise'").all()
