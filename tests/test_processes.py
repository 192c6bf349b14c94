"""Leases across real processes: two and four workers on one store, a receipt committed by another
process in the instant before a lease is taken, workers killed with SIGKILL mid-run, a lease holder
killed mid-call, and a lease held by a process on another host.  Each runs against a store
directory (SQLite) and against a real Redis server: the backends are peers.

Each worker is a fresh Python process that maps N leads through one HTTP tool on the demo
provider and writes its result as JSON.  The demo counts every request and every
Idempotency-Key (the address), so "paid twice" is counted exactly, not inferred.
Times are bounded only generously, where promptness is the behaviour under test.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import warm
from warm import Warm

import playbook as pb
from playbook.store import engine
from playbook.tools import engine_of


@pytest.fixture
def demo(demo_loopback: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The demo provider on loopback: the runs here are processes of their own, which reach a
    provider only through a socket."""
    return demo_loopback


TOOL = "demo.email"
CONCURRENCY = 16

# argv[1] is a JSON object: url, store, n, ttl, out; optional reverse (map the rows in reverse
# order), ready/go (touch `ready`, then wait for `go` to exist: a start line for racing workers).
_WORKER = """
import json, os, sys, time
import pandas as pd
import playbook as pb

cfg = json.loads(sys.argv[1])
n = cfg["n"]
frame = pd.DataFrame({"domain": [f"company{i}.com" for i in range(n)], "first": [f"P{i}" for i in range(n)]})
if cfg.get("reverse"):
    frame = frame.iloc[::-1]
email = pb.http_tool(
    "demo.email",
    method="GET",
    url=cfg["url"] + "/v1/email",
    params={"domain": "{domain}", "first": "{first}"},
    headers={"Authorization": "Bearer demo-key"},
    pick="email",
    miss_status=(404,),
)
store = pb.ReceiptStore(cfg["store"], lease_ttl=cfg["ttl"])
try:
    if cfg.get("ready"):
        open(cfg["ready"], "w").close()
        deadline = time.monotonic() + 30
        while not os.path.exists(cfg["go"]) and time.monotonic() < deadline:
            time.sleep(0.002)
    began = time.time()
    run = frame.play.run(email, store=store, progress=False, concurrency=16)
    ended = time.time()
    run.result.to_json(cfg["out"])
finally:
    store.close()
print(json.dumps({"calls_executed": run.stats.calls_executed, "began": began, "ended": ended, "elapsed": ended - began}))
"""


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Callable[..., Warm]]:
    """Start worker processes; every one still running at teardown is killed and reaped."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    started: list[Warm] = []

    def start(**cfg: Any) -> Warm:
        proc = warm.start(script, json.dumps(cfg))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)


def _finish(proc: Warm, timeout: float = 60) -> dict[str, Any]:
    """Wait for a worker to exit cleanly; its printed stats."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def _kill(proc: Warm) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)  # reaped: its pid is gone, as after any crash


