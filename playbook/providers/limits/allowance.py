"""Calls a provider allows per window of time: ``window=(50, 5)`` configured, or learnt.

Many providers count calls per window ("50 requests per 5 seconds", "1,000 per hour"), not at a
steady rate: a burst of the whole allowance passes, the next call is refused until the window
resets, and the refusal says when (``Retry-After``).  A rate paces such a provider badly: at
the average it wastes nothing but lags behind, and faster it meets every window's end with all
its calls in flight, each refused.

:class:`Allowance` keeps the calls inside the windows, either way:

* **configured** (``limit`` calls in ``seconds``): a sliding log, so no span of ``seconds /
  HEADROOM`` holds more than ``limit`` calls.  However the provider aligns its windows, none can
  see more (the small margin covers the network's jitter): no 429 at all, and a whole
  allowance at once when a window opens.
* **learnt**: a refusal that holds the provider (its hint is long: a window's end, not a
  bucket's next token) says how many calls the window let in: those sent since it opened (the
  end of the previous hold) and before the refused one.  Once the allowance is known, a
  refusal of a call past it is the window's end whatever its hint (``Retry-After: 1`` when the
  window ends within the second): it holds the provider until then and cuts no rate (cut at
  every window's end, the rate would sink to the window's average, and pace the allowance
  out over the whole window instead of sending it at once).  In the windows after, nine tenths of
  that go as they come, then one at a time until the next refusal, which is the window's end
  and holds the provider until its reset: one 429 a window instead of one per call in flight.  A
  call let in beyond the allowance doubles it (the refusals at the window's end read it again),
  so an allowance first read too low (a window someone else had used part of, or one our first
  calls straddled) does not leave the calls going one at a time.  Only long hints teach: a
  bucket's "Retry-After: 1" says when its next token comes, not how many calls a window holds.

Like :class:`~playbook.providers.limits.pace.Pace` it reads no clock: each method takes ``now``.
"""

from __future__ import annotations

import math
from collections import deque

from playbook.providers.limits.base import HEADROOM

__all__ = ["Allowance"]


class Allowance:
    """``Allowance(limit, seconds)`` configured, ``Allowance()`` learnt from the provider's refusals."""

    __slots__ = (
        "limit",
        "seconds",
        "configured",
        "_log",
        "_opened",
        "_count",
        "_recent",
        "_learnt",
        "_single_at",
    )

    RECENT = 120.0  # learnt: seconds of send times kept to place a refused call among its window's
    # Learnt: the last tenth of the allowance goes one call at a time too.  An allowance read from
    # a window our first calls straddled counts some of the window before; sent in a burst, the
    # excess would all be refused at once.
    SURE = 0.9

    def __init__(self, limit: int | None = None, seconds: float | None = None) -> None:
        self.configured = limit is not None
        self.limit = limit  # calls a window allows (None: not known yet)
        self.seconds = seconds
        self._log: deque[float] = deque()  # configured: when recent calls went, the last `limit` of them
        self._opened = -math.inf  # learnt: when the current window opened (a hold's end)
        self._count = 0  # learnt: calls sent in the current window
        self._recent: deque[float] = deque()  # learnt: when they went, RECENT seconds of them
        self._learnt: float | None = None  # learnt: the window (its opening) the limit was read in
        self._single_at = math.inf  # learnt: when this window's first call past the allowance went

    def __repr__(self) -> str:
        if self.configured:
            return f"<Allowance {self.limit} per {self.seconds:g}s, {len(self._log)} lately>"
        known = "unknown" if self.limit is None else str(self.limit)
        return f"<Allowance learnt {known} per window, {self._count} in this one>"

    @property
    def span(self) -> float:
        """Configured: the span no more than ``limit`` calls may share (a margin over ``seconds``)."""
        return (self.seconds or 0.0) / HEADROOM

    def delay(self, now: float) -> float:
        """Seconds until a call may go (configured: the oldest of the last ``limit`` calls ages out)."""
        log = self._log
        if not self.configured or self.limit is None or len(log) < self.limit:
            return 0.0
        return max(0.0, log[-self.limit] + self.span - now)

    def single_file(self) -> bool:
        """Learnt: this window's allowance is used up, so calls go one at a time until a refusal
        says when it ends (or one is let in, and the allowance grows)."""
        return (
            not self.configured
            and self.limit is not None
            and self._count >= math.ceil(self.limit * self.SURE)
        )

    def take(self, now: float, hold_end: float) -> None:
        """A call goes at ``now``; ``hold_end``: when the provider's last hold ended (a window opened)."""
        if self.configured:
            log = self._log
            log.append(now)
            while self.limit is not None and len(log) > self.limit:
                log.popleft()
            return
        if self._opened < hold_end <= now:
            self._opened, self._count, self._single_at = hold_end, 0, math.inf
            self._recent.clear()
        if self.single_file() and self._single_at == math.inf:
            self._single_at = now
        self._count += 1
        recent = self._recent
        recent.append(now)
        while recent[0] < now - self.RECENT:
            recent.popleft()

    def ends(self, sent_at: float) -> bool:
        """Learnt: a call sent at ``sent_at`` and refused came after this window's allowance (read
        in an earlier window) was used up, so its refusal is the window's end, whatever its hint
        (a window ending within the second says ``Retry-After: 1``), not a word on the rate."""
        return (
            not self.configured
            and self.limit is not None
            and self._learnt is not None
            and self._learnt < self._opened <= sent_at
            and self._before(sent_at) >= math.ceil(self.limit * self.SURE)
        )

    def let_in(self, sent_at: float) -> None:
        """Learnt: a call sent at ``sent_at`` was answered.  One sent past the allowance (one at
        a time) says it was read too low: it doubles, as a slow start would, and the refusals
        at the window's end read it again."""
        if sent_at >= self._single_at and sent_at >= self._opened and self.limit is not None:
            place = self._before(sent_at) + 1
            if place > self.limit:
                self.limit = 2 * place

    def refused(self, sent_at: float) -> None:
        """Learnt: the window refused a call sent at ``sent_at`` (a long hint holds the provider):
        the calls of this window sent before it are its allowance (the fewest, of the calls it
        refused: those sent together may arrive in any order)."""
        if self.configured or sent_at < self._opened:
            return
        before = self._before(sent_at)
        if not before:
            return
        if self._learnt == self._opened and self.limit is not None:
            self.limit = min(self.limit, before)
        else:
            self.limit, self._learnt = before, self._opened

    def _before(self, sent_at: float) -> int:
        """Calls of the current window sent before ``sent_at`` (those since went within RECENT)."""
        after = 0
        for t in reversed(self._recent):
            if t < sent_at:
                break
            after += 1
        return self._count - after
