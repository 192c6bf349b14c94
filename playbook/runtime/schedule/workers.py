"""Admission: the worker tasks that take rows, waiting rows first (at their time), then fresh ones,
then rows held behind them (a call failing on its own: retry_queue), then rows stepped back
because another process was paying for one of their calls.

At most ``level.size`` workers run rows at once (:class:`~playbook.runtime.calls.level.Level`: the
``concurrency`` given, or the level the run finds).  A row that steps aside (held, sleeping)
gives its worker up; a worker is added if the pool fell short, so a waiting row never lacks one when
it comes back.  When the level grows, workers are added at once; when it comes down, workers
over it stop as their rows end.  Workers join while an execution goes (a retry adds rows), so the
pool is waited for until none is left.
"""

from __future__ import annotations

import asyncio
from array import array
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from playbook.runtime.calls.level import Level
from playbook.runtime.schedule.retry_queue import RetryQueue

__all__ = ["RowQueue", "Workers"]


class RowQueue:
    """Rows not started yet, in order, kept as the sequences they were given (a ``range`` of a
    million rows is one object, not a million ints)."""

    __slots__ = ("_parts", "_next", "_size")

    def __init__(self) -> None:
        self._parts: deque[Sequence[int]] = deque()
        self._next = 0  # the place of the next row in the first part
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"<RowQueue {self._size} rows>"

    def extend(self, positions: Iterable[int]) -> None:
        part = positions if isinstance(positions, (range, list, array)) else list(positions)
        if part:
            self._parts.append(part)
            self._size += len(part)

    def popleft(self) -> int:
        part = self._parts[0]
        pos = part[self._next]
        self._next += 1
        self._size -= 1
        if self._next == len(part):
            self._parts.popleft()
            self._next = 0
        return pos

    def rotate(self, n: int) -> None:
        """As ``deque.rotate(n)``: the last ``n`` rows come first (rare: the rows are made a list)."""
        rows = deque(self.drain())
        rows.rotate(n)
        self._parts.append(list(rows))
        self._size = len(rows)

    def drain(self) -> list[int]:
        rows = [pos for part in self._parts for pos in part][self._next :]
        self.clear()
        return rows

    def clear(self) -> None:
        self._parts.clear()
        self._next = self._size = 0


class Workers:
    """The pool of one execution: fresh rows in ``pending``, waiting rows in ``queue``."""

    __slots__ = ("tasks", "pending", "queue", "level", "_run", "_resume", "_revisit", "_running")

    def __init__(
        self,
        level: Level,
        queue: RetryQueue,
        run: Callable[[int], Awaitable[bool]],
        resume: Callable[[int], None],
        revisit: Callable[[list[int]], Sequence[int]] = lambda rows: rows,
    ) -> None:
        self.tasks: list[asyncio.Task[None]] = []
        self.pending = RowQueue()
        self.queue = queue
        self.level = level
        self._run = run  # runs one attempt of a row: True if it stepped aside
        self._resume = resume  # a waiting row is taken again
        self._revisit = revisit  # rows stepped back: settles those another process finished, returns the rest
        self._running = 0  # workers in their loop (live() counts the tasks: too slow to ask at every row)

    def __repr__(self) -> str:
        return f"<Workers {self.live()}/{self.level.size} pending={len(self.pending)} {self.queue!r}>"

    def live(self) -> int:
        return sum(not t.done() for t in self.tasks)

    def admit(self, positions: Iterable[int]) -> None:
        """Queue rows and start the workers they need, up to the level."""
        self.pending.extend(positions)
        self._fill()

    def _fill(self) -> None:
        self._spawn(max(0, min(self.level.size - self.live(), len(self.pending))))

    def _stepped_aside(self) -> None:
        """A row left its worker for the waiting queue: that worker takes another row, and the
        waiting one must not lack a worker when its time comes."""
        if self.live() < self.level.size:
            self._spawn(1)

    def _spawn(self, count: int) -> None:
        for _ in range(count):
            self.tasks.append(asyncio.ensure_future(self._worker()))

    async def _worker(self) -> None:
        self._running += 1
        try:
            await self._take_rows()
        finally:
            self._running -= 1

    async def _take_rows(self) -> None:
        pending, queue, run, level = self.pending, self.queue, self._run, self.level
        found = not level.fixed  # a fixed level needs no word of a row's start or end
        loop = asyncio.get_running_loop()
        while True:
            if self._running > level.size:
                return  # the level came down: this worker's place goes
            pos = queue.due(loop.time(), fresh=bool(pending)) if queue else None
            if pos is not None:  # a waiting row comes back ahead of fresh rows
                self._resume(pos)
            elif pending:
                pos = pending.popleft()
            elif back := queue.stepped_back():
                # Another process ran them meanwhile, most likely: its memos settle them, all at
                # once; the rest run again, as fresh rows, from its receipts or its leases.
                pending.extend(self._revisit(back))
                continue
            elif queue:
                await queue.nap(queue.next_at())  # type: ignore[arg-type]  # not empty: it has a next
            else:
                return
            if pos is None:
                continue
            if found:
                level.started()
                try:
                    aside = await run(pos)
                finally:
                    level.ended()
            else:
                aside = await run(pos)
            if aside:
                self._stepped_aside()
            if found and level.adjust(bool(pending)):
                self._fill()

    def cancel(self, keep: asyncio.Task[Any] | None, landing: set[asyncio.Task[Any]]) -> None:
        """Stop taking rows; cancel the rows in flight but ``keep`` and those ``landing`` a receipt."""
        self.pending.clear()
        self.queue.clear()
        for task in self.tasks:
            if task is not keep and task not in landing:
                task.cancel()

    def failure(self) -> BaseException | None:
        """An error that escaped a worker (a bug, not a row's failure: those are outcomes)."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None
