"""Providers: one per upstream account, the unit of concurrency, rate limits and holds.

A :class:`Provider` is a frozen description (name, limits, account, how long rows may wait, where
its limits are shared); what happens to its calls lives in its :class:`~playbook.providers.governor.Governor`,
acting over a :class:`~playbook.providers.limits.Limiter`: a local one, or with ``shared="redis://..."`` one
whose rate, calls in flight and holds every process and machine on that account shares.
"""

from __future__ import annotations

import contextvars
import math
import numbers
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from playbook._internal.urls import masked
from playbook.errors import PlayDefinitionError
from playbook.providers.governor import IN_PLACE, Governor, Ticket
from playbook.providers.limits import HEADROOM, Limiter, LocalLimiter, Rates
from playbook.providers.pool import Pool
from playbook.providers.status import ProviderStatus

if TYPE_CHECKING:
    from playbook.secrets import Secret

__all__ = [
    "HEADROOM",
    "IN_PLACE",
    "Provider",
    "ProviderStatus",
    "Ticket",
    "forget_governors",
    "governor",
    "sharing_limits",
]

_PER_KEY = (
    "rps",
    "rpm",
    "burst",
    "window",
    "concurrency",
    "tpm",
    "itpm",
    "otpm",
)  # limits a pool may give one per key
_CONFIG = frozenset({"name", *_PER_KEY, "account", "max_wait", "retries", "shared", "keys"})
_SCHEMES = ("redis", "rediss", "unix")
# While set, a provider pickled without shared= travels as one whose limits are shared there (a
# cluster run: every worker is another process, and one account has one rate, not one per worker).
_SHARE_AT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "playbook_share_limits_at", default=None
)
_made: dict[tuple[Any, ...], Provider] = {}  # what unpickling made in this process, by description
# The governor of each description made in this process (see Provider.__init__).
_governors: weakref.WeakValueDictionary[tuple[Any, ...], Governor | Pool] = weakref.WeakValueDictionary()
_making = threading.RLock()  # unpickling makes a Provider, which looks up its governor: both under it


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


def _check(
    name: str, option: str, value: Any, *, integer: bool = False, zero: bool = False, optional: bool = True
) -> Any:
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
        none = (
            " or None"
            if optional
            else " (waiting and retrying are always bounded)"
            if option in ("max_wait", "retries")
            else ""
        )
        raise PlayDefinitionError(
            f"Provider {name!r}: {option} must be a {what} {bound}{none}, not {value!r}"
        )
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _check_window(name: str, window: object) -> tuple[int, float] | None:
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise PlayDefinitionError(
            f"Provider {name!r}: window must be (calls, seconds), e.g. window=(50, 5) for 50 calls per 5 seconds, or None, not {window!r}"
        )
    calls, seconds = window
    return _check(name, "window's calls", calls, integer=True, optional=False), _check(
        name, "window's seconds", seconds, optional=False
    )


def _check_keys(name: str, keys: object) -> tuple[Secret, ...] | None:
    """``keys`` as a tuple of secrets, one per key of the account (None: the tools' own secrets)."""
    from playbook.secrets import Secret

    if keys is None:
        return None
    if isinstance(keys, Iterator):  # a generator of secrets
        keys = tuple(keys)
    if isinstance(keys, (str, bytes, Secret)) or not isinstance(keys, Sequence) or not keys:
        raise PlayDefinitionError(
            f"Provider {name!r}: keys must be a list of pb.secret('ENV_VAR'), one per key of the account, not {_shown(keys)}"
        )
    seen: dict[str, int] = {}
    for i, key in enumerate(keys):
        if not isinstance(key, Secret):
            raise PlayDefinitionError(
                f"Provider {name!r}: keys[{i}] must come from pb.secret('ENV_VAR') (a key is read from the environment "
                f"at call time, never written in the code), not {_shown(key)}"
            )
        if key.env_var in seen:
            raise PlayDefinitionError(
                f"Provider {name!r}: keys[{i}] names {key.env_var} again (it is keys[{seen[key.env_var]}])"
            )
        seen[key.env_var] = i
    return tuple(keys)


