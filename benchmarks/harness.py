"""A small harness: alternate a case and its baseline, keep the median of each, print ratios.

Absolute numbers on a shared 2-core machine wander; a ratio of two medians measured in the
same run, interleaved, does not wander much.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pandas as pd
from httpx_aiohttp import AiohttpTransport


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

    @property
    def ratio(self) -> float:
        return self.ours / self.baseline if self.baseline else float("nan")

    @property
    def ok(self) -> bool:
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
            f"{('<=' if r.at_most else '>=') + format(r.target, '.2f'):>7}  {_verdict(r):4} {r.baseline_name}"
        )
        for text, verdict in r.notes:
            flag = "" if verdict is None else "ok" if verdict else "LOW"
            lines.append(f"  {text:<{_VERDICT - 3}} {flag}".rstrip())
    return "\n".join(lines)


def _verdict(r: Result) -> str:
    if r.ok:
        return "ok"
    return "HIGH" if r.at_most else "LOW"


def timed(fn: Callable[[], int]) -> float:
    """Items per second for ``fn``, which returns how many items it processed."""
    start = time.perf_counter()
    count = fn()
    return count / (time.perf_counter() - start)


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
                    r = await client.get(url + "/v1/email", params={"domain": domain, "first": first},
                                         headers={"Authorization": "Bearer demo-key"})  # fmt: skip
                    return r.json().get("email") if r.status_code == 200 else None

            results = await asyncio.gather(*(one(d, f) for d, f in zip(frame["domain"], frame["first"])))
            return len(results)

    return asyncio.run(main())
