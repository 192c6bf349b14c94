"""Steps of the call pipeline, each on its own: the lookup that waits for a call in flight, the cost
budget, the row table's one-line reset, the held queue's order (real store, virtual time), and a row that steps
back for the fresh rows while another run pays for its call."""

from __future__ import annotations

import asyncio
import tracemalloc

import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb
from playbook._internal.flow import Parked
from playbook.addresses import receipt_address
from playbook.runtime.calls.pipeline import lookup
from playbook.runtime.calls.scope import Ahead, CostBudget
from playbook.runtime.rows.table import Parking, RowTable
from playbook.runtime.schedule.retry_queue import RetryQueue
from playbook.store import MISSING, engine
from playbook.store.inflight import InFlight
from playbook.store.records import record


def test_lookup_waits_for_the_same_call_in_flight_then_reads_its_receipt(store: pb.ReceiptStore) -> None:
    """A key missing from the store is MISSING at once; while another row pays for it, lookup waits for
    that call and returns its receipt instead of paying twice."""
    key = receipt_address("t", "1", '{"n":1}', "default")
    core = engine(store)

    async def main() -> tuple[object, object, float]:
        assert await lookup(core, key, None) is MISSING
        paying, ended = object(), []
        core.inflight.start(key, paying)

        async def pay() -> None:
            await asyncio.sleep(5)
            await core.commit(record(key, tool="t", stored={"v": 1}, tagged=False, at=0.0))
            core.inflight.end(key, paying)
            ended.append(key not in core.inflight)

        task = asyncio.ensure_future(pay())
        found = await lookup(core, key, None)
        await task
        return found, ended == [True], asyncio.get_running_loop().time()

    found, paid, at = run_virtual(main())
    assert paid and at == pytest.approx(5.0) and found[0] == {"v": 1}  # type: ignore[index]


def test_the_cost_budget_reserves_before_dispatch_and_refunds_what_did_not_complete() -> None:
    """A paid call is counted before it is sent; one that would pass max_cost parks its row; a refund frees room."""

    @pb.tool(cost=0.4)
    def priced(n: int) -> int:
        return n

    async def main() -> None:
        budget = CostBudget(1.0)
        await budget.reserve(priced, 0.4)
        await budget.reserve(priced, 0.4)
        with pytest.raises(Parked) as parked:
            await budget.reserve(priced, 0.4, wait=False)
        assert parked.value.reason == "budget" and budget.committed == pytest.approx(0.8)
        budget.refund(0.4)
        await budget.reserve(priced, 0.4)
        assert budget.committed == pytest.approx(0.8)
        budget.charge(0.4, 0.4)
        budget.charge(0.4, 0.4)
        with pytest.raises(Parked):  # nothing in flight to wait for
            await budget.reserve(priced, 0.4)

    asyncio.run(main())


def test_the_cost_budget_settles_each_call_at_what_it_really_cost() -> None:
    """A call reserved at its estimate is counted at its real cost once answered, up or down."""
    llm = pb.tool(lambda n: n, name="priced_by_usage")

    async def main() -> None:
        budget = CostBudget(1.0)
        await budget.reserve(llm, 0.5)
        budget.charge(0.5, 0.125)
        await budget.reserve(llm, 0.5)
        budget.charge(0.5, 0.75)
        assert budget.committed == pytest.approx(0.875)
        with pytest.raises(Parked):
            await budget.reserve(llm, 0.5)

    asyncio.run(main())


def test_a_call_that_does_not_fit_waits_for_the_calls_in_flight_to_settle() -> None:
    """Reservations in flight at their estimates: a call waits for them, and goes once they settle for less."""
    llm = pb.tool(lambda n: n, name="estimated")

    async def main() -> float:
        budget = CostBudget(1.2)
        await budget.reserve(llm, 0.5)
        await budget.reserve(llm, 0.5)
        waiting = asyncio.ensure_future(budget.reserve(llm, 0.5))
        await asyncio.sleep(0)
        assert not waiting.done()
        budget.charge(0.5, 0.1)  # cost less than estimated: room for the waiting call
        await asyncio.wait_for(waiting, 1.0)
        return budget.committed

    assert asyncio.run(main()) == pytest.approx(1.1)


