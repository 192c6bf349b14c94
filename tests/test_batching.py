"""Batch tools: calls from many rows coalesce into batches; members keep their own outcome."""

from __future__ import annotations

import asyncio
from typing import Any

import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb


def _bulk(batches: list[list]) -> pb.Tool:
    @pb.tool(name="bulk_upper", batch_size=4)
    async def bulk_upper(items: list) -> list:
        batches.append(list(items))
        return [
            ValueError(f"cannot do {i['word']}")
            if i["word"] == "bad"
            else (None if i["word"] == "none" else i["word"].upper())
            for i in items
        ]

    return bulk_upper


@pb.play
async def shout(row, ctx):
    return {"loud": await ctx.tool(BULK, word=row.word)}


BATCHES: list[list] = []
BULK = _bulk(BATCHES)


def test_calls_coalesce_into_batches(store: pb.ReceiptStore) -> None:
    """Ten rows at concurrency 10 make three calls of at most batch_size items; a rerun makes none."""
    BATCHES.clear()
    words = [f"w{i}" for i in range(10)]
    out = pd.DataFrame({"word": words}).play.map(shout, store=store, progress=False, concurrency=10)
    assert out["loud"].tolist() == [w.upper() for w in words]
    assert sorted(len(b) for b in BATCHES) == [2, 4, 4]
    BATCHES.clear()
    pd.DataFrame({"word": words}).play.map(shout, store=store, progress=False, refresh="rows")
    assert BATCHES == [] and pb.last_run().stats.calls_reused == 10


def test_member_failure_is_that_members_outcome(store: pb.ReceiptStore) -> None:
    """An exception in one member's slot fails that row only; None is a miss receipt."""
    BATCHES.clear()
    out = pd.DataFrame({"word": ["a", "bad", "none", "b"]}).play.map(
        shout, store=store, progress=False, concurrency=4
    )
    assert out["play_status"].tolist() == ["ok", "failed", "ok", "ok"]
    assert "cannot do bad" in out["play_error"].iloc[1]
    assert store.get(BULK, {"word": "none"}).miss is True
    assert len(BATCHES) == 1


def test_wrong_length_fails_every_member(store: pb.ReceiptStore) -> None:
    """A batch function that returns the wrong number of outputs fails its rows with a clear error."""

    @pb.tool(name="short", batch_size=10)
    def short(items: list) -> list:
        return items[:1]

    @pb.play
    async def use(row, ctx):
        return {"v": await ctx.tool(short, row.n)}

    out = pd.DataFrame({"n": [1, 2, 3]}).play.map(use, store=store, progress=False)
    assert (out["play_status"] == "failed").all()
    assert "returned 1 outputs for 3 inputs" in out["play_error"].iloc[0]


def test_batch_tool_definitions() -> None:
    """A batch tool takes exactly one list parameter and cannot be mapped straight from columns."""
    with pytest.raises(pb.PlayDefinitionError, match="one parameter"):

        @pb.tool(batch_size=5)
        def two(a: list, b: int) -> list:
            return a

    with pytest.raises(pb.PlayDefinitionError, match="call it from a play"):
        pd.DataFrame({"word": ["x"]}).play.map(BULK)


def _held_batch(batches: list[tuple[float, list[int]]], provider: pb.Provider, holds: int) -> pb.Tool:
    """A batch tool whose first ``holds`` batches meet a 429 holding ``provider`` for 30 s."""

    @pb.tool(name="held_bulk", provider=provider, batch_size=10)
    async def held_bulk(items: list) -> list:
        batches.append((asyncio.get_running_loop().time(), list(items)))
        if len(batches) <= holds:
            raise pb.ToolError("slow down", status=429, retry_after=30)
        return [n * 10 for n in items]

    return held_bulk


def _batch_run(tool: pb.Tool, store: pb.ReceiptStore, **opts: Any) -> pb.Run:
    @pb.play
    async def use(row, ctx):
        return {"v": await ctx.tool(tool, row.n)}

    async def main() -> pb.Run:
        run = await pd.DataFrame({"n": range(4)}).play.arun(
            use, store=store, progress=False, background=True, **opts
        )
        await run._task
        return run

    return run_virtual(main())


def test_a_batch_member_held_past_its_rows_max_wait_parks(store: pb.ReceiptStore) -> None:
    """max_wait=10 on the map: a batch held 30 s parks its member rows (as a call of their own would),
    though the provider's own max_wait would have let the batch wait."""
    batches: list[tuple[float, list[int]]] = []
    run = _batch_run(_held_batch(batches, pb.Provider("bulk", max_wait=120), holds=1), store, max_wait=10)
    assert run.result["play_status"].tolist() == ["parked"] * 4
    assert run.parked["reason"].tolist() == ["hold"] * 4 and len(batches) == 1


def test_a_batch_member_spends_its_own_rows_wait_budget_across_holds(store: pb.ReceiptStore) -> None:
    """With 50 s to wait, a member held 30 s has 20 s left: held 30 s again, it parks, as a lone call
    would; a fresh budget per batch would have let it wait forever."""
    batches: list[tuple[float, list[int]]] = []
    run = _batch_run(_held_batch(batches, pb.Provider("bulk", max_wait=50), holds=2), store)
    assert run.result["play_status"].tolist() == ["parked"] * 4
    assert [sorted(items) for _, items in batches] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert batches[1][0] == pytest.approx(30.0, abs=0.01)


def test_a_batch_member_within_its_wait_budget_is_held_and_replayed(store: pb.ReceiptStore) -> None:
    """A hold within every member's budget suspends the members, which come back and finish."""
    batches: list[tuple[float, list[int]]] = []
    run = _batch_run(_held_batch(batches, pb.Provider("bulk", max_wait=50), holds=1), store)
    assert run.result["v"].tolist() == [0, 10, 20, 30]
    assert run.stats.parked == 0 and batches[1][0] == pytest.approx(30.0, abs=0.01)
