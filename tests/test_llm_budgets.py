"""An LLM tool against providers that count tokens as Anthropic and Azure do, on virtual time: the
limits an answer's ``anthropic-ratelimit-*`` headers announce are learnt, each into its own budget;
the output budget, charged ``max_tokens`` when a request starts and the real count when it ends, is
used in full and never passed; Azure's prompt plus ``max_tokens`` counted on arrival is what calls
are paced by; and the provider's status, the panel and the text summary name each budget.

The provider is served in process through httpx's ``MockTransport``: its buckets refill on the
loop's clock (tests/vtime.py), its answers take their latency in that time, and it counts what it
admitted and refused.  Its answers are chat completions (the tool's wire format); what it counts and
the headers it sends are the dialect's.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Literal

import httpx
import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb
from playbook.providers.limits import HEADROOM
from playbook.providers.provider import governor
from playbook.tools import engine_of

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
    ) -> None:
        self.style, self.answer, self.latency = style, answer, latency
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


def _run(llm: pb.Tool, rows: int) -> pd.DataFrame:
    frame = pd.DataFrame(
        {"company": [f"Company {i} makes tools for people who make things" for i in range(rows)]}
    )

    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company} by its industry, in one word.")

    return run_virtual(frame.play.amap(label, progress=False, concurrency=16))  # type: ignore[no-any-return]


def test_anthropic_limits_are_learnt_and_the_output_budget_is_used_in_full_never_passed() -> None:
    """No limits configured: the headers teach the provider its requests, input and output budgets
    (each its own); calls charged max_tokens=300 that answer 40 reach >= 0.9 of the 6,000 output
    tokens a minute, not above, with no 429: far more than the 20 calls a minute max_tokens charged for
    good would let through."""
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
    out = _run(llm, 400)
    assert (out.play_status == "ok").all() and fake.refused == 0
    rates = governor(provider).limiter.token_rates
    assert rates == (None, pytest.approx(200_000 / 60 * HEADROOM), pytest.approx(6_000 / 60 * HEADROOM))
    assert provider.status().rate == pytest.approx(2_000 / 60 * HEADROOM)
    output = fake.used_per_minute(2, skip=32)  # past the calls sent before the first answer taught the limits
    assert 0.9 * 6_000 <= output <= 6_000
    assert output / fake.answer > 5 * 6_000 / 300


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
    out = _run(llm, 120)
    assert (out.play_status == "ok").all() and fake.refused == 0
    assert 0.9 * 12_000 <= fake.used_per_minute(2) <= 12_000