def test_a_row_and_its_copies_settle_together_and_reset_in_one_step() -> None:
    """Rows sharing a key share their lead's outcome; unsettling the lead resets every field of the group."""
    table = RowTable(pd.DataFrame({"k": [1, 2, 1]}, index=["a", "b", "c"]))
    runnable, unkeyed = table.identify([0, 1, 2], None)
    assert (runnable, unkeyed) == ([0, 1], [])
    table.park(0, Parking("hold", "acme", 10.0))
    assert table.set_outcome(0, "parked", None, "held too long") == 2
    assert [row.row for row in table.parked()] == ["a", "c"]
    assert table.settled_as(("parked",)) == [0]  # the copy runs with its lead
    assert table.unsettle(0) == 2
    assert [(table.status(p), table.errors.get(p), table.parkings.get(p)) for p in range(3)] == [
        (None, None, None)
    ] * 3
    assert table.set_outcome(0, "ok", {"v": 1}, None) == 2
    assert [table.output(p) for p in range(3)] == [{"v": 1}, None, {"v": 1}]


def test_a_hundred_thousand_rows_cost_the_rows_table_a_few_bytes_each() -> None:
    """The table keeps a row's state in arrays and its outputs by column: 100,000 rows, a tenth
    failed, hold under 64 bytes a row beyond the frame (16 of them the row's id, 8 its copy of
    the frame's value, 8 its output's place), and identifying them peaks under 128."""
    n = 100_000
    frame = pd.DataFrame({"x": range(n)})
    tracemalloc.start()
    try:
        table = RowTable(frame)
        runnable, unkeyed = table.identify(range(n), None)  # as a run asks: every row, a range
        _, peak = tracemalloc.get_traced_memory()
        for pos in runnable:
            if pos % 10:
                table.set_outcome(pos, "ok", {"y": 1}, None)
            else:
                table.set_outcome(
                    pos, "failed", None, f"ValueError: no y for {pos}", "ValueError: no y for <n>"
                )
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(runnable) == n and not unkeyed
    assert held / n < 64 and peak / n < 128, (held / n, peak / n)
    assert len(table.failed()) == n // 10 and table.output(1) == {"y": 1} and table.key(1) is not None


def test_the_held_queue_gives_rows_back_in_deadline_order() -> None:
    """Rows come back by their time, ties in the order they were held; nothing before its time."""
    queue = RetryQueue()
    for pos, until in [(0, 5.0), (1, 2.0), (2, 5.0)]:
        queue.push(pos, until)
    assert queue.due(1.0) is None and queue.next_at() == 2.0
    assert [queue.due(9.0), queue.due(9.0), queue.due(9.0), queue.due(9.0)] == [1, 0, 2, None]


def test_a_row_held_behind_comes_back_only_when_no_fresh_row_waits() -> None:
    """A row held behind (its call fails on its own) is due at its time only when no fresh row
    waits; the rows held ahead of fresh ones come first, and its time counts for the next nap."""
    queue = RetryQueue()
    queue.push(0, 1.0, behind=True)
    queue.push(1, 3.0)
    assert len(queue) == 2 and queue.next_at() == 1.0
    assert queue.due(2.0, fresh=True) is None and queue.due(2.0) == 0
    queue.push(0, 1.0, behind=True)
    assert queue.due(9.0, fresh=True) == 1 and queue.due(9.0, fresh=True) is None and queue.due(9.0) == 0


