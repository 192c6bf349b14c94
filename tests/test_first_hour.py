"""The first hour of a new user, in a real kernel where a user would have one: nothing paid again
by accident, counts that are true, and mistakes named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from jupyter_client.manager import start_new_kernel
from kernel import Kernel
from vtime import run_virtual

import playbook as pb


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    km, kc = start_new_kernel(kernel_name="python3")
    k = Kernel(kc)
    home = tmp_path_factory.mktemp("home")
    got = k.run(f"""
        import os, pandas as pd, playbook as pb
        os.environ["PLAYBOOK_HOME"] = {str(home)!r}
    """)
    assert got["error"] is None, got["error"]
    try:
        yield k
    finally:
        k.run("[server.stop() for server in list(pb.demo.server._started.values())]")
        kc.stop_channels()
        km.shutdown_kernel(now=True)


# -- the demo server's cell run again ----------------------------------------------------------

_SERVE_CELL = """
demo = pb.demo.serve(latency=0.0)
email = pb.demo.email_tool(demo)

async def enrich(row, ctx):
    return {"email": await ctx.tool(email, domain=row.domain, first=row.first)}

people = pd.DataFrame({"domain": [f"company{i}.com" for i in range(50)], "first": ["Ann"] * 50})
out = people.play.map(enrich, progress=False)
print(pb.last_run().stats.calls_executed, demo.stats()["requests"])
"""


def test_running_the_demo_servers_cell_again_pays_for_nothing(kernel: Kernel) -> None:
    """The cell that starts the demo provider and maps over it, run twice in one kernel: the second
    run finds the same server (the same URL, so the same receipts) and sends nothing."""
    first = kernel.run(_SERVE_CELL)
    assert first["error"] is None, first["error"]
    assert first["stdout"].split() == ["50", "50"]
    url = kernel.value("demo.url")
    again = kernel.run(_SERVE_CELL)
    assert again["error"] is None, again["error"]
    assert again["stdout"].split() == ["0", "0"] and kernel.value("demo.url") == url
    edited = kernel.run(
        _SERVE_CELL.replace("range(50)", "range(60)").replace("* 50", "* 60")
    )  # the cell edited: the same server still
    assert edited["stdout"].split() == ["10", "10"] and kernel.value("demo.url") == url


@pytest.mark.network
def test_serve_again_from_the_same_line_is_the_same_server_with_the_new_settings() -> None:
    def serve(**settings):  # type: ignore[no-untyped-def]  # one line calling serve(), as a cell's, run again and again
        return pb.demo.serve(**settings)

    a = serve(miss_rate=0.5)
    b = serve(rps=5)
    other = pb.demo.serve()
    own = pb.demo.serve(port=0)
    try:
        assert (
            b is a and a.settings.rps == 5 and a.settings.miss_rate != 0.5
        )  # settings as asked the second time
        assert other.url != a.url and own.url not in (a.url, other.url)  # another place, another server
        a.stop()
        c = serve(miss_rate=0.5)
        assert c is not a and c.running and serve() is c  # a stopped server is not handed out
        c.stop()
    finally:
        for server in (a, other, own):
            server.stop()


@pytest.mark.network
def test_serve_from_a_place_of_its_own_keeps_its_counters_apart(tmp_path: Path) -> None:
    """Two providers in one notebook (a main one and a backup) stay two servers."""
    main = pb.demo.serve(quota=3)
    backup = pb.demo.serve()
    try:
        assert main is not backup and main.settings.quota == 3 and backup.settings.quota != 3
    finally:
        main.stop()
        backup.stop()


# -- client errors are answers; every request is counted ----------------------------------------


def _bad_domains(n: int) -> pd.DataFrame:
    return pd.DataFrame({"domain": ["not a domain"] * n, "first": ["Ann"] * n, "n": range(n)})


def test_a_client_error_is_kept_as_the_calls_answer_and_not_asked_again(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """100 rows with the same bad domain (the demo answers 422): one request; the other rows get
    the same error from its receipt, and a rerun sends nothing.  The 422 is counted as paid (the
    provider counted it), the others as shared, then as from receipts."""
    email = pb.demo.email_tool(demo, provider=pb.Provider("acme-422"))

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"email": await ctx.tool(email, domain=row.domain, first=row.first)}  # every row asks the same

    frame = _bad_domains(100)
    run = frame.play.run(play, store=store, progress=False, concurrency=16)
    out = run.result
    assert out["play_status"].tolist() == ["failed"] * 100
    assert out["play_error"].nunique() == 1 and "HTTP 422" in out["play_error"].iloc[0]  # one message
    groups = (
        run.errors["group"].unique().tolist()
    )  # and one group, the paid one's and the shared ones', the tool's template, masked as messages are
    assert len(groups) == 1 and "(GET http://" in groups[0] and "/v1/email)" in groups[0], groups
    stats = pb.last_run().stats
    assert (
        demo.stats()["requests"] == 1
        and stats.calls_executed == 1
        and stats.calls_shared == 99
        and stats.calls_reused == 0
    )
    rerun = frame.play.run(play, store=store, progress=False)
    again = rerun.result
    assert again["play_error"].tolist() == out["play_error"].tolist() and demo.stats()["requests"] == 1
    assert rerun.errors["group"].unique().tolist() == groups
    assert pb.last_run().stats.calls_reused == 100 and pb.last_run().stats.calls_executed == 0
    forced = frame.head(1).play.map(play, store=store, progress=False, refresh=True)  # asked again on purpose
    assert forced["play_status"].tolist() == ["failed"] and demo.stats()["requests"] == 2


def test_requests_the_provider_saw_are_the_calls_the_run_counted(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """A flaky provider (a 503 on every third request), a strict one (429s past its rate) and bad
    inputs (422): every request it saw is a call the run counts, paid or failed."""
    demo.reset(fault_every=3, rps=20, burst=1, miss_rate=0.0)
    email = pb.demo.email_tool(demo, provider=pb.Provider("acme-counted", retries=6))
    frame = pd.DataFrame(
        {"domain": [f"c{i}.com" if i % 10 else "bad domain" for i in range(60)], "first": ["Al"] * 60}
    )

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"email": await ctx.tool(email, domain=row.domain, first=row.first)}

    # On virtual time (tests/vtime.py): the provider's rate and the tries' backoff pass at once.
    run_virtual(frame.play.amap(play, store=store, progress=False, concurrency=8))
    stats, seen = pb.last_run().stats, demo.stats()
    assert (
        seen["by_status"].get("503", 0) > 0
        and seen["by_status"].get("429", 0) > 0
        and seen["by_status"].get("422", 0) == 1
    )
    assert stats.calls_executed + stats.calls_failed == seen["requests"], (stats, seen["by_status"])


# -- an output never silently replaces an input -----------------------------------------------


def test_an_output_named_like_an_input_column_fails_its_row_unless_overwrite(store: pb.ReceiptStore) -> None:
    """``return {"a": row.a * 100}`` over a frame with ``a``: the rows fail naming the column and
    the fix, and the input stays; overwrite=True replaces it, and pays nothing again."""
    calls: list[int] = []

    @pb.tool(name="times100", version="1", cost=1.0)
    def times100(a: int) -> int:
        calls.append(a)
        return a * 100

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"a": await ctx.tool(times100, a=row.a)}

    frame = pd.DataFrame({"a": [1, 2, 3]})
    out = frame.play.map(play, store=store, progress=False)
    assert out["a"].tolist() == [1, 2, 3] and out["play_status"].tolist() == ["failed"] * 3
    assert (
        out["play_error"]
        .iloc[0]
        .startswith("OutputError: play 'play' returned 'a', an input column of the frame, with another value")
    )
    assert "overwrite=True" in out["play_error"].iloc[0] and calls == [1, 2, 3]
    replaced = frame.play.map(play, store=store, progress=False, overwrite=True)
    assert replaced["a"].tolist() == [100, 200, 300] and calls == [
        1,
        2,
        3,
    ]  # from the rows' memos: nothing paid again
    assert pb.last_run().stats.reused == 3


def test_the_command_line_and_the_magic_name_overwrite_too(tmp_path: Path) -> None:
    """`python -m playbook run` fails the rows whose output is named like an input column (exit 3,
    the file saying why), and --overwrite replaces it."""
    import warm

    (tmp_path / "in.csv").write_text("a\n1\n2\n")
    (tmp_path / "plays.py").write_text(
        "import playbook as pb\n\n@pb.play\nasync def up(row, ctx):\n    return {'a': row.a * 100}\n"
    )
    base = ["--store", str(tmp_path / "s"), "run", "plays.py:up", "--in", "in.csv"]
    # Started warm (tests/warm.py): a process of its own, without importing pandas anew.
    failed = warm.run(*base, "--out", "out.csv", module="playbook", cwd=tmp_path, timeout=60)
    assert failed.returncode == 3 and "returned 'a', an input column" in (tmp_path / "out.csv").read_text()
    done = warm.run(*base, "--out", "out2.csv", "--overwrite", module="playbook", cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert pd.read_csv(tmp_path / "out2.csv")["a"].tolist() == [100, 200]


# -- kill -9 keeps the memos of finished rows ----------------------------------------------------

_HANGING = """
import asyncio, os, sys
import pandas as pd
import playbook as pb

