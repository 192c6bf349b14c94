"""B13: the default rows in flight against the best a careful user sets by hand.

A newcomer's job: 3,000 rows, each calling an HTTP API limited to 40 requests a second (150-300 ms
an answer), then an LLM limited by tokens a minute (0.5 s an answer).  Two demo provider
processes serve them: ``/v1/email`` with a token bucket of 40/s (burst 10) and half the answers
0.15 s slower, and ``/v1/chat/completions`` with ``chat_tpm``.  The providers are described as
the user would: ``pb.Provider("api", rps=40)`` and ``pb.Provider("llm", tpm=TPM)``.

     contender                           target
     map() with no concurrency (ours)    wall <= 1.1 x the best fixed setting's; faster than
                                         concurrency=16 (the old default); 429s <= 2% of requests
     map(concurrency=N), N in 16, 32,    the baseline: the fastest of them
     64, 128

Each contender gets new providers and a new store, and both demos are reset before it; the rows
in flight are counted by the play itself (the most at once is printed).  The provider's own bound,
rows / 40 a second, is printed for reference.  One repetition takes ~8 min.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pandas as pd

import playbook as pb

from .harness import Result, demo_process

ROWS = 3000
RPS = 40
TPM = 150_000  # ~50 tokens a call: room for ~50 rows a second, so the API is the tighter bound
API = {"rps": RPS, "burst": 10, "latency": 0.15, "slow_rate": 0.5, "slow_latency": 0.15}
LLM = {"chat_tpm": TPM, "latency": 0.5}
FIXED = (16, 32, 64, 128)
WITHIN = 1.1  # ours over the best fixed setting
REFUSED = 0.02
MODEL = "demo-1"


@dataclass
class Outcome:
    label: str
    seconds: float
    ok: int
    most: int  # rows in flight at once, at most
    requests: int
    refused: int


def run(repeats: int = 1) -> list[Result]:
    frame = pd.DataFrame(
        {"domain": [f"firm{i}.example" for i in range(ROWS)], "first": [f"ann{i}" for i in range(ROWS)]}
    )
    with demo_process() as api, demo_process() as llm:
        outcomes: dict[str, list[Outcome]] = {}
        for _ in range(repeats):
            for concurrency in (None, *FIXED):
                outcome = _measured(api, llm, frame, concurrency)
                outcomes.setdefault(outcome.label, []).append(outcome)
    medians = {
        label: sorted(found, key=lambda o: o.seconds)[(len(found) - 1) // 2]
        for label, found in outcomes.items()
    }
    return [_row(medians)]


def _row(medians: dict[str, Outcome]) -> Result:
    ours = medians["default"]
    fixed = [medians[f"concurrency={n}"] for n in FIXED]
    best = min(fixed, key=lambda o: o.seconds)
    old = medians["concurrency=16"]
    result = Result(
        "B13 default rows in flight",
        "s",
        ours.seconds,
        best.seconds,
        f"best fixed ({best.label})",
        WITHIN,
        at_most=True,
    )
    share = ours.refused / ours.requests if ours.requests else 0.0
    result.notes = [
        (f"provider bound: {ROWS} rows / {RPS} rps = {ROWS / RPS:.1f}s", None),
        *(
            (
                f"{o.label}: {o.seconds:.1f}s, at most {o.most} rows in flight, {o.refused} 429s of {o.requests:,} requests, "
                f"{ROWS - o.ok} rows not ok",
                None,
            )
            for o in (ours, *fixed)
        ),
        (
            f"default {ours.seconds:.1f}s faster than the old default 16 ({old.seconds:.1f}s): {old.seconds / ours.seconds:.2f}x",
            ours.seconds < old.seconds,
        ),
        (
            f"default: 429s {share:.1%} of {ours.requests:,} requests <= {REFUSED:.0%}; {ROWS - ours.ok} rows not ok",
            share <= REFUSED and ours.ok == ROWS,
        ),
    ]
    return result


def _measured(api: str, llm: str, frame: pd.DataFrame, concurrency: int | None) -> Outcome:
    for url, settings in ((api, API), (llm, LLM)):
        httpx.post(url + "/_reset", json=settings, timeout=5).raise_for_status()
    label = "default" if concurrency is None else f"concurrency={concurrency}"
    flight = _Flight()
    play = flight.play(*_tools(api, llm, label))
    opts: dict[str, Any] = {} if concurrency is None else {"concurrency": concurrency}
    with tempfile.TemporaryDirectory(prefix="pb-b13-") as home:
        store = pb.ReceiptStore(home)
        try:
            start = time.perf_counter()
            out = frame.play.map(play, store=store, progress=False, **opts)
            seconds = time.perf_counter() - start
        finally:
            store.close()
    stats = [httpx.get(url + "/_stats", timeout=5).json() for url in (api, llm)]
    requests = sum(s["requests"] for s in stats)
    refused = sum(s["by_status"].get("429", 0) for s in stats)
    return Outcome(label, seconds, int((out["play_status"] == "ok").sum()), flight.most, requests, refused)


def _tools(api: str, llm: str, label: str) -> tuple[pb.Tool, pb.Tool]:
    """A new pair of providers and tools for each contender: nothing learnt carries over."""
    key = pb.secret("DEMO_API_KEY", default="demo-key")
    email = pb.http_tool(
        "b13.email",
        provider=pb.Provider(f"api {label}", rps=RPS),
        method="GET",
        url=api + "/v1/email",
        params={"domain": "{domain}", "first": "{first}"},
        headers={"Authorization": "Bearer {secret}"},
        secret=key,
        pick="email",
        miss_status=(404,),
    )
    chat = pb.llm_tool(
        "b13.llm",
        model=MODEL,
        base_url=llm + "/v1",
        secret=key,
        provider=pb.Provider(f"llm {label}", tpm=TPM),
    )
    return email, chat


class _Flight:
    """The play, counting rows in flight."""

    def __init__(self) -> None:
        self.now = self.most = 0

    def play(self, email: pb.Tool, chat: pb.Tool) -> pb.Play:
        async def greet(row: Any, ctx: pb.Context) -> dict[str, Any]:
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                address = await ctx.tool(email, domain=row.domain, first=row.first)
                note = await ctx.tool(
                    chat, prompt=f"Write one line greeting {row.first} of {row.domain} ({address})."
                )
                return {"email": address, "note": note}
            finally:
                self.now -= 1

        return pb.play(greet, name="b13_greet")
