"""The text view: a tqdm bar on a stream, as wide as the terminal, that starts with what holds rows
back; a line when a provider goes down or comes back; and a summary that says what holds rows back."""

from __future__ import annotations

import asyncio
import fcntl
import io
import itertools
import logging
import os
import pty
import re
import select
import struct
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from provider_state import hold, set_down
from vtime import run_virtual

import playbook as pb
from playbook._internal.words import time_of_day
from playbook.events import (
    CallFinished,
    KeyRetired,
    ProviderDown,
    ProviderUp,
    RowFinished,
    RowHeld,
    RowParked,
    RowStarted,
    RunFinished,
    RunStarted,
)
from playbook.providers.provider import governor
from playbook.runtime.state.reading import RunState
from playbook.ui.text import MIN_BAR, TextView


def test_summary_names_the_provider_that_holds_parked_rows(
    store: pb.ReceiptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a quota hold, the text view shows the parked count and which provider holds until when."""
    monkeypatch.delenv(
        "COLUMNS", raising=False
    )  # a log's default width (a narrower one cuts the counters off)
    quota = pb.Provider("quota", max_wait=60)
    answered = []

    @pb.tool(provider=quota)
    async def lookup(n: int) -> int:
        if len(answered) >= 3:
            raise pb.ToolError("daily quota exceeded", status=429, retry_after=3600)
        answered.append(n)
        return n

    out = io.StringIO()

    async def main() -> pb.Run:
        run = await pd.DataFrame({"n": range(8)}).play.arun(
            lookup, store=store, progress=False, background=True, concurrency=1
        )
        TextView(run.state, file=out, clock=asyncio.get_running_loop().time)
        await asyncio.wait([run._task])
        return run

    run = run_virtual(main())
    text = out.getvalue()
    assert run.stats.parked == 5
    assert text.startswith(
        "lookup: 0/8 rows (0%) [00:00<?, ? rows/s] | ok=0 "
    )  # the run parks at once: its start, then the summary
    summary = text.strip().splitlines()[-3:]
    assert summary[0].startswith(
        "lookup: 8 rows | ok 3 | reused 0 | failed 0 | parked 5 | calls 3 paid, 1 failed, 0 from receipts, 0 local"
    )
    assert summary[1].startswith("provider 'quota' holds calls until ") and summary[1].endswith(
        " (HTTP 429); 5 rows parked"
    )
    assert summary[2] == "a rerun runs the parked rows again"


def test_text_view_counts_rows_and_calls(store: pb.ReceiptStore) -> None:
    """The bar reaches the total and the summary counts paid, reused and local calls (a plain Python tool is local)."""

    @pb.tool
    async def double(n: int) -> int:
        return 2 * n

    out = io.StringIO()

    async def main() -> None:
        frame = pd.DataFrame({"n": [1, 2, 2, 3]})
        for _ in range(2):
            run = await frame.play.arun(double, store=store, progress=False, background=True)
            TextView(run.state, file=out)
            await asyncio.wait([run._task])

    run_virtual(main())
    lines = out.getvalue().strip().splitlines()
    summaries = [line for line in lines if line.startswith("double: 4 rows")]
    assert summaries[0].startswith(
        "double: 4 rows | ok 4 | reused 0 | failed 0 | calls 0 paid, 0 from receipts, 3 local"
    )
    # The memos answered every row: its local calls neither ran nor came from receipts.
    assert summaries[1].startswith(
        "double: 4 rows | ok 0 | reused 4 | failed 0 | calls 0 paid, 0 from receipts, 0 local"
    )


def _frames(text: str, play: str = "enrich") -> list[str]:
    """Each line of progress: a log's lines, or each redraw of a terminal's bar (tqdm redraws over
    the last with a carriage return)."""
    return [frame for line in text.split("\n") for frame in line.split("\r") if frame.startswith(play)]


_views: list[TextView] = []


@pytest.fixture(autouse=True)
def _close_views() -> Iterator[None]:
    """A bar left open (a test that failed mid-run) would push the next tests' bars down a line."""
    yield
    while _views:
        _views.pop().unsubscribe()


def _view(state: RunState, file: object) -> TextView:
    """A text view whose clock moves 10 s a reading: no refresh is skipped for the 10 Hz throttle,
    and a log gets a line at each."""
    ticks = itertools.count(step=10)
    view = TextView(state, file=file, clock=lambda: float(next(ticks)))
    _views.append(view)
    return view


def _scene(state: RunState, *, probe_at: float, hold_in: float = 3600) -> tuple[pb.Provider, pb.Provider]:
    """A run of 40 rows: 'acme' goes down and parks 12 rows, 'quota' holds 3 rows; 5 rows are ok."""
    acme, quota = pb.Provider("acme", rps=20, concurrency=8), pb.Provider("quota", max_wait=1)
    for provider in (acme, quota):  # as a run watches the providers its rows call
        state.providers[provider.name] = provider
        governor(provider).subscribe(state.emit)
    state.emit(RunStarted("r1", "enrich", 40))
    for pos in range(5):
        state.emit(RowStarted(pos))
        state.emit(CallFinished("acme.email", "acme", False, 1.0))
        state.emit(CallFinished("clean_domain", None, False, 0.0, local=True))
        state.emit(RowFinished(pos, "ok", None))
    set_down(acme, "ConnectError: connection refused", probe_at)
    state.emit(ProviderDown("acme", "ConnectError: connection refused"))
    for pos in range(5, 17):
        state.emit(RowStarted(pos))
        state.emit(RowParked(pos, "down", "acme", probe_at))
        state.emit(RowFinished(pos, "parked", "provider 'acme' is down"))
    hold(quota, hold_in)
    for pos in range(17, 20):
        state.emit(RowStarted(pos))
        state.emit(RowHeld(pos, "quota", quota.status().hold_until_at, 429))
    return acme, quota


def test_a_narrow_log_still_shows_waiting_and_parked_rows_and_down_providers_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Written to a log 60 columns wide, every line fits, and while rows wait it starts with the
    waiting and parked counts and the providers that are down or hold calls; the counters come after.
    A log gets plain lines, never a carriage return."""
    monkeypatch.setenv("COLUMNS", "60")
    out = io.StringIO()
    state = RunState()
    _view(state, out)
    _scene(state, probe_at=time.time() + 30)
    frames = _frames(out.getvalue())
    assert max(len(frame) for frame in frames) <= 60 and "\r" not in out.getvalue()
    assert frames[-1].startswith("enrich [waiting=3 parked=12 | 1 down, 1 held]: 17/40 rows"), frames[
        -1
    ]  # no room for names
    state.emit(RunFinished("r1", False))


def test_a_wide_bar_says_until_when_and_how_many_rows_and_counts_paid_and_local_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With room, the bar gives each provider's rows and times, then ok/reused/failed and the paid, reused and local calls."""
    monkeypatch.setenv("COLUMNS", "250")
    out = io.StringIO()
    state = RunState()
    _view(state, out)
    probe = time.time() + 30
    _, quota = _scene(state, probe_at=probe)
    last = _frames(out.getvalue())[-1]
    assert last.startswith(
        f"enrich [waiting=3 parked=12 | acme down (12 rows, probe {time_of_day(probe)}) | "
        f"quota held until {time_of_day(quota.status().hold_until_at)} (3 rows)]: "
    ), last
    assert last.endswith(
        ": 17/40 rows (42%) [00:00<?, ? rows/s] | ok=5 reused=0 failed=0 | calls 5 paid, 0 from receipts, 5 local"
    ), last
    state.emit(RunFinished("r1", False))


def test_the_bar_follows_the_terminal_width() -> None:
    """On a terminal the bar is as wide as the window, and follows it when the window is resized."""
    master, slave = pty.openpty()
    terminal = os.fdopen(slave, "w", encoding="utf-8")

    def resize(columns: int) -> None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))

    def drawn() -> list[str]:
        terminal.flush()
        chunks = []
        while select.select([master], [], [], 0.2)[0]:
            chunks.append(os.read(master, 65536))
        return _frames(b"".join(chunks).decode("utf-8", "replace"))

    try:
        resize(80)
        state = RunState()
        _view(state, terminal)
        probe = time.time() + 30
        _scene(state, probe_at=probe)
        narrow = drawn()
        assert max(len(frame) for frame in narrow) <= 79  # tqdm leaves the last column free
        assert narrow[-1].startswith("enrich [waiting=3 parked=12 | acme down | quota held]: "), narrow[-1]
        bar = re.search(r"\d+%\|(.*?)\| \d", narrow[-1])
        assert bar and len(bar.group(1)) >= MIN_BAR, narrow[-1]  # the counters gave way, not the bar
        resize(200)
        state.emit(RowFinished(0, "ok", None))
        wide = drawn()[-1]
        assert 79 < len(wide) <= 199, wide
        assert wide.startswith(
            f"enrich [waiting=3 parked=12 | acme down (12 rows, probe {time_of_day(probe)}) | quota held until "
        ), wide
        state.emit(RunFinished("r1", False))
    finally:
        terminal.close()
        os.close(master)


