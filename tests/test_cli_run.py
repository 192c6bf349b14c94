"""`python -m playbook run FILE.py:play --in ... --out ...`, run for real in subprocesses against the
demo provider: formats, reruns that pay nothing, exit codes, --json, Ctrl-C and SIGTERM."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import warm
from cli_plays import EMAIL_TOOL

import playbook as pb
from playbook.frontends.files import PARQUET_INSTALL


@pytest.fixture
def demo(demo_loopback: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The demo provider on loopback: the command line runs in a process of its own, which reaches a
    provider only through a socket."""
    return demo_loopback


PLAYS = (
    EMAIL_TOOL
    + """
@pb.play
async def enrich(row, ctx):
    return {"email": await ctx.tool(find_email, domain=row.domain, first=row.first), "size": len(row.domain)}

@pb.play
async def picky(row, ctx):
    print("looking at", row.domain)  # with --json, stdout is the report's alone: this goes to stderr
    if row.n % 3 == 0:
        raise ValueError(f"no match for {row.domain}")
    return {"email": await ctx.tool(find_email, domain=row.domain, first=row.first)}

@pb.play
async def mixed(row, ctx):
    return {"info": {"n": row.n} if row.n % 2 else "none"}

@pb.play
async def show(row, ctx):
    out = {"seen": repr(row.to_dict()), "id": row.id}  # id as given: an output that replaces nothing
    if row.kind == "fix":
        out["zip"] = "fixed"  # replaces zip in this row only
    return out

@pb.play
async def numbered(row, ctx):
    return {"line": row.index}

chat = pb.llm_tool("chat", model="demo-1", base_url=os.environ["DEMO_URL"] + "/v1",
                   secret=pb.secret("DEMO_API_KEY", default="demo-key"))

@pb.play
async def pitch(row, ctx):  # the demo's model is in no price table: unpriced
    return {"pitch": await ctx.tool(chat, prompt=f"One line on {row.domain}")}

@pb.tool
async def slow(n: int) -> int:
    open(os.environ["STARTED"], "a").close()
    await asyncio.sleep(0.2)  # 12 rows one at a time: 2.4 s for the test to catch it mid-run
    return n
"""
)

START_TIMEOUT = 60.0  # seconds a subprocess may take to get going on a loaded machine


