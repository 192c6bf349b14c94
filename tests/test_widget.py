"""The live widget in a real kernel: shown for progress="auto", replaced by the static summary at
the end, and its Stop and Retry buttons act on a background run."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

from playbook.ui.html import LIMIT

TIME = r"(?:\w{3} \d\d )?\d\d:\d\d:\d\d"  # a time of day, with its date when it is not today

WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    km, kc = start_new_kernel(kernel_name="python3")
    home = tmp_path_factory.mktemp("home")
    kc.execute_interactive(
        textwrap.dedent(f"""
        import asyncio, os, pandas as pd, playbook as pb
        os.environ["PLAYBOOK_HOME"] = {str(home)!r}
        calls = []
        @pb.tool
        async def slow(n: int) -> int:
            calls.append(n)
            await asyncio.sleep(0.05)
            if n == 3:
                raise ValueError("three")
            return n
    """),
        timeout=60,
    )
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _run(kc: Any, code: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    reply = kc.execute_interactive(textwrap.dedent(code), timeout=60, output_hook=messages.append)
    assert reply["content"]["status"] == "ok", [
        m["content"] for m in messages if m["msg_type"] in ("error", "stream")
    ]
    return messages


def test_auto_progress_shows_the_widget_and_leaves_the_summary(kernel: Any) -> None:
    """In a kernel, map() shows the live panel, then replaces it with the run's static HTML summary."""
    messages = _run(kernel, 'out = pd.DataFrame({"n": range(80)}).play.map(slow, concurrency=4)')  # ~1 s
    shown = [m for m in messages if m["msg_type"] == "display_data" and WIDGET in m["content"]["data"]]
    assert len(shown) == 1
    display_id = shown[0]["content"]["transient"]["display_id"]
    updates = [m for m in messages if m["msg_type"] == "update_display_data"]
    assert updates and updates[-1]["content"]["transient"]["display_id"] == display_id
    html = updates[-1]["content"]["data"]["text/html"]
    assert "<td>80</td><td>79</td>" in html and "three" in html  # 80 rows, 79 ok; the error grouped
    values = [
        m["content"]["data"]["state"]["status"]
        for m in messages
        if m["msg_type"] == "comm_msg" and "status" in m["content"]["data"].get("state", {})
    ]
    bars = [v for v in values if 'class="pb-rest"' in v or 'class="pb-ok"' in v]
    assert (
        len({bar.partition("</svg>")[0] for bar in bars}) >= 2
    )  # the bar (the rows as an SVG status bar) moved while the run went on
    opened = [m["content"]["data"]["state"] for m in messages if m["msg_type"] == "comm_open"]
    panels = [state for state in opened if state.get("_model_name") == "AnyModel"]
    assert len(panels) == 1 and panels[0]["buttons"] == []  # one anywidget; a blocking run's has no buttons
    assert "export default" in panels[0]["_esm"]  # the front end comes with the widget: nothing to install


def test_buttons_stop_and_retry_a_background_run(kernel: Any) -> None:
    """Stop ends a background run (rows not run are skipped); Retry failed runs the failed rows again."""
    _run(
        kernel,
        """
        import tempfile
        fresh = pb.ReceiptStore(tempfile.mkdtemp())  # nothing reused from the other tests
        run = pd.DataFrame({"n": range(200)}).play.run(slow, concurrency=2, background=True, store=fresh)
        await asyncio.sleep(0.8)  # past the panel's delay
    """,
    )
    _press(kernel, "run", "stop")
    _run(kernel, "await asyncio.sleep(0.2)")
    messages = _run(kernel, "print(run.running, run.stats.skipped > 100, run.stats.failed)")
    lines = [m["content"]["text"] for m in messages if m["msg_type"] == "stream"]
    assert "".join(lines).split() == ["False", "True", "1"]
    _run(kernel, "before = calls.count(3)")
    _press(kernel, "run", "retry_failed")
    messages = _run(
        kernel,
        """
        await asyncio.sleep(0.5)
        again = pb.last_run()  # the retry's own run: the panel shows it
        print(run.running, run.stats.failed, run.result.loc[3, "play_status"], calls.count(3) - before)
        print(again.previous is run, again.stats.total, again.stats.failed, list(again.view.tally.failed) == [3])
    """,
    )
    lines = [m["content"]["text"] for m in messages if m["msg_type"] == "stream"]
    assert "".join(lines).split() == [
        "False",
        "1",
        "failed",
        "1",
        "True",
        "1",
        "1",
        "True",
    ]  # it ran again, and failed again


