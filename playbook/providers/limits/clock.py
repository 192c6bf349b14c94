"""Another machine's clock, read from this loop's: what a shared limiter needs to turn the slots
Redis hands out into times at which this process sends.

Each script answer carries Redis's time, read while the script ran; this process reads the
answer later, by the time it took to come back and for the loop to get to it.  That delay is
nothing on a quiet machine and tens of milliseconds on a busy one, and it differs from one answer
to the next.  Taking ``redis_now - loop.time()`` from each answer as the clocks' difference would
make every slot late by its own answer's delay: two processes' calls, spaced exactly by Redis,
then reach a strict provider out of step, and it refuses the early one (a burst of 1 leaves 2%
of an interval to spare).  The difference with the least delay is the truest, so the largest of
the recent ones is kept; older ones are forgotten, so a clock that drifts or steps is followed
within ``SPAN`` seconds.
"""

from __future__ import annotations

from collections import deque

__all__ = ["RemoteClock"]


class RemoteClock:
    """``offset``: the other clock minus this loop's, from the answer with the least delay over
    the last :attr:`SPAN` seconds (a sliding maximum, in O(1) a sample)."""

    __slots__ = ("offset", "_best")

    SPAN = 10.0  # seconds of samples that count

    def __init__(self) -> None:
        self.offset = 0.0
        self._best: deque[tuple[float, float]] = deque()  # (loop time, offset), offsets decreasing

    def __repr__(self) -> str:
        return f"<RemoteClock offset={self.offset:.6f} samples={len(self._best)}>"

    def read(self, remote_now: float, here_now: float) -> float:
        """An answer read at ``here_now`` (loop clock) said the other clock was ``remote_now``;
        returns the offset to use from now on."""
        sample = remote_now - here_now
        best = self._best
        while best and best[-1][1] <= sample:  # a sample with less delay makes older, worse ones useless
            best.pop()
        best.append((here_now, sample))
        while best[0][0] < here_now - self.SPAN:
            best.popleft()
        self.offset = best[0][1]
        return self.offset

    def here(self, remote_t: float) -> float:
        """A time on the other clock, as this loop's clock reads it."""
        return remote_t - self.offset
