"""The live panel's tally of failed, parked and held rows agrees with the run, event by event,
through holds, parking, duplicate keys and retries, and with the summary's one-scan tally
(real runs in virtual time)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pandas as pd
from vtime import run_virtual

import playbook as pb
from playbook.events import Event, RowFinished, RowParked, RowRequeued, RunFinished
from playbook.ui.tally import KINDS, Tally

Counts = tuple[Counter[str], Counter[str | None], Counter[str], Counter[tuple[str | None, str]], Counter[Any]]


def _truth(run: pb.Run) -> Counts:
    """Scanned from the run's rows through the state's read API: failed rows per error group, parked
    rows per provider, held rows per provider, parked rows per provider and reason, and per reason,
    provider and the minute they are ready in."""
    state = run.state
    failed = Counter(row.group for row in state.failed_rows())
    parked = Counter(row.provider for row in state.parked_rows())
    held = Counter(w.provider for w in state.waiting_rows().values() if w.provider is not None)
    reasons = Counter((row.provider, row.reason) for row in state.parked_rows())
    minutes = Counter(
        (r.reason, r.provider, None if r.ready_at is None else r.ready_at // 60 * 60)
        for r in state.parked_rows()
    )
    paid = Counter[str]()
    for row in state.failed_rows():
        paid[row.group] += row.cost
    return (
        failed,
        parked,
        held,
        reasons,
        minutes,
        Counter({group: round(cost, 9) for group, cost in paid.items() if round(cost, 9)}),
    )


def _tallied(tally: Tally) -> Counts:
    failed = Counter({group: rows for group, rows in tally.counts.items() if rows})
    parked = Counter({p: n for p, n in tally.parked_rows_by.items() if n})
    held = Counter({p: n for p, n in tally.held_by.items() if n})
    reasons = Counter({key: n for key, n in tally.parked_reasons.items() if n})
    paid = Counter({group: round(cost, 9) for group, cost in tally.paid.items() if round(cost, 9)})
    return failed, parked, held, reasons, Counter(tally.parked_groups), paid


def test_the_tally_matches_a_scan_of_the_rows_after_every_row_and_retry(store: pb.ReceiptStore) -> None:
    """Failed rows by message (and what they paid for), parked and held rows by provider, parked rows by
    provider and reason: the tally equals a scan of the rows at every row settled."""
    quota = pb.Provider("quota", max_wait=30)
    asked = Counter[int]()

    @pb.tool(provider=quota)
    async def limited(n: int) -> int:
        asked[n] += 1
        if n >= 12 and asked[n] == 1 and not asked[-1]:
            raise pb.ToolError("quota exceeded", status=429, retry_after=20 if n < 30 else 3600)
        return n

    @pb.tool(cost=0.5)
    async def priced(n: int) -> int:
        return n

    @pb.play
    async def mixed(row, ctx):
        await asyncio.sleep(0.1)
        if row.n % 5 == 1:
            raise ValueError(f"odd one {row.n % 3}")  # three messages, one group
        if row.n % 7 == 3:
            await ctx.tool(priced, n=row.n)
            raise LookupError(
                "paid, then lost"
            )  # a group whose rows paid (the first time: a retry replays the call)
        return {"v": await ctx.tool(limited, n=row.n)}

    frame = pd.DataFrame({"n": [i // 2 for i in range(80)]})  # each key twice: copies share an outcome
    checked: list[int] = []
    paid_before_retry = Counter[str]()

    def followed(run: pb.Run) -> Tally:
        tally = Tally(run.state.label)
        run.state.subscribe(tally.on_event, kinds=KINDS)

        def check(event: Event) -> None:
            tallied = _tallied(tally)
            assert tallied == _truth(run), event
            checked.append(sum(tallied[2].values()))  # rows held at that moment

        run.state.subscribe(check, kinds=(RowFinished, RunFinished))  # after the tally's
        return tally

    async def main() -> list[tuple[pb.Run, Tally]]:
        run = await frame.play.arun(
            mixed, store=store, progress=False, background=True, concurrency=4, id_columns="n"
        )
        runs = [(run, followed(run))]
        await asyncio.wait([run._task])
        assert run.stats.parked and run.stats.failed
        paid_before_retry.update(_tallied(runs[0][1])[5])
        # Each retry is a run of its own: its tally starts empty and counts the rows it runs.
        again = run.retry(statuses=("failed",))  # the failed rows fail again
        runs.append((again, followed(again)))
        await asyncio.wait([again._task])
        await asyncio.sleep(3600)
        asked[-1] = 1  # the quota is back: the parked rows now succeed
        last = again.retry(statuses=("parked",))
        runs.append((last, followed(last)))
        await asyncio.wait([last._task])
        return runs

    (first, _), (run, tally), (last, parked_tally) = run_virtual(main())
    assert (
        len(checked) > 40 and max(checked) > 0
    )  # every key settled at least once, some while others were held
    for each, its in ((run, tally), (last, parked_tally)):
        assert (
            _tallied(its) == _truth(each) == _tallied(Tally.of(each.state))
        )  # the static summary's scan agrees
    assert not parked_tally.parked and not parked_tally.counts and last.stats.ok == first.stats.parked
    assert not tally.parked and sum(tally.counts.values()) == run.stats.failed == first.stats.failed
    groups = tally.error_groups(20)
    assert len(groups) == 2 and len({m.partition(" (")[0] for m in run.result["play_error"].dropna()}) == 4
    assert paid_before_retry and paid_before_retry == {
        g: c for g, c in paid_before_retry.items() if g.startswith("LookupError")
    }
    assert [cost for *_, cost in groups] == [
        0.0,
        0.0,
    ]  # the retried rows replayed their paid calls from receipts
    errors = run.errors.set_index("row")
    for _, group, label, message, _cost in groups:
        assert run.result.loc[label, "play_error"] == message  # each example row still fails that way
        assert errors.loc[label, "group"] == group


def test_parked_rows_are_counted_by_provider_and_reason_and_leave_on_a_retry() -> None:
    """Rows parked on a down provider, on a hold and by the budget count per provider and reason (with the rows
    sharing their key); a retried row leaves its count."""
    tally = Tally(lambda position: position)
    for event in [
        RowParked(0, "down", "acme", 1.0),
        RowFinished(0, "parked", "provider 'acme' is down", copies=2),
        RowParked(1, "hold", "acme", 2.0),
        RowFinished(1, "parked", "provider 'acme' holds calls"),
        RowParked(2, "budget", None, None),
        RowFinished(2, "parked", "budget"),
    ]:
        tally.on_event(event)
    assert (tally.reasons("acme"), tally.reasons(None), tally.waiting()) == (
        {"down": 2, "hold": 1},
        {"budget": 1},
        {"acme": 3, None: 1},
    )
    tally.on_event(RowRequeued(0, "parked", 2))
    assert (tally.reasons("acme"), tally.parked_count) == ({"hold": 1}, 2)
