"""The README's third promise, outside a notebook: what a run did can be read back.  With
``events="run.jsonl"`` every call, hold, park and row outcome is a JSON line, and the lines add
up to what the run counted.

Written once and run on every engine (``engines``): one process, processes sharing a Redis store,
a dask.distributed cluster, and a Redis Cluster.  The provider is the demo's, a real HTTP server.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engines import Engine
from promises import email, people

import playbook as pb

STATUSES = ("ok", "reused", "failed", "parked", "skipped")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines()]


def _frame() -> Any:
    """40 rows asking 30 different people; rows 1, 3, 5 and 7 have no domain the play can use."""
    frame = people(40, calls=30)
    bad = frame["n"].isin([1, 3, 5, 7])
    frame.loc[bad, "domain"] = [f"not a domain {n}" for n in frame.loc[bad, "n"]]
    return frame


def _play(tool: pb.Tool) -> pb.Play:
    """The enrichment, failing a row whose domain it cannot use (whichever engine runs it first)."""

    async def play(row: Any, ctx: Any) -> dict[str, Any]:
        if row.domain.startswith("not a domain"):
            raise ValueError(f"no such domain: {row.domain}")
        return {"email": await ctx.tool(tool, domain=row.domain, first=row.first)}

    return pb.play(play, name="seen")


def _counts(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stats.items() if k != "elapsed"}


def _ended(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The stats a run's ``run_finished`` line gives."""
    [finished] = [line for line in lines if line["event"] == "run_finished"]
    return _counts(finished["stats"])


def _adds_up(lines: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    """One run's lines against the stats it ended with."""
    kinds = Counter(line["event"] for line in lines)
    assert kinds["run_started"] == 1 and kinds["run_finished"] == 1
    # the rows, as their last line settles them (copies: rows of the same id settled together)
    last: dict[int, dict[str, Any]] = {}
    for line in lines:
        if line["event"] == "row":
            last[line["position"]] = line
    settled: Counter[str] = Counter()
    for line in last.values():
        settled[line["status"]] += line["copies"]
    reused_by_memo = sum(line["calls"] for line in last.values() if line["status"] == "reused")
    calls = [line for line in lines if line["event"] == "call"]
    if not kinds["progress"]:  # a run in one process: a line per row and per call
        assert {s: settled[s] for s in STATUSES} == {s: stats[s] for s in STATUSES}
        assert sum(line["paid"] for line in calls) == stats["calls_executed"]
        assert sum(line["reused"] for line in calls) + reused_by_memo == stats["calls_reused"]
        assert sum(line["shared"] for line in calls) == stats["calls_shared"]
        assert round(sum(line["cost"] for line in calls if line["paid"]), 9) == stats["cost_spent"]
        assert kinds["call_failed"] == stats["calls_failed"]
    else:  # a cluster job: its workers' counts as they reported them, the rows they named
        said = [line for line in lines if line["event"] == "progress"][-1]
        for counter in (*STATUSES, "calls_executed", "calls_reused", "calls_shared", "calls_failed"):
            assert said[counter] == stats[counter]
        assert (settled["failed"], settled["parked"]) == (stats["failed"], stats["parked"])
    # every parked row said why, on which provider, until when, before it was settled
    parked = {p for p, line in last.items() if line["status"] == "parked"}
    said_parked = {line["position"]: line for line in lines if line["event"] == "row_parked"}
    assert parked <= set(said_parked)


def test_the_events_of_a_run_add_up_to_what_it_counted(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str], tmp_path: Path
) -> None:
    """A quota of 20 requests used up (429, Retry-After an hour) past max_wait, 4 rows that fail,
    10 rows repeating another's call; then a rerun.  Every line names its run, its kind and
    when; each run's lines add up to its stats (rows by status, calls paid, reused and shared, the
    cost, failed requests); the parked rows and the hold name the provider and the hour."""
    demo.reset(quota=20, quota_reset=3600)
    quota = name("quota")
    play = _play(email(demo, pb.Provider(quota, concurrency=2, max_wait=30)))
    path = tmp_path / "events" / "run.jsonl"
    first = engine.run(_frame(), play, concurrency=4, events=str(path))
    again = engine.run(_frame(), play, concurrency=4, events=str(path))

    lines = _lines(path)
    assert all({"event", "at", "run", "execution"} <= set(line) for line in lines)
    runs: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        runs.setdefault(line["run"], []).append(line)
    assert len(runs) == len(first.runs) + len(again.runs)
    # each run (a process's, the job's) ended with the stats its run.stats gives, and its lines add up
    ended = {run: _ended(run_lines) for run, run_lines in runs.items()}
    for stats in [*first.runs, *again.runs]:
        run = next(run for run, said in ended.items() if said == _counts(stats))  # (two may be alike)
        _adds_up(runs.pop(run), stats)
        del ended[run]

    assert first.statuses.get("failed", 0) == 4 and first.statuses.get("parked", 0) >= 1
    parks = [line for line in lines if line["event"] == "row_parked"]
    assert {(line["reason"], line["provider"]) for line in parks} == {("hold", quota)}
    assert all(line["ready_at"] > line["at"] + 3000 for line in parks)
    holds = [line for line in lines if line["event"] == "hold" and line["provider"] == quota]
    assert all(line["until"] > line["at"] + 3000 for line in holds)
    # the 429 that set it; a hold another process met and shared (through Redis) has no status here
    assert any(line["status"] == 429 for line in holds)
    failed = [line for line in lines if line["event"] == "row" and line["status"] == "failed"]
    assert {line["row"] for line in failed} == {1, 3, 5, 7}
    assert all("no such domain" in line["error"] for line in failed)
