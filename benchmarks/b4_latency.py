"""B4: a slow provider.  The demo provider answers every request after 100 ms (no rate limit);
1,600 rows, one GET /v1/email call each, 32 at a time: at most 32 / 0.1 s = 320 rows a second.
Against the hand-written ``httpx`` + ``asyncio.gather`` loop of B2 at the same concurrency.

The tool goes through a ``pb.Provider("demo")`` (no rps: unlimited until a 429, which never comes
here), so the governor's path is measured too.  Every repetition uses a new store and Provider.
"""

from __future__ import annotations

import itertools
import tempfile

import pandas as pd

import playbook as pb

from .harness import Result, compare, demo_process, gather_loop, timed

ROWS = 1_600
CONCURRENCY = 32
LATENCY = 0.1
CEILING = CONCURRENCY / LATENCY  # rows a second, in theory
FLOOR = 0.9  # of the ceiling


def run(repeats: int = 3) -> list[Result]:
    with demo_process("--latency", str(LATENCY)) as url:
        frame = pd.DataFrame(
            {"domain": [f"company{i}.com" for i in range(ROWS)], "first": [f"P{i}" for i in range(ROWS)]}
        )
        stores = (tempfile.mkdtemp(prefix=f"pb-b4-{i}-") for i in itertools.count())

        def ours() -> int:
            find_email = pb.http_tool(
                "demo.email",
                method="GET",
                url=url + "/v1/email",
                params={"domain": "{domain}", "first": "{first}"},
                headers={"Authorization": "Bearer demo-key"},
                pick="email",
                miss_status=(404,),
                provider=pb.Provider("demo"),
            )

            @pb.play
            async def enrich(row, ctx):
                return {"email": await ctx.tool(find_email, domain=row.domain, first=row.first)}

            out = frame.play.map(
                enrich, store=pb.ReceiptStore(next(stores)), concurrency=CONCURRENCY, progress=False
            )
            assert (out["play_status"] == "ok").all(), out["play_error"].dropna().head()
            return len(out)

        def hand_written() -> int:
            return gather_loop(url, frame, CONCURRENCY)

        result = compare(
            f"B4 latency {LATENCY:g} s (1.6k rows, c={CONCURRENCY})",
            lambda: timed(ours),
            lambda: timed(hand_written),
            unit="/s",
            baseline_name="httpx+aiohttp gather loop",
            target=FLOOR,
            repeats=repeats,
        )
    result.notes = [
        (
            f"ours {result.ours:.0f}/s >= {FLOOR * CEILING:.0f}/s ({FLOOR:g} x {CONCURRENCY} / {LATENCY:g} s)",
            result.ours >= FLOOR * CEILING,
        ),
        (
            f"baseline {result.baseline:.0f}/s = {result.baseline / CEILING:.0%} of the {CEILING:.0f}/s ceiling; median of {repeats}",
            None,
        ),
    ]
    return [result]