def test_a_run_over_at_once_shows_only_its_summary(kernel: Any) -> None:
    """A run shorter than the panel's delay shows no live panel, just the static summary."""
    messages = _run(kernel, 'quick = pd.DataFrame({"n": [5000, 5001]}).play.map(slow)')
    assert not [m for m in messages if m["msg_type"] == "display_data" and WIDGET in m["content"]["data"]]
    summaries = [
        m for m in messages if m["msg_type"] == "display_data" and "text/html" in m["content"]["data"]
    ]
    assert len(summaries) == 1 and "<td>2</td><td>2</td>" in summaries[0]["content"]["data"]["text/html"]


def test_the_live_panel_caps_its_tables_and_counts_down_the_hold(kernel: Any) -> None:
    """Mid-run, the panel says in one line how many rows are parked on whose hold until when, lists the
    largest error groups, capped, shows the held provider with the seconds left, the rows as a stacked
    bar and the provider as a chart; no refresh it sends grows with the number of rows."""
    messages = _run(
        kernel,
        """
        import json, tempfile
        quota = pb.Provider("quota", max_wait=1)
        @pb.tool(provider=quota)
        async def limited(n: int) -> int:
            raise pb.ToolError("daily quota exceeded", status=429, retry_after=3600)
        @pb.play
        async def mixed(row, ctx):
            await asyncio.sleep(0.02)
            if row.n % 2:  # 40 kinds of error, each raised by many rows with a message of its own
                raise type(f"Odd{row.n % 80}Error", (ValueError,), {})(f"row {row.n} is odd")
            if row.n % 4 == 0:
                return {"v": await ctx.tool(limited, n=row.n)}
            return {"v": row.n}
        live = pd.DataFrame({"n": range(600)}).play.run(mixed, concurrency=4, background=True, store=pb.ReceiptStore(tempfile.mkdtemp()))
        await asyncio.sleep(1.6)  # past the panel's delay, before the end (600 x 0.02 s / 4 = 3 s)
        view = live.view
        print(json.dumps([live.running, live.stats.failed, live.stats.parked, view.panel.tables, view.panel.status, view.panel.pictures]))
        live.wait()
    """,
    )
    printed = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    running, failed, parked, tables, providers, pictures = json.loads(printed)
    assert running and failed > LIMIT and parked > LIMIT
    parked_rows = re.search(r"parked rows</div><table>.*?</table>", tables, re.S)
    errors = re.search(r"errors</div><table>.*?</table>", tables, re.S)
    assert parked_rows and errors
    # every parked row waits on quota's one hold: a line (two if they straddle a minute), not a line per row
    lines = re.findall(
        rf"<tr><td>([\d,]+)</td><td>held past the wait budget</td><td>quota</td><td>{TIME} \(HTTP 429\)</td>",
        tables,
    )
    assert 1 <= len(lines) <= 2 and parked_rows.group(0).count("<tr>") == len(lines) + 1
    assert errors.group(0).count("<tr>") == LIMIT + 1  # the largest groups, + the header
    assert re.search(r"… and [\d,]+ more groups", tables)
    assert "Odd1Error: row &lt;n&gt; is odd (line " in errors.group(0)
    assert (
        providers.count("<svg") == 1 and 'class="pb-failed"' in providers and 'class="pb-parked"' in providers
    )
    assert pictures.count("<svg") == 1 and "<title>quota: " in pictures
    countdown = re.search(
        rf"<td>quota</td><td>held (\d+)m (\d\d)s more, until {TIME} \(HTTP 429\)</td>", providers
    )
    assert countdown and 3500 < int(countdown.group(1)) * 60 + int(countdown.group(2)) <= 3600
    updates = [m for m in messages if m["msg_type"] == "comm_msg"]
    assert len(updates) > 10  # refreshed all along
    assert max(len(json.dumps(m["content"])) for m in updates) < 12_000  # capped: no update carries every row
    assert max(_refreshes(updates)) <= 20_000  # nor does a refresh (the messages it sends at once)
    summary = [m for m in messages if m["msg_type"] == "update_display_data"][-1]["content"]["data"][
        "text/html"
    ]
    assert "<td>600</td>" in summary and "… and" in summary


