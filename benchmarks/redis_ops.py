"""What playbook asks of Redis per row: commands, round trips and bytes, measured on a real server.

``python -m benchmarks.redis_ops`` (``--rows 20000``; ``--cluster`` for a 3-master Redis Cluster
with a replica each instead of one server) prints:

- per row, for a first run, a receipts replay (an edited play over the same calls) and a row-memo
  replay of a trivial async tool: the commands the server ran (``INFO commandstats`` after
  ``CONFIG RESETSTAT``, summed over the masters), by command, and the reads it served
  (``total_reads_processed``: a pipeline of many commands arrives in one read or a few, so this
  is close to the round trips);
- per paid call through a provider with ``shared=`` (the limiter on Redis, the store elsewhere):
  the same;
- the bytes Redis holds, by family of keys (``MEMORY USAGE`` of each key), and per receipt, per
  row memo, per hint and per lease, beside the growth of ``used_memory`` per row.

docs/sharing.md ("Past one Redis") rests on these figures.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd
import redis

import playbook as pb
from playbook.demo.redis_server import RedisClusterServer, RedisServer
from playbook.store import engine

CONCURRENCY = 16
PREFIX = "playbook:"


@dataclass
class Usage:
    """What the masters did between two samples: commands by name, reads served."""

    commands: Counter[str]
    reads: int
    cpu: float  # seconds of the servers' CPU (user + system)

    def per(self, n: int) -> str:
        total = sum(self.commands.values())
        top = ", ".join(f"{name} {calls / n:.3f}" for name, calls in self.commands.most_common())
        return f"{total / n:6.3f} commands, {self.reads / n:.3f} reads, {self.cpu / n * 1e6:.1f} µs of server CPU\n{'':19}({top})"


class Nodes:
    """Plain clients of every master (one for a single server), to sample what they did."""

    def __init__(self, ports: list[int]) -> None:
        self.clients = [redis.Redis(port=port, decode_responses=True) for port in ports]

    def reset(self) -> None:
        self.cpu: dict[int, float] = {}
        for client in self.clients:
            client.config_resetstat()
            used = client.info("cpu")  # not reset by RESETSTAT
            self.cpu[id(client)] = float(used["used_cpu_user"]) + float(used["used_cpu_sys"])

    def usage(self) -> Usage:
        commands: Counter[str] = Counter()
        reads, cpu = 0, 0.0
        for client in self.clients:
            used = client.info("cpu")
            cpu += float(used["used_cpu_user"]) + float(used["used_cpu_sys"]) - self.cpu.get(id(client), 0.0)
            for name, stats in client.info("commandstats").items():
                commands[name.removeprefix("cmdstat_")] += int(stats["calls"])
            reads += int(client.info("stats")["total_reads_processed"])
        # what this sampling sent itself (on each node): the reset, two INFO counted, four reads
        for name in ("info", "config|resetstat"):
            commands[name] -= 2 * len(self.clients) if name == "info" else len(self.clients)
        return Usage(+commands, reads - 4 * len(self.clients), cpu)

    @contextlib.contextmanager
    def measured(self, into: list[Usage]) -> Iterator[None]:
        self.reset()
        yield
        into.append(self.usage())

    def used_memory(self) -> int:
        return sum(int(client.info("memory")["used_memory"]) for client in self.clients)

    def keys(self) -> set[tuple[int, str]]:
        """Every key, with the index of the master holding it."""
        return {(i, key) for i, client in enumerate(self.clients) for key in client.scan_iter(count=1000)}

    def sizes(self, keys: set[tuple[int, str]]) -> dict[str, tuple[int, int]]:
        """``MEMORY USAGE`` of each key (every element counted: ``SAMPLES 0``) and the length of
        its value (a string's; 0 for other types)."""
        found: dict[str, tuple[int, int]] = {}
        for i, client in enumerate(self.clients):
            mine = [key for node, key in keys if node == i]
            for start in range(0, len(mine), 1000):
                chunk = mine[start : start + 1000]
                with client.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        pipe.execute_command("MEMORY USAGE", key, "SAMPLES", "0")
                        pipe.type(key)
                        pipe.strlen(key)
                    answers = pipe.execute(raise_on_error=False)
                for key, size, kind, length in zip(chunk, answers[::3], answers[1::3], answers[2::3]):
                    found[key] = (int(size or 0), int(length) if kind == "string" else 0)
        return found

    def close(self) -> None:
        for client in self.clients:
            client.close()


_ADDRESS = re.compile(r"(?<![A-Za-z0-9])([rsm])[A-Za-z0-9_-]{20,}")


def family(key: str) -> str:
    """A key with its address, play and row replaced by their kind: ``playbook:info:<r>``."""
    key = _ADDRESS.sub(lambda m: f"<{m.group(1)}>", key)
    key = re.sub(r"\{[A-Za-z0-9]{1,4}\}$", "{<slot>}", key)  # a counter in each slot
    return re.sub(r"used:[^:]+:.+$", "used:<play>:<row>", key)


def kind(name: str) -> str:
    """What a family of keys is kept for: receipt, memo, hint, lease or other."""
    if "lease" in name:
        return "lease"
    if "used:" in name:
        return "hint"
    if "<m>" in name or re.search(r":memos\b", name):
        return "memo"
    if "<r>" in name or name.endswith((":receipts", ":count")) or ":tool:" in name or ":n{" in name:
        return "receipt"
    return "other"


def _frame(rows: int) -> pd.DataFrame:
    return pd.DataFrame({"n": range(rows)})


def _lookup(name: str) -> Callable[..., object]:
    @pb.tool(name=name, version="1")
    async def lookup(n: int) -> dict:
        return {"n": n, "label": f"item-{n}"}

    return lookup


def _played(
    store: pb.ReceiptStore, rows: int, tool: Callable[..., object], play: str, version: str
) -> pb.RunStats:
    async def body(row, ctx):
        return {"v": await ctx.tool(tool, n=row.n)}

    run = _frame(rows).play.run(
        pb.play(body, name=play, version=version), store=store, progress=False, concurrency=CONCURRENCY
    )
    return run.stats


def store_rows(url: str, nodes: Nodes, rows: int) -> None:
    """Commands per row of the three runs, then the bytes a run of as many rows more adds, by
    family of keys, then a lease's."""
    store = pb.ReceiptStore(url)
    lookup = _lookup("lookup")
    usages: list[Usage] = []
    with nodes.measured(usages):
        stats = _played(store, rows, lookup, "ops", "1")
    assert stats.ok == rows and stats.calls_reused == 0, stats
    with nodes.measured(usages):
        stats = _played(store, rows, lookup, "ops", "2")
    assert stats.calls_reused == rows and stats.calls_executed == 0, stats
    with nodes.measured(usages):
        stats = _played(store, rows, lookup, "ops", "2")
    assert stats.reused == rows, stats
    print(f"\nRedis commands per row, {rows:,} rows of one trivial call each (concurrency {CONCURRENCY}):")
    for name, usage in zip(("first run", "receipts replay", "row-memo replay"), usages):
        print(f"  {name:<16} {usage.per(rows)}")
    addresses = grown_by(store, nodes, rows)
    leased(store, nodes, addresses)
    store.close()


def grown_by(store: pb.ReceiptStore, nodes: Nodes, rows: int) -> list[str]:
    """What a first run of ``rows`` rows more adds to a store that holds as many (so what is
    made once, a counter or an id, is not counted), by family of keys; the receipts' addresses."""
    keys = nodes.keys()
    before, memory = nodes.sizes(keys), nodes.used_memory()
    stats = _played(store, rows, _lookup("lookup-more"), "ops-more", "1")
    assert stats.ok == rows and stats.calls_reused == 0, stats
    grown = nodes.used_memory() - memory
    after_keys = nodes.keys()
    after = nodes.sizes(after_keys)
    by_family: dict[str, list[int]] = {}
    lengths: Counter[str] = Counter()
    for key, (size, length) in after.items():
        if size != before.get(key, (0, 0))[0]:
            by_family.setdefault(family(key), []).append(size - before.get(key, (0, 0))[0])
            lengths[family(key)] += length if key not in before else 0
    print(f"\nBytes a first run of {rows:,} rows more adds (MEMORY USAGE, SAMPLES 0, after - before):")
    by_kind: Counter[str] = Counter()
    for name, found in sorted(by_family.items(), key=lambda item: -sum(item[1])):
        by_kind[kind(name)] += sum(found)
        print(
            f"  {name:<40} {len(found):>7,} keys  {sum(found) / len(found):>9,.0f} B each  {sum(found) / rows:>7,.1f} B/row"
            + (f"  (value {lengths[name] / len(found):,.0f} B)" if lengths[name] else "")
        )
    for name in ("receipt", "memo", "hint", "other"):
        print(f"  per {name:<8} {by_kind[name] / rows:>7,.1f} B (its keys and its share of the indexes)")
    print(
        f"  all        {sum(by_kind.values()) / rows:>7,.1f} B a row by MEMORY USAGE; used_memory grew {grown / rows:,.1f} B a row"
    )
    found = (_ADDRESS.search(key) for _, key in after_keys - keys if family(key).endswith("<r>"))
    return sorted({match.group(0) for match in found if match})[:1000]


def leased(store: pb.ReceiptStore, nodes: Nodes, addresses: list[str]) -> None:
    """The bytes of a lease on each of ``addresses``."""
    backend = engine(store).backend
    keys_before, before = nodes.keys(), nodes.used_memory()
    backend.take(addresses, "bench-owner-0123456789abcdef", 600.0)
    leases = nodes.sizes(nodes.keys() - keys_before)
    grown = nodes.used_memory() - before
    print(
        f"  per lease  {sum(size for size, _ in leases.values()) / len(addresses):>7,.1f} B ({len(leases)} keys for {len(addresses)} leases); "
        f"used_memory grew {grown / len(addresses):,.1f} B a lease"
    )
    backend.release(addresses, "bench-owner-0123456789abcdef")


def limiter_calls(url: str, nodes: Nodes, calls: int) -> None:
    """Commands per paid call of a provider with ``shared=`` on this Redis (the store on disk)."""
    api = pb.Provider("ops-bench", rps=1000, concurrency=CONCURRENCY, shared=url)

    @pb.tool(name="paid", version="1", provider=api)
    async def paid(n: int) -> dict:
        return {"n": n}

    async def body(row, ctx):
        return {"v": await ctx.tool(paid, n=row.n)}

    store = pb.ReceiptStore(tempfile.mkdtemp(prefix="pb-ops-") + "/store")
    usages: list[Usage] = []
    with nodes.measured(usages):
        run = _frame(calls).play.run(
            pb.play(body, name="limited"), store=store, progress=False, concurrency=CONCURRENCY
        )
    if run.stats.calls_executed != calls:
        print(f"\nShared limiter: the run did not pay every call: {run.stats}")
        return
    print(f"\nShared limiter (rps=1000, concurrency={CONCURRENCY}), per paid call, {calls:,} calls:")
    print(f"  {'limiter':<16} {usages[0].per(calls)}")
    store.close()


def index_entries(nodes: Nodes, entries: int = 200_000, per_hash: int = 100) -> None:
    """What a receipt would cost Redis if only an index of it stayed there (its body elsewhere):
    the address's last 12 bytes -> a segment number, a row in it and a time (12 bytes), in hashes
    of about ``per_hash`` entries (small hashes are kept as listpacks), bucketed by the address's
    first 4 bytes.  The tier docs/sharing.md's plan weighs, measured on this server."""
    import hashlib
    import struct

    client = nodes.clients[0]
    before = nodes.used_memory()
    buckets = entries // per_hash
    with client.pipeline(transaction=False) as pipe:
        for i in range(entries):
            digest = hashlib.blake2b(str(i).encode(), digest_size=16).digest()
            bucket = int.from_bytes(digest[:4], "big") % buckets
            pipe.hset(f"bench:index:{{{bucket}}}", digest[4:], struct.pack(">IIf", i // 10_000, i, 0.0))
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
    grown = nodes.used_memory() - before
    encoding = client.object("encoding", "bench:index:{0}")
    print(
        f"\nAn index entry only ({entries:,} in hashes of ~{per_hash}, {encoding}): {grown / entries:.1f} B each (used_memory)"
    )
    client.delete(*[f"bench:index:{{{b}}}" for b in range(buckets)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_ops", description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument(
        "--calls", type=int, default=3_000, help="paid calls through the shared limiter (0: none)"
    )
    parser.add_argument("--cluster", action="store_true", help="a 3-master Redis Cluster, not one server")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="playbook-ops-marks-") as marks:
        import os

        os.environ.setdefault("PLAYBOOK_MARKS", marks)
        with RedisClusterServer() if args.cluster else RedisServer() as server:
            ports = (
                [node.port for node in server.masters()]
                if isinstance(server, RedisClusterServer)
                else [server.port]
            )
            nodes = Nodes(ports)
            print(
                f"on {'a Redis Cluster of 3 masters' if args.cluster else 'one Redis server'} ({server.url})"
            )
            store_rows(server.url, nodes, args.rows)
            if args.calls:
                limiter_calls(server.url, nodes, args.calls)
            if not args.cluster:
                index_entries(nodes)
            nodes.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
