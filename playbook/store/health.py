"""Whether the store takes writes, and how long a run waits for it when it does not.

A store that refuses a receipt (a full disk, a Redis server at its ``maxmemory``, a filesystem
remounted read-only) may refuse it for a moment only: a log copied back into the database, a
burst of other writers, a server freeing memory.  So a receipt that cannot be written is not a
failed row at once.  Its answer is paid for and kept in memory (the receipts the store owes: owed.py),
and written again, backing off from 50 ms to a second, for up to ``grace_s`` seconds (5 by
default, ``ReceiptStore(write_grace=...)``).  Meanwhile a call about to be paid for waits for the
store too, before it is sent: paying for what cannot be recorded is what the grace is there to
avoid.

A store still refusing after the grace is *failing*.  The receipts that waited fail their rows
(paid, not recorded: their answers stay in memory and are written at the end of the run, or
counted in ``receipts_lost``), and a call that would pay is not sent: its row parks with reason
``store``, for a rerun or ``run.retry()``.  Rows answered by receipts go on.  A row about to pay
first tries once more to write the answers kept (a probe that costs nothing, shared by the rows
that ask at the same time): when the store takes them, rows pay again.  A row waits for a probe
at most the grace left, and past the grace :data:`PROBE_WAIT_S`: a probe of a store that answers
slowly when down (a Redis Cluster whose client retries for its failover's length) goes on for
the rows after, while those that asked park, so a run over a store that stays down ends in
seconds, not a probe's length a row.

While the store takes writes, a call checks one attribute (:attr:`WriteHealth.reason`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine

from playbook._internal.flow import Parked

__all__ = ["GRACE_S", "PROBE_WAIT_S", "WriteHealth"]

GRACE_S = 5.0  # how long a store may refuse writes before the rows that would pay park
PROBE_WAIT_S = 1.0  # past the grace, how long a row waits for a probe under way before it parks
_FIRST_RETRY_S = 0.05
_LAST_RETRY_S = 1.0


class WriteHealth:
    """Whether the store takes writes (``reason`` is None) and, when it does not, since when and why.

    ``rewrite`` writes the answers kept in memory again, returning True once the store took them
    (it then calls :meth:`mended`).  Times are the running loop's clock, so virtual time drives it.
    """

    __slots__ = ("grace_s", "reason", "_since", "_rewrite", "_trying")

    def __init__(
        self, rewrite: Callable[[], Coroutine[object, None, bool]], grace_s: float = GRACE_S
    ) -> None:
        self.grace_s = grace_s
        self.reason: str | None = None  # why the store refuses writes; None while it takes them
        self._since: tuple[asyncio.AbstractEventLoop, float] | None = None
        self._rewrite = rewrite
        self._trying: asyncio.Task[bool] | None = None

    def __repr__(self) -> str:
        if self.reason is None:
            return f"<WriteHealth takes writes, grace {self.grace_s:g}s>"
        return f"<WriteHealth refusing writes ({self.reason}), grace {self.grace_s:g}s>"

    def failed(self, reason: str) -> None:
        """A write was refused (on the loop that asked for it): the grace starts, if it has not."""
        self.reason = reason
        if self._since is None:
            loop = asyncio.get_running_loop()
            self._since = (loop, loop.time())

    def mended(self) -> None:
        """A write went through: the store takes writes."""
        self.reason = None
        self._since = None

    def _left(self) -> float:
        """Seconds of grace left."""
        loop = asyncio.get_running_loop()
        since = self._since
        if since is None or since[0] is not loop:  # refused under an earlier run's loop: that grace is over
            since = self._since = (loop, loop.time() - self.grace_s)
        return since[1] + self.grace_s - loop.time()

    async def retry(self, written: Callable[[], bool]) -> bool:
        """Write what is kept again, backing off, until ``written()`` or the grace is over; returns
        ``written()``."""
        delay = _FIRST_RETRY_S
        while not written():
            left = self._left()
            if left <= 0:
                return False
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, _LAST_RETRY_S)
            await self._try(max(self._left(), PROBE_WAIT_S))
        return True

    async def writable(self, location: str) -> None:
        """Returns when the store at ``location`` takes writes (at once while it does, or once it
        takes them again within the grace); past the grace, the row parks (:class:`Parked`)."""
        if self.reason is None or await self.retry(lambda: self.reason is None):
            return
        await self._try(PROBE_WAIT_S)
        if self.reason is not None:
            raise Parked(
                "store",
                f"store: the receipt store at {location} refuses writes ({self.reason}), so nothing more is "
                "paid for: rerun, or run.retry(), once it takes them",
            )

    async def _try(self, patience: float) -> None:
        """One write of the answers kept; those who ask meanwhile share it, each waiting for it
        ``patience`` seconds at most (it goes on for those who ask next)."""
        loop = asyncio.get_running_loop()
        trying = self._trying
        if trying is None or trying.done() or trying.get_loop() is not loop:
            trying = self._trying = loop.create_task(self._rewrite())
        done, _ = await asyncio.wait({trying}, timeout=patience)
        if done:
            trying.result()  # what it raised, raised here as when it was awaited whole
