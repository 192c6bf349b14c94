"""B14: one input that always fails is not a down provider.  The demo provider in its own process,
limited to 40 requests a second (a token bucket, burst 10), answers ``GET /v1/status/{code}`` with
the status the path names (httpbin's ``/status/{code}``).  Each row calls it through an
``http_tool`` whose path is built from the row: every tenth row asks for 503, the others for 200.
32 rows in flight, ``pb.Provider(rps=40)``, a new store and provider each run:

     case                        measure                              bound
  1  300 rows, 1 in 10 fails     wall until the last healthy row      <= 1.2 x the clean run
  2  3,000 rows, 1 in 10 fails   is done                              <= 1.2 x the clean run

The baseline, the *clean run*, is the same run with the failing rows removed (270 and 2,700 rows),
measured in the same run of the harness, alternating with ours.  The failing rows must fail after
their retries (5 tries each) with an error that names the tool and says the request fails on its
own (but for the last one or two, whose tries find nothing else answered after them: they give up
as before, naming the tool), and the provider must be neither held nor down.

Each failing row's first try competes with the healthy rows for the 40 requests a second; its later
tries wait for the fresh rows.  Its second try competes too for the first few failing rows (it takes
a second failure, after others were answered, to tell the request from the provider, and two such
requests before the provider learns that its failed calls fail on their own) and for one in four
after (they keep that word fresh: ``Health.gives_way``).  So at one row in ten the healthy rows need
about 1 + 1/9 + 1/36 = 1.14 x the clean run's requests sent before they are done, less what the
burst and each run's fixed cost take off.  One repetition takes ~3.5 minutes.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pandas as pd

import playbook as pb
from playbook.events import ProviderHoldSet
from playbook.providers.provider import governor

from .harness import Result, demo_process

SIZES = (300, 3_000)
EVERY = 10  # every tenth row's request always gets a 503
RPS = 40
SETTINGS = {"rps": RPS, "burst": 10, "latency": 0.02}
CONCURRENCY = 32
TARGET = 1.2
OWN = "this request fails on its own"


@dataclass(frozen=True)
class Outcome:
    healthy_seconds: float  # from the start until the last row that succeeded did
    seconds: float  # the whole run, failing rows included
    ok: int
    failed: int
    own: int  # failed rows whose error says the request fails on its own
    named: int  # failed rows whose error names the tool
    parked: int
    down: bool
    holds: int  # provider holds announced during the run
    requests: int  # what the demo was sent
    answered_503: int


def run(repeats: int = 1) -> list[Result]:
    results = []
    with demo_process() as url:
        for rows in SIZES:
            clean, failing = [], []
            for _ in range(repeats):  # alternated, so a slow spell of the machine hits both
                clean.append(_measured(url, _frame(rows, failing=False)))
                failing.append(_measured(url, _frame(rows, failing=True)))
            results.append(_row(rows, _median(clean), _median(failing)))
    return results


def _frame(rows: int, *, failing: bool) -> pd.DataFrame:
    """``rows`` rows, every tenth asking for 503; the clean frame is the same without those."""
    frame = pd.DataFrame(
        {"row": range(rows), "code": [503 if i % EVERY == EVERY - 1 else 200 for i in range(rows)]}
    )
    return frame if failing else frame[frame["code"] == 200].reset_index(drop=True)


def _measured(url: str, frame: pd.DataFrame) -> Outcome:
    httpx.post(url + "/_reset", json=SETTINGS, timeout=5).raise_for_status()
    provider = pb.Provider(f"b14-{random.randrange(1 << 30)}", rps=RPS)
    status = pb.http_tool(
        "b14.status",
        provider=provider,
        method="GET",
        url=url + "/v1/status/{code}",
        params={"row": "{row}"},
        headers={"Authorization": "Bearer demo-key"},
    )
    holds: list[Any] = []
    governor(provider).subscribe(
        lambda event: holds.append(event) if isinstance(event, ProviderHoldSet) else None, anywhere=True
    )
    last_ok = [0.0]

    async def play(row: Any, ctx: pb.Context) -> dict[str, Any]:
        answer = await ctx.tool(status, code=row.code, row=row.row)
        last_ok[0] = time.perf_counter()
        return {"answer": answer}

    with tempfile.TemporaryDirectory(prefix="pb-b14-") as home:
        start = time.perf_counter()
        done = frame.play.run(pb.play(play, name="b14"), store=home, concurrency=CONCURRENCY, progress=False)
        done.wait()
        seconds = time.perf_counter() - start
    out = done.result
    errors = out.loc[out["play_status"] == "failed", "play_error"]
    stats = httpx.get(url + "/_stats", timeout=5).json()
    return Outcome(
        healthy_seconds=last_ok[0] - start,
        seconds=seconds,
        ok=done.stats.ok,
        failed=done.stats.failed,
        own=int(sum(OWN in e for e in errors)),
        named=int(sum("tool 'b14.status'" in e for e in errors)),
        parked=done.stats.parked,
        down=provider.status().down,
        holds=len(holds),
        requests=stats["requests"],
        answered_503=stats["by_status"].get("503", 0),
    )


def _median(outcomes: list[Outcome]) -> Outcome:
    """The run of median healthy wall (the lower middle one), so a row's notes all come from one run."""
    middle = statistics.median_low([o.healthy_seconds for o in outcomes])
    return next(o for o in outcomes if o.healthy_seconds == middle)


def _row(rows: int, clean: Outcome, mine: Outcome) -> Result:
    failing = rows // EVERY
    result = Result(
        f"B14 1 in {EVERY} always 503: {rows:,} rows",
        "s",
        mine.healthy_seconds,
        clean.healthy_seconds,
        f"the clean run ({rows - failing:,} rows)",
        TARGET,
        at_most=True,
    )
    # The last failing rows' tries may find nothing else answered after them (the healthy rows are
    # done): with no word on the others, they give up as before ("provider ... is unavailable").
    calm = (
        mine.failed == mine.named == failing
        and mine.own >= failing - 2
        and not mine.parked
        and not mine.down
        and not mine.waiting_on
    )
    result.notes = [
        (
            f"healthy rows done in {mine.healthy_seconds:.2f}s, the clean run in {clean.healthy_seconds:.2f}s: "
            f"{mine.healthy_seconds / clean.healthy_seconds:.3f} x <= {TARGET}",
            None,
        ),
        (
            f"{mine.ok:,} ok; {mine.failed} failed ({mine.named} naming the tool, {mine.own} saying the request fails on its own), "
            f"{mine.parked} parked; "
            f"provider down: {mine.down}, waiting on: {mine.waiting_on}",
            calm and mine.ok == rows - failing and clean.ok == rows - failing,
        ),
        (
            f"{mine.requests:,} requests ({mine.answered_503} answered 503: {mine.answered_503 / failing:.1f} a failing row); "
            f"whole run {mine.seconds:.1f}s, the clean one {clean.seconds:.1f}s",
            None,
        ),
    ]
    return result
