"""A pilot: the play run for real on a sample of the rows a run would run, each row's calls logged.

The rows a run would run are those it would not reuse: rows answered by their memos are settled
as reused (free), as a run settles them, and the sample is drawn from the rest (random with a
seed, or the first N).  The sampled rows run as any run's rows do, through the same pipeline:
their calls are paid, become receipts and memos, and the real run reuses them.  Beside the
run's own counters, :class:`PilotLog` keeps what each sampled row paid, reused, spent in tokens
and waited on each request, per provider and tool: what :mod:`playbook.runtime.estimate.projection`
projects over the rows left.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from playbook.providers.limits.weights import parts
from playbook.runtime.calls.observed import Called, joined
from playbook.runtime.estimate.distinct import Counted, counted
from playbook.runtime.run import Run, scheduler
from playbook.tools.protocol import is_local

if TYPE_CHECKING:
    from playbook.tools.protocol import Spent, ToolEngine

__all__ = ["FIELDS", "Flight", "Pilot", "PilotLog"]

# What a row's line per (provider, tool) holds, in this order: calls paid, calls answered by a
# receipt made before the pilot, money, tokens, requests sent, their seconds on the wire, those that
# failed, the seconds from each call's first request to its answer (retries and their waits
# included), calls shared: answered by a receipt another pilot row paid for (or waited for in
# flight), and calls refused: paid, answered with a client error (4xx) the tool keeps as the call's
# answer, which fails the row and costs no money.  A request "failed" as the run's ``calls_failed``
# counts it: it brought back no answer to keep (a 5xx, a timeout, a 429), not a refusal.  Then
# the money the paid calls would have cost asked online (a batch job's answers cost less), and of
# their tokens, the output ones (an LLM's answers say).
FIELDS = (
    "paid",
    "reused",
    "cost",
    "tokens",
    "sent",
    "seconds",
    "failed",
    "span",
    "shared",
    "refused",
    "online",
    "output",
)
(
    _PAID,
    _REUSED,
    _COST,
    _TOKENS,
    _SENT,
    _SECONDS,
    _FAILED,
    _SPAN,
    _SHARED,
    _REFUSED,
    _ONLINE,
    _OUTPUT,
) = range(len(FIELDS))

Where = tuple[str | None, str]  # (provider, tool)


class PilotLog:
    """Per sampled row (by position), per (provider, tool): calls paid, reused and shared, money,
    tokens, requests sent, the seconds they took, and those that failed; and each call's inputs
    (per tool, by its place among the row's calls of that tool), with the tools called."""

    __slots__ = ("rows", "calls", "tools", "unpriced", "_first")

    def __init__(self) -> None:
        self.rows: dict[int, dict[Where, list[float]]] = {}
        self.unpriced: set[Where] = set()  # whose calls had no price: their cost is not known
        # row -> tool -> occurrence -> its inputs
        self.calls: dict[int, dict[str, dict[tuple[str, int], Called]]] = {}
        self.tools: dict[str, ToolEngine] = {}
        self._first: dict[tuple[int, str], float] = {}  # (row, tool) -> when its call's first request went

    def __repr__(self) -> str:
        return f"<PilotLog {len(self.rows)} rows>"

    def _line(self, position: int, tool: ToolEngine) -> list[float]:
        row = self.rows.setdefault(position, {})
        where = _where(tool)
        line = row.get(where)
        if line is None:
            line = row[where] = [0.0] * len(FIELDS)
        return line

    def called(self, position: int, tool: ToolEngine, occurrence: tuple[str, int], call: Called) -> None:
        """Row ``position`` calls ``tool`` with these inputs; ``occurrence``: the row's id (a
        sub-play's, for its calls) and the call's place among its calls of the tool (a row
        replayed after stepping aside calls it again: the same call)."""
        self.tools.setdefault(tool.name, tool)
        self.calls.setdefault(position, {}).setdefault(tool.name, {})[occurrence] = call

    def counted(
        self, position: int, tool: ToolEngine, reused: bool, spent: Spent, shared: bool = False
    ) -> None:
        """A call answered: paid now (its cost, its tokens), or reused from a receipt (``shared``:
        one another pilot row paid for)."""
        if is_local(tool, spent.cost):
            return  # a free local tool, run or answered by a receipt: nothing to pay, nothing to wait for
        line = self._line(position, tool)
        if reused:
            line[_SHARED if shared else _REUSED] += spent.requests
        else:
            line[_PAID] += spent.requests
            if spent.cost is None:
                self.unpriced.add(_where(tool))
            else:
                line[_COST] += spent.cost
                line[_ONLINE] += spent.cost if spent.online is None else spent.online
            line[_TOKENS] += spent.tokens or 0.0
            line[_OUTPUT] += parts(spent.tokens or 0.0)[1]  # of them, output (an LLM answer's says)

    def began(self, position: int, tool: ToolEngine) -> float:
        """A request to the tool is sent now (the first of its call, or a retry); returns when."""
        started = time.monotonic()
        self._first.setdefault((position, tool.name), started)
        return started

    def sent(
        self,
        position: int,
        tool: ToolEngine,
        began: float,
        *,
        failed: bool,
        refused: bool = False,
        status: int | None = None,
    ) -> None:
        """The request sent at ``began`` came back (``refused``: with a client error kept as the
        call's answer) or failed with nothing to keep: its time on the wire, and once answered,
        the call's time from its first request."""
        key = (position, tool.name)
        # a retry follows a failure
        first = self._first.get(key, began) if failed else self._first.pop(key, began)
        if is_local(tool, 0.0):
            return  # a plain Python tool: nothing was sent
        ended = time.monotonic()
        line = self._line(position, tool)
        line[_SENT] += 1
        line[_SECONDS] += ended - began
        line[_FAILED] += failed
        line[_REFUSED] += refused
        if not failed:
            line[_SPAN] += ended - first


@dataclass(frozen=True)
class Pilot:
    """What a pilot found: rows in the frame, those a run would run (leads: rows sharing a key run
    once), the sampled ones and how they ended, and each sampled row's log."""

    rows: int  # in the frame (after limit=)
    # rows a run will not run: answered by memos, or finished ok by the pilot (with the rows sharing
    # their keys)
    done_rows: int
    runnable: int  # rows a run would run (leads: rows sharing a key run once), the sample among them
    sample: list[int]  # positions run by the pilot
    measured: list[int]  # of those, rows that ended ok or failed: what the projection is made of
    failed: list[int]  # of the sample, rows that failed
    # of the sample, rows that did not end (parked by a hold or the budget, skipped): why -> rows
    cut: dict[str, int]
    log: PilotLog
    stats: Any  # the pilot run's RunStats: what it paid
    # tools whose calls the rows left share, counted from columns
    counted: dict[Where, Counted] = field(default_factory=dict)


class Flight:
    """The pilot of ``run`` (a run not started yet): :meth:`fly` runs ``rows`` more of the rows a
    run would run (the first time, those memos do not answer are found), and says what all it ran
    so far found.  Rows are taken at random with ``seed``, or in order (``first``)."""

    def __init__(self, run: Run, *, seed: int | None = 0, first: bool = False) -> None:
        self.run = run
        self.log = PilotLog()
        self.chosen: list[int] = []
        # the rows a run would run, not flown yet (None: not known before the first flight)
        self.pool: list[int] | None = None
        self.runnable = 0
        self._random = None if first else random.Random(seed)

    def __repr__(self) -> str:
        return f"<Flight {len(self.chosen)} rows flown of {self.runnable}>"

    @property
    def more(self) -> bool:
        """Are rows left that a further flight could run?"""
        return self.pool is None or bool(self.pool)

    def _take(self, rows: int) -> list[int]:
        pool = self.pool or []
        if self._random is None:
            picked, self.pool = pool[:rows], pool[rows:]
        else:
            picked = sorted(self._random.sample(pool, min(rows, len(pool))))
            taken = set(picked)
            self.pool = [p for p in pool if p not in taken]
        self.chosen.extend(picked)
        return picked

    async def fly(self, rows: int) -> Pilot:
        driven = scheduler(self.run)
        watching = driven.scope.observer  # the run's telemetry, if any: it hears the pilot's calls too
        driven.scope.observer = joined(self.log, watching)

        def choose(runnable: Sequence[int]) -> list[int]:
            self.pool, self.runnable = list(runnable), len(runnable)
            return self._take(rows)

        try:
            if self.pool is None:
                await driven.execute(choose=choose)
            else:
                await driven.execute(self._take(rows))
        finally:
            driven.scope.observer = watching
        return await self._found()

    async def _found(self) -> Pilot:
        driven = scheduler(self.run)
        table = driven.table
        ended = {p: table.status(p) for p in self.chosen}
        cut: dict[str, int] = {}
        for p, status in ended.items():
            if status not in ("ok", "failed"):
                parking = table.parkings.get(p)
                why = f"parked ({parking.reason})" if parking is not None else str(status)
                cut[why] = cut.get(why, 0) + 1
        measured = [p for p, status in ended.items() if status in ("ok", "failed")]
        failed = [p for p in measured if ended[p] == "failed"]
        state = self.run.state
        shared: dict[Where, Counted] = {}
        replay = driven.scope.replay
        if replay is None or replay.store is not driven.store:
            # fixtures in their own store answer from the file, by no key
            ran = set(measured)
            left = [
                *(self.pool or []),
                *(p for p in self.chosen if p not in ran),
            ]  # the rows the run will run
            # a free local tool pays nothing to count
            paying = {where for row in self.log.rows.values() for where in row}
            tools = {name: tool for name, tool in self.log.tools.items() if _where(tool) in paying}
            found = await counted(self.log.calls, tools, measured, left, table, driven.store)
            shared = {_where(self.log.tools[name]): c for name, c in found.items()}
        return Pilot(
            len(driven.frame),
            state.reused + state.ok,
            self.runnable,
            list(self.chosen),
            measured,
            failed,
            cut,
            self.log,
            self.run.stats,
            shared,
        )


def _where(tool: ToolEngine) -> Where:
    return tool.provider.name if tool.provider is not None else None, tool.name
