"""What the runtime keeps of one row attempt behind its ``ctx`` (:class:`RowLedger`)."""

from __future__ import annotations

import inspect
import linecache
import sys
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from playbook._internal.renamed import callers_frame
from playbook._internal.words import money
from playbook.tools.protocol import is_local

if TYPE_CHECKING:
    from playbook.runtime.calls.scope import RunScope
    from playbook.tools.protocol import Spent, ToolEngine

__all__ = ["RowLedger"]


class RowLedger:
    """What the runtime keeps of one row attempt behind its ``ctx``: where the row stands in the
    run, the occurrence of each call, the calls and cost so far, the tools and receipts it used
    (its memo keeps them), a suspension or fatal error the play may have caught, the coroutines
    it was handed.  The call pipeline, the row runner and sub-plays work on this, never on
    ``ctx`` (see :func:`ledger`)."""

    __slots__ = (
        "scope",
        "row_id",
        "position",
        "attempt",
        "seen",
        "logs",
        "signal",
        "calls",
        "local",
        "cost",
        "unpriced",
        "paid",
        "refused",
        "tools",
        "receipts",
        "made",
    )

    def __init__(self, scope: RunScope, row_id: str, position: int, attempt: int) -> None:
        self.scope = scope  # what of the run this row's calls may use
        self.row_id = row_id
        self.position = position
        self.attempt = attempt
        self.seen: dict[str, int] | None = None  # calls per tool so far: the occurrence index
        self.logs: list[str] | None = None
        # A suspension or fatal error that met this row, even if the play caught it: the row
        # still steps aside (or fails) when the play returns.
        self.signal: BaseException | None = None
        # The row's calls, paid now or before, and what they cost: its memo keeps them, so a
        # rerun that reuses the row can say what it saved; ``local``: those of free local tools.
        self.calls = self.local = 0
        self.cost = 0.0
        self.unpriced = 0  # of its calls, those with no price (not in ``cost``)
        # What this attempt paid for (not reused), and the part of it that bought answers validation
        # refused: a row that fails counts all it paid in ``cost_failed``, one that succeeds the refused part.
        self.paid = self.refused = 0.0
        self.tools: dict[str, str] = {}  # name -> fingerprint of every tool the row called
        # the addresses it looked up: a remote store reads them ahead next time
        self.receipts: list[str] = []
        self.made: list[tuple[Coroutine[Any, Any, Any], str, int]] | None = None

    def __repr__(self) -> str:
        return f"<RowLedger row={self.position} calls={self.calls} cost={money(self.cost)}>"

    def made_here(self, coro: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
        """Remember the play's line that made ``coro``, for "did you forget an await?"."""
        # the play's line that called ctx.tool (or waterfall, step, sleep)
        frame = callers_frame(sys._getframe(2))
        made = self.made
        if made is None:
            made = self.made = []
        made.append((coro, frame.f_code.co_filename, frame.f_lineno))
        return coro

    def forgotten_await(self, value: Any) -> str:
        """The advice for an awaitable found where a value should be; closes it (it will never run)."""
        found = next((m for m in self.made if m[0] is value), None) if self.made else None
        if found is not None:
            _, filename, line = found
            text = linecache.getline(filename, line).strip()
            where = f" (line {line}: {text})" if text else f" (line {line})"
        else:
            name = getattr(getattr(value, "cr_code", None), "co_name", None)
            where = f" (a {type(value).__name__} of {name!r})" if name else f" (a {type(value).__name__})"
        if inspect.iscoroutine(value):
            value.close()
        return "did you forget an await?" + where

    def never_awaited(self) -> str | None:
        """The advice for a ctx call made but never awaited (a bare ``ctx.tool(...)`` line, or one
        formatted into text): it never ran.  ``None`` when every call was awaited."""
        for coro, _, _ in self.made or ():
            if _unstarted(coro):
                return self.forgotten_await(coro)
        return None

    def close(self) -> None:
        """The row is done: close the coroutines it made but never awaited (no warning later)."""
        if self.made:
            for coro, _, _ in self.made:
                if _unstarted(coro):
                    coro.close()  # made, never started
            self.made = None

    def occurrence(self, name: str) -> int:
        """The index of this call among the row's calls named ``name`` (0, 1, ...)."""
        seen = self.seen
        if seen is None:
            seen = self.seen = {}
        n = seen[name] = seen.get(name, -1) + 1
        return n

    def used(self, tool: ToolEngine, key: str | None) -> None:
        """The row called ``tool``; ``key``: the receipt it looked up (none when fixtures answered)."""
        self.tools[tool.name] = tool.fingerprint
        if key is not None:
            self.receipts.append(key)

    def count(self, tool: ToolEngine, *, reused: bool, spent: Spent, shared: bool = False) -> None:
        """A call answered, paid now or before (``shared``: during this run, for another row); an
        answer that needed a re-ask counts its requests (what it cost is on the first)."""
        scope = self.scope
        if reused and spent.requests == 1 and scope.observer is None:
            # A receipt's answer, one request: every call of a replay comes here; no tokens, no loop.
            cost = spent.cost
            if cost is None:
                self.unpriced += 1
            self.calls += 1
            self.cost += cost or 0.0
            scope.call_finished(tool, True, cost or 0.0, shared, 0.0, cost is None, self.position)
            return
        # An unpriced answer (no price for its model) adds nothing to the sums and is counted apart.
        unpriced = spent.cost is None
        cost = spent.cost or 0.0
        if not reused:
            self.paid += cost
            self.refused += spent.refused
            if is_local(tool, cost):
                self.local += spent.requests
        if self.scope.observer is not None:
            self.scope.observer.counted(self.position, tool, reused, spent, shared)
        tokens = spent.tokens or 0.0
        if unpriced:
            self.unpriced += spent.requests
        for _ in range(spent.requests):
            self.calls += 1
            self.cost += cost
            self.scope.call_finished(tool, reused, cost, shared, tokens, unpriced, self.position)
            cost = tokens = 0.0  # both on the answer's first request

    def absorb(
        self,
        calls: int,
        cost: float,
        tools: dict[str, str],
        receipts: Sequence[str],
        paid: tuple[float, float] = (0.0, 0.0),
        local: int = 0,
        unpriced: int = 0,
    ) -> None:
        """A sub-play's calls are this row's too: its memo counts them, and drops with their tools;
        ``paid``: what a sub-play that ran paid, and the part of it validation refused; ``local``:
        its calls of free local tools; ``unpriced``: those with no price."""
        self.calls += calls
        self.local += local
        self.unpriced += unpriced
        self.cost += cost
        self.paid += paid[0]
        self.refused += paid[1]
        self.tools.update(tools)
        self.receipts.extend(receipts)


def _unstarted(coro: Coroutine[Any, Any, Any]) -> bool:
    """Made, never awaited (a coroutine closed or finished has no frame left)."""
    return (
        getattr(coro, "cr_frame", None) is not None
        and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED
    )
