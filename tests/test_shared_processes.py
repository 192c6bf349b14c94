"""One provider account, shared through a real Redis by two and four real processes against the
demo provider, which enforces the account's limits (a 20/s token bucket, 8 requests in flight)
and counts what it saw: the processes together keep to one budget.

Each worker maps its own rows (distinct inputs, so each call's Idempotency-Key is distinct and a
duplicate dispatch would show) through ``Provider("demo", rps=20, concurrency=8, shared=url)``.
Bounds are on the demo's counters; wall time only bounds the combined rate, generously.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import warm
from warm import Warm

import playbook as pb

_WORKER = """
import json, os, sys, time
import pandas as pd
import playbook as pb

cfg = json.loads(sys.argv[1])
start, n = cfg["start"], cfg["n"]
frame = pd.DataFrame({"domain": [f"company{i}.com" for i in range(start, start + n)],
                      "first": [f"P{i}" for i in range(start, start + n)]})
provider = pb.Provider("demo", rps=20, concurrency=8, shared=cfg["shared"])
tool = pb.demo.email_tool(cfg["url"], provider=provider)
store = pb.ReceiptStore(cfg["store"])
# Warm up (imports, the HTTP client) on a provider of its own, so the start line is not a stall.
warm = pd.DataFrame({"domain": [f"warm{start}.com"], "first": ["W"]})
warm.play.map(pb.demo.email_tool(cfg["url"], name="warm"), store=pb.ReceiptStore(cfg["store"] + "-warm"), progress=False)
open(cfg["ready"], "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(cfg["go"]) and time.monotonic() < deadline:
    time.sleep(0.002)
began = time.time()
try:
    run = frame.play.run(tool, store=store, progress=False, concurrency=16)
finally:
    store.close()
statuses = run.result["play_status"].value_counts().to_dict()
print(json.dumps({"began": began, "ended": time.time(), "statuses": statuses, "sent": provider.status().sent}))
"""


@pytest.fixture
def demo(demo_loopback: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The demo provider on loopback: the workers are processes of their own, which reach a
    provider only through a socket."""
    return demo_loopback


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., list[dict[str, Any]]]]:
    """Run N workers from one start line; their printed results.  Any still running at teardown is killed."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    started: list[Warm] = []

    def run(count: int, rows: int, ready: Callable[[], object], **cfg: Any) -> list[dict[str, Any]]:
        go = tmp_path / "go"
        for i in range(count):
            own = {
                **cfg,
                "start": i * rows,
                "n": rows,
                "store": str(tmp_path / f"store{i}"),
                "ready": str(tmp_path / f"ready{i}"),
                "go": str(go),
            }
            started.append(warm.start(script, json.dumps(own)))
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready{i}").exists() for i in range(count)):
            assert time.monotonic() < deadline, "the workers did not get ready"
            time.sleep(0.01)
        ready()  # counters from here: the warm-up calls are not the run's
        go.touch()
        results = []
        for proc in started:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)


@pytest.mark.parametrize(
    ("count", "where"), [(2, "redis_url"), (4, "redis_url"), (4, "cluster_url")], ids=["2", "4", "4-cluster"]
)
def test_processes_sharing_a_provider_keep_to_one_rate_and_one_concurrency(
    demo: pb.demo.DemoServer,
    request: pytest.FixtureRequest,
    workers: Callable[..., list[dict[str, Any]]],
    count: int,
    where: str,
) -> None:
    """2 or 4 processes, rps=20 and concurrency=8 shared (on one Redis server, or 4 on a Redis
    Cluster): the demo never sees more than 8 in flight, the combined rate stays under 20/s, few
    429s, no call dispatched twice."""
    redis_url = request.getfixturevalue(where)
    rows = 120 // count
    limits = {
        "rps": 20,
        "burst": 10,
        "max_in_flight": 8,
        "latency": 0.5,
    }  # 0.5 s answers: 8 in flight bind before 20/s
    demo.reset(**limits)
    results = workers(count, rows, lambda: demo.reset(**limits), url=demo.url, shared=redis_url)
    stats = demo.stats()
    seconds = max(r["ended"] for r in results) - min(r["began"] for r in results)
    rate = stats["requests"] / seconds
    refused = stats["by_status"].get("429", 0)
    print(
        f"{count} processes: {stats['requests']} requests in {seconds:.1f}s = {rate:.1f}/s, "
        f"max in flight {stats['max_in_flight']}, 429s {refused}, sent {[r['sent'] for r in results]}"
    )

    assert all(r["statuses"] == {"ok": rows} for r in results), [r["statuses"] for r in results]
    assert stats["max_in_flight"] <= 8
    assert refused <= 0.02 * stats["requests"] + 1
    # A key seen twice is a refused call tried again (a 429 is not paid for), never a call paid twice.
    assert stats["duplicate_idempotency_keys"] <= refused and len(stats["idempotency_keys"]) == count * rows
    assert rate <= 20 * 1.05
    assert rate >= 0.5 * 16  # 8 in flight / 0.5 s: a limiter that serialised the processes would crawl
    assert all(r["sent"] > 0 for r in results)
