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

The baseline is the loop a careful user would write instead (``hand_loop``): 256 workers pulling
rows from one iterator (no task per row), a sha256 key per call, results written to SQLite in
batches of 1,000; for the receipts replay, the same workers reading each row's result back by key
(``json.loads`` of it).  The memo replay is judged against SQLite's batched keyed read of the
same memos, from the store the first run left, read as playbook asks for them (``memo_read``).
Bounds: first run >= 0.6 of the worker loop, receipts replay >= 0.8 of it reading, memo replay
>= 0.5 of SQLite's read; at most 0.15 kB of memory per row (0.25 with 10% failing: the errors
are held).  No verdict compares with a constant.

Printed beside them: SQLite's own batched insert and keyed read rates; the loop with one task per
row under a semaphore (the baseline before the worker loop) and playbook's ratio to it; and the
rates of the worker loop keeping what playbook promises (a lease per call, each receipt synced
before its row goes on, a memo per row, receipts read 512 rows ahead: ``b10_kept.py``), the part
of the gap that is those promises' own.

With ``--repeats N`` each case runs N times, each time after its baseline (baseline, ours,
baseline, ours, ...), each in a fresh process and on stores of the repeat's own; the medians are
compared, and each repeat's ratio printed.

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
import asyncio
import hashlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import Result, worker_pool

ROWS = 1_000_000
QUICK = 100_000
CONCURRENCY = 256
PER_ROW_KB = 0.15  # the bound on run state per row
FAILING_KB = 0.25  # with 10% failing: the errors a run holds (100,000 at 1M rows) on top
FIRST = 0.6  # the bounds on the ratios: a first run, of the worker loop's rate
RECEIPTS = 0.8  # a receipts replay, of the worker loop's reading
MEMO = 0.5  # a memo replay, of SQLite's batched keyed read of the same memos


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
    """The hand-written loops and SQLite's own reads, each in a process of its own: ``loop`` (a
    first run: compute, write a thousand at a time), ``loop-read`` (a keyed read per row),
    ``tasks`` (the first run with a task per row), ``memo-read`` (SQLite's batched keyed read of
    the memos playbook's first run left in the store at ``where``), ``sqlite`` (batched insert
    and read), ``kept`` and ``kept-read`` (``b10_kept.py``)."""
    import sqlite3

    import pandas as pd

    frame = pd.DataFrame({"x": range(rows)})
    base = _rss_kb()
    if case in ("kept", "kept-read"):  # kept-read: a new version of the play, over the receipts "kept" left
        from .b10_kept import kept_loop

        if case == "kept":
            for end in ("", "-wal", "-shm"):
                Path(where + ".kept.db" + end).unlink(missing_ok=True)
        version = "1" if case == "kept" else "2"
        rate = kept_loop(frame["x"].tolist(), where + ".kept.db", CONCURRENCY, version)
        return {"rate": rate, "base_kb": base, "peak_kb": _peak_kb()}
    if case == "memo-read":
        return {"rate": memo_read(where, rows), "base_kb": base, "peak_kb": _peak_kb()}
    db = sqlite3.connect(where + ".loop.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS receipts (key TEXT PRIMARY KEY, value TEXT)")
    if case == "sqlite":
        return _sqlite_floor(db, rows)
    rate, results = hand_loop(db, frame["x"].tolist(), case)
    frame["y"] = results
    return {"rate": rate, "base_kb": base, "peak_kb": _peak_kb()}


def _key(x: int) -> str:
    return hashlib.sha256(json.dumps(["double", "1", {"x": x}]).encode()).hexdigest()


def _sqlite_floor(db: sqlite3.Connection, rows: int) -> dict:
    pairs = [(_key(x), json.dumps(x * 2)) for x in range(rows)]
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


def hand_loop(db: sqlite3.Connection, values: list[int], case: str) -> tuple[float, list[int]]:
    """The loop a careful user writes instead, over the table ``receipts (key, value)`` of ``db``:
    ``CONCURRENCY`` workers pulling rows from one iterator, a sha256 key per call, the results
    written a thousand at a time (``loop``) or read back one keyed read each (``loop-read``).
    ``tasks``: the ``loop`` with a task per row under a semaphore instead of the workers.  Rows
    per second and the results, in order."""
    pending: list[tuple[str, str]] = []

    async def double(x: int) -> int:
        return x * 2

    def flush() -> None:
        db.executemany("INSERT OR REPLACE INTO receipts VALUES (?, ?)", pending)
        db.commit()
        pending.clear()

    async def write(x: int) -> int:
        k = _key(x)
        value = await double(x)
        pending.append((k, json.dumps(value)))
        if len(pending) >= 1000:
            flush()
        return value

    async def read(x: int) -> int:
        found = db.execute("SELECT value FROM receipts WHERE key = ?", (_key(x),)).fetchone()
        return json.loads(found[0])  # type: ignore[no-any-return]

    async def tasks() -> list[int]:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(x: int) -> int:
            async with gate:
                return await write(x)

        return await asyncio.gather(*(one(x) for x in values))

    async def main() -> list[int]:
        if case == "tasks":
            results = await tasks()
        else:
            results = await worker_pool(
                values, read if case == "loop-read" else write, len(values), CONCURRENCY
            )
        if pending:
            flush()
        return results

    start = time.perf_counter()
    results = asyncio.run(main())
    return len(values) / (time.perf_counter() - start), results


