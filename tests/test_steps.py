"""ctx.step (a durable per-row memo) and ctx.sleep (a durable timer), in virtual time and against
the demo provider's async jobs: submit, sleep, poll."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb
from playbook.events import RowHeld, RowSleeping

EPOCH = 1_800_000_000.0


def virtual_store(path: Path) -> pb.ReceiptStore:
    """A store whose clock (receipt times, sleep deadlines) is the virtual loop's."""
    return pb.ReceiptStore(path, clock=lambda: EPOCH + asyncio.get_running_loop().time())


async def launch(
    frame: pd.DataFrame, play: Any, store: pb.ReceiptStore, **opts: Any
) -> tuple[pb.Run, list[tuple[float, Any]]]:
    run = await frame.play.arun(play, store=store, progress=False, background=True, **opts)
    events: list[tuple[float, Any]] = []
    run.state.subscribe(lambda e: events.append((asyncio.get_running_loop().time(), e)))
    await run._task
    return run, events


def test_step_runs_once_per_row_across_replays_and_reruns(tmp_path: Path) -> None:
    """A step's function runs once per row: a replay after a hold and a rerun of an edited play reuse its value."""
    submitted: list[int] = []
    limited = pb.Provider("p")

    async def submit(n: int) -> dict[str, Any]:
        submitted.append(n)
        return {"job": f"j{n}", "parts": (n, n)}

    @pb.tool(provider=limited)
    async def fetch(job: str) -> str:
        if job == "j1" and fetch_calls.count(job) == 0:
            fetch_calls.append(job)
            raise pb.ToolError("slow down", status=429, retry_after=20)
        fetch_calls.append(job)
        return job.upper()

    fetch_calls: list[str] = []

    @pb.play(name="jobs")
    async def v1(row, ctx):
        job = await ctx.step("submit", submit, row.n)
        return {"job": job["job"], "parts": job["parts"], "got": await ctx.tool(fetch, job=job["job"])}

    @pb.play(name="jobs", version="2")
    async def v2(row, ctx):
        job = await ctx.step("submit", submit, row.n)
        return {"job": job["job"], "again": True}

    store = virtual_store(tmp_path / "s")
    frame = pd.DataFrame({"n": [0, 1, 2]})

    async def main() -> tuple[pb.Run, pb.Run]:
        first, events = await launch(frame, v1, store)
        assert 1 in [e.position for _, e in events if isinstance(e, RowHeld)]  # replayed after the hold
        second, _ = await launch(frame, v2, store)
        return first, second

    first, second = run_virtual(main())
    assert first.result["play_status"].tolist() == ["ok"] * 3
    assert first.result["parts"].tolist() == [(0, 0), (1, 1), (2, 2)]  # exactly as returned, every time
    assert first.result["got"].tolist() == ["J0", "J1", "J2"]
    assert second.result["play_status"].tolist() == ["ok"] * 3
    assert sorted(submitted) == [0, 1, 2]  # not again for the held row, nor for the edited play


