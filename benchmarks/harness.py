"""A small harness: alternate a case and its baseline, keep the median of each, print ratios.

Absolute numbers on a shared 2-core machine wander; a ratio of two medians measured in the
same run, interleaved, does not wander much.  Rates a provider grants are measured where it
enforces them, on the demo's clock: ``on_providers_clock`` for a whole run, ``admissions`` and
``convergence`` for how the rate grew over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import pandas as pd
from httpx_aiohttp import AiohttpTransport

import playbook as pb
from playbook.demo.redis_server import RedisServer


@dataclass
class Result:
    name: str
    unit: str
    ours: float
    baseline: float
    baseline_name: str
    target: float  # minimum ratio ours / baseline (maximum with at_most)
    # Extra lines printed under the row: (text, verdict); verdict True/False prints ok/LOW, None nothing.
    notes: list[tuple[str, bool | None]] = field(default_factory=list)
    at_most: bool = False  # for costs such as times (lower is better): the ratio must stay <= target
    upper: float | None = (
        None  # a ratio that must stay between target and this (a projection against what happened)
    )

    @property
    def ratio(self) -> float:
        return self.ours / self.baseline if self.baseline else float("nan")

    @property
    def ok(self) -> bool:
        if self.upper is not None:
            return self.target <= self.ratio <= self.upper
        return self.ratio <= self.target if self.at_most else self.ratio >= self.target


def compare(
    name: str,
    ours: Callable[[], float],
    baseline: Callable[[], float],
    *,
    unit: str,
    baseline_name: str,
    target: float,
    repeats: int = 3,
) -> Result:
    """Run baseline and ours alternately ``repeats`` times; each returns a rate (higher is better)."""
    mine, theirs = [], []
    for _ in range(repeats):
        theirs.append(baseline())
        mine.append(ours())
    return Result(name, unit, statistics.median(mine), statistics.median(theirs), baseline_name, target)


_VERDICT = 78  # the column of a row's ok / LOW


def table(results: list[Result]) -> str:
    head = f"{'case':<34} {'ours':>12} {'baseline':>12} {'ratio':>7} {'target':>7}  {'':4} baseline is"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.name:<34} {r.ours:>10,.0f}{r.unit:>2} {r.baseline:>10,.0f}{r.unit:>2} {r.ratio:>7.2f} "
            f"{_bound(r):>7}  {_verdict(r):4} {r.baseline_name}"
        )
        for text, verdict in r.notes:
            flag = "" if verdict is None else "ok" if verdict else "LOW"
            lines.append(f"  {text:<{_VERDICT - 3}} {flag}".rstrip())
    return "\n".join(lines)


def _bound(r: Result) -> str:
    if r.upper is not None:
        return (
            f"±{r.upper - 1:.0%}"
            if abs((r.upper - 1) - (1 - r.target)) < 1e-9
            else f"{r.target:.2f}-{r.upper:.2f}"
        )
    return ("<=" if r.at_most else ">=") + format(r.target, ".2f")


def _verdict(r: Result) -> str:
    if r.ok:
        return "ok"
    return "HIGH" if r.at_most or (r.upper is not None and r.ratio > r.upper) else "LOW"


T = TypeVar("T")
R = TypeVar("R")


async def worker_pool(
    items: Iterable[T], work: Callable[[T], Awaitable[R]], count: int, workers: int = 256
) -> list[R]:
    """``work(item)`` for the ``count`` items, by ``workers`` coroutines pulling from one iterator
    (what a careful hand-written loop does: no task per item); the results in the items' order."""
    results: list[Any] = [None] * count
    pulled = enumerate(items)

    async def worker() -> None:
        for i, item in pulled:
            results[i] = await work(item)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return results


def timed(fn: Callable[[], int]) -> float:
    """Items per second for ``fn``, which returns how many items it processed."""
    start = time.perf_counter()
    count = fn()
    return count / (time.perf_counter() - start)


def emptied(redis: RedisServer) -> None:
    """``redis`` flushed between cases, and its store's loss accepted: a store emptied on
    purpose, which the next run must not refuse as one that lost its receipts."""
    redis.flush()
    store = pb.ReceiptStore(redis.url)
    store.accept_loss()
    store.close()


