"""The command line, run for real in a subprocess: cache stats, list, clear, export, and its errors."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import warm

import playbook as pb


@pytest.fixture
def home() -> Path:
    """The default store ($PLAYBOOK_HOME, set by conftest) after a small map with two tools:
    3 receipts of `clean` (version 2), 3 of `acme.email` (one a miss), 3 row memos."""

    @pb.tool(version="2")
    def clean(q: str) -> str:
        return q.upper()

    @pb.tool(name="acme.email", cost=0.5)
    def email(q: str) -> str | None:
        return None if q == "b" else f"{q}@example.com"

    @pb.play
    async def enrich(row, ctx):
        return {"c": await ctx.tool(clean, q=row.q), "e": await ctx.tool(email, q=row.q)}

    store = pb.ReceiptStore()
    pd.DataFrame({"q": ["a", "b", "c"]}).play.map(enrich, store=store, progress=False)
    store.close()
    return Path(store.location)


def cli(*args: str, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """``python -m playbook *args``; started warm (tests/warm.py) unless it reads a terminal."""
    if stdin is subprocess.DEVNULL:
        return warm.run(*args, module="playbook", timeout=60)
    return subprocess.run(
        [sys.executable, "-m", "playbook", *args], stdin=stdin, capture_output=True, text=True, timeout=60
    )


def cli_many(
    cases: list[list[str]], *, cwd: Path, env: dict[str, str]
) -> list[subprocess.CompletedProcess[str]]:
    """Several commands at once, from ``cwd``."""
    procs = [warm.start(None, *args, module="playbook", cwd=cwd, env={**os.environ, **env}) for args in cases]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    return [
        subprocess.CompletedProcess(args, proc.wait(), *out) for args, proc, out in zip(cases, procs, outputs)
    ]


def _stats(path: Path) -> dict[str, Any]:
    store = pb.ReceiptStore(path)
    try:
        return store.stats()
    finally:
        store.close()


def _receipts(path: Path) -> pd.DataFrame:
    store = pb.ReceiptStore(path)
    try:
        return store.receipts()
    finally:
        store.close()


def _one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr


def test_stats_text_and_json(home: Path) -> None:
    """`cache stats` shows receipts per tool, row memos, size and path; --json the same as store.stats()."""
    text = cli("cache", "stats")
    assert text.returncode == 0, text.stderr
    lines = [line.split() for line in text.stdout.splitlines()]
    assert ["store", str(home)] in lines
    assert ["receipts", "6", "(total", "cost", "$1.50)"] in lines
    assert ["acme.email", "3"] in lines and ["clean", "3"] in lines
    assert ["row", "memos", "3"] in lines
    assert any(line[0] == "size" and line[-1] == "KiB" for line in lines)

    machine = cli("cache", "stats", "--json")
    assert json.loads(machine.stdout) == _stats(home)


def test_spend_text_and_json(home: Path) -> None:
    """`cache spend` shows the calls paid and reused per provider, tool and day, and a total line;
    `--by tool --json` is store.spend(by="tool") a line each; a free local tool is not spending."""
    text = cli("cache", "spend")
    assert text.returncode == 0, text.stderr
    lines = [line.split() for line in text.stdout.splitlines()]
    assert lines[0] == ["provider", "tool", "day", "calls", "paid", "cost", "calls", "reused", "saved"]
    assert lines[1] == [
        "-",
        "acme.email",
        time.strftime("%Y-%m-%d", time.gmtime()),
        "3",
        "$1.50",
        "0",
        "$0.00",
    ]
    assert lines[-1] == [
        "in",
        "all:",
        "3",
        "calls",
        "paid,",
        "$1.50",
        "spent;",
        "0",
        "reused,",
        "$0.00",
        "saved",
    ]
    machine = cli("cache", "spend", "--by", "tool", "--json")
    with pb.ReceiptStore(home) as store:
        assert [json.loads(line) for line in machine.stdout.splitlines()] == store.spend(by="tool").to_dict(
            "records"
        )
    bad = cli("cache", "spend", "--by", "provider,cost")
    assert (
        bad.returncode == 2
        and "argument --by: 'provider,cost': name some of provider, tool, day" in bad.stderr
    )  # argparse's usage error


def test_list_shows_one_line_per_receipt_up_to_the_limit(home: Path) -> None:
    """`cache list --limit N` prints a header, N receipts oldest first, and a "… more" line."""
    done = cli("cache", "list", "--limit", "4")
    assert done.returncode == 0, done.stderr
    header, *rows, more = done.stdout.splitlines()
    assert header.split()[:5] == ["WHEN", "TOOL", "VER", "MISS", "COST"]
    assert len(rows) == 4 and more == "… 2 more (--limit 0 shows all)"
    first = _receipts(home).iloc[0]  # a `clean` receipt: each row calls it first
    when = datetime.fromtimestamp(first["created_at"].timestamp()).isoformat(timespec="seconds")
    assert rows[0].split()[:5] == [when, "clean", "2", "-", "$0.00"]
    q = first["input"]["q"]
    assert rows[0].endswith(f'{{"q":"{q}"}} → "{q.upper()}"')


def test_list_filters_by_tool(home: Path) -> None:
    """`cache list --tool NAME` lists only that tool's receipts, misses marked."""
    done = cli("cache", "list", "--tool", "acme.email")
    rows = done.stdout.splitlines()[1:]
    assert [row.split()[1] for row in rows] == ["acme.email"] * 3
    (miss,) = [row for row in rows if row.split()[3] == "miss"]
    assert miss.split()[4] == "$0.50" and miss.endswith('{"q":"b"} → null')


