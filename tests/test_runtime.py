"""The row runtime: order and index, identity and duplicates, isolation, limits, reuse."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pytest
from exact import same

import playbook as pb


def _echo_tool(calls: list) -> pb.Tool:
    @pb.tool(name="echo")
    async def echo(value: object) -> object:
        calls.append(value)
        await asyncio.sleep(0)
        return value

    return echo


@pb.play
async def doubled(row, ctx):
    return {"double": row.n * 2}


@pytest.mark.parametrize(
    "index",
    [
        pd.Index([30, 10, 20, 40]),
        pd.Index(["b", "a", "b", "a"]),  # non-unique
        pd.date_range("2024-01-01", periods=4),
        pd.MultiIndex.from_tuples([("x", 1), ("x", 2), ("y", 1), ("y", 2)]),
    ],
    ids=["ints", "non-unique", "dates", "multi"],
)
def test_result_keeps_order_and_index(index: pd.Index, store: pb.ReceiptStore) -> None:
    """Rows come back in input order with the input index, whatever the index is."""
    frame = pd.DataFrame({"n": [4, 1, 3, 2]}, index=index)
    out = frame.play.map(doubled, store=store, progress=False, concurrency=3)
    assert out.index.equals(frame.index)
    assert out["double"].tolist() == [8, 2, 6, 4]
    assert out["play_status"].tolist() == ["ok"] * 4


def test_slow_first_row_does_not_reorder(store: pb.ReceiptStore) -> None:
    """Rows that finish out of order are still returned in input order."""

    @pb.play
    async def slow_first(row, ctx):
        await asyncio.sleep(0.05 if row.n == 0 else 0)
        return {"n2": row.n}

    frame = pd.DataFrame({"n": range(8)})
    out = frame.play.map(slow_first, store=store, progress=False, concurrency=8)
    assert out["n2"].tolist() == list(range(8))


def test_duplicate_rows_run_once_and_share_output(store: pb.ReceiptStore) -> None:
    """Rows with the same values run once; every copy gets the output and status."""
    calls: list = []
    echo = _echo_tool(calls)

    @pb.play
    async def play(row, ctx):
        return {"e": await ctx.tool(echo, value=row.v)}

    frame = pd.DataFrame({"v": ["a", "b", "a", "a"]}, index=[3, 2, 1, 0])
    out = frame.play.map(play, store=store, progress=False)
    assert sorted(calls) == ["a", "b"]
    assert out["e"].tolist() == ["a", "b", "a", "a"]
    assert pb.last_run().stats.ok == 4


@pb.play
async def labelled(row, ctx):
    return {"label": str(row.Index)}


def test_a_play_reading_the_index_runs_equal_rows_of_other_labels_as_rows_of_their_own(
    store: pb.ReceiptStore,
) -> None:
    """A play that reads row.Index gets each row's own label, though the rows' values are equal;
    a row of another frame with the same values and a new label runs, not reused from a memo."""
    frame = pd.DataFrame({"a": [1, 1, 1]}, index=["x", "y", "z"])
    out = frame.play.map(labelled, store=store, progress=False)
    assert out["label"].tolist() == ["x", "y", "z"] and out["play_status"].tolist() == ["ok"] * 3
    new = pd.DataFrame({"a": [1]}, index=["NEW"]).play.map(labelled, store=store, progress=False)
    assert new["label"].tolist() == ["NEW"] and new["play_status"].tolist() == ["ok"]
    again = frame.iloc[::-1].play.map(labelled, store=store, progress=False)
    assert again["label"].tolist() == ["z", "y", "x"] and again["play_status"].tolist() == ["reused"] * 3


def test_a_play_reading_the_index_through_a_helper_gets_each_label(store: pb.ReceiptStore) -> None:
    """row.index read in a helper the play calls counts as the play reading it."""

    async def play(row, ctx):
        return {"label": _label_of(row)}

    out = pd.DataFrame({"a": ["v", "v"]}, index=["p", "q"]).play.map(
        pb.play(play, name="helped"), store=store, progress=False
    )
    assert out["label"].tolist() == ["p", "q"]


def _label_of(row):
    return row.index


@pytest.mark.parametrize("index", [None, [10, 20, 30, 40]], ids=["range", "ints"])
def test_an_int_column_of_a_play_reading_the_index_keys_its_rows_as_objects_do(
    index: list[int] | None, store: pb.ReceiptStore
) -> None:
    """Equal int rows under int labels (a column read at a time) are distinct rows when the play
    reads the label, and keyed as the same rows as objects: a run over them as objects reuses each."""
    ints = pd.DataFrame({"a": [5, 5, 5, 6]}, index=index)
    out = ints.play.map(labelled, store=store, progress=False)
    assert out["label"].tolist() == [str(i) for i in ints.index] and out["play_status"].tolist() == ["ok"] * 4
    again = ints.astype(object).play.map(labelled, store=store, progress=False)
    assert (
        again["label"].tolist() == out["label"].tolist() and again["play_status"].tolist() == ["reused"] * 4
    )


def test_a_play_not_reading_the_index_still_runs_equal_rows_once(store: pb.ReceiptStore) -> None:
    """A play that does not read the index runs rows of equal values once, whatever their labels,
    and a frame of those values under new labels reuses them."""
    ran: list[object] = []

    async def counted(row, ctx):
        ran.append(row.a)
        return {"b": row.a}

    play = pb.play(counted, name="counted")
    out = pd.DataFrame({"a": [1, 1, 1, 2]}, index=["x", "y", "z", "w"]).play.map(
        play, store=store, progress=False
    )
    assert ran == [1, 2] and out["play_status"].tolist() == ["ok"] * 4
    new = pd.DataFrame({"a": [1]}, index=["NEW"]).play.map(play, store=store, progress=False)
    assert ran == [1, 2] and new["play_status"].tolist() == ["reused"]


def test_an_index_label_with_no_key_form_fails_its_row_naming_the_label_when_the_play_reads_it(
    store: pb.ReceiptStore,
) -> None:
    """A label with no key form (an object of the user's) fails its row, for a play that reads the
    label, saying the index label is at fault and that id_columns= names what identifies a row instead."""

    class Thing:
        pass

    frame = pd.DataFrame({"a": [1]}, index=pd.Index([Thing()], dtype=object))
    out = frame.play.map(labelled, store=store, progress=False)
    assert out["play_status"].tolist() == ["failed"]
    assert (
        "has no JSON form (at the index label, which the play reads); pass id_columns=COLUMNS"
        in out["play_error"].iloc[0]
    )
    assert frame.play.map(labelled, store=store, progress=False, id_columns="a")["play_status"].tolist() == [
        "ok"
    ]


def test_id_columns_decide_identity_even_when_the_play_reads_the_index(store: pb.ReceiptStore) -> None:
    """id_columns= is the user's word on what identifies a row: rows agreeing on it are one row, whatever
    their labels, though the play reads row.index."""
    frame = pd.DataFrame({"id": [1, 1, 2]}, index=["x", "y", "z"])
    out = frame.play.map(labelled, store=store, progress=False, id_columns="id")
    assert out["label"].tolist() == ["x", "x", "z"]


def test_id_columns_define_identity(store: pb.ReceiptStore) -> None:
    """With id_columns=, rows that agree on those columns are the same row."""
    seen: list = []

    @pb.play
    async def play(row, ctx):
        seen.append(row.other)
        return {"x": row.id}

    frame = pd.DataFrame({"id": [1, 1, 2], "other": ["p", "q", "r"]})
    out = frame.play.map(play, store=store, progress=False, id_columns="id")
    assert seen == ["p", "r"] and out["x"].tolist() == [1, 1, 2]


def test_awkward_input_values(store: pb.ReceiptStore) -> None:
    """None, NaN, pd.NA, numpy scalars and datetimes reach tools and key receipts stably."""
    calls: list = []
    echo = _echo_tool(calls)

    @pb.play
    async def play(row, ctx):
        return {"e": await ctx.tool(echo, value=row.v)}

    values = [
        None,
        np.nan,
        pd.NA,
        np.int64(7),
        np.float32(0.5),
        pd.Timestamp("2024-02-03"),
        dt.date(2024, 1, 1),
        pd.NaT,
    ]
    frame = pd.DataFrame({"v": pd.Series(values, dtype=object)})
    out = frame.play.map(play, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok"] * len(values)
    assert [same(a, b) for a, b in zip(out["e"].tolist()[3:7], values[3:7])] == [
        True
    ] * 4  # as given, types too
    # None, NaN, NA and NaT are the same row: executed once.
    assert len(calls) == 5
    again = frame.play.map(play, store=store, progress=False, refresh="rows")
    assert pb.last_run().stats.calls_local == 0
    assert all(same(a, b) for a, b in zip(again["e"].tolist()[3:7], values[3:7]))


def test_unserialisable_tool_input_fails_that_row(store: pb.ReceiptStore) -> None:
    """A tool input with no JSON form fails only its row, naming the tool and the type."""
    echo = _echo_tool([])

    class Gadget:
        pass

    @pb.play
    async def play(row, ctx):
        return {"e": await ctx.tool(echo, value=Gadget() if row.n == 1 else row.n)}

    frame = pd.DataFrame({"n": [0, 1, 2]}, index=["r0", "r1", "r2"])
    run = frame.play.run(play, store=store, progress=False)
    assert run.result["play_status"].tolist() == ["ok", "failed", "ok"]
    message = run.result.loc["r1", "play_error"]
    assert "'echo'" in message and "Gadget" in message
    assert run.errors["row"].tolist() == ["r1"]


def test_on_error_isolate_and_raise(store: pb.ReceiptStore) -> None:
    """isolate keeps going and records the error, with the play's line that raised it; raise stops and raises it, naming the row."""

    @pb.play
    async def picky(row, ctx):
        if row.n == 2:
            raise ValueError("two is not allowed")
        return {"ok": True}

    frame = pd.DataFrame({"n": range(5)}, index=list("abcde"))
    out = frame.play.map(picky, store=store, progress=False, concurrency=1)
    assert out["play_status"].tolist() == ["ok", "ok", "failed", "ok", "ok"]
    line = picky.fn.__code__.co_firstlineno + 3  # the raise, under the decorator, def and if
    assert (
        out.loc["c", "play_error"]
        == f'ValueError: two is not allowed (line {line}: raise ValueError("two is not allowed"))'
    )
    with pytest.raises(ValueError, match="two is not allowed") as info:
        frame.play.map(picky, store=store, progress=False, concurrency=1, on_error="raise", refresh="rows")
    assert "in row 'c'" in "".join(info.value.__notes__)
    result = pb.last_run().result
    assert result["play_status"].tolist() == ["ok", "ok", "failed", "skipped", "skipped"]


def test_sync_tool_does_not_block_the_loop(store: pb.ReceiptStore) -> None:
    """A blocking sync tool runs in a thread: another row's coroutine runs while it blocks."""
    release = threading.Event()
    main = threading.get_ident()
    threads: set[int] = set()

    @pb.tool
    def blocking(n: int) -> bool:
        threads.add(threading.get_ident())
        return release.wait(timeout=10)  # only another row, running on the loop, can set it

    @pb.play
    async def play(row, ctx):
        if row.n == 0:
            while not threads:
                await asyncio.sleep(0.001)
            release.set()
            return {"released": True}
        return {"released": await ctx.tool(blocking, n=row.n)}

    out = pd.DataFrame({"n": [1, 0]}).play.map(play, store=store, progress=False, concurrency=2)
    assert out["released"].tolist() == [True, True]
    assert main not in threads


def test_limit_runs_the_first_rows(store: pb.ReceiptStore) -> None:
    """limit=N runs the first N rows and returns those N rows, as df.head(N) would; limit=0 none."""
    frame = pd.DataFrame({"n": range(5)}, index=list("abcde"))
    out = frame.play.map(doubled, store=store, progress=False, limit=2)
    assert out.index.tolist() == ["a", "b"] and out["play_status"].tolist() == ["ok", "ok"]
    assert pb.last_run().stats.total == 2
    assert len(frame.play.map(doubled, store=store, progress=False, limit=0)) == 0
    assert len(frame.play.map(doubled, store=store, progress=False, limit=50)) == 5


def test_edited_play_reuses_every_receipt(store: pb.ReceiptStore) -> None:
    """Editing a play reruns its rows, but every unchanged tool call hits its receipt."""
    calls: list = []
    echo = _echo_tool(calls)

    async def v1(row, ctx):
        return {"e": await ctx.tool(echo, value=row.n)}

    async def v2(row, ctx):
        e = await ctx.tool(echo, value=row.n)
        return {"e": e, "twice": e * 2}

    frame = pd.DataFrame({"n": range(6)})
    frame.play.map(pb.play(v1, name="p"), store=store, progress=False)
    out = frame.play.map(pb.play(v2, name="p"), store=store, progress=False)
    stats = pb.last_run().stats
    assert (stats.ok, stats.reused, stats.calls_local, stats.calls_reused) == (6, 0, 0, 6)
    assert out["twice"].tolist() == [0, 2, 4, 6, 8, 10]
    assert len(calls) == 6


def test_rerun_is_a_resume(store: pb.ReceiptStore) -> None:
    """A rerun reuses finished rows and runs only the failed ones."""
    attempts: list = []

    @pb.play
    async def flaky(row, ctx):
        attempts.append(row.n)
        if row.n == 1 and attempts.count(1) == 1:
            raise RuntimeError("first time fails")
        return {"n": row.n}

    frame = pd.DataFrame({"n": range(3)})
    frame.play.map(flaky, store=store, progress=False)
    out = frame.play.map(flaky, store=store, progress=False)
    assert out["play_status"].tolist() == ["reused", "ok", "reused"]
    assert sorted(attempts) == [0, 1, 1, 2]


@pb.play
async def _ok_play(row, ctx):  # type: ignore[no-untyped-def]
    return {"m": row.n}


def test_retry_readmits_failed_rows(store: pb.ReceiptStore) -> None:
    """run.retry() runs failed rows again in place: the result has every row ok."""
    failing = {"on": True}

    @pb.play
    async def gated(row, ctx):
        if row.n % 2 and failing["on"]:
            raise RuntimeError("not yet")
        return {"n": row.n}

    run = pd.DataFrame({"n": range(4)}).play.run(gated, store=store, progress=False)
    assert run.stats.failed == 2
    failing["on"] = False
    again = run.retry()
    assert again.stats.failed == 0 and again.stats.ok == 2
    assert again.result["play_status"].tolist() == ["ok"] * 4


def test_a_retry_counts_its_own_work_and_keeps_the_run_before(store: pb.ReceiptStore) -> None:
    """run.retry() returns a run whose stats count the retry alone (its rows, calls, money, failures,
    time); its previous is the run before, whose stats stay as they ended; both results have every row."""
    failing = {"on": True}

    @pb.tool(name="priced", version="1", cost=0.5)
    def priced(n: int) -> int:
        return n * 10

    @pb.play
    async def gated(row, ctx):
        value = await ctx.tool(priced, n=row.n)
        if row.n % 2 and failing["on"]:
            await asyncio.sleep(0.4)  # the first run takes a while; the retry does not
            raise RuntimeError("not yet")
        if row.n == 5:
            await ctx.tool(priced, n=50)  # one call of its own, paid by the retry
        return {"v": value}

    run = pd.DataFrame({"n": range(6)}).play.run(gated, store=store, progress=False)
    first = run.stats
    assert (first.total, first.ok, first.failed, first.calls_executed, first.cost_spent) == (6, 3, 3, 6, 3.0)
    failing["on"] = False
    again = run.retry()
    assert again is not run and again.previous is run and run.previous is None and pb.last_run() is again
    s = again.stats
    assert (s.total, s.ok, s.reused, s.failed, s.parked) == (3, 3, 0, 0, 0)
    # The calls the first run paid for are receipts to the retry, not calls shared within it.
    assert (s.calls_executed, s.calls_reused, s.calls_shared, s.cost_spent, s.cost_saved) == (
        1,
        3,
        0,
        0.5,
        1.5,
    )
    assert first.elapsed >= 0.4 and s.elapsed < 0.4
    assert run.stats == first  # the run before keeps what it counted
    assert again.result["play_status"].tolist() == ["ok"] * 6
    assert again.result["v"].tolist() == [0, 10, 20, 30, 40, 50]
    assert run.result.equals(again.result)  # every run of the chain gives the rows as they stand
    assert repr(again).startswith("<Run 'gated' finished: 3 rows, ok=3 reused=0 failed=0")


def test_a_retry_with_nothing_to_retry_returns_the_run_as_it_is(store: pb.ReceiptStore) -> None:
    """run.retry() when no row failed or parked runs nothing and gives back the run itself."""
    run = pd.DataFrame({"n": range(3)}).play.run(_ok_play, store=store, progress=False)
    assert run.retry() is run and run.previous is None and pb.last_run() is run and run.stats.ok == 3


def test_a_retry_of_parked_rows_still_knows_the_failed_rows_the_run_before_left(
    store: pb.ReceiptStore,
) -> None:
    """After a retry of the parked rows only, the retry counts none failed, yet the rows the run
    before left failed can still be retried (what the panel's Retry failed button asks)."""

    @pb.tool(name="dear", version="1", cost=1.0)
    def dear(n: int) -> int:
        return n

    @pb.play
    async def mixed(row, ctx):
        if row.n == 0:
            raise RuntimeError("broken row")
        return {"v": await ctx.tool(dear, n=row.n)}

    run = pd.DataFrame({"n": range(6)}).play.run(
        mixed, store=store, progress=False, max_cost=2, concurrency=1
    )
    assert (run.stats.failed, run.stats.parked) == (1, 3)
    again = run.retry(statuses=("parked",))  # the budget is spent: they park again
    assert (again.stats.total, again.stats.failed, again.stats.parked) == (3, 0, 3) and again.errors.empty
    assert again.state.can_retry("failed") and again.state.can_retry("parked")
    last = again.retry(statuses=("failed",))
    assert (last.stats.total, last.stats.failed) == (1, 1) and not pd.DataFrame(last.errors).empty


def test_a_retry_of_a_retry_chains_and_an_earlier_run_retries_the_latest(store: pb.ReceiptStore) -> None:
    """Each retry's previous is the run it followed; retry() asked of an earlier run retries after the latest."""
    failing = {"left": 2}

    @pb.play
    async def gated(row, ctx):
        if row.n == 1 and failing["left"]:
            failing["left"] -= 1
            raise RuntimeError("not yet")
        return {"n": row.n}

    run = pd.DataFrame({"n": range(3)}).play.run(gated, store=store, progress=False)
    second = run.retry()
    assert (second.stats.total, second.stats.failed) == (1, 1)
    third = run.retry()  # asked of the first run: it follows the second
    assert third.previous is second and second.previous is run
    assert (third.stats.total, third.stats.ok, third.stats.failed) == (1, 1, 0)
    assert (run.stats.ok, run.stats.failed, second.stats.failed) == (2, 1, 1)


def test_map_accepts_a_bare_async_function_and_a_tool(store: pb.ReceiptStore) -> None:
    """map() wraps a bare async function, and binds a Tool's inputs from same-named columns."""

    async def plain(row, ctx):
        return row.n + 1

    @pb.tool(name="square")
    def square(n: int) -> int:
        return n * n

    frame = pd.DataFrame({"n": [1, 2, 3]})
    assert frame.play.map(plain, store=store, progress=False)["plain"].tolist() == [2, 3, 4]
    assert frame.play.map(square, store=store, progress=False)["square"].tolist() == [1, 4, 9]
    with pytest.raises(pb.PlayDefinitionError, match="no column 'n'"):
        pd.DataFrame({"m": [1]}).play.map(square, store=store)


def test_concurrency_bounds_rows_in_flight(store: pb.ReceiptStore) -> None:
    """No more than `concurrency` rows run at once."""
    now = {"in": 0, "max": 0}

    @pb.play
    async def busy(row, ctx):
        now["in"] += 1
        now["max"] = max(now["max"], now["in"])
        await asyncio.sleep(0.005)
        now["in"] -= 1

    pd.DataFrame({"n": range(40)}).play.map(busy, store=store, progress=False, concurrency=5)
    assert now["max"] == 5


def test_empty_frame(store: pb.ReceiptStore) -> None:
    """An empty DataFrame gives an empty result with the status columns."""
    out = pd.DataFrame({"n": []}).play.map(doubled, store=store, progress=False)
    assert len(out) == 0 and {"play_status", "play_error"} <= set(out.columns)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": -3}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"on_error": "ignore"}, "on_error"),
        ({"refresh": "yes"}, "refresh"),
        ({"limit": -1}, "limit"),
        ({"max_cost": "ten"}, "max_cost"),
        ({"progress": "fancy"}, "progress"),
        ({"id_columns": "nope"}, "no column 'nope'"),
        ({"concurency": 4}, "did you mean 'concurrency'"),
    ],
)
def test_bad_options_name_the_option(options: dict, match: str, store: pb.ReceiptStore) -> None:
    """A bad run option raises PlayDefinitionError naming it, before any row runs."""
    with pytest.raises(pb.PlayDefinitionError, match=match):
        pd.DataFrame({"n": [1]}).play.map(doubled, store=store, **options)
    assert pb.last_run() is None


