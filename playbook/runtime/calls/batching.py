"""Coalescing calls to a batch tool across rows: the batch step of the call pipeline.

Rows call a batch tool one input at a time; calls that miss their receipts wait here until
``batch_size`` of them have gathered or a short linger passes, then go out as one call (one
provider slot, one request).  Each member gets its own output, or its own exception.  The batch's
own task writes every member's receipt (``land``), so a member whose row was stopped meanwhile
still keeps what was paid for.

A batch serves many rows, each with its own wait budget.  The batch waits on its provider as long
as its most patient member may; when the provider holds it, each member steps aside against its
own budget, or parks when the hold is past it, exactly as a call of its own would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from playbook._internal.flow import OnHold, Suspend, WaitBudget
from playbook._internal.words import time_of_day
from playbook.errors import ProviderExhausted
from playbook.providers.provider import Ticket
from playbook.runtime.state.upstream import dispatch
from playbook.tools.protocol import ToolEngine

__all__ = ["Batcher", "Batches"]

LINGER = 0.005  # seconds a partial batch waits for more members
Land = Callable[[Any, bool], Awaitable[tuple[Any, bool]]]


class Member(NamedTuple):
    item: Any
    land: Land
    done: asyncio.Future[tuple[Any, bool]]
    budget: WaitBudget | None  # the member row's wait on the provider; None: no provider


class Batches:
    """The batchers of one run, and the batches it sent: a stop waits for them to land their
    members' receipts."""

    __slots__ = ("_batchers", "tasks")

    def __init__(self) -> None:
        self._batchers: dict[str, Batcher] = {}
        self.tasks: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"<Batches {sorted(self._batchers)} sending={len(self.tasks)}>"

    def batcher(self, tool: ToolEngine) -> Batcher:
        found = self._batchers.get(tool.name)
        if found is None:
            found = self._batchers[tool.name] = Batcher(tool, self.track)
        return found

    def track(self, task: asyncio.Task[Any]) -> None:
        """A task sending or submitting calls: a stop waits for it."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class Batcher:
    """One per batch tool per run; ``track`` is told of every batch task (a stop waits for them)."""

    __slots__ = ("tool", "_pending", "_timer", "_tasks", "_track")

    def __init__(
        self, tool: ToolEngine, track: Callable[[asyncio.Task[Any]], None] = lambda task: None
    ) -> None:
        self.tool = tool
        self._pending: list[Member] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._track = track

    def __repr__(self) -> str:
        return f"<Batcher {self.tool.name!r} size={self.tool.batch_size} waiting={len(self._pending)} sending={len(self._tasks)}>"

    async def call(self, item: Any, land: Land, budget: WaitBudget | None = None) -> tuple[Any, bool]:
        """``(output, miss)`` for one input, sent with whatever else is waiting; ``land(answer,
        miss)`` records its receipt and gives what the row gets; ``budget`` is the row's wait."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[Any, bool]] = loop.create_future()
        self._pending.append(Member(item, land, done, budget))
        if len(self._pending) >= (self.tool.batch_size or 1):
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(LINGER, self._flush)
        return await done

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        batch = [member for member in batch if not member.done.done()]  # drop cancelled rows
        if batch:
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self._track(task)

    async def _send(self, batch: list[Member]) -> None:
        tool = self.tool
        items = [member.item for member in batch]

        async def send() -> list[Any]:
            return await tool.invoke_batch(items)

        try:
            if tool.provider is None:
                outs = await send()
            else:
                # Waits on the provider as long as the most patient member may; each member then
                # answers for its own budget (below).  The batch cannot suspend: it serves many.
                patience = max(
                    (m.budget.left for m in batch if m.budget is not None), default=tool.provider.max_wait
                )
                outs = await dispatch(
                    tool.provider, send, Ticket(tool.name, WaitBudget(patience), suspend=False)
                )
        except BaseException as exc:  # every member shares the batch's fate
            for member in batch:
                if not member.done.done():
                    member.done.set_exception(_for_member(exc, member, tool))
            if not isinstance(exc, (Exception, Suspend)):  # a held batch is its members' news, not ours
                raise
            return
        landed = await asyncio.gather(
            *(_land(m.land, out) for m, out in zip(batch, outs)), return_exceptions=True
        )
        for member, result in zip(batch, landed):
            if member.done.done():
                continue
            if isinstance(result, BaseException):
                member.done.set_exception(result)  # one member's failure is that member's outcome
            else:
                member.done.set_result(result)


def _for_member(exc: BaseException, member: Member, tool: ToolEngine) -> BaseException:
    """The batch's hold as this member's: held against its own row's wait budget, or, past it,
    the row parks (a waterfall tries its next leg) as a call of its own would."""
    if not isinstance(exc, OnHold) or member.budget is None:
        return exc
    budget = member.budget
    wait = exc.until - asyncio.get_running_loop().time()
    if wait > budget.left + 1e-9:
        return ProviderExhausted(
            f"tool {tool.name!r}: provider {exc.provider.name!r} holds calls until {time_of_day(exc.wall)} ({wait:.0f}s from now), "
            f"past this row's wait budget ({max(budget.left, 0):.0f}s left of max_wait)",
            tool=tool.name,
            provider=exc.provider.name,
            status=exc.status,
            retry_at=exc.wall,
        )
    return OnHold(exc.provider, exc.until, exc.wall, exc.status, budget)


async def _land(land: Land, out: Any) -> tuple[Any, bool]:
    if isinstance(out, BaseException):
        raise out
    return await land(out, out is None)