def test_clear_refuses_without_yes_when_stdin_is_not_a_terminal(home: Path) -> None:
    """`cache clear` without --yes and without a terminal exits 1, says why, and removes nothing."""
    done = cli("cache", "clear")
    _one_line_error(done, "--yes", "not a terminal")
    assert _stats(home)["receipts"] == 6


def test_clear_one_tool_then_everything(home: Path) -> None:
    """`clear --tool NAME --yes` removes that tool's receipts and the memos of rows that used it, so the
    next run pays for that tool (and only it) again; `clear --yes` removes the rest."""
    one = cli("cache", "clear", "--tool", "clean", "--yes")
    assert one.stdout == f"removed 3 receipts of clean and 3 row memos of rows that used it from {home}\n"
    stats = _stats(home)
    assert stats["by_tool"] == {"acme.email": 3} and stats["row_memos"] == 0
    everything = cli("cache", "clear", "--yes")
    assert everything.stdout == f"removed 3 receipts, 0 row memos from {home}\n"
    stats = _stats(home)
    assert (stats["receipts"], stats["row_memos"]) == (0, 0)


@pytest.mark.slow  # a cold interpreter on a terminal: the warm server gives no terminal
def test_clear_asks_on_a_terminal(home: Path) -> None:
    """On a terminal, `cache clear --tool NAME` asks first and clears after a "y"."""
    import pty

    master, terminal = pty.openpty()
    try:
        os.write(master, b"y\n")  # waits in the terminal's input queue until the prompt reads it
        done = cli("cache", "clear", "--tool", "acme.email", stdin=terminal)
    finally:
        os.close(master)
        os.close(terminal)
    what = "3 receipts of acme.email and 3 row memos of rows that used it"
    assert done.stdout == f"Remove {what} from {home}? [y/N] removed {what} from {home}\n"
    assert _stats(home)["by_tool"] == {"clean": 3}


def test_export_round_trips_the_receipts(home: Path) -> None:
    """`cache export` writes one JSON object per receipt with the fields and values of store.receipts()."""
    done = cli("cache", "export")
    exported = [json.loads(line) for line in done.stdout.splitlines()]
    frame = _receipts(home)
    # The frame's created_at is a UTC datetime (to the microsecond); the export keeps the epoch seconds.
    expected = frame.to_dict("records")
    for line, row in zip(exported, expected, strict=True):
        assert line.pop("created_at") == pytest.approx(row.pop("created_at").timestamp(), abs=1e-6)
    assert exported == expected
    assert list(json.loads(done.stdout.splitlines()[0])) == [
        "address",
        "tool",
        "version",
        "account",
        "input",
        "output",
        "miss",
        "cost",
        "created_at",
    ]
    assert [r["output"] for r in exported if r["miss"]] == [None]