@pb.tool(name="quick", version="1")
async def quick(n: int) -> int:
    if n >= 10 and os.environ.get("HANG"):
        await asyncio.sleep(600)  # a provider that stops answering: the run waits, the kill comes
    return n * 2

@pb.play(name="hangs")
async def hangs(row, ctx):
    return {"m": await ctx.tool(quick, n=row.n)}

run = pd.DataFrame({"n": range(40)}).play.run(hangs, store=sys.argv[1], progress=False, concurrency=4)
print(run.stats.reused, run.stats.ok, flush=True)
"""


@pytest.mark.slow
def test_rows_finished_before_a_kill_are_reused_from_their_memos(tmp_path: Path) -> None:
    """10 rows finish, then every other row waits on a provider that stopped answering; kill -9 a
    second later: the rerun reuses the 10 from their memos (written within half a second), not
    only from their receipts."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script, store = tmp_path / "hangs.py", tmp_path / "store"
    script.write_text(_HANGING)
    proc = subprocess.Popen([sys.executable, str(script), str(store)], env={**os.environ, "HANG": "1"})
    deadline = time.monotonic() + 60
    while not _receipts(store) >= 10 and time.monotonic() < deadline:  # the 10 rows' receipts are on the disk
        time.sleep(0.1)
    time.sleep(1.0)  # their memos' half second, and then some; every other row waits on the provider
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    done = subprocess.run(
        [sys.executable, str(script), str(store)], capture_output=True, text=True, timeout=120
    )
    reused, ok = (int(n) for n in done.stdout.split())
    assert reused >= 10 and reused + ok == 40, done.stdout


