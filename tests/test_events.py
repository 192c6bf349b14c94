"""``events=`` and ``run.events()``: a run's calls, holds and outcomes kept as JSON lines, in memory,
in a file or handed to a function; bad values refused before anything runs, naming the option.
(That the lines add up to ``run.stats`` on every engine is ``test_promises_seen``.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pytest

import playbook as pb


@pb.tool(name="doubled", version="1")
async def doubled(x: int) -> int:
    if x % 4 == 3:
        raise ValueError(f"no double for {x}")
    return x * 2


async def _play(row: Any, ctx: Any) -> dict[str, Any]:
    return {"y": await ctx.tool(doubled, x=int(row.x))}


PLAY = pb.play(_play, name="doubling")


def test_events_true_keeps_them_in_memory_and_a_retry_has_its_own(tmp_path: Path) -> None:
    """Every line names its kind, when, the run and its execution; a retry's lines are its own
    (execution 1) and ``run.previous.events()`` still gives the first's."""
    frame = pd.DataFrame({"x": range(8)})
    run = frame.play.run(PLAY, store=tmp_path, progress=False, events=True)
    lines = run.events()
    assert lines[0]["event"] == "run_started"
    assert lines[-1]["event"] == "run_finished" and lines[-1]["stats"] == run.stats.model_dump()
    assert {line["run"] for line in lines} == {run.run_id} and {line["execution"] for line in lines} == {0}
    rows = {line["position"]: line for line in lines if line["event"] == "row"}
    assert sorted(rows) == list(range(8))
    assert [rows[p]["status"] for p in (3, 7)] == ["failed", "failed"]
    assert "no double for 3" in rows[3]["error"] and rows[3]["group"]
    calls = [line for line in lines if line["event"] == "call"]
    assert sorted(line["position"] for line in calls) == [0, 1, 2, 4, 5, 6]
    assert all(line["tool"] == "doubled" and line["local"] for line in calls)
    json.dumps(lines)  # JSON as they are

    retry = run.retry()
    again = retry.events()
    assert {line["execution"] for line in again} == {1} and again[-1]["stats"] == retry.stats.model_dump()
    assert [line["position"] for line in again if line["event"] == "row"] == [3, 7]
    assert run.events() == lines  # the first run's, as they were


def test_events_go_to_a_file_as_json_lines_appended_run_after_run(tmp_path: Path) -> None:
    """A file (its folder made) gets a line per event; a second run appends its own; each run's
    ``events()`` reads back its lines only; a last line cut short (a killed process) is passed over."""
    frame = pd.DataFrame({"x": range(6)})
    path = tmp_path / "logs" / "run.jsonl"
    first = frame.play.run(PLAY, store=tmp_path / "s", progress=False, events=path)
    second = frame.play.run(PLAY, store=tmp_path / "s", progress=False, events=str(path))
    texts = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(text) for text in texts] == first.events() + second.events()
    assert {line["status"] for line in second.events() if line["event"] == "row"} == {"reused", "failed"}
    with path.open("a", encoding="utf-8") as out:
        out.write('{"event": "row", "at": 1')  # cut short
    assert second.events() == [json.loads(text) for text in texts[len(first.events()) :]]


def test_events_handed_to_a_function_as_they_happen(tmp_path: Path) -> None:
    """A function is handed each line as it happens; ``run.events()`` then says it has none to give."""
    heard: list[dict[str, Any]] = []
    run = pd.DataFrame({"x": range(3)}).play.run(PLAY, store=tmp_path, progress=False, events=heard.append)
    assert heard[0]["event"] == "run_started" and heard[-1]["event"] == "run_finished"
    with pytest.raises(pb.PlayDefinitionError, match="handed its events to the function"):
        run.events()


def test_a_run_without_events_says_how_to_keep_them(tmp_path: Path) -> None:
    run = pd.DataFrame({"x": range(3)}).play.run(PLAY, store=tmp_path, progress=False)
    with pytest.raises(pb.PlayDefinitionError, match=r"kept no events; start it with events='run.jsonl'"):
        run.events()


@pytest.mark.parametrize(
    ("events", "said"),
    [
        (42, "events=42: events must be a file to append JSON Lines to"),
        ("  ", "events='  ': events must be a file name, not empty"),
        ("{dir}", "is a directory: name a file"),
        ("{dir}/a-file/run.jsonl", "a-file is a file, not a folder"),
        ("{dir}/x\0.jsonl", "cannot write there"),
    ],
    ids=["a number", "empty", "a directory", "under a file", "a NUL"],
)
def test_bad_events_are_refused_before_anything_runs(tmp_path: Path, events: Any, said: str) -> None:
    """Nothing runs (no receipt, no memo) when ``events=`` cannot be kept."""
    (tmp_path / "a-file").write_text("")
    if isinstance(events, str):
        events = events.replace("{dir}", str(tmp_path))
    store = tmp_path / "store"
    with pytest.raises(pb.PlayDefinitionError, match=said):
        pd.DataFrame({"x": range(3)}).play.map(PLAY, store=store, progress=False, events=events)
    assert pb.ReceiptStore(store).stats()["receipts"] == 0


