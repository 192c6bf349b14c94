"""force, ttl and refresh, exactly: what is paid for again and what is not."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pandas as pd
from vtime import run_virtual

import playbook as pb

EPOCH = 1_800_000_000.0


def virtual_store(path: Path) -> pb.ReceiptStore:
    return pb.ReceiptStore(path, clock=lambda: EPOCH + asyncio.get_running_loop().time())


async def finish(frame: pd.DataFrame, play: Any, store: pb.ReceiptStore, **opts: Any) -> pb.Run:
    run = await frame.play.arun(play, store=store, progress=False, background=True, **opts)
    await run._task
    return run


def test_force_pays_once_per_logical_call_even_when_the_row_is_replayed(tmp_path: Path) -> None:
    """ctx.tool(..., refresh=True) re-dispatches once per logical call in a run: a replay after a hold does not pay again."""
    paid: list[int] = []
    held = {"once": False}
    provider = pb.Provider("p")

    @pb.tool(provider=provider)
    async def price(n: int) -> int:
        paid.append(n)
        return n * 100 + len(paid)

    @pb.tool(provider=provider)
    async def later(n: int) -> int:
        if n == 1 and not held["once"]:
            held["once"] = True
            raise pb.ToolError("slow down", status=429, retry_after=10)
        return n

    @pb.play
    async def play(row, ctx):
        fresh = await ctx.tool(price, n=row.n, refresh=True)
        return {"price": fresh, "later": await ctx.tool(later, n=row.n)}

    store = virtual_store(tmp_path / "s")
    frame = pd.DataFrame({"n": [0, 1, 2]})

    async def main() -> tuple[pb.Run, pb.Run]:
        first = await finish(frame, play, store)
        second = await finish(frame, play, store, refresh="rows")
        return first, second

    first, second = run_virtual(main())
    assert first.result["play_status"].tolist() == ["ok"] * 3
    assert sorted(paid[:3]) == [0, 1, 2] and len(paid) == 6  # once per row per run, never on the replay
    assert second.stats.calls_executed == 3 + 0  # three forced prices; `later` from its receipts


def test_force_still_pays_when_the_forced_call_itself_was_held(tmp_path: Path) -> None:
    """A forced call held before it was paid for is forced on the replay, not answered from an old receipt."""
    answers = iter([1, None, 2])  # old receipt 1; then a 429; then the fresh answer 2

    @pb.tool(provider=pb.Provider("p"))
    async def quote(n: int) -> int:
        value = next(answers)
        if value is None:
            raise pb.ToolError("slow down", status=429, retry_after=10)
        return value

    @pb.play
    async def plain(row, ctx):
        return {"q": await ctx.tool(quote, n=row.n)}

    @pb.play
    async def forced(row, ctx):
        return {"q": await ctx.tool(quote, n=row.n, refresh=True)}

    store = virtual_store(tmp_path / "s")
    frame = pd.DataFrame({"n": [7]})

    async def main() -> pb.Run:
        await finish(frame, plain, store)
        return await finish(frame, forced, store)

    run = run_virtual(main())
    assert run.result["q"].tolist() == [2]


def test_ttl_makes_old_receipts_stale(tmp_path: Path) -> None:
    """ttl=60: a receipt younger than a minute answers; an older one is paid for again and replaced."""
    paid: list[float] = []

    @pb.tool
    async def rate(n: int) -> float:
        paid.append(asyncio.get_running_loop().time())
        return len(paid)

    @pb.play
    async def play(row, ctx):
        return {"r": await ctx.tool(rate, n=row.n, ttl=60)}

    store = virtual_store(tmp_path / "s")
    frame = pd.DataFrame({"n": [1]})

    async def main() -> list[int]:
        seen = []
        for wait in (0, 30, 61, 30):
            await asyncio.sleep(wait)
            run = await finish(frame, play, store, refresh="rows")
            seen.append(run.result["r"].iloc[0])
        return seen

    assert run_virtual(main()) == [1, 1, 2, 2]
    assert paid == [0.0, 91.0]


def test_refresh_true_pays_for_every_call_again_once(tmp_path: Path) -> None:
    """refresh=True pays for every call of every row again, once per logical call; refresh='rows' pays for none."""
    paid: list[int] = []

    @pb.tool
    async def lookup(n: int) -> int:
        paid.append(n)
        return n

    @pb.play
    async def play(row, ctx):
        a = await ctx.tool(lookup, n=row.n)
        b = await ctx.tool(lookup, n=row.n)  # the same call twice: two logical calls
        return {"a": a, "b": b}

    store = virtual_store(tmp_path / "s")
    frame = pd.DataFrame({"n": [1, 2]})

    async def main() -> list[int]:
        counts = []
        for refresh in (False, False, "rows", True):
            before = len(paid)
            await finish(frame, play, store, refresh=refresh)
            counts.append(len(paid) - before)
        return counts

    assert run_virtual(main()) == [2, 0, 0, 4]
