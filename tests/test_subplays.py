"""``await ctx.run_play(play, **inputs)``: a sub-play as a step of a row, with its own memo; its
holds, parks and errors are the outer row's; what it paid for is reused by any play."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb

LEADS = pd.DataFrame({"domain": ["acme.com", "globex.com", "initech.com"], "first": ["Ann", "Bob", "Cy"]})


def _email(demo: Any, provider: pb.Provider | None = None) -> pb.Tool:
    return pb.http_tool(
        "demo.email",
        provider=provider,
        method="GET",
        url=demo.url + "/v1/email",
        params={"domain": "{domain}", "first": "{first}"},
        headers={"Authorization": "Bearer demo-key"},
        pick="email",
        miss_status=(404,),
        cost=1.0,
    )


def _find(tool: pb.Tool) -> pb.Play:
    @pb.play(name="find")
    async def find(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"email": await ctx.tool(tool, domain=row.domain, first=row.first)}

    return find


def test_a_sub_play_output_and_memo_are_shared(demo: Any, store: pb.ReceiptStore) -> None:
    """The outer row gets the sub-play's output; a map of the sub-play over the same columns, and
    another play calling it, reuse it without a request, counting its calls as reused."""
    find = _find(_email(demo))

    @pb.play
    async def outer(row: Any, ctx: pb.Context) -> dict[str, Any]:
        found = await ctx.run_play(find, domain=row.domain, first=row.first)
        return {"who": row.first, **found}

    out = LEADS.play.map(outer, store=store, progress=False)
    assert demo.stats()["requests"] == 3 and list(out.columns[-3:]) == ["email", "play_status", "play_error"]
    direct = LEADS.play.map(find, store=store, progress=False)
    assert list(direct.play_status) == ["reused"] * 3 and list(direct.email) == list(out.email)

    @pb.play
    async def other(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"twice": (await ctx.run_play(find, domain=row.domain, first=row.first))["email"]}

    again = LEADS.play.map(other, store=store, progress=False)
    stats = pb.last_run().stats
    assert demo.stats()["requests"] == 3 and list(again.twice) == list(out.email)
    assert (stats.ok, stats.calls_reused, stats.cost_saved) == (3, 3, 3.0)


def test_a_hold_inside_parks_the_outer_row(demo: Any, store: pb.ReceiptStore) -> None:
    """A provider's hold met inside the sub-play parks the outer row, naming the provider."""
    demo.configure(quota=0, quota_reset=3600)
    acme = pb.Provider("acme-sub", max_wait=1)
    find = _find(_email(demo, acme))

    @pb.play
    async def outer(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return await ctx.run_play(find, domain=row.domain, first=row.first)

    out = LEADS.head(1).play.map(outer, store=store, progress=False)
    assert list(out.play_status) == ["parked"]
    assert pb.last_run().parked.provider.tolist() == ["acme-sub"]


def test_a_sub_play_error_is_the_outer_rows(store: pb.ReceiptStore) -> None:
    """An error in the sub-play fails the outer row with a note naming the sub-play; an outer
    play that catches it goes on."""

    @pb.play(name="boom")
    async def boom(row: Any, ctx: pb.Context) -> dict[str, Any]:
        raise ValueError(f"no {row.n}")

    @pb.play
    async def outer(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return await ctx.run_play(boom, n=row.n)

    @pb.play
    async def careful(row: Any, ctx: pb.Context) -> dict[str, Any]:
        try:
            return await ctx.run_play(boom, n=row.n)
        except ValueError as exc:
            return {"caught": str(exc)}

    frame = pd.DataFrame({"n": [1]})
    failed = frame.play.map(outer, store=store, progress=False)
    assert failed.play_status[0] == "failed" and "no 1" in failed.play_error[0]
    with pytest.raises(ValueError, match="no 1") as info:
        frame.play.map(outer, store=store, progress=False, on_error="raise")
    assert any("ctx.run_play('boom'" in note for note in info.value.__notes__)
    assert frame.play.map(careful, store=store, progress=False).caught[0] == "no 1"


def test_a_sleep_inside_resumes_the_sub_play(tmp_path: Path) -> None:
    """A durable sleep inside the sub-play steps the outer row aside; the row comes back and the
    sub-play's finished step is not run again.  In virtual time: the store's clock (the sleep's
    deadline) is the loop's."""
    store = pb.ReceiptStore(tmp_path / "store", clock=lambda: 1.8e9 + asyncio.get_running_loop().time())
    ran: list[int] = []

    @pb.play(name="waits")
    async def waits(row: Any, ctx: pb.Context) -> dict[str, Any]:
        n = await ctx.step("count", lambda: ran.append(row.n) or len(ran))
        await ctx.sleep(30)
        return {"n": n}

    @pb.play
    async def outer(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return await ctx.run_play(waits, n=row.n)

    out = run_virtual(pd.DataFrame({"n": [7]}).play.amap(outer, store=store, progress=False, overwrite=True))
    assert out.play_status[0] == "ok" and ran == [7] and out.n[0] == 1

    woke: list[bool] = []

    @pb.play(name="swallows")
    async def swallows(row: Any, ctx: pb.Context) -> dict[str, Any]:
        try:
            await ctx.sleep(30)
            woke.append(True)
        except BaseException:  # a bare except catches the sleep's signal: the row still steps aside
            woke.append(False)
        return {"n": row.n}

    @pb.play
    async def outer_of_swallows(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return await ctx.run_play(swallows, n=row.n)

    out = run_virtual(pd.DataFrame({"n": [8]}).play.amap(outer_of_swallows, store=store, progress=False))
    assert out.play_status[0] == "ok" and woke == [False, True]
    store.close()


def test_refresh_rows_runs_sub_plays_again_from_receipts(demo: Any, store: pb.ReceiptStore) -> None:
    """refresh="rows" runs sub-plays again too, and their calls hit their receipts."""
    find = _find(_email(demo))
    runs: list[str] = []

    @pb.play
    async def outer(row: Any, ctx: pb.Context) -> dict[str, Any]:
        runs.append(row.domain)
        return await ctx.run_play(find, domain=row.domain, first=row.first)

    LEADS.play.map(outer, store=store, progress=False)
    LEADS.play.map(outer, store=store, progress=False, refresh="rows")
    assert len(runs) == 6 and demo.stats()["requests"] == 3
    assert pb.last_run().stats.calls_reused == 3


def test_bad_sub_plays_are_named(demo: Any, store: pb.ReceiptStore) -> None:
    """A tool, a plain function, or an input with no identity is refused with a message that names it."""
    tool = _email(demo)

    @pb.play
    async def with_tool(row: Any, ctx: pb.Context) -> Any:
        return await ctx.run_play(tool, domain=row.domain)

    @pb.play
    async def with_function(row: Any, ctx: pb.Context) -> Any:
        return await ctx.run_play(len, domain=row.domain)

    @pb.play
    async def with_object(row: Any, ctx: pb.Context) -> Any:
        return await ctx.run_play(_find(tool), domain=object(), first="x")

    out = LEADS.head(1).play.map(with_tool, store=store, progress=False)
    assert "is a tool: await ctx.tool(" in out.play_error[0]
    out = LEADS.head(1).play.map(with_function, store=store, progress=False)
    assert "ctx.run_play()" in out.play_error[0]
    out = LEADS.head(1).play.map(with_object, store=store, progress=False)
    assert "ctx.run_play('find')" in out.play_error[0] and "cannot identify" in out.play_error[0]


def test_an_edited_sub_play_runs_the_outer_rows_again(store: pb.ReceiptStore) -> None:
    """A sub-play defined anew (a cell run again, an edited file in the next process) is a new
    play: rows of the outer play that ran the old one run again and get the new output."""
    plays: dict[str, pb.Play] = {}

    async def lower(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"word": row.word.lower()}

    async def upper(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"word": row.word.upper()}

    @pb.play
    async def outer(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return await ctx.run_play(plays["inner"], word=row.word)

    frame = pd.DataFrame({"word": ["Ab", "Cd"]})
    plays["inner"] = pb.play(lower, name="inner")
    assert list(frame.play.map(outer, store=store, progress=False, overwrite=True).word) == ["ab", "cd"]
    plays["inner"] = pb.play(upper, name="inner")  # the same name, defined anew
    again = frame.play.map(outer, store=store, progress=False, overwrite=True)
    assert list(again.word) == ["AB", "CD"] and list(again.play_status) == ["ok", "ok"]


def test_calls_of_free_local_tools_in_reused_rows_and_sub_plays_are_not_from_receipts(
    store: pb.ReceiptStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows reused from their memos, and a sub-play reused inside another play, count only their
    paid calls as answered by receipts: their calls of a free local tool neither ran nor were
    answered by receipts, and the summary says so (it said all 9 and 3 came from receipts)."""

    @pb.tool
    def clean(q: str) -> str:
        return q.upper()

    @pb.tool(name="priced", cost=0.5)
    def priced(q: str) -> str:
        return q + "!"

    @pb.play(name="tidy")
    async def tidy(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"tidy": await ctx.tool(clean, q=row.q + " ")}

    @pb.play
    async def outer(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {
            "c": await ctx.tool(clean, q=row.q),
            "p": await ctx.tool(priced, q=row.q),
            **(await ctx.run_play(tidy, q=row.q)),
        }

    @pb.play
    async def other(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return await ctx.run_play(tidy, q=row.q)

    frame = pd.DataFrame({"q": ["a", "b", "c"]})
    first = frame.play.run(outer, store=store, progress=False).stats
    assert (first.calls_executed, first.calls_reused, first.calls_local) == (3, 0, 6)
    capsys.readouterr()
    again = frame.play.run(outer, store=store, progress="text").stats
    assert (again.reused, again.calls_executed, again.calls_reused, again.calls_local, again.cost_saved) == (
        3,
        0,
        3,
        0,
        1.5,
    )
    assert "calls 0 paid, 3 from receipts, 0 local" in capsys.readouterr().err
    inside = frame.play.run(other, store=store, progress=False).stats  # each row runs; its sub-play is reused
    assert (inside.ok, inside.calls_reused, inside.calls_local) == (3, 0, 0)
    assert frame.play.run(other, store=store, progress=False).stats.calls_reused == 0
