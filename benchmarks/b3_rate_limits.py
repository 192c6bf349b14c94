"""B3: providers that push back, in the shapes real ones do.  One demo provider process; before
each contender ``POST /_reset`` gives it the shape's settings and zeroes its counters.

     shape                                        rows  ideal     contenders (targets)
  1  token bucket 20/s, burst 5, Retry-After: 1    300  20/s      rps=20 (>= 0.95 ideal, 429s <= 2%)
                                                                  discovered (>= 0.9 ideal, 429s <= 10%)
  2  fixed window, 20 per aligned 1 s              300  20/s      the same two, the same targets
  3  4 requests in flight, 0.1 s each, 429 with    300  40/s      discovered (>= 0.9 ideal, 429s <= 10%)
     no hint
  4  rps=20 configured, 10/s allowed (burst 5)     300  10/s      rps=20 (>= 0.9 ideal, 429s <= 2%)
  5  every 7th request 503 + Retry-After: 1,       150  see      discovered (>= 0.7 x the best a
     0.02 s each                                        below     client honouring the hint can do)
  6  nothing listening (a closed port)             300  -         discovered: returns in < 3 s with every
                                                                  row failed or parked, no exception

In shape 5 the same contender runs on the same server without faults too.  Honouring
"Retry-After: 1" costs a second per round of retries on top of that clean run (retries are
requests, so some are a 7th again: 2 rounds for 150 rows), so the best throughput there is 150 rows
/ (clean seconds + 2 s), under 0.1 x the clean run's; the target is 0.7 x that best.

"Ideal" is the rate the shape allows; goodput is rows ok per second of wall time; the share of
429s is the demo's own count (``GET /_stats``).  Shapes 1-5 are healthy providers, so no row may
fail.  Each row of the table is one (shape, contender); its ratio is against the naive loop run on
the same shape in the same run: ``asyncio.gather`` + ``asyncio.Semaphore(32)`` with exponential
backoff on 429 and 5xx (8 attempts, 0.1 s doubling, no jitter, hints ignored; a transport error
fails the row at once, as a hand-written ``except httpx.HTTPError`` does).  In shapes 1-4 ours must
beat it (ratio >= 1); in 5 and 6 it is printed for reference only (it ignores Retry-After, and it
gives up on a refused connection at once), so their ratio has no target.  Every contender gets a
new store and a new Provider.  When one of ours misses its absolute target, its trajectory (rate,
in-flight limit, 429s, sent, rows done, every 0.5 s) goes to stderr.  One repetition takes ~3 min.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
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

from .harness import Result, demo_process

ROWS = 300
CONCURRENCY = 32
ATTEMPTS = 8  # the naive loop's
SAMPLE = 0.5  # seconds between samples of the governor
NAIVE = "naive gather+Semaphore+backoff"
DOWN_WITHIN = 3.0  # seconds the map may take against a closed port
FLAKY_ROWS = 150
FLAKY_FLOOR = 0.7  # of the clean run's throughput

Trace = list[tuple[float, Any, Any, Any, Any, int]]  # t, rate, in-flight limit, 429s, sent, rows done


@dataclass(frozen=True)
class Contender:
    label: str
    rps: float | None  # what pb.Provider is told; None: discovered
    floor: float  # goodput at least this share of the shape's ideal
    most: float  # 429s at most this share of the requests


@dataclass(frozen=True)
class Shape:
    number: int
    title: str
    settings: dict[str, Any]  # the demo's, for POST /_reset
    ideal: float  # rows per second the provider allows
    contenders: tuple[Contender, ...]


CONFIGURED = Contender("rps=20", 20.0, 0.95, 0.02)
DISCOVERED = Contender("discovered", None, 0.90, 0.10)
LIMITED = (
    Shape(1, "bucket 20/s", {"rps": 20, "burst": 5, "retry_after_format": "seconds"}, 20.0, (CONFIGURED, DISCOVERED)),
    Shape(2, "window 20/1s", {"window_limit": 20, "window_seconds": 1.0}, 20.0, (CONFIGURED, DISCOVERED)),
    Shape(3, "4 in flight", {"max_in_flight": 4, "latency": 0.1}, 40.0, (DISCOVERED,)),
    Shape(4, "10/s allowed", {"rps": 10, "burst": 5}, 10.0, (Contender("rps=20", 20.0, 0.90, 0.02),)),
)
FLAKY = {"fault_every": 7, "fault_retry_after": 1, "latency": 0.02}
CLEAN = {"latency": 0.02}


@dataclass
class Outcome:
    rows: int
    ok: int  # rows that succeeded
    settled: int  # rows failed or parked
    seconds: float
    stats: dict[str, Any] | None  # the demo's counters after the run; None without a server
    error: str | None = None  # what the map raised, if it did
    trace: Trace = field(default_factory=list)

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


def run(repeats: int = 1) -> list[Result]:
    results: list[Result] = []
    with demo_process() as url:
        for shape in LIMITED:
            results += _limited(url, shape, repeats)
        results.append(_flaky(url, repeats))
    results.append(_unreachable(repeats))
    return results


# -- the shapes -------------------------------------------------------------------------------


def _limited(url: str, shape: Shape, repeats: int) -> list[Result]:
    frame = _frame(ROWS)
    naive: list[Outcome] = []
    ours: dict[str, list[Outcome]] = {c.label: [] for c in shape.contenders}
    for _ in range(repeats):  # interleaved, so a slow spell of the machine hits every contender
        naive.append(_measured(url, shape.settings, ROWS, lambda: _naive(url, frame)))
        for c in shape.contenders:
            ours[c.label].append(_measured(url, shape.settings, ROWS, lambda c=c: _ours(url, frame, rps=c.rps)))
    base = _median(naive)
    results = []
    for c in shape.contenders:
        mine = _median(ours[c.label])
        floor = c.floor * shape.ideal
        failed = mine.rows - mine.ok
        result = Result(f"B3.{shape.number} {shape.title}: {c.label}", "/s", mine.goodput, base.goodput, NAIVE, 1.0)
        result.notes = [
            (f"goodput {mine.goodput:.1f}/s >= {floor:.1f}/s ({c.floor:.2f} x ideal {shape.ideal:g}/s)", mine.goodput >= floor),
            (f"429s {mine.refused_share:.1%} of {mine.requests:,} requests <= {c.most:.0%}; {failed} rows not ok{_raised(mine)}",
             mine.refused_share <= c.most and failed == 0),
            (_naive_line(base), None),
        ]  # fmt: skip
        results.append(result)
        if not all(verdict for _, verdict in result.notes[:2]):
            _print_trace(result.name, mine)
    return results


def _flaky(url: str, repeats: int) -> Result:
    """Shape 5: the same contender on a server that fails every 7th request and on a clean one."""
    frame = _frame(FLAKY_ROWS)
    naive, clean, flaky = [], [], []
    for _ in range(repeats):
        naive.append(_measured(url, FLAKY, FLAKY_ROWS, lambda: _naive(url, frame)))
        clean.append(_measured(url, CLEAN, FLAKY_ROWS, lambda: _ours(url, frame, rps=None)))
        flaky.append(_measured(url, FLAKY, FLAKY_ROWS, lambda: _ours(url, frame, rps=None)))
    base, calm, mine = _median(naive), _median(clean), _median(flaky)
    # Honouring "Retry-After: 1" costs that second once per round of retries on top of the clean
    # run, and retries are requests too, so some of them are a 7th again: that is the best any
    # client can do here (under 0.1 x the clean run for 150 rows), and the target is a share of it.
    rounds = _retry_rounds(FLAKY_ROWS, FLAKY["fault_every"])
    best = FLAKY_ROWS / (calm.seconds + rounds * FLAKY["fault_retry_after"])
    floor = FLAKY_FLOOR * best
    failed = mine.rows - mine.ok
    result = Result("B3.5 503 every 7th: discovered", "/s", mine.goodput, base.goodput, NAIVE, 0.0)
    throughput = f"throughput {mine.goodput:.0f}/s >= {floor:.0f}/s ({FLAKY_FLOOR:.2f} x best {best:.0f}/s"
    reference = f"naive (hints ignored) {base.goodput:.0f}/s, {base.rows - base.ok} rows not ok"
    result.notes = [
        (f"{throughput}: the clean run {calm.goodput:.0f}/s + {rounds} x 1 s)", mine.goodput >= floor),
        (f"503s {mine.answered('503')} of {mine.requests} requests; {failed} rows not ok{_raised(mine)}",
         failed == 0 and calm.ok == calm.rows),
        (f"{mine.goodput / calm.goodput:.2f} x the clean run; {reference}", None),
    ]  # fmt: skip
    if mine.goodput < floor or failed:
        _print_trace(result.name, mine)
    return result


def _unreachable(repeats: int) -> Result:
    """Shape 6: a port nobody listens on.  The measure is rows settled (failed or parked) a second."""
    url = f"http://127.0.0.1:{_closed_port()}"
    frame = _frame(ROWS)
    naive, ours = [], []
    for _ in range(repeats):
        naive.append(_measured(url, None, ROWS, lambda: _naive(url, frame)))
        ours.append(_measured(url, None, ROWS, lambda: _ours(url, frame, rps=None)))
    base, mine = _median(naive, key=_settled_rate), _median(ours, key=_settled_rate)
    result = Result("B3.6 nothing listening: discovered", "/s", _settled_rate(mine), _settled_rate(base), NAIVE, 0.0)
    result.notes = [
        (f"returned in {mine.seconds:.2f}s < {DOWN_WITHIN:g}s{_raised(mine)}", mine.seconds < DOWN_WITHIN and mine.error is None),
        (f"{mine.settled} of {mine.rows} rows failed or parked (the measure: rows settled a second)", mine.settled == mine.rows),
        (f"naive: {base.settled} rows failed in {base.seconds:.2f}s (no retry of a refused connection)", None),
    ]  # fmt: skip
    if not all(verdict for _, verdict in result.notes[:2]):
        _print_trace(result.name, mine)
    return result


# -- the contenders ---------------------------------------------------------------------------


def _measured(url: str, settings: dict[str, Any] | None, rows: int, contender: Callable[[], tuple[int, int, Trace]]) -> Outcome:
    """Reset the demo to ``settings`` (None: there is no demo), time ``contender`` over ``rows``
    rows, read the counters."""
    if settings is not None:
        httpx.post(url + "/_reset", json=settings, timeout=5).raise_for_status()
    error = None
    start = time.perf_counter()
    try:
        ok, settled, trace = contender()
    except Exception as exc:
        ok, settled, trace, error = 0, 0, [], f"{type(exc).__name__}: {exc}"
        print(f"B3: a contender raised {error}", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    stats = httpx.get(url + "/_stats", timeout=5).json() if settings is not None else None
    return Outcome(rows, ok, settled, seconds, stats, error, trace)


def _ours(url: str, frame: pd.DataFrame, *, rps: float | None) -> tuple[int, int, Trace]:
    """``frame.play.map`` with one GET /v1/email per row through a new ``pb.Provider`` and store."""
    provider = pb.Provider("demo", rps=rps)
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
            out = frame.play.map(enrich, store=store, concurrency=CONCURRENCY, progress=False)
        finally:
            store.close()
    status = out["play_status"]
    return int((status == "ok").sum()), int(status.isin(["failed", "parked"]).sum()), trace


def _naive(url: str, frame: pd.DataFrame, *, concurrency: int = CONCURRENCY, attempts: int = ATTEMPTS,
           base: float = 0.1) -> tuple[int, int, Trace]:  # fmt: skip
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
                            r = await client.get(url + "/v1/email", params={"domain": domain, "first": first},
                                                 headers={"Authorization": "Bearer demo-key"})  # fmt: skip
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


# -- helpers ----------------------------------------------------------------------------------


def _frame(rows: int) -> pd.DataFrame:
    return pd.DataFrame({"domain": [f"company{i}.com" for i in range(rows)], "first": [f"P{i}" for i in range(rows)]})


def _closed_port() -> int:
    """A port nothing listens on: bound by us for a moment, so no one else held it, then closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _retry_rounds(rows: int, every: int) -> int:
    """Rounds of retries when every ``every``-th request fails and each failure is retried once
    the round before it is over (the fewest any client honouring the hint can need)."""
    sent, pending, rounds = 0, rows, 0
    while True:
        failed = (sent + pending) // every - sent // every
        sent += pending
        if not failed:
            return rounds
        pending, rounds = failed, rounds + 1