def test_step_value_without_json_form_fails_the_row(store: pb.ReceiptStore) -> None:
    """A step that returns something with no JSON form fails that row, naming the step."""

    @pb.play
    async def play(row, ctx):
        return {"v": await ctx.step("make", lambda: object() if row.n else 1)}

    out = pd.DataFrame({"n": [0, 1]}).play.map(play, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok", "failed"]
    assert (
        "step 'make' returned a value with no JSON form (a value of type builtins.object"
        in out.loc[1, "play_error"]
    )


def test_step_with_a_sync_function_and_arguments(store: pb.ReceiptStore) -> None:
    """A plain function works as a step (run off the loop), with positional arguments."""
    calls = []

    def add(a: int, b: int) -> int:
        calls.append((a, b))
        return a + b

    @pb.play
    async def play(row, ctx):
        return {"sum": await ctx.step("add", add, row.n, 10)}

    frame = pd.DataFrame({"n": [1, 2]})
    assert frame.play.map(play, store=store, progress=False)["sum"].tolist() == [11, 12]
    assert frame.play.map(play, store=store, progress=False, refresh="rows")["sum"].tolist() == [11, 12]
    assert calls == [(1, 10), (2, 10)] or sorted(calls) == [(1, 10), (2, 10)]


def test_sleep_releases_the_slot_and_wakes_on_time(tmp_path: Path) -> None:
    """A long sleep steps aside (other rows use the slot) and the row resumes at its wake time."""
    finished: dict[int, float] = {}

    @pb.play
    async def play(row, ctx):
        if row.n == 0:
            await ctx.sleep(30)
        finished[row.n] = asyncio.get_running_loop().time()
        return {"n2": row.n * 2}

    run, events = run_virtual(
        launch(pd.DataFrame({"n": [0, 1, 2]}), play, virtual_store(tmp_path / "s"), concurrency=1)
    )
    assert run.result["play_status"].tolist() == ["ok"] * 3
    assert finished[1] < 1 and finished[2] < 1
    assert finished[0] == pytest.approx(30.0, abs=0.01)
    assert not [e for _, e in events if isinstance(e, RowHeld)]  # no provider holds it
    asleep = [e for _, e in events if isinstance(e, RowSleeping)]
    assert [e.position for e in asleep] == [0]
    assert asleep[0].until == pytest.approx(EPOCH + 30.0, abs=0.01)


def test_short_sleep_waits_in_place(tmp_path: Path) -> None:
    """A sleep of a second or less is waited out in place, without stepping aside."""

    @pb.play
    async def play(row, ctx):
        await ctx.sleep(0.5)
        return {"t": asyncio.get_running_loop().time()}

    run, events = run_virtual(launch(pd.DataFrame({"n": [0]}), play, virtual_store(tmp_path / "s")))
    assert run.result["t"].tolist() == [pytest.approx(0.5, abs=1e-6)]
    assert not [e for _, e in events if isinstance(e, (RowHeld, RowSleeping))]


def test_replay_skips_a_finished_sleep_and_a_rerun_keeps_the_wake_time(tmp_path: Path) -> None:
    """A replay skips a sleep already over; a rerun after a 'restart' wakes at the time first set."""
    store = virtual_store(tmp_path / "s")
    stops: list[float] = []

    @pb.play
    async def play(row, ctx):
        await ctx.sleep(100)
        stops.append(asyncio.get_running_loop().time())
        return {"done": True}

    async def main() -> tuple[pb.Run, pb.Run]:
        frame = pd.DataFrame({"n": [0]})
        first = await frame.play.arun(play, store=store, progress=False, background=True)
        await asyncio.sleep(40)
        first.stop()  # the kernel goes away 40 s into the sleep
        await first._task
        second, _ = await launch(frame, play, store)  # rerun: resumes, does not sleep 100 s more
        return first, second

    first, second = run_virtual(main())
    assert first.result["play_status"].tolist() == ["skipped"]
    assert second.result["play_status"].tolist() == ["ok"]
    assert stops == [pytest.approx(100.0, abs=0.01)]


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf"), "5", True])
def test_sleep_rejects_bad_seconds(seconds: Any, store: pb.ReceiptStore) -> None:
    """ctx.sleep needs a finite number of seconds >= 0: the row fails saying so."""

    @pb.play
    async def play(row, ctx):
        await ctx.sleep(seconds)
        return {}

    out = pd.DataFrame({"n": [0]}).play.map(play, store=store, progress=False)
    assert "ctx.sleep(): seconds must be a finite number >= 0" in out.loc[0, "play_error"]


def test_demo_job_submit_sleep_poll(demo: pb.demo.DemoServer, store: pb.ReceiptStore) -> None:
    """Submit a job once, sleep while it runs (slot released), poll until done: each job is paid for once."""
    demo.configure(job_seconds=1.5)
    auth = {"Authorization": "Bearer demo-key"}
    submit = pb.http_tool(
        "demo.submit", method="POST", url=demo.url + "/v1/jobs", json={"domain": "{domain}"}, headers=auth
    )
    status = pb.http_tool("demo.job", method="GET", url=demo.url + "/v1/jobs/{job_id}", headers=auth)

    @pb.play
    async def profile(row, ctx):
        job = await ctx.tool(submit, domain=row.domain)
        await ctx.sleep(1.6)
        while True:
            doc = await ctx.tool(status, job_id=job["job_id"], ttl=0)  # always ask afresh
            if doc["status"] == "done":
                return {"industry": doc["result"]["industry"]}
            await ctx.sleep(1.1)

    frame = pd.DataFrame({"domain": ["acme.com", "globex.com", "initech.com"]})
    started = time.monotonic()
    out = frame.play.map(profile, store=store, progress=False, concurrency=1)
    elapsed = time.monotonic() - started
    assert out["play_status"].tolist() == ["ok"] * 3
    assert out["industry"].notna().all()
    assert demo.stats()["jobs_submitted"] == 3
    assert elapsed < 4.5  # one slot, three jobs of 1.5 s each: they slept side by side, not in turn
    again = frame.play.map(profile, store=store, progress=False)
    assert (again["play_status"] == "reused").all() and demo.stats()["jobs_submitted"] == 3
