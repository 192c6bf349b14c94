"""A provider's sending rate: GCRA pacing plus AIMD adaptation, as one exact primitive.

It reads no clock: each method takes ``now`` (seconds, any monotonic origin) from its caller, so
tests drive it in virtual time and the limiter decides which clock is real.
"""

from __future__ import annotations

import math
from collections import deque

from playbook.providers.limits.base import rate_news

__all__ = ["Pace"]


class Pace:
    """A provider's sending rate: GCRA pacing plus AIMD adaptation.

    Pacing is GCRA (the virtual-scheduling form of a token bucket): calls are spaced ``1 / rate``
    apart, with up to ``burst`` let through at once.  :meth:`delay` says how long until the next
    call may go; :meth:`take` spends that slot.  ``rate=None`` means unlimited until the provider
    pushes back.

    A 429 cuts the rate (multiplicative decrease) once per *episode*: a 429 for a call sent before
    the last cut says nothing new.  The cut starts from what the provider *let in while we were
    sending* (:meth:`accepted`: calls sent over the last ``WINDOW`` seconds and not refused, over
    that time less any hold's silence: the silence of a hold is ours, not the provider's verdict).
    A refusal within ``SOON`` of sending (again) measures mostly how sending started (the
    provider's burst, a fixed window's whole allowance, calls bunched as a run starts), so it cuts
    deeper, from the rate.  Successes bring the rate back (additive
    increase): after a refusal quickly up to just under the level refused (``KNOWN`` of it), but
    not at all after one at the level recovered to within ``FORGET`` seconds (that level was too
    high too); then slowly (``PROBE`` of the rate a second), so finding the limit again costs a
    refusal every minute or so, not every few seconds.  ``FORGET`` seconds without a refusal,
    and a configured ``rps`` is sought again quickly.  Without ``rps`` the rate is *discovered*:
    the first 429 sets it from what got through, and a slow start grows it e-fold a second
    (never past twice what is being sent) until the next.

    Not every 429 is a verdict on the rate.  Calls that leave evenly can arrive together (a new
    connection's handshake delays one, the next does not wait), and a strict provider refuses
    the second of the pair.  :meth:`lone` tells such a refusal apart: the rate is under any level
    the provider has refused (the configured one, or the base of the last cut: a probe that
    reaches it again is a measurement), the hint is short, and refusals are few among the calls
    sent over the last ``CALM`` seconds (at most ``JITTER`` of them, or ``FEW``: the first
    calls of a run, each on a new connection, are the likeliest to bunch).  It cuts
    nothing; a second that soon is a pattern, and cuts as above.

    A *coarse* hint (``Retry-After: 1``, whole seconds, the commonest form) at least ``COARSE``
    intervals long says nothing about the rate: a bucket refusing a bunched call would ask for
    a fraction of an interval, and rounded up to a second that is all a server can say.  Such
    refusals are judged over ``SPAN`` seconds too: a few of them together (a stall that bunched
    a handful of calls) among the many let in over that span are jitter still.  A rate the
    provider really holds lower refuses a steady share of the calls, and is cut as before.
    """

    __slots__ = (
        "rate",
        "ceiling",
        "burst",
        "floor",
        "_tat",
        "_not_before",
        "_last_cut",
        "_ok",
        "_sent",
        "_refused",
        "_quiet",
        "_started",
        "_resumed",
        "_slow_start",
        "_shown",
        "_target",
        "_grown",
        "_refusals",
        "_level",
    )

    WINDOW = 1.0  # seconds of sending that measure what the provider accepts
    LEAST = 0.25  # less sending than this measures nothing
    CUT = 0.85  # after a 429, send at this share of what was accepted
    DEEP = 0.75  # ... when the 429 came within SOON seconds of sending again: a burst was measured
    SOON = 1.0
    KNOWN = 0.9  # quick recovery up to this share of the refused level
    RECOVER = 0.05  # of the configured (or refused) rate per second, while below it
    PROBE = 0.002  # of the rate per second, above it
    FORGET = 60.0
    GROW = 1.0  # the slow start grows the rate e-fold a second
    LATE = 0.05  # seconds of a weighed call's lateness counted as the timer's (a stall is not)
    CALM = 2.0  # seconds over which refusals are judged lone (jitter) or a pattern
    JITTER = 0.05  # lone: at most this share of the calls sent over CALM were refused (or FEW)
    FEW = 2
    SPAN = 10.0  # seconds over which the refusals of coarse hints are judged, besides CALM
    COARSE = 4.0  # a whole-second hint at least this many intervals long is the server's rounding

    def __init__(self, rate: float | None = None, burst: int | None = None, *, floor: float = 0.5) -> None:
        self.rate = rate
        self.ceiling = rate
        self.burst = burst or 1
        self.floor = floor
        self._tat = -math.inf  # theoretical arrival time of the next call
        self._not_before = -math.inf  # the end of the last hold
        self._last_cut = -math.inf
        self._ok: deque[float] = deque()  # when recent calls succeeded
        self._sent: deque[float] = deque()  # when recent calls were sent (CALM seconds of them)
        self._refusals: deque[float] = deque()  # when recent refusals were answered
        self._refused: deque[float] = deque()  # when recent refused calls were sent
        self._quiet: deque[list[float]] = deque()  # [start, end] of recent holds
        self._started: float | None = None
        self._resumed = -math.inf  # when sending last (re)started: the first call, or after a hold
        self._slow_start = False
        self._shown = rate  # the rate last reported as changed
        self._target: float | None = None  # quick recovery goes up to here after a cut
        self._level: float | None = None  # the rate the provider last refused (the base of the last cut)
        self._grown = -math.inf  # the slow start's last growth

    def __repr__(self) -> str:
        rate = "unlimited" if self.rate is None else f"{self.rate:.3g}/s"
        ceiling = "discovered" if self.ceiling is None else f"up to {self.ceiling:g}/s"
        return f"<Pace {rate} ({ceiling}) burst={self.burst}>"

    def delay(self, now: float, weight: float = 1.0, room: float = 0.0) -> float:
        """Seconds until the next call (of ``weight`` units) may go (0: now).  ``room``: units let
        through at once beyond the burst (what calls in flight hold only until they are answered)."""
        rate = self.rate
        at = (
            self._not_before
            if rate is None
            else max(self._not_before, self._tat - max(0.0, self.burst + room - weight) / rate)
        )
        return max(0.0, at - now)

    def take(
        self, now: float, *, queued: bool = False, weight: float = 1.0, room: float = 0.0, held: float = 0.0
    ) -> None:
        """Spend the slot of a call sent at ``now``.  ``queued``: the call waited for this slot,
        so lateness under one interval is the timer's, and must not push every later slot back.
        ``weight``: the units it is charged (1 per call; tokens for a call weighed by them);
        ``room``: as :meth:`delay`'s; ``held``: units of the schedule that calls in flight hold
        until they are answered (reserved, to be given back): a schedule that refunds took into the
        past restarts from now with them still in it, not without them."""
        if self._started is None:
            self._started = self._resumed = now
        sent = self._sent
        sent.append(now)
        while sent[0] < now - self.SPAN:
            sent.popleft()
        rate = self.rate
        if rate is not None:
            interval = 1.0 / rate
            start = now
            if queued:
                due = max(self._not_before, self._tat - max(0.0, self.burst + room - weight) * interval)
                # Released late by the timer (within one interval; a weighed call: within LATE, not
                # its whole span, which after a stalled loop would let a burst of tokens go at once):
                # count the slot from when it was due.
                if now - max(interval, min(interval * weight, self.LATE)) < due <= now:
                    start = due
            self._tat = max(self._tat, start + held * interval) + interval * weight

    def charge(self, extra: float) -> None:
        """A call weighed ``extra`` units more than it was charged (less, when negative): the
        next slots move by that much.  A refund never makes room before now: :meth:`take`
        starts from ``now`` when the schedule lies in the past."""
        if self.rate is not None:
            self._tat += extra / self.rate

    def fill(self, now: float, level: float) -> None:
        """The bucket this pace keeps holds ``level`` units at ``now`` (its provider said so): the
        schedule moves to match, later or sooner, the bucket holding ``burst`` units at most."""
        if self.rate is not None:
            self._tat = now + (self.burst - min(level, self.burst)) / self.rate

    def learn(self, rate: float) -> bool:
        """The provider announced its limit: pace at no more than ``rate`` from now on (a higher
        configured rate comes down to it; a lower one stays).  True when the rate changed."""
        if self.ceiling is not None and self.ceiling <= rate:
            return False
        self.ceiling = rate
        if self.rate is None or self.rate > rate:
            self.rate = rate
        self._slow_start = False  # nothing left to discover
        if self._target is not None:
            self._target = min(self._target, rate)
        return self._changed()

    def reserve(self, now: float) -> float:
        """Take the next free slot, however far ahead; returns the wait until it."""
        wait = self.delay(now)
        self.take(now + wait)
        return wait

    def hold(self, until: float, now: float | None = None) -> None:
        """Send nothing before ``until``; ``now``: the hold starts now (its silence measures nothing)."""
        self._not_before = max(self._not_before, until)
        self._resumed = max(self._resumed, until)
        if now is None or until <= now:
            return
        quiet = self._quiet
        if quiet and now <= quiet[-1][1]:
            quiet[-1][1] = max(quiet[-1][1], until)
        else:
            quiet.append([now, until])

    def accepted(self, now: float) -> float | None:
        """Calls a second the provider let in while we were sending: those sent in the last
        ``WINDOW`` seconds less those refused, over that time less any hold's silence.  Counted
        by when they were *sent*, so a slow provider's answers, arriving seconds later, do not
        make it look slower than it is.  ``None`` when we sent too little lately to tell."""
        if self._started is None:
            return None
        start = max(now - self.WINDOW, self._started)
        quiet = self._quiet
        while quiet and quiet[0][1] <= start:
            quiet.popleft()
        span = now - start - sum(max(0.0, min(end, now) - max(begin, start)) for begin, end in quiet)
        if span < self.LEAST:
            return None
        refused = self._refused
        while refused and refused[0] < start:
            refused.popleft()
        return max(0, _since(self._sent, start) - len(refused)) / span

    def success(self, now: float) -> bool:
        """A call went through; returns True when the rate changed noticeably (>= 5%)."""
        ok = self._ok
        ok.append(now)
        while ok[0] < now - self.WINDOW:
            ok.popleft()
        rate = self.rate
        if rate is None:
            return False
        target = self._target if now - self._last_cut < self.FORGET else None
        ceiling = self.ceiling
        if self._slow_start:
            # By the clock rather than per success: slow answers come seldom.
            since = max(self._grown, self._not_before)  # no growth for the silence of a hold
            new = rate * math.exp(self.GROW * min(1.0, now - since)) if now > since else rate
            self._grown = now
            sending = self.accepted(now)
            if sending is not None:  # a rate far above what is being sent would measure nothing
                new = max(rate, min(new, 2 * sending))
        elif target is not None and rate < target:
            new = min(target, rate + self.RECOVER * target / rate)
        elif target is None and ceiling is not None:
            new = rate + self.RECOVER * ceiling / rate
        else:
            new = rate + self.PROBE  # per success: PROBE of the rate per second
        self.rate = new if ceiling is None else min(ceiling, new)
        return self._changed()

    def lone(self, now: float, *, coarse: bool = False) -> bool:
        """A call was refused with a short hint at ``now`` (``coarse``: a whole second): True
        when that is a lone refusal (see the class) which changes nothing; False when it is to
        be judged by :meth:`limited`.  Either way it counts towards the next judgement."""
        refusals = self._refusals
        refusals.append(now)
        while refusals[0] < now - self.SPAN:
            refusals.popleft()
        # Only under a level the provider has not refused (the configured rate, or under the level
        # it refused last): while finding the rate, or probing past that level, a refusal is the measurement.
        rate = self.rate
        level = self._level if now - self._last_cut < self.FORGET else None
        under = rate is not None and (
            rate < level if level is not None else self.ceiling is not None and rate <= self.ceiling
        )
        if not under or self._slow_start:
            return False
        rounded = coarse and rate is not None and rate >= self.COARSE  # the hint says nothing of the rate
        if not self._few(now, self.CALM) and not (rounded and self._few(now, self.SPAN)):
            return False
        if level is not None:
            # Refused here once, if only by jitter: a probe that reaches this rate again measures.
            self._level = min(level, rate)  # type: ignore[type-var]  # under: rate is known
        return True

    def _few(self, now: float, span: float) -> bool:
        """Refusals over the last ``span`` seconds are few among the calls sent over it."""
        start = now - span
        return _since(self._refusals, start) <= max(self.FEW, self.JITTER * _since(self._sent, start))

    def limited(self, now: float, sent_at: float, *, pending: int = 0) -> bool:
        """The provider refused a call sent at ``sent_at`` (a 429), with ``pending`` calls still
        unanswered; returns True if the rate was cut."""
        self._refused.append(sent_at)
        if sent_at <= self._last_cut:
            return False  # already cut for this episode
        # nothing accepted while sending: a quota's refusal, no rate to read
        accepted = self.accepted(now) or None
        rate = self.rate
        if rate is None:
            oks = self._ok
            while oks and oks[0] < now - self.WINDOW:
                oks.popleft()
            # Calls still in flight were let in: they count (a refusal comes back before them).
            through = len(oks) + pending
            if not through:
                return False  # nothing got through lately (a quota, not a rate): the hold says enough
            # The first refusal with no rate set: start from what got through, and when that was
            # too little sending to measure, a slow start finds the rest.
            base, cut = (accepted, self.CUT) if accepted is not None else (float(through), 1.0)
            self._slow_start = accepted is None
            self._grown = max(now, self._not_before)
            self._target = None  # a seed for the slow start, not a level the provider refused
        elif self._slow_start:
            if accepted is None:
                return False  # still finding the rate: a refusal too early to measure says nothing new
            base, cut = accepted, self.CUT
            self._slow_start, self._target = False, None
        else:
            # Refused soon after sending (re)started: the last cut, if any, was not enough.  What
            # was let in so far measures how sending started more than the provider: a burst, a
            # fixed window's whole allowance, or a cold start's calls bunched and refused (each
            # one counted against it: cut from that, a run went at half its rate).  The cut
            # starts from the rate, deeper.
            soon = now - self._resumed < self.SOON
            cut = self.DEEP if soon else self.CUT
            base = rate if accepted is None or soon else min(rate, accepted)
        # Refused again at (or under) the level recovered to: that level was too high too.
        again = (
            self._target is not None
            and now - self._last_cut < self.FORGET
            and (rate or 0.0) <= self._target * 1.01
        )
        self._last_cut = now
        self.rate = max(self._floor(), base * cut)
        self._shown = self.rate
        if not self._slow_start:
            # Once refused, recover quickly to just under the refused level (a probe past it that
            # is refused finds the level again); refused at the level recovered to, from the new
            # rate on, only probe.
            self._target = self.rate if again else max(self.rate, base * self.KNOWN)
            self._level = base
        return True

    def _floor(self) -> float:
        """The rate is never cut below this: a tenth of the configured rate, else ``floor``."""
        return self.ceiling / 10 if self.ceiling is not None else self.floor

    def _changed(self) -> bool:
        if rate_news(self._shown, self.rate, self.ceiling):
            self._shown = self.rate
            return True
        return False


def _since(times: deque[float], start: float) -> int:
    """How many of ``times`` (in order) are at or after ``start``."""
    n = 0
    for t in reversed(times):
        if t < start:
            break
        n += 1
    return n
