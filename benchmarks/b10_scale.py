"""B10: one process at a million rows, against a hand-written loop measured in the same run.

The play is the smallest there is: one async tool (``x * 2``, ``version="1"``) per row of
``pd.DataFrame({"x": range(N)})``, ``concurrency=256``, the store on local disk.  Every case runs
in a fresh process (``python -m benchmarks.b10_scale --child CASE``), so its peak RSS is its own:

- first run: a new store, every call paid (here: made) and written as a receipt;
- memo replay: the same play again, every row answered by its row memo;
- receipts replay: a new version of the play over the same store, every call answered by its
  receipt (the row memos miss);
- 10% failing: a first run whose tool raises on every tenth row (``run.errors`` and the grouped
  errors hold 100,000 failures at 1M rows).

The baseline is the loop a user would write instead: one coroutine per row under a semaphore of
256, a sha256 key per call, results written to SQLite in batches of 1,000 (and, for the receipts
replay, read back by key).  SQLite's own batched insert and keyed read rates are printed beside it,
and so is the rate of the same loop keeping what playbook promises on a first run (a lease per
call, each receipt synced before its row goes on, a memo per row: ``b10_kept.py``), the part of
the gap that is those promises' own.

Memory is the peak RSS over the process's RSS after imports, the input frame and a 100-row
warm-up run (the modules a run loads on first use), per row: the run's state.

``python -m benchmarks b10`` runs 1,000,000 rows; ``python -m benchmarks b10 --quick`` (or
``python -m benchmarks.b10_scale --quick``) runs 100,000 for the edit loop.

``python -m benchmarks.b10_scale --file 10000000`` runs the command line over a Parquet file of
that many rows (the same tool), read and written a chunk at a time: it kills a run half way
(SIGKILL, as a crash would), runs it again, then once more over the finished file, and prints
each one's rate and peak RSS, checking that the output is whole and in order and that each rerun
reused what the runs before it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .harness import Result

ROWS = 1_000_000
QUICK = 100_000
CONCURRENCY = 256
PER_ROW_KB = 0.25  # the bound on run state per row
MEMO_RATE = 100_000  # rows/s, the bound on a memo replay at 1M rows


# -- the children: each case in a process of its own -----------------------------------------


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _peak_kb() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _child(case: str, rows: int, where: str) -> dict:
    import time

    import pandas as pd

    import playbook as pb

    frame = pd.DataFrame({"x": range(rows)})

    @pb.tool(name="double", version="1")
    async def double(x: int) -> int:
        if case == "failing" and x % 10 == 0:
            raise ValueError(f"no double for {x}")
        return x * 2

    version = "2" if case == "receipts" else "1"

    async def doubled(row, ctx):
        return {"y": await ctx.tool(double, x=row.x)}

    play = pb.play(doubled, name="doubled", version=version)
    warm = pd.DataFrame({"x": range(-100, 0)})
    warm.play.map(play, store=where + "-warm", progress=False, concurrency=CONCURRENCY)
    base = _rss_kb()
    start = time.perf_counter()
    run = frame.play.run(play, store=where, progress=False, concurrency=CONCURRENCY)
    result = run.result  # what map() returns: its making counts too
    seconds = time.perf_counter() - start
    assert len(result) == rows
    stats = run.stats
    expect_failed = rows // 10 if case == "failing" else 0
    assert stats.failed == expect_failed, (case, stats)
    if case == "memo":
        assert stats.reused == rows, stats
    if case == "receipts":
        assert stats.calls_reused == rows and stats.calls_executed == 0, stats
    if case == "failing":
        assert len(run.errors) == expect_failed
    return {"rate": rows / seconds, "base_kb": base, "peak_kb": _peak_kb()}


def _loop_child(case: str, rows: int, where: str) -> dict:
    """The hand-written loop (``loop``: compute and write; ``loop-read``: read back by key), and
    SQLite's own batched insert and read (``sqlite``)."""
    import asyncio
    import hashlib
    import sqlite3
    import time

    import pandas as pd

    frame = pd.DataFrame({"x": range(rows)})
    base = _rss_kb()
    db = sqlite3.connect(where + ".loop.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS receipts (key TEXT PRIMARY KEY, value TEXT)")

    def key(x: int) -> str:
        return hashlib.sha256(json.dumps(["double", "1", {"x": x}]).encode()).hexdigest()

    if case in ("kept", "kept-read"):  # kept-read: a new version of the play, over the receipts "kept" left
        from .b10_kept import kept_loop

        if case == "kept":
            for end in ("", "-wal", "-shm"):
                Path(where + ".kept.db" + end).unlink(missing_ok=True)
        version = "1" if case == "kept" else "2"
        return {
            "rate": kept_loop([int(x) for x in frame["x"]], where + ".kept.db", CONCURRENCY, version),
            "base_kb": base,
            "peak_kb": _peak_kb(),
        }

    if case == "sqlite":
        pairs = [(key(x), json.dumps(x * 2)) for x in range(rows)]
        db.execute("DELETE FROM receipts")
        db.commit()
        start = time.perf_counter()
        for i in range(0, rows, 1000):
            db.executemany("INSERT OR REPLACE INTO receipts VALUES (?, ?)", pairs[i : i + 1000])
            db.commit()
        insert = rows / (time.perf_counter() - start)
        start = time.perf_counter()
        for i in range(0, rows, 1000):
            chunk = [k for k, _ in pairs[i : i + 1000]]
            marks = ",".join("?" * len(chunk))
            db.execute(f"SELECT key, value FROM receipts WHERE key IN ({marks})", chunk).fetchall()
        read = rows / (time.perf_counter() - start)
        return {"insert": insert, "read": read}

    async def double(x: int) -> int:
        return x * 2

    async def main() -> list:
        gate = asyncio.Semaphore(CONCURRENCY)
        pending: list[tuple[str, str]] = []

        async def one(x: int) -> object:
            async with gate:
                k = key(x)
                if case == "loop-read":
                    found = db.execute("SELECT value FROM receipts WHERE key = ?", (k,)).fetchone()
                    return json.loads(found[0])
                value = await double(x)
                pending.append((k, json.dumps(value)))
                if len(pending) >= 1000:
                    db.executemany("INSERT OR REPLACE INTO receipts VALUES (?, ?)", pending)
                    db.commit()
                    pending.clear()
                return value

        results = await asyncio.gather(*(one(int(x)) for x in frame["x"]))
        if pending:
            db.executemany("INSERT OR REPLACE INTO receipts VALUES (?, ?)", pending)
            db.commit()
        return results

    start = time.perf_counter()
    results = asyncio.run(main())
    seconds = time.perf_counter() - start
    frame["y"] = results
    return {"rate": rows / seconds, "base_kb": base, "peak_kb": _peak_kb()}


