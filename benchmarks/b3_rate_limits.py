"""B3: a rate-limited provider.  The demo provider admits 50 requests a second per key (burst 10);
1,500 rows, one GET /v1/email call each, 64 at a time.  Three contenders, interleaved in one run:

- configured: ``pb.Provider("demo", rps=50)`` (burst left unset);
- discovered: ``pb.Provider("demo")``, the rate found from the provider's 429s;
- naive: the loop a user would hand-write, ``asyncio.gather`` + ``asyncio.Semaphore(64)`` and
  exponential backoff on 429 (8 attempts, 0.1 s doubling, no jitter, Retry-After ignored); a row
  that runs out of attempts fails.

Goodput is successful rows per second of wall time.  The demo's own counters (``GET /_stats``)
give the share of requests refused with 429; ``POST /_reset`` before each contender zeroes them and
refills the rate bucket.  Every contender gets a new store and a new Provider.  A repetition costs
~30 s a contender, so the default is one.  When a contender of ours misses its absolute target, its
trajectory (rate, 429s, rows done, sampled every 0.5 s) goes to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pandas as pd
from httpx_aiohttp import AiohttpTransport

import playbook as pb

from .harness import Result, demo_process

ROWS = 1_500
CONCURRENCY = 64
RPS = 50
BURST = 10
ATTEMPTS = 8  # the naive loop's
SAMPLE = 0.5  # seconds between samples of the governor's rate


@dataclass
class Outcome:
    ok: int  # rows that succeeded
    seconds: float
    requests: int  # as the demo counted them
    refused: int  # 429s among them
    trace: list[tuple[float, float | None, int, int, int]] = field(default_factory=list)  # t, rate, 429s, sent, rows done

    @property
    def goodput(self) -> float:
        return self.ok / self.seconds

    @property
    def refused_share(self) -> float:
        return self.refused / self.requests if self.requests else 0.0


@contextlib.contextmanager
def sampling(provider: pb.Provider, done: list[int]) -> Iterator[list[tuple[float, float | None, int, int, int]]]:
    """Sample the governor every ``SAMPLE`` seconds from a thread while the block runs."""
    trace: list[tuple[float, float | None, int, int, int]] = []
    stop = threading.Event()
    start = time.perf_counter()

    def sample() -> None:
        trace.append((time.perf_counter() - start, provider.rate, provider.refused, provider.sent, done[0]))

    def loop() -> None:
        while not stop.wait(SAMPLE):
            sample()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield trace
    finally:
        stop.set()
        thread.join()
        sample()


def run(repeats: int = 1) -> list[Result]:
    with demo_process("--rps", str(RPS), "--burst", str(BURST)) as url:
        frame = pd.DataFrame({"domain": [f"company{i}.com" for i in range(ROWS)], "first": [f"P{i}" for i in range(ROWS)]})
        stores = (tempfile.mkdtemp(prefix=f"pb-b3-{i}-") for i in itertools.count())

        def measured(contender) -> Outcome:  # noqa: ANN001 - returns (ok rows, trace)
            httpx.post(url + "/_reset", timeout=5).raise_for_status()
            start = time.perf_counter()
            ok, trace = contender()
            seconds = time.perf_counter() - start
            stats = httpx.get(url + "/_stats", timeout=5).json()
            return Outcome(ok, seconds, stats["requests"], stats["by_status"].get("429", 0), trace)

        def ours(rps: float | None):  # noqa: ANN202
            def contender() -> tuple[int, list]:
                provider = pb.Provider("demo", rps=rps)
                find_email = pb.http_tool(
                    "demo.email", method="GET", url=url + "/v1/email",
                    params={"domain": "{domain}", "first": "{first}"},
                    headers={"Authorization": "Bearer demo-key"}, pick="email", miss_status=(404,), provider=provider,
                )  # fmt: skip
                done = [0]

                @pb.play
                async def enrich(row, ctx):
                    email = await ctx.tool(find_email, domain=row.domain, first=row.first)
                    done[0] += 1
                    return {"email": email}

                with sampling(provider, done) as trace:
                    out = frame.play.map(enrich, store=pb.ReceiptStore(next(stores)), concurrency=CONCURRENCY, progress=False)
                return int((out["play_status"] == "ok").sum()), trace

            return contender

        def naive() -> tuple[int, list]:
            async def main() -> int:
                limits = httpx.Limits(max_connections=4 * CONCURRENCY, max_keepalive_connections=4 * CONCURRENCY)
                async with httpx.AsyncClient(transport=AiohttpTransport(limits=limits)) as client:
                    gate = asyncio.Semaphore(CONCURRENCY)

                    async def one(domain: str, first: str) -> bool:
                        async with gate:
                            for attempt in range(ATTEMPTS):
                                r = await client.get(url + "/v1/email", params={"domain": domain, "first": first},
                                                     headers={"Authorization": "Bearer demo-key"})  # fmt: skip
                                if r.status_code != 429:
                                    break
                                await asyncio.sleep(0.1 * 2**attempt)
                            return r.status_code in (200, 404)

                    results = await asyncio.gather(*(one(d, f) for d, f in zip(frame["domain"], frame["first"])))
                    return sum(results)

            return asyncio.run(main()), []

        contenders = {"naive": naive, "configured": ours(RPS), "discovered": ours(None)}
        outcomes: dict[str, list[Outcome]] = {name: [] for name in contenders}
        for _ in range(repeats):
            for name, contender in contenders.items():
                outcomes[name].append(measured(contender))

    base = outcomes["naive"]
    base_goodput = statistics.median(o.goodput for o in base)
    runs = f"{repeats} run{'s' if repeats != 1 else ''} each"
    naive_line = (
        f"naive: 429s {_share(base)} of {_requests(base)} requests, "
        f"{ROWS - statistics.median(o.ok for o in base):.0f} rows out of attempts; {runs}"
    )
    results = []
    for name, label, floor, most in (("configured", f"configured rps={RPS}", 0.95, 0.02), ("discovered", "discovered rps", 0.85, 0.10)):
        mine = outcomes[name]
        goodput = statistics.median(o.goodput for o in mine)
        share = statistics.median(o.refused_share for o in mine)
        failed = ROWS - statistics.median(o.ok for o in mine)
        result = Result(
            f"B3 {label} (1.5k, c={CONCURRENCY})", "/s", goodput, base_goodput,
            "naive gather+Semaphore+backoff on 429", 1.0,
        )  # fmt: skip
        result.notes = [
            (f"goodput {goodput:.1f}/s >= {floor * RPS:.1f}/s ({floor:.2f} x {RPS} rps); naive {base_goodput:.1f}/s", goodput >= floor * RPS),
            (f"429s {share:.1%} of {_requests(mine)} requests <= {most:.0%}; {failed:.0f} rows failed", share <= most and failed == 0),
            (naive_line, None),
        ]  # fmt: skip
        results.append(result)
        if goodput < floor * RPS or share > most:
            _print_trace(name, min(mine, key=lambda o: o.goodput))
    return results


def _requests(outcomes: list[Outcome]) -> str:
    return f"{statistics.median(o.requests for o in outcomes):,.0f}"


def _share(outcomes: list[Outcome]) -> str:
    return f"{statistics.median(o.refused_share for o in outcomes):.1%}"


def _print_trace(name: str, outcome: Outcome) -> None:
    out = sys.stderr
    print(f"B3 {name} missed its target: {outcome.goodput:.1f}/s, {outcome.refused} 429s of {outcome.requests} requests, "
          f"{outcome.seconds:.1f}s; the governor every {SAMPLE}s:", file=out)  # fmt: skip
    print(f"  {'t(s)':>6} {'rate/s':>8} {'429s':>6} {'sent':>6} {'rows':>6} {'rows/s':>7}", file=out)
    last_t, last_rows = 0.0, 0
    for t, rate, refused, sent, rows in outcome.trace:
        pace = (rows - last_rows) / (t - last_t) if t > last_t else 0.0
        shown = "none" if rate is None else f"{rate:.2f}"
        print(f"  {t:>6.1f} {shown:>8} {refused:>6} {sent:>6} {rows:>6} {pace:>7.1f}", file=out)
        last_t, last_rows = t, rows
    out.flush()
