"""Notebooks in a real JupyterLab, driven by a real browser.

A module fixture copies ``notebooks/01_quickstart.ipynb`` (outputs cleared, so nothing on the page
predates this run) and writes ``big_run.ipynb`` into a temporary Jupyter root, starts
``jupyter lab`` on loopback with a random token, an isolated Jupyter config/data/settings
directory (so the kernel is this venv's ``python3``) and a temporary ``PLAYBOOK_HOME``; another
launches headless Chromium for Playwright.  Each scenario opens its notebook and clicks Run > Run
All Cells, which queues every cell at once (cells wait behind a blocking ``map()``), while a
MutationObserver in the page records every ``.playbook-live`` panel the ipywidgets front-end
draws.  The tests then read what the page shows: the live panel with its progress bar, the static
summaries that replace it, and the counts the notebook printed.

The quickstart checks the panel is drawn and gives way to the summaries.  The big run maps a play
over 100,000 rows (one in 7 fails with its own message, one in 11 is parked) while the page
samples the panel every 200 ms: its done count must keep moving, and neither the panel nor the
document may grow with the failed and parked rows.  Screenshots go to ``build/browser/``.  The
harness (server, browser, page scripts, ``Session``) is in ``lab_harness.py`` beside this file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from lab_harness import Lab, Session, drive, isolated_env, jupyter_lab, launch_chromium
from playwright.sync_api import Browser

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01_quickstart.ipynb"

# The big run: every 7th row fails with a message of its own, every 11th other row is parked
# behind a provider held for an hour.  The second map replays the first one's receipts, so it
# takes seconds, not minutes, and its rows reach the panel far faster than it can redraw.
BIG_ROWS = 100_000
BIG_FAILED = sum(n % 7 == 0 for n in range(BIG_ROWS))  # 14,286 error groups of one row each
BIG_PARKED = sum(n % 11 == 0 and n % 7 != 0 for n in range(BIG_ROWS))  # 7,792
BIG_RUN = [
    """\
import pandas as pd
import playbook as pb


@pb.tool
async def lookup(n: int) -> int:
    return n * 2


quota = pb.Provider("quota", max_wait=1)


@pb.tool(provider=quota)
async def scarce(n: int) -> int:
    raise pb.ToolError("daily quota exceeded", status=429, retry_after=3600)


@pb.play
async def messy(row, ctx):
    value = await ctx.tool(lookup, n=row.n)
    if row.n % 7 == 0:
        raise ValueError(f"no match for {row.n}")
    if row.n % 11 == 0:
        value = await ctx.tool(scarce, n=row.n)
    return {"value": value}