def test_the_summary_gives_a_line_per_provider_that_is_down_holds_or_has_parked_rows() -> None:
    """At the end: the counters with paid, reused and local calls, then for each provider down since when, why, rows
    parked and the next probe, or held until when with the status, and the rows the budget parked."""
    out = io.StringIO()
    now = [1_700_000_000.0]
    state = RunState(wall=lambda: now[0])
    _view(state, out)
    probe = now[0] + 30
    _, quota = _scene(state, probe_at=probe)
    state.emit(RowParked(20, "budget", None, None))
    state.emit(RowFinished(20, "parked", "budget: max_cost", copies=2))
    state.emit(RunFinished("r1", False))
    lines = out.getvalue().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("enrich: 40 rows"))
    assert lines[start].startswith(
        "enrich: 40 rows | ok 5 | reused 0 | failed 0 | parked 14 | calls 5 paid, 0 from receipts, 5 local | cost $5.00 spent, $0.00 saved"
    ), lines[start]
    assert lines[start + 1 :] == [
        f"provider 'acme' is down since {time_of_day(now[0])}: ConnectError: connection refused; 12 rows parked; "
        f"next probe at {time_of_day(probe)}",
        f"provider 'quota' holds calls until {time_of_day(quota.status().hold_until_at)} (HTTP 429)",
        "2 rows parked: the budget ran out",
        "a rerun runs the parked rows again",
        "",
    ]