# -- the parent -------------------------------------------------------------------------------


def _measure(case: str, rows: int, where: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.b10_scale",
            "--child",
            case,
            "--rows",
            str(rows),
            "--where",
            where,
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    if out.returncode:
        raise RuntimeError(f"B10 {case} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _kept(ours: dict, kept: dict) -> str:
    return f"the loop keeping playbook's promises (b10_kept.py): {kept['rate']:,.0f}/s, ours {ours['rate'] / kept['rate']:.2f} of it"


def _per_row(m: dict, rows: int) -> float:
    return (m["peak_kb"] - m["base_kb"]) / rows


def run(repeats: int = 1, rows: int = ROWS) -> list[Result]:
    where = str(Path(tempfile.mkdtemp(prefix="pb-b10-")) / "store")
    sqlite = _measure("sqlite", rows, where)
    loop = _measure("loop", rows, where)
    loop_read = _measure("loop-read", rows, where)
    kept = _measure("kept", rows, where)
    kept_read = _measure("kept-read", rows, where)
    first = _measure("first", rows, where)
    memo = _measure("memo", rows, where)
    receipts = _measure("receipts", rows, where)
    failing = _measure("failing", rows, where + "-failing")
    size = f"{rows // 1000:,}k" if rows < 1_000_000 else f"{rows // 1_000_000}M"
    floor = f"SQLite's own: batched insert {sqlite['insert']:,.0f}/s, keyed read {sqlite['read']:,.0f}/s"
    first_result = Result(
        f"B10 first run ({size} rows)", "/s", first["rate"], loop["rate"], "hand-written loop", 0.6
    )
    first_result.notes.append((floor, None))
    first_result.notes.append((_kept(first, kept), None))
    receipts_result = Result(
        f"B10 receipts replay ({size} rows)",
        "/s",
        receipts["rate"],
        loop_read["rate"],
        "hand-written loop, reading",
        0.6,
    )
    receipts_result.notes.append((_kept(receipts, kept_read), None))
    results = [
        first_result,
        receipts_result,
        Result(f"B10 memo replay ({size} rows)", "/s", memo["rate"], MEMO_RATE, "100k rows/s", 1.0),
    ]
    for name, m in (
        ("first run", first),
        ("memo replay", memo),
        ("receipts replay", receipts),
        ("10% failing", failing),
        ("hand loop", loop),
    ):
        kb = _per_row(m, rows)
        verdict = None if name == "hand loop" else kb <= PER_ROW_KB
        results[0].notes.append(
            (
                f"{name}: {kb:.3f} kB/row over {m['base_kb'] / 1024:,.0f} MB (peak {m['peak_kb'] / 1024:,.0f} MB)",
                verdict,
            )
        )
    return results


# -- a file too big to hold: the command line ----------------------------------------------------

PLAYS = """
import playbook as pb


@pb.tool(name="double", version="1")
async def double(x: int) -> int:
    return x * 2


@pb.play(name="doubled", version="1")
async def doubled(row, ctx):
    return {"y": await ctx.tool(double, x=row.x)}
"""


def file_run(rows: int, chunk: int | None = None) -> list[str]:
    """The command line over a Parquet file of ``rows`` rows (read ``chunk`` rows at a time; by
    default as the command line does), killed half way and run again: figures as lines of text."""
    import signal
    import time

    folder = Path(tempfile.mkdtemp(prefix="pb-b10-file-"))
    (folder / "plays.py").write_text(PLAYS)
    # Made and checked by processes of their own: a child's peak RSS counts its parent's at the
    # fork, so this one stays small (a 10M-row table held here would be counted as the command's).
    _helper("--make-file", rows, folder / "in.parquet")
    env = {**os.environ, "PLAYBOOK_MARKS": str(folder / "marks")}
    command = [
        sys.executable,
        "-m",
        "playbook",
        "run",
        "plays.py:doubled",
        "--in",
        "in.parquet",
        "--out",
        "out.parquet",
        "--store",
        "store",
        "--concurrency",
        str(CONCURRENCY),
        *(["--chunk-rows", str(chunk)] if chunk else []),
    ]

    def ended(proc: subprocess.Popen[str], start: float) -> tuple[int, float, float]:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode, time.perf_counter() - start, usage.ru_maxrss / 1024

    # A crash half way through the file: SIGKILL once a chunk past the middle has started.
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("playbook: rows ") and int(line.split()[2].replace(",", "")) > rows // 2:
            proc.send_signal(signal.SIGKILL)
            break
    code, seconds, peak = ended(proc, start)
    left = sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) or "nothing"
    lines = [
        f"{rows:,} rows of Parquet: killed (exit {code}) after {seconds:,.0f}s, peak RSS {peak:,.0f} MB; left behind: {left}"
    ]
    for what in ("the rerun", "a rerun of the finished file"):
        start = time.perf_counter()
        code, seconds, peak = ended(
            subprocess.Popen(
                command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
            ),
            start,
        )
        written, statuses = _helper("--check-file", rows, folder / "out.parquet")
        lines.append(
            f"{what}: exit {code}, {rows / seconds:,.0f} rows/s, peak RSS {peak:,.0f} MB; {written:,} rows in order, {statuses}"
        )
    return lines


def _helper(what: str, rows: int, path: Path) -> Any:
    """``--make-file`` or ``--check-file`` in a process of its own: what it printed, as JSON."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.b10_scale", what, str(path), "--rows", str(rows)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def _make_file(path: Path, rows: int) -> None:
    """A Parquet file of ``rows`` rows (``x``: 0, 1, ...; ``name``: "row 0", ...), a million at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    for start in range(0, rows, 1_000_000):
        xs = np.arange(start, min(rows, start + 1_000_000))
        batch = pa.table({"x": xs, "name": pa.array([f"row {i}" for i in xs])})
        writer = writer or pq.ParquetWriter(path, batch.schema)
        writer.write_table(batch)
    if writer is not None:
        writer.close()


def _check_file(path: Path, rows: int) -> tuple[int, dict[str, int]]:
    """The rows of an output file (each in its place) and how many of each status."""
    import numpy as np
    import pyarrow.parquet as pq

    expected, statuses = 0, dict[str, int]()
    for batch in pq.ParquetFile(path).iter_batches(columns=["x", "play_status"]):
        xs = batch.column(0).to_numpy()
        assert (xs == np.arange(expected, expected + len(xs))).all(), "rows out of order"
        expected += len(xs)
        for status, n in zip(*np.unique(batch.column(1).to_numpy(zero_copy_only=False), return_counts=True)):
            statuses[str(status)] = statuses.get(str(status), 0) + int(n)
    assert expected == rows, f"{expected:,} rows written of {rows:,}"
    return expected, statuses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.b10_scale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK:,} rows instead of {ROWS:,}")
    parser.add_argument("--rows", type=int)
    parser.add_argument(
        "--file", type=int, metavar="ROWS", help="the command line over a Parquet file of ROWS rows"
    )
    parser.add_argument("--chunk-rows", type=int, help="with --file: the command line's --chunk-rows")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--make-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--check-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--where", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = args.rows or (QUICK if args.quick else ROWS)
    if args.child:
        do = _loop_child if args.child in ("loop", "loop-read", "sqlite", "kept", "kept-read") else _child
        print(json.dumps(do(args.child, rows, args.where)))
        return 0
    if args.make_file:
        _make_file(args.make_file, rows)
        print("null")
        return 0
    if args.check_file:
        print(json.dumps(_check_file(args.check_file, rows)))
        return 0
    if args.file:
        print("\n".join(file_run(args.file, args.chunk_rows)))
        return 0
    from .harness import table

    os.environ.setdefault("PLAYBOOK_MARKS", tempfile.mkdtemp(prefix="playbook-bench-marks-"))

    print(table(run(rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
