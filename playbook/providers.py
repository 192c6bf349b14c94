"""Providers: one per upstream account, the unit of concurrency, rate limits and holds.

A :class:`Provider` is a frozen description (name, limits, account, how long rows may wait, where
its limits are shared); what happens to its calls lives in its :class:`~playbook.governor.Governor`,
acting over a :class:`~playbook.limits.Limiter`: a local one, or with ``shared="redis://..."`` one
whose rate, calls in flight and holds every process and machine on that account shares.
"""

from __future__ import annotations

import contextvars
import math
import numbers
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np

from .errors import PlayDefinitionError
from .governor import IN_PLACE, Governor, Ticket
from .limits import HEADROOM, Health, Limiter, LocalLimiter
from .urls import masked

__all__ = ["HEADROOM", "IN_PLACE", "Provider", "Ticket", "sharing_limits"]

T = TypeVar("T")

_CONFIG = frozenset({"name", "rps", "rpm", "burst", "window", "concurrency", "tpm", "account", "max_wait", "retries", "shared", "governor"})
_SCHEMES = ("redis", "rediss", "unix")
# While set, a provider pickled without shared= travels as one whose limits are shared there (a
# cluster run: every worker is another process, and one account has one rate, not one per worker).
_SHARE_AT: contextvars.ContextVar[str | None] = contextvars.ContextVar("playbook_share_limits_at", default=None)
_made: dict[tuple[Any, ...], Provider] = {}  # what unpickling made in this process, by description
_making = threading.Lock()


@contextmanager
def sharing_limits(url: str) -> Iterator[None]:
    """Providers pickled in this block without ``shared=`` arrive with ``shared=url``."""
    token = _SHARE_AT.set(url)
    try:
        yield
    finally:
        _SHARE_AT.reset(token)


def _provider(name: str, options: tuple[tuple[str, Any], ...]) -> Provider:
    """The provider a pickle describes: one per description in each process, so the tasks of a
    worker process share one governor (its calls in flight, its hold) as a kernel's rows do."""
    key = (name, options)
    with _making:
        made = _made.get(key)
        if made is None:
            made = _made[key] = Provider(name, **dict(options))
    return made


