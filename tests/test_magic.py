"""%%play in a real IPython kernel: define, run, output columns, options, errors, reruns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.manager import start_new_kernel
from kernel import Kernel


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    km, kc = start_new_kernel(kernel_name="python3")
    k = Kernel(kc)
    home = tmp_path_factory.mktemp("home")
    k.run(f"""
        import os, pandas as pd, playbook as pb
        os.environ["PLAYBOOK_HOME"] = {str(home)!r}
        %load_ext playbook
        calls = []
        @pb.tool
        async def double(n: int) -> int:
            calls.append(n)
            return 2 * n
        df = pd.DataFrame({{"n": [1, 2, 3]}})
    """)
    try:
        yield k
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_assigned_names_become_columns(kernel: Kernel) -> None:
    """Without a return, the names the body assigns (not _private) are the output columns."""
    got = kernel.run("""
        %%play twice --on df --out out1
        _tmp = await ctx.tool(double, n=row.n)
        doubled = _tmp
        if row.n > 1:
            big = True
    """)
    assert got["error"] is None, got["error"]
    assert kernel.value("list(out1.columns)") == ["n", "doubled", "big", "play_status", "play_error"]
    assert kernel.value("out1['doubled'].tolist()") == [2, 4, 6]
    assert kernel.value("out1['big'].tolist()[1:]") == [True, True]
    assert kernel.value("type(twice).__name__") == "Play"


def test_estimate_runs_a_pilot_shows_what_the_rest_costs_and_asks_first(kernel: Kernel) -> None:
    """--estimate: a pilot of 20 rows, its estimate shown as a table, then the question; "n" runs
    nothing more (the rest skipped), "y" runs the rest, reusing the pilot's rows."""
    kernel.run("""
        priced_calls = []
        @pb.tool(cost=0.5)
        async def priced(n: int) -> int:
            priced_calls.append(n)
            return n + 100
        df30 = pd.DataFrame({"n": range(30)})
        df70 = pd.DataFrame({"n": range(30, 100)})
    """)
    cell = """
        %%play plus --on df30 --estimate --progress none --out out_est
        total = await ctx.tool(priced, n=row.n)
    """
    got = kernel.run(cell, answer="n")
    assert got["error"] is None, got["error"]
    assert got["asked"] == ["run the 10 rows left? [y/N] "]
    [shown] = [d for d in got["shown"] if "text/html" in d]
    assert (
        "<table" in shown["text/html"]
        and "30 rows: 20 already done; ~10 paid calls, $5.00" in shown["text/plain"]
    )
    assert kernel.value("out_est.play_status.value_counts().to_dict()") == {"ok": 20, "skipped": 10}
    got = kernel.run(cell.replace("df30", "df70"), answer="y")
    assert got["error"] is None and got["asked"] == ["run the 50 rows left? [y/N] "], got
    assert kernel.value("out_est.play_status.value_counts().to_dict()") == {"reused": 20, "ok": 50}
    assert (
        kernel.value("len(priced_calls)") == 20 + 20 + 50
    )  # each call paid once: the pilots', then the rows left


def test_explicit_return_is_the_output(kernel: Kernel) -> None:
    """With a return, its value is the row's output; the result is the cell's value without --out."""
    got = kernel.run("""
        %%play tripled --on df
        value = await ctx.tool(double, n=row.n)
        return {"t": value + row.n}
    """)
    assert got["error"] is None, got["error"]
    assert "t" in got["value"] and "play_status" in got["value"]
    assert kernel.value("pb.last_run().result['t'].tolist()") == [3, 6, 9]


def test_without_on_the_cell_only_defines_the_play(kernel: Kernel) -> None:
    """Without --on, the cell defines the play and runs nothing."""
    before = kernel.value("len(calls)")
    got = kernel.run("""
        %%play later
        x = await ctx.tool(double, n=row.n + 100)
    """)
    assert got["error"] is None and got["value"] is None
    assert kernel.value("len(calls)") == before
    assert kernel.value("df.play.map(later, progress=False)['x'].tolist()") == [202, 204, 206]


def test_rerun_after_an_edit_reuses_receipts(kernel: Kernel) -> None:
    """Running the cell again costs nothing; after an edit, its rows run again but calls hit receipts."""
    cell = """
        %%play edited --on df --out out2
        a = await ctx.tool(double, n=row.n + 10)
    """
    kernel.run(cell)
    before = kernel.value("len(calls)")
    kernel.run(cell)
    assert kernel.value("pb.last_run().stats.reused") == 3
    kernel.run(cell + "    b = a + 1\n")
    assert kernel.value("pb.last_run().stats.ok") == 3
    assert kernel.value("len(calls)") == before
    assert kernel.value("out2['b'].tolist()") == [23, 25, 27]


def test_a_notebook_global_rebound_runs_the_rows_again(kernel: Kernel) -> None:
    """A %%play cell and an @pb.play cell reading a global of the notebook: rebinding it in another
    cell makes the next run run the rows with the new value (not their memos)."""
    kernel.run("OFFSET = 100")
    cell = """
        %%play shifted --on df --out out9
        a = await ctx.tool(double, n=row.n + OFFSET)
    """
    kernel.run(cell)
    kernel.run("OFFSET = 200")
    kernel.run(cell)
    assert kernel.value("pb.last_run().stats.ok") == 3 and kernel.value("out9['a'].tolist()") == [
        402,
        404,
        406,
    ]
    kernel.run("""
        @pb.play
        async def offset(row, ctx):
            return {"a": await ctx.tool(double, n=row.n + OFFSET)}
        first = df.play.map(offset, progress=False)
        OFFSET = 300
        second = df.play.map(offset, progress=False)
    """)
    assert (
        kernel.value("second['a'].tolist()") == [602, 604, 606]
        and kernel.value("pb.last_run().stats.ok") == 3
    )


def test_a_forgotten_await_in_a_cell_names_the_cells_line(kernel: Kernel) -> None:
    """`domain = ctx.tool(...)` without await fails each row with "did you forget an await?" and the cell's
    own line; no coroutine lands in the result."""
    got = kernel.run("""
        %%play forgot --on df --out out4
        x = 1
        domain = ctx.tool(double, n=row.n)
    """)
    assert got["error"] is None, got["error"]
    assert kernel.value("out4['play_status'].tolist()") == ["failed"] * 3
    errors = kernel.value("out4['play_error'].tolist()")
    assert all(
        "output['domain']" in e
        and "did you forget an await? (line 3: domain = ctx.tool(double, n=row.n))" in e
        for e in errors
    )
    assert kernel.value("'domain' in out4.columns") is False


def test_options_reach_the_run(kernel: Kernel, tmp_path: Path) -> None:
    """--limit, --id-columns, --concurrency, --store and --refresh are passed to the run."""
    kernel.run(f"store = pb.ReceiptStore({str(tmp_path / 's')!r})")
    got = kernel.run("""
        %%play limited --on df --out out3 --limit 2 --id-columns n --concurrency 2 --store store --refresh
        y = await ctx.tool(double, n=row.n)
    """)
    assert got["error"] is None, got["error"]
    assert kernel.value("out3['play_status'].tolist()") == ["ok", "ok"]
    assert kernel.value("store.stats()['receipts']") == 2
    kernel.run(f"where = {str(tmp_path / 'd')!r}")
    got = kernel.run("""
        %%play in_dir --on df --out out5 --store where
        y = await ctx.tool(double, n=row.n)
    """)
    assert got["error"] is None, got["error"]
    assert kernel.value("pb.ReceiptStore(where).stats()['receipts']") == 3
    kernel.run(f"import os; os.chdir({str(tmp_path)!r})")
    got = kernel.run("""
        %%play in_words --on df --out out6 --store receipts_here
        y = await ctx.tool(double, n=row.n)
    """)  # not a variable: a directory, as the same flag means on the command line
    assert got["error"] is None, got["error"]
    assert kernel.value("pb.ReceiptStore('receipts_here').stats()['receipts']") == 3


def test_the_old_flag_key_still_names_the_row_id_and_says_its_new_name(
    kernel: Kernel, tmp_path: Path
) -> None:
    """``--key``, the old spelling of ``--id-columns``, still runs; the cell shows the
    DeprecationWarning naming ``--id-columns`` (attributed to the cell, so IPython shows it)."""
    kernel.run(f"old_store = pb.ReceiptStore({str(tmp_path / 'k')!r})")
    got = kernel.run("""
        %%play keyed --on df --out out7 --key n --store old_store
        y = await ctx.tool(double, n=row.n)
    """)
    assert got["error"] is None, got["error"]
    assert kernel.value("out7['play_status'].tolist()") == ["ok", "ok", "ok"]
    assert "RenamedWarning" in got["stderr"] and "use --id-columns" in got["stderr"], got["stderr"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "%%play bad --on nowhere",
            "expected a pandas, Polars or Dask DataFrame in the namespace, found no such name",
        ),
        (
            "%%play bad --on calls",
            "expected a pandas, Polars or Dask DataFrame in the namespace, found a list",
        ),
        ("%%play bad --concurrency many", "argument --concurrency: expected a whole number >= 1, not 'many'"),
        (
            "%%play bad --on df --concurrency 0",
            "argument --concurrency: expected a whole number >= 1, not '0'",
        ),
        ("%%play bad --on df --limit 2.5", "argument --limit: expected a whole number >= 0, not '2.5'"),
        ("%%play bad --on df --max-cost lots", "argument --max-cost: expected a number >= 0, not 'lots'"),
        ("%%play bad --on df --max-wait nan", "argument --max-wait: expected a number >= 0, not 'nan'"),
        (
            "%%play bad --on df --refresh sometimes",
            "argument --refresh: invalid choice: 'sometimes' (choose from 'rows', 'all')",
        ),
        ("%%play bad --on df --progress loud", "argument --progress: invalid choice: 'loud'"),
        (
            "%%play bad --on df --on-error ignore",
            "argument --on-error: invalid choice: 'ignore' (choose from 'isolate', 'raise')",
        ),
        ("%%play bad --on df --fixtures nowhere.jsonl", "%%play --fixtures nowhere.jsonl: no such file"),
        (
            "%%play bad --store calls --on df",
            "expected a variable holding a pb.ReceiptStore, a directory or a redis:// URL, not list",
        ),
        ("%%play 1bad", "must be a Python name"),
        (
            "%%play bad --on df --id-colums lead_id",
            "unrecognized arguments: --id-colums lead_id (did you mean --id-columns?)",
        ),
        ("%%play bad --on df --on-error isolat", "(choose from 'isolate', 'raise') (did you mean isolate?)"),
    ],
)
def test_bad_options_are_usage_errors(kernel: Kernel, line: str, message: str) -> None:
    """Bad options raise UsageError, shown without a traceback."""
    got = kernel.run(f"{line}\nx = 1\n")
    assert got["status"] == "error"
    assert got["stderr"].startswith("UsageError: ") and message in got["stderr"]
    assert "Traceback" not in got["stderr"] and got["error"] is None  # IPython shows it as one line


def test_an_error_in_the_body_points_at_the_users_line(kernel: Kernel) -> None:
    """A row that fails in the body names the cell's own line; a syntax error names it too."""
    got = kernel.run("""
        %%play broken --on df --out out4
        a = await ctx.tool(double, n=row.n)
        b = a / (row.n - 2)
    """)
    assert got["error"] is None, got["error"]
    assert (
        kernel.value("out4['play_error'].tolist()[1]")
        == "ZeroDivisionError: division by zero (line 3: b = a / (row.n - 2))"
    )
    got = kernel.run("""
        %%play worse
        a = = 1
    """)
    assert got["error"][0] == "SyntaxError"
    assert any("line 2" in part for part in got["error"][2])


def test_magic_help_lists_the_options(kernel: Kernel) -> None:
    """%%play? documents an option for every option df.play.run() takes, and the magic's own."""
    got = kernel.run("%%play?")
    assert got["error"] is None and "Define a play from the cell's body" in got["page"]
    run_options = kernel.value(
        "[p.name for p in __import__('inspect').signature(pd.DataFrame.play.run).parameters.values() if p.kind is p.KEYWORD_ONLY]"
    )
    assert {"concurrency", "refresh", "on_error", "progress", "fixtures", "background"} <= set(run_options)
    for option in ["--on", "--out", *("--" + name.replace("_", "-") for name in run_options)]:
        assert option in got["page"], option
    assert "--refresh [rows|all]" in got["page"] and "--progress auto|widget|text|none" in got["page"]
    assert "--on-error isolate|raise" in got["page"] and "--fixtures FILE" in got["page"]


def test_refresh_all_pays_again_and_bare_refresh_reuses_receipts(kernel: Kernel) -> None:
    """--refresh (rows) runs every row again from receipts; --refresh all pays for every call again."""
    cell = """
        %%play again --on df --out out6 {}
        w = await ctx.tool(double, n=row.n + 1000)
    """
    kernel.run(cell.format(""))
    before = kernel.value("len(calls)")
    got = kernel.run(cell.format("--refresh"))
    assert got["error"] is None, got["error"]
    assert kernel.value("(pb.last_run().stats.ok, pb.last_run().stats.reused, len(calls))") == (3, 0, before)
    got = kernel.run(cell.format("--refresh all"))
    assert got["error"] is None, got["error"]
    assert kernel.value("(pb.last_run().stats.ok, len(calls))") == (3, before + 3)


def test_on_error_and_progress_reach_the_run(kernel: Kernel) -> None:
    """--on-error raise stops the cell at the failing row; --progress text writes the bar to stderr, none
    shows no view at all, and the default shows the widget."""
    got = kernel.run("""
        %%play fragile --on df --on-error raise --progress none
        v = 1 / (row.n - 2)
    """)
    assert got["status"] == "error" and "ZeroDivisionError" in str(got["error"])
    quiet = kernel.run("%%play quiet --on df --out out7 --progress none\nq = row.n\n")
    assert quiet["error"] is None and quiet["stderr"] == "" and kernel.value("pb.last_run().view") is None
    text = kernel.run("%%play loud --on df --out out7 --progress text --refresh\nq = row.n\n")
    assert text["error"] is None and "loud" in text["stderr"] and "ok 3" in text["stderr"]
    assert kernel.value("type(pb.last_run().view).__name__") == "TextView"
    kernel.run("%%play shown --on df --out out7\nq = row.n\n")
    assert kernel.value("type(pb.last_run().view).__name__") == "WidgetView"


def test_fixtures_answer_the_calls(kernel: Kernel, tmp_path: Path) -> None:
    """--fixtures FILE answers tool calls from the file: no call is made, and a call it lacks fails its row."""
    fixture = tmp_path / "double.jsonl"
    fixture.write_text('{"tool":"double","input":{"n":1},"output":100,"miss":false,"cost":0.0}\n')
    before = kernel.value("len(calls)")
    got = kernel.run(f"""
        %%play replayed --on df --out out8 --fixtures {fixture}
        r = await ctx.tool(double, n=row.n)
    """)
    assert got["error"] is None, got["error"]
    assert kernel.value("out8['play_status'].tolist()") == ["ok", "failed", "failed"]
    assert kernel.value("out8['r'].tolist()[0]") == 100
    assert "double" in kernel.value("out8['play_error'].tolist()[1]")
    assert kernel.value("len(calls)") == before


def test_background_returns_the_run_at_once_and_the_cell_ends(kernel: Kernel) -> None:
    """--background stores the Run in --out and ends the cell while it runs; run.wait() gives the columns."""
    got = kernel.run("""
        %%play sleepy --on df --out job --background
        import asyncio
        await asyncio.sleep(0.3)
        z = await ctx.tool(double, n=row.n + 50)
    """)
    assert got["error"] is None, got["error"]
    assert kernel.value("(type(job).__name__, job.running)") == ("Run", True)
    assert kernel.value("job.wait()['z'].tolist()") == [102, 104, 106]
    assert kernel.value("list(job.result.columns)") == ["n", "z", "play_status", "play_error"]
    assert kernel.value("(job.running, job.stats.ok)") == (False, 3)


def test_a_polars_frame_runs_and_comes_back_polars(kernel: Kernel) -> None:
    """--on a Polars DataFrame runs the cell over its rows and stores a Polars DataFrame."""
    got = kernel.run("""
        import polars as pl
        pdf = pl.DataFrame({"n": [4, 5]})
    """)
    assert got["error"] is None, got["error"]
    got = kernel.run(
        "%%play on_polars --on pdf --out out9 --progress none\nd = await ctx.tool(double, n=row.n)\n"
    )
    assert got["error"] is None, got["error"]
    assert kernel.value(
        "(type(out9).__module__.split('.')[0], out9['d'].to_list(), out9['play_status'].to_list())"
    ) == (
        "polars",
        [8, 10],
        ["ok", "ok"],
    )
