"""Per-key admission primitives of the demo provider: a token bucket, fixed windows, a
quota window, and the chat endpoint's per-minute limits with OpenAI's headers.

All take `now` from the caller (a `time.monotonic` reading) instead of reading a clock,
so they are exact and trivially testable; none is thread-safe on its own (the demo
state serialises access under its lock).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "ChatLimits",
    "ChatVerdict",
    "FixedWindows",
    "MinuteBuckets",
    "QuotaWindows",
    "RateLimiter",
    "format_duration",
]

# Below this a bucket's shortfall is float rounding: a client that waited the advertised
# milliseconds to the letter must be admitted.
_SLACK = 1e-6


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


class MinuteBuckets:
    """A per-minute limit enforced as OpenAI does: a bucket per key refilling continuously at
    `limit`/60 per second that holds `seconds` worth of it, not a whole minute's burst.

    A request weighing more than the bucket holds still fits once the bucket has refilled to
    its weight: the capacity for a request is ``max(limit / 60 * seconds, weight)``.
    """

    __slots__ = ("_buckets", "limit", "seconds")

    def __init__(self, limit: int | None, seconds: float) -> None:
        self.limit = limit
        self.seconds = seconds
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (level, stamp)

    @property
    def rate(self) -> float:
        """Refill per second."""
        return (self.limit or 0) / 60.0

    @property
    def capacity(self) -> float:
        return self.rate * self.seconds

    def level(self, key: str, now: float, weight: float = 0.0) -> float:
        """What the key's bucket holds for a request of `weight` now."""
        if key not in self._buckets:
            return max(self.capacity, weight)
        level, stamp = self._buckets[key]
        return min(max(self.capacity, weight), level + (now - stamp) * self.rate)

    def wait(self, key: str, now: float, weight: float) -> float:
        """Seconds until `weight` fits (0.0 when it fits now)."""
        short = weight - self.level(key, now, weight)
        return 0.0 if short <= _SLACK else short / self.rate

    def take(self, key: str, now: float, weight: float) -> None:
        self._buckets[key] = (max(0.0, self.level(key, now, weight) - weight), now)

    def give(self, key: str, now: float, amount: float) -> None:
        """Give back `amount` taken too much (a reservation settled below what it held)."""
        if key in self._buckets:
            self._buckets[key] = (min(self.capacity, self.level(key, now) + amount), now)

    def reset_in(self, key: str, now: float) -> float:
        """Seconds until the key's bucket is full again."""
        return (self.capacity - min(self.capacity, self.level(key, now))) / self.rate

    def headers(self, key: str, now: float, unit: str) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers for this limit; `unit` is "requests" or "tokens"."""
        level = min(self.capacity, self.level(key, now))
        return {
            f"x-ratelimit-limit-{unit}": str(self.limit),
            f"x-ratelimit-remaining-{unit}": str(max(0, math.floor(level + _SLACK))),
            f"x-ratelimit-reset-{unit}": format_duration((self.capacity - level) / self.rate),
        }

    def clear(self) -> None:
        self._buckets.clear()

    def __repr__(self) -> str:
        limit = "unlimited" if self.limit is None else f"{self.limit}/min"
        return f"<MinuteBuckets {limit} holding {self.seconds:g}s keys={len(self._buckets)}>"


class ChatVerdict:
    """A chat request's fate under the per-minute limits: `kind` is None when admitted, else
    "requests" or "tokens" with OpenAI's 429 `body` and `wait` seconds."""

    __slots__ = ("body", "headers", "kind", "wait")

    def __init__(
        self,
        headers: dict[str, str],
        kind: str | None = None,
        wait: float = 0.0,
        body: dict[str, Any] | None = None,
    ) -> None:
        self.headers = headers
        self.kind = kind
        self.wait = wait
        self.body = body


class ChatLimits:
    """Requests (RPM) and tokens (TPM) per minute per key, each optional."""

    __slots__ = ("requests", "tokens")

    def __init__(self, rpm: int | None, tpm: int | None, seconds: float) -> None:
        self.requests = MinuteBuckets(rpm, seconds)
        self.tokens = MinuteBuckets(tpm, seconds)

    def set(self, rpm: int | None, tpm: int | None, seconds: float) -> None:
        self.requests.limit, self.tokens.limit = rpm, tpm
        self.requests.seconds = self.tokens.seconds = seconds

    def admit(self, key: str, now: float, model: str, weight: int) -> ChatVerdict:
        """Take one request of `weight` tokens, or refuse it saying which limit and for how long."""
        waits = {
            unit: buckets.wait(key, now, amount)
            for unit, buckets, amount in (("requests", self.requests, 1), ("tokens", self.tokens, weight))
            if buckets.limit is not None
        }
        if any(waits.values()):
            kind = max(waits, key=lambda unit: waits[unit])  # the request fits once the longer wait is over
            headers = self._headers(key, now)
            wait_ms = _milliseconds(waits[kind])
            headers["retry-after-ms"] = str(wait_ms)
            headers["retry-after"] = str(max(1, math.ceil(wait_ms / 1000)))
            return ChatVerdict(
                headers, kind, waits[kind], self._refusal(key, now, model, kind, weight, waits[kind])
            )
        if self.requests.limit is not None:
            self.requests.take(key, now, 1)
        if self.tokens.limit is not None:
            self.tokens.take(key, now, weight)
        return ChatVerdict(self._headers(key, now))

    def _headers(self, key: str, now: float) -> dict[str, str]:
        headers: dict[str, str] = {}
        for unit, buckets in (("requests", self.requests), ("tokens", self.tokens)):
            if buckets.limit is not None:
                headers.update(buckets.headers(key, now, unit))
        return headers

    def _refusal(
        self, key: str, now: float, model: str, kind: str, weight: int, wait: float
    ) -> dict[str, Any]:
        buckets, requested = (self.requests, 1) if kind == "requests" else (self.tokens, weight)
        used = max(0, math.ceil(buckets.capacity - min(buckets.capacity, buckets.level(key, now)) - _SLACK))
        per = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
        message = (
            f"Rate limit reached for {model} in organization org-demo on {per}: Limit {buckets.limit}, Used {used}, "
            f"Requested {requested}. Please try again in {format_duration(wait)}. "
            "Visit https://platform.openai.com/account/rate-limits to learn more."
        )
        return {"error": {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}}

    def clear(self) -> None:
        self.requests.clear()
        self.tokens.clear()

    def __repr__(self) -> str:
        return f"<ChatLimits {self.requests!r} {self.tokens!r}>"


def format_duration(seconds: float) -> str:
    """A duration as OpenAI's headers write it (Go's style): "20ms", "1.5s", "6m0s", "1h2m3s".

    Rounded up to the millisecond, so a client that waits this long is never early.
    """
    ms = _milliseconds(seconds)
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, frac = divmod(rest, 1000)
    text = f"{whole}.{frac:03d}".rstrip("0") + "s" if frac else f"{whole}s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def _milliseconds(seconds: float) -> int:
    # Rounded up, but not past float noise: 0.07 s is 70 ms, not 71.
    return max(0, math.ceil(seconds * 1000 - 1e-9))
