"""The limiter whose state lives in this process: :class:`~playbook.providers.limits.pace.Pace` (GCRA and
AIMD) and :class:`~playbook.providers.limits.gates.Window` (calls in flight), on the running loop's clock.

Calls waiting for a paced slot queue in order and a timer lets them out a slot at a time, so a
rate that rises while they wait speeds them up at once.  A hold sends every waiting call back to
its governor at once (which parks, suspends or waits by its row's budget) instead of letting it
sleep through a hold that may last the day.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections import deque
from collections.abc import Callable

from playbook.providers.limits.allowance import Allowance
from playbook.providers.limits.base import Permit, Verdict
from playbook.providers.limits.budgets import Budgets
from playbook.providers.limits.gates import Window
from playbook.providers.limits.pace import Pace
from playbook.providers.limits.waiters import here, wake_all
from playbook.providers.limits.weights import Rates, counted, parts, reserved

__all__ = ["LocalLimiter"]


class LocalLimiter:
    """``LocalLimiter(rate, burst, concurrency, tokens=None)``: the
    :class:`~playbook.providers.limits.base.Limiter` of one process.  ``rate`` in calls a second (None:
    discovered from 429s); ``tokens`` in tokens a second, a number (one budget of all tokens) or
    :class:`~playbook.providers.limits.budgets.Rates` (all, input and output tokens apart; None:
    calls are not weighed).

    One process, any number of threads: each thread running a blocking ``map()`` has a loop of
    its own, and they all share this rate and this bound on calls in flight.  A lock guards the
    state (uncontended with one thread); waiters are woken through their own loop
    (:mod:`~playbook.providers.limits.waiters`), and every loop with calls queued keeps a timer of its own,
    so the queue moves on while any of them runs.  (Times read on different loops compare: an
    asyncio loop's clock is ``time.monotonic()``.)
    """

    __slots__ = (
        "pace",
        "budgets",
        "window",
        "allowance",
        "hold_until_t",
        "in_flight",
        "_lock",
        "_waiters",
        "_queued",
        "_queued_out",
        "_loops",
    )

    def __init__(
        self,
        rate: float | None = None,
        burst: int | None = None,
        concurrency: int | None = None,
        tokens: float | Rates | None = None,
        allowance: tuple[int, float] | None = None,
    ) -> None:
        self.pace = Pace(rate, burst)
        rates = tokens if isinstance(tokens, Rates) else Rates(tokens)
        # None while no budget is known: a call then costs no more than it did before budgets
        self.budgets = Budgets(rates) if rates != Rates() else None
        self.window = Window(concurrency)
        self.allowance = Allowance(*allowance) if allowance is not None else Allowance()
        self.hold_until_t = 0.0  # loop clock
        self.in_flight = 0  # calls on the wire
        self._lock = threading.Lock()
        # (slot, weight), in order, on any loop
        self._waiters: deque[tuple[asyncio.Future[bool], float]] = deque()
        self._queued = self._queued_out = 0.0  # the waiters' weights (and their output tokens), summed
        self._loops: dict[asyncio.AbstractEventLoop, _Timer] = {}  # each loop with waiters: its timer

    def __repr__(self) -> str:
        tokens = f" {self.budgets!r}" if self.budgets is not None else ""
        limits = f"{self.pace!r}{tokens} {self.window!r} {self.allowance!r}"
        return f"<LocalLimiter {limits} on_wire={self.in_flight} hold_until_t={self.hold_until_t:.3f}>"

    @property
    def rate(self) -> float | None:
        return self.pace.rate

    @property
    def in_flight_limit(self) -> int | None:
        return self.window.known_limit

    @property
    def ceiling(self) -> float | None:
        return self.pace.ceiling

    @property
    def token_rate(self) -> float | None:
        return self.token_rates.tokens

    @property
    def token_rates(self) -> Rates:
        return self.budgets.rates if self.budgets is not None else Rates()

    def expected_wait(self, weight: float) -> float:
        loop = here()
        if loop is None or (
            self.pace.rate is None and self.budgets is None and not self.allowance.configured
        ):
            return 0.0
        with self._lock:
            wait = self._delay(loop.time(), weight)
            if self._waiters:  # the queue ahead goes first
                if self.pace.rate is not None:
                    wait += len(self._waiters) / self.pace.rate
                if self.budgets is not None:
                    wait += self.budgets.behind(self._queued, self._queued_out)
        return wait

    def turn_away(self) -> None:
        with self._lock:
            kicked = self.window.kick() + self._unqueue_all()
        wake_all(kicked, False)

    def learn(self, requests: float | None, tokens: float | Rates | None) -> bool:
        rates = tokens if isinstance(tokens, Rates) else Rates(tokens)
        with self._lock:
            changed = requests is not None and self.pace.learn(requests)
            if rates != Rates():
                if self.budgets is None:
                    self.budgets = Budgets(rates)
                    changed = True
                elif self.budgets.learn(rates):
                    changed = True
        if changed:
            self._rearm()
        return changed

    async def acquire(self, weight: float = 1.0, patience: float = math.inf) -> Permit | None:
        # ``patience``: the governor asked expected_wait() first, which this queue answers exactly.
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.window.enter():
                now = loop.time()
                if self._due(now, weight):
                    self._take(now, weight)
                    return self._sent(weight, now)
                turn = None
            else:
                turn = loop.create_future()
                self.window.wait(turn)
        if turn is not None and not await self._gate(turn):
            return None  # a hold arrived while this call waited at the gate
        return await self._paced(loop, weight)

    async def settle(self, permit: Permit, actual: float | None = None, left: Rates | None = None) -> bool:
        if permit.done:
            return False
        now = asyncio.get_running_loop().time()
        rearm = False
        with self._lock:
            if not self._landed(permit):
                return False
            if self.budgets is not None and permit.weighed:
                if actual is not None:
                    # a call that used fewer tokens than charged lets the next one go sooner
                    rearm = self.budgets.charge(permit.weight, actual, permit.sent_at)
                else:
                    self.budgets.unhold(permit.weight)
            if self.budgets is not None and left is not None:
                # after this call's own charge: the provider's word counts it already
                rearm = self.budgets.fill(now, left) or rearm
            if actual is not None:
                permit.weight = counted(permit.weight, actual)  # as its provider counts it
            self.window.release()
            grew = self.window.success(permit.level, now, permit.sent_at)
            if self.pace.success(now):
                rearm = grew = True
            self.allowance.let_in(permit.sent_at)
            self.window.single(self.allowance.single_file())
            handed = self.window.handed()
        if handed:
            self._let_in(handed)
        if rearm:
            self._rearm()
        return grew

    async def refused(
        self, permit: Permit, *, hinted: bool, short: bool = False, coarse: bool = False
    ) -> Verdict:
        now = asyncio.get_running_loop().time()
        with self._lock:
            if not self._landed(permit):
                return Verdict.NOTED
            verdict, rearm = Verdict.NOTED, self._drop(permit)
            lone = self.pace.lone(now, coarse=coarse)  # every refusal counts towards the next judgement
            ends = hinted and self.allowance.ends(permit.sent_at)  # a learnt window's end: its hint holds
            if ends:
                pass  # no word on the rate nor on calls in flight
            elif permit.level and self.window.refused(permit.level, now, hinted=hinted):
                verdict = Verdict.LOWERED
            elif short and lone:
                verdict = Verdict.LONE
            elif not (hinted and self.budgets is not None):
                # else a token limit's refusal, most likely: its hold says when
                cut = self.pace.limited(now, permit.sent_at, pending=self.in_flight)
                verdict, rearm = (Verdict.LOWERED if cut else Verdict.NOTED), rearm or cut
            if ends or (hinted and not short and verdict is not Verdict.LONE):
                # a window's end, most likely: what did it let in?
                self.allowance.refused(permit.sent_at)
                self.window.single(self.allowance.single_file())
            self.window.release()
            handed = self.window.handed()
        if handed:
            self._let_in(handed)
        if rearm:
            self._rearm()
        return verdict

    async def busy(self, permit: Permit) -> bool:
        now = asyncio.get_running_loop().time()
        with self._lock:
            if not self._landed(permit):
                return False
            rearm = self._drop(permit)
            bounded = bool(permit.level) and self.window.busy(permit.level, self.in_flight, now)
            self.window.release()
            handed = self.window.handed()
        self._let_in(handed)
        if rearm:
            self._rearm()
        return bounded

    async def release(self, permit: Permit) -> None:
        with self._lock:
            if not self._landed(permit):
                return
            rearm = self._drop(permit)
            self.window.release()
            handed = self.window.handed()
        self._let_in(handed)
        if rearm:
            self._rearm()

    async def hold(self, until: float) -> float:
        now = asyncio.get_running_loop().time()
        with self._lock:
            if until <= self.hold_until_t:
                return self.hold_until_t
            self.hold_until_t = until
            self.pace.hold(until, now)
            # Calls waiting for their turn or their slot learn of it now, not when it ends: each
            # goes back to its governor, which parks its row, suspends it or waits, by its budget.
            if until <= now:
                return until
            kicked = self.window.kick() + self._unqueue_all()
        wake_all(kicked, False)
        return until

    def _landed(self, permit: Permit) -> bool:
        """The call is off the wire; False when its permit was given back already."""
        landed = permit.land()
        self.in_flight -= landed
        return landed

    def _sent(self, weight: float, now: float) -> Permit:
        self.in_flight += 1
        return Permit(weight, self.in_flight, now, weighed=self.budgets is not None)

    def _drop(self, permit: Permit) -> bool:
        """Under the lock: a call ended with no answer; its reservation, if any, is given back."""
        return self.budgets is not None and permit.weighed and self.budgets.drop(permit.weight)

    # -- the gate ----------------------------------------------------------------------------

    async def _gate(self, turn: asyncio.Future[bool]) -> bool:
        """Wait at the gate: True once let in, False when a hold arrived first."""
        try:
            return await turn
        except BaseException:
            if turn.done() and not turn.cancelled() and turn.result():
                self._unhand()  # let in as it was cancelled: the room goes to the next
            raise

    def _unhand(self) -> None:
        with self._lock:
            self.window.release()
            handed = self.window.handed()
        self._let_in(handed)

    def _let_in(self, handed: list[asyncio.Future[bool]]) -> None:
        if handed:
            wake_all(handed, True, self._unhand)

    # -- the paced queue ---------------------------------------------------------------------

    def _due(self, now: float, weight: float) -> bool:
        """Under the lock: may a call go now, with no one queued ahead of it?"""
        if self.pace.rate is None and self.budgets is None and not self.allowance.configured:
            return True
        return not self._waiters and self._delay(now, weight) <= 0

    def _delay(self, now: float, weight: float) -> float:
        """Seconds until a call of ``weight`` tokens has a request slot, room in the window and its tokens."""
        wait = max(self.pace.delay(now), self.allowance.delay(now))
        return wait if self.budgets is None else max(wait, self.budgets.delay(now, weight))

    def _take(self, now: float, weight: float, *, queued: bool = False) -> None:
        self.pace.take(now, queued=queued)
        self.allowance.take(now, self.hold_until_t)
        self.window.single(self.allowance.single_file())
        if self.budgets is not None:
            self.budgets.take(now, weight, queued=queued)

    async def _paced(self, loop: asyncio.AbstractEventLoop, weight: float) -> Permit | None:
        """Past the gate (its room counted): wait for a slot at the current rate (and for the
        call's tokens); None when a hold arrived first."""
        slot: asyncio.Future[bool] | None = None
        try:
            with self._lock:
                now = loop.time()
                if self.hold_until_t <= now:  # else set while this call waited at the gate
                    if self._due(now, weight):
                        self._take(now, weight)
                        return self._sent(weight, now)
                    slot = loop.create_future()
                    self._queue(loop, now, slot, weight)
            if slot is not None and await slot:
                with self._lock:
                    now = loop.time()
                    if self.hold_until_t <= now:
                        return self._sent(weight, now)
        except BaseException:
            if slot is not None:
                self._unqueue(slot, weight)
            self._unhand()
            raise
        self._unhand()
        return None

    def _unqueue(self, slot: asyncio.Future[bool], weight: float) -> None:
        """A call cancelled in the queue leaves it now: left there, it would count in
        :meth:`expected_wait` until a timer let it out (and its loop may never run one again)."""
        with self._lock:
            try:
                self._waiters.remove((slot, weight))
            except ValueError:
                return  # let out or sent back already
            self._count_queued(weight, -1)
            self._gone(slot.get_loop())

    def _queue(
        self, loop: asyncio.AbstractEventLoop, now: float, slot: asyncio.Future[bool], weight: float
    ) -> None:
        """Under the lock: queue ``slot``; its loop's timer lets the queue out when the first slot
        is due (sooner than it was armed for, if the schedule moved up)."""
        self._waiters.append((slot, weight))
        self._count_queued(weight, 1)
        timer = self._loops.get(loop)
        if timer is None:
            self._loops[loop] = timer = _Timer(loop)
        timer.count += 1
        timer.arm(now + self._delay(now, self._waiters[0][1]), self._release)

    def _release(self, timer: _Timer) -> None:
        """A loop's timer fired: let out every call whose slot is due, on whichever loop."""
        let_out: list[asyncio.Future[bool]] = []
        bounced: list[asyncio.Future[bool]] = []
        loop = timer.loop
        with self._lock:
            if self._loops.get(loop) is timer:
                timer.handle = None  # else it fired after its loop's last call left the queue: stale
            now, waiters = loop.time(), self._waiters
            while waiters and self._delay(now, waiters[0][1]) <= 0:
                slot, weight = waiters.popleft()
                self._count_queued(weight, -1)
                self._gone(slot.get_loop())
                if not slot.done():  # a cancelled waiter gives its turn to the next
                    self._take(now, weight, queued=True)
                    let_out.append(slot)
                    if self.allowance.single_file():
                        # past the window's allowance: back to the gate, one at a time
                        bounced = self._unqueue_all()
            if waiters and self._loops.get(loop) is timer:
                timer.arm(now + self._delay(now, waiters[0][1]), self._release)
        wake_all(let_out, True)
        wake_all(bounced, False)

    def _unqueue_all(self) -> list[asyncio.Future[bool]]:
        """Under the lock: empty the paced queue; its calls go back to their governors (a hold,
        or a window's allowance used up), which ask again."""
        sent_back = [slot for slot, _ in self._waiters if not slot.done()]
        self._waiters.clear()
        self._queued = self._queued_out = 0.0
        for timer in self._loops.values():
            timer.cancel()
        self._loops.clear()
        return sent_back

    def _count_queued(self, weight: float, sign: int) -> None:
        """Under the lock: a call of ``weight`` joined (1) or left (-1) the queue.  What it only
        reserves (given back when it is answered) keeps no one behind it waiting."""
        back = reserved(weight)
        self._queued += sign * (weight - back)
        self._queued_out += sign * (parts(weight)[1] - back)

    def _gone(self, loop: asyncio.AbstractEventLoop) -> None:
        """Under the lock: one of ``loop``'s calls left the queue."""
        timer = self._loops[loop]
        timer.count -= 1
        if not timer.count:
            del self._loops[loop]
            timer.cancel()

    def _rearm(self) -> None:
        """The rate changed: the next slot may be due sooner than the timers think."""
        current = here()
        with self._lock:
            timers = list(self._loops.values())
        for timer in timers:
            if timer.loop is current:
                self._rearm_here(timer)
            else:
                with contextlib.suppress(RuntimeError):  # a closed loop has no calls left to let out
                    timer.loop.call_soon_threadsafe(self._rearm_here, timer)

    def _rearm_here(self, timer: _Timer) -> None:
        with self._lock:
            if self._waiters and self._loops.get(timer.loop) is timer:
                now = timer.loop.time()
                timer.arm(now + self._delay(now, self._waiters[0][1]), self._release)


class _Timer:
    """One loop's part in the paced queue: how many of the queued calls wait on it, and the timer
    that lets the queue out from it.  Touched under the limiter's lock, its handle only from its
    own loop (another thread drops it instead; a stale firing lets out what is due, no more)."""

    __slots__ = ("loop", "count", "handle")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.count = 0
        self.handle: asyncio.TimerHandle | None = None

    def arm(self, due: float, release: Callable[[_Timer], None]) -> None:
        handle = self.handle
        if handle is not None:
            if handle.when() <= due + 1e-9:
                return
            handle.cancel()
        self.handle = self.loop.call_at(due, release, self)

    def cancel(self) -> None:
        if self.handle is not None and self.loop is here():
            self.handle.cancel()
        self.handle = None
