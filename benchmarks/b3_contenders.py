"""B3's contenders and how one run of them is measured against the demo provider.

``ours`` is ``frame.play.map`` with one GET /v1/email per row through a new ``pb.Provider`` and a
new store; ``naive`` is the loop a user would hand-write: ``asyncio.gather`` over a semaphore, a
429 or a 5xx retried after ``0.1 * 2**attempt`` seconds (8 attempts, no jitter, hints ignored; a
transport error fails the row at once, as a hand-written ``except httpx.HTTPError`` does).
``measured`` resets the demo to a shape's settings, times one contender and reads the demo's
counters; a trace of the governor (every ``SAMPLE`` seconds) is kept for when a run misses its
target.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pandas as pd
from httpx_aiohttp import AiohttpTransport

import playbook as pb

from .harness import Samples, admissions, on_providers_clock

CONCURRENCY = 32
ATTEMPTS = 8  # the naive loop's
SAMPLE = 0.5  # seconds between samples of the governor
NAIVE = "naive gather+Semaphore+backoff"

Trace = list[tuple[float, Any, Any, Any, Any, int]]  # t, rate, in-flight limit, 429s, sent, rows done
Run = Callable[[], tuple[int, int, Trace]]  # a contender over its rows: rows ok, rows failed or parked, trace


@dataclass
class Outcome:
    rows: int
    ok: int  # rows that succeeded
    settled: int  # rows failed or parked
    seconds: float
    stats: dict[str, Any] | None  # the demo's counters after the run; None without a server
    error: str | None = None  # what the map raised, if it did
    trace: Trace = field(default_factory=list)
    admitted: Samples = field(default_factory=list)  # the demo's admissions over the run, when watched

    @property
    def goodput(self) -> float:
        return self.ok / self.seconds

    @property
    def requests(self) -> int:
        return self.stats["requests"] if self.stats else 0

    def answered(self, status: str) -> int:
        return self.stats["by_status"].get(status, 0) if self.stats else 0

    @property
    def refused_share(self) -> float:
        return self.answered("429") / self.requests if self.requests else 0.0

    def on_clock(self, settings: dict[str, Any]) -> float:
        """Ideal seconds over the seconds the demo admitted requests in (see ``on_providers_clock``)."""
        return on_providers_clock(settings, self.stats) if self.stats else float("nan")


def measured(
    url: str, settings: dict[str, Any] | None, rows: int, contender: Run, *, watch: bool = False
) -> Outcome:
    """Reset the demo to ``settings`` (None: there is no demo), time ``contender`` over ``rows``
    rows, read the counters; with ``watch``, sample the demo's admissions while it runs."""
    if settings is not None:
        httpx.post(url + "/_reset", json=settings, timeout=5).raise_for_status()
    error = None
    start = time.perf_counter()
    with admissions(url) if watch else contextlib.nullcontext([]) as admitted:
        try:
            ok, settled, trace = contender()
        except Exception as exc:
            ok, settled, trace, error = 0, 0, [], f"{type(exc).__name__}: {exc}"
            print(f"B3: a contender raised {error}", file=sys.stderr, flush=True)
        seconds = time.perf_counter() - start
    stats = httpx.get(url + "/_stats", timeout=5).json() if settings is not None else None
    return Outcome(rows, ok, settled, seconds, stats, error, trace, admitted)


def ours(
    url: str, frame: pd.DataFrame, provider: pb.Provider, *, concurrency: int = CONCURRENCY
) -> tuple[int, int, Trace]:
    """``frame.play.map`` with one GET /v1/email per row through ``provider`` and a new store."""
    find_email = pb.demo.email_tool(url, provider=provider)
    done = [0]

    @pb.play
    async def enrich(row, ctx):
        email = await ctx.tool(find_email, domain=row.domain, first=row.first)
        done[0] += 1
        return {"email": email}

    with tempfile.TemporaryDirectory(prefix="pb-b3-") as home, sampling(provider, done) as trace:
        store = pb.ReceiptStore(home)
        try:
            out = frame.play.map(enrich, store=store, concurrency=concurrency, progress=False)
        finally:
            store.close()
    status = out["play_status"]
    return int((status == "ok").sum()), int(status.isin(["failed", "parked"]).sum()), trace


