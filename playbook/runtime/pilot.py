"""A pilot: the play run for real on a sample of the rows a run would run, each row's calls logged.

The rows a run would run are those it would not reuse: rows answered by their memos are settled
as reused (free), as a run settles them, and the sample is drawn from the rest (random with a
seed, or the first N).  The sampled rows run as any run's rows do, through the same pipeline:
their calls are paid, become receipts and memos, and the real run reuses them.  Beside the
run's own counters, :class:`PilotLog` keeps what each sampled row paid, reused, spent in tokens
and waited on each request, per provider and tool: what :mod:`playbook.runtime.estimate`
projects over the rows left.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..tools.base import is_local
from .run import Run, scheduler

if TYPE_CHECKING:
    from ..tools import Tool
    from ..tools.base import Spent

__all__ = ["FIELDS", "Pilot", "PilotLog", "fly"]

T = TypeVar("T")

# What a row's line per (provider, tool) holds, in this order.
FIELDS = ("paid", "reused", "cost", "tokens", "sent", "seconds", "failed")
_PAID, _REUSED, _COST, _TOKENS, _SENT, _SECONDS, _FAILED = range(len(FIELDS))

Where = tuple[str | None, str]  # (provider, tool)


class PilotLog:
    """Per sampled row (by position), per (provider, tool): calls paid and reused, money, tokens,
    requests sent, the seconds they took, and those that failed."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: dict[int, dict[Where, list[float]]] = {}

    def __repr__(self) -> str:
        return f"<PilotLog {len(self.rows)} rows>"

    def _line(self, position: int, tool: Tool[Any]) -> list[float]:
        row = self.rows.setdefault(position, {})
        where = (tool.provider.name if tool.provider is not None else None, tool.name)
        line = row.get(where)
        if line is None:
            line = row[where] = [0.0] * len(FIELDS)
        return line

    def counted(self, position: int, tool: Tool[Any], reused: bool, spent: Spent) -> None:
        """A call answered: paid now (its cost, its tokens), or reused from a receipt."""
        if not reused and is_local(tool, spent.cost):
            return  # a free local tool: nothing to pay, nothing to wait for
        line = self._line(position, tool)
        if reused:
            line[_REUSED] += spent.requests
        else:
            line[_PAID] += spent.requests
            line[_COST] += spent.cost
            line[_TOKENS] += spent.tokens or 0.0

    async def timed(self, position: int, tool: Tool[Any], sent: Awaitable[T]) -> T:
        """One request to the tool's provider: how long it took, and whether it failed."""
        started = time.monotonic()
        failed = True
        try:
            result = await sent
            failed = False
            return result
        finally:
            if not is_local(tool, 0.0):
                line = self._line(position, tool)
                line[_SENT] += 1
                line[_SECONDS] += time.monotonic() - started
                line[_FAILED] += failed


@dataclass(frozen=True)
class Pilot:
    """What a pilot found: rows in the frame, those a run would run (leads: rows sharing a key run
    once), the sampled ones and how they ended, and each sampled row's log."""

    rows: int  # in the frame (after limit=)
    reused_rows: int  # answered by their memos before the pilot: free
    runnable: int  # rows a run would run (leads), the sample among them
    sample: list[int]  # positions run by the pilot
    finished: int  # of those, rows that finished ok (a run reuses them)
    log: PilotLog
    seconds: float  # how long the pilot took
    stats: Any  # the pilot run's RunStats: what it paid


async def fly(run: Run, sample: int, *, seed: int | None = 0, first: bool = False) -> Pilot:
    """Run the pilot of ``run`` (a run not started yet) on ``sample`` of its rows."""
    driven = scheduler(run)
    log = PilotLog()
    driven.scope.observer = log
    chosen: list[int] = []
    counted = [0]

    def choose(runnable: Sequence[int]) -> list[int]:
        counted[0] = len(runnable)
        pool = list(runnable)
        picked = pool[:sample] if first else sorted(random.Random(seed).sample(pool, min(sample, len(pool))))
        chosen.extend(picked)
        return picked

    started = time.monotonic()
    try:
        await driven.execute(choose=choose)
    finally:
        driven.scope.observer = None
    table = driven.table
    finished = sum(table.status(p) == "ok" for p in chosen)
    state = run.state
    return Pilot(len(driven.frame), state.reused, counted[0], chosen, finished, log, time.monotonic() - started, run.stats)
