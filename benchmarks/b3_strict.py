"""B3, stricter shapes: a token bucket with almost no burst, a window of seconds, a restart.  One
demo provider process; before each contender ``POST /_reset`` gives it the shape's settings and
zeroes its counters.

     shape                                  rows  conc  contenders (targets)
  7  token bucket 20/s, burst 2,            700    32   rps=20 (>= 0.95 on the provider's clock, 429s <= 2%)
     0.15 s each                                        discovered (steady state >= 0.9 x 20/s, 429s <= 5%)
  8  fixed window, 50 per aligned 5 s,      500    16   unknown (elapsed on the provider's clock
     0.05 s each                                        <= 1.2 x ideal, 429s <= 5%)
                                                        window=(50, 5) (>= 0.95 of ideal, no 429)
  9  503 without a hint for its first 5 s,  100    32   max_wait=60 (every row ok, within 15 s)
     then well
 10  a local server: 8 answered at once,    400    64   concurrency=64 (<= 1.4 x its capacity in
     503 without a hint past them, 0.5 s                time, 503s <= 10%, every row ok)
     each (vLLM or Ollama, queue full)

Shapes 7 and 8 are measured on the provider's clock, where the limit is enforced: the demo counts
the requests it admitted past every limit and the seconds between the first and the last of them.
The ideal seconds for that many are (admitted - burst) / rps for the bucket and (admitted - 50) /
(50 / 5 s) for the window (the first burst or window's allowance goes at once); the ratio is ideal
over the admitted seconds, and it is the ratio column of these rows (ours: the rate on the
provider's clock, ratio x the limit; the baseline: the limit).

The discovered contender of shape 7 is told no rate, so it runs >= 30 s (700 rows at 20/s): a
thread samples the demo's admitted count every 0.1 s; it has converged once the admission rate
over every sliding 3 s holds >= 0.9 x 20/s until 95% of the requests are in (the last rows, few
left to send, are no steady state).  The time from the first admission to then is printed apart;
the target is on the rate from then on (the least-squares slope of admissions over time).

In shape 9 a timer POSTs ``/_configure`` ``{"fault_rate": 0.0}`` 5 s after the contender starts.
Ours waits for the down provider's probes (1 s, then 1.5, 2.25... apart) within max_wait=60.

The naive loop of ``b3_contenders`` (``asyncio.gather`` + ``Semaphore``, exponential backoff, hints
ignored) runs on every shape at the shape's concurrency, printed for reference: in 7 and 8 what
the demo admitted for it checks the shape's ideal; in 9 the ratio is ours over its goodput, with no
target (its backoff, 12.7 s in all, happens to outlast a 5 s outage).  Medians over ``repeats``,
interleaved.  One repetition takes ~5 min.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import httpx

import playbook as pb

from . import b3_contenders as contenders
from .b3_contenders import NAIVE, Outcome, Run, measured, median, naive_line, print_trace, raised
from .harness import Result, allowed_rate, clock_row, convergence, demo_process, refused_note, steady_row

RESTART_ROWS = 100
FAILING = {"fault_rate": 1.0, "fault_status": 503}  # no fault_retry_after: no hint
RECOVERS = 5.0  # seconds after the start
RESTART_WAIT = 60.0  # the provider's max_wait
RESTART_WITHIN = 15.0  # seconds for every row
LOCAL = {"max_in_flight": 8, "max_in_flight_status": 503, "latency": 0.5}
LOCAL_ROWS = 400
LOCAL_CONCURRENCY = 64  # configured far above what the server takes
LOCAL_WITHIN = 1.4  # x its capacity in time: rows x latency / max_in_flight
LOCAL_REFUSED = 0.10  # 503s, of requests


@dataclass(frozen=True)
class Contender:
    label: str
    provider: dict[str, Any]  # pb.Provider("demo", **provider)
    floor: (
        float  # the ratio on the provider's clock (converging: of the steady rate to the limit) at least this
    )
    most: float  # 429s at most this share of the requests
    converges: bool = False  # told no rate: judged on the steady state after it converged


@dataclass(frozen=True)
class Shape:
    number: int
    title: str
    settings: dict[str, Any]  # the demo's, for POST /_reset
    rows: int
    concurrency: int
    contenders: tuple[Contender, ...]


STRICT = (
    Shape(
        7,
        "bucket, burst 2",
        {"rps": 20, "burst": 2, "latency": 0.15},
        700,
        32,
        (
            Contender("rps=20", {"rps": 20}, 0.95, 0.02),
            Contender("discovered", {}, 0.90, 0.05, converges=True),
        ),
    ),
    Shape(
        8,
        "window 50/5s",
        {"window_limit": 50, "window_seconds": 5.0, "latency": 0.05},
        500,
        16,
        (
            Contender("unknown", {}, 1 / 1.2, 0.05),
            Contender("window=(50, 5)", {"window": (50, 5)}, 0.95, 0.0),
        ),
    ),
)


def run(repeats: int = 1) -> list[Result]:
    results: list[Result] = []
    with demo_process() as url:
        for shape in STRICT:
            results += _strict(url, shape, repeats)
        results.append(_restarting(url, repeats))
        results.append(_local_server(url, repeats))
    return results


# -- the shapes -------------------------------------------------------------------------------


def _strict(url: str, shape: Shape, repeats: int) -> list[Result]:
    frame = contenders.frame(shape.rows)
    naive: list[Outcome] = []
    ours: dict[str, list[Outcome]] = {c.label: [] for c in shape.contenders}
    for _ in range(repeats):  # interleaved, so a slow spell of the machine hits every contender
        naive.append(
            measured(
                url,
                shape.settings,
                shape.rows,
                lambda: contenders.naive(url, frame, concurrency=shape.concurrency),
            )
        )
        for c in shape.contenders:
            contender = _ours(url, frame, c.provider, shape.concurrency)
            ours[c.label].append(measured(url, shape.settings, shape.rows, contender, watch=c.converges))
    base = median(naive)
    results = []
    for c in shape.contenders:
        name = f"B3.{shape.number} {shape.title}: {c.label}"
        if c.converges:
            limit = allowed_rate(shape.settings)
            mine = median(ours[c.label], key=lambda o: convergence(o.admitted, limit).rate)
            result = steady_row(name, shape.settings, _stats(mine), mine.admitted, c.floor)
        else:
            mine = median(ours[c.label], key=lambda o: o.on_clock(shape.settings))
            result = clock_row(name, shape.settings, _stats(mine), c.floor)
        result.notes += [
            refused_note(_stats(mine), c.most, mine.rows - mine.ok, raised(mine)),
            (naive_line(base), None),
        ]
        results.append(result)
        if not all(verdict for _, verdict in result.notes if verdict is not None):
            print_trace(result.name, mine)
    return results


def _restarting(url: str, repeats: int) -> Result:
    """Shape 9: a provider answering 503 for its first seconds, then well again."""
    frame = contenders.frame(RESTART_ROWS)
    naive, ours = [], []
    provider = {"max_wait": RESTART_WAIT}
    for _ in range(repeats):
        naive.append(
            measured(url, FAILING, RESTART_ROWS, _recovering(url, lambda: contenders.naive(url, frame)))
        )
        ours.append(
            measured(
                url,
                FAILING,
                RESTART_ROWS,
                _recovering(url, _ours(url, frame, provider, contenders.CONCURRENCY)),
            )
        )
    base, mine = median(naive), median(ours)
    failed = mine.rows - mine.ok
    result = Result(f"B3.9 restart: max_wait={RESTART_WAIT:g}", "/s", mine.goodput, base.goodput, NAIVE, 0.0)
    result.notes = [
        (
            f"{mine.ok} of {mine.rows} rows ok in {mine.seconds:.1f}s <= {RESTART_WITHIN:g}s{raised(mine)}",
            failed == 0 and mine.seconds <= RESTART_WITHIN and mine.error is None,
        ),
        (
            f"503s {mine.answered('503')} of {mine.requests} requests (the demo recovered {RECOVERS:g}s after the start)",
            None,
        ),
        (
            f"naive {base.goodput:.1f}/s: {base.rows - base.ok} rows not ok in {base.seconds:.1f}s; 503s {base.answered('503')} "
            f"of {base.requests}",
            None,
        ),
    ]
    if result.notes[0][1] is False:
        print_trace(result.name, mine)
    return result


def _local_server(url: str, repeats: int) -> Result:
    """Shape 10: a local server refusing with 503 past the calls it can take, concurrency set far above."""
    frame = contenders.frame(LOCAL_ROWS)
    provider = {"concurrency": LOCAL_CONCURRENCY}
    runs = [
        measured(url, LOCAL, LOCAL_ROWS, _ours(url, frame, provider, LOCAL_CONCURRENCY))
        for _ in range(repeats)
    ]
    mine = median(runs)
    capacity = LOCAL_ROWS * LOCAL["latency"] / LOCAL["max_in_flight"]  # seconds, every slot busy throughout
    result = Result(
        f"B3.10 local server, 503 past {LOCAL['max_in_flight']}",
        "/s",
        mine.goodput,
        LOCAL_ROWS / capacity,
        "its capacity (slots / latency)",
        1 / LOCAL_WITHIN,
    )
    refused = mine.answered("503")
    result.notes = [
        (
            f"{mine.ok} of {mine.rows} rows ok in {mine.seconds:.1f}s <= {LOCAL_WITHIN:g} x {capacity:.1f}s{raised(mine)}",
            mine.ok == mine.rows and mine.seconds <= LOCAL_WITHIN * capacity,
        ),
        (
            f"503s {refused / max(1, mine.requests):.1%} ({refused}) of {mine.requests} requests <= {LOCAL_REFUSED:.0%}",
            refused <= LOCAL_REFUSED * mine.requests,
        ),
    ]
    return result


# -- running and reading ----------------------------------------------------------------------


def _ours(url: str, frame: Any, provider: dict[str, Any], concurrency: int) -> Run:
    """Ours over ``frame``, with a new ``pb.Provider("demo", **provider)`` each time it runs."""
    return lambda: contenders.ours(url, frame, pb.Provider("demo", **provider), concurrency=concurrency)


def _recovering(url: str, contender: Run) -> Run:
    """``contender``, with the demo's faults turned off ``RECOVERS`` seconds after it starts."""

    def recovering() -> tuple[int, int, Any]:
        timer = threading.Timer(
            RECOVERS, lambda: httpx.post(url + "/_configure", json={"fault_rate": 0.0}, timeout=5)
        )
        timer.start()
        try:
            return contender()
        finally:
            timer.cancel()
            timer.join()

    return recovering


def _stats(outcome: Outcome) -> dict[str, Any]:
    return outcome.stats or {"requests": 0, "admitted": 0, "admitted_seconds": 0.0, "by_status": {}}
