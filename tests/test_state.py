"""RunState's counters: calls paid (a provider or a cost) apart from free local calls, and when a
provider went down, built from the run's events."""

from __future__ import annotations

import pandas as pd

import playbook as pb
from playbook.events import CallFinished, ProviderDown, ProviderUp, RunStarted
from playbook.runtime.state.reading import RunState


def test_calls_with_a_provider_or_a_cost_are_paid_and_free_local_calls_are_counted_apart() -> None:
    """A call sent to a provider or with a cost counts as paid; one with neither counts as local; reused calls stay reused."""
    state = RunState()
    state.emit(RunStarted("r1", "enrich", 4))
    for event in [
        CallFinished("acme.email", "acme", False, 0.0),  # a provider that bills by the month
        CallFinished("priced", None, False, 0.5),  # a cost without a provider
        CallFinished("clean_domain", None, False, 0.0, local=True),
        CallFinished("clean_domain", None, False, 0.0, local=True),
        CallFinished("acme.email", "acme", True, 1.0),
        CallFinished("clean_domain", None, True, 0.0),
    ]:
        state.emit(event)
    stats = state.stats()
    assert (stats.calls_executed, stats.calls_local, stats.calls_reused) == (2, 2, 2)
    assert (stats.cost_spent, stats.cost_saved) == (0.5, 1.0)


def test_a_run_counts_its_local_tools_apart_from_the_ones_it_pays_for(store: pb.ReceiptStore) -> None:
    """In a real run a plain Python tool is a local call, a tool with a cost or a provider a paid one; a rerun reuses them all."""
    acme = pb.Provider("acme")

    @pb.tool
    def clean(n: int) -> int:
        return n

    @pb.tool(cost=0.25)
    async def priced(n: int) -> int:
        return n + 1

    @pb.tool(provider=acme)
    async def remote(n: int) -> int:
        return n + 2

    @pb.play
    async def three(row, ctx):
        n = await ctx.tool(clean, n=row.n)
        return {"a": await ctx.tool(priced, n=n), "b": await ctx.tool(remote, n=n)}

    frame = pd.DataFrame({"n": [1, 2, 3]})
    first = frame.play.run(three, store=store, progress=False).stats
    assert (first.calls_executed, first.calls_local, first.calls_reused, first.cost_spent) == (6, 3, 0, 0.75)
    again = frame.play.run(
        three, store=store, progress=False, refresh="rows"
    ).stats  # every call from its receipt
    assert (again.calls_executed, again.calls_local, again.calls_reused, again.cost_saved) == (0, 0, 9, 0.75)


def test_down_since_is_when_the_provider_went_down_until_it_is_up() -> None:
    """down_since holds the wall time of a provider's first ProviderDown, kept through failed probes, cleared by ProviderUp."""
    now = [1_000.0]
    state = RunState(wall=lambda: now[0])
    state.emit(ProviderDown("acme", "connection refused"))
    now[0] = 1_030.0
    state.emit(ProviderDown("acme", "connection reset"))  # a probe failed: the same outage
    assert state.down_since == {"acme": 1_000.0}
    state.emit(ProviderUp("acme"))
    assert state.down_since == {}
    state.emit(ProviderDown("acme", "timed out"))
    assert state.down_since == {"acme": 1_030.0}


def test_the_phase_says_whether_the_run_goes_is_stopping_or_ended() -> None:
    """not started → running → stopping (a stop asked for) → stopped; a retry runs again, and ends finished."""
    from playbook.events import RunFinished

    state = RunState()
    seen = [state.phase]
    state.emit(RunStarted("r1", "enrich", 4))
    seen.append(state.phase)
    state.stop_requested()
    seen.append(state.phase)
    state.emit(RunFinished("r1", True))
    seen.append(state.phase)
    state.emit(RunStarted("r1", "enrich", 4))
    state.emit(RunFinished("r1", False))
    seen.append(state.phase)
    assert seen == ["not started", "running", "stopping", "stopped", "finished"]