def test_export_one_tool_to_a_file_from_store_option(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--store PATH cache export --tool NAME --out FILE` reads that store and writes only that tool's lines."""
    monkeypatch.setenv("PLAYBOOK_HOME", str(tmp_path / "elsewhere"))
    out = tmp_path / "email.jsonl"
    done = cli("--store", str(home), "cache", "export", "--tool", "acme.email", "--out", str(out))
    assert done.returncode == 0 and done.stdout == ""
    assert done.stderr == f"exported 3 receipts to {out}\n"
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["tool"] for r in lines] == ["acme.email"] * 3
    assert not (tmp_path / "elsewhere").exists()


def test_unknown_tool_is_a_short_error_naming_the_known_tools(home: Path) -> None:
    """A --tool with no receipts exits 1 with one line that lists the tools the store holds."""
    done = cli("cache", "list", "--tool", "acme.phone")
    _one_line_error(done, "'acme.phone'", "acme.email, clean")


def test_missing_store_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    """A store path that does not exist exits 1 with one line, and no directory is created."""
    missing = tmp_path / "typo"
    done = cli("--store", str(missing), "cache", "stats")
    _one_line_error(done, "no receipt store", str(missing))
    assert not missing.exists()


def test_corrupt_store_is_a_short_error(tmp_path: Path) -> None:
    """A store whose database is not SQLite exits 1 with the ReceiptError message, no traceback."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "cache.db").write_bytes(b"not a database, just bytes " * 200)
    done = cli("--store", str(broken), "cache", "list")
    _one_line_error(done, "cannot open the receipt store", "broken")


def test_a_store_named_relative_to_the_working_folder(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--store NAME` and `$PLAYBOOK_HOME=NAME` relative to the working folder open the store read-only
    for `cache stats` and `cache list`, as `ReceiptStore(NAME, readonly=True)` does from Python."""
    folder, name = home.parent, home.name
    monkeypatch.chdir(folder)
    store = pb.ReceiptStore(name, readonly=True)
    try:
        assert store.stats()["receipts"] == 6
    finally:
        store.close()
    runs = cli_many(
        [
            ["cache", "stats", "--store", name],
            ["cache", "list", "--store", name],
            ["cache", "stats", "--json"],
        ],
        cwd=folder,
        env={"PLAYBOOK_HOME": name},
    )
    for done in runs:
        assert done.returncode == 0 and done.stderr == "", done.stderr
    stats, listed, machine = (done.stdout for done in runs)
    assert ["receipts", "6", "(total", "cost", "$1.50)"] in [line.split() for line in stats.splitlines()]
    assert len(listed.splitlines()) == 1 + 6
    assert json.loads(machine)["receipts"] == 6


def _lose(path: Path, receipts: int) -> None:
    """Remove receipts from receipts.db behind playbook's back (another program)."""
    with sqlite3.connect(path / "receipts.db") as con:
        con.execute(
            "DELETE FROM receipt WHERE key IN (SELECT key FROM receipt WHERE key >= 'r' AND key < 's' LIMIT ?)",
            (receipts,),
        )
    con.close()


def test_accept_loss_accepts_what_a_lost_store_holds(home: Path) -> None:
    """`cache accept-loss --yes` does what store.accept_loss() does: a store that lost receipts, refused until
    then (the message names both ways out), runs again, even in a process that kept it open."""

    @pb.tool(name="again")
    def again(q: str) -> str:
        return q * 2

    @pb.play
    async def twice(row, ctx):  # type: ignore[no-untyped-def]
        return {"v": await ctx.tool(again, q=row.q)}

    kept = pb.ReceiptStore(home)  # a kernel's, open across the acceptance
    _lose(home, 2)
    with pytest.raises(pb.ReceiptError) as refused:
        pd.DataFrame({"q": ["x"]}).play.map(twice, store=kept, progress=False)
    assert "held 6 receipts" in str(refused.value) and "now holds 4" in str(refused.value)
    assert f"pb.ReceiptStore({str(home)!r}).accept_loss()" in str(refused.value)
    assert f"python -m playbook cache accept-loss --store {home}" in str(refused.value)
    _one_line_error(cli("cache", "accept-loss"), "held 6 receipts", "--yes", "not a terminal")
    done = cli("cache", "accept-loss", "--yes")
    assert (
        done.returncode == 0
        and done.stdout
        == f"accepted: the receipt store at {home} holds 4 receipts; runs on it go on from there\n"
    )
    out = pd.DataFrame({"q": ["x"]}).play.map(twice, store=kept, progress=False)
    assert out["v"].tolist() == ["xx"] and kept.lost is None
    kept.close()
    assert (
        cli("cache", "accept-loss").stdout
        == f"the receipt store at {home} has lost nothing: it holds 5 receipts\n"
    )


def test_looking_at_a_store_refused_as_lost_says_so_and_how_to_accept_it(home: Path) -> None:
    """The store deleted whole, then a run refused on the empty one made in its place: `cache
    stats` and `cache list` still show what it holds (exit 0), with one line on stderr saying runs
    on it are refused and naming `cache accept-loss`; once accepted, nothing more is said."""

    @pb.play
    async def noop(row, ctx):  # type: ignore[no-untyped-def]
        return {}

    shutil.rmtree(home)
    with pytest.raises(pb.ReceiptError):
        pd.DataFrame({"q": ["x"]}).play.map(noop, store=pb.ReceiptStore(home), progress=False)
    for args in (("cache", "stats"), ("cache", "list"), ("cache", "stats", "--json")):
        done = cli(*args)
        said = done.stderr.splitlines()
        assert done.returncode == 0 and len(said) == 1, (args, done.stderr)
        assert (
            said[0].startswith("playbook: runs on this store are refused: ")
            and "python -m playbook cache accept-loss" in said[0]
        )
    assert cli("cache", "stats").stdout.splitlines()[1].split()[:2] == ["receipts", "0"]
    assert cli("cache", "accept-loss", "--yes").returncode == 0 and cli("cache", "stats").stderr == ""


def test_a_store_deleted_whole_is_said_gone_and_only_accept_loss_makes_it_again(
    home: Path, tmp_path: Path
) -> None:
    """The store's directory deleted: `cache stats` fails saying it held receipts and is gone, and
    names `cache accept-loss`, which makes it again, empty; a path that never held a store is no store,
    for accept-loss too (a typo makes nothing), without the hint to set --store when --store was given."""
    shutil.rmtree(home)
    _one_line_error(
        cli("cache", "stats"),
        f"the receipt store at {home} held 6 receipts",
        "is gone",
        "cache accept-loss --store",
    )
    assert not home.exists()
    done = cli("cache", "accept-loss", "--yes")
    assert done.returncode == 0 and "holds 0 receipts" in done.stdout and (home / "receipts.db").is_file()
    assert cli("cache", "stats").returncode == 0
    typo = tmp_path / "stroe"
    for args in (("cache", "accept-loss", "--yes"), ("cache", "stats")):
        done = cli(*args, "--store", str(typo))
        _one_line_error(done, f"no receipt store at {typo}")
        assert "set --store" not in done.stderr and not typo.exists()


def test_a_misspelt_option_or_subcommand_gets_what_it_was_likely_meant_to_be(home: Path) -> None:
    """An unknown subcommand or option is argparse's usage error (exit 2, the usage on stderr)
    with the closest ones it takes: `rn`, `cache lst`, `cache list --limt 3`; one nothing is close
    to gets no guess."""
    cases = {
        ("rn",): "invalid choice: 'rn' (choose from 'run', 'cache') (did you mean run?)",
        (
            "cache",
            "lst",
        ): "invalid choice: 'lst' (choose from 'stats', 'list', 'spend', 'clear', 'accept-loss', 'export') (did you mean list?)",
        ("cache", "list", "--limt", "3"): "unrecognized arguments: --limt 3 (did you mean --limit?)",
        (
            "cache",
            "spend",
            "--bye",
            "tool",
            "--jsno",
        ): "unrecognized arguments: --bye tool --jsno (did you mean --by for --bye, --json for --jsno?)",
        ("cache", "list", "--zzz"): "unrecognized arguments: --zzz",
    }
    for args, said in cases.items():
        done = cli(*args)
        last = done.stderr.splitlines()[-1]
        assert done.returncode == 2 and done.stdout == "" and done.stderr.startswith("usage: "), (
            args,
            done.stderr,
        )
        assert last.endswith(said), (args, last)


def test_cache_reset_still_accepts_a_loss_and_names_accept_loss(home: Path) -> None:
    """`cache reset`, the old spelling, does what `cache accept-loss` does and says on stderr that
    it is deprecated, naming `cache accept-loss`."""
    _lose(home, 2)
    done = cli("cache", "reset", "--yes")
    assert done.returncode == 0 and "accepted: the receipt store at" in done.stdout, done.stderr
    assert "`cache reset` is deprecated" in done.stderr and "use `cache accept-loss`" in done.stderr
    assert pb.ReceiptStore(home).lost is None
    assert "reset" not in cli("cache", "--help").stdout  # listed no more
    assert "deprecated: use cache accept-loss" in cli("cache", "reset", "--help").stdout
    told = cli("cache", "rest").stderr
    assert "invalid choice: 'rest'" in told and "reset" not in told  # nor among the choices told
