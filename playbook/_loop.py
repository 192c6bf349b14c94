"""Running a coroutine to completion from sync code, inside or outside a running loop.

In a Jupyter kernel a loop is already running the cell, so ``asyncio.run`` refuses; the blocking
``map()`` then re-enters the kernel's loop with nest-asyncio2.  Outside a loop, ``asyncio.run``.

nest-asyncio2, not the original nest-asyncio: ipykernel 7 runs every shell message in one shared
context, and a cell queued behind a blocking ``map()`` (Run All sends them all at once) would be
started inside the nested loop while that context is entered, fail to enter it, and leave its
cell hanging.  nest-asyncio2 defers such callbacks until the nested run returns, so the queued
cells run afterwards, in order.

Ctrl-C.  Python's default handler raises ``KeyboardInterrupt`` wherever the main thread happens
to be, which in a loop can be half-way through writing a receipt.  While a blocking run goes on,
SIGINT instead *cancels* its task, which the run takes as "stop": calls already sent land their
receipts, the other rows are settled as skipped.  A second Ctrl-C cancels again, and the run
stops at once; a third raises ``KeyboardInterrupt`` the usual way.  The run's task then ends
cancelled, and the caller gets ``KeyboardInterrupt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["run_sync", "running_loop"]

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result, whatever loop is (or isn't) running.

    Raises ``KeyboardInterrupt`` once the coroutine has wound down after a Ctrl-C.
    """
    loop = running_loop()
    if loop is None:
        return asyncio.run(_guarded(coro))
    import nest_asyncio2

    nest_asyncio2.apply(loop)
    return loop.run_until_complete(loop.create_task(_guarded(coro)))


async def _guarded(coro: Coroutine[Any, Any, T]) -> T:
    task = asyncio.current_task()
    assert task is not None
    with _interrupt_cancels(task) as presses:
        try:
            result = await coro
        except asyncio.CancelledError:
            if presses:
                raise KeyboardInterrupt from None
            raise
        if presses:  # pressed as the run finished: the run is whole, but the interrupt still counts
            raise KeyboardInterrupt
        return result


@contextlib.contextmanager
def _interrupt_cancels(task: asyncio.Task[Any]) -> Iterator[list[int]]:
    """While inside, SIGINT cancels ``task`` (twice at most); yields the presses so far."""
    presses: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield presses  # signals reach the main thread only; there is nothing to install here
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # ignored or default-terminate: the process chose; leave it
        yield presses
        return
    loop = task.get_loop()

    def on_sigint(signum: int, frame: Any) -> None:
        presses.append(signum)
        if len(presses) > 2:
            raise KeyboardInterrupt
        loop.call_soon_threadsafe(task.cancel)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield presses
    finally:
        signal.signal(signal.SIGINT, previous)