def memo_read(where: str, rows: int) -> float:
    """SQLite's batched keyed read of the row memos in the store at ``where``, as playbook asks for
    them (its ``memos()``): the keys in row order (not the table's), 8,192 at a time, each chunk
    sorted and read 500 keys a query, every output decoded.  Rows per second."""
    import random
    import sqlite3

    from playbook.store.db import FILE

    db = sqlite3.connect(f"file:{Path(where) / FILE}?mode=ro", uri=True)
    keys = [k for (k,) in db.execute("SELECT key FROM memo")]
    assert len(keys) == rows, f"{len(keys):,} memos in the store, not one per row"
    random.Random(0).shuffle(keys)  # digests: the rows' order is no order of the keys
    query = "SELECT key, play, tools, calls, cost, flags, output FROM memo WHERE key IN ({})"
    loads = json.loads
    start = time.perf_counter()
    read = 0
    for first in range(0, len(keys), 8192):
        chunk = sorted(keys[first : first + 8192])
        for i in range(0, len(chunk), 500):
            part = chunk[i : i + 500]
            for row in db.execute(query.format(",".join("?" * len(part))), part).fetchall():
                loads(row[6])
                read += 1
    seconds = time.perf_counter() - start
    db.close()
    assert read == len(keys)
    return read / seconds


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


def _kept(ours: float, kept: dict) -> str:
    return f"the loop keeping playbook's promises (b10_kept.py): {kept['rate']:,.0f}/s, ours {ours / kept['rate']:.2f} of it"


def _per_row(m: dict, rows: int) -> float:
    return (m["peak_kb"] - m["base_kb"]) / rows


# Each repeat, every case after its baseline, on stores of the repeat's own: (baseline, ours).
PAIRS = (("loop", "first"), ("memo-read", "memo"), ("loop-read", "receipts"))


def run(repeats: int = 1, rows: int = ROWS) -> list[Result]:
    folder = Path(tempfile.mkdtemp(prefix="pb-b10-"))
    samples: dict[str, list[dict]] = {}
    for repeat in range(repeats):
        where = str(folder / f"store-{repeat}")
        for baseline, ours in PAIRS:
            for case in (baseline, ours):
                samples.setdefault(case, []).append(_measure(case, rows, where))
    where = str(folder / "store")
    once = {case: _measure(case, rows, where) for case in ("sqlite", "tasks", "kept", "kept-read")}
    once["failing"] = _measure("failing", rows, where + "-failing")
    return results(rows, samples, once)


def median(samples: list[dict], what: str = "rate") -> float:
    return statistics.median(m[what] for m in samples)


def results(rows: int, samples: dict[str, list[dict]], once: dict[str, dict]) -> list[Result]:
    """The table's rows: each case's median over the repeats against its baseline's."""
    rate = {case: median(ms) for case, ms in samples.items()}
    size = f"{rows // 1000:,}k" if rows < 1_000_000 else f"{rows // 1_000_000}M"
    sqlite, tasks = once["sqlite"], once["tasks"]
    first = Result(
        f"B10 first run ({size} rows)", "/s", rate["first"], rate["loop"], "hand loop, 256 workers", FIRST
    )
    first.notes += [
        (f"SQLite's own: batched insert {sqlite['insert']:,.0f}/s, keyed read {sqlite['read']:,.0f}/s", None),
        (
            f"the loop with a task per row (the old baseline): {tasks['rate']:,.0f}/s, ours {rate['first'] / tasks['rate']:.2f} of it",
            None,
        ),
        (_kept(rate["first"], once["kept"]), None),
    ]
    receipts = Result(
        f"B10 receipts replay ({size} rows)",
        "/s",
        rate["receipts"],
        rate["loop-read"],
        "hand loop, 256 workers, reading",
        RECEIPTS,
    )
    receipts.notes.append((_kept(rate["receipts"], once["kept-read"]), None))
    memo = Result(
        f"B10 memo replay ({size} rows)",
        "/s",
        rate["memo"],
        rate["memo-read"],
        "SQLite batched read of the memos",
        MEMO,
    )
    if len(samples["first"]) > 1:
        for result, ours, baseline in (
            (first, "first", "loop"),
            (receipts, "receipts", "loop-read"),
            (memo, "memo", "memo-read"),
        ):
            each = ", ".join(f"{o['rate'] / b['rate']:.2f}" for o, b in zip(samples[ours], samples[baseline]))
            result.notes.append((f"each repeat: {each}", None))
    for name, ms in (
        ("first run", samples["first"]),
        ("memo replay", samples["memo"]),
        ("receipts replay", samples["receipts"]),
        ("10% failing", [once["failing"]]),
        ("hand loop", samples["loop"]),
    ):
        kb = statistics.median(_per_row(m, rows) for m in ms)
        verdict = None if name == "hand loop" else kb <= (FAILING_KB if name == "10% failing" else PER_ROW_KB)
        first.notes.append(
            (
                f"{name}: {kb:.3f} kB/row over {median(ms, 'base_kb') / 1024:,.0f} MB (peak {median(ms, 'peak_kb') / 1024:,.0f} MB)",
                verdict,
            )
        )
    return [first, receipts, memo]


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
    parser.add_argument("--repeats", type=int, default=1, help="each case and its baseline, alternately")
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
        do = _child if args.child in ("first", "memo", "receipts", "failing") else _loop_child
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

    print(table(run(repeats=args.repeats, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