def naive(
    url: str,
    frame: pd.DataFrame,
    *,
    concurrency: int = CONCURRENCY,
    attempts: int = ATTEMPTS,
    base: float = 0.1,
) -> tuple[int, int, Trace]:
    """The loop a user would hand-write: ``asyncio.gather`` over a semaphore; a 429 or a 5xx is
    retried after ``base * 2**attempt`` seconds, up to ``attempts`` tries; hints are ignored."""

    async def main() -> list[bool]:
        limits = httpx.Limits(max_connections=4 * concurrency, max_keepalive_connections=4 * concurrency)
        async with httpx.AsyncClient(transport=AiohttpTransport(limits=limits), timeout=30) as client:
            gate = asyncio.Semaphore(concurrency)

            async def one(domain: str, first: str) -> bool:
                async with gate:
                    for attempt in range(attempts):
                        try:
                            r = await client.get(
                                url + "/v1/email",
                                params={"domain": domain, "first": first},
                                headers={"Authorization": "Bearer demo-key"},
                            )
                        except httpx.HTTPError:
                            return False
                        if r.status_code != 429 and r.status_code < 500:
                            return r.status_code in (200, 404)
                        if attempt + 1 < attempts:
                            await asyncio.sleep(base * 2**attempt)
                    return False

            return await asyncio.gather(*(one(d, f) for d, f in zip(frame["domain"], frame["first"])))

    results = asyncio.run(main())
    return sum(results), len(results) - sum(results), []


@contextlib.contextmanager
def sampling(provider: pb.Provider, done: list[int]) -> Iterator[Trace]:
    """Sample the governor every ``SAMPLE`` seconds from a thread while the block runs.  Read with
    ``getattr``: a governor without one of these still gets measured."""
    trace: Trace = []
    stop = threading.Event()
    start = time.perf_counter()

    def sample() -> None:
        seen = [getattr(provider, name, None) for name in ("rate", "in_flight_limit", "refused", "sent")]
        trace.append((time.perf_counter() - start, *seen, done[0]))

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


# -- reading outcomes -------------------------------------------------------------------------


def frame(rows: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"domain": [f"company{i}.com" for i in range(rows)], "first": [f"P{i}" for i in range(rows)]}
    )


def median(outcomes: list[Outcome], key: Callable[[Outcome], float] = lambda o: o.goodput) -> Outcome:
    """The run of median ``key`` (the lower middle one), so a row's notes all come from one run."""
    return sorted(outcomes, key=key)[(len(outcomes) - 1) // 2]


def raised(outcome: Outcome) -> str:
    return f"; raised {outcome.error}" if outcome.error else ""


def naive_line(outcome: Outcome) -> str:
    """The naive run, and what the demo admitted during it on its own clock: a check on the shape's ideal."""
    stats = outcome.stats or {"admitted": 0, "admitted_seconds": 0.0}
    return (
        f"naive {outcome.goodput:.1f}/s, demo admitted {stats['admitted']:,} in {stats['admitted_seconds']:.1f}s; "
        f"429s {outcome.refused_share:.0%} of {outcome.requests:,}; {outcome.rows - outcome.ok} rows not ok"
    )


def print_trace(name: str, outcome: Outcome) -> None:
    out = sys.stderr
    print(
        f"{name} missed its target: {outcome.goodput:.1f}/s, {outcome.answered('429')} 429s of {outcome.requests} "
        f"requests, {outcome.seconds:.1f}s; the governor every {SAMPLE}s:",
        file=out,
    )
    print(
        f"  {'t(s)':>6} {'rate/s':>8} {'in-flt':>6} {'429s':>6} {'sent':>6} {'rows':>6} {'rows/s':>7}",
        file=out,
    )
    last_t, last_rows = 0.0, 0
    for t, rate, window, refused, sent, rows in outcome.trace:
        pace = (rows - last_rows) / (t - last_t) if t > last_t else 0.0
        print(
            f"  {t:>6.1f} {_shown(rate):>8} {_shown(window):>6} {_shown(refused):>6} {_shown(sent):>6} {rows:>6} {pace:>7.1f}",
            file=out,
        )
        last_t, last_rows = t, rows
    out.flush()


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    return f"{value:.2f}" if isinstance(value, float) else str(value)
