"""Coalescing calls to a batch tool across rows.

Rows call a batch tool one input at a time; calls that miss their receipts wait here until
``batch_size`` of them have gathered or a short linger passes, then go out as one call (one
provider slot, one request).  Each member gets its own output, or its own exception.  The batch's
own task writes every member's receipt (``land``), so a member whose row was stopped meanwhile
still keeps what was paid for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..signals import Suspend
from ..tools import Tool

__all__ = ["Batcher"]

LINGER = 0.005  # seconds a partial batch waits for more members
Land = Callable[[Any, bool], Awaitable[tuple[Any, bool]]]
Member = tuple[Any, Land, "asyncio.Future[tuple[Any, bool]]"]


class Batcher:
    """One per batch tool per run; ``track`` is told of every batch task (a stop waits for them)."""

    __slots__ = ("tool", "_pending", "_timer", "_tasks", "_track")

    def __init__(self, tool: Tool, track: Callable[[asyncio.Task[Any]], None] = lambda task: None) -> None:
        self.tool = tool
        self._pending: list[Member] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._track = track

    def __repr__(self) -> str:
        return f"<Batcher {self.tool.name!r} size={self.tool.batch_size} waiting={len(self._pending)} sending={len(self._tasks)}>"

    async def call(self, item: Any, land: Land) -> tuple[Any, bool]:
        """``(output, miss)`` for one input, sent with whatever else is waiting; ``land(answer,
        miss)`` records its receipt and gives what the row gets."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[Any, bool]] = loop.create_future()
        self._pending.append((item, land, done))
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
        batch = [member for member in batch if not member[2].done()]  # drop cancelled rows
        if batch:
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self._track(task)

    async def _send(self, batch: list[Member]) -> None:
        tool = self.tool
        items = [item for item, _, _ in batch]

        async def send() -> list[Any]:
            return await tool.invoke_batch(items)

        try:
            outs = await (tool.provider.dispatch(send) if tool.provider is not None else send())
        except BaseException as exc:  # every member shares the batch's fate
            for _, _, done in batch:
                if not done.done():
                    done.set_exception(exc)
            if not isinstance(exc, (Exception, Suspend)):  # a held batch is its members' news, not ours
                raise
            return
        landed = await asyncio.gather(*(_land(land, out) for (_, land, _), out in zip(batch, outs)), return_exceptions=True)
        for (_, _, done), result in zip(batch, landed):
            if done.done():
                continue
            if isinstance(result, BaseException):
                done.set_exception(result)  # one member's failure is that member's outcome
            else:
                done.set_result(result)


async def _land(land: Land, out: Any) -> tuple[Any, bool]:
    if isinstance(out, BaseException):
        raise out
    return await land(out, out is None)