def test_a_row_whose_call_another_run_pays_for_steps_back_for_the_fresh_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Another run on the same store (a thread here, with a store object and leases of its own, as
    a process has) holds the lease of row 0's call: row 0 steps back instead of waiting, the fresh
    rows 1-4 run meanwhile (from a random place among them: another process runs them in the same
    order), and row 0 comes back last, reused from the memo the other run left."""
    import threading
    import time

    calls: list[tuple[str, int]] = []

    @pb.tool(name="lookup", version="1")
    async def lookup_(n: int) -> int:
        calls.append((threading.current_thread().name, n))
        await asyncio.sleep(0.5 if n == 0 else 0.01)
        while (
            n != 0 and len(calls) == 5 and other.is_alive()
        ):  # the other run is over (its memo written) before row 0 comes back
            await asyncio.sleep(0.01)
        return n * 10

    play = pb.play(lambda_play(lookup_), name="tenfold")
    location = tmp_path / "store"
    other = threading.Thread(
        target=lambda: pd.DataFrame({"n": [0]}).play.map(play, store=location, progress=False), name="other"
    )
    other.start()
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:  # the other run is paying for row 0's call
        time.sleep(0.005)
    out = pd.DataFrame({"n": range(5)}).play.map(play, store=location, progress=False, concurrency=1)
    other.join()
    assert calls[0] == ("other", 0) and sorted(n for _, n in calls[1:]) == [
        1,
        2,
        3,
        4,
    ]  # row 0's call was paid once, by the other run
    assert out["play_status"].tolist() == ["reused", "ok", "ok", "ok", "ok"] and out["lookup"].tolist() == [
        0,
        10,
        20,
        30,
        40,
    ]


def test_a_run_of_new_calls_takes_leases_first_and_still_reuses_a_receipt_it_then_finds(
    store: pb.ReceiptStore,
) -> None:
    """After a hundred calls with no receipt, the run takes each call's lease before looking its
    receipt up (one lookup instead of two).  The next hundred calls have receipts (another play made
    them): each is found once its lease is held and reused, never paid again."""
    paid: list[int] = []

    @pb.tool(name="lookup", version="1", cost=0.001)  # a cost: a paid call, counted as executed
    async def lookup_(n: int) -> int:
        paid.append(n)
        return n * 10

    pd.DataFrame({"n": range(100, 200)}).play.map(
        pb.play(lambda_play(lookup_), name="earlier"), store=store, progress=False
    )
    paid.clear()
    backend = engine(store).backend
    take, take_and_look, leased = backend.take, backend.take_and_look, []

    def counted(keys, owner, ttl):  # type: ignore[no-untyped-def]  # the store's own take, counted
        leased.extend(keys)
        return take(keys, owner, ttl)

    def counted_looking(keys, owner, ttl):  # type: ignore[no-untyped-def]  # a take that reads too
        leased.extend(keys)
        return take_and_look(keys, owner, ttl)

    backend.take = counted  # type: ignore[method-assign]
    backend.take_and_look = counted_looking  # type: ignore[method-assign]
    run = pd.DataFrame({"n": range(200)}).play.run(
        pb.play(lambda_play(lookup_), name="tenfold"), store=store, progress=False, concurrency=1
    )

    assert paid == list(range(100))
    assert run.stats.calls_executed == 100 and run.stats.calls_reused == 100
    # Leases: the hundred new calls, then the first few calls that had receipts, until their
    # tool is looked up first again (every one of them, were it never; none, were it always).
    assert 100 < len(leased) < 120, len(leased)
    assert run.result["lookup"].tolist() == [n * 10 for n in range(200)]


def test_a_receipt_gives_its_call_lease_back_in_the_same_transaction(store: pb.ReceiptStore) -> None:
    """On this machine a call's lease goes with its receipt's commit (no transaction of its own):
    once the receipt is on disk no process sees the lease, and letting it go costs nothing more."""
    key = receipt_address("t", "1", '{"n":1}', "default")
    core = engine(store)

    async def main() -> tuple[object, object, bool]:
        assert await core.leases.take(key)
        leased = core.backend.holder(key)
        await core.commit(record(key, tool="t", stored={"v": 1}, tagged=False, at=0.0))
        return leased, core.backend.holder(key), key in core.leases.held

    leased, after, held = asyncio.run(main())
    assert leased is not None and after is None and not held
    assert core.lookup(key)[0] == {"v": 1}


def test_a_tool_is_looked_up_first_again_once_its_calls_find_receipts() -> None:
    """Looking up first is learnt per tool: a few misses keep it, a run of them ends it, and a few
    calls that found their receipts bring it back."""
    ahead = Ahead()
    assert ahead.first("a")  # a tool not seen yet: a replay is the likely case
    for _ in range(5):
        ahead.learn("a", False)
    assert ahead.first("a")
    for _ in range(20):
        ahead.learn("a", False)
    assert not ahead.first("a") and ahead.first("b")
    for _ in range(5):
        ahead.learn("a", True)
    assert ahead.first("a")


def lambda_play(tool: pb.Tool):  # type: ignore[no-untyped-def]
    async def tenfold(row, ctx):  # type: ignore[no-untyped-def]
        return {"lookup": await ctx.tool(tool, n=row.n)}

    return tenfold


def test_a_call_in_flight_that_ends_leaves_another_of_the_same_address_in_flight() -> None:
    """Two calls of one address paid at once (both refreshed): the first to end wakes the rows waiting
    for the address, and the other stays in flight, so they wait for it in turn."""

    async def main() -> list[bool]:
        inflight, first, second = InFlight(), object(), object()
        inflight.start("k", first)
        inflight.start("k", second)
        waiting = inflight.ended("k")
        assert waiting is not None and not waiting.done()
        inflight.end("k", first)
        seen = [waiting.done(), "k" in inflight]
        again = inflight.ended("k")
        inflight.end("k", second)
        return [*seen, again is not None and again.done(), "k" not in inflight, inflight.ended("k") is None]

    assert asyncio.run(main()) == [True, True, True, True, True]
