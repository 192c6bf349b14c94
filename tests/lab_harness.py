"""A harness for driving notebooks in a real JupyterLab or Notebook 7 with headless Chromium
(Playwright).

``jupyter_server`` starts ``jupyter lab`` or ``jupyter notebook`` (a ``FrontEnd``: ``JUPYTERLAB``,
``NOTEBOOK7``) on loopback with a random token over a root directory, in an environment from
``isolated_env`` (Jupyter's config, data and settings directories of its own, so the kernel is
this venv's ``python3``), and shuts it down with its kernels.  ``launch_chromium`` starts the
browser.  ``drive`` opens one notebook in a fresh page of the server's front-end, switches it to
the theme asked for (its ``apputils:change-theme`` command, through the app the server exposes as
``window.jupyterapp``), clicks Run > Run All Cells while a MutationObserver
records every ``.playbook-live`` panel and a sampler measures the page every 200 ms, then looks at
the finished page in each theme asked for (on the same page: the run is not repeated), takes
screenshots into ``build/browser/`` and returns a ``Session``: what the page showed, including
what the run's SVG pictures are painted with in each theme (the computed fill and stroke of each
``pb-*`` class, the theme variables they should come from, and the background behind them).  The
notebooks and the assertions live in ``test_browser.py``.
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
from typing import Any, NamedTuple

from playwright.sync_api import Browser, Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

SHOTS = Path(__file__).resolve().parents[1] / "build" / "browser"  # screenshots
# The counters table heading every run summary.
HEADER = [
    "rows",
    "ok",
    "reused",
    "failed",
    "waiting",
    "parked",
    "skipped",
    "calls paid",
    "calls failed",
    "calls shared",
    "calls from receipts",
    "calls local",
    "cost spent",
    "of it on failures",
    "cost saved",
]
PARKED_HEAD = ["rows", "why", "provider", "ready at"]  # parked rows, by why, provider and ready-at minute
ERRORS_HEAD = ["rows", "error", "e.g. row", "its message"]  # failed rows, by their error's group
LIGHT, DARK = "JupyterLab Light", "JupyterLab Dark"
# The theme variables the pictures' classes are mapped to, resolved to rgb() in every look.
THEME_VARS = [
    "--jp-layout-color0",
    "--jp-layout-color2",
    "--jp-success-color1",
    "--jp-error-color1",
    "--jp-warn-color0",
    "--jp-warn-color2",
    "--jp-ui-font-color1",
    "--jp-ui-font-color2",
]
RUN_TIMEOUT = 120.0  # seconds for all of a notebook's cells together; they take about 15
LIVE_SHOT_AFTER = 3.0  # seconds a live panel has shown when it is screenshot
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
# Settings for this server only (JupyterLab and Notebook 7 read the same ones): no news or update
# checks (they reach the internet and put a toast over the screenshots); every cell attached to
# the DOM, so offscreen cells render and count.
SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


@dataclass(frozen=True)
class FrontEnd:
    """What ``jupyter_server`` and ``drive`` do differently in one Jupyter front-end.

    Notebook 7 is built from JupyterLab's components, and in JupyterLab 4.6 and Notebook 7.6 the
    rest is the same elements: the cells and their prompts, the main menu's "Run" item and its
    menu (``#jp-mainmenu-run``, "Run All Cells" as ``runmenu:run-all``), the notebook toolbar's
    execution indicator (``data-status="idle"``), the notebook's scroller
    (``.jp-WindowedPanel-outer``: the page itself does not scroll), the theme variables and
    ``body[data-jp-theme-name]``.
    """

    name: str  # in test ids
    app: str  # jupyter's subcommand
    options: tuple[str, ...]  # the app's own, beside the server's
    page: str  # a notebook's page, formatted with base, stem, name and token
    menu_bar: str  # the element that holds the main menu
    side_bar: str | None  # the tab of a side bar open on a new page, clicked to fold it away
    shots: str  # what follows the notebook's stem in screenshot names


JUPYTERLAB = FrontEnd(
    name="lab",
    app="lab",
    options=(
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: its commands switch the theme
    ),
    # A workspace of its own: the default one would open the notebooks of earlier pages too.
    page="{base}/lab/workspaces/{stem}/tree/{name}?token={token}",
    menu_bar="#jp-menu-panel",
    side_bar=".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current",  # the file browser
    shots="",
)
NOTEBOOK7 = FrontEnd(
    name="notebook7",
    app="notebook",
    # Notebook 7 has no news url or update checker options: its announcements plugin is
    # JupyterLab's, and SETTINGS turn it off.
    options=("--JupyterNotebookApp.expose_app_in_browser=True",),
    page="{base}/notebooks/{name}?token={token}",  # one notebook per page, no workspace
    menu_bar="#menu-panel",
    side_bar=None,  # a notebook's page starts with its side panels hidden and no tab bar
    shots="_notebook7",
)


class Server(NamedTuple):
    """A running server: its base url and token, its PLAYBOOK_HOME and its front-end."""

    base: str
    token: str
    home: Path
    front: FrontEnd


# Records every live panel the widget front-end draws: in which code cell, whether it holds an
# progress bar (the SVG status bar of its rows), and its header as last seen.  Installed before the front-end loads, with
# window.__pbLook(root): the theme, THEME_VARS resolved to rgb(), the computed fill and stroke of
# the first element of each pb-* class in root's SVG pictures, and the background behind them
# (the first ancestor of a chart's text, or of root, whose background is not transparent).
OBSERVER = (
    f"const THEME_VARS = {json.dumps(THEME_VARS)};"
    """
window.__pbLook = root => {
  const probe = document.createElement('span');
  document.body.appendChild(probe);
  const vars = {};
  for (const name of THEME_VARS) {
    probe.style.color = `var(${name})`;
    vars[name] = getComputedStyle(probe).color;
  }
  probe.remove();
  const paint = {};
  for (const el of root.querySelectorAll('svg [class^="pb-"]')) {
    const cls = el.getAttribute('class');
    if (cls in paint) continue;
    const style = getComputedStyle(el);
    paint[cls] = {fill: style.fill, stroke: style.stroke};
  }
  let node = root.querySelector('svg .pb-text') || root, background = null;
  for (; node && !background; node = node.parentElement) {
    const colour = getComputedStyle(node).backgroundColor;
    if (colour && colour !== 'transparent' && !/^rgba\\(.*,\\s*0\\)$/.test(colour)) background = colour;
  }
  return {theme: document.body.dataset.jpThemeName, vars, paint, background};
};
window.__playbookLive = [];
new MutationObserver(() => {
  for (const panel of document.querySelectorAll('.playbook-live')) {
    let seen = window.__playbookLive.find(r => r.node === panel);
    if (!seen) {
      const cells = Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell'));
      seen = {node: panel, cell: cells.indexOf(panel.closest('.jp-CodeCell')), progress: false, heads: []};
      window.__playbookLive.push(seen);
    }
    seen.progress = seen.progress || panel.querySelector('.playbook-status svg rect') !== null;
    const head = panel.querySelector('.playbook-status');
    const text = head ? head.textContent : '';
    if (text && seen.heads[seen.heads.length - 1] !== text) seen.heads.push(text);
  }
}).observe(document, {childList: true, subtree: true, characterData: true, attributes: true});
"""
)

# Every 200 ms, what the page holds: the live panel's done count (from its header) and bar width,
# its node count (and how many of them are in its SVG pictures), its tables (head and cells),
# its status bar's segments (class, drawn width in pixels) and its charts' titles, the
# document's node count and the JS heap.  The first time the panel shows a done segment, a
# not-yet-done one and a chart's text, window.__liveLook keeps their colours.  Started just
# before Run All; window.__stopSampling() ends it and returns the samples.
SAMPLER = """
() => {
  const count = root => { const walker = document.createTreeWalker(root); let n = 0; while (walker.nextNode()) n++; return n; };
  const cells = table => ({
    head: Array.from(table.querySelectorAll('thead th'), th => th.textContent),
    rows: Array.from(table.querySelectorAll('tbody tr'), tr => Array.from(tr.querySelectorAll('td'), td => td.textContent)),
  });
  window.__samples = [];
  window.__liveLook = null;
  const timer = setInterval(() => {
    const panel = document.querySelector('.playbook-live');
    const head = panel && panel.querySelector('.playbook-status');
    const rows = head && head.textContent.match(/([\\d,]+)\\/([\\d,]+) rows/);
    const status = panel && panel.querySelector('.playbook-status svg');
    if (panel && !window.__liveLook && ['rect.pb-ok', 'rect.pb-rest', '.pb-text'].every(s => panel.querySelector(s)))
      window.__liveLook = window.__pbLook(panel);
    window.__samples.push({
      t: performance.now() / 1000,
      live: panel !== null,
      done: rows ? Number(rows[1].replace(/,/g, '')) : null,
      bar: status ? Array.from(status.querySelectorAll('rect:not(.pb-rest)'), r => r.getBoundingClientRect().width).reduce((a, b) => a + b, 0) : null,
      panel_nodes: panel ? count(panel) : 0,
      svg_nodes: panel ? Array.from(panel.querySelectorAll('svg'), svg => 1 + count(svg)).reduce((a, b) => a + b, 0) : 0,
      tables: panel ? Array.from(panel.querySelectorAll('table'), cells) : [],
      segments: status ? Array.from(status.querySelectorAll('rect'), r => [r.getAttribute('class'), r.getBoundingClientRect().width]) : [],
      charts: panel ? Array.from(panel.querySelectorAll('.playbook-pictures .playbook-chart svg > title'), t => t.textContent) : [],
      document_nodes: count(document),
      heap: performance.memory ? performance.memory.usedJSHeapSize : null,
    });
  }, 200);
  window.__stopSampling = () => { clearInterval(timer); return window.__samples; };
}
"""

# Per code cell: its prompt, and its outputs (mime type, text, and each run summary's tables,
# notes such as "… and N more groups", its status bar (width and segments: class, width
# attribute, drawn width in pixels, tooltip) and its charts (tooltip, text lines, drawn size)).
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
      bar: Array.from(run.querySelectorAll(':scope > div > svg'), svg => ({
        width: svg.getBoundingClientRect().width,
        segments: Array.from(svg.querySelectorAll('rect'), r => ({
          cls: r.getAttribute('class'),
          width: parseFloat(r.getAttribute('width')),
          px: r.getBoundingClientRect().width,
          title: (r.querySelector('title') || {}).textContent,
        })),
      })),
      charts: Array.from(run.querySelectorAll('.playbook-chart svg'), svg => ({
        title: (svg.querySelector(':scope > title') || {}).textContent,
        text: Array.from(svg.querySelectorAll('text'), t => t.textContent),
        size: [svg.getBoundingClientRect().width, svg.getBoundingClientRect().height],
      })),
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
    theme: str = LIGHT  # the one the cells ran in
    live_look: dict[str, Any] | None = (
        None  # the live panel's colours (window.__pbLook), once it showed its pictures
    )
    looks: dict[str, dict[str, Any]] = field(
        default_factory=dict
    )  # theme -> the finished notebook's colours in it
    stalled: str | None = None  # what the browser still waited for when the time ran out
    console_errors: list[str] = field(default_factory=list)

    def runs(self) -> list[tuple[int, dict[str, Any]]]:
        """(code cell, summary) for every run summary on the page, in page order."""
        return [
            (i, s) for i, cell in enumerate(self.cells) for out in cell["outputs"] for s in out["summaries"]
        ]

    def summaries(self) -> list[tuple[int, dict[str, int]]]:
        """(code cell, counters) for every run summary on the page, in page order."""
        found = []
        for i, summary in self.runs():
            counters = summary["tables"][0]
            assert counters["head"] == HEADER, counters
            # counts, and money as "$1,204.10": read as whole numbers
            found.append(
                (
                    i,
                    {
                        h: int(float(v.replace(",", "").lstrip("<$")))
                        for h, v in zip(HEADER, counters["rows"][0])
                    },
                )
            )
        return found

    def printed(self) -> str:
        return "".join(
            out["text"]
            for cell in self.cells
            for out in cell["outputs"]
            if out["mime"] == "application/vnd.jupyter.stdout"
        )

    def live_samples(self) -> list[dict[str, Any]]:
        """The samples that show a live panel, from the first one whose header is drawn: the
        front-end may draw the panel's widgets a moment before their first values arrive."""
        live = [s for s in self.samples if s["live"]]
        first = next((i for i, s in enumerate(live) if s["done"] is not None), len(live))
        return live[first:]

    def grouped(self) -> list[dict[str, Any]]:
        """The live samples from the first one that shows both the parked and the errors table."""
        live = self.live_samples()
        first = next(
            (i for i, s in enumerate(live) if {tuple(PARKED_HEAD), tuple(ERRORS_HEAD)} <= _heads(s)),
            len(live),
        )
        return live[first:]

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

        def lines(head: str) -> int:
            return max((len(t["rows"]) for s in live for t in s["tables"] if t["head"] == head), default=0)

        grouped = [s["document_nodes"] for s in self.grouped()]
        return {
            "samples": len(self.samples),
            "live samples": len(live),
            "live for s": round(live[-1]["t"] - live[0]["t"], 2),
            "distinct done": len({s["done"] for s in live}),
            "done values": [s["done"] for s in changes],
            "max gap s": round(max(b - a for a, b in zip(stops, stops[1:])), 2)
            if len(changes) > 1
            else float("inf"),
            "max panel nodes": max(s["panel_nodes"] for s in live),
            "max panel nodes in SVG": max(s["svg_nodes"] for s in live),
            "max table rows": max((len(t["rows"]) for s in live for t in s["tables"]), default=0),
            "max lines of parked, errors": (lines(PARKED_HEAD), lines(ERRORS_HEAD)),
            "document nodes at panel start, end": (live[0]["document_nodes"], live[-1]["document_nodes"]),
            "max document nodes while live": max(s["document_nodes"] for s in live),
            "live samples with both tables": len(grouped),
            "document nodes with both tables first, min, max, last": grouped
            and (grouped[0], min(grouped), max(grouped), grouped[-1]),
            "document nodes before Run All, after": (
                self.samples[0]["document_nodes"],
                self.samples[-1]["document_nodes"],
            ),
            "JS heap MB at panel start, end, max": tuple(
                round(h / 2**20, 1) for h in (heaps[0], heaps[-1], max(heaps))
            )
            if heaps
            else None,
        }


def _heads(sample: dict[str, Any]) -> set[tuple[str, ...]]:
    return {tuple(t["head"]) for t in sample["tables"]}


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
def jupyter_server(
    front: FrontEnd, root: Path, env: dict[str, str], log_path: Path
) -> Iterator[tuple[str, str]]:
    """``front``'s server on loopback serving ``root``, run with ``env`` and logging to
    ``log_path``: (base url, token).  Its python3 kernel must be this venv's."""
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "jupyter",
        front.app,
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.open_browser=False",
        "--ServerApp.allow_root=True",
        "--ServerApp.terminals_enabled=False",
        *front.options,
    ]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            argv, env=env, cwd=root, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, f"jupyter {front.app} exited:\n{log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, (
                    f"jupyter {front.app} did not answer:\n{log_path.read_text()[-3000:]}"
                )
                try:
                    _get(f"{base}/api/status?token={token}")
                    break
                except urllib.error.HTTPError as e:
                    e.close()
                except OSError:
                    pass
                time.sleep(0.2)
            spec = _get(f"{base}/api/kernelspecs?token={token}")["kernelspecs"]["python3"]["spec"]
            # resolved: a venv reached through a symlink names its interpreter by either path
            assert Path(spec["argv"][0]).parent.parent.resolve() == Path(sys.prefix).resolve(), spec["argv"]
            yield base, token
        finally:
            try:  # shuts the kernels down too, which terminating the server may not
                urllib.request.urlopen(
                    urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST"), timeout=10
                ).close()
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
        browser = pw.chromium.launch(
            executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


# JavaScript expressions about the code cells' prompts: "[ ]:" not run, "[*]:" queued or running.
_PROMPTS = "Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt'), p => p.textContent.trim())"
_SETTLED = f"{_PROMPTS}.every(p => p !== '[*]:')"  # a failed cell leaves the ones after it "[ ]:"
_LIVE = "document.querySelector('.playbook-live .playbook-status svg') !== null"
_IDLE = '.jp-Notebook-ExecutionIndicator[data-status="idle"]'  # the kernel, in the notebook's toolbar


def _run_all(page: Page, front: FrontEnd, deadline: float, on_live: Callable[[], None]) -> None:
    """Run > Run All Cells, call ``on_live`` once a live panel shows, and wait until no cell is
    queued or running."""
    left = lambda: max(deadline - time.monotonic(), 0.001) * 1000  # noqa: E731
    for attempt in range(3):
        page.locator(front.menu_bar).get_by_role("menuitem", name="Run", exact=True).click()
        page.locator('#jp-mainmenu-run [data-command="runmenu:run-all"]').click()
        # The front-end marks the cells [*] as soon as it sends their requests; a click lost while
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
    page.wait_for_selector(_IDLE, timeout=left())


def set_theme(page: Page, theme: str) -> None:
    """Switch the front-end to ``theme`` (``LIGHT``, ``DARK``) and wait until its stylesheet applies."""
    themed = "() => document.body.dataset.jpThemeName && getComputedStyle(document.body).getPropertyValue('--jp-layout-color0').trim()"
    page.wait_for_function(themed, timeout=60_000)  # the first theme, loaded with the page
    if page.evaluate("document.body.dataset.jpThemeName") == theme:
        return
    before = page.evaluate("getComputedStyle(document.body).getPropertyValue('--jp-layout-color0')")
    page.evaluate("theme => window.jupyterapp.commands.execute('apputils:change-theme', {theme})", theme)
    # The name is set when the theme is chosen; the variables change once its stylesheet is in.
    switched = """([theme, before]) => document.body.dataset.jpThemeName === theme
        && getComputedStyle(document.body).getPropertyValue('--jp-layout-color0') !== before"""
    page.wait_for_function(switched, arg=[theme, before], timeout=30_000)
    page.evaluate(
        "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"
    )  # painted


def crop(page: Page, element: Any, path: Path, margin: int = 8) -> None:
    """Screenshot ``element`` (a locator) with ``margin`` pixels of the page around it."""
    box = element.bounding_box()
    page.screenshot(
        path=path,
        clip={
            "x": max(box["x"] - margin, 0),
            "y": max(box["y"] - margin, 0),
            "width": box["width"] + 2 * margin,
            "height": box["height"] + 2 * margin,
        },
    )


def shade(theme: str) -> str:
    """A theme's word in file names: "JupyterLab Dark" -> "dark"."""
    return theme.split()[-1].lower()


def drive(
    chromium: Browser, server: Server, name: str, *, theme: str = LIGHT, looks: tuple[str, ...] = ()
) -> Session:
    """Open notebook ``name`` in a fresh page of the server's front-end in ``theme``, Run All
    while sampling the page, screenshot it live (``<stem><shots>_live_<shade>.png``), then in each
    of ``looks`` (default: ``theme``) read its pictures' colours and screenshot it finished
    (``<stem><shots>_<shade>.png``), and read what it shows."""
    base, token, home, front = server
    stem = Path(name).stem
    shot = stem + front.shots  # the screenshots' names
    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.add_init_script(OBSERVER)
        page.goto(front.page.format(base=base, stem=stem, name=name, token=token))
        # The notebook attaches its cells a few at a time: wait for all of them.
        code_cells = sum(
            cell["cell_type"] == "code"
            for cell in _get(f"{base}/api/contents/{name}?token={token}")["content"]["cells"]
        )
        page.wait_for_function(
            f"document.querySelectorAll('.jp-Notebook .jp-CodeCell').length === {code_cells}", timeout=60_000
        )
        page.wait_for_selector(_IDLE, timeout=60_000)
        folder = page.locator(front.side_bar) if front.side_bar else None
        if folder and folder.count():
            folder.click()  # fold the side bar away: more notebook in the screenshots
        # Every page says its theme: a switch is saved in the server's settings, for the next page too.
        set_theme(page, theme)

        def live_shot() -> None:
            # A few seconds in, its tables and charts have something to show; a run over by then has no live shot.
            gone_or_grown = f"() => !document.querySelector('.playbook-live') || performance.now() - {page.evaluate('performance.now()')} > {LIVE_SHOT_AFTER * 1000}"
            page.wait_for_function(gone_or_grown, polling=100)
            panel = page.locator(".playbook-live")
            if panel.count():
                panel.first.evaluate("node => node.scrollIntoView({block: 'center'})")
                page.screenshot(path=SHOTS / f"{shot}_live_{shade(theme)}.png")
                crop(page, panel.first, SHOTS / f"{shot}_panel_{shade(theme)}.png")

        page.evaluate(SAMPLER)
        stalled = None
        try:
            _run_all(page, front, time.monotonic() + RUN_TIMEOUT, live_shot)
        except PlaywrightTimeout as e:  # the tests say what is missing; the page is still read
            stalled = e.message.splitlines()[0]
        samples = page.evaluate("window.__stopSampling()")
        live_look = page.evaluate("window.__liveLook")
        cells = page.evaluate(READ_CELLS)
        live = page.evaluate("window.__playbookLive.map(({node, ...rest}) => rest)")
        # Both front-ends scroll inside the notebook, not the page: make the page tall enough for
        # all of it.
        scroller = "document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer')"
        height = page.evaluate(f"{scroller}.scrollHeight")
        page.set_viewport_size({"width": 1400, "height": min(height + 200, 16_000)})
        page.evaluate(f"{scroller}.scrollTop = 0")
        page.wait_for_timeout(300)  # let the layout settle at the new size
        seen = {}
        for each in looks or (theme,):
            set_theme(page, each)
            seen[each] = page.evaluate("window.__pbLook(document.querySelector('.jp-Notebook'))")
            page.screenshot(path=SHOTS / f"{shot}_{shade(each)}.png", full_page=True)
    finally:
        page.close()
    return Session(
        code_cells=code_cells,
        cells=cells,
        live=live,
        samples=samples,
        home=home,
        theme=theme,
        live_look=live_look,
        looks=seen,
        stalled=stalled,
        console_errors=errors,
    )