@pytest.fixture
def work(tmp_path: Path, demo: pb.demo.DemoServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with plays.py (reading the demo's URL from $DEMO_URL) and leads.csv of 12 distinct rows."""
    monkeypatch.setenv("DEMO_URL", demo.url)
    (tmp_path / "plays.py").write_text(PLAYS)
    _leads(12).to_csv(tmp_path / "leads.csv", index=False)
    return tmp_path


def _leads(rows: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "n": range(rows),
            "domain": [f"d{i}.example.com" for i in range(rows)],
            "first": [f"p{i}" for i in range(rows)],
        }
    )


def _args(work: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "playbook", "run", *args, "--store", str(work / "store")]


def cli(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m playbook run *args`` from ``work``, started warm (tests/warm.py)."""
    return warm.run(*_args(work, *args)[3:], module="playbook", cwd=work)


def cli_many(
    work: Path, cases: list[tuple[list[str], dict[str, str]]]
) -> list[subprocess.CompletedProcess[str]]:
    """Run several commands at once; one whose environment changes what Python imports at start
    (``PYTHONPATH``) in a fresh interpreter, the others started warm."""
    procs: list[Any] = []
    for args, env in cases:
        if "PYTHONPATH" in env:
            procs.append(
                subprocess.Popen(
                    _args(work, *args),
                    cwd=work,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env={**os.environ, **env},
                )
            )
        else:
            procs.append(
                warm.start(
                    None, *_args(work, *args)[3:], module="playbook", cwd=work, env={**os.environ, **env}
                )
            )
    done = []
    for (args, _), proc in zip(cases, procs):
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(args, proc.wait(), out, err))
    return done


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain dicts, every missing value as None (files spell it NaN, None or nothing)."""
    return [
        {k: None if pd.isna(v) else v for k, v in row.items()}
        for row in frame.astype(object).to_dict("records")
    ]


def _python_map(work: Path, name: str) -> pd.DataFrame:
    """The same play run by map() in this process, on a store of its own."""
    spec = importlib.util.spec_from_file_location("plays_for_test", work / "plays.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return pd.read_csv(work / "leads.csv").play.map(
        getattr(module, name), store=work / "python-store", progress=False
    )


def _leftovers(work: Path) -> list[str]:
    return [p.name for p in work.iterdir() if p.name.startswith(".")]


def test_csv_to_parquet_matches_map_and_a_rerun_to_jsonl_pays_nothing(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """CSV in, Parquet out holds what map() returns from Python; the rerun (JSON Lines out) reuses every row, pays 0, exits 0."""
    expected = _python_map(work, "enrich")
    assert demo.stats()["requests"] == 12

    first = cli(work, "plays.py:enrich", "--in", "leads.csv", "--out", "out.parquet")
    assert first.returncode == 0, first.stderr
    assert first.stdout == ""
    assert demo.stats()["requests"] == 24
    back = pd.read_parquet(work / "out.parquet")
    assert (
        list(back.columns)
        == list(expected.columns)
        == ["n", "domain", "first", "email", "size", "play_status", "play_error"]
    )
    assert _records(back) == _records(expected)
    assert "wrote 12 rows to out.parquet" in first.stderr

    again = cli(work, "plays.py:enrich", "--in", "leads.csv", "--out", "out.jsonl")
    assert again.returncode == 0, again.stderr
    assert demo.stats()["requests"] == 24
    lines = pd.read_json(work / "out.jsonl", lines=True)
    assert list(lines["play_status"]) == ["reused"] * 12
    assert _records(lines.drop(columns="play_status")) == _records(expected.drop(columns="play_status"))
    assert _leftovers(work) == []


def test_events_are_written_as_json_lines_that_add_up_to_the_report(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """``--events run.jsonl``: a line per paid call and per row, which add up to the --json report and
    to the requests the provider saw; a rerun appends its own lines, every row reused."""
    done = cli(
        work, "plays.py:picky", "--in", "leads.csv", "--out", "out.csv", "--json", "--events", "run.jsonl"
    )
    assert done.returncode == 3, done.stderr
    stats = json.loads(done.stdout)["stats"]
    lines = [json.loads(text) for text in (work / "run.jsonl").read_text().splitlines()]
    rows = [line for line in lines if line["event"] == "row"]
    assert sorted(line["row"] for line in rows if line["status"] == "failed") == [0, 3, 6, 9]
    paid = [line for line in lines if line["event"] == "call" and line["paid"]]
    assert len(paid) == stats["calls_executed"] == demo.stats()["requests"] == 8
    assert lines[-1]["event"] == "run_finished" and lines[-1]["stats"]["failed"] == 4

    again = cli(work, "plays.py:picky", "--in", "leads.csv", "--out", "out.csv", "--events", "run.jsonl")
    assert again.returncode == 3, again.stderr
    more = [json.loads(text) for text in (work / "run.jsonl").read_text().splitlines()][len(lines) :]
    assert {line["status"] for line in more if line["event"] == "row"} == {"reused", "failed"}
    assert not any(line["event"] == "call" and line["paid"] for line in more)


def test_the_json_report_and_the_summary_count_unpriced_calls(work: Path) -> None:
    """An LLM column of a model with no price: the --json report's stats count its calls as
    unpriced with no cost, and the summary on stderr says "unpriced", not $0.00 spent."""
    done = cli(work, "plays.py:pitch", "--in", "leads.csv", "--out", "out.csv", "--json")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)["stats"]
    assert (stats["calls_executed"], stats["calls_unpriced"], stats["cost_spent"]) == (12, 12, 0.0)
    assert (
        "cost unpriced spent, $0.00 saved (12 calls of 'chat' unpriced: no price for the model)"
        in done.stderr
    )


def test_failed_rows_exit_3_with_the_output_written_and_the_json_report(work: Path) -> None:
    """Rows that raise: exit 3, the output holds them with their errors, and --json prints one object that
    matches the file (stats, output path, exit code, first errors); progress stays on stderr."""
    done = cli(work, "plays.py:picky", "--in", "leads.csv", "--out", "out.csv.gz", "--json")
    assert done.returncode == 3, done.stderr
    report = json.loads(done.stdout)
    out = pd.read_csv(work / "out.csv.gz")
    failed = out[out["play_status"] == "failed"]
    assert list(failed["n"]) == [0, 3, 6, 9]
    assert all(error.startswith("ValueError: no match for d") for error in failed["play_error"])
    assert report["exit_code"] == 3 and report["output"] == "out.csv.gz" and report["error"] is None
    stats = report["stats"]
    assert (stats["total"], stats["ok"], stats["failed"], stats["parked"], stats["reused"]) == (
        12,
        8,
        4,
        0,
        0,
    )
    assert stats["calls_executed"] == 8 and stats["cost_spent"] == 8.0
    assert [e["row"] for e in report["errors"]] == [0, 3, 6, 9]
    assert [e["error"] for e in report["errors"]] == list(failed["play_error"])
    [group] = report["error_groups"]  # one line of the play failed them all: one group
    assert (
        group["group"].startswith("ValueError: no match for <id>.example.com (line ") and group["rows"] == 4
    )
    assert (group["example_row"], group["message"]) == (0, failed["play_error"].iloc[0])
    assert f"  4 × {group['group']}; e.g. row 0: " in done.stderr
    assert "4 rows failed" in done.stderr and "no match for d0.example.com" in done.stderr
    assert "looking at d11.example.com" in done.stderr


def test_on_error_raise_stops_at_the_first_failed_row_in_one_line(work: Path) -> None:
    """--on-error raise: the first row that raises stops the run with exit 1 and one line naming the
    error and the row (no traceback), and nothing is written."""
    done = cli(work, "plays.py:picky", "--in", "leads.csv", "--out", "raised.csv", "--on-error", "raise")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and not (work / "raised.csv").exists()
    [line] = [line for line in done.stderr.splitlines() if "error: " in line]
    assert (
        "ValueError: no match for d" in line and "row " in line and "--on-error raise stopped the run" in line
    )


def test_bad_credentials_and_an_unwritable_result_exit_1_and_write_nothing(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """A 401 stops the run (exit 1, one line naming the provider and status); a result Parquet cannot hold
    exits 1 saying the receipts are saved; neither leaves an output or a temporary file."""
    refused, mixed = cli_many(
        work,
        [
            (
                ["plays.py:enrich", "--in", "leads.csv", "--out", "refused.parquet"],
                {"DEMO_API_KEY": "not-the-key"},
            ),
            (["plays.py:mixed", "--in", "leads.csv", "--out", "mixed.parquet"], {}),
        ],
    )
    assert refused.returncode == 1 and refused.stdout == ""
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("playbook: ")]
    assert "401" in line and "'acme'" in line and "refused.parquet" in line
    assert "Traceback" not in refused.stderr
    assert set(demo.stats()["by_status"]) == {"401"}

    assert mixed.returncode == 1
    (line,) = [line for line in mixed.stderr.splitlines() if line.startswith("playbook: ")]
    assert "column info" in line and "receipts are saved" in line and ".jsonl" in line
    assert not (work / "refused.parquet").exists() and not (work / "mixed.parquet").exists()
    assert _leftovers(work) == []


def test_a_deleted_store_is_refused_with_its_way_out_on_the_command_line(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """A store directory deleted after a run: every run is refused (exit 1) with the command that
    accepts it and no claim that a rerun helps; `cache accept-loss --yes` on the deleted path lets the
    next run go on, paying again for the lost calls."""
    run = ["plays.py:enrich", "--in", "leads.csv", "--out", "out.csv", "--overwrite"]
    assert cli(work, *run).returncode == 0
    shutil.rmtree(work / "store")
    for _ in range(2):
        refused = cli(work, *run)
        assert refused.returncode == 1, refused.stderr
        (line,) = [line for line in refused.stderr.splitlines() if line.startswith("playbook: ")]
        assert (
            "held 12 receipts" in line
            and f"python -m playbook cache accept-loss --store {work / 'store'}" in line
        )
        assert "rerun" not in line
    assert demo.stats()["requests"] == 12
    reset = warm.run("cache", "reset", "--yes", "--store", str(work / "store"), module="playbook", cwd=work)
    assert reset.returncode == 0 and "accepted" in reset.stdout, reset.stderr
    assert cli(work, *run).returncode == 0
    assert demo.stats()["requests"] == 24


def test_usage_errors_exit_2_naming_what_is_wrong_before_anything_runs(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """A missing file, play or `:name`, a broken plays file (its own traceback only), an unknown format,
    a missing input, Parquet without pyarrow, bad option values, a misspelt option (and what it was
    likely meant to be), an --out that is the --in file
    (spelled another way, through a symlink) and a CSV whose rows have more fields than its header
    (which pandas would shift into the index; or anywhere in a file read in chunks): exit 2 naming
    the line, no call is made and the input is intact."""
    (work / "broken.py").write_text("import playbook as pb\n  x = 1\n")
    (work / "raises.py").write_text("import os\n\nCONFIG = os.environ['NO_SUCH_SETTING_HERE']\n")
    (work / "no_pyarrow").mkdir()
    (work / "no_pyarrow" / "pyarrow.py").write_text("raise ImportError('No module named pyarrow')\n")
    (work / "link.csv").symlink_to(work / "leads.csv")
    (work / "shifted.csv").write_text("domain,first\n\nacme.com,Ada,x\nglobex.com,Bo,y\n")
    (work / "longer.csv").write_text("domain,first\nacme.com,Ada\nglobex.com,Bo,y\n")
    (work / "longer_late.csv").write_text(
        "domain,first\n" + "".join(f"c{i}.com,P{i}\n" for i in range(6)) + "globex.com,Bo,y\n"
    )
    leads = (work / "leads.csv").read_bytes()
    run = ["--in", "leads.csv", "--out", "out.csv"]
    cases: list[tuple[list[str], list[str], dict[str, str]]] = [
        (["plays.py", *run], ["after a colon", "plays.py:enrich"], {}),
        (["missing.py:enrich", *run], ["no such file", "missing.py"], {}),
        (["plays.py:enrih", *run], ["'enrih'", "did you mean 'enrich'", "picky (play)", "slow (tool)"], {}),
        (["broken.py:x", *run], ["broken.py, line 2", "IndentationError"], {}),
        (["raises.py:x", *run], ["raises.py", "KeyError"], {}),
        (
            ["plays.py:enrich", "--in", "leads.csv", "--out", "out.xlsx"],
            ["--out out.xlsx", "unknown format"],
            {},
        ),
        (
            ["plays.py:enrich", "--in", "nowhere.csv", "--out", "out.csv"],
            ["--in nowhere.csv", "no such file"],
            {},
        ),
        (
            ["plays.py:enrich", "--in", "leads.csv", "--out", "out.parquet"],
            ["--out", PARQUET_INSTALL],
            {"PYTHONPATH": str(work / "no_pyarrow")},
        ),
        (["plays.py:enrich", *run, "--concurrency", "0"], ["--concurrency", "'0'"], {}),
        (["plays.py:enrich", *run, "--max-cost", "abc"], ["--max-cost", "'abc'"], {}),
        (
            ["plays.py:enrich", *run, "--max-cost", "inf"],
            ["argument --max-cost", "'inf' (for no limit, leave the option out)"],
            {},
        ),
        (
            ["plays.py:enrich", *run, "--store", ""],
            ["argument --store: expected a directory or a redis:// URL, not ''"],
            {},
        ),
        (
            ["plays.py:enrich", *run, "--concurency", "8"],
            ["unrecognized arguments: --concurency 8 (did you mean --concurrency?)"],
            {},
        ),
        (
            ["plays.py:enrich", *run, "--conc", "0"],
            ["argument --concurrency", "'0'"],
            {},
        ),  # an abbreviation is argparse's: it names one option
        (["plays.py:enrich", *run, "--id-columns", "domain,nope"], ["--id-columns", "'nope'"], {}),
        (
            ["plays.py:enrich", "--in", "./leads.csv", "--out", "link.csv"],
            ["--out link.csv", "same file as --in ./leads.csv"],
            {},
        ),
        (
            ["plays.py:enrich", "--in", "shifted.csv", "--out", "out.csv"],
            ["--in shifted.csv", "line 3 has 3 fields but the header has 2"],
            {},
        ),
        (
            ["plays.py:enrich", "--in", "longer.csv", "--out", "out.csv"],
            ["--in longer.csv", "line 3, saw 3"],
            {},
        ),
        # read in chunks, the longer row in the fourth: refused before the first chunk pays
        (
            ["plays.py:enrich", "--in", "longer_late.csv", "--out", "out.csv", "--chunk-rows", "2"],
            ["line 8, saw 3"],
            {},
        ),
    ]
    results = cli_many(work, [(args, env) for args, _, env in cases])
    for (args, words, _), done in zip(cases, results):
        assert done.returncode == 2, (args, done.stderr)
        assert done.stdout == ""
        last = done.stderr.splitlines()[-1]
        for word in words:
            assert word in (done.stderr if args[0] == "raises.py:x" else last), (args, done.stderr)
        if args[0] != "raises.py:x":  # the user's own traceback is the one exception to one line
            assert "Traceback" not in done.stderr, (args, done.stderr)
    raised = results[4].stderr
    assert (
        'raises.py", line 3, in <module>' in raised and "importlib" not in raised and "cli_run" not in raised
    )
    assert demo.stats()["requests"] == 0
    assert (
        not (work / "out.csv").exists()
        and not (work / "store").exists()
        and not (work / "receipts.db").exists()
    )
    assert (work / "leads.csv").read_bytes() == leads


def test_ctrl_c_or_sigterm_writes_nothing_and_the_rerun_pays_each_call_once(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """SIGINT mid-run: calls in flight land, exit 130, no output file, stderr says how far it got; the
    rerun finishes and the demo has answered exactly one request per distinct call.  SIGTERM (a
    cancelled CI job) winds a run down the same way and exits 143."""
    _leads(40).to_csv(work / "many.csv", index=False)
    demo.configure(latency=0.3)
    started = work / "started"
    interrupted, terminated = (
        subprocess.Popen(
            _args(work, *args), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for args, env in [
            (["plays.py:enrich", "--in", "many.csv", "--out", "many.parquet", "--concurrency", "4"], None),
            (
                ["plays.py:slow", "--in", "leads.csv", "--out", "slow.csv", "--concurrency", "1", "--json"],
                {**os.environ, "STARTED": str(started)},
            ),
        ]
    )
    _signal_when_under_way(
        [
            (interrupted, lambda: demo.stats()["requests"] >= 4, signal.SIGINT),
            (terminated, started.exists, signal.SIGTERM),
        ]
    )

    out, err = interrupted.communicate(timeout=60)
    assert interrupted.returncode == 130, err
    assert out == "" and not (work / "many.parquet").exists()
    assert (
        "interrupted: " in err and "nothing was written to many.parquet" in err and "a rerun resumes" in err
    )
    assert demo.stats()["requests"] < 40
    out, err = terminated.communicate(timeout=60)
    assert terminated.returncode == 143, err
    report = json.loads(out)
    assert report["exit_code"] == 143 and report["output"] is None and report["stats"]["skipped"] > 0
    assert not (work / "slow.csv").exists() and _leftovers(work) == []

    demo.configure(latency=0.0)
    rerun = cli(work, "plays.py:enrich", "--in", "many.csv", "--out", "many.parquet")
    assert rerun.returncode == 0, rerun.stderr
    assert demo.stats()["requests"] == 40
    assert demo.stats()["duplicate_idempotency_keys"] == 0
    assert set(pd.read_parquet(work / "many.parquet")["play_status"]) <= {"ok", "reused"}


def _signal_when_under_way(waiting: list[tuple[subprocess.Popen[str], Any, signal.Signals]]) -> None:
    """Send each process its signal as soon as its run is under way (``ready()``); fail if one
    ended first or never got there."""
    deadline = time.monotonic() + START_TIMEOUT
    while waiting:
        for proc, ready, signum in list(waiting):
            if ready():
                proc.send_signal(signum)
                waiting.remove((proc, ready, signum))
            elif proc.poll() is not None:
                pytest.fail(f"the run ended before it was interrupted: {proc.communicate()[1]}")
        if time.monotonic() > deadline:
            for proc, _, _ in waiting:
                proc.kill()
            pytest.fail("the run did not start")
        time.sleep(0.01)


CSV_IDS = "id,zip,phone,name,amount,kind,n\n007,01234,+4412345,Zoë,1.50,keep,1\n1e3,99999,0044,,NA,fix,2\n42,00000,+15550100,日本語,2.25,keep,3\n"
JSONL_IDS = [
    {
        "id": "007",
        "zip": "01234",
        "phone": "+4412345",
        "name": "Zoë",
        "n": 1,
        "big": 9007199254740993,
        "x": 0.30000000000000004,
        "kind": "keep",
    },
    {
        "id": "1e3",
        "zip": "99999",
        "phone": "0044",
        "name": None,
        "n": None,
        "big": None,
        "x": 1e300,
        "kind": "fix",
        "empty": "",
    },
    {
        "id": "42",
        "zip": "00000",
        "phone": "+15550100",
        "name": "日本語",
        "n": 3,
        "big": 2,
        "x": 1.5,
        "kind": "keep",
        "empty": "",
    },
]


def _seen(frame: pd.DataFrame) -> list[str]:
    """What the play `show` reports for each row of ``frame``: its values as iterating a column gives them."""
    return [
        repr(dict(zip(frame.columns, values))) for values in zip(*(frame[c].tolist() for c in frame.columns))
    ]


def test_a_play_reading_row_index_gets_each_duplicate_lines_own_place(work: Path) -> None:
    """Equal lines of a CSV are rows of their own for a play that reads row.index: each gets its
    own place in the file, and the rerun reuses each row's own memo."""
    (work / "twice.csv").write_text(
        "domain,first\na.example.com,p\na.example.com,p\nb.example.com,q\na.example.com,p\n"
    )
    first = cli(work, "plays.py:numbered", "--in", "twice.csv", "--out", "twice-out.csv")
    assert first.returncode == 0, first.stderr
    out = pd.read_csv(work / "twice-out.csv")
    assert out["line"].tolist() == [0, 1, 2, 3] and out["play_status"].tolist() == ["ok"] * 4
    again = cli(work, "plays.py:numbered", "--in", "twice.csv", "--out", "twice-again.csv")
    assert again.returncode == 0, again.stderr
    back = pd.read_csv(work / "twice-again.csv")
    assert back["line"].tolist() == [0, 1, 2, 3] and back["play_status"].tolist() == ["reused"] * 4


def test_input_columns_reach_the_output_as_the_file_spells_them(work: Path) -> None:
    """Leading zeros, 1e3, +44, empty cells, NA and unicode come out of a CSV exactly as they went in
    (to CSV as text; to Parquet as text where pandas' number would differ, numbers where it would not),
    while the play sees read_csv's values; JSON Lines keep their types, big ints and every float digit;
    a column the play returns replaces the file's (--overwrite) only in the rows that changed it."""
    (work / "ids.csv").write_text(CSV_IDS, encoding="utf-8")
    (work / "ids.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in JSONL_IDS), encoding="utf-8"
    )
    runs = cli_many(
        work,
        [
            (["plays.py:show", "--in", "ids.csv", "--out", "ids-out.csv", "--overwrite"], {}),
            (["plays.py:show", "--in", "ids.csv", "--out", "ids-out.parquet", "--overwrite"], {}),
            (["plays.py:show", "--in", "ids.jsonl", "--out", "ids-out.jsonl", "--overwrite"], {}),
        ],
    )
    assert [done.returncode for done in runs] == [0, 0, 0], [done.stderr for done in runs]

    text = pd.read_csv(work / "ids.csv", dtype=str, keep_default_na=False)
    out = pd.read_csv(work / "ids-out.csv", dtype=str, keep_default_na=False)
    assert out[text.columns].to_dict("records") == text.assign(zip=["01234", "fixed", "00000"]).to_dict(
        "records"
    )
    assert list(out["seen"]) == _seen(
        pd.read_csv(work / "ids.csv")
    )  # 7.0, 1234, nan: what a notebook's read_csv gives
    parquet = pd.read_parquet(work / "ids-out.parquet")
    assert _records(parquet[["id", "phone", "name", "amount", "n"]]) == [
        {"id": "007", "phone": "+4412345", "name": "Zoë", "amount": "1.50", "n": 1},
        {"id": "1e3", "phone": "0044", "name": None, "amount": "NA", "n": 2},
        {"id": "42", "phone": "+15550100", "name": "日本語", "amount": "2.25", "n": 3},
    ]

    lines = [json.loads(line) for line in (work / "ids-out.jsonl").read_text(encoding="utf-8").splitlines()]
    expected = [{**r, "zip": "fixed"} if r["kind"] == "fix" else r for r in JSONL_IDS]
    assert [json.dumps({k: line[k] for k in r}) for line, r in zip(lines, expected)] == [
        json.dumps(r) for r in expected
    ]
    assert [line["seen"] for line in lines] == _seen(
        pd.read_json(work / "ids.jsonl", lines=True, dtype=False, precise_float=True)
    )
    assert "'id': '007'" in lines[0]["seen"]


def test_json_report_says_why_rows_parked_and_stderr_says_what_to_do_from_a_shell(
    work: Path, demo: pb.demo.DemoServer
) -> None:
    """Rows parked on the budget or on a provider's hold: the --json report counts them by reason and
    lists the first (provider, when it takes calls again, message); stderr names --max-cost once and
    tells the shell user to rerun the command, without repeating the run summary's parked lines."""
    demo.configure(
        api_keys=("demo-key", "held-key"), quota=5, quota_reset=600
    )  # a quota per key: the budget run stays under it
    _leads(12).assign(domain=lambda f: "held-" + f["domain"]).to_csv(
        work / "other.csv", index=False
    )  # calls of their own
    budget, held = cli_many(
        work,
        [
            (
                ["plays.py:enrich", "--in", "leads.csv", "--out", "budget.csv", "--max-cost", "3", "--json"],
                {},
            ),
            (
                ["plays.py:enrich", "--in", "other.csv", "--out", "held.csv", "--max-wait", "2", "--json"],
                {"DEMO_API_KEY": "held-key"},
            ),
        ],
    )
    assert budget.returncode == 3, budget.stderr
    report = json.loads(budget.stdout)
    out = pd.read_csv(work / "budget.csv")
    assert (
        report["parked"]["by_reason"] == {"budget": 9}
        and report["waiting_on"] == []
        and report["errors"] == []
    )
    assert [r["row"] for r in report["parked"]["rows"]] == list(out.index[out["play_status"] == "parked"][:5])
    assert {(r["reason"], r["provider"], r["ready_at"]) for r in report["parked"]["rows"]} == {
        ("budget", None, None)
    }
    assert all("acme.email" in r["message"] for r in report["parked"]["rows"])
    assert budget.stderr.count("--max-cost") == 1
    assert "rerun the same command with a higher --max-cost" in budget.stderr

    assert held.returncode == 3, held.stderr
    report = json.loads(held.stdout)
    assert report["parked"]["by_reason"] == {"hold": 7}
    (provider,) = {r["provider"] for r in report["parked"]["rows"]}
    assert provider == "acme" and len(report["parked"]["rows"]) == 5
    ready = {datetime.fromisoformat(r["ready_at"]) for r in report["parked"]["rows"]}
    assert all(at > datetime.now(UTC) for at in ready)
    assert held.stderr.count("7 rows parked") == 1 and "--max-cost" not in held.stderr
    assert "rerun the same command to run the rows that did not finish" in held.stderr


def test_a_plays_old_spellings_are_said_on_stderr_once_each(work: Path) -> None:
    """A play run from the command line that uses an old spelling (``ctx.row_key``, ``force=``)
    runs, and stderr says each once with its new name: the play's module is not ``__main__``,
    where Python would hide the warning from a scheduled job."""
    (work / "old.py").write_text(
        "import playbook as pb\n\n\n@pb.tool\ndef up(a: str) -> str:\n    return a.upper()\n\n\n"
        "@pb.play\nasync def old(row, ctx):\n"
        "    value = await ctx.tool(up, a=row.first, force=False)\n"
        "    return {'value': value, 'id': ctx.row_key}\n"
    )
    (work / "few.csv").write_text("domain,first\na.example.com,p\nb.example.com,q\n")
    done = cli(work, "old.py:old", "--in", "few.csv", "--out", "old-out.csv")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("ctx.row_key is deprecated") == 1, done.stderr
    assert "use ctx.row_id" in done.stderr and "use ctx.tool(..., refresh=)" in done.stderr
    assert pd.read_csv(work / "old-out.csv")["value"].tolist() == ["P", "Q"]