def _shown(value: object) -> str:
    """A bad option's value in an error, without a plain key written where a secret belongs."""
    if isinstance(value, str):
        return f"a plain string ({len(value)} characters)"
    if isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
        return f"a {type(value).__name__} of plain strings"
    return repr(value)


def _plain(value: Any) -> Any:
    """A NumPy array or a pandas or Polars Series as a list of its values; anything else as it is."""
    convert = (
        None if np.isscalar(value) else getattr(value, "tolist", None) or getattr(value, "to_list", None)
    )
    return value if convert is None else convert()


def _per_key(name: str, given: dict[str, Any], keys: tuple[Secret, ...] | None) -> list[dict[str, Any]]:
    """The limits each key has: a limit given as a list has one value per key, any other is every key's."""
    n = 1 if keys is None else len(keys)
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for option, value in given.items():
        value = given[option] = _plain(value)
        listed = isinstance(value, (list, tuple)) and (
            option != "window" or any(isinstance(v, (list, tuple)) or v is None for v in value)
        )
        if listed and keys is None:
            raise PlayDefinitionError(
                f"Provider {name!r}: {option} is a list ({value!r}), one per key, but no keys= were given"
            )
        if listed and len(value) != n:
            raise PlayDefinitionError(
                f"Provider {name!r}: {option} has {len(value)} values for {n} keys: give one per key, or one for all"
            )
        for i, one in enumerate(out):
            one[option] = value[i] if listed else value
    return out


