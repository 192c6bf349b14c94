"""The live panel in marimo, driven by a real browser.

A module fixture copies ``notebooks/07_marimo.py`` into a temporary directory and starts
``marimo edit`` on it (headless, no token, loopback, a user config of its own under the temporary
directory that runs every cell on open), then opens it in headless Chromium.  The notebook
serves the demo provider, maps 2,000 leads against it (blocking), prints the run's counts and
the requests the demo was sent, then starts a map of 2,000 other leads in the background, on a
provider held to 20 requests a second.

The tests read the page: the blocking map's live panel appeared in its cell's output and its
done count moved; it gave way to the run's summary, whose counters are the counts the notebook
printed and the requests the demo was sent; the background run's panel has a Stop button, and a
click on it stops the run (its panel says so, rows are skipped, and the demo gets no more
requests).  marimo draws an anywidget inside a shadow root: Playwright's CSS locators look
inside it, ``document.querySelector`` does not.  Screenshots of the panel, light and dark
(marimo's own ``dark`` class on the body), go to ``build/browser/``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lab_harness import SHOTS, _free_port, crop, launch_chromium
from playwright.sync_api import Page

ROWS = 2_000
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "07_marimo.py"
# The notebook's line after the map: its counts, the demo's address and the requests it was sent.
PRINTED = re.compile(
    r"([\d,]+) rows: ([\d,]+) ok, ([\d,]+) failed; ([\d,]+) calls paid; "
    r"the demo provider at (\S+) was sent ([\d,]+) requests"
)


@dataclass
class Seen:
    """What the page showed of the notebook's runs."""

    heads: list[str] = field(default_factory=list)  # the blocking panel's header, sampled
    summary: str = ""  # the blocking run's summary, as text
    printed: dict[str, int] = field(default_factory=dict)  # the notebook's COUNTS line
    requests_of_map: int = 0  # what the demo was sent with the map's key
    stopped: str = ""  # the background panel's text after Stop
    requests_after_reruns: list[int] = field(
        default_factory=list
    )  # the demo's, after the cell ran twice more and Stop
    requests_after_stop: list[int] = field(
        default_factory=list
    )  # with the background run's key, a second apart
    errors: list[str] = field(default_factory=list)  # the page's console errors


