"""B2: fresh dispatch of 3,000 rows, one HTTP call each, to the demo provider (no limits),
64 at a time, against a hand-written ``httpx`` + ``asyncio.gather`` loop on the same transport; and
the same map with its leases granted free, to show what cross-process leases cost; and what
synced receipts cost (``durability="strict"``, the default: each commit fsync'd before its rows go
on) against SQLite's NORMAL (``durability="best-effort"``), over HTTP and, the worst case for
syncing, with a tool that answers at once (20,000 rows: the commits are as small as they get).

The demo provider runs in its own process.  Every repetition uses a new store, so every call is
paid for: receipts are written before rows continue, row memos are written too.
"""

from __future__ import annotations

import itertools
import tempfile
from typing import Any

import pandas as pd

import playbook as pb
from playbook.store import MISSING, engine

from .harness import Result, compare, demo_process, gather_loop, timed

ROWS = 3_000
INSTANT_ROWS = 20_000
CONCURRENCY = 64


@pb.tool(name="echo", version="1")
async def _echo(n: int) -> int:
    return n


@pb.play(name="echo")
async def echo(row, ctx):  # type: ignore[no-untyped-def]
    return {"v": await ctx.tool(_echo, n=row.n)}


def run(repeats: int = 3) -> list[Result]:
    with demo_process() as url:
        frame = pd.DataFrame(
            {"domain": [f"company{i}.com" for i in range(ROWS)], "first": [f"P{i}" for i in range(ROWS)]}
        )
        find_email = pb.http_tool(
            "demo.email",
            method="GET",
            url=url + "/v1/email",
            params={"domain": "{domain}", "first": "{first}"},
            headers={"Authorization": "Bearer demo-key"},
            pick="email",
            miss_status=(404,),
        )
        stores = (tempfile.mkdtemp(prefix=f"pb-b2-{i}-") for i in itertools.count())

        @pb.play
        async def enrich(row, ctx):
            return {"email": await ctx.tool(find_email, domain=row.domain, first=row.first)}

        def ours() -> int:
            out = frame.play.map(
                enrich, store=pb.ReceiptStore(next(stores)), concurrency=CONCURRENCY, progress=False
            )
            assert (out["play_status"] == "ok").all(), out["play_error"].dropna().head()
            return len(out)

        def best_effort() -> int:
            store = pb.ReceiptStore(next(stores), durability="best-effort")
            out = frame.play.map(enrich, store=store, concurrency=CONCURRENCY, progress=False)
            assert (out["play_status"] == "ok").all()
            return len(out)

        instant_rows = pd.DataFrame({"n": range(INSTANT_ROWS)})

        def instant(durability: str) -> int:
            store = pb.ReceiptStore(next(stores), durability=durability)
            run = instant_rows.play.run(echo, store=store, concurrency=CONCURRENCY, progress=False)
            assert run.stats.ok == INSTANT_ROWS
            return INSTANT_ROWS

        def hand_written() -> int:
            return gather_loop(url, frame, CONCURRENCY)

        def without_leases() -> int:
            # What leases cost: the same map with the store's leases replaced by a stand-in that
            # grants every lease at once (what a single process would need).
            store = pb.ReceiptStore(next(stores))
            core = engine(store)
            core.leases = _NoLeases(core)  # type: ignore[assignment]
            out = frame.play.map(enrich, store=store, concurrency=CONCURRENCY, progress=False)
            assert (out["play_status"] == "ok").all(), out["play_error"].dropna().head()
            assert not pb.last_run().notices, pb.last_run().notices
            return len(out)

        return [
            compare(
                "B2 fresh dispatch (3k rows, c=64)",
                lambda: timed(ours),
                lambda: timed(hand_written),
                unit="/s",
                baseline_name="httpx+aiohttp gather loop",
                target=0.7,
                repeats=repeats,
            ),
            compare(
                "B2 with leases vs without",
                lambda: timed(ours),
                lambda: timed(without_leases),
                unit="/s",
                baseline_name="the same map, leases granted free",
                target=0.0,
                repeats=repeats,
            ),
            compare(
                "B2 synced receipts vs NORMAL",
                lambda: timed(ours),
                lambda: timed(best_effort),
                unit="/s",
                baseline_name="durability='best-effort'",
                target=0.8,
                repeats=repeats,
            ),
            compare(
                "B2 synced, instant tool (20k rows)",
                lambda: timed(lambda: instant("strict")),
                lambda: timed(lambda: instant("best-effort")),
                unit="/s",
                baseline_name="durability='best-effort'",
                target=0.8,
                repeats=repeats,
            ),
        ]


class _NoLeases:
    """Every lease granted at once, none written: what one process alone would need.  A take that
    looks reads the receipt, as the store's own take does (on a first run, none is there)."""

    owner = "one process alone"
    ttl = 30.0

    def __init__(self, core: Any) -> None:
        self._core = core

    async def take(self, key: str) -> bool:
        return True

    async def take_looking(self, key: str) -> tuple[bool, None]:
        assert self._core.lookup(key) is MISSING
        return True, None

    def among(self, keys: list[str]) -> list[str]:
        return []  # none to give back with the receipts

    def release(self, key: str) -> None:
        pass

    async def stop_renewing(self) -> None:
        pass
