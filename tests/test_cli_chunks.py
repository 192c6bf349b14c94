"""`python -m playbook run` over a file read in chunks (``--chunk-rows``): the same output as one
read, the report of one run, and a run killed between chunks that resumes, run for real in
subprocesses against the demo provider."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import warm
from cli_plays import EMAIL_TOOL

import playbook as pb

PLAYS = (
    EMAIL_TOOL
    + """
@pb.play
async def picky(row, ctx):
    if row.n % 3 == 0:
        raise ValueError(f"no match for {row.domain}")
    # ints in the chunks where no row fails, floats where one does: the file holds one type
    return {"email": await ctx.tool(find_email, domain=row.domain, first=row.first), "twice": row.n * 2}


class Client:
    def __init__(self):
        self.connection = object()  # no stable form: the run says so


CLIENT = Client()


@pb.play
async def via_client(row, ctx):
    assert CLIENT.connection is not None
    return {"email": await ctx.tool(find_email, domain=row.domain, first=row.first)}
"""
)

ROWS = 40


@pytest.fixture
def demo(demo_loopback: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The demo provider on loopback: the command line runs in processes of its own, which
    reach a provider only through a socket."""
    return demo_loopback


@pytest.fixture
def work(tmp_path: Path, demo: pb.demo.DemoServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DEMO_URL", demo.url)
    (tmp_path / "plays.py").write_text(PLAYS)
    frame = pd.DataFrame(
        {
            "n": range(ROWS),
            "domain": [f"d{i}.example.com" for i in range(ROWS)],
            "first": [f"p{i}" for i in range(ROWS)],
        }
    )
    frame.to_csv(tmp_path / "leads.csv", index=False)
    frame.to_parquet(tmp_path / "leads.parquet")
    frame.to_json(tmp_path / "leads.jsonl", orient="records", lines=True)
    return tmp_path


def _args(work: Path, *args: str) -> list[str]:
    return ["run", "plays.py:picky", *args, "--store", str(work / "store"), "--json"]


def cli(work: Path, *args: str) -> tuple[int, dict, str]:
    done = warm.run(*_args(work, *args), module="playbook", cwd=work)
    return done.returncode, json.loads(done.stdout), done.stderr


@pytest.mark.parametrize("suffix", ["csv", "parquet", "jsonl"])
def test_a_file_read_in_chunks_writes_what_one_read_writes_and_reports_one_run(
    work: Path, demo: pb.demo.DemoServer, suffix: str
) -> None:
    """40 rows in chunks of 7 and in one chunk: the same file (one header, one schema: a column of ints
    in some chunks and floats in others is floats), the same report; each call paid once."""
    code, chunked, err = cli(
        work, "--in", f"leads.{suffix}", "--out", f"chunked.{suffix}", "--chunk-rows", "7"
    )
    assert code == 3, err
    assert "rows 8 to 14 of leads" in err and "rows 36 to 40 of leads" in err
    paid = ROWS - len(range(0, ROWS, 3))
    assert demo.stats()["requests"] == paid
    code, whole, err = cli(
        work, "--in", f"leads.{suffix}", "--out", f"whole.{suffix}", "--chunk-rows", "1000"
    )
    assert code == 3, err
    assert demo.stats()["requests"] == paid
    if suffix == "parquet":
        a, b = pd.read_parquet(work / f"chunked.{suffix}"), pd.read_parquet(work / f"whole.{suffix}")
        pd.testing.assert_frame_equal(a, b.assign(play_status=a["play_status"]))
        assert a["twice"].dtype == "float64" and list(a.index) == list(range(ROWS))
    else:
        chunked_text = (work / f"chunked.{suffix}").read_text()
        assert chunked_text == (work / f"whole.{suffix}").read_text().replace('"reused"', '"ok"').replace(
            ",reused,", ",ok,"
        )
    stats = chunked["stats"]
    assert (stats["total"], stats["ok"], stats["failed"], stats["calls_executed"], stats["cost_spent"]) == (
        ROWS,
        paid,
        ROWS - paid,
        paid,
        paid,
    )
    assert whole["stats"]["reused"] == paid and whole["stats"]["failed"] == ROWS - paid
    assert chunked["errors"] == whole["errors"] and [e["row"] for e in chunked["errors"]] == [0, 3, 6, 9, 12]
    assert (
        chunked["error_groups"] == whole["error_groups"] and chunked["error_groups"][0]["rows"] == ROWS - paid
    )
    assert chunked["error_kinds"] == whole["error_kinds"] == 1
    assert chunked["output"] == f"chunked.{suffix}" and chunked["exit_code"] == 3
    assert [p.name for p in work.iterdir() if p.name.startswith(".")] == []


def test_limit_and_max_cost_are_for_the_whole_file(work: Path, demo: pb.demo.DemoServer) -> None:
    """--limit 17 over chunks of 5 runs 17 rows; --max-cost 10 pays for 10 calls across the chunks, and
    the rows whose calls it leaves unpaid park."""
    code, report, err = cli(
        work, "--in", "leads.csv", "--out", "limited.csv", "--chunk-rows", "5", "--limit", "17"
    )
    assert code == 3, err
    assert len(pd.read_csv(work / "limited.csv")) == 17 and report["stats"]["total"] == 17
    assert demo.stats()["requests"] == len([n for n in range(17) if n % 3])
    demo.reset()
    code, report, err = cli(
        work,
        "--in",
        "leads.jsonl",
        "--out",
        "budget.jsonl",
        "--chunk-rows",
        "5",
        "--max-cost",
        "10",
        "--refresh",
    )
    assert code == 3, err
    assert report["stats"]["calls_executed"] == demo.stats()["requests"] == 10
    # The first 17 rows' calls have their receipts (free): 15 calls of the other rows to pay for, 10 paid.
    assert report["parked"]["by_reason"]["budget"] == len([n for n in range(17, ROWS) if n % 3]) - 10
    assert "with a higher --max-cost" in err


def test_a_run_stopped_between_chunks_writes_nothing_and_the_rerun_finishes_the_file(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """SIGINT in the fourth chunk: exit 130, no --out and no part files left; the same command again
    reuses the rows the first three chunks finished, pays each call once, and writes the whole file."""
    demo.configure(latency=0.05)
    proc = warm.start(
        None,
        *_args(work, "--in", "leads.csv", "--out", "out.parquet", "--chunk-rows", "4", "--concurrency", "1"),
        module="playbook",
        cwd=work,
        env=os.environ.copy(),
    )
    deadline = time.monotonic() + 60
    while demo.stats()["requests"] < 9 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "nothing was written to out.parquet" in err and json.loads(out)["exit_code"] == 130
    assert (
        not (work / "out.parquet").exists()
        and [p.name for p in work.iterdir() if p.name.startswith(".")] == []
    )
    paid_before = demo.stats()["requests"]
    assert 9 <= paid_before < ROWS - len(range(0, ROWS, 3))
    demo.configure(latency=0.0)
    code, report, err = cli(work, "--in", "leads.csv", "--out", "out.parquet", "--chunk-rows", "4")
    assert code == 3, err
    result = pd.read_parquet(work / "out.parquet")
    assert list(result["n"]) == list(range(ROWS))
    assert report["stats"]["reused"] >= 6  # three chunks of 4, less the rows that failed
    assert demo.stats()["requests"] == ROWS - len(range(0, ROWS, 3))  # every call once, over both runs
    assert demo.stats()["duplicate_idempotency_keys"] == 0


def test_bad_chunk_sizes_and_a_file_that_breaks_mid_way_are_said_plainly(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """--chunk-rows 0 is a usage error; a JSON Lines file broken at line 23 fails with the line named
    after the chunks before it ran (their rows are saved), and no --out is written; a Parquet file
    of no rows (it has no batch to read) gives an output of no rows."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "playbook",
            *_args(work, "--in", "leads.csv", "--out", "x.csv", "--chunk-rows", "0"),
        ],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert (
        done.returncode == 2 and "argument --chunk-rows: expected a whole number >= 1, not '0'" in done.stderr
    )
    lines = (work / "leads.jsonl").read_text().splitlines()
    lines[22] = "{broken"
    (work / "broken.jsonl").write_text("\n".join(lines) + "\n")
    code, report, err = cli(work, "--in", "broken.jsonl", "--out", "x.jsonl", "--chunk-rows", "10")
    assert code == 2, err
    assert "--in broken.jsonl: cannot read it as JSON Lines: line 23" in report["error"]
    assert (
        not (work / "x.jsonl").exists() and [p.name for p in work.iterdir() if p.name.startswith(".")] == []
    )
    assert demo.stats()["requests"] == len([n for n in range(20) if n % 3])
    empty = pd.read_parquet(work / "leads.parquet").iloc[:0]
    empty.to_parquet(work / "empty.parquet")
    code, report, err = cli(work, "--in", "empty.parquet", "--out", "empty-out.parquet")
    assert code == 0, err
    assert list(pd.read_parquet(work / "empty-out.parquet").columns) == [
        *empty.columns,
        "play_status",
        "play_error",
    ]


def test_what_a_play_reads_and_cannot_count_is_said_once_per_command(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """A play reading a client object, over 40 rows in chunks of 10 (after a pilot, then without): the notice is said
    once per command, not once per chunk."""
    args = [
        "run",
        "plays.py:via_client",
        "--in",
        "leads.csv",
        "--out",
        "out.csv",
        "--chunk-rows",
        "10",
        "--store",
        str(work / "store"),
    ]
    for extra in (["--estimate", "--yes", "--sample", "5"], []):
        done = warm.run(*args, *extra, module="playbook", cwd=work)
        assert done.returncode == 0, done.stderr
        assert (
            "rows 31 to 40 of leads" in done.stderr
            and done.stderr.count("play 'via_client' reads CLIENT") == 1
        ), done.stderr
