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
  6  nothing listening (a closed port)             300  -         max_wait=5: returns within max_wait + 3 s
                                                                  with every row failed or parked, no
                                                                  exception

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
gives up on a refused connection at once), so their ratio has no target.  In shape 6 rows wait for
the down provider's probes (1 s, then 2, 4... apart) while the next one falls within max_wait, and
park past it: with max_wait=5 a row parks after about 3 s.  Every contender gets a new store and a
new Provider (``b3_contenders``).  When one of ours misses its absolute target, its trajectory
(rate, in-flight limit, 429s, sent, rows done, every 0.5 s) goes to stderr.  One repetition takes
~3 min.  The stricter shapes (a bucket of 2, a window of 5 s, a restart) are ``b3_strict``.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import playbook as pb

from . import b3_contenders as contenders
from .b3_contenders import NAIVE, Outcome, measured, median, naive_line, print_trace, raised
from .harness import Result, demo_process

ROWS = 300
DOWN_WAIT = 5.0  # the max_wait of shape 6's provider
DOWN_WITHIN = DOWN_WAIT + 3.0  # seconds the map may take against a closed port
FLAKY_ROWS = 150
FLAKY_FLOOR = 0.7  # of the clean run's throughput


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
    Shape(
        1,
        "bucket 20/s",
        {"rps": 20, "burst": 5, "retry_after_format": "seconds"},
        20.0,
        (CONFIGURED, DISCOVERED),
    ),
    Shape(2, "window 20/1s", {"window_limit": 20, "window_seconds": 1.0}, 20.0, (CONFIGURED, DISCOVERED)),
    Shape(3, "4 in flight", {"max_in_flight": 4, "latency": 0.1}, 40.0, (DISCOVERED,)),
    Shape(4, "10/s allowed", {"rps": 10, "burst": 5}, 10.0, (Contender("rps=20", 20.0, 0.90, 0.02),)),
)
FLAKY = {"fault_every": 7, "fault_retry_after": 1, "latency": 0.02}
CLEAN = {"latency": 0.02}


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
    frame = contenders.frame(ROWS)
    naive: list[Outcome] = []
    ours: dict[str, list[Outcome]] = {c.label: [] for c in shape.contenders}
    for _ in range(repeats):  # interleaved, so a slow spell of the machine hits every contender
        naive.append(measured(url, shape.settings, ROWS, lambda: contenders.naive(url, frame)))
        for c in shape.contenders:
            ours[c.label].append(
                measured(
                    url,
                    shape.settings,
                    ROWS,
                    lambda c=c: contenders.ours(url, frame, pb.Provider("demo", rps=c.rps)),
                )
            )
    base = median(naive)
    results = []
    for c in shape.contenders:
        mine = median(ours[c.label])
        floor = c.floor * shape.ideal
        failed = mine.rows - mine.ok
        result = Result(
            f"B3.{shape.number} {shape.title}: {c.label}", "/s", mine.goodput, base.goodput, NAIVE, 1.0
        )
        result.notes = [
            (
                f"goodput {mine.goodput:.1f}/s >= {floor:.1f}/s ({c.floor:.2f} x ideal {shape.ideal:g}/s)",
                mine.goodput >= floor,
            ),
            (
                f"429s {mine.refused_share:.1%} of {mine.requests:,} requests <= {c.most:.0%}; {failed} rows not ok{raised(mine)}",
                mine.refused_share <= c.most and failed == 0,
            ),
            (naive_line(base), None),
        ]
        results.append(result)
        if not all(verdict for _, verdict in result.notes[:2]):
            print_trace(result.name, mine)
    return results


def _flaky(url: str, repeats: int) -> Result:
    """Shape 5: the same contender on a server that fails every 7th request and on a clean one."""
    frame = contenders.frame(FLAKY_ROWS)
    naive, clean, flaky = [], [], []
    for _ in range(repeats):
        naive.append(measured(url, FLAKY, FLAKY_ROWS, lambda: contenders.naive(url, frame)))
        clean.append(
            measured(url, CLEAN, FLAKY_ROWS, lambda: contenders.ours(url, frame, pb.Provider("demo")))
        )
        flaky.append(
            measured(url, FLAKY, FLAKY_ROWS, lambda: contenders.ours(url, frame, pb.Provider("demo")))
        )
    base, calm, mine = median(naive), median(clean), median(flaky)
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
        (
            f"503s {mine.answered('503')} of {mine.requests} requests; {failed} rows not ok{raised(mine)}",
            failed == 0 and calm.ok == calm.rows,
        ),
        (f"{mine.goodput / calm.goodput:.2f} x the clean run; {reference}", None),
    ]
    if mine.goodput < floor or failed:
        print_trace(result.name, mine)
    return result


def _unreachable(repeats: int) -> Result:
    """Shape 6: a port nobody listens on.  The measure is rows settled (failed or parked) a second;
    rows wait for the down provider's probes within ``max_wait``, so it is bounded by that wait."""
    url = f"http://127.0.0.1:{_closed_port()}"
    frame = contenders.frame(ROWS)
    naive, ours = [], []
    for _ in range(repeats):
        naive.append(measured(url, None, ROWS, lambda: contenders.naive(url, frame)))
        ours.append(
            measured(
                url, None, ROWS, lambda: contenders.ours(url, frame, pb.Provider("demo", max_wait=DOWN_WAIT))
            )
        )
    base, mine = median(naive, key=_settled_rate), median(ours, key=_settled_rate)
    result = Result(
        f"B3.6 nothing listening: max_wait={DOWN_WAIT:g}",
        "/s",
        _settled_rate(mine),
        _settled_rate(base),
        NAIVE,
        0.0,
    )
    result.notes = [
        (
            f"returned in {mine.seconds:.2f}s <= max_wait + 3 = {DOWN_WITHIN:g}s{raised(mine)}",
            mine.seconds <= DOWN_WITHIN and mine.error is None,
        ),
        (
            f"{mine.settled} of {mine.rows} rows failed or parked (the measure: rows settled a second)",
            mine.settled == mine.rows,
        ),
        (
            "(rows wait for the down provider's probes, 1 s, then 1.5, 2.25... apart, while one falls within max_wait)",
            None,
        ),
        (
            f"naive: {base.settled} rows failed in {base.seconds:.2f}s (no retry of a refused connection)",
            None,
        ),
    ]
    if not all(verdict for _, verdict in result.notes[:2]):
        print_trace(result.name, mine)
    return result


# -- helpers ----------------------------------------------------------------------------------


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