@contextlib.contextmanager
def demo_process(*args: str) -> Iterator[str]:
    """The demo provider in its own process (so it does not share our GIL); yields its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "playbook.demo", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"the demo provider did not start: {line!r}")
        url = line.rsplit(" ", 1)[-1].strip()
        httpx.get(url + "/_health", timeout=5).raise_for_status()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def gather_loop(url: str, frame: pd.DataFrame, concurrency: int) -> int:
    """The baseline a user would hand-write: ``asyncio.gather`` over a semaphore, one GET
    /v1/email per row, on httpx with the aiohttp transport.  Returns the rows done."""

    async def main() -> int:
        limits = httpx.Limits(max_connections=4 * concurrency, max_keepalive_connections=4 * concurrency)
        async with httpx.AsyncClient(transport=AiohttpTransport(limits=limits)) as client:
            gate = asyncio.Semaphore(concurrency)

            async def one(domain: str, first: str) -> object:
                async with gate:
                    r = await client.get(
                        url + "/v1/email",
                        params={"domain": domain, "first": first},
                        headers={"Authorization": "Bearer demo-key"},
                    )
                    return r.json().get("email") if r.status_code == 200 else None

            results = await asyncio.gather(*(one(d, f) for d, f in zip(frame["domain"], frame["first"])))
            return len(results)

    return asyncio.run(main())


# -- the provider's clock ---------------------------------------------------------------------

POLL = 0.1  # seconds between samples of the demo's counters
Samples = list[tuple[float, int]]  # (time.perf_counter(), requests the demo admitted so far)


def allowed_rate(settings: dict[str, Any]) -> float:
    """Requests a second the demo's limit in ``settings`` (a token bucket or a fixed window) allows
    in the long run."""
    if settings.get("rps"):
        return float(settings["rps"])
    return settings["window_limit"] / settings["window_seconds"]


def ideal_seconds(settings: dict[str, Any], admitted: int) -> float:
    """The least time the demo's limit in ``settings`` lets ``admitted`` requests in, on its clock:
    a token bucket lets ``burst`` in at once and then ``rps`` a second; a fixed window lets
    ``window_limit`` in at once and then that many per ``window_seconds``."""
    first = (
        settings.get("burst", 10) if settings.get("rps") else settings["window_limit"]
    )  # 10: the demo's default burst
    return (admitted - first) / allowed_rate(settings)


def on_providers_clock(settings: dict[str, Any], stats: dict[str, Any]) -> float:
    """Ideal seconds over the seconds between the first and the last request the demo admitted:
    1.0 is every request in as soon as the limit allowed."""
    seconds = stats["admitted_seconds"]
    return ideal_seconds(settings, stats["admitted"]) / seconds if seconds > 0 else float("nan")


@contextlib.contextmanager
def admissions(url: str) -> Iterator[Samples]:
    """The demo's admitted count every ``POLL`` seconds, from a thread, while the block runs (and
    once after it)."""
    samples: Samples = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=5) as client:
            while True:
                last = done.is_set()
                samples.append((time.perf_counter(), client.get(url + "/_stats").json()["admitted"]))
                if last:
                    return
                done.wait(POLL)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()


@dataclass(frozen=True)
class Convergence:
    """How a discovered rate settled: ``after`` seconds from the first admission until the rate
    over every sliding ``SPAN`` seconds held >= ``SHARE`` x the limit (None: it never did);
    ``rate`` admissions a second from then on (until ``UNTIL`` of them were in), over ``seconds``."""

    after: float | None
    rate: float
    seconds: float

    SPAN = 3.0  # seconds of the sliding window
    SHARE = 0.9  # of the limit
    UNTIL = 0.95  # of the admissions: the last few rows, when few are left to send, are not steady


def convergence(samples: Samples, limit: float) -> Convergence:
    """Read ``samples`` (from ``admissions``) against ``limit`` (admissions a second)."""
    final = samples[-1][1] if samples else 0
    started = next((i for i, (_, n) in enumerate(samples) if n > 0), None)
    if started is None:
        return Convergence(None, math.nan, 0.0)
    start = max(started - 1, 0)  # the first admission fell between these two samples
    end = next(i for i, (_, n) in enumerate(samples) if n >= Convergence.UNTIL * final)
    steady = start
    for i in range(start, end + 1):
        t, n = samples[i]
        j = next((j for j in range(i, end + 1) if samples[j][0] >= t + Convergence.SPAN), None)
        if j is None:
            break
        if (samples[j][1] - n) / (samples[j][0] - t) < Convergence.SHARE * limit:
            steady = i + 1  # a window that fell short: steadiness starts after it
    if steady >= end or samples[end][0] - samples[steady][0] < Convergence.SPAN:
        return Convergence(None, math.nan, 0.0)
    held = samples[steady : end + 1]
    return Convergence(samples[steady][0] - samples[start][0], slope(held), held[-1][0] - held[0][0])


def slope(points: Samples) -> float:
    """The least-squares slope of ``points`` (a count over time): a rate that one late sample does not move."""
    t0 = points[0][0]
    xs = [t - t0 for t, _ in points]
    ys = [float(n) for _, n in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


# -- rows judged on the provider's clock ------------------------------------------------------


def clock_row(name: str, settings: dict[str, Any], stats: dict[str, Any], floor: float) -> Result:
    """A row whose ratio is the run's on the provider's clock (ours: the rate that amounts to;
    the baseline: the limit), judged against ``floor``."""
    limit, ratio = allowed_rate(settings), on_providers_clock(settings, stats)
    result = Result(name, "/s", ratio * limit, limit, f"the provider's limit, {limit:g}/s", floor)
    result.notes = [clock_note(settings, stats, floor)]
    return result


def steady_row(
    name: str, settings: dict[str, Any], stats: dict[str, Any], samples: Samples, floor: float
) -> Result:
    """A row for a rate that was not configured: its ratio is the rate after it converged over the
    limit, judged against ``floor``; the time it took and the whole run are printed apart."""
    limit = allowed_rate(settings)
    steady = convergence(samples, limit)
    held = f"the {Convergence.SPAN:g} s rate held >= {Convergence.SHARE:g} x {limit:g}/s"
    if steady.after is None:
        converged = f"never converged ({held} at no point until {Convergence.UNTIL:.0%} were admitted)"
    else:
        converged = f"converged {steady.after:.1f}s after the first admission ({held} from then on)"
    result = Result(name, "/s", steady.rate, limit, f"the provider's limit, {limit:g}/s", floor)
    result.notes = [
        (converged, None),
        (
            f"steady {steady.rate:.1f}/s over {steady.seconds:.0f}s after it: {steady.rate / limit:.2f} x {limit:g}/s >= {floor:.2f}",
            steady.rate >= floor * limit,
        ),
        clock_note(settings, stats, None),
    ]
    return result


def clock_note(
    settings: dict[str, Any], stats: dict[str, Any], floor: float | None
) -> tuple[str, bool | None]:
    """What the demo admitted and in how long on its clock, against the ideal (judged unless ``floor`` is None)."""
    ratio = on_providers_clock(settings, stats)
    text = (
        f"on the provider's clock {stats['admitted']:,} admitted in {stats['admitted_seconds']:.1f}s, "
        f"ideal {ideal_seconds(settings, stats['admitted']):.1f}s: {ratio:.2f}"
    )
    if floor is None:
        return f"whole run {text}", None
    return f"{text} >= {floor:.2f} (elapsed <= {1 / floor:.2f} x ideal)", ratio >= floor


def refused_note(stats: dict[str, Any], most: float, not_ok: int, tail: str = "") -> tuple[str, bool]:
    """The share of requests the demo refused with 429 (at most ``most``), and rows not ok (none)."""
    refused, requests = stats["by_status"].get("429", 0), stats["requests"]
    share = refused / requests if requests else 0.0
    return (
        f"429s {share:.1%} ({refused}) of {requests:,} requests <= {most:.0%}; {not_ok} rows not ok{tail}",
        share <= most and not not_ok,
    )
