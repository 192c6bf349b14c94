"""B7's one measuring path, shared by every dialect's row: reset the demo to a row's limits, run a
contender over the rows, read what the demo counted for that dialect, and judge it against the
dialect's binding limit.

A dialect's limits are ``Budget``s: each lets ``capacity`` in at once (a full bucket, a window's
allowance) and then ``per_minute``.  The least time the demo's limits let a run's usage in is,
for each budget, (what it counted - its capacity + what it still held at the end) / its rate:
what the budget's refill supplied to the run.  The budget that needs the most is the *binding*
one, and a run's share of it is that least time over the run's wall time (1.0: every token the
limit supplied during the run was used; a first burst from a full bucket neither helps nor
hurts).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pandas as pd

import playbook as pb

PROMPT_CHARS = 1000
KEY = "demo-key"


@dataclass(frozen=True)
class Budget:
    """One of a dialect's limits on the demo: ``counts`` reads what it charged from the dialect's
    counters (and the run's requests answered)."""

    name: str  # as the provider's docs name it: "input tokens", "output tokens", "requests"...
    per_minute: float
    capacity: float  # let in at once: a full bucket, or a window's allowance
    counts: Callable[[dict[str, Any]], float]

    def least_seconds(self, counters: dict[str, Any], left: float = 0.0) -> float:
        """The least time the run's usage needed: what it took beyond what the budget let in at
        once (less what the budget still held at the end, ``left``), at the budget's rate."""
        return max(0.0, self.counts(counters) - self.capacity + left) * 60.0 / self.per_minute


def input_tokens(counters: dict[str, Any]) -> float:
    return float(counters["input_tokens"])


def output_tokens(counters: dict[str, Any]) -> float:
    return float(counters["output_tokens"])


def all_tokens(counters: dict[str, Any]) -> float:
    return float(counters["input_tokens"] + counters["output_tokens"])


def answered(counters: dict[str, Any]) -> float:
    return float(counters["ok"])


@dataclass
class Ran:
    """What a contender reports of its own run."""

    ok: int
    seconds: float
    cost: float | None = None  # what the run says it spent (ours only)
    errors: list[str] = field(default_factory=list)  # why rows were not ok, as the run says
    statuses: dict[str, int] = field(default_factory=dict)  # rows by status (ours only)
    extra: dict[str, Any] = field(default_factory=dict)  # the contender's own figures
    started: float = 0.0  # time.monotonic() at its start: the demo's clock, for windows aligned on it

    @property
    def ended(self) -> float:
        return self.started + self.seconds


@dataclass
class Outcome:
    """A contender's run and what the demo counted for the dialect meanwhile."""

    api: str
    rows: int
    ran: Ran
    counters: dict[str, Any]  # the dialect's counters (requests, ok, rate_limited, overloaded, tokens)
    stats: dict[str, Any]  # all the demo's counters
    left: dict[str, float] = field(default_factory=dict)  # what each budget held at the end, by name

    @property
    def ok(self) -> int:
        return self.ran.ok

    @property
    def seconds(self) -> float:
        return self.ran.seconds

    @property
    def requests(self) -> int:
        return int(self.counters["requests"])

    def refused(self, status: int = 429) -> int:
        return int(self.counters.get("by_status", {}).get(str(status), 0))

    def share(self, status: int = 429) -> float:
        return self.refused(status) / self.requests if self.requests else 0.0

    def binding(self, budgets: Sequence[Budget]) -> tuple[Budget, float]:
        """The budget that needed the most time for this run's usage, and the run's share of
        it: that least time over the run's wall time."""
        need = max(budgets, key=lambda b: b.least_seconds(self.counters, self.left.get(b.name, 0.0)))
        least = need.least_seconds(self.counters, self.left.get(need.name, 0.0))
        return need, least / self.seconds if self.seconds else float("nan")


Contender = Callable[[str, pd.DataFrame], Ran]


def measured(
    url: str,
    api: str,
    settings: dict[str, Any],
    frame: pd.DataFrame,
    contender: Contender,
    left: Callable[[str], dict[str, float]] | None = None,
) -> Outcome:
    """Reset the demo to ``settings``, run ``contender`` over ``frame``, read the counters (and
    with ``left``, what each budget still holds, asked of the demo after them)."""
    httpx.post(url + "/_reset", json=settings, timeout=5).raise_for_status()
    ran = contender(url, frame)
    stats = httpx.get(url + "/_stats", timeout=5).json()
    counters = stats.get("by_api", {}).get(api) or {
        "requests": 0,
        "ok": 0,
        "rate_limited": 0,
        "overloaded": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "by_status": {},
    }
    return Outcome(api, len(frame), ran, counters, stats, left(url) if left is not None else {})


# -- ours: a play over pb.llm_tool ------------------------------------------------------------


def ours(make_tool: Callable[[str], pb.LlmTool], concurrency: int) -> Contender:
    """``frame.play.map`` of one call per row to the tool ``make_tool(url)`` builds (with a new
    Provider each run), ``concurrency`` rows at once, in a new store."""

    def contender(url: str, frame: pd.DataFrame) -> Ran:
        llm = make_tool(url)

        @pb.play
        async def summarise(row, ctx):
            return {"summary": await ctx.tool(llm, prompt=row.prompt)}

        with tempfile.TemporaryDirectory(prefix="pb-b7-") as home:
            store = pb.ReceiptStore(home)
            try:
                began, start = time.monotonic(), time.perf_counter()
                out = frame.play.map(summarise, store=store, concurrency=concurrency, progress=False)
                seconds = time.perf_counter() - start
            finally:
                store.close()
        run = pb.last_run()
        statuses = out["play_status"].value_counts().to_dict()
        errors = [str(e) for e in out.loc[out["play_status"] != "ok", "play_error"].dropna()]
        cost = run.stats.cost_spent if run is not None else None
        counted = {str(k): int(v) for k, v in statuses.items()}
        return Ran(int(statuses.get("ok", 0)), seconds, cost, errors, counted, started=began)

    return contender


# -- baselines: an official SDK under asyncio.gather and a semaphore -------------------------


def gathered(
    client: Callable[[str], Any],
    call: Callable[[Any, str], Awaitable[bool]],
    concurrency: int,
    refused: tuple[type[BaseException], ...],
) -> Contender:
    """What a user writes with a provider's SDK: ``asyncio.gather`` over a semaphore of
    ``concurrency``, ``call(client, prompt)`` per row with the SDK's own retries; a row whose call
    raises one of ``refused`` (the retries spent) is not ok."""

    def contender(url: str, frame: pd.DataFrame) -> Ran:
        errors: list[str] = []

        async def main() -> list[bool]:
            sdk = client(url)
            gate = asyncio.Semaphore(concurrency)

            async def one(prompt: str) -> bool:
                async with gate:
                    try:
                        return await call(sdk, prompt)
                    except refused as exc:
                        errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                        return False

            try:
                return await asyncio.gather(*(one(p) for p in frame["prompt"]))
            finally:
                # google-genai's async client is closed apart (its close() is the sync client's)
                await (sdk.aio.aclose() if hasattr(sdk, "aio") else sdk.close())

        began, start = time.monotonic(), time.perf_counter()
        results = asyncio.run(main())
        return Ran(sum(results), time.perf_counter() - start, errors=errors, started=began)

    return contender


# -- rows' text ---------------------------------------------------------------------------------

_WORDS = (  # noqa: SIM905 - a word list reads better as text
    "harbour lantern quarry meadow orchard copper saddle beacon glacier thistle canyon ember willow falcon granite "
    "marble tundra juniper cobalt prairie summit lagoon cedar mosaic velvet timber compass harvest anchor citadel "
    "riverbank nectar pebble orbit sparrow basalt crimson fjord garnet heather ivory kestrel lattice mangrove "
    "nomad obsidian paddock quartz rampart sequoia tapestry umber vineyard wharf yarrow zephyr almond bramble "
    "cinder dune estuary fennel gorge hollow inlet jasper kelp loom marsh nettle oasis pylon reef shale trellis"
).split()


def frame(rows: int, salt: str = "") -> pd.DataFrame:
    """``rows`` prompts of ~``PROMPT_CHARS`` characters each (~250 tokens), every one different."""
    return pd.DataFrame({"prompt": [prompt(i, salt) for i in range(rows)]})


def prompt(i: int, salt: str = "") -> str:
    """~``PROMPT_CHARS`` characters of words drawn for row ``i``: every row's text (and answer) differs."""
    draw = random.Random(f"{salt}{i}")
    words = [f"Page {salt}{i}:"]
    while sum(len(w) + 1 for w in words) < PROMPT_CHARS:
        words.append(draw.choice(_WORDS))
    return "Summarise this page: " + " ".join(words)


def median(outcomes: list[Outcome], key: Callable[[Outcome], float]) -> Outcome:
    return sorted(outcomes, key=key)[(len(outcomes) - 1) // 2]
