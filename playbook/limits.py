"""The exact primitives a provider's governor is made of: pacing, rate adaptation, backoff and
reading a server's "come back later" headers.

None of them reads a clock: each takes ``now`` (seconds, any monotonic origin) from its caller,
so tests drive them in virtual time and the governor decides which clock is real.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping
from datetime import timezone
from email.utils import parsedate_to_datetime

__all__ = ["Backoff", "Pace", "retry_after"]

_EPOCH_FLOOR = 1e9  # a reset value this large is a Unix timestamp, not a number of seconds


def retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds the server asks us to wait, from ``Retry-After`` (seconds or an HTTP date),
    ``RateLimit-Reset`` / ``RateLimit: ...; reset=N`` (seconds) or ``X-RateLimit-Reset``
    (a Unix timestamp, or seconds when small).  ``now`` is the wall-clock time (epoch seconds).

    ``None`` when no header gives a usable value; garbage is ignored, never trusted.
    """
    value = headers.get("retry-after")
    if value is not None:
        seconds = _seconds(value)
        if seconds is None:
            try:
                when = parsedate_to_datetime(value.strip())
            except (TypeError, ValueError, IndexError):
                when = None
            if when is not None:
                if when.tzinfo is None:  # asctime dates carry no zone: HTTP dates are GMT
                    when = when.replace(tzinfo=timezone.utc)
                seconds = max(0.0, when.timestamp() - now)
        if seconds is not None:
            return seconds
    value = headers.get("ratelimit-reset")
    if value is None:
        # The combined draft header: "RateLimit: limit=10, remaining=0, reset=5".
        combined = headers.get("ratelimit")
        if combined is not None:
            for part in combined.replace(";", ",").split(","):
                name, _, raw = part.strip().partition("=")
                if name.strip().lower() == "reset":
                    value = raw
    if value is not None:
        seconds = _seconds(value)
        if seconds is not None:
            return seconds
    value = headers.get("x-ratelimit-reset")
    if value is not None:
        seconds = _seconds(value)
        if seconds is not None:
            if seconds >= _EPOCH_FLOOR * 1000:  # milliseconds since the epoch
                seconds = seconds / 1000.0
            return max(0.0, seconds - now) if seconds >= _EPOCH_FLOOR else seconds
    return None


def _seconds(text: str) -> float | None:
    try:
        seconds = float(text.strip().strip('"'))
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