def _receipts(store: Path) -> int:
    if not (store / "receipts.db").exists():
        return 0
    try:
        return int(pb.ReceiptStore(store, readonly=True).stats()["receipts"])
    except pb.ReceiptError:
        return 0


# -- tools are functions too; mistakes are named -----------------------------------------------


def test_a_python_tool_called_directly_runs_its_function_with_no_receipt(store: pb.ReceiptStore) -> None:
    @pb.tool(version="1")
    def up(s: str) -> str:
        return s.upper()

    @pb.tool(version="1")
    async def later(s: str) -> str:
        return s + "!"

    import asyncio

    assert up(s="q") == "Q" and up("q") == "Q" and asyncio.run(later(s="x")) == "x!"
    assert store.stats()["receipts"] == 0


def test_an_http_tool_called_directly_says_how_to_try_it(demo: pb.demo.DemoServer) -> None:
    email = pb.demo.email_tool(demo)
    with pytest.raises(TypeError) as raised:
        email(domain="acme.com", first="Ann")
    said = str(raised.value)
    assert (
        "await ctx.tool(tool, domain=..., first=...)" in said
        and "pd.DataFrame([{'domain': ..., 'first': ...}]).play.map(tool)" in said
    )


def _failed_with(play: object, frame: pd.DataFrame, store: pb.ReceiptStore) -> str:
    out = frame.play.map(play, store=store, progress=False)
    assert out["play_status"].tolist() == ["failed"] * len(frame)
    return str(out["play_error"].iloc[0])


