"""Running a coroutine to completion from sync code, inside or outside a running loop.

In a Jupyter kernel a loop is already running the cell, so ``asyncio.run`` refuses; the blocking
``map()`` then re-enters the kernel's loop with nest-asyncio2.

nest-asyncio2, not the original nest-asyncio: ipykernel 7 runs every shell message in one shared
context, and a cell queued behind a blocking ``map()`` (Run All sends them all at once) would be
started inside the nested loop while that context is entered, fail to enter it, and leave its
cell hanging.  nest-asyncio2 defers such callbacks until the nested run returns, so the queued
cells run afterwards, in order.

nest-asyncio2 can re-enter asyncio's own loops only.  Under another running loop (uvloop, as
uvicorn and FastAPI run by default) a blocking call cannot wait without stopping that loop, so it
is refused before it starts anything, naming the ``await`` form to use instead.

Outside a loop (scripts, schedulers, a server's worker threads), each thread keeps one loop of its
own across calls, rather than a fresh ``asyncio.run`` per call: an async client made at module
level (``AsyncOpenAI()``, ``httpx.AsyncClient()``) binds its connections to the loop of its first
request, and a second ``map()`` on a new loop would find them on a closed one ("Event loop is
closed").  The loop is closed when its thread's ``Thread`` object goes away, or at exit.

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
import os
import signal
import threading
import weakref
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from playbook.errors import PlayDefinitionError

__all__ = ["check_blocking", "finished", "run_sync", "running_loop", "schedule"]

T = TypeVar("T")

_MAP_INSTEAD = "await df.play.amap(...) (or await df.play.arun(...) for the Run)"


class _ThreadLoop(threading.local):
    """This thread's own loop, and the process that made it."""

    loop: asyncio.AbstractEventLoop | None = None
    pid = 0


_here = _ThreadLoop()


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def check_blocking(what: str, instead: str) -> None:
    """Raise ``PlayDefinitionError`` if a blocking ``what`` cannot run here: under a running loop
    that nest-asyncio2 cannot re-enter.  Call it before making the coroutine to run."""
    loop = running_loop()
    if loop is not None and not _reentrant(loop):
        raise PlayDefinitionError(
            f"{what} cannot block inside this running event loop ({type(loop).__module__}.{type(loop).__qualname__}): "
            "only asyncio's own loop can be re-entered (as in Jupyter), and waiting here would stop this one. "
            f"In async code (a FastAPI or uvicorn endpoint, an async script), use {instead}"
        )


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result, whatever loop is (or isn't) running.

    Raises ``KeyboardInterrupt`` once the coroutine has wound down after a Ctrl-C, and
    ``PlayDefinitionError`` under a loop it cannot re-enter (callers other than ``map()`` call
    :func:`check_blocking` first, with words of their own).
    """
    loop = running_loop()
    if loop is None:
        return _run_here(_thread_loop(), coro)
    try:
        check_blocking("df.play.map() (or df.play.run())", _MAP_INSTEAD)
    except PlayDefinitionError:
        coro.close()  # never started: no "coroutine was never awaited" to follow the error
        raise
    import nest_asyncio2

    nest_asyncio2.apply(loop)
    return loop.run_until_complete(loop.create_task(_guarded(coro)))


def _reentrant(loop: asyncio.AbstractEventLoop) -> bool:
    return isinstance(loop, asyncio.BaseEventLoop) or hasattr(loop, "_nest_patched")


def _thread_loop() -> asyncio.AbstractEventLoop:
    loop = _here.loop
    # A forked child inherits the parent's loop, whose selector it shares: it makes its own.
    if loop is None or loop.is_closed() or _here.pid != os.getpid():
        loop = asyncio.new_event_loop()
        _here.loop, _here.pid = loop, os.getpid()
        weakref.finalize(threading.current_thread(), _close, loop, os.getpid())
    return loop


def _run_here(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    task = loop.create_task(_guarded(coro))
    try:
        return loop.run_until_complete(task)
    finally:
        if not task.done():
            # A third Ctrl-C broke out of the loop mid-run: let the run wind down now, as
            # asyncio.run would, rather than resume inside the next call on this loop.
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)


def _close(loop: asyncio.AbstractEventLoop, pid: int) -> None:
    """Close a thread's loop once its thread is gone (or at exit), as ``asyncio.run`` would."""
    if os.getpid() != pid or loop.is_closed() or loop.is_running():
        return  # a forked child's copy shares the parent's selector; a daemon thread's still runs
    try:
        if running_loop() is None:  # a loop cannot be run from inside another
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


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


def schedule(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """Run ``coro`` as a task of the running loop (a background run); a clear error without one."""
    loop = running_loop()
    if loop is None:
        coro.close()
        raise PlayDefinitionError(
            "background=True needs a running event loop (a Jupyter kernel or async code); "
            "in a script, run it without background=True (map() blocks until it is done)"
        )
    return loop.create_task(coro)


async def finished(task: asyncio.Task[Any]) -> None:
    """Wait for ``task`` to end, without raising its error here (the caller reads it)."""
    await asyncio.wait([task])
