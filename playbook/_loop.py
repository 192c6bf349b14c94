"""Running a coroutine to completion from sync code, inside or outside a running loop.

In a Jupyter kernel a loop is already running the cell, so ``asyncio.run`` refuses; the blocking
``map()`` then re-enters the kernel's loop with nest-asyncio2.  Outside a loop, ``asyncio.run``.

nest-asyncio2, not the original nest-asyncio: ipykernel 7 runs every shell message in one shared
context, and a cell queued behind a blocking ``map()`` (Run All sends them all at once) would be
started inside the nested loop while that context is entered, fail to enter it, and leave its
cell hanging.  nest-asyncio2 defers such callbacks until the nested run returns, so the queued
cells run afterwards, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_sync", "running_loop"]

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result, whatever loop is (or isn't) running."""
    loop = running_loop()
    if loop is None:
        return asyncio.run(coro)
    import nest_asyncio2

    nest_asyncio2.apply(loop)
    task = loop.create_task(coro)
    try:
        return loop.run_until_complete(task)
    except KeyboardInterrupt:
        # Ctrl-C lands wherever the loop was; the task is still pending.  Cancel it and let it
        # unwind (settle its rows, flush its memos) before the interrupt goes on, as asyncio.run does.
        task.cancel()
        try:
            loop.run_until_complete(task)
        except BaseException:  # noqa: BLE001 - the interrupt below is the news
            pass
        raise