"""
    + f'huge = pd.DataFrame({{"n": range({BIG_ROWS:_})}})',
    "warm = huge.play.map(lookup, progress=False)  # receipts first: the timed map replays them",
    'out = huge.play.map(messy, refresh="rows")  # every row runs again, from its receipts',
]
LIMIT = 20  # rows a parked or errors table shows, live or static (playbook.ui.html.LIMIT)
# Nodes (elements and text) in the big run's live panel with both tables full: measured at 443.
# The bound leaves room for other widget layouts and wider cells; a row costs 7 to 9 nodes, so
# uncapped tables of this run would add some 170,000.
PANEL_NODES = 800
# How far the whole document may drift while the panel is live: JupyterLab's own prompts and
# status bar change a little as cells run.  Measured at 4 to 14; the bound is a dozen table rows.
DOCUMENT_DRIFT = 100
MAX_GAP = 1.5  # seconds the panel's done count may stand still while the run goes on


def _big_run_notebook() -> str:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in BIG_RUN])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nbformat.writes(notebook)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A JupyterLab server on loopback serving a copy of the quickstart and the big run: (base url, token, home)."""
    root = tmp_path_factory.mktemp("lab")
    private = tmp_path_factory.mktemp("jupyter")
    home = private / "playbook-home"
    notebook = json.loads(NOTEBOOK.read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    (root / NOTEBOOK.name).write_text(json.dumps(notebook, indent=1))
    (root / "big_run.ipynb").write_text(_big_run_notebook())
    env = isolated_env(private) | {"PLAYBOOK_HOME": str(home)}
    env.pop("DEMO_API_KEY", None)
    with jupyter_lab(root, env, private / "lab.log") as (base, token):
        yield base, token, home


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """Headless Chromium, one page per notebook."""
    with launch_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def session(chromium: Browser, lab: Lab) -> Session:
    """The quickstart, every code cell run."""
    return drive(chromium, lab, NOTEBOOK.name)


@pytest.fixture(scope="module")
def big_run(chromium: Browser, lab: Lab) -> Session:
    """The 100,000-row notebook, every code cell run, with what the samples measured printed."""
    run = drive(chromium, lab, "big_run.ipynb")
    print("big run:", *(f"  {name}: {value}" for name, value in run.figures().items()), sep="\n")
    return run


def test_live_panel_renders_with_a_progress_bar_in_jupyterlab(session: Session) -> None:
    """During the first map, JupyterLab's widget front-end draws the .playbook-live panel with its IntProgress bar."""
    assert session.live, f"no .playbook-live panel was ever drawn; console errors: {session.console_errors[:10]}"
    first_cell, first = session.summaries()[0]
    panel = session.live[0]
    assert panel["cell"] == first_cell  # it was the first map's panel
    assert panel["progress"]
    rows = first["rows"]
    assert any(re.search(rf"· running · \d+/{rows} rows", head) for head in panel["heads"]), panel["heads"]


def test_live_panel_gives_way_to_the_static_summary(session: Session) -> None:
    """Once a run finishes its live panel is gone, and its cell shows the static div.playbook-run summary."""
    assert not any(cell["live"] for cell in session.cells)
    cells_with_summary = {i for i, _ in session.summaries()}
    assert {panel["cell"] for panel in session.live} <= cells_with_summary


def test_first_summary_agrees_with_what_the_notebook_printed(session: Session) -> None:
    """The first run's summary counts the rows, done and failed that the next cell prints."""
    printed = re.search(r"(\d+) rows: (\d+) done, (\d+) failed", session.printed())
    assert printed, session.printed()
    total, done, failed = map(int, printed.groups())
    _, first = session.summaries()[0]
    assert first["rows"] == total > 0
    assert first["ok"] + first["reused"] == done
    assert first["failed"] == failed
    assert first["calls paid"] > 0  # a fresh PLAYBOOK_HOME: the first run pays for its calls


def test_rerun_summary_shows_every_row_reused_and_nothing_paid(session: Session) -> None:
    """The rerun's summary shows all rows reused and no call paid; the notebook prints no request sent."""
    (_, first), (_, again) = session.summaries()[:2]
    assert again["rows"] == again["reused"] == first["rows"]
    assert again["ok"] == again["failed"] == again["calls paid"] == 0
    assert "requests sent by the rerun: 0" in session.printed()
    assert f"rows reused: {first['rows']}" in session.printed()


@pytest.mark.parametrize("notebook", ["session", "big_run"])
def test_no_cell_shows_an_error(notebook: str, request: pytest.FixtureRequest) -> None:
    """Every code cell ran (it has an execution count) and none shows a traceback or stderr."""
    run: Session = request.getfixturevalue(notebook)
    assert run.stalled is None, (run.stalled, [c["prompt"] for c in run.cells])
    assert len(run.cells) == run.code_cells
    assert all(re.fullmatch(r"\[\d+\]:", cell["prompt"].strip()) for cell in run.cells), [c["prompt"] for c in run.cells]
    stderr = [out["text"] for cell in run.cells for out in cell["outputs"] if out["mime"] == "application/vnd.jupyter.stderr"]
    assert not stderr, stderr[0][:2000]


def test_receipts_go_to_the_server_playbook_home(session: Session) -> None:
    """The notebook's receipts land in the PLAYBOOK_HOME given to the server, not in the repository."""
    assert session.home.is_dir() and any(session.home.iterdir())


def test_big_run_panel_keeps_updating(big_run: Session) -> None:
    """While 100,000 rows run, the live panel's done count and bar keep moving, never standing still for long."""
    live = big_run.live_samples()
    figures = big_run.figures()
    assert live, f"no live panel was sampled; console errors: {big_run.console_errors[:10]}"
    done = figures["done values"]
    assert None not in done and done == sorted(done), done
    assert figures["distinct done"] >= 5, figures
    assert len({s["bar"] for s in live}) >= 5, [s["bar"] for s in live]
    assert figures["max gap s"] <= MAX_GAP, figures


def test_big_run_panel_stays_bounded(big_run: Session) -> None:
    """The live panel's tables stay capped, so neither the panel nor the page grows with failed and parked rows."""
    live = big_run.live_samples()
    figures = big_run.figures()
    assert live
    assert figures["max table rows"] <= LIMIT + 1, figures  # the head row, and LIMIT rows at most
    # The parked and errors tables are there, and full, so the bound below is tested at its worst.
    assert any(s["table_rows"].count(LIMIT + 1) >= 2 for s in live), [s["table_rows"] for s in live]
    assert figures["max panel nodes"] <= PANEL_NODES, figures
    # From the first sample with both tables full (the panel at its largest; before that the
    # tables fill, which the bound on panel nodes covers), the page must not grow.
    full = [s["document_nodes"] for s in live if s["table_rows"].count(LIMIT + 1) >= 2]
    assert abs(full[-1] - full[0]) <= DOCUMENT_DRIFT, (full[0], full[-1], figures)
    assert max(full) - full[0] <= DOCUMENT_DRIFT, (full[0], max(full), figures)


def test_big_run_summary_is_capped(big_run: Session) -> None:
    """The big run's static summary counts every row and failure, and lists only the first parked rows and errors."""
    assert not any(cell["live"] for cell in big_run.cells)
    ((_, counters),) = big_run.summaries()
    assert counters["rows"] == BIG_ROWS
    assert counters["failed"] == BIG_FAILED
    assert counters["parked"] == BIG_PARKED
    ((_, summary),) = big_run.runs()
    tables = {tuple(t["head"]): t["rows"] for t in summary["tables"]}
    parked, errors = tables[("row", "reason", "provider", "ready at")], tables[("rows", "error", "e.g. row")]
    assert len(parked) == len(errors) == LIMIT
    assert {row[0] for row in errors} == {"1"}  # each failure has a message of its own
    assert errors[0][1].startswith("ValueError: no match for 0"), errors[0]
    more = [note for note in summary["notes"] if note.startswith("… and")]
    assert more == [f"… and {BIG_PARKED - LIMIT:,} more", f"… and {BIG_FAILED - LIMIT:,} more"], summary["notes"]
