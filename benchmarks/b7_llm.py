"""B7: an LLM endpoint limited by tokens per minute.  The demo provider (its own process) serves
``/v1/chat/completions`` with a limit of 30,000 tokens a minute, enforced as OpenAI does: a bucket
that refills continuously and holds one second's worth (500 tokens), so a minute's worth sent at
once is refused.  Each answer takes 1 s, so one call at a time gets at most ~18,000 tokens a
minute: only calls in flight together reach the limit.  Each of the 60 rows is one call of ~300
tokens (a ~1,000 character prompt of words drawn for that row, and its summary).

     contender                                     targets
     map(concurrency=16) over pb.llm_tool with     token goodput >= 0.9 x 30,000/min; 429s <= 2%
     pb.Provider(tpm=30000) (ours)                 of requests; cost_spent == the demo's usage x
                                                   prices (to 9 decimals)
     asyncio.gather + Semaphore(16) over           the baseline: the SDK's own retries
     openai.AsyncOpenAI(max_retries=100)           (retry-after-ms honoured, else exponential
                                                   backoff with jitter)

Token goodput is the tokens the demo answered (prompt + completion, by its own counters) per
minute of wall time; the ratio is ours over the baseline's.  Then two cheap checks on the demo
without limits, with a play of two LLM columns over 12 rows: a rerun pays for no call, and
editing one of the two prompts pays for that column's calls only.  Every contender gets a new
store and a new Provider.  One repetition takes ~80 s.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pandas as pd

import playbook as pb

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
PROMPT_CHARS = 1000

Contender = Callable[
    [str, pd.DataFrame], tuple[int, float, float | None]
]  # (url, frame) -> rows ok, seconds, cost spent

_WORDS = (  # noqa: SIM905 - a word list reads better as text
    "harbour lantern quarry meadow orchard copper saddle beacon glacier thistle canyon ember willow falcon granite "
    "marble tundra juniper cobalt prairie summit lagoon cedar mosaic velvet timber compass harvest anchor citadel "
    "riverbank nectar pebble orbit sparrow basalt crimson fjord garnet heather ivory kestrel lattice mangrove "
    "nomad obsidian paddock quartz rampart sequoia tapestry umber vineyard wharf yarrow zephyr almond bramble "
    "cinder dune estuary fennel gorge hollow inlet jasper kelp loom marsh nettle oasis pylon reef shale trellis"
).split()


@dataclass
class Outcome:
    rows: int
    ok: int
    seconds: float
    stats: dict[str, Any]  # the demo's counters after the run
    cost: float | None = None  # what the run says it spent (ours only)

    @property
    def tokens(self) -> int:
        return sum(m["prompt_tokens"] + m["completion_tokens"] for m in self.stats["chat"].values())

    @property
    def goodput(self) -> float:
        """Tokens answered a minute of wall time."""
        return self.tokens * 60.0 / self.seconds

    @property
    def requests(self) -> int:
        return int(self.stats["requests"])

    @property
    def refused(self) -> int:
        return int(self.stats["by_status"].get("429", 0))

    @property
    def refused_share(self) -> float:
        return self.refused / self.requests if self.requests else 0.0

    def billed(self) -> float:
        """What the demo's own usage counters cost at ``PRICES``."""
        return sum(
            (m["prompt_tokens"] * PRICES[model][0] + m["completion_tokens"] * PRICES[model][1]) / 1e6
            for model, m in self.stats["chat"].items()
        )


def run(repeats: int = 1) -> list[Result]:
    frame = _frame(ROWS)
    with demo_process() as url:
        ours, base = [], []
        for _ in range(repeats):  # interleaved, so a slow spell of the machine hits both
            base.append(_measured(url, frame, _baseline))
            ours.append(_measured(url, frame, _ours))
        checks = _receipts(url)
    return [_row(_median(ours), _median(base), checks)]


def _row(mine: Outcome, base: Outcome, checks: list[tuple[str, bool]]) -> Result:
    result = Result("B7 LLM, 30k tokens/min", "/m", mine.goodput, base.goodput, BASELINE, 1.0)
    floor = GOODPUT * TPM
    per_call = mine.tokens / max(1, mine.ok)
    cost, billed = round(mine.cost or 0.0, 9), round(mine.billed(), 9)
    result.notes = [
        (
            f"token goodput {mine.goodput:,.0f}/min >= {floor:,.0f}/min ({GOODPUT:.2f} x {TPM:,}); "
            f"{mine.rows - mine.ok} rows not ok, ~{per_call:.0f} tokens a call",
            mine.goodput >= floor and mine.ok == mine.rows,
        ),
        (
            f"429s {mine.refused_share:.1%} of {mine.requests} requests <= {REFUSED:.0%}",
            mine.refused_share <= REFUSED,
        ),
        (f"cost_spent ${cost:.9f} == the demo's usage x prices ${billed:.9f}", cost == billed),
        *checks,
        (
            f"baseline: {base.goodput:,.0f} tokens/min, 429s {base.refused_share:.0%} of {base.requests} requests, "
            f"{base.rows - base.ok} rows not ok",
            None,
        ),
        (f"wall time: ours {mine.seconds:.1f}s, the baseline {base.seconds:.1f}s", None),
    ]
    return result


