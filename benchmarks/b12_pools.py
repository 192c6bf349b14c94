"""B12: a provider with several keys (``pb.Provider(..., keys=[...])``) against the demo provider in
its own process, which enforces each key's limits itself (strict token buckets: no burst) and
counts what each key was answered.  600 rows of the demo's email finder, 32 rows in flight, a
new store and provider names each time:

     case                                            bound
  1  2 keys of 10 rps each                           >= 0.95 x 20/s on the provider's clock, 429s <= 2%
  2  3 keys of 10 rps, one revoked (401) after       every row ok (0 failed for it)
     200 requests
  3  rerun of case 1's frame, another play, the      0 requests (receipts answer whichever key asks)
     keys listed the other way round
  4  2 keys of 10 rps, key A's daily quota runs      every row ok, none parked; A's rows go on under B
     out when it has carried half its share          (elapsed within 1.1 x the ideal 45 s)

The rate of case 1 is measured where it is enforced: the requests the demo admitted over the
seconds between the first and the last.  One repetition takes ~2.5 minutes.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from typing import Any

import httpx
import pandas as pd

import playbook as pb

from .harness import Result, demo_process

ROWS = 600
CONCURRENCY = 32
RPS = 10
KEYS = {"B12_KEY_A": "b12-key-aaaa-0001", "B12_KEY_B": "b12-key-bbbb-0002", "B12_KEY_C": "b12-key-cccc-0003"}
REVOKE_AFTER = 200  # requests
QUOTA = ROWS // 4  # key A's: half of the half it would carry


def run(repeats: int = 1) -> list[Result]:
    os.environ.update(KEYS)
    results: list[Result] = []
    with demo_process() as url:
        for _ in range(repeats):
            results += _two_keys(url)
            results.append(_revoked(url))
            results.append(_quota(url))
    return results


def _frame(tag: str = "") -> pd.DataFrame:
    return pd.DataFrame(
        {"domain": [f"company{i}{tag}.com" for i in range(ROWS)], "first": [f"P{i}" for i in range(ROWS)]}
    )


def _reset(url: str, **settings: Any) -> None:
    body = {"api_keys": list(KEYS.values()), "rps": RPS, "burst": 1, "miss_rate": 0.0, **settings}
    httpx.post(url + "/_reset", json=body, timeout=5).raise_for_status()


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(url + "/_stats", timeout=5).json()  # type: ignore[no-any-return]


def _provider(*envs: str) -> pb.Provider:
    return pb.Provider(
        f"b12-{random.randrange(1 << 30)}", keys=[pb.secret(e) for e in envs], rps=RPS, burst=1
    )


def _run(
    url: str, provider: pb.Provider, frame: pd.DataFrame, store: str, name: str = "enrich"
) -> tuple[pb.Run, float]:
    tool = pb.demo.email_tool(url, provider=provider)

    async def play(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"email": await ctx.tool(tool, domain=row.domain, first=row.first)}

    started = time.perf_counter()
    run = frame.play.run(pb.play(play, name=name), store=store, concurrency=CONCURRENCY, progress=False)
    return run, time.perf_counter() - started


def _two_keys(url: str) -> list[Result]:
    _reset(url)
    store, frame = tempfile.mkdtemp(prefix="pb-b12-"), _frame()
    provider = _provider("B12_KEY_A", "B12_KEY_B")
    first, seconds = _run(url, provider, frame, store)
    stats = _stats(url)
    rate = stats["admitted"] / stats["admitted_seconds"] if stats["admitted_seconds"] else 0.0
    refused, requests = stats["by_status"].get("429", 0), stats["requests"]
    limit = 2 * RPS
    rows = Result(
        "B12.1 2 keys x 10 rps (strict)", "/s", rate, limit, f"the keys' limits summed, {limit}/s", 0.95
    )
    share = refused / requests if requests else 0.0
    by_key = ", ".join(f"{k} {v['ok']}" for k, v in sorted(stats["by_key"].items()))
    rows.notes = [
        (
            f"429s {share:.1%} ({refused}) of {requests:,} requests <= 2%; {ROWS - first.stats.ok} rows not ok",
            share <= 0.02 and first.stats.ok == ROWS,
        ),
        (f"answered per key: {by_key}; wall {seconds:.1f}s", None),
    ]
    # Case 3: another play over the same calls, the keys the other way round: receipts answer.
    swapped = pb.Provider(
        provider.name, keys=[pb.secret("B12_KEY_B"), pb.secret("B12_KEY_A")], rps=RPS, burst=1
    )
    again, _ = _run(url, swapped, frame, store, name="again")
    sent = _stats(url)["requests"] - requests
    rerun = Result(
        "B12.3 rerun, keys swapped: requests",
        "",
        sent,
        requests,
        "the first run's requests",
        0.0,
        at_most=True,
    )
    rerun.notes = [
        (
            f"{again.stats.calls_reused:,} calls answered by receipts, {again.stats.calls_executed} paid",
            again.stats.calls_executed == 0,
        )
    ]
    return [rows, rerun]


def _revoked(url: str) -> Result:
    _reset(url)
    keys = ("B12_KEY_A", "B12_KEY_B", "B12_KEY_C")
    store = tempfile.mkdtemp(prefix="pb-b12-")

    def revoke() -> None:
        while _stats(url)["requests"] < REVOKE_AFTER:
            time.sleep(0.02)
        httpx.post(
            url + "/_configure", json={"api_keys": [KEYS["B12_KEY_A"], KEYS["B12_KEY_C"]]}, timeout=5
        ).raise_for_status()

    watcher = threading.Thread(target=revoke, daemon=True)
    watcher.start()
    run, seconds = _run(url, _provider(*keys), _frame("r"), store)
    watcher.join(timeout=10)
    stats = _stats(url)
    refused = stats["by_status"].get("401", 0)
    result = Result("B12.2 3 keys, 1 revoked mid-run: rows ok", "", run.stats.ok, ROWS, "the rows", 1.0)
    result.notes = [
        (
            f"{run.stats.failed} rows failed; {refused} requests refused with 401 (the calls out under the key when it was "
            f"revoked); wall {seconds:.1f}s",
            run.stats.failed == 0,
        ),
        (f"notices: {'; '.join(run.notices) or 'none'}", None),
    ]
    return result


def _quota(url: str) -> Result:
    _reset(url, quota=QUOTA, quota_keys=[KEYS["B12_KEY_A"]], quota_reset=86400)
    store = tempfile.mkdtemp(prefix="pb-b12-")
    run, seconds = _run(url, _provider("B12_KEY_A", "B12_KEY_B"), _frame("q"), store)
    stats = _stats(url)
    ideal = (ROWS - QUOTA) / RPS  # B carries all but A's quota, at its own rate
    result = Result("B12.4 key A's daily quota out at 50%: rows ok", "", run.stats.ok, ROWS, "the rows", 1.0)
    by_key = ", ".join(
        f"{k} {v['ok']} ok, {v['quota_exceeded']} over quota" for k, v in sorted(stats["by_key"].items())
    )
    result.notes = [
        (
            f"{run.stats.parked} parked, {run.stats.failed} failed; {by_key}",
            run.stats.parked == 0 and run.stats.failed == 0,
        ),
        (
            f"wall {seconds:.1f}s <= 1.1 x the ideal {ideal:.0f}s (B alone after A's quota)",
            seconds <= 1.1 * ideal,
        ),
    ]
    return result
