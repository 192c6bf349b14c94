"""A hold that arrives while calls wait for their turn or their paced slot: each waiting call is
judged against its row's wait budget at once (parked, suspended as a held row, or waited out in
place), never left asleep until the hold ends.

In virtual time (tests/vtime.py) the loop clock at the end of a run says how long the governor
made it wait; against the demo provider, its counters say which calls reached it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pandas as pd
import pytest
from vtime import FrozenClock, run_virtual

import playbook as pb
from playbook.demo.settings import DEMO_KEY
from playbook.events import RowHeld
from playbook.ui.html import parked_table
from playbook.ui.tally import Tally
from playbook.ui.text import summary


def quota_tool(provider: pb.Provider, quota: int, reset: float) -> tuple[pb.Tool, list[float]]:
    """An async tool whose first ``quota`` calls answer; the next get 429 with Retry-After ``reset``."""
    calls: list[float] = []

    async def lookup(n: int) -> str:
        calls.append(asyncio.get_running_loop().time())
        k = len(calls)
        await asyncio.sleep(0.001)  # answered before the next paced call goes
        if k > quota:
            raise pb.ToolError("daily quota exceeded", status=429, retry_after=reset)
        return f"found{n}"

    return pb.tool(lookup, provider=provider), calls


def calling(tool: pb.Tool) -> pb.Play:
    async def play(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"v": await ctx.tool(tool, n=row.n)}

    return pb.play(play, name="calling")


async def launch(
    frame: pd.DataFrame, play: pb.Play, store: pb.ReceiptStore, **opts: Any
) -> tuple[pb.Run, list[Any], float]:
    """Run ``play`` in the background; returns the run, its events and the loop time it ended at."""
    run = await frame.play.arun(play, store=store, progress=False, background=True, **opts)
    events: list[Any] = []
    run.state.subscribe(events.append)
    while run.running:
        await asyncio.sleep(0.01)
    return run, events, asyncio.get_running_loop().time()


@pytest.mark.parametrize(
    "limits",
    [{"rps": 50, "concurrency": 8}, {"rps": 5, "burst": 2}],
    ids=["rps-and-concurrency", "rps-and-burst"],
)
def test_a_hold_past_max_wait_parks_the_rows_queued_for_a_paced_slot_at_once(
    limits: dict[str, int], store: pb.ReceiptStore
) -> None:
    """Rows queued for a paced slot when a 600 s quota hold arrives park at once (max_wait=5): no
    call of theirs reaches the provider and the run ends long before the hold does."""
    lookup, calls = quota_tool(pb.Provider("acme", **limits), quota=3, reset=600)
    frame = pd.DataFrame({"n": range(8)})
    run, _, ended = run_virtual(launch(frame, calling(lookup), store, max_wait=5, concurrency=16))
    assert run.result["play_status"].tolist() == ["ok"] * 3 + ["parked"] * 5
    parked = run.parked
    assert parked["reason"].tolist() == ["hold"] * 5 and parked["provider"].tolist() == ["acme"] * 5
    assert all("ProviderExhausted" in message and "max_wait" in message for message in parked["message"])
    assert len(calls) == 4  # the three answered and the one refused: the queued rows never went
    assert ended < 5  # loop seconds: nobody slept through the hold


def test_a_hold_within_max_wait_suspends_the_rows_queued_for_a_paced_slot(store: pb.ReceiptStore) -> None:
    """Rows queued for a paced slot when a 30 s hold arrives become held rows (their workers freed),
    and resume and finish after it."""
    left = {"answers": 3}

    async def refuse_once(n: int) -> str:  # the quota is back once the hold is over
        left["answers"] -= 1
        if left["answers"] == -1:
            raise pb.ToolError("daily quota exceeded", status=429, retry_after=30)
        return f"found{n}"

    tool = pb.tool(refuse_once, name="lookup", provider=pb.Provider("acme", rps=5))
    frame = pd.DataFrame({"n": range(8)})
    run, events, ended = run_virtual(launch(frame, calling(tool), store, max_wait=100, concurrency=16))
    assert run.result["play_status"].tolist() == ["ok"] * 8
    held = sorted(e.position for e in events if isinstance(e, RowHeld))
    assert held == list(range(3, 8))  # the refused row and every row queued behind it
    assert 30 <= ended < 35


def test_demo_quota_used_up_parks_every_waiting_row_without_waiting(store: pb.ReceiptStore) -> None:
    """The demo provider's quota runs out mid-run (429, Retry-After the quota's reset): the rows
    waiting for their slot park at once with the refused one, and only one call is refused."""
    with pb.demo.serve(clock=FrozenClock(), quota=3, quota_reset=20) as demo:
        acme = pb.Provider("acme", rps=50, concurrency=8)
        company = pb.http_tool(
            "acme.company",
            provider=acme,
            method="GET",
            url=demo.url + "/v1/company",
            params={"domain": "{domain}"},
            headers={"Authorization": "Bearer demo-key"},
            cost=2.0,
        )

        @pb.play
        async def co_only(row: Any, ctx: pb.Context) -> dict[str, Any]:
            return {"c": await ctx.tool(company, domain=row.domain)}

        frame = pd.DataFrame(
            {"domain": ["acme.com", "globex.io", "hooli.com", "initech.net", "umbrella.org"]}
        )
        run = frame.play.run(co_only, store=store, max_wait=5, concurrency=16, progress=False)
        stats = demo.stats()
    assert run.result["play_status"].tolist() == ["ok"] * 3 + ["parked"] * 2
    assert run.parked["reason"].tolist() == ["hold"] * 2 and run.parked["provider"].tolist() == ["acme"] * 2
    assert stats["quota_exceeded"] == 1  # the waiting row did not go again after the hold
    assert run.stats.elapsed < 5  # max_wait: not the 20 s hold


def test_a_spent_daily_quota_parks_every_row_at_once_naming_it_even_within_max_wait(
    store: pb.ReceiptStore,
) -> None:
    """A refusal naming a per-day quota (ToolError.quota, reset 60 s away, max_wait=600): no retry
    beats it, so the provider holds until the reset and the refused rows and those behind them
    park at once, their reason naming the quota; refused <= calls in flight, none retried."""
    calls: list[float] = []
    daily = "GenerateRequestsPerDayPerProjectPerModel-FreeTier"

    async def generate(n: int) -> str:
        calls.append(asyncio.get_running_loop().time())
        k = len(calls)
        await asyncio.sleep(0.05)
        if k > 3:
            raise pb.ToolError("quota exceeded", status=429, retry_after=60, quota=daily)
        return f"text{n}"

    tool = pb.tool(generate, name="generate", provider=pb.Provider("gemini", concurrency=4))
    frame = pd.DataFrame({"n": range(20)})
    run, _, ended = run_virtual(launch(frame, calling(tool), store, max_wait=600, concurrency=4))
    statuses = run.result["play_status"].tolist()
    assert statuses.count("ok") == 3 and statuses.count("parked") == 17
    parked = run.parked
    assert set(parked["reason"]) == {f"quota: {daily}"} and set(parked["provider"]) == {"gemini"}
    assert all(daily in message for message in parked["message"])
    assert len(calls) - 3 <= 4  # refused: at most the calls that were in flight, none retried
    assert ended < 5  # loop seconds: parked at once, not after the reset
    lines = summary(run.state, Tally.of(run.state)).splitlines()
    assert any(
        line.startswith("provider 'gemini'") and f"17 rows parked (quota: {daily})" in line for line in lines
    ), lines
    assert parked_table(Tally.of(run.state).parked_summary(5), 1).count(f"quota {daily} spent") == 1


def test_gemini_spending_its_daily_quota_parks_the_rest_at_once_naming_it(
    store: pb.ReceiptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's Gemini allows 5 requests a day: the rest of 30 rows park within the run
    (max_wait=600, the reset hours away), their reason naming the daily quota the refusal's
    QuotaFailure named; the demo refused at most the calls in flight, none retried."""
    monkeypatch.setenv("PLAYBOOK_TEST_GEMINI_KEY", DEMO_KEY)
    with pb.demo.serve(in_process=True, gemini_rpd=5) as demo:
        llm = pb.llm_tool(
            "ask",
            api="gemini",
            model="demo-mini",
            base_url=demo.url,
            secret=pb.secret("PLAYBOOK_TEST_GEMINI_KEY"),
            provider=pb.Provider("gemini", concurrency=4),
        )

        async def ask(row: Any, ctx: pb.Context) -> Any:
            return await ctx.tool(llm, prompt=f"Classify company {row.n}")

        frame = pd.DataFrame({"n": range(30)})
        out = frame.play.run(
            pb.play(ask, name="ask"), store=store, progress=False, max_wait=600, concurrency=4
        )
        refused = demo.stats()["by_api"]["gemini"]["rate_limited"]
    statuses = out.result["play_status"].tolist()
    assert statuses.count("ok") == 5 and statuses.count("parked") == 25
    assert set(out.parked["reason"]) == {"quota: GenerateRequestsPerDayPerProjectPerModel"}
    assert 1 <= refused <= 4  # the calls in flight when the quota ran out
    assert out.stats.elapsed < 30


