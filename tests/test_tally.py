"""The live panel's tally of failed, parked and held rows agrees with the run, event by event,
through holds, parking, duplicate keys and retries, and with the summary's one-scan tally
(real runs in virtual time)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pandas as pd
from vtime import run_virtual

import playbook as pb
from playbook.models import Event, RowFinished, RunFinished
from playbook.ui.tally import KINDS, Tally


def _truth(run: pb.Run) -> tuple[Counter[str], Counter[str | None], Counter[str]]:
    """Scanned from the run's rows: failed rows per message, parked rows per provider, held rows per provider."""
    m = run._maprun
    failed = Counter(e for e, s in zip(m.errors, m.status) if s == "failed")
    parked = Counter(m.park_provider[p] for p, s in enumerate(m.status) if s == "parked")
    held = Counter(m._held.waiting_on.values())
    return failed, parked, held


def _tallied(tally: Tally) -> tuple[Counter[str], Counter[str | None], Counter[str]]:
    failed = Counter({message: rows for message, rows in tally.counts.items() if rows})
    parked = Counter({p: n for p, n in tally.parked_rows_by.items() if n})
    held = Counter({p: n for p, n in tally.held_by.items() if n})
    return failed, parked, held


def test_the_tally_matches_a_scan_of_the_rows_after_every_row_and_retry(store: pb.ReceiptStore) -> None:
    """Failed rows by message, parked and held rows by provider: the tally equals a scan of the rows at every row settled."""
    quota = pb.Provider("quota", max_wait=30)
    asked = Counter[int]()

    @pb.tool(provider=quota)
    async def limited(n: int) -> int:
        asked[n] += 1
        if n >= 12 and asked[n] == 1 and not asked[-1]:
            raise pb.ToolError("quota exceeded", status=429, retry_after=20 if n < 30 else 3600)
        return n

    @pb.play
    async def mixed(row, ctx):
        await asyncio.sleep(0.1)
        if row.n % 5 == 1:
            raise ValueError(f"odd one {row.n % 3}")  # three messages, shared by many rows
        return {"v": await ctx.tool(limited, n=row.n)}

    frame = pd.DataFrame({"n": [i // 2 for i in range(80)]})  # each key twice: copies share an outcome
    checked: list[int] = []

    async def main() -> tuple[pb.Run, Tally]:
        run = await frame.play.arun(mixed, store=store, progress=False, background=True, concurrency=4, key="n")
        tally = Tally(run._maprun.label)
        run.state.subscribe(tally.on_event, kinds=KINDS)

        def check(event: Event) -> None:
            tallied = _tallied(tally)
            assert tallied == _truth(run), event
            checked.append(sum(tallied[2].values()))  # rows held at that moment

        run.state.subscribe(check, kinds=(RowFinished, RunFinished))  # after the tally's
        await asyncio.wait([run._task])
        assert run.stats.parked and run.stats.failed
        run.retry(statuses=("failed",))  # the failed rows leave the tally, then fail again
        await asyncio.wait([run._task])
        await asyncio.sleep(3600)
        asked[-1] = 1  # the quota is back: the parked rows now succeed
        run.retry(statuses=("parked",))
        await asyncio.wait([run._task])
        return run, tally

    run, tally = run_virtual(main())
    assert len(checked) > 40 and max(checked) > 0  # every key settled at least once, some while others were held
    assert _tallied(tally) == _truth(run) == _tallied(Tally.of(run._maprun))  # the static summary's scan agrees
    assert not tally.parked and sum(tally.counts.values()) == run.stats.failed
    examples = {message: label for _, message, label in tally.error_groups(20)}
    for message, label in examples.items():
        assert run.result.loc[label, "play_error"] == message  # each example row still fails that way