def _result(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Emails and play statuses by row index, from a worker's JSON result."""
    data = json.loads(path.read_text())
    return data[TOOL], data["play_status"]


def _wait_for(what: str, check: Callable[[], Any], timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
    return found


@pytest.fixture(params=["sqlite", "redis"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the workers keep their receipts: a directory, or a real Redis server."""
    return str(tmp_path / "store") if request.param == "sqlite" else request.getfixturevalue("redis_url")


@pytest.fixture
def shared(where: str) -> Iterator[pb.ReceiptStore]:
    """This process's view of the workers' store."""
    s = pb.ReceiptStore(where)
    yield s
    s.close()


def _look(where: str, work: Callable[[pb.ReceiptStore], Any]) -> Any:
    """Open the store at ``where`` (a fresh view, as another process has it), look, close."""
    store = pb.ReceiptStore(where)
    try:
        return work(store)
    finally:
        store.close()


def _receipts(where: str) -> int:
    return int(_look(where, lambda s: s.stats()["receipts"]))


def _holder(where: str, key: str) -> tuple[str, float] | None:
    return _look(where, lambda s: engine(s).backend.holder(key))  # type: ignore[no-any-return]


def _key(demo: pb.demo.DemoServer, i: int) -> str:
    """Row i's address, as the worker's tool computes it for its call."""
    return engine_of(_email_tool(demo)).address({"domain": f"company{i}.com", "first": f"P{i}"})


def _email_tool(demo: pb.demo.DemoServer) -> pb.Tool:
    return pb.demo.email_tool(demo, name=TOOL)


# -- two processes, one store ------------------------------------------------------------------


@pytest.mark.parametrize("order", ["same", "reversed"])
def test_two_processes_on_one_store_pay_for_each_call_once(
    demo, worker, tmp_path: Path, order: str, where: str
) -> None:
    """Two processes mapping the same 300 rows on one store at once dispatch each call exactly
    once and agree; in the same order, they share the rows out (a row the other is paying for
    steps back, and comes back reused from its memo or answered by its receipt)."""
    demo.reset(latency=0.005)  # short calls, many commits a second: the runs race on every key
    store, go = where, tmp_path / "go"
    procs = [
        worker(
            url=demo.url,
            store=store,
            n=300,
            ttl=30,
            out=str(tmp_path / f"out{i}.json"),
            reverse=(order == "reversed" and i == 1),
            ready=str(tmp_path / f"ready{i}"),
            go=str(go),
        )
        for i in range(2)
    ]
    _wait_for(
        "both workers to be ready",
        lambda: all((tmp_path / f"ready{i}").exists() for i in range(2)),
        timeout=30,
    )
    go.touch()  # both start mapping within milliseconds of each other
    a, b = (_finish(p) for p in procs)
    stats = demo.stats()
    print(
        f"[{order}] requests={stats['requests']} duplicates={stats['duplicate_idempotency_keys']} "
        f"executed={a['calls_executed']}+{b['calls_executed']}"
    )

    assert a["began"] < b["ended"] and b["began"] < a["ended"], "the two runs did not overlap"
    assert stats["duplicate_idempotency_keys"] == 0, (
        f"{stats['duplicate_idempotency_keys']} calls were paid twice "
        f"(keys: {sorted(k for k, n in stats['idempotency_keys'].items() if n > 1)[:5]})"
    )
    assert stats["requests"] == 300
    assert len(stats["idempotency_keys"]) == 300
    assert a["calls_executed"] + b["calls_executed"] == 300, (a["calls_executed"], b["calls_executed"])
    assert a["calls_executed"] > 0 and b["calls_executed"] > 0, (a["calls_executed"], b["calls_executed"])
    emails_a, status_a = _result(tmp_path / "out0.json")
    emails_b, status_b = _result(tmp_path / "out1.json")
    assert len(emails_a) == 300 and emails_a == emails_b
    assert sum(e is not None for e in emails_a.values()) == stats["by_status"]["200"]
    assert set(status_a.values()) | set(status_b.values()) <= {"ok", "reused"}
    assert all(
        "ok" in (status_a[row], status_b[row]) for row in status_a
    )  # each row ran in one of them at least


def test_four_processes_on_one_store_pay_for_each_call_once(demo, worker, tmp_path: Path, where: str) -> None:
    """Four processes mapping the same 400 rows (two forwards, two backwards) on one store pay for each call once."""
    demo.reset(latency=0.005)
    go = tmp_path / "go"
    procs = [
        worker(
            url=demo.url,
            store=where,
            n=400,
            ttl=30,
            out=str(tmp_path / f"out{i}.json"),
            reverse=bool(i % 2),
            ready=str(tmp_path / f"ready{i}"),
            go=str(go),
        )
        for i in range(4)
    ]
    _wait_for(
        "the workers to be ready",
        lambda: all((tmp_path / f"ready{i}").exists() for i in range(4)),
        timeout=60,
    )
    go.touch()
    results = [_finish(p, timeout=120) for p in procs]
    stats = demo.stats()

    assert stats["duplicate_idempotency_keys"] == 0, (
        f"{stats['duplicate_idempotency_keys']} calls were paid twice"
    )
    assert stats["requests"] == 400 and len(stats["idempotency_keys"]) == 400
    assert sum(r["calls_executed"] for r in results) == 400, [r["calls_executed"] for r in results]
    outputs = [_result(tmp_path / f"out{i}.json") for i in range(4)]
    assert all(emails == outputs[0][0] for emails, _ in outputs)
    assert all(
        set(statuses.values()) <= {"ok", "reused"} for _, statuses in outputs
    )  # reused: from another's memo
    assert all(any(statuses[row] == "ok" for _, statuses in outputs) for row in outputs[0][1])
    assert _receipts(where) == 400


def test_a_receipt_committed_just_before_the_lease_is_taken_is_used(
    demo, worker, shared: pb.ReceiptStore, where: str, tmp_path: Path
) -> None:
    """A call another process paid for between this one's receipt lookup and its lease is not paid again."""
    tool, key, store = _email_tool(demo), _key(demo, 0), shared
    ask = engine(store).leases.ask
    raced: list[str] = []

    async def take_after_another_process(asked: str, look: bool) -> Any:
        if asked == key and not raced:
            raced.append(asked)
            # Another process pays for the same call, commits its receipt and releases its
            # lease, all between our lookup (a miss) and our lease (now free).
            _finish(worker(url=demo.url, store=where, n=1, ttl=30, out=str(tmp_path / "other.json")))
        return await ask(asked, look)

    engine(store).leases.ask = take_after_another_process  # type: ignore[method-assign]
    frame = pd.DataFrame({"domain": ["company0.com"], "first": ["P0"]})
    run = frame.play.run(tool, store=store, progress=False, concurrency=CONCURRENCY)
    stats = demo.stats()

    assert raced == [key]
    assert stats["idempotency_keys"] == {key: 1}, (
        "the call was paid for again after the other process's receipt was committed"
    )
    assert (run.stats.calls_executed, run.stats.calls_shared) == (
        0,
        1,
    )  # paid by the other process during this run
    assert run.result[TOOL].tolist() == ["p@company0.com"]


# -- SIGKILL at random moments, then a rerun ----------------------------------------------------


def test_runs_killed_at_random_moments_resume_to_the_uninterrupted_result(
    demo, worker, tmp_path: Path, where: str
) -> None:
    """Five SIGKILLs mid-run then a rerun give the uninterrupted result; only calls in flight at a kill are paid again."""
    n, kills = 640, 5
    reference = tmp_path / "reference.json"
    _finish(worker(url=demo.url, store=str(tmp_path / "fresh"), n=n, ttl=60, out=str(reference)))

    demo.reset(latency=0.1)  # ~16 calls in flight at any moment, ~160 calls/s at most
    store, out = where, tmp_path / "out.json"
    rng = random.Random(1)
    delays = [rng.uniform(0.1, 1.0) for _ in range(kills)]  # ~2.75 s in all: < n rows at 160/s
    lost: list[int] = []  # per kill: calls dispatched whose receipt never got written
    for delay in delays:
        before = demo.stats()["requests"]
        proc = worker(url=demo.url, store=store, n=n, ttl=60, out=str(out))
        _wait_for(
            "the worker to dispatch", lambda before=before: demo.stats()["requests"] > before, timeout=30
        )
        time.sleep(delay)
        assert proc.poll() is None, "the worker finished before it could be killed"
        _kill(proc)
        time.sleep(0.05)  # requests already on the wire are admitted by the demo
        _wait_for("the demo to answer the dead worker's requests", lambda: demo.stats()["in_flight"] == 0)
        lost.append(demo.stats()["requests"] - _receipts(store) - sum(lost))
    done_before = _receipts(store)
    final = _finish(worker(url=demo.url, store=store, n=n, ttl=60, out=str(out)))
    stats = demo.stats()
    print(
        f"delays={[round(d, 3) for d in delays]} lost per kill={lost} receipts before rerun={done_before} "
        f"rerun executed={final['calls_executed']} extra={stats['requests'] - n}"
    )

    extra = stats["requests"] - n
    assert all(0 <= k <= CONCURRENCY for k in lost), f"calls lost per kill: {lost}"
    assert sum(lost) > 0, "no call was in flight at any kill: the scenario did not exercise a crash mid-call"
    assert extra == sum(lost), f"extra dispatches {extra}, calls in flight at the kills {lost}"
    assert extra <= kills * CONCURRENCY, (
        f"extra dispatches {extra} > {kills} kills x {CONCURRENCY}; per kill {lost}"
    )
    assert stats["duplicate_idempotency_keys"] == extra  # each lost call was paid again once, no more
    assert final["calls_executed"] == n - done_before
    assert len(stats["idempotency_keys"]) == n
    emails, statuses = _result(out)
    expected, expected_statuses = _result(reference)
    assert emails == expected
    assert set(expected_statuses.values()) == {"ok"}
    assert set(statuses.values()) <= {"ok", "reused"} and len(statuses) == n


# -- a lease holder that dies mid-call ----------------------------------------------------------


def test_a_killed_local_lease_holder_is_taken_over_at_once(demo, worker, tmp_path: Path, where: str) -> None:
    """A lease whose holder on this machine was SIGKILLed mid-call is taken over at once, not after
    lease_ttl.  In real time (a killed process): the lease's 60 s are told from at once by far more
    than a loaded machine adds to one call."""
    demo.reset(slow_rate=1.0, slow_latency=3.0)  # the holder's call hangs; its lease_ttl is 60s
    store, key = where, _key(demo, 0)
    holder = worker(url=demo.url, store=store, n=1, ttl=60, out=str(tmp_path / "a.json"))
    _wait_for("the holder's call to be in flight", lambda: demo.stats()["in_flight"] == 1, timeout=30)
    held = _holder(store, key)
    assert held is not None and held[0].split(":")[1] == str(holder.pid) and held[1] > 30
    _kill(holder)
    demo.configure(slow_rate=0.0)

    started = time.monotonic()
    taker = _finish(worker(url=demo.url, store=store, n=1, ttl=60, out=str(tmp_path / "b.json")))
    wall = time.monotonic() - started
    stats = demo.stats()

    assert taker["calls_executed"] == 1
    assert taker["elapsed"] < 20 and wall < 40, f"took over after {taker['elapsed']:.1f}s (lease_ttl 60s)"
    assert stats["requests"] == 2 and stats["idempotency_keys"] == {key: 2}  # the dead one's, and the taker's
    emails, statuses = _result(tmp_path / "b.json")
    assert emails == {"0": "p@company0.com"} and statuses == {"0": "ok"}
    assert _holder(store, key) is None
    # Let the dead holder's request end here, not in the session server's shutdown.
    _wait_for("the dead holder's request to end", lambda: demo.stats()["in_flight"] == 0)


def test_a_lease_held_on_another_host_is_waited_out_then_taken_over(
    demo, worker, shared: pb.ReceiptStore, where: str, tmp_path: Path
) -> None:
    """A live-looking lease from another host makes its call wait until the lease expires; then it is paid once."""
    n, key, store = 5, _key(demo, 0), shared
    tool = _email_tool(demo)
    assert store.get(tool, domain="company0.com", first="P0") is None
    ready, go = tmp_path / "ready", tmp_path / "go"
    proc = worker(
        url=demo.url, store=where, n=n, ttl=30, out=str(tmp_path / "out.json"), ready=str(ready), go=str(go)
    )
    _wait_for("the worker to be ready", ready.exists, timeout=30)
    expires = time.time() + 2.0
    assert engine(store).backend.take([key], "otherhost:12345:abcd", 2.0) == [True]
    go.touch()
    result = _finish(proc)
    stats = demo.stats()

    assert result["ended"] >= expires, (
        f"the call did not wait for the lease: the run ended {expires - result['ended']:.2f}s early"
    )
    assert 1.9 <= result["elapsed"] < 10, f"the run took {result['elapsed']:.2f}s against a 2s foreign lease"
    assert result["calls_executed"] == n and stats["requests"] == n
    assert stats["idempotency_keys"][key] == 1 and stats["duplicate_idempotency_keys"] == 0
    receipt = store.get(tool, domain="company0.com", first="P0")
    assert receipt is not None and receipt.address == key  # the lease was on the very call
    emails, statuses = _result(tmp_path / "out.json")
    assert emails["0"] == "p@company0.com" and set(statuses.values()) == {"ok"}
    assert _holder(where, key) is None


def test_two_processes_making_one_new_store_at_once_both_open_it(tmp_path: Path) -> None:
    """Two processes that open the same new store at the same moment (two kernels started together,
    two cron jobs) both get it: neither fails with "database is locked"."""
    code = "import sys, playbook as pb; pb.ReceiptStore(sys.argv[1]).close(); print('ok')"
    for i in range(12):
        store = tmp_path / f"store{i}"
        procs = [warm.start(None, str(store), code=code) for _ in range(2)]
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and out.strip() == "ok", err[-500:]


def test_a_killed_process_is_dead_before_its_parent_reaps_it() -> None:
    """A lease holder killed with SIGKILL whose parent has not waited for it yet (a zombie: its pid
    is still taken) is dead at once, so its leases are taken over now, not when they expire."""
    from playbook._internal.owners import HOST, dead

    child = subprocess.Popen(["sleep", "30"])
    try:
        owner = f"{HOST}:{child.pid}:token"
        assert not dead(owner)
        child.send_signal(signal.SIGKILL)
        _wait_for("the child to die", lambda: dead(owner), timeout=5)
        assert child.poll() is not None  # reaped only now
    finally:
        child.kill()
        child.wait()