def _limits(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """One key's limits, checked: its rate per second (from ``rps`` or ``rpm``), burst, window,
    calls in flight and tokens per minute (all, input and output)."""
    rps, rpm, tpm, itpm, otpm = (
        _check(name, option, given[option]) for option in ("rps", "rpm", "tpm", "itpm", "otpm")
    )
    return {
        "rps": rps if rpm is None else rpm / 60.0,
        "rpm": rpm,
        "tpm": tpm,
        "itpm": itpm,
        "otpm": otpm,
        "burst": _check(name, "burst", given["burst"], integer=True),
        "window": _check_window(name, given["window"]),
        "concurrency": _check(name, "concurrency", given["concurrency"], integer=True),
    }


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
    ``itpm`` and ``otpm`` are input and output tokens per minute, budgets apart (as Anthropic counts
    them; beside ``tpm``, which counts both): a call is charged its prompt against the one and,
    where the provider charges ``max_tokens`` when a request starts, its ``max_tokens`` against the
    other, given back when the answer says what it used.  Limits nobody configured are learnt from
    the headers of an LLM provider's answers (``x-ratelimit-limit-*``,
    ``anthropic-ratelimit-*-limit``);
    ``window=(50, 5)`` is a limit counted per window of time (50 calls per 5 seconds): no span
    of 5 s sees more than 50 calls, and a window's whole allowance goes at once (without it, an
    allowance is learnt from the refusals that say when a window ends);
    ``retries`` bounds retries of transient failures; ``max_wait`` (seconds) is how long a row may
    wait on this provider's holds (and on the probes of a provider that is down) before it parks.
    ``shared="redis://host:6379/0"``: rate, calls in flight and holds are shared by every process
    and machine naming this provider and ``account`` at that Redis (a Redis out of reach counts as
    the provider being down).  ``keys=[pb.secret("KEY_A"), pb.secret("KEY_B")]`` pools several keys
    of the account: each key has its own limits (a limit given as a list has one value per key),
    holds and health; a call goes under the key with the most room; a key refused with 401/402/403
    retires for the run (``RunFatal`` only when every key is); receipts do not depend on the key; an
    ``http_tool``'s ``{secret}`` and an ``llm_tool``'s bearer token are the chosen key (see
    docs/keys.md).

    The options are frozen; the live state (rate, holds, health, counters) is its governor's, and
    :meth:`status` shows it.  It is the process's: equal Providers (the same name, account and
    limits, made in two cells or unpickled) share one governor, and threads that each run a
    blocking ``map()`` (each on an event loop of its own) share one rate, one bound on calls in
    flight and one hold.  Providers of one account with different limits pace their calls apart.
    """

    __slots__ = (*sorted(_CONFIG), "_governor")

    name: str
    rps: float | None
    rpm: float | None
    burst: int | None
    window: tuple[int, float] | None
    concurrency: int | None
    tpm: float | None
    itpm: float | None
    otpm: float | None
    account: str
    max_wait: float
    retries: int
    shared: str | None
    keys: tuple[Secret, ...] | None
    _governor: Governor | Pool

    def __init__(
        self,
        name: str,
        *,
        rps: float | Sequence[float] | None = None,
        rpm: float | Sequence[float] | None = None,
        burst: int | Sequence[int] | None = None,
        window: tuple[int, float] | Sequence[tuple[int, float]] | None = None,
        concurrency: int | Sequence[int] | None = None,
        tpm: float | Sequence[float] | None = None,
        itpm: float | Sequence[float] | None = None,
        otpm: float | Sequence[float] | None = None,
        account: str = "default",
        max_wait: float = 120.0,
        retries: int = 4,
        shared: str | None = None,
        keys: Sequence[Secret] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise PlayDefinitionError(f"Provider name must be a non-empty string, not {name!r}")
        pool = _check_keys(name, keys)
        if rps is not None and rpm is not None:
            raise PlayDefinitionError(
                f"Provider {name!r}: give rps or rpm, not both (rps={rps!r}, rpm={rpm!r}): rpm is rps * 60"
            )
        for option, value in (("max_wait", max_wait), ("retries", retries)):
            if isinstance(_plain(value), (list, tuple)):
                raise PlayDefinitionError(
                    f"Provider {name!r}: {option} is the provider's, one number for all its keys, not {value!r}"
                )
        given = {
            "rps": rps,
            "rpm": rpm,
            "burst": burst,
            "window": window,
            "concurrency": concurrency,
            "tpm": tpm,
            "itpm": itpm,
            "otpm": otpm,
        }
        limits = [_limits(name, one) for one in _per_key(name, given, pool)]
        max_wait = _check(name, "max_wait", max_wait, zero=True, optional=False)
        retries = _check(name, "retries", retries, integer=True, zero=True, optional=False)
        if not isinstance(account, str) or not account:
            raise PlayDefinitionError(
                f"Provider {name!r}: account must be a non-empty string, not {account!r}"
            )
        _check_shared(name, shared)
        config: dict[str, Any] = {
            "name": name,
            "max_wait": float(max_wait),
            "retries": retries,
            "shared": shared,
            "keys": pool,
            # The account's identity: receipts are keyed by it (whichever key answered), and shared
            # limits live under it.
            "account": f"{name}:{account}",
        }
        for option in _PER_KEY:  # one value, or a tuple of one per key when the keys differ
            values = tuple(one[option] for one in limits)
            config[option] = values[0] if len(set(values)) == 1 else values
        for option, value in config.items():
            object.__setattr__(self, option, value)
        # One account, one description, one governor: equal Providers made in this process (two
        # cells, two tools, unpickled copies) share its rate, calls in flight and holds.
        key = self._description()
        with _making:
            found = _governors.get(key)
            if found is None:
                found = _governors[key] = self._governed(limits)
        object.__setattr__(self, "_governor", found)

    def _governed(self, limits: list[dict[str, Any]]) -> Governor | Pool:
        if self.keys is None:
            return Governor(self, self._limiter(limits[0], self.account), limits[0]["window"])
        # Each key's limits are its own, shared (with shared=) under the account and the key's variable.
        keys = zip(self.keys, limits, strict=True)
        return Pool(
            self,
            [(key, self._limiter(one, f"{self.account}/{key.env_var}"), one["window"]) for key, one in keys],
        )

    def _limiter(self, limits: dict[str, Any], account: str) -> Limiter:
        rps = limits["rps"]
        rate = rps * HEADROOM if rps is not None else None
        tokens = Rates(
            *(limits[k] / 60.0 * HEADROOM if limits[k] is not None else None for k in ("tpm", "itpm", "otpm"))
        )
        if self.shared is None:
            return LocalLimiter(rate, limits["burst"], limits["concurrency"], tokens, limits["window"])
        from playbook.providers.limits.shared import (
            RedisLimiter,  # imports redis: only when limits are shared
        )

        return RedisLimiter(
            self.shared,
            account,
            provider=self.name,
            rate=rate,
            burst=limits["burst"],
            concurrency=limits["concurrency"],
            tokens=tokens,
            window=limits["window"],
        )

    def _options(self, shared: str | None) -> tuple[tuple[str, Any], ...]:
        options: dict[str, Any] = {
            "rps": self.rps if self.rpm is None else None,
            "rpm": self.rpm,
            "burst": self.burst,
            "window": self.window,
            "concurrency": self.concurrency,
            "tpm": self.tpm,
            "itpm": self.itpm,
            "otpm": self.otpm,
            "account": self.account.split(":", 1)[1],
            "max_wait": self.max_wait,
            "retries": self.retries,
            "shared": shared,
            "keys": self.keys,
        }
        return tuple(sorted(options.items()))

    def _description(self) -> tuple[Any, ...]:
        return (self.name, self._options(self.shared))

    def __reduce__(self) -> tuple[Any, ...]:
        """Its description travels, never its live state (rate, holds, counters, connections)."""
        return (
            _provider,
            (self.name, self._options(self.shared if self.shared is not None else _SHARE_AT.get())),
        )

    def __setattr__(self, option: str, value: object) -> None:
        if option in _CONFIG:
            raise AttributeError(
                f"Provider {self.name!r} is a frozen description: {option} cannot change (make a new Provider)"
            )
        object.__setattr__(self, option, value)

    def __repr__(self) -> str:
        given = (
            "rpm" if self.rpm is not None else "rps",
            "burst",
            "window",
            "concurrency",
            "tpm",
            "itpm",
            "otpm",
        )
        limits = [f"{k}={getattr(self, k)!r}" for k in given if getattr(self, k) is not None]
        if self.keys is not None:
            limits.append(f"keys={len(self.keys)}")
        if self.shared is not None:
            limits.append(f"shared={masked(self.shared)}")
        now = self.status()
        rate = "unlimited" if now.rate is None else f"{now.rate:.3g}/s"
        window = now.in_flight_limit
        found = f" in_flight_limit={window}" if window is not None and window != self.concurrency else ""
        state = (
            f" down ({now.down_error})"
            if now.down
            else f" held until {_time_of_day(now.hold_until_at)}"
            if now.held
            else ""
        )
        head = " ".join([repr(self.name), *limits])
        return f"<Provider {head} rate={rate}{found} in_flight={now.in_flight} 429s={now.refused}{state}>"

    def status(self) -> ProviderStatus:
        """The provider's state now, in this process: its rate, calls in flight, hold, health and
        counters (times in epoch seconds).  A snapshot: it does not change after it is taken."""
        return self._governor.status()


def governor(provider: Provider) -> Governor | Pool:
    """The live state acting on ``provider``'s description (shared by every equal description in
    this process): what the runtime sends calls through and listens to."""
    return provider._governor


def forget_governors() -> None:
    """Equal descriptions made from now on get a governor of their own (for tests: no hold or
    down state of one test reaches the next)."""
    with _making:
        _governors.clear()
        _made.clear()


def _time_of_day(wall: float) -> str:
    from playbook._internal.words import time_of_day

    return time_of_day(wall)
