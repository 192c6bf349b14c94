"""B5: what the live widget costs.  The same 5,000-row map, every call answered from its receipt
(``refresh="rows"``: each row runs and emits its events), in a real Jupyter kernel, with the
widget (``progress="widget"``) and with no view (``progress=False``).  Target: the widget costs at
most 5% of run time.

That map is over in about 0.1 s, before the live panel's delay (``DELAY``), so it shows only
the final summary; a second case maps 50,000 rows (about a second) so the live panel is drawn
and refreshed too.
"""

from __future__ import annotations

import tempfile
import textwrap
from typing import Any

from jupyter_client.manager import start_new_kernel

from .harness import Result, compare

ROWS = 5_000
LONG = 50_000

SETUP = """
import time, pandas as pd, playbook as pb
store = pb.ReceiptStore({store!r})
@pb.tool
async def lookup(n: int) -> int:
    return n * 2
frames = {{rows: pd.DataFrame({{"n": range(rows)}}) for rows in ({rows}, {long})}}
frames[{long}].play.map(lookup, store=store, progress=False)   # pay once: every later call is a receipt
"""

TIMED = """
_t = time.perf_counter()
_out = frames[{rows}].play.map(lookup, store=store, progress={progress!r}, refresh="rows")
assert (_out["play_status"] == "ok").all()
print(len(_out) / (time.perf_counter() - _t))
"""


def run(repeats: int = 5) -> list[Result]:  # runs of 0.1-1 s: more of them steady the median
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        _execute(kc, SETUP.format(store=tempfile.mkdtemp(prefix="pb-b5-"), rows=ROWS, long=LONG))

        def rate(rows: int, progress: Any) -> float:
            return float(_execute(kc, TIMED.format(rows=rows, progress=progress)))

        return [
            compare(f"B5 widget vs none ({rows // 1000}k cached rows)", lambda: rate(rows, "widget"), lambda: rate(rows, False),
                    unit="/s", baseline_name="the same map in the kernel, progress=False", target=0.95, repeats=repeats)
            for rows in (ROWS, LONG)
        ]  # fmt: skip
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _execute(kc: Any, code: str) -> str:
    printed: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            raise RuntimeError(f"B5: the kernel raised {msg['content']['ename']}: {msg['content']['evalue']}")

    kc.execute_interactive(textwrap.dedent(code), timeout=300, output_hook=hook)
    return "".join(printed)
