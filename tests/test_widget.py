"""The live widget in a real kernel: shown for progress="auto", replaced by the static summary at
the end, and its Stop and Retry buttons act on a background run."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    km, kc = start_new_kernel(kernel_name="python3")
    home = tmp_path_factory.mktemp("home")
    kc.execute_interactive(textwrap.dedent(f"""
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
    """), timeout=60)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _run(kc: Any, code: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    reply = kc.execute_interactive(textwrap.dedent(code), timeout=60, output_hook=messages.append)
    assert reply["content"]["status"] == "ok", messages
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
    state_updates = [m for m in messages if m["msg_type"] == "comm_msg" and "value" in m["content"]["data"].get("state", {})]
    assert state_updates  # the bar moved while the run went on


def test_buttons_stop_and_retry_a_background_run(kernel: Any) -> None:
    """Stop ends a background run (rows not run are skipped); Retry failed runs the failed rows again."""
    _run(kernel, """
        import tempfile
        fresh = pb.ReceiptStore(tempfile.mkdtemp())  # nothing reused from the other tests
        run = pd.DataFrame({"n": range(200)}).play.run(slow, concurrency=2, background=True, store=fresh)
        await asyncio.sleep(0.8)  # past the panel's delay
        run.view.stop.click()
        await asyncio.sleep(0.2)
    """)
    messages = _run(kernel, "print(run.running, run.stats.skipped > 100, run.stats.failed)")
    lines = [m["content"]["text"] for m in messages if m["msg_type"] == "stream"]
    assert "".join(lines).split() == ["False", "True", "1"]
    messages = _run(kernel, """
        before = calls.count(3)
        run.view.retry_failed.click()
        await asyncio.sleep(0.5)
        print(run.running, run.stats.failed, run.result.loc[3, "play_status"], calls.count(3) - before)
    """)
    lines = [m["content"]["text"] for m in messages if m["msg_type"] == "stream"]
    assert "".join(lines).split() == ["False", "1", "failed", "1"]  # it ran again, and failed again


def test_a_run_over_at_once_shows_only_its_summary(kernel: Any) -> None:
    """A run shorter than the panel's delay shows no live panel, just the static summary."""
    messages = _run(kernel, 'quick = pd.DataFrame({"n": [5000, 5001]}).play.map(slow)')
    assert not [m for m in messages if m["msg_type"] == "display_data" and WIDGET in m["content"]["data"]]
    summaries = [m for m in messages if m["msg_type"] == "display_data" and "text/html" in m["content"]["data"]]
    assert len(summaries) == 1 and "<td>2</td><td>2</td>" in summaries[0]["content"]["data"]["text/html"]
