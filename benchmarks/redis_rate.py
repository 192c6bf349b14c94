"""Operations a second a Redis master serves here, for the commands playbook sends, measured with
Debian's ``redis-benchmark`` against one ``redis-server`` and against a 3-master Redis Cluster
(``--cluster``: its clients spread over the masters by hash tag), each started as the tests start
theirs (append-only file on).

``python -m benchmarks.redis_rate`` prints each ``redis-benchmark`` command line and its result.
The cases: ``GET`` and ``SET`` of one key (a 200-byte value: about a receipt), ``MGET`` of 16 keys
(a read-ahead asks for hundreds at once; 16 keys is one request here), and ``EVALSHA`` of the
store's lease script on one key (``LEASE_TAKE``: a GET and a SET in Lua), each without pipelining
and pipelined 16 deep, from 50 connections.  On a cluster every key carries ``{tag}``, which
redis-benchmark replaces with a tag of the master each of its clients is connected to.

The machine's cores are shared by the benchmark client, the server(s) and whatever else runs: the
single server's figure is what one master serves with a core of its own at best here; the
cluster's is three masters and the client on the same cores, so its total is not three times
one master's.  docs/sharing.md ("Past one Redis") rests on these figures.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess

import redis

from playbook.demo.redis_server import RedisClusterServer, RedisServer
from playbook.store.redis.format import LEASE_TAKE

VALUE = "x" * 200
KEYS = 100_000  # -r: keys drawn at random among this many


def cases(sha: str) -> list[tuple[str, list[str]]]:
    key = "{tag}:k:__rand_int__"
    return [
        ("SET", ["SET", key, VALUE]),
        ("GET", ["GET", key]),
        ("MGET 16 keys", ["MGET", *[key] * 16]),
        ("EVALSHA lease", ["EVALSHA", sha, "1", "{tag}:lease:__rand_int__", "owner-0123456789", "30000"]),
    ]


def bench(port: int, command: list[str], *, cluster: bool, pipeline: int, requests: int) -> tuple[str, float]:
    binary = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"
    args = [
        binary,
        "-p",
        str(port),
        "-c",
        "50",
        "-n",
        str(requests),
        "-r",
        str(KEYS),
        "-P",
        str(pipeline),
        "--csv",
    ]
    if cluster:
        args.append("--cluster")
    args += command
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=600).stdout
    rows = [row for row in csv.reader(io.StringIO(out)) if row and row[0] != "test"]
    shown = " ".join(
        arg if len(arg) < 40 else arg[:8] + "…" for arg in args[1 : len(args) - len(command) + 2]
    )
    shown += (
        f" ×{len(command) - 1}"
        if len(set(command[1:])) == 1 and len(command) > 2
        else " " + " ".join(arg if len(arg) < 40 else arg[:8] + "…" for arg in command[2:])
    )
    return shown, float(rows[-1][1])


def run(target: str, ports: list[int], url_port: int, *, requests: int) -> None:
    cluster = target == "cluster"
    sha = ""
    for port in ports:
        with redis.Redis(port=port) as client:
            sha = str(client.script_load(LEASE_TAKE))
    print(
        f"\n{target}: {'3 masters with a replica each' if cluster else 'one redis-server'}, append-only file on"
    )
    for name, command in cases(sha):
        for pipeline in (1, 16):
            shown, rate = bench(
                url_port,
                command,
                cluster=cluster,
                pipeline=pipeline,
                requests=requests * (4 if pipeline > 1 else 1),
            )
            print(f"  {name:<14} -P {pipeline:<3} {rate:>11,.0f} requests/s   redis-benchmark {shown}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_rate", description=__doc__)
    parser.add_argument("--requests", type=int, default=200_000, help="requests per case (x4 pipelined)")
    args = parser.parse_args(argv)
    print(
        f"{os.cpu_count()} cores; {subprocess.run(['redis-server', '--version'], capture_output=True, text=True).stdout.strip()}"
    )
    with RedisServer() as server:
        run("single", [server.port], server.port, requests=args.requests)
    with RedisClusterServer() as cluster:
        masters = [node.port for node in cluster.masters()]
        run("cluster", masters, masters[0], requests=args.requests)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