def test_the_summary_and_the_stats_count_the_tokens_of_paid_calls() -> None:
    """Three paid LLM answers of 29,800 tokens each, one reused and a local call: the summary says
    89.4k tokens beside the paid calls, and the stats count them; a run with none counts 0."""
    out = io.StringIO()
    state = RunState()
    _view(state, out)
    state.emit(RunStarted("r1", "write", 4))
    for _ in range(3):
        state.emit(CallFinished("llm", "openai", False, 0.01, tokens=29_800.0))
    state.emit(CallFinished("llm", "openai", True, 0.01))
    state.emit(CallFinished("clean", None, False, 0.0, local=True))
    state.emit(RunFinished("r1", False))
    said = next(line for line in out.getvalue().split("\n") if line.startswith("write: 4 rows"))
    assert "| calls 3 paid (89.4k tokens), 1 from receipts, 1 local |" in said, said
    assert state.stats().tokens == 89_400 and state.stats().model_dump()["tokens"] == 89_400
    quiet = RunState()
    quiet.emit(CallFinished("email", "acme", False, 1.0))
    assert quiet.stats().tokens == 0


def test_a_provider_going_down_and_coming_back_gets_a_line_of_its_own() -> None:
    """ProviderDown writes one line (why, the next probe), a failed probe none, ProviderUp one; the bar is redrawn each time."""
    out = io.StringIO()
    state = RunState()
    _view(state, out)
    acme = state.providers["acme"] = pb.Provider("acme")
    state.emit(RunStarted("r1", "enrich", 10))
    probe = time.time() + 30
    set_down(acme, "connection refused", probe)
    state.emit(ProviderDown("acme", "connection refused"))
    assert _frames(out.getvalue())[-1].startswith(
        f"enrich [acme down (0 rows, probe {time_of_day(probe)})]: "
    )
    state.emit(ProviderDown("acme", "connection refused"))  # the probe failed: still the same outage
    set_down(acme, None)
    state.emit(ProviderUp("acme"))
    assert _frames(out.getvalue())[-1].startswith("enrich: ")  # nothing waits any more
    state.emit(RunFinished("r1", False))
    said = [line for line in out.getvalue().replace("\r", "\n").split("\n") if line.startswith("provider")]
    assert said == [
        f"provider 'acme' is down: connection refused; its rows wait for it up to max_wait, then park; next probe at {time_of_day(probe)}",
        "provider 'acme' is up again",
    ], out.getvalue()