def test_row_labels_of_any_kind_are_json(tmp_path: Path) -> None:
    """Index labels JSON has no form for (dates, tuples of a MultiIndex, numpy ints, NaN) are
    written as JSON has them: ISO text, lists, ints, text."""
    index = pd.MultiIndex.from_tuples(
        [(pd.Timestamp("2026-01-02"), np.int64(1)), (pd.Timestamp("2026-01-03"), np.int64(2))]
    )
    frame = pd.DataFrame({"x": [0, 1]}, index=index)
    path = tmp_path / "run.jsonl"
    frame.play.map(PLAY, store=tmp_path / "s", progress=False, events=path)
    rows = [json.loads(t) for t in path.read_text().splitlines() if '"event": "row"' in t]
    assert [row["row"] for row in rows] == [["2026-01-02T00:00:00", 1], ["2026-01-03T00:00:00", 2]]
    frame = pd.DataFrame({"x": [0, 1]}, index=[float("nan"), 2.5])
    run = frame.play.run(PLAY, store=tmp_path / "s", progress=False, events=True)
    assert [line["row"] for line in run.events() if line["event"] == "row"] == ["nan", 2.5]


def test_a_polars_map_keeps_its_events(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    out = pl.DataFrame({"x": [0, 1, 2]}).play.map(PLAY, store=tmp_path / "s", progress=False, events=path)
    lines = [json.loads(t) for t in path.read_text().splitlines()]
    assert out.height == 3 and sum(line["event"] == "row" for line in lines) == 3


def test_hostile_text_stays_one_line_and_reads_back_the_same(tmp_path: Path) -> None:
    """A label with a lone surrogate, a newline and a line separator (scraped text): one line per
    event in the file (ASCII, escaped), and read back as it was."""
    label = "bad\ud800\nlabel\u2028end"
    path = tmp_path / "run.jsonl"
    run = pd.DataFrame({"x": [3]}, index=pd.Index([label], dtype=object)).play.run(
        PLAY, store=tmp_path / "s", progress=False, events=path
    )
    data = path.read_bytes()
    assert data.isascii() and len(data.splitlines()) == len(run.events()) == 3
    [row] = [line for line in run.events() if line["event"] == "row"]
    assert row["row"] == label and row["status"] == "failed"


def test_a_function_that_raises_costs_the_run_nothing(
    tmp_path: Path, demo: pb.demo.DemoServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A function given as events= that raises on a paid call's line: every row still ends ok with
    its receipt written, the run says its events stopped, and a rerun pays nothing."""

    def sink(line: dict[str, Any]) -> None:
        if line["event"] == "call":
            raise RuntimeError("the sink broke")

    play = enrich_with(pb.demo.email_tool(demo, provider=pb.Provider("acme-sink")))
    frame = pd.DataFrame({"domain": [f"x{i}.com" for i in range(6)], "first": ["a"] * 6})
    run = frame.play.run(play, store=tmp_path, progress=False, events=sink)
    assert run.stats.ok == 6 and run.stats.failed == 0 and demo.stats()["requests"] == 6
    assert any("the function given as events= raised RuntimeError: the sink broke" in n for n in run.notices)
    assert "went on without keeping its events" in caplog.text
    again = frame.play.run(play, store=tmp_path, progress=False)
    assert again.stats.reused == 6 and demo.stats()["requests"] == 6


def test_a_file_that_cannot_be_written_mid_run_costs_the_run_nothing(tmp_path: Path) -> None:
    """The events file's folder taken away mid-run (a full or unmounted disk): the rows end as
    they would, and the run says its events stopped."""
    folder = tmp_path / "logs"
    path = folder / "run.jsonl"
    calls = 0

    @pb.tool(name="removing", version="1")
    async def removing(x: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            path.unlink()
            folder.rmdir()
            folder.write_text("")  # the folder is now a file: nothing can be appended
        return x

    async def play(row: Any, ctx: Any) -> dict[str, Any]:
        return {"y": await ctx.tool(removing, x=int(row.x))}

    run = pd.DataFrame({"x": range(1000)}).play.run(
        pb.play(play, name="removing"), store=tmp_path / "s", progress=False, events=path
    )
    assert run.stats.ok == 1000
    assert any("events could not be written to" in n for n in run.notices)


def test_a_polars_run_gives_its_events(tmp_path: Path) -> None:
    """``PolarsRun.events()`` is its run's, and a retry's its own."""
    run = pl.DataFrame({"x": [0, 1, 3]}).play.run(PLAY, store=tmp_path, progress=False, events=True)
    rows = sorted((line["position"], line["status"]) for line in run.events() if line["event"] == "row")
    assert rows == [(0, "ok"), (1, "ok"), (2, "failed")]
    assert {line["execution"] for line in run.retry().events()} == {1}


def enrich_with(tool: pb.Tool) -> pb.Play:
    async def play(row: Any, ctx: Any) -> dict[str, Any]:
        return {"email": await ctx.tool(tool, domain=row.domain, first=row.first)}

    return pb.play(play, name="enrich-events")
