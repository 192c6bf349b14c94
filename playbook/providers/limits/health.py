"""Whether a provider is up at all (:class:`Health`), judged on distinct calls, and what it
remembers of one call across its tries (:class:`Standing`).

Like :class:`~playbook.providers.limits.pace.Pace`, neither reads a clock: each takes ``now`` from
its caller (the running loop's time), so tests drive them in virtual time.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque

from playbook.providers.limits.waiters import wake_all

__all__ = ["Health", "Standing"]


class Standing:
    """What a provider's :class:`Health` remembers of one call across its tries (its ticket
    carries it): when it last failed, whether it fails *on its own*, and whether its next try
    waits *behind* the rows not started yet.

    A call that fails again after the provider answered a call sent since its last failure is
    its own failure (one input the provider always refuses, a path that always answers 503), not
    the provider's: from then on its tries, failed or not, are no evidence about the provider.
    It keeps that word when it moves to another key of a pool (the request is the same), and
    its provider's health remembers it by ``request`` (the request's identity, its address):
    a later call of the same request (a ``run.retry()``, a rerun in this process) fails on its
    own from its first failure, until it goes through.

    A call failing on its own tries again behind the rows not started yet; so does one that has
    failed once when the provider's calls that failed lately went on to fail on their own
    (:meth:`Health.gives_way`): its first failure still counts toward the provider's health."""

    __slots__ = ("own", "behind", "request", "host", "_health", "_failed_t", "_failing")

    def __init__(self, request: str | None = None) -> None:
        self.own = False
        self.request = request  # the request's identity (its address); None: none to remember it by
        self.host = False  # it failed at a host its row chose: nothing it does is the provider's
        self.behind = False  # its next try waits for the rows not started yet
        self._health: Health | None = None  # whose clock _failed_t is on
        self._failed_t = math.inf  # loop clock: its last failure
        self._failing = False  # its latest try failed, and none has gone through since

    def __repr__(self) -> str:
        return f"<Standing{' own' if self.own else ''}{' behind' if self.behind else ''}>"

    def site(self) -> None:
        """It failed at a host its row chose (``url="{url}"``): its own failure from the first, and
        none of its tries, failed or through, says anything about the provider."""
        self.own = self.host = True

    def failed(self, health: Health, now: float) -> bool:
        """It failed now on ``health``'s provider: True when the failure is its own."""
        if not self.own and self._health is health and health.answered_t >= self._failed_t:
            self.own = True
            health.settled(own=True)
            health.remember(self.request)
        elif not self.own and health.knows(self.request):  # it failed on its own before, in this process
            self.own = True
        self._health, self._failed_t, self._failing = health, now, True
        return self.own

    def answered(self, health: Health, *, through: bool) -> None:
        """``health``'s provider answered it (``through``: with what was asked, not a 429 or a 4xx)."""
        if through:
            if self._failing and not self.host:
                health.settled(own=False)  # it failed, then went through: its failure was the moment's
            self._failing = False
            health.forget(self.request)
        self.behind = self.own


class Health:
    """Is the provider up?  ``DOWN_AFTER`` transient failures in a row (refused connections,
    timeouts, 5xx) with no success between, when they are most of the recent calls, take it *down*;
    then one probe call at a time tests it, the first at once and the next ones further apart
    (``PROBE_FIRST``, growing by half each time, up to ``PROBE_MAX``: rows wait for the probes, so a
    provider back in 4 s is found by 5 s), and a success brings it back up.

    It also says when failures *dominate* the recent calls (more than half of the last
    ``RECENT``): a 5xx is a failure of one call, retried without slowing the others, until then.

    It judges the provider on distinct calls: a call's first try counts, and its retries count
    while nothing sent since it failed was answered (a provider failing everything).  A call that
    fails again after others were answered fails on its own (:class:`Standing`): its tries no
    longer count, so one input that always gets a 503 costs its row its retries, and neither
    holds the provider nor takes it down.  It remembers the last ``KNOWN`` requests that failed
    on their own, until one goes through: retried later, with no other call between (the rows
    that failed, alone), they fail on their own from their first failure, not like an outage.

    It learns what became of its calls that failed (:meth:`gives_way`): when the latest ones went
    on to fail on their own, and none went through on a retry, a call that fails sends its next
    try behind the rows not started yet from its first failure, as it would once known to fail
    on its own; but one such retry in ``SAMPLE`` still goes at once, so a retry going through (a
    passing 503) is seen, and the provider's calls retry at once again.
    """

    __slots__ = (
        "failures",
        "down",
        "probe_t",
        "probing",
        "since",
        "answered_t",
        "_recent",
        "_probes",
        "_outcome",
        "_lock",
        "_fates",
        "_given",
        "_known",
    )

    DOWN_AFTER = 5
    RECENT = 20
    PROBE_FIRST = 1.0
    PROBE_GROWTH = 1.5
    PROBE_MAX = 30.0
    FATES = 8  # the latest calls that failed, by what became of them
    LEARNT = 2  # of those failing on their own, and none going through, before a first failure gives way
    KNOWN = 4_096  # requests remembered as failing on their own
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
        # done when the probe in flight lands, one per loop waiting
        self._outcome: list[asyncio.Future[None]] = []
        self._lock = threading.Lock()  # two threads' calls must not both become the probe
        # True: it failed on its own; False: a retry went through
        self._fates: deque[bool] = deque(maxlen=self.FATES)
        self._given = 0  # retries sent behind on what was learnt, to pick the ones that go at once
        self._known: dict[str, None] = {}  # requests that failed on their own, oldest first

    def __repr__(self) -> str:
        state = "down" if self.down else "up"
        return f"<Health {state} failures_in_a_row={self.failures} recent={sum(self._recent)}/{len(self._recent)}>"

    def success(
        self, sent_at: float = math.inf, standing: Standing | None = None, *, through: bool = False
    ) -> bool:
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

    def knows(self, request: str | None) -> bool:
        """True when ``request`` failed on its own lately and has not gone through since."""
        return request is not None and request in self._known

    def remember(self, request: str | None) -> None:
        if request is not None:
            with self._lock:  # calls on several threads' loops share it
                known = self._known
                known.pop(request, None)
                known[request] = None
                if len(known) > self.KNOWN:
                    del known[next(iter(known))]

    def forget(self, request: str | None) -> None:
        if request is not None and request in self._known:
            with self._lock:
                self._known.pop(request, None)

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
