"""A harness for driving notebooks in a real JupyterLab with headless Chromium (Playwright).

``jupyter_lab`` starts ``jupyter lab`` on loopback with a random token over a root directory,
in an environment from ``isolated_env`` (Jupyter's config, data and settings directories of its
own, so the kernel is this venv's ``python3``), and shuts it down with its kernels.
``launch_chromium`` starts the browser.  ``drive`` opens one notebook in a fresh page, clicks
Run > Run All Cells while a MutationObserver records every ``.playbook-live`` panel and a sampler
measures the page every 200 ms, takes screenshots into ``build/browser/``, and returns a
``Session``: what the page showed.  The notebooks and the assertions live in ``test_browser.py``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

SHOTS = Path(__file__).resolve().parents[1] / "build" / "browser"  # screenshots
# The counters table heading every run summary.
HEADER = [
    "rows",
    "ok",
    "reused",
    "failed",
    "held",
    "parked",
    "skipped",
    "calls paid",
    "calls reused",
    "calls local",
    "cost spent",
    "cost saved",
]
RUN_TIMEOUT = 120.0  # seconds for all of a notebook's cells together; they take about 15
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these, Chromium's own background connections get refused here and it stalls.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # performance.memory otherwise reports the heap in coarse, delayed buckets.
    "--enable-precise-memory-info",
]
# Settings for this lab only: no news or update checks (they reach the internet and put a toast
# over the screenshots); every cell attached to the DOM, so offscreen cells render and count.
SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

Lab = tuple[str, str, Path]  # a running server's base url and token, and its PLAYBOOK_HOME

# Records every live panel the widget front-end draws: in which code cell, whether it holds an
# IntProgress bar, and its header as last seen.  Installed before JupyterLab loads.
OBSERVER = """
window.__playbookLive = [];
new MutationObserver(() => {
  for (const panel of document.querySelectorAll('.playbook-live')) {
    let seen = window.__playbookLive.find(r => r.node === panel);
    if (!seen) {
      const cells = Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell'));
      seen = {node: panel, cell: cells.indexOf(panel.closest('.jp-CodeCell')), progress: false, heads: []};
      window.__playbookLive.push(seen);
    }
    seen.progress = seen.progress || panel.querySelector('.widget-hprogress .progress-bar') !== null;
    const head = panel.querySelector('.playbook-status .widget-html-content');
    const text = head ? head.textContent : '';
    if (text && seen.heads[seen.heads.length - 1] !== text) seen.heads.push(text);
  }
}).observe(document, {childList: true, subtree: true, characterData: true, attributes: true});
"""

# Every 200 ms, what the page holds: the live panel's done count (from its header) and bar width,
# its node count and table sizes, the document's node count and the JS heap.  Started just
# before Run All; window.__stopSampling() ends it and returns the samples.
SAMPLER = """
() => {
  const count = root => { const walker = document.createTreeWalker(root); let n = 0; while (walker.nextNode()) n++; return n; };
  window.__samples = [];
  const timer = setInterval(() => {
    const panel = document.querySelector('.playbook-live');
    const head = panel && panel.querySelector('.playbook-status .widget-html-content');
    const rows = head && head.textContent.match(/([\\d,]+)\\/([\\d,]+) rows/);
    const bar = panel && panel.querySelector('.widget-hprogress .progress-bar');
    window.__samples.push({
      t: performance.now() / 1000,
      live: panel !== null,
      done: rows ? Number(rows[1].replace(/,/g, '')) : null,
      bar: bar ? parseFloat(bar.style.width) : null,
      panel_nodes: panel ? count(panel) : 0,
      table_rows: panel ? Array.from(panel.querySelectorAll('table'), t => t.querySelectorAll('tr').length) : [],
      document_nodes: count(document),
      heap: performance.memory ? performance.memory.usedJSHeapSize : null,
    });
  }, 200);
  window.__stopSampling = () => { clearInterval(timer); return window.__samples; };
}
"""

# Per code cell: its prompt, and its outputs (mime type, text, and each run summary's tables
# and notes such as "… and N more").
READ_CELLS = """
() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell')).map(cell => ({
  prompt: (cell.querySelector('.jp-InputPrompt') || {}).textContent || '',
  live: cell.querySelectorAll('.playbook-live').length,
  outputs: Array.from(cell.querySelectorAll('.jp-OutputArea-output')).map(out => ({
    mime: out.getAttribute('data-mime-type'),
    text: out.textContent,
    summaries: Array.from(out.querySelectorAll('div.playbook-run'), run => ({
      tables: Array.from(run.querySelectorAll('table'), table => ({
        head: Array.from(table.querySelectorAll('thead th'), th => th.textContent),
        rows: Array.from(table.querySelectorAll('tbody tr'), tr => Array.from(tr.querySelectorAll('td'), td => td.textContent)),
      })),
      notes: Array.from(run.querySelectorAll(':scope > div'), div => div.textContent),
    })),
  })),
}))
"""


@dataclass
class Session:
    """What the browser saw of one run of a notebook."""

    code_cells: int  # in the notebook file
    cells: list[dict[str, Any]]  # as the page shows them
    live: list[dict[str, Any]]
    samples: list[dict[str, Any]]  # SAMPLER's, from Run All to the end
    home: Path
    stalled: str | None = None  # what the browser still waited for when the time ran out
    console_errors: list[str] = field(default_factory=list)

    def runs(self) -> list[tuple[int, dict[str, Any]]]:
        """(code cell, summary) for every run summary on the page, in page order."""
        return [(i, s) for i, cell in enumerate(self.cells) for out in cell["outputs"] for s in out["summaries"]]

    def summaries(self) -> list[tuple[int, dict[str, int]]]:
        """(code cell, counters) for every run summary on the page, in page order."""
        found = []
        for i, summary in self.runs():
            counters = summary["tables"][0]
            assert counters["head"] == HEADER, counters
            found.append((i, {h: int(float(v)) for h, v in zip(HEADER, counters["rows"][0])}))
        return found

    def printed(self) -> str:
        return "".join(out["text"] for cell in self.cells for out in cell["outputs"] if out["mime"] == "application/vnd.jupyter.stdout")

    def live_samples(self) -> list[dict[str, Any]]:
        return [s for s in self.samples if s["live"]]

    def figures(self) -> dict[str, Any]:
        """What the samples measured of the live panel, for the report and the assertions."""
        live = self.live_samples()
        if not live:
            return {"samples": len(self.samples), "live samples": 0}
        changes = [live[0]]  # the panel's first done count, then each time it moved
        changes += [b for a, b in zip(live, live[1:]) if b["done"] != a["done"]]
        # Up to the panel's last sample too: a panel that froze for good would otherwise pass.
        stops = [s["t"] for s in changes] + [live[-1]["t"]]
        heaps = [s["heap"] for s in live if s["heap"] is not None]
        return {
            "samples": len(self.samples),
            "live samples": len(live),
            "live for s": round(live[-1]["t"] - live[0]["t"], 2),
            "distinct done": len({s["done"] for s in live}),
            "done values": [s["done"] for s in changes],
            "max gap s": round(max(b - a for a, b in zip(stops, stops[1:])), 2) if len(changes) > 1 else float("inf"),
            "max panel nodes": max(s["panel_nodes"] for s in live),
            "max table rows": max((n for s in live for n in s["table_rows"]), default=0),
            "document nodes at panel start, end": (live[0]["document_nodes"], live[-1]["document_nodes"]),
            "max document nodes while live": max(s["document_nodes"] for s in live),
            "document nodes before Run All, after": (self.samples[0]["document_nodes"], self.samples[-1]["document_nodes"]),
            "JS heap MB at panel start, end, max": tuple(round(h / 2**20, 1) for h in (heaps[0], heaps[-1], max(heaps))) if heaps else None,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def isolated_env(private: Path) -> dict[str, str]:
    """``os.environ`` with Jupyter's config, data, runtime, settings, workspaces and IPython
    directories under ``private``, and ``SETTINGS`` written there."""
    for name, value in SETTINGS.items():
        path = private / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    return dict(
        os.environ,
        # A user-level kernelspec or config must not shadow this venv's: the data directory is
        # searched before sys.prefix.
        JUPYTER_CONFIG_DIR=str(private / "config"),
        JUPYTER_DATA_DIR=str(private / "data"),
        JUPYTER_RUNTIME_DIR=str(private / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(private / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(private / "workspaces"),
        IPYTHONDIR=str(private / "ipython"),
    )


@contextmanager
def jupyter_lab(root: Path, env: dict[str, str], log_path: Path) -> Iterator[tuple[str, str]]:
    """A JupyterLab server on loopback serving ``root``, run with ``env`` and logging to
    ``log_path``: (base url, token).  Its python3 kernel must be this venv's."""
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.open_browser=False",
        "--ServerApp.allow_root=True",
        "--ServerApp.terminals_enabled=False",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(argv, env=env, cwd=root, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, f"jupyter lab exited:\n{log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"jupyter lab did not answer:\n{log_path.read_text()[-3000:]}"
                try:
                    _get(f"{base}/api/status?token={token}")
                    break
                except urllib.error.HTTPError as e:
                    e.close()
                except OSError:
                    pass
                time.sleep(0.2)
            spec = _get(f"{base}/api/kernelspecs?token={token}")["kernelspecs"]["python3"]["spec"]
            assert Path(spec["argv"][0]).parent.parent == Path(sys.prefix), spec["argv"]
            yield base, token
        finally:
            try:  # shuts the kernels down too, which terminating the server may not
                urllib.request.urlopen(urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST"), timeout=10).close()
            except OSError:
                pass
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.terminate()
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()


@contextmanager
def launch_chromium() -> Iterator[Browser]:
    """Headless Chromium: ``$CHROMIUM``, else ``/usr/bin/chromium``."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# JavaScript expressions about the code cells' prompts: "[ ]:" not run, "[*]:" queued or running.
_PROMPTS = "Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt'), p => p.textContent.trim())"
_SETTLED = f"{_PROMPTS}.every(p => p !== '[*]:')"  # a failed cell leaves the ones after it "[ ]:"
_LIVE = "document.querySelector('.playbook-live .widget-hprogress') !== null"


def _run_all(page: Page, deadline: float, on_live: Callable[[], None]) -> None:
    """Run > Run All Cells, call ``on_live`` once a live panel shows, and wait until no cell is
    queued or running."""
    left = lambda: max(deadline - time.monotonic(), 0.001) * 1000  # noqa: E731
    for attempt in range(3):
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.locator('#jp-mainmenu-run [data-command="runmenu:run-all"]').click()
        # JupyterLab marks the cells [*] as soon as it sends their requests; a click lost while
        # the page was still settling leaves them all [ ]: then (only then) it is safe to ask again.
        try:
            page.wait_for_function(f"{_PROMPTS}.some(p => p !== '[ ]:')", timeout=min(10_000, left()))
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
    page.wait_for_function(f"({_SETTLED}) || {_LIVE}", timeout=left())
    if page.evaluate(_LIVE):
        on_live()
    page.wait_for_function(_SETTLED, timeout=left())
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=left())


def drive(chromium: Browser, lab: Lab, name: str) -> Session:
    """Open notebook ``name`` in a fresh page, Run All while sampling the page, screenshot it
    live (``<stem>_live.png``) and finished (``<stem>.png``), and read what it shows."""
    base, token, home = lab
    stem = Path(name).stem
    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.add_init_script(OBSERVER)
        # A workspace of its own: the default one would open the notebooks of earlier pages too.
        page.goto(f"{base}/lab/workspaces/{stem}/tree/{name}?token={token}")
        # The notebook attaches its cells a few at a time: wait for all of them.
        code_cells = sum(cell["cell_type"] == "code" for cell in _get(f"{base}/api/contents/{name}?token={token}")["content"]["cells"])
        page.wait_for_function(f"document.querySelectorAll('.jp-Notebook .jp-CodeCell').length === {code_cells}", timeout=60_000)
        page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=60_000)
        folder = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
        if folder.count():
            folder.click()  # fold the file browser away: more notebook in the screenshots

        def live_shot() -> None:
            page.locator(".playbook-live").first.scroll_into_view_if_needed()
            page.screenshot(path=SHOTS / f"{stem}_live.png")

        page.evaluate(SAMPLER)
        stalled = None
        try:
            _run_all(page, time.monotonic() + RUN_TIMEOUT, live_shot)
        except PlaywrightTimeout as e:  # the tests say what is missing; the page is still read
            stalled = e.message.splitlines()[0]
        samples = page.evaluate("window.__stopSampling()")
        cells = page.evaluate(READ_CELLS)
        live = page.evaluate("window.__playbookLive.map(({node, ...rest}) => rest)")
        # JupyterLab scrolls inside the notebook, not the page: make the page tall enough for all of it.
        scroller = "document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer')"
        height = page.evaluate(f"{scroller}.scrollHeight")
        page.set_viewport_size({"width": 1400, "height": min(height + 200, 16_000)})
        page.evaluate(f"{scroller}.scrollTop = 0")
        page.wait_for_timeout(300)  # let the layout settle at the new size
        page.screenshot(path=SHOTS / f"{stem}.png", full_page=True)
    finally:
        page.close()
    return Session(code_cells=code_cells, cells=cells, live=live, samples=samples, home=home, stalled=stalled, console_errors=errors)