def _settled_rate(outcome: Outcome) -> float:
    return outcome.settled / outcome.seconds


def _median(outcomes: list[Outcome], key: Callable[[Outcome], float] = lambda o: o.goodput) -> Outcome:
    """The run of median ``key`` (the lower middle one), so a row's notes all come from one run."""
    return sorted(outcomes, key=key)[(len(outcomes) - 1) // 2]


def _raised(outcome: Outcome) -> str:
    return f"; raised {outcome.error}" if outcome.error else ""


def _naive_line(outcome: Outcome) -> str:
    """The naive run, and what the demo admitted a second during it: a check on the shape's ideal."""
    admitted = outcome.answered("200") + outcome.answered("404")
    return (
        f"naive {outcome.goodput:.1f}/s, demo admitted {admitted / outcome.seconds:.1f}/s; "
        f"429s {outcome.refused_share:.0%} of {outcome.requests:,}; {outcome.rows - outcome.ok} rows not ok"
    )


def _print_trace(name: str, outcome: Outcome) -> None:
    out = sys.stderr
    print(f"{name} missed its target: {outcome.goodput:.1f}/s, {outcome.answered('429')} 429s of {outcome.requests} "
          f"requests, {outcome.seconds:.1f}s; the governor every {SAMPLE}s:", file=out)  # fmt: skip
    print(f"  {'t(s)':>6} {'rate/s':>8} {'in-flt':>6} {'429s':>6} {'sent':>6} {'rows':>6} {'rows/s':>7}", file=out)
    last_t, last_rows = 0.0, 0
    for t, rate, window, refused, sent, rows in outcome.trace:
        pace = (rows - last_rows) / (t - last_t) if t > last_t else 0.0
        print(f"  {t:>6.1f} {_shown(rate):>8} {_shown(window):>6} {_shown(refused):>6} {_shown(sent):>6} {rows:>6} {pace:>7.1f}",
              file=out)  # fmt: skip
        last_t, last_rows = t, rows
    out.flush()


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    return f"{value:.2f}" if isinstance(value, float) else str(value)