def test_a_log_gets_a_plain_line_every_few_seconds_through_a_quiet_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Written to a log: a line when the run starts, then one every LOG_EVERY seconds while rows
    wait on a hold (no event comes), and never a carriage return."""
    monkeypatch.delenv("COLUMNS", raising=False)  # a log's default width

    async def main() -> str:
        out = io.StringIO()
        state = RunState(clock=asyncio.get_running_loop().time)
        view = TextView(state, file=out, clock=asyncio.get_running_loop().time)
        state.emit(RunStarted("r", "enrich", 10))
        for pos in range(3):
            state.emit(RowStarted(pos))
            state.emit(RowFinished(pos, "ok", None))
        assert _frames(out.getvalue()) == [
            "enrich: 0/10 rows (0%) [00:00<?, ? rows/s] | ok=0 reused=0 failed=0"
        ]
        await asyncio.sleep(5.5)
        assert _frames(out.getvalue())[-1].startswith(
            "enrich: 3/10 rows (30%) [00:05<00:11, 1.7s/row] | ok=3 "
        )
        await asyncio.sleep(20.0)
        view.unsubscribe()
        assert 5 <= len(_frames(out.getvalue())) <= 7 and "\r" not in out.getvalue()
        return out.getvalue()

    run_virtual(main())


def test_a_key_leaving_its_pool_gets_a_line_of_its_own_and_a_warning_in_the_summary() -> None:
    out = io.StringIO()
    state = RunState()
    _view(state, out)
    state.emit(RunStarted("r1", "enrich", 10))
    state.emit(KeyRetired("openai", "OPENAI_KEY_B …9c1d", "HTTP 401", 1))
    state.emit(RunFinished("r1", False))
    lines = out.getvalue().replace("\r", "\n").split("\n")
    said = "provider 'openai': key OPENAI_KEY_B …9c1d left the pool for the run (HTTP 401); 1 other key(s) went on"
    assert said in lines and f"warning: {said}" in lines and state.notices == [said]
    last = KeyRetired("openai", "OPENAI_KEY_A …77aa", "HTTP 403", 0).said()
    assert last.endswith(
        "(HTTP 403); no key was left, so the run stopped (run.retry() tries every key again)"
    )


def test_a_log_line_says_elapsed_remaining_and_rate_and_no_eta_before_a_rate() -> None:
    """Written to a log, each line of progress ends its count with tqdm's [elapsed<remaining,
    rate]: the first line has neither rate nor ETA; then rows done over the time since the line
    before give both; a hold with no row done gives neither again."""

    async def main() -> list[str]:
        out = io.StringIO()
        loop = asyncio.get_running_loop()
        state = RunState(clock=loop.time)
        view = TextView(state, file=out, clock=loop.time)
        state.emit(RunStarted("r", "enrich", 100))
        for pos in range(40):  # 2 rows a second for 20 s
            await asyncio.sleep(0.5)
            state.emit(RowStarted(pos))
            state.emit(RowFinished(pos, "ok", None))
        await asyncio.sleep(12.0)  # then nothing finishes
        view.unsubscribe()
        return _frames(out.getvalue())

    frames = run_virtual(main())
    assert frames[0].startswith("enrich: 0/100 rows (0%) [00:00<?, ? rows/s] | ok=0"), frames[0]
    # at 20 s (a line every LOG_EVERY = 5 s, the first at 0): 40 done, 60 left at 2 rows/s
    assert any(f.startswith("enrich: 40/100 rows (40%) [00:20<00:30, 2 rows/s] | ok=40") for f in frames), (
        frames
    )
    assert frames[-1].startswith("enrich: 40/100 rows (40%) [00:3") and "<?, ? rows/s]" in frames[-1], frames[
        -1
    ]


def test_a_retry_prints_a_summary_of_what_it_did_alone(
    store: pb.ReceiptStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """The text view follows run.retry(): its summary counts the rows the retry ran and the calls it
    made, not the run before and the retry together."""
    failing = {"on": True}

    @pb.tool(name="priced", version="1", cost=1.0)
    def priced(n: int) -> int:
        return n

    @pb.play
    async def gated(row, ctx):  # type: ignore[no-untyped-def]
        value = await ctx.tool(priced, n=row.n)
        if row.n % 3 == 0 and failing["on"]:
            raise RuntimeError("not yet")
        return {"v": value}

    run = pd.DataFrame({"n": range(9)}).play.run(gated, store=store, progress="text")
    first = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gated: 9 rows")]
    assert first and first[-1].startswith("gated: 9 rows | ok 6 | reused 0 | failed 3 | calls 9 paid"), first
    failing["on"] = False
    run.retry()
    said = capsys.readouterr().err.splitlines()
    summary = [line for line in said if " saved | " in line]
    assert len(summary) == 1 and summary[0].startswith(
        "gated: 3 rows | ok 3 | reused 0 | failed 0 | calls 0 paid, 3 from receipts"
    ), said


def test_the_widget_asked_for_outside_a_notebook_says_so_and_shows_the_text_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """``progress="widget"`` in a script: no notebook can show the panel, so the run says so and
    shows its text bar (and summary), and ends whole."""

    @pb.tool
    async def slowish(n: int) -> int:
        await asyncio.sleep(0.01)
        return n

    with caplog.at_level(logging.WARNING, logger="playbook"):
        run = pd.DataFrame({"n": range(40)}).play.run(
            slowish, concurrency=4, progress="widget", store=tmp_path
        )
    assert run.stats.ok == 40 and list(run.result["slowish"]) == list(range(40))
    assert 'progress="widget" shows in a notebook' in caplog.text
    assert "slowish: 40 rows | ok 40" in capsys.readouterr().err  # the text view's summary