def test_a_typo_in_a_column_or_a_tool_input_says_did_you_mean(store: pb.ReceiptStore) -> None:
    @pb.tool(version="1")
    def up(website: str) -> str:
        return website.upper()

    async def typo_column(row, ctx):  # type: ignore[no-untyped-def]
        return {"v": await ctx.tool(up, website=row.webiste)}

    async def typo_item(row, ctx):  # type: ignore[no-untyped-def]
        return {"v": await ctx.tool(up, website=row["webiste"])}

    async def typo_input(row, ctx):  # type: ignore[no-untyped-def]
        return {"v": await ctx.tool(up, webiste=row.website)}

    frame = pd.DataFrame({"website": ["a.com", "b.com"], "first": ["A", "B"]})
    assert _failed_with(typo_column, frame, store).startswith(
        "AttributeError: the row has no column 'webiste'"
    )
    assert "did you mean 'website'?" in _failed_with(typo_column, frame, store)
    assert "did you mean 'website'?" in _failed_with(typo_item, frame, store)
    assert "unexpected webiste; did you mean 'website' for 'webiste'?" in _failed_with(
        typo_input, frame, store
    )


def test_a_value_used_before_it_was_awaited_says_await(store: pb.ReceiptStore) -> None:
    @pb.tool(version="1")
    def up(s: str) -> str:
        return s.upper()

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        v = ctx.tool(up, s=row.s)
        return {"v": v.upper()}

    said = _failed_with(play, pd.DataFrame({"s": ["a"]}), store)
    assert said.startswith("AttributeError: 'coroutine' object has no attribute 'upper'")
    assert "did you forget an await? (line " in said and "v = ctx.tool(up, s=row.s))" in said


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            {"params": {"q": "{query"}},
            "params['q'] '{query': expected '}' before end of string (the '{' at position 0 is never closed",
        ),
        (
            {"url": "http://x/a}b"},
            "url 'http://x/a}b': Single '}' encountered in format string (the '}' at position 10 closes nothing",
        ),
        ({"json": {"x": [1, "{y"]}}, "json['x'][1] '{y'"),
        ({"headers": {"A": "{a.b}"}}, "headers['A'] '{a.b}': placeholder {a.b} must be a plain name"),
    ],
)
def test_a_bad_template_names_the_tool_the_field_and_the_position(options: dict, said: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(pb.PlayDefinitionError) as raised:
        pb.http_tool("lookup", method="GET", **{"url": "http://x/", **options})
    assert str(raised.value).startswith("http_tool 'lookup': ") and said in str(raised.value)


# -- grouped errors mask the values, not the tool's template nor the play's line -------------------


def test_an_error_group_keeps_the_tools_url_and_the_plays_line(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    from playbook.runtime.rows.grouping import message_group

    email = pb.demo.email_tool(demo)

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"e": await ctx.tool(email, domain=row.d, first="Ann")}

    run = pd.DataFrame({"d": ["bad 1", "bad 22"]}).play.run(play, store=store, progress=False)
    groups = run.errors["group"].unique().tolist()
    assert len(groups) == 1 and "(GET http://" in groups[0] and "/v1/email)" in groups[0], groups
    said = message_group("ValueError: no domain for 'Initech 42' (line 4: domain = lookup(row.n * 100))")
    assert said == "ValueError: no domain for 'Initech <n>' (line 4: domain = lookup(row.n * 100))"