class Backoff:
    """Exponential backoff with jitter: try ``n`` waits between ``base * 2**n / 2`` and
    ``base * 2**n``, never more than ``cap``.  The lower half stays, so waits still grow."""

    __slots__ = ("base", "cap", "_rng")

    def __init__(self, base: float = 0.5, cap: float = 30.0, *, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self._rng = rng or random.Random()

    def delay(self, n: int) -> float:
        high = min(self.cap, self.base * 2.0 ** min(n, 60))
        return self._rng.uniform(high / 2, high)

    def __repr__(self) -> str:
        return f"<Backoff base={self.base:g}s cap={self.cap:g}s>"


class Pace:
    """A provider's sending rate: GCRA pacing plus AIMD adaptation.

    Pacing is GCRA (the virtual-scheduling form of a token bucket): calls are spaced ``1 / rate``
    apart, with up to ``burst`` let through at once.  :meth:`delay` says how long until the next
    call may go; :meth:`take` spends that slot.  ``rate=None`` means unlimited until the provider
    pushes back.

    A 429 cuts the rate (multiplicative decrease) once per round: a 429 for a call sent before
    the last cut says nothing new.  With ``rps`` configured, successes bring the rate back up to
    it (additive increase, ``RECOVER`` of it per second).  Without ``rps`` the rate is
    *discovered*: the first 429 sets it from what got through in the last second.  If that came
    within the first second of traffic, a slow start grows the rate ~e-fold a second until a 429
    after that first second, which sets it just under what the provider accepted in the last
    second (a second of traffic is the least that measures anything).  From there it creeps up by ``PROBE`` a second, so finding a raised limit costs a
    refusal every few minutes, not every few seconds.
    """

    __slots__ = (
        "rate", "ceiling", "burst", "floor", "_tat", "_not_before", "_last_cut", "_ok", "_started", "_slow_start", "_shown",
    )  # fmt: skip

    WINDOW = 1.0  # seconds of successes that measure what the provider accepts
    CUT = 0.9  # after a 429, send at this share of what was accepted
    RECOVER = 0.05  # of the configured rate per second, while below it
    PROBE = 0.002  # of the discovered rate per second

    def __init__(self, rate: float | None = None, burst: int | None = None, *, floor: float = 0.5) -> None:
        self.rate = rate
        self.ceiling = rate
        self.burst = burst or 1
        self.floor = floor
        self._tat = -math.inf  # theoretical arrival time of the next call
        self._not_before = -math.inf  # the end of the last hold
        self._last_cut = -math.inf
        self._ok: deque[float] = deque()  # when recent calls succeeded
        self._started: float | None = None
        self._slow_start = False
        self._shown = rate  # the rate last reported as changed

    def __repr__(self) -> str:
        rate = "unlimited" if self.rate is None else f"{self.rate:.3g}/s"
        ceiling = "discovered" if self.ceiling is None else f"up to {self.ceiling:g}/s"
        return f"<Pace {rate} ({ceiling}) burst={self.burst}>"

    def delay(self, now: float) -> float:
        """Seconds until the next call may go (0: now)."""
        rate = self.rate
        at = self._not_before if rate is None else max(self._not_before, self._tat - (self.burst - 1) / rate)
        return max(0.0, at - now)

    def take(self, now: float, *, queued: bool = False) -> None:
        """Spend the slot of a call sent at ``now``.  ``queued``: the call waited for this slot,
        so lateness under one interval is the timer's, and must not push every later slot back."""
        if self._started is None:
            self._started = now
        rate = self.rate
        if rate is not None:
            interval = 1.0 / rate
            start = now
            if queued:
                due = max(self._not_before, self._tat - (self.burst - 1) * interval)
                if now - interval < due <= now:
                    start = due  # released late: count the slot from when it was due
            self._tat = max(self._tat, start) + interval

    def reserve(self, now: float) -> float:
        """Take the next free slot, however far ahead; returns the wait until it."""
        wait = self.delay(now)
        self.take(now + wait)
        return wait

    def hold(self, until: float) -> None:
        """Send nothing before ``until``."""
        self._not_before = max(self._not_before, until)

    def success(self, now: float) -> bool:
        """A call went through; returns True when the rate changed noticeably (>= 5%)."""
        ok = self._ok
        ok.append(now)
        while ok[0] < now - self.WINDOW:
            ok.popleft()
        rate = self.rate
        if rate is None:
            return False
        if self._slow_start:
            new = rate + 1.0  # per success, so ~e-fold a second
        elif self.ceiling is not None:
            new = min(self.ceiling, rate + self.RECOVER * self.ceiling / rate)
        else:
            new = rate + self.PROBE  # per success: PROBE of the rate per second
        self.rate = new
        return self._changed()

    def limited(self, now: float, sent_at: float) -> bool:
        """The provider refused a call sent at ``sent_at`` (a 429); returns True if the rate was cut."""
        if sent_at < self._last_cut:
            return False  # already cut for this round
        ok = self._ok
        while ok and ok[0] < now - self.WINDOW:
            ok.popleft()
        accepted = len(ok) / self.WINDOW
        measured = self._started is not None and now - self._started >= self.WINDOW
        rate = self.rate
        if rate is None:
            if not accepted:
                return False  # nothing got through lately (a quota, not a rate): the hold says enough
            # The first refusal with no rate set: start from what got through in the last second
            # (all of it if that second is not over yet: the slow start finds the rest).
            base, cut = accepted, (self.CUT if measured else 1.0)
            self._slow_start = not measured
        elif not (measured and accepted):
            # Too little traffic to measure: a configured rate was probably right (trim it); a
            # discovered one may be far off (halve it).
            base, cut = rate, (self.CUT if self.ceiling is not None else 0.5)
        else:
            base, cut = min(rate, accepted), self.CUT
            self._slow_start = False
        self._last_cut = now
        self.rate = max(self._floor(), base * cut)
        self._shown = self.rate
        return True

    def _floor(self) -> float:
        """The rate is never cut below this: a tenth of the configured rate, else ``floor``."""
        return self.ceiling / 10 if self.ceiling is not None else self.floor

    def _changed(self) -> bool:
        shown, rate = self._shown, self.rate
        if shown == rate:
            return False
        if shown is None or rate is None or rate == self.ceiling or abs(rate - shown) >= 0.05 * shown:
            self._shown = rate
            return True
        return False