def _check(name: str, option: str, value: Any, *, integer: bool = False, zero: bool = False, optional: bool = True) -> Any:
    """``value`` as a plain int or float (a numpy number too: a frame's column gives those), or a
    PlayDefinitionError naming the option."""
    if value is None and optional:
        return None
    kind = numbers.Integral if integer else numbers.Real
    if (
        not isinstance(value, kind)
        or isinstance(value, (bool, np.bool_))
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        what = "whole number" if integer else "finite number"
        bound = ">= 0" if zero else "> 0"
        none = " or None" if optional else " (waiting and retrying are always bounded)" if option in ("max_wait", "retries") else ""
        raise PlayDefinitionError(f"Provider {name!r}: {option} must be a {what} {bound}{none}, not {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _check_window(name: str, window: object) -> tuple[int, float] | None:
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise PlayDefinitionError(
            f"Provider {name!r}: window must be (calls, seconds), e.g. window=(50, 5) for 50 calls per 5 seconds, or None, not {window!r}"
        )
    calls, seconds = window
    return _check(name, "window's calls", calls, integer=True, optional=False), _check(name, "window's seconds", seconds, optional=False)


def _check_shared(name: str, shared: object) -> None:
    if shared is None:
        return
    if not isinstance(shared, str) or urlsplit(shared).scheme not in _SCHEMES:
        raise PlayDefinitionError(
            f"Provider {name!r}: shared must be a Redis URL such as 'redis://host:6379/0' (or None: limits "
            f"in this process only), not {shared!r}"
        )


class Provider:
    """An upstream account: ``pb.Provider("acme", rps=20, concurrency=8)``.

    ``rps`` (or ``rpm``, the same per minute, as LLM providers publish it) and ``burst`` pace the
    calls, at 98% of the rate (without either the rate is discovered from 429s, or read from the
    ``x-ratelimit-limit-*`` headers of an LLM provider's answers); ``concurrency`` bounds calls in
    flight; ``tpm`` is tokens per minute: an LLM tool's calls are weighed by their estimated tokens,
    paced evenly (never a minute's worth at once), and charged their real usage when answered;
    ``window=(50, 5)`` is a limit counted per window of time (50 calls per 5 seconds): no span
    of 5 s sees more than 50 calls, and a window's whole allowance goes at once (without it, an
    allowance is learnt from the refusals that say when a window ends);
    ``retries`` bounds retries of transient failures; ``max_wait`` (seconds) is how long a row may
    wait on this provider's holds (and on the probes of a provider that is down) before it parks.  ``shared="redis://host:6379/0"``: rate,
    calls in flight and holds are shared by every process and machine naming this provider and
    ``account`` at that Redis (a Redis out of reach counts as the provider being down).

    The options are frozen; the live state (rate, holds, health, counters) is the ``governor``'s.
    It is the process's: threads that each run a blocking ``map()`` (each on an event loop of
    its own) share one rate, one bound on calls in flight and one hold.
    """

    __slots__ = tuple(sorted(_CONFIG))

    name: str
    rps: float | None
    rpm: float | None
    burst: int | None
    window: tuple[int, float] | None
    concurrency: int | None
    tpm: float | None
    account: str
    max_wait: float
    retries: int
    shared: str | None
    governor: Governor

    def __init__(
        self,
        name: str,
        *,
        rps: float | None = None,
        rpm: float | None = None,
        burst: int | None = None,
        window: tuple[int, float] | None = None,
        concurrency: int | None = None,
        tpm: float | None = None,
        account: str = "default",
        max_wait: float = 120.0,
        retries: int = 4,
        shared: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise PlayDefinitionError(f"Provider name must be a non-empty string, not {name!r}")
        rps, rpm, tpm = (_check(name, option, value) for option, value in (("rps", rps), ("rpm", rpm), ("tpm", tpm)))
        if rps is not None and rpm is not None:
            raise PlayDefinitionError(f"Provider {name!r}: give rps or rpm, not both (rps={rps!r}, rpm={rpm!r}): rpm is rps * 60")
        burst, concurrency = _check(name, "burst", burst, integer=True), _check(name, "concurrency", concurrency, integer=True)
        max_wait = _check(name, "max_wait", max_wait, zero=True, optional=False)
        retries = _check(name, "retries", retries, integer=True, zero=True, optional=False)
        if not isinstance(account, str) or not account:
            raise PlayDefinitionError(f"Provider {name!r}: account must be a non-empty string, not {account!r}")
        _check_shared(name, shared)
        config: dict[str, Any] = {
            "name": name, "rps": rps if rpm is None else rpm / 60.0, "rpm": rpm, "burst": burst,
            "window": _check_window(name, window), "concurrency": concurrency,
            "tpm": tpm, "max_wait": float(max_wait), "retries": retries, "shared": shared,
            # The account's identity: receipts are keyed by it, and shared limits live under it.
            "account": f"{name}:{account}",
        }  # fmt: skip
        for option, value in config.items():
            object.__setattr__(self, option, value)
        object.__setattr__(self, "governor", Governor(self, self._limiter()))

    def _limiter(self) -> Limiter:
        rate = self.rps * HEADROOM if self.rps is not None else None
        tokens = self.tpm / 60.0 * HEADROOM if self.tpm is not None else None
        if self.shared is None:
            return LocalLimiter(rate, self.burst, self.concurrency, tokens, self.window)
        from .limits.shared import RedisLimiter  # imports redis: only when limits are shared

        return RedisLimiter(
            self.shared, self.account, provider=self.name, rate=rate, burst=self.burst, concurrency=self.concurrency, tokens=tokens,
            window=self.window,
        )  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        """Its description travels, never its live state (rate, holds, counters, connections)."""
        options: dict[str, Any] = {
            "rps": self.rps if self.rpm is None else None, "rpm": self.rpm, "burst": self.burst, "window": self.window,
            "concurrency": self.concurrency,
            "tpm": self.tpm, "account": self.account.split(":", 1)[1], "max_wait": self.max_wait, "retries": self.retries,
            "shared": self.shared if self.shared is not None else _SHARE_AT.get(),
        }  # fmt: skip
        return (_provider, (self.name, tuple(sorted(options.items()))))

    def __setattr__(self, option: str, value: object) -> None:
        if option in _CONFIG:
            raise AttributeError(f"Provider {self.name!r} is a frozen description: {option} cannot change (make a new Provider)")
        object.__setattr__(self, option, value)

    def __repr__(self) -> str:
        given = ("rpm" if self.rpm is not None else "rps", "burst", "window", "concurrency", "tpm")
        limits = [f"{k}={getattr(self, k)!r}" for k in given if getattr(self, k) is not None]
        if self.shared is not None:
            limits.append(f"shared={masked(self.shared)}")
        rate = "unlimited" if self.rate is None else f"{self.rate:.3g}/s"
        window = self.in_flight_limit
        found = f" in_flight_limit={window}" if window is not None and window != self.concurrency else ""
        state = f" down ({self.down_error})" if self.down else f" held until {_time_of_day(self.hold_wall)}" if self.held else ""
        head = " ".join([repr(self.name), *limits])
        return f"<Provider {head} rate={rate}{found} in_flight={self.in_flight} 429s={self.refused}{state}>"

    # -- what the runtime, tools and views use -------------------------------------------------

    async def dispatch(self, send: Callable[[], Awaitable[T]], ticket: Ticket | None = None, *, weight: float = 1.0) -> T:
        """Send one call through the governor: down, hold, permit, send; retry what may be retried."""
        return await self.governor.dispatch(send, ticket, weight=weight)

    def subscribe(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``listener(event)`` on hold set / lifted, rate changes, down and up; returns an
        unsubscribe.  Subscribed on a running loop, the listener is called on that loop, whichever
        thread's call the event comes from."""
        return self.governor.subscribe(listener)

    @property
    def limiter(self) -> Limiter:
        return self.governor.limiter

    @property
    def health(self) -> Health:
        return self.governor.health

    @property
    def rate(self) -> float | None:
        """The current sending rate (calls per second); ``None`` while unlimited."""
        return self.governor.limiter.rate

    @property
    def tokens_per_minute(self) -> tuple[float, float | None]:
        """Tokens answered over the last minute, and the token limit per minute (``tpm``, or the
        one the provider announced; ``None``: no token limit)."""
        return self.governor.tokens_per_minute()

    @property
    def in_flight_limit(self) -> int | None:
        """Calls in flight it allows now: ``concurrency``, or the window discovered from 429s that
        track calls in flight; ``None`` while no limit is known."""
        return self.governor.limiter.in_flight_limit

    @property
    def in_flight(self) -> int:
        """This process's calls on the wire."""
        return self.governor.limiter.in_flight

    @property
    def down(self) -> bool:
        """True while the provider refuses connections or keeps failing: rows that need it park
        ("down") and one probe call at a time tests whether it is back."""
        return self.governor.health.down

    @property
    def held(self) -> bool:
        """True while a hold the provider asked for is in force."""
        return self.governor.held

    @property
    def hold_until(self) -> float:
        """The hold's end on the running loop's clock (0.0: none yet)."""
        return self.governor.limiter.hold_until

    @property
    def hold_wall(self) -> float:
        """The hold's end in epoch seconds."""
        return self.governor.hold_wall

    @property
    def last_status(self) -> int | None:
        return self.governor.last_status

    @property
    def sent(self) -> int:
        """Requests this process sent."""
        return self.governor.sent

    @property
    def refused(self) -> int:
        """429s this process got."""
        return self.governor.refused

    @property
    def failed(self) -> int:
        """Transient failures (5xx, timeouts, connection errors) this process met."""
        return self.governor.failed

    @property
    def down_error(self) -> str | None:
        """The failure that took it down, in words."""
        return self.governor.down_error

    @down_error.setter
    def down_error(self, value: str | None) -> None:
        self.governor.down_error = value

    @property
    def probe_at(self) -> float:
        """Epoch seconds: when the next probe may go while down."""
        return self.governor.probe_at

    @probe_at.setter
    def probe_at(self, value: float) -> None:
        self.governor.probe_at = value


def _time_of_day(wall: float) -> str:
    from .models import time_of_day

    return time_of_day(wall)
