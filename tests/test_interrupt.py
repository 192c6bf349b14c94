"""Ctrl-C: a blocking map stops admitting rows, lets calls in flight land their receipts, settles
the rest as skipped, then raises KeyboardInterrupt; the partial run is pb.last_run(), and a rerun
pays only for what never landed.  A second Ctrl-C stops at once.

Both run for real: a script interrupted with SIGINT, and a Jupyter kernel interrupted mid-cell
(where the map runs inside the kernel's own event loop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from jupyter_client.manager import start_new_kernel

# The tool notes each call as it starts and as it ends, in files a test can count afterwards.
TOOL = """
import asyncio, json, os, signal, sys, threading
import pandas as pd, playbook as pb

LOG = sys.argv[2]

@pb.tool
async def slow(n: int) -> int:
    with open(LOG + ".started", "a") as f:
        f.write(f"{n}\\n")
    await asyncio.sleep(float(os.environ.get("TOOL_SECONDS", "0.5")))
    with open(LOG + ".ended", "a") as f:
        f.write(f"{n}\\n")
    return n * 2

store = pb.ReceiptStore(sys.argv[1])
frame = pd.DataFrame({"n": range(200)})
"""

SCRIPT = (
    TOOL
    + """
for at in sys.argv[3:]:
    threading.Timer(float(at), lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    frame.play.map(slow, store=store, progress=False, concurrency=4)
finally:
    run = pb.last_run()
    s = run.stats
    print(json.dumps({"ok": s.ok, "skipped": s.skipped, "executed": s.calls_local, "elapsed": s.elapsed,
                      "receipts": store.stats()["receipts"]}))
"""
)

RERUN = (
    TOOL
    + """
run = frame.play.run(slow, store=store, progress=False, concurrency=50)
print(json.dumps({"reused": run.stats.reused, "ok": run.stats.ok, "executed": run.stats.calls_local,
                  "calls_reused": run.stats.calls_reused}))
"""
)


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _script(
    code: str, store: Path, log: Path, *args: str, seconds: float = 0.5
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, str(store), str(log), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TOOL_SECONDS": str(seconds)},
    )


def test_ctrl_c_in_a_script_lands_calls_in_flight_then_raises(tmp_path: Path) -> None:
    """SIGINT: the script exits as interrupted; every call already started landed its receipt; the
    rows are ok or skipped; a rerun pays exactly for the calls that never started."""
    store, log = tmp_path / "store", tmp_path / "log"
    proc = _script(SCRIPT, store, log, "1.0")
    assert proc.returncode in (-2, 130), (
        "an interrupted script exits as killed by SIGINT (a shell says 130), not 0"
    )
    assert "KeyboardInterrupt: interrupted: " in proc.stderr
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state["ok"] >= 4 and state["skipped"] >= 100 and state["ok"] + state["skipped"] == 200
    started, ended = _lines(log.with_suffix(".started")), _lines(log.with_suffix(".ended"))
    assert len(started) > state["ok"], "some calls were in flight at the interrupt"
    assert sorted(ended) == sorted(started) and state["receipts"] == len(started)  # every one landed
    assert state["executed"] == len(started)  # and is counted as run, though its row was skipped

    again = _script(RERUN, store, tmp_path / "log2")
    assert again.returncode == 0, again.stderr
    rerun = json.loads(again.stdout.strip().splitlines()[-1])
    assert rerun["reused"] == state["ok"] and rerun["ok"] == 200 - state["ok"]
    assert rerun["executed"] == 200 - len(started)  # nothing that landed is paid for again
    assert len(_lines(tmp_path / "log2.started")) == 200 - len(started)


def test_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    """A second SIGINT while calls are landing cancels them: the script ends at once, not after the
    grace.  In real time (signals to a real process): the calls in flight take 30 s, so ending at
    once is told from waiting for them by far more than a loaded machine's late timers."""
    store, log = tmp_path / "store", tmp_path / "log"
    started = time.monotonic()
    proc = _script(SCRIPT, store, log, "1.0", "1.5", seconds=30)
    wall = time.monotonic() - started
    assert proc.returncode in (-2, 130) and "KeyboardInterrupt" in proc.stderr
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state["skipped"] == 200 and state["receipts"] == 0
    assert len(_lines(log.with_suffix(".started"))) == 4 and _lines(log.with_suffix(".ended")) == []
    assert state["elapsed"] < 10.0 and wall < 25, (
        f"the second interrupt took {state['elapsed']:.1f}s to stop the run"
    )


def test_kernel_interrupt_stops_the_cell_and_run_all(tmp_path: Path) -> None:
    """Interrupting a kernel mid-map fails the cell with a one-line KeyboardInterrupt, stops the cells
    queued after it (Run All), leaves the partial run in pb.last_run(), and lands calls in flight."""
    km, kc = start_new_kernel(kernel_name="python3")
    log = tmp_path / "log"
    try:
        setup = TOOL.replace("sys.argv[1]", repr(str(tmp_path / "store"))).replace(
            "sys.argv[2]", repr(str(log))
        )
        assert kc.execute_interactive(setup, timeout=60)["content"]["status"] == "ok"
        mapped = kc.execute(
            "out = frame.play.map(slow, store=store, progress=False, concurrency=4)", stop_on_error=True
        )
        queued = kc.execute("after = 'ran'", stop_on_error=True)  # what Run All sends next
        time.sleep(2.0)  # the map is well under way: 4 rows every 0.5 s

        km.interrupt_kernel()
        replies = {}
        while len(replies) < 2:
            reply = kc.get_shell_msg(timeout=60)
            replies[reply["parent_header"].get("msg_id")] = reply["content"]
        assert replies[mapped]["status"] == "error" and replies[mapped]["ename"] == "KeyboardInterrupt"
        assert replies[mapped]["traceback"][0].startswith(
            "KeyboardInterrupt: interrupted: "
        )  # one line, no stack
        assert replies[queued]["status"] == "aborted"

        lines: list[str] = []
        check = kc.execute_interactive(
            "import json; s = pb.last_run().stats\n"
            "print(json.dumps([s.ok, s.skipped, store.stats()['receipts'], 'out' in dir(), 'after' in dir()]))",
            timeout=30,
            output_hook=lambda m: (
                lines.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None
            ),
        )
        assert check["content"]["status"] == "ok"
        ok, skipped, receipts, has_out, has_after = json.loads("".join(lines))
        assert ok >= 4 and skipped >= 100 and ok + skipped == 200
        assert not has_out and not has_after  # the cell did not finish; the next one never ran
        started = _lines(log.with_suffix(".started"))
        assert receipts == len(started) == len(_lines(log.with_suffix(".ended")))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
