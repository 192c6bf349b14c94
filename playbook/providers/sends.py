"""How many calls a provider was sent, and the most that went within any one second (:class:`Sends`).

A provider counts requests per window of time; a picture that says "peak 41/s" beside "limit
40/s" reads as a breach.  So the peak is counted the way a provider counts and the pace lets calls
go: calls *sent* (when the permit was spent, not when the answer came back), on the loop's clock
(the one the limiter paces on), within any sliding window of :attr:`Sends.WINDOW` seconds.

Like the limiter's primitives it reads no clock: :meth:`Sends.note` takes ``now``.
"""

from __future__ import annotations

from collections import deque

__all__ = ["PerMinute", "Sends"]


class Sends:
    """``count``: calls sent so far; :attr:`busiest`: the most sent within one ``WINDOW`` by any
    of the calls sent over the last ``RECENT`` seconds before the latest (a sliding maximum)."""

    __slots__ = ("count", "_window", "_peaks")

    WINDOW = 1.0  # seconds: a rate limit's unit (calls per second)
    # A view samples a few times a second; a peak is kept this long after the latest call, so a
    # late sample still sees it, and one from an earlier run has gone by the next run's calls.
    RECENT = 2.0

    def __init__(self) -> None:
        self.count = 0
        self._window: deque[float] = deque()  # when the calls of the last WINDOW went
        # (time, calls in the window ending then), counts decreasing
        self._peaks: deque[tuple[float, int]] = deque()

    def __repr__(self) -> str:
        return f"<Sends {self.count} busiest={self.busiest}/{self.WINDOW:g}s>"

    def note(self, now: float) -> None:
        """A call went at ``now`` (loop clock)."""
        self.count += 1
        window = self._window
        window.append(now)
        # (now - WINDOW, now]: a call exactly one window earlier is in the window before
        while window[0] <= now - self.WINDOW:
            window.popleft()
        peaks = self._peaks
        while peaks and peaks[-1][1] <= len(window):
            peaks.pop()
        peaks.append((now, len(window)))
        while peaks[0][0] < now - self.RECENT:
            peaks.popleft()

    @property
    def busiest(self) -> int:
        """The most calls any window of ``WINDOW`` seconds held, among the recent ones (0: none sent)."""
        return self._peaks[0][1] if self._peaks else 0


class PerMinute:
    """Calls sent over the last minute, counted in whole seconds (``now``: a display's clock,
    ``time.monotonic()``, as views read it)."""

    __slots__ = ("_seconds",)

    MINUTE = 60

    def __init__(self) -> None:
        self._seconds: deque[list[int]] = deque()  # [second, calls sent in it], the last MINUTE of them

    def note(self, now: float) -> None:
        second = int(now)
        seconds = self._seconds
        if seconds and seconds[-1][0] == second:
            seconds[-1][1] += 1
            return
        seconds.append([second, 1])
        while seconds[0][0] <= second - self.MINUTE:
            seconds.popleft()

    def count(self, now: float) -> int:
        """Calls sent within the minute before ``now``."""
        start = int(now) - self.MINUTE
        return sum(n for second, n in list(self._seconds) if second > start)