def test_anthropic_overloaded_for_half_the_calls_fails_no_row(
    store: pb.ReceiptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's Anthropic answers 529 overloaded_error (no retry-after) to half the requests: an
    overload is the provider's, held with a backoff, and uses up no try, so all 12 rows are
    answered (with retries=1, a row met by two 529s in a row failed)."""
    monkeypatch.setenv("PLAYBOOK_TEST_ANTHROPIC_KEY", DEMO_KEY)
    with pb.demo.serve(in_process=True, overload_rate=0.5, overload_apis=("anthropic",), seed=3) as demo:
        llm = pb.llm_tool(
            "ask",
            api="anthropic",
            model="demo-mini",
            base_url=demo.url,
            secret=pb.secret("PLAYBOOK_TEST_ANTHROPIC_KEY"),
            provider=pb.Provider("anthropic", concurrency=4, retries=1),
        )

        async def ask(row: Any, ctx: pb.Context) -> Any:
            return await ctx.tool(llm, prompt=f"Classify company {row.n}")

        frame = pd.DataFrame({"n": range(12)})
        out = frame.play.run(pb.play(ask, name="ask"), store=store, progress=False, concurrency=4)
        overloaded = demo.stats()["by_status"].get("529", 0)
    assert out.result["play_status"].tolist() == ["ok"] * 12, (
        out.result["play_error"].dropna().head(3).tolist()
    )
    assert overloaded >= 6


def test_a_local_server_past_its_queue_runs_at_its_capacity() -> None:
    """The demo as a local server (2 decode slots, a queue of 2, 0.1 s an answer, no key, 503
    without a hint past them) and concurrency=32 configured: its 503s bound the calls in flight,
    so 60 rows take <= 1.4 x its capacity (3 s) with <= 10% of requests refused, none failing."""
    with pb.demo.serve(in_process=True, local_slots=2, local_queue=2, local_service_seconds=0.1) as demo:
        llm = pb.llm_tool(
            "ask",
            model="llama",
            base_url=demo.url + "/v1",
            secret=None,
            provider=pb.Provider("local", concurrency=32),
        )

        async def ask(row: Any, ctx: pb.Context) -> Any:
            return await ctx.tool(llm, prompt=f"Classify company {row.n}")

        frame = pd.DataFrame({"n": range(60)})
        out = frame.play.run(pb.play(ask, name="ask"), progress=False, concurrency=32)
        served = demo.stats()["by_api"]["local"]["by_status"]
    assert out.result["play_status"].tolist() == ["ok"] * 60, (
        out.result["play_error"].dropna().head(3).tolist()
    )
    assert served.get("503", 0) <= 0.10 * (served["200"] + served.get("503", 0)), served
    assert out.stats.elapsed <= 1.4 * 60 * 0.1 / 2, out.stats.elapsed
