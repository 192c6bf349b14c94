"""Per-key admission primitives of the demo provider: a token bucket, fixed windows and a
quota window.

Both take `now` from the caller (a `time.monotonic` reading) instead of reading a clock,
so they are exact and trivially testable; neither is thread-safe on its own (the demo
state serialises access under its lock).
"""

from __future__ import annotations

import math

__all__ = ["FixedWindows", "QuotaWindows", "RateLimiter"]


class RateLimiter:
    """Token bucket per key: `burst` tokens, refilled at `rps` per second."""

    __slots__ = ("_buckets", "burst", "rps")

    def __init__(self, rps: float | None, burst: int) -> None:
        self.rps = rps
        self.burst = burst
        # key -> [tokens, stamp]; a list so the hot path mutates instead of allocating.
        self._buckets: dict[str, list[float]] = {}

    def acquire(self, key: str, now: float) -> float:
        """Take one token: 0.0 when admitted, else the seconds until a token is due."""
        rps = self.rps
        if rps is None:
            return 0.0
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = [float(self.burst), now]
        tokens = min(float(self.burst), bucket[0] + (now - bucket[1]) * rps)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return 0.0
        bucket[0] = tokens
        return (1.0 - tokens) / rps

    def clear(self) -> None:
        self._buckets.clear()

    def __repr__(self) -> str:
        rate = "unlimited" if self.rps is None else f"{self.rps:g}/s"
        return f"<RateLimiter {rate} burst={self.burst} keys={len(self._buckets)}>"


class FixedWindows:
    """At most `limit` requests per key in each window of `period` seconds.

    Windows are aligned to multiples of `period` on the clock, as a provider counting per
    "calendar" second or minute does: a burst of `limit` at the end of one window and another
    at the start of the next all pass, which a token bucket would never allow.
    """

    __slots__ = ("_windows", "limit", "period")

    def __init__(self, limit: int | None, period: float) -> None:
        self.limit = limit
        self.period = period
        self._windows: dict[str, list[float]] = {}  # key -> [window index, used]

    def acquire(self, key: str, now: float) -> float:
        """Count one request: 0.0 when admitted, else the seconds until the window ends."""
        limit = self.limit
        if limit is None:
            return 0.0
        index = math.floor(now / self.period)
        window = self._windows.get(key)
        if window is None or window[0] != index:
            window = self._windows[key] = [index, 0.0]
        if window[1] >= limit:
            # Never 0.0, which means "admitted", even where float rounding meets the boundary.
            return max((index + 1) * self.period - now, 1e-9)
        window[1] += 1.0
        return 0.0

    def clear(self) -> None:
        self._windows.clear()

    def __repr__(self) -> str:
        limit = "unlimited" if self.limit is None else str(self.limit)
        return f"<FixedWindows {limit} per {self.period:g}s keys={len(self._windows)}>"


class QuotaWindows:
    """At most `limit` requests per key per window of `period` seconds.

    A key's window opens at its first counted request (a rolling "day"), which keeps the
    reported wait honest: it is the time left in that key's window.
    """

    __slots__ = ("_windows", "limit", "period")

    def __init__(self, limit: int | None, period: float) -> None:
        self.limit = limit
        self.period = period
        self._windows: dict[str, list[float]] = {}  # key -> [opened_at, used]

    def acquire(self, key: str, now: float) -> float:
        """Count one request: 0.0 when within quota, else the seconds until the window resets."""
        limit = self.limit
        if limit is None:
            return 0.0
        window = self._windows.get(key)
        if window is None or now - window[0] >= self.period:
            window = self._windows[key] = [now, 0.0]
        if window[1] >= limit:
            return window[0] + self.period - now
        window[1] += 1.0
        return 0.0

    def remaining(self, key: str, now: float) -> int | None:
        """Requests the key may still make in its current window; None without a quota."""
        limit = self.limit
        if limit is None:
            return None
        window = self._windows.get(key)
        if window is None or now - window[0] >= self.period:
            return limit
        return max(0, limit - int(window[1]))

    def clear(self) -> None:
        self._windows.clear()

    def __repr__(self) -> str:
        limit = "unlimited" if self.limit is None else str(self.limit)
        used = sum(int(w[1]) for w in self._windows.values())
        return f"<QuotaWindows limit={limit} per {self.period:g}s keys={len(self._windows)} used={used}>"
