"""What a provider's governor knows besides its rate: how many calls it may have in flight
(:class:`Window`) and whether the provider is up at all (:class:`Health`).

Like :class:`~playbook.providers.limits.pace.Pace`, neither reads a clock: each takes ``now`` from its caller (the
running loop's time), so tests drive them in virtual time.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque

from .waiters import wake_all

__all__ = ["Health", "Standing", "Window"]


class Window:
    """Calls in flight: a gate whose limit is configured (``concurrency=``), discovered from
    429s that track calls in flight, or both (the discovered limit never exceeds the configured).

    It *opens* like TCP's slow start: ``INITIAL`` calls at first, one more per success (doubling
    each round trip), so a provider with limits meets a handful of calls, not the whole run's
    concurrency at once; the first 429 ends the opening.

    A 429 for a call sent while ``level`` calls were in flight (itself included) is a verdict on
    concurrency when calls sent at lower levels went through lately and none at this level did:
    a rate limit refuses calls whatever the level, so its refusals fall among successes at the
    same levels; and it says when to come back (``Retry-After``), which no concurrency limit
    can.  The limit is then set to the highest level that went through (the level *is*
    the measurement, so no multiplicative cut is needed).  A success at a level above the limit
    says the limit was read too low and raises it by one, and ``PROBE`` seconds at the limit
    without a refusal raise it by a quarter: a raised limit is found at the cost of a refusal
    every few seconds.  A refusal below the limit, among levels that went through, is the
    rate's.

    Its waiters may sit on several threads' loops; it takes no lock and wakes nobody itself: its
    owner serialises the calls to it and wakes the waiters it hands over (:meth:`handed`).
    """

    limit: int | None

    __slots__ = ("configured", "limit", "in_flight", "opening", "_waiters", "_handed", "_oks", "_changed", "_blind", "_single")

    HORIZON = 2.0  # seconds of successes that say which levels went through
    INITIAL = 8
    OPEN = 256  # an opening that gets this far without a 429 has found no limit
    PROBE = 2.0  # seconds at the limit without a refusal before it grows

    def __init__(self, configured: int | None = None) -> None:
        self.configured = configured
        self.opening = configured is None or configured > self.INITIAL
        self.limit = min(configured or self.INITIAL, self.INITIAL)
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[bool]] = deque()  # calls waiting for room, on any thread's loop
        self._handed: list[asyncio.Future[bool]] = []  # let in, not yet woken
        self._oks: deque[tuple[float, int]] = deque()  # (when, level) of recent successes
        self._changed = -math.inf  # when the limit last fell
        self._blind = False  # halved on a refusal before anything went through
        self._single = False  # one call at a time, whatever the limit (a window's allowance is used up)

    def __repr__(self) -> str:
        limit = "unbounded" if self.limit is None else str(self.limit)
        how = " opening" if self.opening else " discovered" if self.discovered else ""
        return f"<Window {self.in_flight}/{limit}{how} waiting={len(self._waiters)}>"

    @property
    def discovered(self) -> bool:
        return not self.opening and self.limit is not None and self.limit != self.configured

    @property
    def known_limit(self) -> int | None:
        """The limit to show: ``None`` while opening with no configured one.  (A new provider
        meets a growing handful of calls first, like TCP's slow start, but that opening is not a
        limit it has shown.)"""
        return None if self.opening and self.configured is None else self.limit

    def _open(self) -> bool:
        if self._single:
            return self.in_flight < 1
        return self.limit is None or self.in_flight < self.limit

    def single(self, single: bool) -> None:
        """One call at a time while ``single`` (see :class:`~playbook.providers.limits.allowance.Allowance`),
        else as the limit says: lifted, it lets waiters in."""
        if single != self._single:
            self._single = single
            if not single:
                self._wake()

    def enter(self) -> bool:
        """Take room for one more call if there is some now, without waiting (the hot path)."""
        if self._waiters or not self._open():
            return False
        self.in_flight += 1
        return True

    def wait(self, turn: asyncio.Future[bool]) -> None:
        """Queue ``turn`` for room: it is counted in and handed over (:meth:`handed`) when room
        frees, in order, or dropped by :meth:`kick`."""
        self._waiters.append(turn)

    def handed(self) -> list[asyncio.Future[bool]]:
        """The waiters let in since the last ask, each already counted in flight: the owner wakes
        them with True (outside its lock), or gives their room back if they are gone."""
        handed = self._handed
        if handed:
            self._handed = []
        return handed

    def kick(self) -> list[asyncio.Future[bool]]:
        """Let every waiter go without room (a hold arrived): the owner wakes them with False."""
        kicked = [turn for turn in self._waiters if not turn.done()]
        self._waiters.clear()
        return kicked

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self._open():
            turn = waiters.popleft()
            if not turn.done():  # a waiter cancelled meanwhile gives its turn to the next
                self.in_flight += 1  # counted here, so no later arrival takes the room first
                self._handed.append(turn)

    def _set(self, limit: int | None) -> None:
        if limit is not None and self.configured is not None:
            limit = min(limit, self.configured)
        if limit == self.configured:
            limit = self.configured
        self.limit = limit
        self._wake()

    def success(self, level: int, now: float) -> bool:
        """A call sent at ``level`` went through; True when the limit changed."""
        oks = self._oks
        oks.append((now, level))
        while oks[0][0] < now - self.HORIZON:
            oks.popleft()
        self._blind = False
        limit = self.limit
        if limit is None or (limit == self.configured and not self.opening):
            return False
        if self.opening:  # growing by one per success says nothing worth showing until it ends
            if limit + 1 < min(self.configured or self.OPEN, self.OPEN):
                self._set(limit + 1)
                return False
            self.opening = False
            self._set(self.configured)
            return True
        if level > limit:
            self._set(limit + 1)
        elif level == limit and now - self._changed >= self.PROBE:
            self._changed = now
            self._set(limit + max(1, limit // 4))
        else:
            return False
        return True

    def refused(self, level: int, now: float, *, hinted: bool = False) -> bool:
        """A call sent at ``level`` got a 429 (``hinted``: saying when to come back); True when
        that is a verdict on concurrency (the limit is set), False when it is the rate's."""
        oks = self._oks
        while oks and oks[0][0] < now - self.HORIZON:
            oks.popleft()
        top = max((lvl for _, lvl in oks), default=0)
        if hinted:
            # A time to come back is a rate's or a quota's answer: a slot in flight frees in no
            # time anyone could name.  (Calls sent in a burst make a rate look like a level.)
            if top:  # what went through lately says the window was not what refused it
                self.opening = False
                self._set(self.configured)
            return False
        self.opening = False
        self._changed = now
        if not top:
            # Nothing went through lately, so no level to read: calls sent together reach the
            # provider in any order.  Halve the window, once until something goes through.
            if not self._blind:
                self._blind = True
                self._set(max(1, (self.limit if self.limit is not None else level) // 2))
            return True
        if level > top:
            self._set(top)
            return True
        if self.discovered and self.limit is not None and level >= self.limit:
            # At the limit read before: the provider counts a call until its answer has left, so
            # a level that went through once (an answer in transit) may not the next time.
            self._set(max(1, level - 1))
            return True
        return False


class Standing:
    """What a provider's :class:`Health` remembers of one call across its tries (its ticket
    carries it): when it last failed, whether it fails *on its own*, and whether its next try
    waits *behind* the rows not started yet.

    A call that fails again after the provider answered a call sent since its last failure is
    its own failure (one input the provider always refuses, a path that always answers 503), not
    the provider's: from then on its tries, failed or not, are no evidence about the provider.
    It keeps that word when it moves to another key of a pool (the request is the same).

    A call failing on its own tries again behind the rows not started yet; so does one that has
    failed once when the provider's calls that failed lately went on to fail on their own
    (:meth:`Health.gives_way`): its first failure still counts toward the provider's health."""

    __slots__ = ("own", "behind", "_health", "_failed_t", "_failing")

    def __init__(self) -> None:
        self.own = False
        self.behind = False  # its next try waits for the rows not started yet
        self._health: Health | None = None  # whose clock _failed_t is on
        self._failed_t = math.inf  # loop clock: its last failure
        self._failing = False  # its latest try failed, and none has gone through since

    def __repr__(self) -> str:
        return f"<Standing{' own' if self.own else ''}{' behind' if self.behind else ''}>"

    def failed(self, health: Health, now: float) -> bool:
        """It failed now on ``health``'s provider: True when the failure is its own."""
        if not self.own and self._health is health and health.answered_t >= self._failed_t:
            self.own = True
            health.settled(own=True)
        self._health, self._failed_t, self._failing = health, now, True
        return self.own

    def answered(self, health: Health, *, through: bool) -> None:
        """``health``'s provider answered it (``through``: with what was asked, not a 429 or a 4xx)."""
        if through:
            if self._failing:
                health.settled(own=False)  # it failed, then went through: its failure was the moment's
            self._failing = False
        self.behind = self.own


class Health:
    """Is the provider up?  ``DOWN_AFTER`` transient failures in a row (refused connections,
    timeouts, 5xx) with no success between, when they are most of the recent calls, take it *down*; then one probe call at a time tests it,
    the first at once and the next ones further apart (``PROBE_FIRST``, growing by half each time,
    up to ``PROBE_MAX``: rows wait for the probes, so a provider back in 4 s is found by 5 s),
    and a success brings it back up.

    It also says when failures *dominate* the recent calls (more than half of the last
    ``RECENT``): a 5xx is a failure of one call, retried without slowing the others, until then.

    It judges the provider on distinct calls: a call's first try counts, and its retries count
    while nothing sent since it failed was answered (a provider failing everything).  A call that
    fails again after others were answered fails on its own (:class:`Standing`): its tries no
    longer count, so one input that always gets a 503 costs its row its retries, and neither
    holds the provider nor takes it down.

    It learns what became of its calls that failed (:meth:`gives_way`): when the latest ones went
    on to fail on their own, and none went through on a retry, a call that fails sends its next
    try behind the rows not started yet from its first failure, as it would once known to fail
    on its own; but one such retry in ``SAMPLE`` still goes at once, so a retry going through (a
    passing 503) is seen, and the provider's calls retry at once again.
    """

    __slots__ = (
        "failures", "down", "probe_t", "probing", "since", "answered_t", "_recent", "_probes", "_outcome", "_lock", "_fates", "_given",
    )  # fmt: skip

    DOWN_AFTER = 5
    RECENT = 20
    PROBE_FIRST = 1.0
    PROBE_GROWTH = 1.5
    PROBE_MAX = 30.0
    FATES = 8  # the latest calls that failed, by what became of them
    LEARNT = 2  # of those failing on their own, and none going through, before a first failure gives way
    SAMPLE = 4  # even then, one retry in this many goes at once: a retry going through unlearns it

    def __init__(self) -> None:
        self.failures = 0  # in a row
        self.down = False
        self.probe_t = -math.inf  # loop clock: the next probe may go then
        self.probing = False
        self.since = math.inf  # loop clock: when it went down
        self.answered_t = -math.inf  # loop clock: when the latest call answered was sent
        self._recent: deque[bool] = deque(maxlen=self.RECENT)  # True: failed
        self._probes = 0
        self._outcome: list[asyncio.Future[None]] = []  # done when the probe in flight lands, one per loop waiting
        self._lock = threading.Lock()  # two threads' calls must not both become the probe
        self._fates: deque[bool] = deque(maxlen=self.FATES)  # True: it failed on its own; False: a retry went through
        self._given = 0  # retries sent behind on what was learnt, to pick the ones that go at once

    def __repr__(self) -> str:
        state = "down" if self.down else "up"
        return f"<Health {state} failures_in_a_row={self.failures} recent={sum(self._recent)}/{len(self._recent)}>"

    def success(self, sent_at: float = math.inf, standing: Standing | None = None, *, through: bool = False) -> bool:
        """A call sent at ``sent_at`` was answered (a 4xx or a 429 is an answer too; ``through``:
        with what it asked for); True when that brings the provider back up.  An answer to a call
        sent before it went down says nothing about now.  ``standing``: the call's (one failing
        on its own is not counted)."""
        if standing is not None:
            standing.answered(self, through=through)
        if standing is None or not standing.own:
            self._recent.append(False)
        self.failures = 0
        if sent_at != math.inf:
            self.answered_t = max(self.answered_t, sent_at)
        if not self.down or sent_at < self.since:
            return False
        self.down, self._probes, self.probe_t, self.since = False, 0, -math.inf, math.inf
        self._landed()
        return True

    def failure(self, now: float, standing: Standing | None = None) -> bool:
        """A transient failure; True when it takes the provider down.  ``standing``: the
        call's, which says whether it failed on its own (then it is not counted)."""
        own = standing is not None and standing.failed(self, now)
        if not own:
            self._recent.append(True)
            self.failures += 1
        if standing is not None:
            standing.behind = own or self.gives_way()
        if self.down:
            if self.probing:  # the probe failed: the next one waits longer
                self.probe_t = now + min(self.PROBE_MAX, self.PROBE_FIRST * self.PROBE_GROWTH**self._probes)
                self._probes += 1
                self._landed()
            return False
        if own:
            return False
        # Failures come back faster than answers, so a run of them alone can be a few unlucky
        # calls among many good ones: down takes a run *and* most recent calls failing.
        if self.failures < self.DOWN_AFTER or not self.dominated():
            return False
        self.down, self.probe_t, self._probes, self.since = True, now + self.PROBE_FIRST, 1, now
        return True

    def dominated(self) -> bool:
        recent = self._recent
        return len(recent) >= self.RECENT // 2 and 2 * sum(recent) > len(recent)

    def settled(self, *, own: bool) -> None:
        """What became of a call that failed: it failed on its own, or a retry went through."""
        self._fates.append(own)

    def gives_way(self) -> bool:
        """A call failed, not known to fail on its own: True when its next try should wait
        behind the rows not started yet all the same.  So it does when the latest calls that
        failed (``LEARNT`` at least, of the last ``FATES``) all went on to fail on their own,
        but for one in ``SAMPLE``, and never while the provider is down or failures dominate
        (then the provider's health, not the call, decides when it goes)."""
        fates = self._fates
        if self.down or self.dominated() or sum(fates) < self.LEARNT or not all(fates):
            return False
        self._given += 1
        return self._given % self.SAMPLE != 0

    def may_probe(self, now: float) -> bool:
        """While down: True if this call may go as the probe (and it becomes the probe)."""
        with self._lock:
            if self.probing or now < self.probe_t:
                return False
            self.probing = True
            return True

    def outcome(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """Done when the probe in flight has landed, either way: calls that meet a probe wait for
        its word (a provider just back serves them all) rather than park on a guess.  One future
        per loop that asks: the calls waiting may be on several threads' loops."""
        with self._lock:
            for waiter in self._outcome:
                if waiter.get_loop() is loop and not waiter.done():
                    return waiter
            waiter = loop.create_future()
            if self.probing:
                self._outcome.append(waiter)
            else:  # it landed on another thread since the caller looked: its word is in
                waiter.set_result(None)
            return waiter

    def _landed(self) -> None:
        with self._lock:
            self.probing = False
            waiters, self._outcome = self._outcome, []
        wake_all(waiters, None)

    def unprobe(self) -> None:
        """The probe is over (landed, cancelled or held before it went): another call may probe."""
        if self.probing:
            self._landed()

    def retest(self) -> None:
        """A new run asks afresh: a provider that is down is probed by its first call."""
        if self.down and not self.probing:
            self.probe_t = -math.inf