def test_play_must_be_async() -> None:
    """A sync function is refused as a play, with the fix in the message."""

    def not_async(row, ctx):
        return {}

    with pytest.raises(pb.PlayDefinitionError, match="async def not_async"):
        pb.play(not_async)


def test_map_inside_a_running_loop(tmp_path) -> None:
    """The blocking map() works when called from code already running in an event loop.

    Runs in a fresh interpreter, as in a kernel: nest-asyncio patches asyncio process-wide.
    """
    script = """
import asyncio, pandas as pd, playbook as pb

@pb.play
async def doubled(row, ctx):
    return {"double": row.n * 2}

async def notebook_cell():
    first = pd.DataFrame({"n": [1, 2]}).play.map(doubled, progress=False)
    again = pd.DataFrame({"n": [1, 2]}).play.map(doubled, progress=False)
    return first["double"].tolist(), again["play_status"].tolist()

print(asyncio.run(notebook_cell()))
"""
    env = {**os.environ, "PLAYBOOK_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "([2, 4], ['reused', 'reused'])"


def test_amap_and_background_run(store: pb.ReceiptStore) -> None:
    """amap() awaits the result; run(background=True) returns at once and wait() finishes it."""

    async def main() -> tuple:
        out = await pd.DataFrame({"n": [1]}).play.amap(doubled, store=store, progress=False)
        run = await pd.DataFrame({"n": [5, 6]}).play.arun(
            doubled, store=store, progress=False, background=True
        )
        was_running = run.running
        for _ in range(500):
            if not run.running:
                break
            await asyncio.sleep(0.01)
        return out["double"].tolist(), was_running, run.result["double"].tolist(), pb.last_run() is run

    assert asyncio.run(main()) == ([2], True, [10, 12], True)


def test_background_needs_a_loop(store: pb.ReceiptStore) -> None:
    """background=True outside any event loop is a clear error."""
    with pytest.raises(pb.PlayDefinitionError, match="running event loop"):
        pd.DataFrame({"n": [1]}).play.run(doubled, store=store, background=True)


def test_default_store_follows_playbook_home(tmp_path, monkeypatch) -> None:
    """Without store=, receipts go under $PLAYBOOK_HOME."""
    monkeypatch.setenv("PLAYBOOK_HOME", str(tmp_path / "elsewhere"))
    pd.DataFrame({"n": [1]}).play.map(doubled, progress=False)
    assert pb.ReceiptStore(tmp_path / "elsewhere").stats()["row_memos"] == 1


def test_budget_parks_rows(store: pb.ReceiptStore) -> None:
    """max_cost stops paid calls that would pass it; those rows park with reason budget."""

    @pb.tool(name="paid", cost=1.0)
    def paid(n: int) -> int:
        return n

    @pb.play
    async def spend(row, ctx):
        return {"v": await ctx.tool(paid, n=row.n)}

    run = pd.DataFrame({"n": range(5)}).play.run(
        spend, store=store, progress=False, max_cost=3, concurrency=1
    )
    assert run.result["play_status"].tolist() == ["ok", "ok", "ok", "parked", "parked"]
    assert run.stats.cost_spent == 3.0 and run.parked["reason"].tolist() == ["budget", "budget"]


def test_identical_calls_in_flight_are_paid_once(store: pb.ReceiptStore) -> None:
    """Two rows that make the same call at the same time share one dispatch."""
    calls: list = []

    @pb.tool(name="shared")
    async def shared(domain: str) -> str:
        calls.append(domain)
        await asyncio.sleep(0.02)
        return domain.upper()

    @pb.play
    async def play(row, ctx):
        return {"v": await ctx.tool(shared, domain=row.domain)}

    frame = pd.DataFrame({"person": ["a", "b", "c"], "domain": ["x.com", "x.com", "y.com"]})
    out = frame.play.map(play, store=store, progress=False, concurrency=3)
    assert sorted(calls) == ["x.com", "y.com"]
    assert out["v"].tolist() == ["X.COM", "X.COM", "Y.COM"]
    assert (
        pb.last_run().stats.calls_shared == 1 and pb.last_run().stats.calls_reused == 0
    )  # shared within the run, not an old receipt


def test_failed_call_lets_the_waiting_row_try(store: pb.ReceiptStore) -> None:
    """If the shared call fails, a row that waited on it dispatches for itself."""
    calls: list = []

    @pb.tool(name="fragile")
    async def fragile(domain: str) -> str:
        calls.append(domain)
        await asyncio.sleep(0.01)
        if len(calls) == 1:
            raise ConnectionError("first attempt dropped")
        return "ok"

    @pb.play
    async def play(row, ctx):
        return {"v": await ctx.tool(fragile, domain="same")}

    out = pd.DataFrame({"person": ["a", "b"]}).play.map(play, store=store, progress=False, concurrency=2)
    assert sorted(out["play_status"]) == ["failed", "ok"] and len(calls) == 2


def test_ctx_log_names_the_row(store: pb.ReceiptStore, caplog: pytest.LogCaptureFixture) -> None:
    """ctx.log sends the message to the 'playbook' logger with the play and the row's label."""
    caplog.set_level("INFO", logger="playbook")

    @pb.play
    async def chatty(row, ctx):
        ctx.log(f"looking at {row.n}")
        return {"n": row.n}

    pd.DataFrame({"n": [7]}, index=["lead-7"]).play.map(chatty, store=store, progress=False)
    assert "chatty row lead-7: looking at 7" in caplog.text


def test_output_without_json_form_is_ok_but_not_memoised(store: pb.ReceiptStore) -> None:
    """A row whose output has no JSON form is ok in the result and simply runs again next time."""
    runs: list = []

    class Blob:
        pass

    @pb.play
    async def opaque(row, ctx):
        runs.append(row.n)
        return {"blob": Blob()}

    frame = pd.DataFrame({"n": [1]})
    first = frame.play.map(opaque, store=store, progress=False)
    again = frame.play.map(opaque, store=store, progress=False)
    assert first["play_status"].tolist() == again["play_status"].tolist() == ["ok"]
    assert runs == [1, 1] and isinstance(again["blob"].iloc[0], Blob)


def test_last_run_is_per_task_with_the_latest_in_the_process_as_fallback(store: pb.ReceiptStore) -> None:
    """Two runs started in concurrent tasks each see their own as pb.last_run(); code that started none
    sees the latest in the process."""

    @pb.play
    async def slow(row, ctx):
        await asyncio.sleep(0.01)
        return {"n": row.n}

    async def one(n: int) -> tuple[pb.Run, pb.Run | None]:
        run = await pd.DataFrame({"n": range(n)}).play.arun(
            slow, store=store, progress=False, background=True
        )
        await asyncio.sleep(0)  # the other task starts its run meanwhile
        await run._task
        return run, pb.last_run()

    async def main() -> list[tuple[pb.Run, pb.Run | None]]:
        return list(await asyncio.gather(one(3), one(5)))

    (first, first_seen), (second, second_seen) = asyncio.run(main())
    assert first_seen is first and second_seen is second and first is not second
    assert pb.last_run() is second  # started last, and this code started none


def test_a_play_sees_each_column_as_pandas_iterates_it(store) -> None:
    """Text (pyarrow-backed when pyarrow is installed), numbers, times and missing values reach the
    play exactly as iterating the frame gives them: same values, same types."""
    frame = pd.DataFrame(
        {
            "s": pd.Series(["a", None, "c"]),
            "o": pd.Series(["x", None, 3], dtype=object),
            "n": [1, 2, 3],
            "f": [1.0, float("nan"), 2.5],
            "t": pd.to_datetime(["2024-01-01", None, "2024-01-03"]),
        }
    )
    seen: list[tuple] = []

    @pb.play
    async def look(row, ctx):
        seen.append(tuple(row[c] for c in frame.columns))
        return {}

    frame.play.map(look, store=store, progress=False, concurrency=1)
    expected = list(frame.itertuples(index=False, name=None))
    assert [[type(v) for v in r] for r in seen] == [[type(v) for v in r] for r in expected]
    assert [[v for v in r if v == v] for r in seen] == [[v for v in r if v == v] for r in expected]


def test_a_stop_sends_no_retry_of_a_call_that_failed_meanwhile(store) -> None:
    """A call in flight when the run is stopped lands; if it failed and would be retried, the retry
    is not sent (past the grace period its answer would be paid for and never written)."""
    tries: list[int] = []
    holder: dict[str, pb.Run] = {}

    @pb.tool(name="flaky_once", version="1", provider=pb.Provider("flaky-stop", retries=4))
    async def flaky(n: int) -> int:
        tries.append(n)
        holder["run"].stop()  # the stop arrives while this call is on the wire
        raise pb.ToolError("busy", status=503, retryable=True, retry_after=0.01)

    @pb.play
    async def play(row, ctx):
        return {"v": await ctx.tool(flaky, n=row.n)}

    async def main() -> pb.Run:
        run = await pd.DataFrame({"n": [1]}).play.arun(play, store=store, progress=False, background=True)
        holder["run"] = run
        for _ in range(1000):  # the run ends within its grace period
            if not run.running:
                break
            await asyncio.sleep(0.01)
        return run

    run = asyncio.run(main())
    assert tries == [1]
    assert run.result.play_status.tolist() == ["skipped"]


def test_a_rerun_settles_rows_and_their_copies_from_memos_in_chunks(store: pb.ReceiptStore) -> None:
    """A rerun over 20,000 rows (memos asked of the store a chunk at a time), every value twice:
    each row and its copy are reused with the output first returned; the calls and money saved
    count once per key; the rows whose output now clashes with an input column fail saying why."""
    calls: list[int] = []

    @pb.tool(name="priced", cost=0.25)
    async def priced(n: int) -> int:
        calls.append(n)
        return n * 3

    async def tripled(row, ctx):
        out = {"t": await ctx.tool(priced, n=row.n)}
        if row.n % 5000 == 1:
            out["n"] = -1  # replaces the input: allowed with overwrite=True only
        return out

    play = pb.play(tripled, name="tripled")
    frame = pd.DataFrame({"n": [i % 10_000 for i in range(20_000)]})
    first = frame.play.map(play, store=store, progress=False, overwrite=True, concurrency=64)
    assert len(calls) == 10_000 and (first["t"] == frame["n"] * 3).all()
    again = frame.play.map(play, store=store, progress=False, concurrency=64)
    stats = pb.last_run().stats
    clashed = frame["n"] % 5000 == 1
    assert len(calls) == 10_000
    assert (
        again.loc[~clashed, "play_status"].eq("reused").all()
        and (again.loc[~clashed, "t"] == frame.loc[~clashed, "n"] * 3).all()
    )
    assert (
        again.loc[clashed, "play_status"].eq("failed").all()
        and again.loc[clashed, "play_error"].str.contains("'n'").all()
    )
    assert again["n"].tolist() == frame["n"].tolist()  # nothing replaced without overwrite=True
    assert (stats.reused, stats.failed) == (20_000 - 4, 4)
    assert stats.calls_reused == 10_000 and stats.cost_saved == pytest.approx(2_500.0)


def test_a_rerun_over_new_rows_among_memoised_ones_runs_the_new_ones_in_frame_order(
    store: pb.ReceiptStore,
) -> None:
    """Memos are asked for in the order of their keys, not of the rows: the rows that find none
    still run in the frame's order, and every row's output is its own.  600 rows: their keys'
    order is already far from the frame's (a chunk of memos is 8192 keys; chunking is the test above)."""
    calls: list[int] = []

    @pb.tool(name="tripled_in_order")
    async def triple(n: int) -> int:
        calls.append(n)
        return n * 3

    async def tripled(row, ctx):
        return {"t": await ctx.tool(triple, n=row.n)}

    play = pb.play(tripled, name="tripled_in_order")
    frame = pd.DataFrame({"n": range(600)})
    frame[frame["n"] % 3 == 0].play.map(play, store=store, progress=False, concurrency=1)
    calls.clear()
    again = frame.play.map(play, store=store, progress=False, concurrency=1)
    assert calls == [n for n in range(600) if n % 3]
    assert again["play_status"].tolist() == ["reused" if n % 3 == 0 else "ok" for n in range(600)]
    assert (again["t"] == frame["n"] * 3).all()


@pytest.mark.parametrize(
    "column",
    [
        [7, -3, 7, 2**62, 0],
        np.array([2**64 - 1, 0, 5, 5, 1], dtype=np.uint64),
        np.array([1, 2, 3, 1, 2], dtype=np.int8),
        [True, False, True, True, False],
    ],
    ids=["int64", "uint64", "int8", "bool"],
)
def test_an_int_or_bool_column_keys_its_rows_as_the_same_values_as_objects_do(
    column: object, store: pb.ReceiptStore
) -> None:
    """Rows keyed by numpy ints or bools (read a column at a time) get the keys the same values get
    one by one: a run over the column as objects reuses every row of a run over it as numbers."""
    calls: list[object] = []

    async def echoed(row, ctx):
        calls.append(row.k)
        return {"seen": 1}

    play = pb.play(echoed, name="echoed_by_key")
    numbers = pd.DataFrame({"k": column, "name": list("abcde")})
    assert numbers["k"].dtype.kind in "iub"
    first = numbers.play.map(play, store=store, progress=False, id_columns=["k"])
    assert len(calls) == len(set(numbers["k"].tolist()))  # a repeated key runs once
    objects = numbers.astype({"k": object}).iloc[::-1]
    again = objects.play.map(play, store=store, progress=False, id_columns=["k"])
    assert len(calls) == len(set(numbers["k"].tolist())) and again["play_status"].eq("reused").all()
    assert first["play_status"].isin(["ok"]).all()


def test_rows_run_with_rarer_collections_and_the_thresholds_come_back(store: pb.ReceiptStore) -> None:
    """While rows run, Python collects its youngest objects every 10,000 of them, not 700; when the
    last of two overlapping runs ends, the thresholds are what they were. Thresholds set higher,
    or changed while a run goes, are left as they are."""
    import gc

    from playbook._internal.collection import YOUNG, fewer_collections

    seen: list[int] = []

    async def looks(row, ctx):
        seen.append(gc.get_threshold()[0])
        return {"v": 1}

    play = pb.play(looks, name="looks_at_collection")
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        pd.DataFrame({"n": range(3)}).play.map(play, store=store, progress=False)
        assert seen == [YOUNG] * 3 and gc.get_threshold() == (700, 10, 10)
        with fewer_collections(1):
            with fewer_collections(1):
                assert gc.get_threshold()[0] == YOUNG
            assert gc.get_threshold()[0] == YOUNG  # the other run still goes
        assert gc.get_threshold() == (700, 10, 10)
        with fewer_collections(1):
            gc.set_threshold(2000, 10, 10)  # the user's own choice, made meanwhile
        assert gc.get_threshold() == (2000, 10, 10)
        gc.set_threshold(50_000, 5, 5)
        seen.clear()
        pd.DataFrame({"n": range(3, 6)}).play.map(play, store=store, progress=False)
        assert seen == [50_000] * 3 and gc.get_threshold() == (50_000, 5, 5)
    finally:
        gc.set_threshold(*before)


def test_runs_collect_everything_once_many_rows_have_run_since_everything_was_last_collected(
    store: pb.ReceiptStore,
) -> None:
    """The cycles runs leave are collected when a run ends once ROWS rows have run since the last
    full collection, whoever made it; a small run's end pays none (in a big kernel, 0.25 s)."""
    import gc
    import weakref

    from playbook._internal.collection import ROWS, fewer_collections

    async def looks(row, ctx):
        return {"v": 1}

    play = pb.play(looks, name="looks_at_collection")
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 1_000_000)  # (no full collection happens by itself)

        class Cycle:
            pass

        with fewer_collections(ROWS):  # a run of that many rows: what earlier runs left is collected
            pass
        left = Cycle()
        left.me = left  # type: ignore[attr-defined]  # garbage only a collection frees
        gone = weakref.ref(left)
        gc.collect()  # it lives through a full collection: now among the oldest objects
        del left
        pd.DataFrame({"n": range(6, 9)}).play.map(play, store=store, progress=False)
        assert gone() is not None  # a small run's end pays no full collection (a big kernel: 0.25 s)
        with fewer_collections(ROWS - 3):  # the rows run since add up to ROWS
            pass
        assert gone() is None  # collected when that run ended, not left for a rare full collection
        with fewer_collections(ROWS // 2):
            pass
        left = Cycle()
        left.me = left  # type: ignore[attr-defined]
        gone = weakref.ref(left)
        gc.collect()  # a full collection made by someone else: the count of rows starts again
        del left
        with fewer_collections(
            ROWS // 2 + 1
        ):  # ROWS + 1 rows since this process's last, ROWS // 2 + 1 since that one
            pass
        assert gone() is not None
        with fewer_collections(ROWS // 2):
            pass
        assert gone() is None
    finally:
        gc.set_threshold(*before)
