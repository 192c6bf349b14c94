"""Where store operations run: in place for a store on this machine, on a thread of its own for
one across the network.

SQLite answers in microseconds, so its reads and writes run on the event loop, in order.  A
Redis server can stop answering (a pause, a dead network) for as long as its socket timeout and
retries allow: run on the loop, that would freeze the progress bar, every other row and even
Ctrl-C.  So a remote store's operations run one at a time, in order, on one daemon thread (a
daemon, so a process told to stop is never kept alive by a server that does not answer), and
their results come back to the loop.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["StoreIO"]

T = TypeVar("T")
Then = Callable[[Any, BaseException | None], None]


class StoreIO:
    """Runs store work in place (``remote=False``) or on the store's own thread."""

    def __init__(self, *, remote: bool) -> None:
        self.remote = remote
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Then, asyncio.AbstractEventLoop]] = (
            queue.SimpleQueue()
        )
        self._pid = 0  # the process whose thread serves the queue (a forked child starts its own)

    def __repr__(self) -> str:
        return f"<StoreIO {'thread' if self.remote else 'in place'}>"

    def submit(self, work: Callable[[], T], then: Callable[[T | None, BaseException | None], None]) -> None:
        """Run ``work``, then ``then(result, None)`` or ``then(None, error)`` on the running loop."""
        if not self.remote:
            try:
                result = work()
            except Exception as exc:
                then(None, exc)
                return
            then(result, None)
            return
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._queue = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(self._queue,), name="playbook-store", daemon=True
            ).start()
            # What is queued at exit (a lease to give back, the last memos) is let through, briefly.
            atexit.register(self.drain, 5.0)
        self._queue.put((work, then, asyncio.get_running_loop()))

    async def run(self, work: Callable[[], T]) -> T:
        """``await`` the result of ``work`` (its error raised here)."""
        if not self.remote:
            return work()
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def then(result: T | None, exc: BaseException | None) -> None:
            if done.done():
                return  # the caller went away (cancelled)
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(result)  # type: ignore[arg-type]

        self.submit(work, then)
        return await done

    async def caught_up(self, timeout: float) -> bool:
        """``await`` the work queued so far (at most ``timeout`` seconds); False if it was not done."""
        if not self.remote:
            return True
        try:  # the queue is served in order: when this job runs, everything before it is done
            await asyncio.wait_for(self.run(lambda: None), timeout)
        except TimeoutError:
            return False
        return True

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until the work queued so far is done (at most ``timeout`` seconds); False if it was not."""
        if not self.remote or self._pid != os.getpid():
            return True
        done = threading.Event()
        self._queue.put((done.set, _nothing, _NO_LOOP))
        return done.wait(timeout)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[tuple[Callable[[], Any], Then, asyncio.AbstractEventLoop]]) -> None:
        while True:
            work, then, loop = jobs.get()
            try:
                result, error = work(), None
            except Exception as exc:
                result, error = None, exc
            if loop is _NO_LOOP:
                continue
            try:
                loop.call_soon_threadsafe(then, result, error)
            except RuntimeError:
                pass  # that loop has closed: nobody waits for the answer any more


def _nothing(result: object, exc: BaseException | None) -> None:
    pass


_NO_LOOP: Any = object()  # for work nobody on a loop waits for (drain)
