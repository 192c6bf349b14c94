"""Ctrl-C: a blocking map stops cleanly and returns its partial result; a rerun resumes it.

Both run for real: a script interrupted with SIGINT, and a Jupyter kernel interrupted mid-cell
(where the map runs inside the kernel's own event loop)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from jupyter_client.manager import start_new_kernel

SCRIPT = """
import asyncio, os, signal, sys, threading
import pandas as pd, playbook as pb

@pb.tool
async def slow(n: int) -> int:
    await asyncio.sleep(0.2)
    return n * 2

store = pb.ReceiptStore(sys.argv[1])
frame = pd.DataFrame({"n": range(200)})
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
out = frame.play.map(slow, store=store, progress=False, concurrency=4)
counts = out["play_status"].value_counts().to_dict()
done = out.loc[out["play_status"] == "ok", "slow"]
assert (done == 2 * out.loc[done.index, "n"]).all()
again = frame.play.run(slow, store=store, progress=False, concurrency=50)
print(counts.get("ok", 0), counts.get("skipped", 0), again.stats.reused, again.stats.ok, again.stats.calls_executed)
"""


def test_ctrl_c_in_a_script_returns_the_partial_result(tmp_path: Path) -> None:
    """SIGINT stops map(): it returns finished rows as ok and the rest as skipped; a rerun pays only for the rest."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    ok, skipped, reused, rerun_ok, executed = map(int, proc.stdout.split())
    assert ok >= 4 and skipped >= 100 and ok + skipped == 200
    assert "interrupted: " in proc.stderr and "Traceback" not in proc.stderr
    assert reused == ok  # finished rows come back from their memos
    assert rerun_ok == skipped and executed == skipped  # nothing finished is paid for again


def test_kernel_interrupt_returns_the_partial_result(tmp_path: Path) -> None:
    """Interrupting a kernel mid-map leaves the cell's variable holding the partial result."""
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        setup = textwrap.dedent(f"""
            import asyncio, pandas as pd, playbook as pb
            @pb.tool
            async def slow(n: int) -> int:
                await asyncio.sleep(0.2)
                return n * 2
            store = pb.ReceiptStore({str(tmp_path / "store")!r})
        """)
        assert kc.execute_interactive(setup, timeout=60)["content"]["status"] == "ok"
        msg_id = kc.execute('out = pd.DataFrame({"n": range(200)}).play.map(slow, store=store, progress=False, concurrency=4)')
        time.sleep(2.0)  # the map is well under way: 4 rows every 0.2 s

        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "ok"
        lines: list[str] = []
        check = kc.execute_interactive(
            'print(out["play_status"].value_counts().to_dict())',
            timeout=30,
            output_hook=lambda m: lines.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None,
        )
        assert check["content"]["status"] == "ok"
        counts = eval("".join(lines))  # noqa: S307 - our own printed dict
        assert counts.get("ok", 0) >= 4 and counts.get("skipped", 0) >= 100
        assert sum(counts.values()) == 200
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
