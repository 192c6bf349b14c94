"""Batch tools: calls from many rows coalesce into batches; members keep their own outcome."""

from __future__ import annotations

import pandas as pd
import pytest

import playbook as pb


def _bulk(batches: list[list]) -> pb.Tool:
    @pb.tool(name="bulk_upper", batch_size=4)
    async def bulk_upper(items: list) -> list:
        batches.append(list(items))
        return [ValueError(f"cannot do {i['word']}") if i["word"] == "bad" else (None if i["word"] == "none" else i["word"].upper()) for i in items]

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
    out = pd.DataFrame({"word": ["a", "bad", "none", "b"]}).play.map(shout, store=store, progress=False, concurrency=4)
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