@pytest.fixture(scope="module")
def marimo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``marimo edit`` on a copy of the notebook: its URL."""
    root = tmp_path_factory.mktemp("marimo")
    config = root / "config" / "marimo"
    config.mkdir(parents=True)
    (config / "marimo.toml").write_text('[runtime]\nauto_instantiate = true\n[display]\ntheme = "light"\n')
    (root / NOTEBOOK.name).write_text(NOTEBOOK.read_text())
    env = dict(
        os.environ,
        HOME=str(root),  # no user's own ~/.marimo.toml
        XDG_CONFIG_HOME=str(root / "config"),
        XDG_CACHE_HOME=str(root / "cache"),
        XDG_STATE_HOME=str(root / "state"),
        MARIMO_SKIP_UPDATE_CHECK="1",
        PLAYBOOK_HOME=str(root / "home"),
    )
    env.pop("DEMO_API_KEY", None)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "marimo", "-y", "edit", NOTEBOOK.name, "--headless", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--no-token", "--skip-update-check", "--no-sandbox"]
    log = root / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            argv,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its kernel with it: the group is ended at the end
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"marimo exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"marimo did not answer:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
def seen(marimo: str) -> Seen:
    got = Seen()
    with launch_chromium() as chromium:
        page = chromium.new_page(viewport={"width": 1300, "height": 1000})
        page.on("console", lambda m: got.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: got.errors.append(str(e)))
        page.route(lambda u: not u.startswith(marimo), lambda route: route.abort())  # nothing leaves loopback
        page.goto(marimo)
        status = page.locator(".playbook-live .playbook-status").first  # inside the widget's shadow root
        status.wait_for(timeout=90_000)
        # Until the map ends: then the summary takes its panel's place (the next live one is the background run's).
        while (head := _text(status)).startswith("enrich ·") and "running" in head:
            got.heads.append(head)
            page.wait_for_timeout(200)
        summary = page.locator(".playbook-run").first
        summary.wait_for(timeout=60_000)
        got.summary = summary.inner_text()
        printed = page.get_by_text(PRINTED)
        printed.wait_for(timeout=30_000)
        found = PRINTED.search(printed.inner_text())
        assert found, printed.inner_text()
        rows, ok, failed, paid, got.demo, sent = found.groups()
        got.printed = {
            name: int(value.replace(",", ""))
            for name, value in zip(("rows", "ok", "failed", "paid", "sent"), (rows, ok, failed, paid, sent))
        }
        _shot(page, page.locator(".playbook-run").first, "marimo_summary")
        # The background run: its panel shows in the last cell, with its Stop button.
        stop = page.locator(".playbook-live button[data-press=stop]")
        stop.wait_for(timeout=30_000)
        background = page.locator(".playbook-live").last
        _wait_for_done(page, background, 60)  # three seconds in: its chart has something to show
        _shot(page, background, "marimo_live")
        stop.click()
        deadline = time.monotonic() + 30
        while "stopped" not in (text := background.inner_text()) and time.monotonic() < deadline:
            page.wait_for_timeout(200)
        got.stopped = text
        for _ in range(3):
            got.requests_after_stop.append(_requests(got.demo))
            page.wait_for_timeout(1000)
        # Run the background cell again, twice: the second time stops the run the first started
        # (its panel went with the cell's output); Stop on the newest panel then leaves none going.
        cells = page.locator(".marimo-cell")
        last = cells.nth(cells.count() - 1)
        for _ in range(2):
            last.hover()
            last.locator("[data-testid=run-button]").first.click()
            page.locator(".playbook-live button[data-press=stop]:enabled").wait_for(timeout=30_000)
            page.wait_for_timeout(1500)
        page.locator(".playbook-live button[data-press=stop]:enabled").click()
        page.wait_for_timeout(1500)  # calls in flight land
        for _ in range(3):
            got.requests_after_reruns.append(_requests(got.demo))
            page.wait_for_timeout(1000)
        page.close()
    return got


def test_the_panel_appears_in_the_cell_and_moves(seen: Seen) -> None:
    done = [
        int(m.group(1).replace(",", "")) for h in seen.heads if (m := re.search(r"([\d,]+)/2,000 rows", h))
    ]
    assert len(set(done)) >= 3, seen.heads  # seen at three counts at least, going up
    assert done == sorted(done) and done[-1] > done[0]
    assert not seen.errors, seen.errors


def test_the_summary_ends_with_the_counts_the_run_has(seen: Seen) -> None:
    printed = seen.printed
    assert printed["rows"] == ROWS and printed["ok"] + printed["failed"] == ROWS
    counters = _counters(seen.summary)
    assert (
        counters["rows"] == ROWS
        and counters["ok"] == printed["ok"]
        and counters["failed"] == printed["failed"]
    )
    assert counters["calls paid"] == printed["paid"] == printed["sent"] == ROWS  # one request a lead
    assert "finished" in seen.summary


def test_stop_stops_a_background_run(seen: Seen) -> None:
    counters = _counters(seen.stopped)
    assert "stopped" in seen.stopped and counters["skipped"] > 0
    assert counters["ok"] + counters["failed"] + counters["skipped"] == ROWS
    sent = [n - seen.printed["sent"] for n in seen.requests_after_stop]  # the background run's
    assert 0 < sent[0] < ROWS // 2  # far from every lead
    assert sent[-1] == sent[0]  # and no request since
    assert counters["calls paid"] == sent[-1]  # each one paid for is in the run's receipts


def _requests(demo: str) -> int:
    """The requests the demo provider at ``demo`` was sent."""
    with urllib.request.urlopen(f"{demo}/_stats", timeout=5) as response:
        return int(json.load(response)["requests"])


def _text(locator: Any) -> str:
    try:
        return str(locator.inner_text(timeout=2000))
    except Exception:  # replaced by the summary in between
        return ""


def _wait_for_done(page: Page, panel: Any, rows: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"([\d,]+)/2,000 rows", _text(panel))
        if m and int(m.group(1).replace(",", "")) >= rows:
            return
        page.wait_for_timeout(200)


def _counters(text: str) -> dict[str, int]:
    """The counters table of a panel or summary, read from its text: the heading line, then the values."""
    lines = [line for line in text.splitlines() if line.strip()]
    at = next(i for i, line in enumerate(lines) if line.startswith("rows\tok"))
    names = lines[at].split("\t")
    values = lines[at + 1].split("\t")
    return {
        name: int(value.replace(",", "").lstrip("$").split(".")[0])
        for name, value in zip(names, values)
        if re.fullmatch(r"\$?[\d,]+(\.\d+)?", value)
    }


def _shot(page: Page, locator: Any, name: str) -> None:
    """``locator`` screenshot in marimo's light theme, then its dark one (the body's ``dark`` class)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    locator.scroll_into_view_if_needed()
    crop(page, locator, SHOTS / f"{name}_light.png")
    page.evaluate("document.body.classList.add('dark', 'dark-theme')")
    page.wait_for_timeout(200)
    crop(page, locator, SHOTS / f"{name}_dark.png")
    page.evaluate("document.body.classList.remove('dark', 'dark-theme')")


def test_running_the_cell_again_stops_the_run_it_started_before(seen: Seen) -> None:
    sent = seen.requests_after_reruns
    assert sent[0] > seen.requests_after_stop[-1]  # the runs went, then
    assert sent[-1] == sent[0]  # none is left going: the one the cell ran before was stopped with it
