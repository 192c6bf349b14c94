"""Waking a call that waits on a limiter, and telling a provider's listeners its events, whichever
thread's loop they are on.

A provider is defined once per process, at module level, and its limits are the process's: every
thread that runs a blocking ``map()`` shares them, each on an event loop of its own.  So the calls
waiting for a slot may sit on several loops at once.  An asyncio future belongs to its loop: one
completed from another thread neither wakes that loop nor is safe to touch there.  A limiter
decides under its lock who goes next and then wakes each waiter through its own loop (at once
when that is the loop running here).  A run listens to a provider's events from its loop, and
hears them there (:class:`Listeners`), whichever thread's call set the hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["Listeners", "here", "wake", "wake_all"]

T = TypeVar("T")


def here() -> asyncio.AbstractEventLoop | None:
    """The loop running this code, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def wake(waiter: asyncio.Future[T], value: T, undo: Callable[[], None] | None = None) -> None:
    """Complete ``waiter`` with ``value`` on its own loop.  ``undo`` gives back what was handed to
    it (a slot) when it turns out nobody waits any more: cancelled meanwhile, or its loop closed."""
    _wake(waiter, value, undo, here())


def wake_all(waiters: Iterable[asyncio.Future[T]], value: T, undo: Callable[[], None] | None = None) -> None:
    current = here()
    for waiter in waiters:
        _wake(waiter, value, undo, current)


def _wake(
    waiter: asyncio.Future[T],
    value: T,
    undo: Callable[[], None] | None,
    current: asyncio.AbstractEventLoop | None,
) -> None:
    loop = waiter.get_loop()
    if loop is current:
        _complete(waiter, value, undo)
        return
    try:
        loop.call_soon_threadsafe(_complete, waiter, value, undo)
    except RuntimeError:  # its loop is closed: the call that waited is gone with it
        if undo is not None:
            undo()


def _complete(waiter: asyncio.Future[T], value: T, undo: Callable[[], None] | None) -> None:
    if not waiter.done():
        waiter.set_result(value)
    elif undo is not None:
        undo()


Listener = Callable[[Any], None]


class Listeners:
    """Who hears a provider's events: each listener on the loop it subscribed from (one that
    subscribed outside a loop hears them at once, on the thread that tells them)."""

    __slots__ = ("_entries", "_lock")

    def __init__(self) -> None:
        # Replaced, never changed in place: telling reads it without the lock.
        self._entries: tuple[tuple[Listener, asyncio.AbstractEventLoop | None], ...] = ()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Listeners {len(self._entries)}>"

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, listener: Listener, *, anywhere: bool = False) -> Callable[[], None]:
        """Subscribe ``listener`` here (``anywhere``: it hears each event at once, on the thread
        that tells it); returns the unsubscribe function."""
        entry = (listener, None if anywhere else here())
        with self._lock:
            self._entries = (*self._entries, entry)

        def remove() -> None:
            with self._lock:
                self._entries = tuple(other for other in self._entries if other is not entry)

        return remove

    def loops(self) -> set[asyncio.AbstractEventLoop]:
        """The loops listeners subscribed from."""
        return {loop for _, loop in self._entries if loop is not None}

    def tell(self, event: Any) -> None:
        current = here()
        for listener, loop in self._entries:
            if loop is None or loop is current:
                listener(event)
            else:
                with contextlib.suppress(RuntimeError):  # its loop is closed: its run is over
                    loop.call_soon_threadsafe(self._deliver, listener, loop, event)

    def _deliver(self, listener: Listener, loop: asyncio.AbstractEventLoop, event: Any) -> None:
        """On the listener's loop: tell it, unless it stopped listening meanwhile."""
        if any(other is listener and at is loop for other, at in self._entries):
            listener(event)
