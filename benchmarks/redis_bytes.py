"""What Redis holds per receipt, per row memo, per hint and per lease of a store on it, on the
layout of the code that runs this (``python -m benchmarks.redis_bytes [rows]``).

A play of one trivial tool call a row runs over ``rows`` rows (10,000 unless told) into a store on
a fresh local ``redis-server``: one receipt, one row memo and one hint a row; then a lease is taken
on each receipt.  Two measures:

- ``MEMORY USAGE key SAMPLES 0`` of every key, summed by what it is for (a record and the index
  entries it has: a hash beside it, its share of a sorted set or a set, a counter), divided by rows;
- ``used_memory`` (``INFO memory``) grown by each step, divided by rows: what the server's
  allocator really gave, key names and dictionary slots included.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import pandas as pd
import redis

import playbook as pb
from playbook.demo.redis_server import RedisServer
from playbook.store.location import open_backend

PREFIX = "playbook:"


def kind(name: str) -> str:
    """What a key is for, by its name (older layouts' names too)."""
    rest = name[len(PREFIX) :]
    if rest.startswith(("lease:",)):
        return "lease"
    if rest.startswith("used:"):
        return "hint"
    if rest.startswith(("m", "memos")):
        return "memo"
    if rest.startswith(("r", "info:r", "tool:", "count", "n{")):
        return "receipt"
    return "other"


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(rows: int = 10_000) -> dict[str, tuple[float, float]]:
    """Bytes per row for each kind: (sum of MEMORY USAGE, used_memory grown)."""

    @pb.tool(name="echo", version="1")
    async def echo(n: int) -> dict[str, int]:
        return {"n": n}

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"n": (await ctx.tool(echo, n=row.n))["n"]}

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        store = pb.ReceiptStore(server.url)
        store.stats()  # opened: its identity and mark exist before the first figure
        before = _used(client)
        pd.DataFrame({"n": range(rows)}).play.run(pb.play(play, name="bytes"), store=store, progress=False)
        after_run = _used(client)
        backend = open_backend(server.url)
        receipts = [
            name.decode()[len(PREFIX) :] for name in client.scan_iter(match=PREFIX + "r*", count=1000)
        ]
        receipts = [key for key in receipts if ":" not in key and key != "receipts"]
        for start in range(0, len(receipts), 1000):
            backend.take(receipts[start : start + 1000], "owner", 600)
        after_leases = _used(client)
        sums: dict[str, int] = defaultdict(int)
        for name in client.scan_iter(match=PREFIX + "*", count=1000):
            sums[kind(name.decode())] += int(client.memory_usage(name, samples=0) or 0)
        backend.close()
        store.close()
    grown = (after_run - before) / rows, (after_leases - after_run) / rows
    return {
        "receipt": (sums["receipt"] / rows, float("nan")),
        "memo": (sums["memo"] / rows, float("nan")),
        "hint": (sums["hint"] / rows, float("nan")),
        "receipt + memo + hint": ((sums["receipt"] + sums["memo"] + sums["hint"]) / rows, grown[0]),
        "lease": (sums["lease"] / rows, grown[1]),
    }


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    print(f"bytes per row in Redis, {rows:,} rows of one call each")
    print(f"{'':24}{'MEMORY USAGE':>14}{'used_memory':>14}")
    for name, (usage, grown) in measure(rows).items():
        shown = "" if grown != grown else f"{grown:,.0f}"
        print(f"{name:24}{usage:>14,.0f}{shown:>14}")


if __name__ == "__main__":
    main()
