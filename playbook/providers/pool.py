"""A pool of keys behind one provider:
``pb.Provider("openai", keys=[pb.secret("KEY_A"), pb.secret("KEY_B")])``.

Each key is a :class:`~playbook.providers.governor.Governor` of its own (a *lane*): its limiter
(rate, tokens, calls in flight, holds), its health, its counters.  The :class:`Pool` stands where
a provider's single governor would, with the same surface (dispatch, subscribe, learn, down...)::

    choose ── the key with the most room now: the shortest wait for a hold, this call's own
       │      backoff on it, a probe or a rate slot (a key's rate is shared with the calls already
       │      sent its way), then the fewest calls in flight for what it allows, then in turn
    send   ── through that key's governor, with that key as the tool's secret (:func:`chosen_key`);
       │      a call that would wait there while another key could take it sooner moves to that
       │      key (:meth:`Pool.elsewhere`), keeping its tries and its wait budget
    401/402/403 ── the key is refused (or a RunFatal ``denied`` otherwise, as Gemini's 400
       │      API_KEY_INVALID): it retires for the run (the next run tries it again) and
              the call goes on under another; RunFatal only when every key is refused

What a run hears is the provider's: held while every key is held (until the first comes back),
down while every key is down, its rate the keys' sum, and a :class:`~playbook.events.KeyRetired`
when a key retires.  ``status().keys`` has one line per key.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from playbook._internal.flow import WaitBudget
from playbook.errors import RunFatal
from playbook.events import (
    KeyRetired,
    ProviderDown,
    ProviderHoldLifted,
    ProviderHoldSet,
    ProviderUp,
    RateChanged,
)
from playbook.providers.governor import Elsewhere, Governor
from playbook.providers.limits import Announced, Limiter
from playbook.providers.limits.waiters import Listeners
from playbook.providers.status import ProviderStatus, merge_budgets
from playbook.providers.ticket import Described, Ticket

if TYPE_CHECKING:
    from playbook.secrets import Secret

__all__ = ["Elsewhere", "Lane", "Pool", "chosen_key", "chosen_label", "key_label"]

T = TypeVar("T")

_REFUSED = frozenset({401, 402, 403})
_SOONER = 0.05  # seconds: a key must be at least this much sooner to move a waiting call to it
# The key the call being sent goes under (set by Pool.dispatch around its governor's send).
_CHOSEN: contextvars.ContextVar[Lane | None] = contextvars.ContextVar("playbook_chosen_key", default=None)


def chosen_key() -> Secret | None:
    """The key of a pooled provider this call is being sent under (None: no pool sends it)."""
    lane = _CHOSEN.get()
    return lane.secret if lane is not None else None


def chosen_label() -> str | None:
    """How people see the key this call is being sent under (:func:`key_label`); None: no pool."""
    lane = _CHOSEN.get()
    return lane.label if lane is not None else None


def key_label(secret: Secret) -> str:
    """A key as people see it: its variable and its last four characters (``OPENAI_KEY_A …B7f2``);
    a short value, or one not set here, shows as its variable alone."""
    if not secret.is_set():
        return secret.env_var
    value = secret.reveal()
    return f"{secret.env_var} …{value[-4:]}" if len(value) >= 12 else secret.env_var


class _Aboard:
    """What a pool keeps of one call (``Ticket.lanes``): the key it is under, and the backoff it
    earned under each key it left."""

    __slots__ = ("on", "backoffs")

    def __init__(self, on: int) -> None:
        self.on = on
        self.backoffs: dict[int, float] = {}


class Lane:
    """One key of a pool: its secret, its governor, and whether it was refused this run."""

    __slots__ = ("index", "secret", "governor", "routed", "_label")

    def __init__(self, index: int, secret: Secret, governor: Governor) -> None:
        self.index = index
        self.secret = secret
        self.governor = governor
        self.routed = 0  # calls sent its way that have not come back
        self._label: str | None = None

    @property
    def retired(self) -> str | None:
        """Why it is out of the pool for this run (None: in use)."""
        return self.governor.retired

    @retired.setter
    def retired(self, why: str | None) -> None:
        self.governor.retired = why

    @property
    def label(self) -> str:
        if self._label is None:
            if not self.secret.is_set():
                return self.secret.env_var  # said with its value's last characters once it is set
            self._label = key_label(self.secret)
        return self._label

    def __repr__(self) -> str:
        state = f" retired ({self.retired})" if self.retired else ""
        return f"<Lane {self.secret.env_var}{state} {self.governor!r}>"


class Pool:
    """The live state of a provider with several keys, in this process."""

    __slots__ = ("provider", "lanes", "_turn", "_listeners", "_held", "_down", "__weakref__")

    def __init__(
        self, provider: Described, keys: Sequence[tuple[Secret, Limiter, tuple[int, float] | None]]
    ) -> None:
        self.provider = provider
        self.lanes = tuple(
            Lane(i, secret, Governor(provider, limiter, window))
            for i, (secret, limiter, window) in enumerate(keys)
        )
        self._turn = 0  # the lane a tie goes to next
        self._listeners = Listeners()
        self._held = self._down = False  # as last told: every key held, every key down
        for lane in self.lanes:
            lane.governor.elsewhere = self.elsewhere
            lane.governor.subscribe(self._heard, anywhere=True)

    def __repr__(self) -> str:
        return f"<Pool {self.name!r} {len(self.lanes)} keys, {len(self.active())} in use>"

    @property
    def name(self) -> str:
        return self.provider.name

    def active(self) -> list[Lane]:
        return [lane for lane in self.lanes if lane.retired is None]

    # -- what the runtime reads of a governor ------------------------------------------------

    @property
    def down(self) -> bool:
        active = self.active()
        return bool(active) and all(lane.governor.down for lane in active)

    @property
    def probe_t(self) -> float:
        return min((lane.governor.probe_t for lane in self.active()), default=-math.inf)

    @property
    def held(self) -> bool:
        active = self.active()
        return bool(active) and all(lane.governor.held for lane in active)

    def retest(self) -> None:
        """A run starts (it has just subscribed): a down key is tried again at once, and every key
        is in the pool again (a refused one may have been renewed), unless another run in this
        process is still using the pool (a Dask worker's next partition while the last one runs):
        a key refused under it stays out, not refused once more by each run that starts."""
        for lane in self.lanes:
            lane.governor.retest()
        if len(self._listeners) > 1:
            return
        for lane in self.lanes:
            lane.retired = None
        seen: dict[str, Lane] = {}
        for lane in self.lanes:  # one key named by two variables is one key's budget, not two
            if lane.secret.is_set() and (first := seen.setdefault(lane.secret.reveal(), lane)) is not lane:
                self._retire(lane, f"the same key as {first.secret.env_var}", None)

    def subscribe(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        return self._listeners.add(listener)

    def learn(self, limits: Announced) -> None:
        """A key's answer announced its limits: they are that key's."""
        lane = _CHOSEN.get()
        if lane is not None and lane in self.lanes:
            lane.governor.learn(limits)

    # -- the call ------------------------------------------------------------------------------

    async def dispatch(
        self, send: Callable[[], Awaitable[T]], ticket: Ticket | None = None, *, weight: float = 1.0
    ) -> T:
        """Send one call under the key with the most room; move it when that key holds it, retire
        a key that is refused, and wait (or park) only when every key would make it wait."""
        if ticket is None:
            ticket = Ticket("", WaitBudget(self.provider.max_wait), suspend=False)
        if ticket.weight is not None:
            weight = ticket.weight
        while True:
            lane = self._choose(ticket, weight)
            if not lane.secret.is_set():  # a worker without this key's variable: the others carry its calls
                self._retire(lane, "its variable is not set here", None)
                continue
            self._board(ticket, lane)
            lane.routed += 1
            token = _CHOSEN.set(lane)
            try:
                return await lane.governor.dispatch(send, ticket, weight=weight)
            except Elsewhere:
                continue
            except RunFatal as exc:
                if exc.status not in _REFUSED and not exc.denied:
                    raise
                # Raises when no key is left (a call out when its key retired goes on too).
                why = (
                    f"HTTP {exc.status}" if exc.status in _REFUSED else f"HTTP {exc.status}: the key refused"
                )
                self._retire(lane, why, exc)
            finally:
                lane.routed -= 1
                _CHOSEN.reset(token)

    def elsewhere(self, governor: Governor, ticket: Ticket, wait: float) -> None:
        """A call would wait ``wait`` seconds on ``governor``'s key: raise :class:`Elsewhere` when
        another key could take it sooner (its own backoff on this key is kept for a return)."""
        if len(self.lanes) < 2:
            return
        now = asyncio.get_running_loop().time()
        here = next(lane for lane in self.lanes if lane.governor is governor)
        weight = ticket.weight if ticket.weight is not None else 1.0
        sooner = min(
            (self._wait(lane, ticket, weight, now) for lane in self.active() if lane is not here),
            default=math.inf,
        )
        if sooner + _SOONER < wait:
            raise Elsewhere

    def _choose(self, ticket: Ticket, weight: float) -> Lane:
        active = self.active()
        if not active:  # every key retired while this call waited: the run is stopping
            raise self._none_left(None)
        if len(active) == 1:
            return active[0]
        now = asyncio.get_running_loop().time()
        n = len(self.lanes)
        best: tuple[float, int, float] | None = None
        chosen = active[0]
        for step in range(n):
            lane = self.lanes[(self._turn + step) % n]
            if lane.retired is not None:
                continue
            gov = lane.governor
            limit = gov.limiter.in_flight_limit
            room = (
                round(self._wait(lane, ticket, weight, now), 3),
                int(gov.down),
                lane.routed / limit if limit else 0.0,
            )
            if best is None or room < best:
                best, chosen = room, lane
        self._turn = (chosen.index + 1) % n
        return chosen

    def _wait(self, lane: Lane, ticket: Ticket, weight: float, now: float) -> float:
        """Seconds before ``lane`` could send this call: its hold, the call's own backoff on it,
        its next probe while down, its rate slot behind the calls already sent its way."""
        gov = lane.governor
        limiter = gov.limiter
        aboard = ticket.lanes
        backoff = (
            0.0
            if aboard is None
            else ticket.not_before
            if aboard.on == lane.index
            else aboard.backoffs.get(lane.index, 0.0)
        )
        wait = max(limiter.hold_until_t, backoff) - now
        health = gov.health
        if health.down:
            wait = max(wait, 1.0 if health.probing else health.probe_t - now)
        wait = max(wait, limiter.expected_wait(weight))
        rate = limiter.rate
        if rate:
            wait = max(wait, lane.routed / rate)
        return max(wait, 0.0)

    def _board(self, ticket: Ticket, lane: Lane) -> None:
        """The call goes under ``lane``: its backoff is the one it has there (a backoff earned on
        another key stays with that key)."""
        aboard = ticket.lanes
        if aboard is None:
            aboard = ticket.lanes = _Aboard(lane.index)
        elif aboard.on != lane.index:
            aboard.backoffs[aboard.on] = ticket.not_before
            ticket.not_before = aboard.backoffs.pop(lane.index, 0.0)
            aboard.on = lane.index

    def _retire(self, lane: Lane, why: str, exc: RunFatal | None) -> None:
        """``lane``'s key is out of the pool for this run (``why``).  RunFatal when none is left."""
        if lane.retired is None:
            lane.retired = why
            lane.governor.limiter.turn_away()  # calls waiting for its slots go under another key now
            self._listeners.tell(KeyRetired(self.name, lane.label, why, len(self.active())))
        if not self.active():
            raise self._none_left(exc) from exc

    def _none_left(self, exc: RunFatal | None) -> RunFatal:
        said = "; ".join(f"{lane.label}: {lane.retired}" for lane in self.lanes)
        status = exc.status if exc is not None else 401
        return RunFatal(
            f"provider {self.name!r}: no key is left to call with ({said})" + (f". {exc}" if exc else ""),
            status=status,
            denied=exc.denied if exc is not None else True,
        )

    # -- what the run hears --------------------------------------------------------------------

    def _heard(self, event: Any) -> None:
        """A key's event, told as the provider's: a hold or an outage only when it is every key's."""
        kind = type(event)
        if kind is RateChanged:
            now = self.status()
            self._listeners.tell(RateChanged(self.name, now.rate, now.in_flight_limit))
        elif kind is ProviderHoldSet:
            if self.held:
                self._held = True
                until = min(lane.governor.hold_until_at for lane in self.active())
                self._listeners.tell(ProviderHoldSet(self.name, until, event.status))
        elif kind is ProviderHoldLifted:
            if self._held and not self.held:
                self._held = False
                self._listeners.tell(ProviderHoldLifted(self.name))
        elif kind is ProviderDown:
            if self.down and not self._down:
                self._down = True
                self._listeners.tell(ProviderDown(self.name, event.error))
        elif kind is ProviderUp and self._down:
            self._down = False
            self._listeners.tell(ProviderUp(self.name))

    def status(self) -> ProviderStatus:
        """The provider as one line (the keys in use summed), with a line per key in ``keys``."""
        keys = tuple(lane.governor.status(lane.label, lane.retired) for lane in self.lanes)
        active = [s for lane, s in zip(self.lanes, keys, strict=True) if lane.retired is None]
        going = [s for s in active if not s.held] or active  # a key held for a day sends nothing meanwhile
        rates = [s.rate for s in going]
        limits = [s.in_flight_limit for s in going]
        tpms = [s.tpm for s in active]
        down, held = self.down, self.held
        probe = min((s.probe_at for s in active if s.probe_at), default=0.0)
        return ProviderStatus(
            name=self.name,
            down=down,
            down_error=next((s.down_error for s in active if s.down_error), None) if down else None,
            probe_at=probe if down else 0.0,
            held=held,
            hold_until_at=min((s.hold_until_at for s in active), default=0.0) if held else 0.0,
            last_status=next((s.last_status for s in keys if s.last_status is not None), None),
            rate=0.0 if not rates else None if None in rates else sum(r for r in rates if r is not None),
            in_flight_limit=None if not limits or None in limits else sum(x for x in limits if x is not None),
            in_flight=sum(s.in_flight for s in keys),
            refused=sum(s.refused for s in keys),
            tokens=sum(s.tokens for s in keys),
            tpm=None if not tpms or None in tpms else sum(t for t in tpms if t is not None),
            sent=sum(s.sent for s in keys),
            failed=sum(s.failed for s in keys),
            keys=keys,
            busiest=sum(s.busiest for s in keys),  # at most: each key's busiest second may be another
            budgets=merge_budgets([s.budgets for s in active]),
        )
