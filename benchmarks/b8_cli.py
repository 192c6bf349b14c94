"""B8: the command line over 10,000 cached rows.  ``python -m playbook run plays.py:enrich --in
leads.csv --out out.parquet`` in a fresh process, against what a user would write instead: a
``python -c`` script that imports pandas and playbook, reads the CSV with pandas, runs the same
``map()`` (``progress=False``) and writes the Parquet file with pandas.  Both pay the interpreter's
start-up and imports, so the ratio is what the command line adds: its options, the play's
loading, the text progress and summary, the atomic write.

Every row is a row memo already (the store is warmed once), so no play runs and no tool is called;
both read and write the same files and the same store.  Target: ours <= 1.3 x the script's time,
medians of interleaved runs.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pandas as pd

from .harness import Result

ROWS = 10_000
TARGET = 1.3

PLAYS = """
import playbook as pb


@pb.tool(version="1")
def guess_email(domain: str, first: str) -> str:
    return f"{first.lower()}@{domain}"


@pb.play
async def enrich(row, ctx):
    return {"email": await ctx.tool(guess_email, domain=row.domain, first=row.first), "size": len(row.domain)}
"""

SCRIPT = """
import sys
import pandas as pd
import playbook as pb
sys.path.insert(0, {folder!r})
import plays
out = pd.read_csv({source!r}).play.map(plays.enrich, store={store!r}, progress=False)
assert (out["play_status"] == "reused").all()
out.to_parquet({out!r})
"""


def run(repeats: int = 5) -> list[Result]:
    folder = Path(tempfile.mkdtemp(prefix="pb-b8-"))
    (folder / "plays.py").write_text(PLAYS)
    source, store = folder / "leads.csv", folder / "store"
    frame = pd.DataFrame(
        {"domain": [f"company{i}.com" for i in range(ROWS)], "first": [f"Person{i}" for i in range(ROWS)]}
    )
    frame.to_csv(source, index=False)
    command = [
        sys.executable,
        "-m",
        "playbook",
        "run",
        "plays.py:enrich",
        "--in",
        str(source),
        "--out",
        str(folder / "cli.parquet"),
    ]
    command += ["--store", str(store)]
    script = [
        sys.executable,
        "-c",
        textwrap.dedent(
            SCRIPT.format(
                folder=str(folder), source=str(source), store=str(store), out=str(folder / "py.parquet")
            )
        ),
    ]
    _seconds(command, folder)  # warm the store: every row a row memo
    ours, theirs = [], []
    for _ in range(repeats):
        theirs.append(_seconds(script, folder))
        ours.append(_seconds(command, folder))
    assert pd.read_parquet(folder / "cli.parquet").equals(pd.read_parquet(folder / "py.parquet"))
    result = Result(
        "B8 CLI run (10k cached rows)",
        "ms",
        statistics.median(ours) * 1000,
        statistics.median(theirs) * 1000,
        "python -c: pandas read, map, write",
        TARGET,
        at_most=True,
    )
    result.notes.append(
        (f"CSV in, Parquet out; a fresh process each, wall time, median of {repeats} interleaved pairs", None)
    )
    return [result]


def _seconds(command: list[str], folder: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{command[:4]} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed
