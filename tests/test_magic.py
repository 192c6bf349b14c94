"""%%play in a real IPython kernel: define, run, output columns, options, errors, reruns."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel


class Kernel:
    """A live kernel: run code, get its stdout, error or displayed value."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc

    def run(self, code: str) -> dict[str, Any]:
        out: dict[str, Any] = {"stdout": "", "stderr": "", "error": None, "value": None}

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out[content["name"]] += content["text"]
            elif kind == "error":
                out["error"] = (content["ename"], content["evalue"], content["traceback"])
            elif kind == "execute_result":
                out["value"] = content["data"].get("text/plain")

        reply = self.kc.execute_interactive(textwrap.dedent(code), timeout=60, output_hook=hook)
        out["status"] = reply["content"]["status"]
        return out

    def value(self, expr: str) -> Any:
        got = self.run(f"print(repr({expr}))")
        assert got["error"] is None, got["error"]
        return eval(got["stdout"])


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
    assert all("output['domain']" in e and "did you forget an await? (line 3: domain = ctx.tool(double, n=row.n))" in e for e in errors)
    assert kernel.value("'domain' in out4.columns") is False


def test_options_reach_the_run(kernel: Kernel, tmp_path: Path) -> None:
    """--limit, --key, --concurrency, --store and --refresh are passed to the run."""
    kernel.run(f"store = pb.ReceiptStore({str(tmp_path / 's')!r})")
    got = kernel.run("""
        %%play limited --on df --out out3 --limit 2 --key n --concurrency 2 --store store --refresh
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


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("%%play bad --on nowhere", "expected a DataFrame in the namespace, found no such name"),
        ("%%play bad --on calls", "expected a DataFrame in the namespace, found a list"),
        ("%%play bad --concurrency many", "argument --concurrency: invalid int value"),
        ("%%play bad --store calls --on df", "expected a variable holding a pb.ReceiptStore, a directory or a redis:// URL, not list"),
        ("%%play 1bad", "must be a Python name"),
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
    assert kernel.value("out4['play_error'].tolist()[1]") == "ZeroDivisionError: division by zero (line 3: b = a / (row.n - 2))"
    got = kernel.run("""
        %%play worse
        a = = 1
    """)
    assert got["error"][0] == "SyntaxError"
    assert any("line 2" in part for part in got["error"][2])


def test_magic_help_lists_the_options(kernel: Kernel) -> None:
    """%%play? documents every option."""
    got = kernel.run("from playbook.magic import PlayMagics\nprint(PlayMagics.play.__doc__)")
    for option in (
        "--on",
        "--out",
        "--store",
        "--concurrency",
        "--refresh",
        "--limit",
        "--key",
        "--max-cost",
        "--max-wait",
        "--background",
    ):
        assert option in got["stdout"]


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
