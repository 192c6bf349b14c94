"""An LLM tool against providers that count tokens as Anthropic and Azure do, on virtual time: the
limits an answer's ``anthropic-ratelimit-*`` headers announce are learnt, each into its own budget;
the output budget, charged ``max_tokens`` when a request starts and the real count when it ends, is
used in full and never passed; Azure's prompt plus ``max_tokens`` counted on arrival is what calls
are paced by; and the provider's status, the panel, the text summary and a cluster's view name
each budget.

Two kinds of provider: one served here through httpx's ``MockTransport``, whose buckets refill on
the loop's clock (tests/vtime.py), whose answers take their latency in that time and which counts
what it admitted and refused (its answers are chat completions, the tool's default wire format;
what it counts and the headers it sends are the dialect's); and the demo's own Anthropic and
Azure paths, spoken by ``api="anthropic"`` and ``api="azure"``.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
from typing import Any, Literal

import httpx
import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb
from playbook.providers.governor import OVERLOAD_CAP
from playbook.providers.limits import HEADROOM
from playbook.providers.provider import governor
from playbook.providers.status import Budget
from playbook.tools import engine_of
from playbook.ui.html import provider_rate, run_html
from playbook.ui.text import TextView

MODEL = "model-a"


class Bucket:
    """One per-minute budget as a provider keeps it: refilling at ``limit`` / 60 a second, holding
    ``seconds`` of it (a request heavier than that fits a full bucket)."""

    def __init__(self, limit: int, seconds: float) -> None:
        self.limit, self.rate = limit, limit / 60.0
        self.capacity = self.rate * seconds
        self.level, self.stamp = self.capacity, 0.0

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait(self, now: float, n: float) -> float:
        self._refill(now)
        return max(0.0, (min(n, self.capacity) - self.level) / self.rate)

    def take(self, now: float, n: float) -> None:
        self._refill(now)
        self.level -= n

    def give(self, now: float, n: float) -> None:
        self._refill(now)
        self.level = min(self.capacity, self.level + n)


class Provider:
    """Answers of ``answer`` output tokens after ``latency`` seconds, under per-minute budgets counted
    as ``style`` says: "anthropic" (requests, input tokens, and output tokens charged max_tokens at
    the start and the real count at the end, each bucket holding a minute's worth; its headers), or
    "azure" (one token budget counting prompt plus max_tokens on arrival, over 10 s; only
    ``x-ratelimit-remaining-*``)."""

    def __init__(
        self,
        style: Literal["anthropic", "azure"],
        *,
        rpm: int,
        tpm: int = 0,
        itpm: int = 0,
        otpm: int = 0,
        answer: int = 40,
        latency: float = 2.0,
        overloaded: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        self.style, self.answer, self.latency = style, answer, latency
        self.overloaded = overloaded  # from, until: every request is answered 529 (Anthropic's overload)
        seconds = 60.0 if style == "anthropic" else 10.0
        self.buckets = {
            name: Bucket(limit, seconds)
            for name, limit in (
                ("requests", rpm),
                ("tokens", tpm),
                ("input-tokens", itpm),
                ("output-tokens", otpm),
            )
            if limit
        }
        self.refused = 0
        self.answers: list[tuple[float, int, int]] = []  # (when, input tokens, output tokens counted)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        now = asyncio.get_running_loop().time()
        if self.overloaded[0] <= now < self.overloaded[1]:
            return httpx.Response(529, json={"type": "error", "error": {"type": "overloaded_error"}})
        prompt = sum(len(m["content"]) for m in body["messages"]) // 4
        reserved = body["max_tokens"]
        charges = {
            "requests": 1,
            "input-tokens": prompt,
            "output-tokens": reserved,
            "tokens": prompt + reserved,
        }
        charged = {name: charges[name] for name in self.buckets}
        wait = max(bucket.wait(now, charged[name]) for name, bucket in self.buckets.items())
        if wait > 0:
            self.refused += 1
            return httpx.Response(
                429, headers=self._headers(now, wait), json={"error": {"type": "rate_limit_error"}}
            )
        for name, bucket in self.buckets.items():
            bucket.take(now, charged[name])
        await asyncio.sleep(self.latency)
        done = asyncio.get_running_loop().time()
        if self.style == "anthropic":  # the output reserved comes back but for what the answer used
            self.buckets["output-tokens"].give(done, reserved - self.answer)
        self.answers.append((done, prompt, self.answer if self.style == "anthropic" else prompt + reserved))
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": self.answer,
            "total_tokens": prompt + self.answer,
        }
        answer = {
            "model": MODEL,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            ],
            "usage": usage,
        }
        return httpx.Response(200, headers=self._headers(done), json=answer)

    def _headers(self, now: float, wait: float = 0.0) -> dict[str, str]:
        headers = {"retry-after": str(math.ceil(wait))} if wait else {}
        for name, bucket in self.buckets.items():
            left = str(max(0, math.floor(min(bucket.capacity, bucket.level))))
            if self.style == "azure":
                headers[f"x-ratelimit-remaining-{name}"] = left
            else:
                headers[f"anthropic-ratelimit-{name}-limit"] = str(bucket.limit)
                headers[f"anthropic-ratelimit-{name}-remaining"] = left
        return headers

    def used_per_minute(self, index: int, skip: int = 0) -> float:
        """What the answers counted (1: input, 2: output) per minute, from the ``skip``-th answer to
        the last (the first calls of a run, sent before any limit was announced, go together)."""
        answers = self.answers[skip:]
        first, last = answers[0][0], answers[-1][0]
        return sum(a[index] for a in answers[1:]) / (last - first) * 60.0


def _run(llm: pb.Tool, rows: int) -> tuple[pd.DataFrame, pb.Run, str]:
    """The rows through ``llm`` on virtual time, 16 at a time: the result, the run, and what its
    text view wrote (the summary last)."""
    frame = pd.DataFrame(
        {"company": [f"Company {i} makes tools for people who make things" for i in range(rows)]}
    )
    out = io.StringIO()

    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company} by its industry, in one word.")

    async def main() -> pb.Run:
        run = await frame.play.arun(label, progress=False, background=True, concurrency=16)
        TextView(run.state, file=out, clock=asyncio.get_running_loop().time)
        await run
        return run

    run = run_virtual(main())
    return run.result, run, out.getvalue()


def test_anthropic_limits_are_learnt_and_the_output_budget_is_used_in_full_never_passed() -> None:
    """No limits configured: the headers teach the provider its requests, input and output budgets
    (each its own); calls charged max_tokens=300 that answer 40 reach >= 0.9 of the 6,000 output
    tokens a minute, never more than the provider's bucket lets through (its minute's worth, then
    its refill), with no 429: far more than the 20 calls a minute max_tokens charged for good would
    let through."""
    fake = Provider("anthropic", rpm=2_000, itpm=200_000, otpm=6_000)
    provider = pb.Provider("anthropic-learnt")
    llm = pb.llm_tool(
        model=MODEL,
        base_url="http://anthropic.test/v1",
        secret=None,
        provider=provider,
        max_tokens=300,
        client=fake.client(),
    )
    engine_of(llm).charges_max_tokens = "reserved"  # as the Anthropic dialect says of its provider
    out, _, _ = _run(llm, 400)
    assert (out.play_status == "ok").all() and fake.refused == 0
    rates = governor(provider).limiter.token_rates
    assert rates == (None, pytest.approx(200_000 / 60 * HEADROOM), pytest.approx(6_000 / 60 * HEADROOM))
    assert provider.status().rate == pytest.approx(2_000 / 60 * HEADROOM)
    output = fake.used_per_minute(2, skip=32)  # past the calls sent before the first answer taught the limits
    minutes = (fake.answers[-1][0] - fake.answers[32][0]) / 60.0
    assert 0.9 * 6_000 <= output <= 6_000 + 6_000 / minutes
    assert output / fake.answer > 5 * 6_000 / 300


def test_what_anthropics_bucket_refilled_during_an_overload_is_used_once_it_ends() -> None:
    """Input tokens binding (6,000 a minute, a bucket holding a minute's worth), 30 s of 529s mid-run:
    the level each answer's ``remaining`` tells is used as the provider's bucket, so what it refilled
    while every call backed off is sent once the overload ends: counting only the refill (the
    bucket's first minute's worth taken off), >= 0.9 of the limit over the whole run, with no 429."""
    itpm = 6_000
    fake = Provider("anthropic", rpm=2_000, itpm=itpm, otpm=100_000, latency=0.5, overloaded=(20.0, 50.0))
    provider = pb.Provider("anthropic-overloaded")
    llm = pb.llm_tool(
        model=MODEL,
        base_url="http://anthropic.test/v1",
        secret=None,
        provider=provider,
        max_tokens=300,
        client=fake.client(),
    )
    engine_of(llm).charges_max_tokens = "reserved"
    out, _, _ = _run(llm, 600)
    assert (out.play_status == "ok").all() and fake.refused == 0
    seconds = fake.answers[-1][0]  # the run started at 0 on the loop's clock
    refilled = sum(a[1] for a in fake.answers) - itpm
    assert refilled >= 0.9 * itpm / 60.0 * seconds
    # the overload's backoff is capped: the calls try again within OVERLOAD_CAP of its end
    resumed = min(when for when, _, _ in fake.answers if when >= fake.overloaded[1])
    assert resumed <= fake.overloaded[1] + OVERLOAD_CAP + fake.latency


def test_azure_counts_prompt_and_max_tokens_on_arrival_and_calls_are_paced_by_that() -> None:
    """tpm=12,000 counted as Azure counts it (prompt plus max_tokens=200, on arrival, over 10 s): calls
    weighed so reach >= 0.9 of it with no 429, where weighing what answers use sends ~4x too many."""
    fake = Provider("azure", rpm=2_000, tpm=12_000, answer=30)
    provider = pb.Provider("azure-tpm", tpm=12_000)
    llm = pb.llm_tool(
        model=MODEL,
        base_url="http://azure.test/v1",
        secret=None,
        provider=provider,
        max_tokens=200,
        client=fake.client(),
    )
    engine_of(llm).charges_max_tokens = "counted"  # as the Azure dialect says of its provider
    out, _, _ = _run(llm, 120)
    assert (out.play_status == "ok").all() and fake.refused == 0
    assert 0.9 * 12_000 <= fake.used_per_minute(2) <= 12_000


def test_status_panel_and_text_show_each_budget_by_its_own_name() -> None:
    """provider.status() carries requests, input tokens and output tokens, each with the last minute's
    use and its limit; the panel's rate cell, the static summary and the text summary say each by
    its name ("input tokens 1,234/200k per min")."""
    fake = Provider("anthropic", rpm=2_000, itpm=200_000, otpm=6_000)
    provider = pb.Provider("anthropic-shown")
    llm = pb.llm_tool(
        model=MODEL,
        base_url="http://anthropic.test/v1",
        secret=None,
        provider=provider,
        max_tokens=300,
        client=fake.client(),
    )
    engine_of(llm).charges_max_tokens = "reserved"
    _, run, text = _run(llm, 60)  # a few seconds of real time: every answer within the last minute
    used_in, used_out = sum(a[1] for a in fake.answers), sum(a[2] for a in fake.answers)
    status = provider.status()
    assert status.budgets == (
        Budget("requests", 60, pytest.approx(2_000)),
        Budget("input tokens", used_in, pytest.approx(200_000)),
        Budget("output tokens", used_out, pytest.approx(6_000)),
    )
    said = f"requests 60/2,000 per min, input tokens {used_in:,}/200k per min, output tokens {used_out:,}/6,000 per min"
    assert provider_rate(status) == f"{status.rate:.3g}/s, {said}"
    assert said in run_html(run.state)
    assert f"provider 'anthropic-shown': {said}" in text.strip().splitlines()


def test_a_clusters_workers_report_their_budgets_and_the_view_sums_them() -> None:
    """Each worker's report (JSON) carries its budgets; the cluster's view of the provider sums their
    use under the account's limits, and says each by its name."""
    from playbook import tagged
    from playbook.cluster.state import ClusterState
    from playbook.cluster.wire import COUNTERS
    from playbook.providers.status import ProviderStatus

    def report(worker: str, used_in: float, used_out: float) -> dict[str, Any]:
        view = ProviderStatus(
            "anthropic",
            False,
            None,
            0.0,
            False,
            0.0,
            None,
            0.8,
            None,
            2,
            0,
            used_in + used_out,
            None,
            budgets=(Budget("input tokens", used_in, 40_000.0), Budget("output tokens", used_out, 8_000.0)),
        )
        sent = {"part": 0, "attempt": worker, "worker": worker, "final": False, "counts": [0] * len(COUNTERS)}
        sent |= {"rows": [], "notices": [], "waterfalls": [], "providers": [list(view)], "phase": "running"}
        return json.loads(tagged.dumps(sent))  # type: ignore[no-any-return]

    state = ClusterState(play="enrich")
    state.expect(0)
    state.apply([report("w1", 12_000.0, 3_000.0), report("w2", 20_000.0, 4_500.0)])
    view = state.provider_views()["anthropic"]
    assert view.budgets == (
        Budget("input tokens", 32_000.0, 40_000.0),
        Budget("output tokens", 7_500.0, 8_000.0),
    )
    assert provider_rate(view) == "0.8/s, input tokens 32k/40k per min, output tokens 7,500/8,000 per min"


def _demo_run(llm: pb.Tool, rows: int) -> tuple[pd.DataFrame, float]:
    """The rows through ``llm`` against the demo served in process, on virtual time: the result and
    the minutes the run took."""
    frame = pd.DataFrame({"company": [f"Company {i} Labs makes robots for warehouses" for i in range(rows)]})

    async def summary(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Summarise in two sentences what {row.company} does and for whom.")

    async def main() -> tuple[pd.DataFrame, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        out = await frame.play.amap(summary, progress=False, concurrency=16)
        return out, (loop.time() - start) / 60.0

    return run_virtual(main())  # type: ignore[no-any-return]


def test_the_demos_anthropic_limits_are_learnt_and_its_output_budget_used_at_least_0_9(demo: Any) -> None:
    """api="anthropic" against the demo's Messages (8,000 output and 40,000 input tokens a minute, apart;
    max_tokens reserved on arrival): nothing configured, the answers' headers teach both budgets, and
    the run uses >= 0.9 of the output budget, never more than the demo's bucket lets through (its
    minute's worth, then its refill), with no 429 and every row answered."""
    demo.reset(anthropic_rpm=1_000, anthropic_itpm=40_000, anthropic_otpm=8_000, latency=2.0)
    provider = pb.Provider("anthropic-demo")
    key = pb.secret("PLAYBOOK_TEST_LLM_KEY", default="demo-key")
    llm = pb.llm_tool(
        api="anthropic",
        model="claude-sonnet-4-5",
        base_url=demo.url,
        secret=key,
        provider=provider,
        max_tokens=300,
    )
    out, minutes = _demo_run(llm, 300)
    served = demo.stats()["by_api"]["anthropic"]
    assert (out.play_status == "ok").all() and served["rate_limited"] == 0
    assert 0.9 * 8_000 <= served["output_tokens"] / minutes <= 8_000 + 8_000 / minutes
    assert [b.limit for b in provider.status().budgets] == [1_000, 40_000, 8_000]


def test_the_demos_azure_counts_prompt_and_max_tokens_and_calls_are_paced_by_that(demo: Any) -> None:
    """api="azure" against the demo's Azure (30,000 tokens a minute counted as prompt plus max_tokens on
    arrival, in 10 s windows): calls weighed so go at >= 0.9 of what it counts, few refused (<= 5%),
    every row answered; the status shows the tokens as it counts them."""
    demo.reset(azure_rpm=1_000, azure_tpm=30_000, latency=1.0)
    provider = pb.Provider("azure-demo", tpm=30_000)
    key = pb.secret("PLAYBOOK_TEST_LLM_KEY", default="demo-key")
    llm = pb.llm_tool(
        api="azure", model="gpt-4o-mini", base_url=demo.url, secret=key, provider=provider, max_tokens=200
    )
    out, minutes = _demo_run(llm, 200)
    served = demo.stats()["by_api"]["azure"]
    counted = served["input_tokens"] + 200 * served["ok"]
    assert (out.play_status == "ok").all() and served["rate_limited"] <= 0.05 * served["requests"]
    assert 0.9 * 30_000 <= counted / minutes <= 30_000
    assert provider.status().budgets == (Budget("tokens", counted, pytest.approx(30_000)),)


def test_a_call_reserving_more_output_than_a_minute_allows_fails_at_once_naming_the_budget() -> None:
    """max_tokens=10,000 against otpm=8,000: the provider could never take it, so the call fails at once
    saying which budget and what to lower, instead of waiting out a minute's worth."""
    from playbook._internal.flow import WaitBudget
    from playbook.providers.limits import Tokens
    from playbook.providers.provider import Ticket

    provider = pb.Provider("anthropic-small", otpm=8_000)
    ticket = Ticket("llm", WaitBudget(120.0))
    ticket.weight = Tokens(50, 10_000, "reserved", usual=40)

    async def send() -> str:
        return "sent"

    with pytest.raises(
        pb.ToolError,
        match=r"about 10,000 output tokens, more than .* \(8,000 output tokens/min\): lower max_tokens",
    ):
        run_virtual(governor(provider).dispatch(send, ticket))


def test_calls_whose_max_tokens_fill_the_output_budget_go_one_at_a_time_and_none_parks(demo: Any) -> None:
    """Anthropic's default max_tokens (4,096) against 8,000 output tokens a minute: the provider holds
    one such reservation at a time, so calls go one after another; what they only reserve does not
    count as a queue of a minute's tokens ahead, and no row parks for it (max_wait 120 s)."""
    demo.reset(anthropic_rpm=1_000, anthropic_itpm=40_000, anthropic_otpm=8_000, latency=2.0)
    provider = pb.Provider("anthropic-full")
    key = pb.secret("PLAYBOOK_TEST_LLM_KEY", default="demo-key")
    llm = pb.llm_tool(
        api="anthropic", model="claude-sonnet-4-5", base_url=demo.url, secret=key, provider=provider
    )
    out, minutes = _demo_run(llm, 30)
    served = demo.stats()["by_api"]["anthropic"]
    assert (out.play_status == "ok").all() and served["rate_limited"] <= 1
    assert minutes * 60 >= 2.0 * 29  # one at a time, as the provider holds them