def test_a_provider_going_down_redraws_the_panel_at_once(kernel: Any) -> None:
    """When a provider goes down the panel is redrawn there and then: down since when and why, the next probe
    counting down, its rate with the calls in flight it allows; the counters tell paid calls from local ones."""
    messages = _run(
        kernel,
        """
        import json, tempfile, time
        from playbook.events import ProviderDown
        from playbook.providers.provider import governor
        acme = pb.Provider("acme", rps=200, concurrency=3)
        @pb.tool(provider=acme)
        async def remote(n: int) -> int:
            await asyncio.sleep(0.02)
            return n
        @pb.play
        async def both(row, ctx):
            return {"v": await ctx.tool(remote, n=await ctx.tool(slow, n=row.n + 1000))}
        outage = pd.DataFrame({"n": range(200)}).play.run(both, concurrency=3, background=True, store=pb.ReceiptStore(tempfile.mkdtemp()))
        await asyncio.sleep(0.8)  # past the panel's delay
        before = outage.view.panel.status
        gov = governor(acme)
        gov.health.down = True  # read from the provider's health gate
        gov.down_error, gov.probe_at = "ConnectError: connection refused", time.time() + 30
        outage.state.emit(ProviderDown("acme", "ConnectError: connection refused"))
        after = outage.view.panel.status  # no await since the event: not the timer's redraw
        outage.stop()
        while outage.running:
            await asyncio.sleep(0.05)
        print(json.dumps([before, after]))
    """,
    )
    before, after = json.loads("".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream"))
    assert "down since" not in before and "<th>calls local</th>" in after
    down = re.search(
        rf"<td>acme</td><td>down since {TIME}: ConnectError: connection refused; next probe in (\d+)s, "
        rf"at {TIME}</td><td>[\d.]+/s, ≤3 in flight</td>",
        after,
    )
    assert down and 28 <= int(down.group(1)) <= 30, after
    counters = re.search(r"<th>cost saved</th></tr></thead><tbody><tr>((?:<td>[^<]*</td>)+)</tr>", after)
    assert counters, after
    paid, failed, shared, reused, local = (
        int(v) for v in re.findall(r"<td>([^<]*)</td>", counters.group(1))[7:12]
    )
    assert (
        paid > 0 and local >= paid and failed == shared == reused == 0
    )  # each row: a local call, then a paid one


def test_a_background_run_shows_its_panel_in_its_own_cell_and_ends_as_the_summary(kernel: Any) -> None:
    """The cell that starts a background run shows the panel before it ends; the finished panel holds
    the summary and the Retry buttons (Retry failed enabled: a row failed), and no live part."""
    started = _run(
        kernel,
        """
        import tempfile
        job = pd.DataFrame({"n": range(40)}).play.run(slow, concurrency=4, background=True, store=pb.ReceiptStore(tempfile.mkdtemp()))
    """,
    )
    assert [m for m in started if m["msg_type"] == "display_data" and WIDGET in m["content"]["data"]]
    messages = _run(
        kernel,
        """
        import json
        job.wait()
        panel = job.view.panel
        print(json.dumps([[(b, b in panel.disabled) for b in panel.buttons], panel.summary, panel.status + panel.tables + panel.pictures == ""]))
    """,
    )
    buttons, summary, closed = json.loads(
        "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    )
    assert buttons == [["retry_parked", True], ["retry_failed", False]] and closed
    assert "playbook-run" in summary and "<td>40</td><td>39</td>" in summary


def test_a_finished_run_is_not_kept_alive_by_its_panel(kernel: Any) -> None:
    """Once a blocking run has ended, its panel's widgets are closed (the kernel's registry of widgets
    does not grow) and nothing holds it in a cycle: dropping it frees the run and its rows at once,
    without waiting for the cyclic garbage collector."""
    messages = _run(
        kernel,
        """
        import gc, tempfile, weakref
        from ipywidgets.widgets.widget import _instances
        before = len(_instances)
        gc.collect()
        gc.disable()
        try:
            first = pd.DataFrame({"n": range(80)}).play.run(slow, concurrency=4, store=pb.ReceiptStore(tempfile.mkdtemp()))
            shown = first.view.handle is not None and first.view.panel is None  # the panel was drawn, then let go
            ref = weakref.ref(first)
            del first
            pd.DataFrame({"n": [1]}).play.map(slow)  # the last run is now another one
            print(shown, ref() is None, len(_instances) - before)
        finally:
            gc.enable()
    """,
    )
    assert "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream").split() == [
        "True",
        "True",
        "0",
    ]


def test_cells_queued_behind_a_blocking_map_run_after_it_in_order(kernel: Any) -> None:
    """Run All sends every cell at once: the ones queued behind a blocking map() wait for it, then run, in order."""
    codes = [
        'queued = []\nqueued.append(len(pd.DataFrame({"n": range(400, 440)}).play.map(slow, concurrency=4)))',  # ~0.5 s
        "queued.append('second')",
        "print(queued)",
    ]
    ids = [kernel.execute(code) for code in codes]  # no waiting in between, like Run All
    replies = {}
    while len(replies) < len(ids):
        reply = kernel.get_shell_msg(timeout=60)
        replies[reply["parent_header"]["msg_id"]] = reply["content"]
    assert [replies[i]["status"] for i in ids] == ["ok", "ok", "ok"], [replies[i].get("evalue") for i in ids]
    printed = []
    while not printed:
        msg = kernel.get_iopub_msg(timeout=10)
        if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == ids[2]:
            printed.append(msg["content"]["text"])
    assert printed == ["[40, 'second']\n"]


def _press(kc: Any, run: str, button: str) -> None:
    """Click ``button`` on the panel of ``run`` (a name in the kernel) as a front end does: a
    custom comm message to the widget, on the kernel's shell channel."""
    messages = _run(kc, f"print({run}.view.panel.comm.comm_id)")
    comm_id = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream").strip()
    content = {"comm_id": comm_id, "data": {"method": "custom", "content": {"press": button}}}
    kc.session.send(kc.shell_channel.socket, kc.session.msg("comm_msg", content))


def _refreshes(updates: list[dict[str, Any]]) -> list[int]:
    """Bytes of each refresh: one refresh sends a message per widget that changed, at once."""
    sizes: list[int] = []
    last = None
    for m in updates:
        at = datetime.fromisoformat(str(m["header"]["date"])).timestamp()
        if last is None or at - last > 0.02:
            sizes.append(0)
        sizes[-1] += len(json.dumps(m["content"]))
        last = at
    return sizes


def test_a_lone_surrogate_in_a_row_s_error_costs_nothing(kernel: Any) -> None:
    """Scraped text can hold a lone surrogate, which no UTF-8 message can carry: the panel shows it
    as U+FFFD, keeps refreshing, and the run returns every row (a blocking map and a background run)."""
    messages = _run(
        kernel,
        """
        import json, tempfile
        @pb.tool
        async def scraped(n: int) -> int:
            await asyncio.sleep(0.01)
            if n % 10 == 3:
                raise ValueError(f"bad text \\ud800 in row {n} \\udfff")
            return n
        out = pd.DataFrame({"n": range(200)}).play.map(scraped, concurrency=2, store=pb.ReceiptStore(tempfile.mkdtemp()))
        behind = pd.DataFrame({"n": range(200)}).play.run(scraped, concurrency=2, background=True, store=pb.ReceiptStore(tempfile.mkdtemp()))
        await asyncio.sleep(0.8)
        tables = behind.view.panel.tables  # mid-run, after the first failures
        behind.wait()
        print(json.dumps([len(out), int((out["play_status"] == "failed").sum()), behind.stats.failed, behind.view.broken, tables.count("\\ufffd"), "bad text" in behind.view.panel.summary]))
    """,
    )
    printed = json.loads("".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream"))
    rows, failed, failed_behind, broken, replaced, summarised = printed
    assert (rows, failed, failed_behind, broken) == (200, 20, 20, None)
    assert replaced >= 1 and summarised
    summaries = [
        m["content"]["data"]["text/html"] for m in messages if m["msg_type"] == "update_display_data"
    ]
    assert any("bad text \ufffd in row" in html for html in summaries)


def test_a_finished_background_run_keeps_its_panel_and_retry_goes_live_in_it(kernel: Any) -> None:
    """A background run's output ends as the widget and the summary together (JupyterLab keeps
    the widget and its Retry buttons; a saved notebook shows the summary); Retry runs again in the
    same panel, live again with Stop, and ends as the summary again: no second widget is made
    (marimo could not show one made outside a cell)."""
    _run(
        kernel,
        """
        import tempfile
        again = pd.DataFrame({"n": range(40)}).play.run(slow, concurrency=4, background=True, store=pb.ReceiptStore(tempfile.mkdtemp()))
        again.wait()
    """,
    )
    ended = _run(
        kernel,
        """
        from ipywidgets.widgets.widget import _instances
        panel, widgets, shown = again.view.panel, len(_instances), []
        panel.observe(lambda change: shown.append(list(change["new"])), names="buttons")
        print(panel.buttons, panel.disabled)
    """,
    )
    assert "".join(m["content"]["text"] for m in ended if m["msg_type"] == "stream").split("] [") == [
        "['retry_parked', 'retry_failed'",
        "'retry_parked']\n",
    ]
    _press(kernel, "again", "retry_failed")
    messages = _run(
        kernel,
        """
        import json
        retry = pb.last_run()
        retry.wait()
        print(json.dumps([retry is not again, retry.stats.total, again.view.panel is panel, len(_instances) - widgets, shown, "playbook-run" in panel.summary]))
    """,
    )
    printed = json.loads("".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream"))
    assert printed == [
        True,
        1,
        True,
        0,  # no second widget: the same panel
        [
            ["stop", "retry_parked", "retry_failed"],
            ["retry_parked", "retry_failed"],
        ],  # live again, then ended
        True,
    ]


def test_a_background_run_s_output_holds_the_widget_and_the_summary(kernel: Any) -> None:
    """The end of a background run updates its output with both: the widget (kept where widgets
    render) and the static summary (what a front end without it shows)."""
    messages = _run(
        kernel,
        """
        import tempfile
        kept = pd.DataFrame({"n": range(20)}).play.run(slow, concurrency=4, background=True, store=pb.ReceiptStore(tempfile.mkdtemp()))
        kept.wait()
    """,
    )
    last = [m for m in messages if m["msg_type"] == "update_display_data"][-1]["content"]["data"]
    assert (
        WIDGET in last
        and "playbook-run" in last["text/html"]
        and "<td>20</td><td>19</td>" in last["text/html"]
    )


def _run_in_cell(kc: Any, code: str, cell: str) -> list[dict[str, Any]]:
    """Run ``code`` as JupyterLab runs a cell: the execute request names the cell (``cellId``)."""
    content = {"code": textwrap.dedent(code), "silent": False, "store_history": True}
    content |= {"user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
    msg = kc.session.msg("execute_request", content, metadata={"cellId": cell})
    kc.shell_channel.send(msg)
    messages = []
    while True:
        got = kc.get_iopub_msg(timeout=60)
        if got["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        if got["msg_type"] == "status" and got["content"]["execution_state"] == "idle":
            return messages
        messages.append(got)


def test_a_cell_run_again_stops_the_background_runs_it_started_before(kernel: Any) -> None:
    """Running a cell again clears its output, the panels with the Stop buttons of the background
    runs it started the time before: those runs stop (saying why), the new one goes on.  Two runs
    one execution of a cell starts are both its own, and a run another cell started is left alone."""
    start = """
        import tempfile
        {name} = pd.DataFrame({{"n": range(200)}}).play.run(slow, concurrency=2, background=True, store=pb.ReceiptStore(tempfile.mkdtemp()))
    """
    _run_in_cell(kernel, start.format(name="first") + start.format(name="also"), "cell-a")
    _run_in_cell(kernel, start.format(name="other"), "cell-b")
    alive = _run(kernel, "print(first.running, also.running)")
    assert "".join(m["content"]["text"] for m in alive if m["msg_type"] == "stream").split() == [
        "True",
        "True",
    ]
    said = _run_in_cell(kernel, start.format(name="second"), "cell-a")
    stopped = [
        m for m in said if m["msg_type"] == "stream" and "still going: stopped" in m["content"]["text"]
    ]
    assert len(stopped) == 2
    messages = _run(
        kernel,
        """
        import json
        first.wait(); also.wait()
        print(json.dumps([first.state.stopped, also.state.stopped, first.stats.skipped > 0, "its cell was run again" in " ".join(first.state.notices), second.running, other.running]))
        second.stop(); other.stop(); second.wait(); other.wait()
    """,
    )
    printed = json.loads("".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream"))
    assert printed == [True, True, True, True, True, True]