# -- the contenders ---------------------------------------------------------------------------


def _measured(url: str, frame: pd.DataFrame, contender: Contender) -> Outcome:
    """Reset the demo to ``DEMO``, run ``contender`` over the frame, read the counters."""
    httpx.post(url + "/_reset", json=DEMO, timeout=5).raise_for_status()
    ok, seconds, cost = contender(url, frame)
    stats = httpx.get(url + "/_stats", timeout=5).json()
    return Outcome(len(frame), ok, seconds, stats, cost)


def _ours(url: str, frame: pd.DataFrame) -> tuple[int, float, float]:
    """``frame.play.map`` with one ``pb.llm_tool`` call per row, paced by ``tpm``."""
    provider = pb.Provider("demo-llm", tpm=TPM)
    llm = pb.llm_tool(
        model=MODEL,
        base_url=url + "/v1",
        secret=pb.secret("DEMO_API_KEY", default="demo-key"),
        provider=provider,
        prices=PRICES,
    )

    @pb.play
    async def summarise(row, ctx):
        return {"summary": await ctx.tool(llm, prompt=row.prompt)}

    with tempfile.TemporaryDirectory(prefix="pb-b7-") as home:
        store = pb.ReceiptStore(home)
        try:
            start = time.perf_counter()
            out = frame.play.map(summarise, store=store, concurrency=CONCURRENCY, progress=False)
            seconds = time.perf_counter() - start
        finally:
            store.close()
    run = pb.last_run()
    return int((out["play_status"] == "ok").sum()), seconds, run.stats.cost_spent if run is not None else 0.0


def _baseline(url: str, frame: pd.DataFrame) -> tuple[int, float, None]:
    """What a user writes with the openai SDK: ``asyncio.gather`` over a semaphore, the SDK's
    own retries (``retry-after-ms`` honoured, else exponential backoff with jitter)."""

    async def main() -> list[bool]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="demo-key", max_retries=RETRIES)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(prompt: str) -> bool:
            async with gate:
                try:
                    answer = await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0.0
                    )
                except openai.APIError:
                    return False
                return answer.choices[0].message.content is not None

        try:
            return await asyncio.gather(*(one(p) for p in frame["prompt"]))
        finally:
            await client.close()

    start = time.perf_counter()
    results = asyncio.run(main())
    return sum(results), time.perf_counter() - start, None


# -- receipts: a rerun and an edit ------------------------------------------------------------


def _receipts(url: str) -> list[tuple[str, bool]]:
    """On a demo without limits: a play with two LLM columns; run it, rerun it, edit one prompt."""
    httpx.post(url + "/_reset", json={}, timeout=5).raise_for_status()
    frame = _frame(SMALL)
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
            first = _paid(url, frame, columns, store)
            again = _paid(url, frame, columns, store)
            changed = _paid(url, frame, edited, store)
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


def _paid(url: str, frame: pd.DataFrame, play: pb.Play, store: pb.ReceiptStore) -> tuple[int, int, int]:
    """Map ``play``: the calls it paid for, the requests the demo saw, the calls it reused."""
    before = httpx.get(url + "/_stats", timeout=5).json()["requests"]
    out = frame.play.map(play, store=store, progress=False)
    after = httpx.get(url + "/_stats", timeout=5).json()["requests"]
    if not out["play_status"].isin(["ok", "reused"]).all():
        print(f"B7: rows not ok: {out['play_error'].dropna().head(3).tolist()}", file=sys.stderr, flush=True)
    run = pb.last_run()
    assert run is not None
    return run.stats.calls_executed, after - before, run.stats.calls_reused


# -- helpers ----------------------------------------------------------------------------------


def _frame(rows: int) -> pd.DataFrame:
    return pd.DataFrame({"prompt": [_prompt(i) for i in range(rows)]})


def _prompt(i: int) -> str:
    """~``PROMPT_CHARS`` characters of words drawn for row ``i``: every row's text (and answer) differs."""
    draw = random.Random(i)
    words = [f"Page {i}:"]
    while sum(len(w) + 1 for w in words) < PROMPT_CHARS:
        words.append(draw.choice(_WORDS))
    return "Summarise this page: " + " ".join(words)


def _median(outcomes: list[Outcome]) -> Outcome:
    return sorted(outcomes, key=lambda o: o.goodput)[(len(outcomes) - 1) // 2]
