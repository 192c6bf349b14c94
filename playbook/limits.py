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
            if when is not None and when.tzinfo is not None:
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

    Pacing is the virtual-scheduling form of GCRA: each call reserves the next free slot, spaced
    ``1 / rate`` apart, with up to ``burst`` calls let through at once.  ``rate=None`` means
    unlimited until the provider pushes back.

    A 429 cuts the rate (multiplicative decrease) once per round: a 429 for a call sent before
    the last cut says nothing new.  Successes raise it again (additive increase) up to ``ceiling``
    (the configured ``rps``).  With no ``rps`` the rate is *discovered*: the first cut sets it
    from the successes of the last second, a short slow start doubles it until the next 429, and
    from then on it creeps only slowly above the level where the provider last pushed back, so
    probing costs few refusals.
    """

    __slots__ = (
        "rate", "ceiling", "burst", "floor", "_tat", "_last_cut", "_ok", "_started", "_slow_start", "_known", "_shown",
    )  # fmt: skip

    WINDOW = 1.0  # seconds of successes that measure what the provider accepts
    CUT = 0.9  # after a 429, send at this share of what was accepted
    RECOVER = 0.05  # of the ceiling per second, while below it (configured rate)
    PROBE = 0.005  # of the known level per second, above it (discovered rate)

    def __init__(self, rate: float | None = None, burst: int | None = None, *, floor: float = 0.5) -> None:
        self.rate = rate
        self.ceiling = rate
        self.burst = burst or 1
        self.floor = floor
        self._tat = -math.inf  # theoretical arrival time of the next call
        self._last_cut = -math.inf
        self._ok: deque[float] = deque()
        self._started: float | None = None
        self._slow_start = False
        self._known: float | None = None  # the accepted rate measured at the last cut
        self._shown = rate  # the rate last reported as changed

    def __repr__(self) -> str:
        rate = "unlimited" if self.rate is None else f"{self.rate:.3g}/s"
        ceiling = "discovered" if self.ceiling is None else f"up to {self.ceiling:g}/s"
        return f"<Pace {rate} ({ceiling}) burst={self.burst}>"

    def reserve(self, now: float) -> float:
        """Take the next slot; returns how long to wait before sending (0 to send now)."""
        if self._started is None:
            self._started = now
        rate = self.rate
        if rate is None:
            return 0.0
        interval = 1.0 / rate
        at = max(now, self._tat - (self.burst - 1) * interval)
        self._tat = max(self._tat, at) + interval
        return at - now

    def hold(self, until: float) -> None:
        """Send nothing before ``until``; the first call after it starts a fresh spacing."""
        self._tat = max(self._tat, until)

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
            step = 0.5  # per success: the rate grows ~65% a second
        elif self.ceiling is not None:
            step = self.RECOVER * self.ceiling / rate
        else:
            known = self._known or rate
            step = (self.RECOVER if rate < known else self.PROBE) * known / rate
        new = rate + step
        if self.ceiling is not None and new >= self.ceiling:
            new = self.ceiling
        self.rate = new
        return self._changed()

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

    def limited(self, now: float, sent_at: float) -> bool:
        """The provider refused a call sent at ``sent_at`` (a 429); returns True if the rate was cut."""
        if sent_at < self._last_cut:
            return False  # already cut for this round
        self._last_cut = now
        while self._ok and self._ok[0] < now - self.WINDOW:
            self._ok.popleft()
        accepted = len(self._ok) / self.WINDOW
        measured = self._started is not None and now - self._started >= self.WINDOW
        rate = self.rate
        if rate is None:
            if accepted == 0:
                return False  # nothing got through lately (a quota, not a rate): the hold says enough
            # First refusal with no rate set: start from what got through in the last second.
            base = accepted
            self._slow_start = not measured
        else:
            base = min(rate, accepted) if measured and accepted > 0 else rate / 2
            if self._slow_start and measured:
                self._slow_start = False
        if self.ceiling is None and measured and accepted > 0:
            self._known = accepted
        self.rate = max(self._floor(), base * self.CUT)
        self._shown = self.rate
        return True
