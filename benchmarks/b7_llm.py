"""B7: LLM endpoints, one row per dialect, each against that dialect's binding limit on the demo
provider (its own process), measured in one run; the rows are ``b7_dialects``'s, the measuring
path ``b7_measure``'s.

The OpenAI row: ``/v1/chat/completions`` limited to 30,000 tokens a minute, enforced as OpenAI
does: a bucket that refills continuously and holds one second's worth (500 tokens), so a minute's
worth sent at once is refused.  Each answer takes 1 s, so one call at a time gets at most ~18,000
tokens a minute: only calls in flight together reach the limit.  Each of the 60 rows is one call
of ~300 tokens (a ~1,000 character prompt of words drawn for that row, and its summary).

     contender                                     targets
     map(concurrency=16) over pb.llm_tool with     token goodput >= 0.9 x 30,000/min; 429s <= 2%
     pb.Provider(tpm=30000) (ours)                 of requests; cost_spent == the demo's usage x
                                                   prices (to 9 decimals)
     asyncio.gather + Semaphore(16) over           the baseline: the SDK's own retries
     openai.AsyncOpenAI(max_retries=100)           (retry-after-ms honoured, else exponential
                                                   backoff with jitter)

Token goodput is the tokens the demo answered (prompt + completion, by its own counters) per
minute of wall time; the ratio is ours over the baseline's.  Then the rows of Anthropic (beside
curator's Anthropic backend), Gemini, Azure and a local server (see ``b7_dialects``), and two
cheap checks on the demo without limits, with a play of two LLM columns over 12 rows: a rerun
pays for no call, and editing one of the two prompts pays for that column's calls only.  Every
contender gets a new store and a new Provider.  One repetition takes ~12 minutes.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import httpx
import openai
import pandas as pd

import playbook as pb

from . import b7_dialects
from .b7_measure import KEY, Budget, Outcome, all_tokens, frame, gathered, measured, median, ours
from .harness import Result, demo_process

ROWS = 60  # ~300 tokens each: ~36 s at 30,000 tokens a minute
TPM = 30_000
LATENCY = 1.0  # seconds per answer
CONCURRENCY = 16
DEMO = {"chat_tpm": TPM, "latency": LATENCY}
MODEL = "demo-1"
PRICES = {MODEL: (0.15, 0.60)}  # dollars per 1M input and output tokens
GOODPUT = 0.9  # of TPM
REFUSED = 0.02  # of requests
RETRIES = 100  # the SDK's, for the baseline: enough that no row gives up
BASELINE = "openai SDK retries + gather/Semaphore(16)"
SMALL = 12  # rows of the rerun and edit checks
BUDGETS = (Budget("tokens", TPM, TPM / 60, all_tokens),)  # the bucket holds a second's worth


def run(repeats: int = 1) -> list[Result]:
    with demo_process() as url:
        if os.environ.get("B7_ONLY") == "anthropic":  # the Anthropic row and curator's, alone
            return b7_dialects.anthropic_rows(url, frame(b7_dialects.ANTHROPIC_ROWS), repeats)
        results = [_openai_row(url, repeats)]
        results += b7_dialects.anthropic_rows(url, frame(b7_dialects.ANTHROPIC_ROWS), repeats)
        results += b7_dialects.gemini_rows(
            url, frame(b7_dialects.GEMINI_MINUTE_ROWS), frame(b7_dialects.GEMINI_DAY_ROWS), repeats
        )
        results += b7_dialects.azure_rows(url, frame(b7_dialects.AZURE_ROWS), repeats)
        results += b7_dialects.local_rows(url, frame(b7_dialects.LOCAL_ROWS), repeats)
        results[0].notes += _receipts(url)
    return results


# -- OpenAI chat completions ------------------------------------------------------------------


def _openai_row(url: str, repeats: int) -> Result:
    rows = frame(ROWS)
    mine, base = [], []
    for _ in range(repeats):  # interleaved, so a slow spell of the machine hits both
        base.append(_chat(measured(url, "openai", DEMO, rows, _baseline)))
        mine.append(_chat(measured(url, "openai", DEMO, rows, _ours)))
    goodput = lambda o: all_tokens(o.counters) * 60.0 / o.seconds  # noqa: E731
    return _row(median(mine, goodput), median(base, goodput), goodput)


def _chat(outcome: Outcome) -> Outcome:
    """The chat endpoint's counters by the demo's per-model usage, where it keeps no dialect row."""
    if outcome.counters["requests"]:
        return outcome
    stats = outcome.stats
    usage = stats["chat"].values()
    outcome.counters = {
        "requests": stats["requests"],
        "ok": outcome.ok,
        "input_tokens": sum(m["prompt_tokens"] for m in usage),
        "output_tokens": sum(m["completion_tokens"] for m in usage),
        "by_status": stats["by_status"],
    }
    return outcome


def _row(mine: Outcome, base: Outcome, goodput: Any) -> Result:
    result = Result("B7 OpenAI, 30k tokens/min", "/m", goodput(mine), goodput(base), BASELINE, 1.0)
    floor = GOODPUT * TPM
    tokens = all_tokens(mine.counters)
    per_call = tokens / max(1, mine.ok)
    cost = round(mine.ran.cost or 0.0, 9)
    billed = round(
        (mine.counters["input_tokens"] * PRICES[MODEL][0] + mine.counters["output_tokens"] * PRICES[MODEL][1])
        / 1e6,
        9,
    )
    result.notes = [
        (
            f"token goodput {goodput(mine):,.0f}/min >= {floor:,.0f}/min ({GOODPUT:.2f} x {TPM:,}); "
            f"{mine.rows - mine.ok} rows not ok, ~{per_call:.0f} tokens a call",
            goodput(mine) >= floor and mine.ok == mine.rows,
        ),
        (f"429s {mine.share():.1%} of {mine.requests} requests <= {REFUSED:.0%}", mine.share() <= REFUSED),
        (f"cost_spent ${cost:.9f} == the demo's usage x prices ${billed:.9f}", cost == billed),
        (
            f"baseline: {goodput(base):,.0f} tokens/min, 429s {base.share():.0%} of {base.requests} requests, "
            f"{base.rows - base.ok} rows not ok",
            None,
        ),
        (f"wall time: ours {mine.seconds:.1f}s, the baseline {base.seconds:.1f}s", None),
    ]
    return result


def _tool(url: str) -> pb.LlmTool:
    return pb.llm_tool(
        model=MODEL,
        base_url=url + "/v1",
        secret=pb.secret("DEMO_API_KEY", default=KEY),
        provider=pb.Provider("demo-llm", tpm=TPM),
        prices=PRICES,
    )


_ours = ours(_tool, CONCURRENCY)


async def _call(client: openai.AsyncOpenAI, prompt: str) -> bool:
    answer = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0.0
    )
    return answer.choices[0].message.content is not None


# What a user writes with the openai SDK: ``asyncio.gather`` over a semaphore, the SDK's own
# retries (``retry-after-ms`` honoured, else exponential backoff with jitter).
_baseline = gathered(
    lambda url: openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=RETRIES),
    _call,
    CONCURRENCY,
    (openai.APIError,),
)


# -- receipts: a rerun and an edit ------------------------------------------------------------


def _receipts(url: str) -> list[tuple[str, bool]]:
    """On a demo without limits: a play with two LLM columns; run it, rerun it, edit one prompt."""
    httpx.post(url + "/_reset", json={}, timeout=5).raise_for_status()
    rows = frame(SMALL)
    llm = pb.llm_tool(
        model=MODEL,
        base_url=url + "/v1",
        secret=pb.secret("DEMO_API_KEY", default="demo-key"),
        provider=pb.Provider("demo-llm-small"),
        prices=PRICES,
    )

    @pb.play
    async def columns(row, ctx):
        label = await ctx.tool(llm, prompt=f"Classify the company behind this page: {row.prompt[:200]}")
        return {"label": label, "summary": await ctx.tool(llm, prompt=row.prompt)}

    @pb.play
    async def edited(row, ctx):  # the same play with its summary prompt edited
        label = await ctx.tool(llm, prompt=f"Classify the company behind this page: {row.prompt[:200]}")
        return {"label": label, "summary": await ctx.tool(llm, prompt=row.prompt + " Answer in one line.")}

    with tempfile.TemporaryDirectory(prefix="pb-b7-") as home:
        store = pb.ReceiptStore(home)
        try:
            first = _paid(url, rows, columns, store)
            again = _paid(url, rows, columns, store)
            changed = _paid(url, rows, edited, store)
        finally:
            store.close()
    return [
        (
            f"first run of 2 prompts x {SMALL} rows paid {first[0]} calls ({first[1]} requests)",
            first[0] == first[1] == 2 * SMALL,
        ),
        (f"a rerun paid {again[0]} calls ({again[1]} requests)", again[0] == again[1] == 0),
        (
            f"one prompt edited: paid {changed[0]} calls ({changed[1]} requests), reused {changed[2]}; expected {SMALL} each",
            changed[0] == changed[1] == changed[2] == SMALL,
        ),
    ]


def _paid(url: str, rows: pd.DataFrame, play: pb.Play, store: pb.ReceiptStore) -> tuple[int, int, int]:
    """Map ``play``: the calls it paid for, the requests the demo saw, the calls it reused."""
    before = httpx.get(url + "/_stats", timeout=5).json()["requests"]
    out = rows.play.map(play, store=store, progress=False)
    after = httpx.get(url + "/_stats", timeout=5).json()["requests"]
    if not out["play_status"].isin(["ok", "reused"]).all():
        print(f"B7: rows not ok: {out['play_error'].dropna().head(3).tolist()}", file=sys.stderr, flush=True)
    run = pb.last_run()
    assert run is not None
    return run.stats.calls_executed, after - before, run.stats.calls_reused
