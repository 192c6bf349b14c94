"""Execute a notebook headless in a real kernel and report what its last run did.

    python notebooks/run.py notebooks/01_quickstart.ipynb --out out

The executed notebook and anything it writes land in ``--out``; receipts go to
``$PLAYBOOK_HOME`` (default ``OUT/.playbook``), so running it twice shows the second run paying
for nothing.  The first line says what the notebook's runs paid for and reused, all of them
together (the store's ledger before and after); a line after it says what its last run did.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

PROBE = """
import json as _json, playbook as _pb
_run = _pb.last_run()
print(_json.dumps(None if _run is None else _run.stats.model_dump()))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args(argv)

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PLAYBOOK_HOME", str(out / ".playbook"))
    nb = nbformat.read(args.notebook, as_version=4)
    # IPC transport: the kernel talks over local sockets, not TCP.
    sockets = tempfile.mkdtemp(prefix="playbook-kernel-")
    km = KernelManager(kernel_name="python3", transport="ipc", connection_file=os.path.join(sockets, "kernel.json"))
    client = NotebookClient(nb, km=km, timeout=args.timeout, shutdown_kernel="immediate", resources={"metadata": {"path": str(out)}})
    spent_before = _spent(os.environ["PLAYBOOK_HOME"])
    started = time.monotonic()
    stats = None
    try:
        # The kernel's own stderr is noise here (cell errors come back through the protocol).
        with client.setup_kernel(stderr=subprocess.DEVNULL):
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
            probe = nbformat.v4.new_code_cell(PROBE)
            nb.cells.append(probe)
            try:
                client.execute_cell(probe, len(nb.cells) - 1)
            finally:
                nb.cells.pop()
            text = "".join(o.get("text", "") for o in probe.outputs if o.get("output_type") == "stream")
            stats = json.loads(text.strip().splitlines()[-1])
    except CellExecutionError as exc:
        print(f"{args.notebook}: a cell failed:\n{exc}", file=sys.stderr)
        return 1
    finally:
        target = out / args.notebook.name
        nbformat.write(nb, target)
        shutil.rmtree(sockets, ignore_errors=True)
    elapsed = time.monotonic() - started
    paid, cost, reused, saved = (after - before for after, before in zip(_spent(os.environ["PLAYBOOK_HOME"]), spent_before))
    print(
        f"{args.notebook.name}, every run it made: calls paid {paid:,.0f} (cost {cost:g}) | calls reused {reused:,.0f}"
        f" from receipts and row memos (cost saved {saved:g}) | {elapsed:.1f}s"
    )
    print(f"executed {args.notebook} -> {target}")
    for written in sorted(out.glob("*.csv")):
        print(f"wrote {written}")
    if stats:
        print(
            f"its last run alone: {stats['total']} rows | ok {stats['ok']} | reused {stats['reused']} | failed {stats['failed']}"
            f" | calls paid {stats['calls_executed']} | calls reused {stats['calls_reused']}"
            f" | cost spent {stats['cost_spent']:g} | cost saved {stats['cost_saved']:g}"
        )
    print(f"receipts are in {os.environ['PLAYBOOK_HOME']}; run it again and every call is reused")
    return 0


def _spent(home: str) -> tuple[float, float, float, float]:
    """What every run on the store at ``home`` paid and reused so far: calls paid, their cost,
    calls reused, the cost that saved (the store's ledger; zeros for a store not made yet)."""
    import playbook as pb

    if "://" not in home and not Path(home).exists():
        return (0.0, 0.0, 0.0, 0.0)
    store = pb.ReceiptStore(home, readonly=True)
    try:
        total = store.spend(by=()).iloc[0]
    finally:
        store.close()
    return (float(total["calls_paid"]), float(total["cost_paid"]), float(total["calls_reused"]), float(total["cost_saved"]))


if __name__ == "__main__":
    sys.exit(main())