def test_rows_reused_from_memos_count_the_same_whether_a_view_listens_to_each_or_not(
    store: pb.ReceiptStore,
) -> None:
    """A memo replay counts rows, calls saved, their cost and the memo's spend line alike with a view listening to each row and without."""

    @pb.tool
    def clean(n: int) -> int:
        return n

    @pb.tool(cost=0.1)
    async def priced(n: int) -> int:
        return n + 1

    @pb.play
    async def two(row, ctx):
        return {"a": await ctx.tool(priced, n=await ctx.tool(clean, n=row.n))}

    # 0.1 seven times is not 0.7: the counts add each row's cost in the rows' order, either way
    frame = pd.DataFrame({"n": [1, 2, 3, 4, 5, 6, 7, 7]})
    frame.play.run(two, store=store, progress=False)
    counted = []
    for progress in (False, "text"):  # no view; a view listening to every row's end
        stats = frame.play.run(two, store=store, progress=progress).stats
        counted.append(
            (stats.reused, stats.calls_reused, stats.calls_local, stats.cost_saved, stats.calls_executed)
        )
    assert counted[0] == counted[1] == (8, 7, 0, round(sum([0.1] * 7), 9), 0)
    memo_line = store.spend(by=("provider", "tool"))
    memo_line = memo_line[memo_line["tool"] == "play two"]
    assert (memo_line["calls_reused"].iat[0], memo_line["cost_saved"].iat[0]) == (14, 2 * sum([0.1] * 7))


def test_rows_count_the_same_heard_or_not() -> None:
    """A row's start and end count the same whether a view hears its events or not, and a view that
    subscribes, then leaves, is no longer handed them."""
    from playbook.events import RowFinished, RowStarted
    from playbook.runtime.rows.table import RowTable
    from playbook.runtime.schedule.outcomes import Outcomes
    from playbook.runtime.schedule.retry_queue import RetryQueue

    table = RowTable(pd.DataFrame({"x": range(6)}))
    state = RunState(play="p")
    state.attach(table)
    outcomes = Outcomes(table, RetryQueue(), state, lambda pos, provider: None)
    heard: list[object] = []
    for pos in range(6):
        leave = state.subscribe(heard.append, kinds=(RowStarted,)) if pos in (2, 3) else None
        outcomes.started(pos)
        assert state.in_flight == 1
        outcomes.finish(pos, "ok", {"y": pos}, None, cost_failed=0.5)
        if leave is not None:
            leave()
    assert (state.ok, state.in_flight, state.cost_failed) == (6, 0, 3.0)
    assert [e.position for e in heard] == [2, 3]  # type: ignore[attr-defined]
    assert state.starts_unheard and state.oks_unheard and not any(isinstance(e, RowFinished) for e in heard)


def test_a_tally_of_what_went_wrong_is_not_handed_the_rows_that_went_ok() -> None:
    """A listener of ``RowFinished`` that needs no row that simply went ok (``every_row=False``, as
    the live views' tally) is handed the failed and parked ones, the others count as unheard rows
    do; an ordinary listener of ``RowFinished`` gets every row again."""
    from playbook.events import RowFinished
    from playbook.runtime.rows.table import RowTable
    from playbook.runtime.schedule.outcomes import Outcomes
    from playbook.runtime.schedule.retry_queue import RetryQueue

    table = RowTable(pd.DataFrame({"x": range(6)}))
    state = RunState(play="p")
    state.attach(table)
    outcomes = Outcomes(table, RetryQueue(), state, lambda pos, provider: None)
    wrong: list[object] = []
    leave = state.subscribe(wrong.append, kinds=(RowFinished,), every_row=False)
    assert state.oks_unheard and state.starts_unheard
    for pos in range(4):
        outcomes.started(pos)
        outcomes.finish(
            pos, "failed" if pos == 1 else "ok", None if pos == 1 else {"y": pos}, "no" if pos == 1 else None
        )
    assert [e.position for e in wrong] == [1]  # type: ignore[attr-defined]
    every: list[object] = []
    stay = state.subscribe(every.append, kinds=(RowFinished,))
    assert not state.oks_unheard
    for pos in (4, 5):
        outcomes.started(pos)
        outcomes.finish(pos, "ok", {"y": pos}, None)
    assert [e.position for e in every] == [4, 5] and [e.position for e in wrong] == [1, 4, 5]  # type: ignore[attr-defined]
    stay()
    leave()
    assert state.oks_unheard and (state.ok, state.failed, state.in_flight) == (5, 1, 0)


def test_row_values_read_ahead_match_the_frame() -> None:
    """A row's values are what iterating the frame gives, taken in order across chunks or out of order."""
    from playbook.runtime.rows.table import RowTable

    n = 700
    frame = pd.DataFrame({"x": range(n), "s": [f"v{i}" for i in range(n)], "f": [i / 2 for i in range(n)]})
    table = RowTable(frame)
    expected = list(frame.itertuples(index=False, name=None))
    order = [*range(300), 650, 5, *range(300, n)]
    assert all(table.values(pos) == expected[pos] for pos in order)
    assert all(type(a) is type(b) for pos in order for a, b in zip(table.values(pos), expected[pos]))
