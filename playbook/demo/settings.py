"""The demo provider's knobs: one frozen, validated dataclass.

Every setting is keyword-only and checked on construction, so a typo in a test or a
notebook fails loudly with the setting's name instead of silently serving defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any, Literal, overload

__all__ = ["APIS", "DEMO_KEY", "RETRY_AFTER_FORMATS", "DemoSettings", "down_seconds"]

DEMO_KEY = "demo-key"

# How a 429 tells the client when to come back:
#   seconds    Retry-After: <int seconds>
#   http-date  Retry-After: <IMF-fixdate>
#   reset      X-RateLimit-Reset: <epoch seconds> and RateLimit-Reset: <delta seconds>
#   none       no hint at all (the client must back off on its own)
RETRY_AFTER_FORMATS = ("seconds", "http-date", "reset", "none")

# The LLM dialects the demo speaks, as `pb.llm_tool(api=...)` names them; "local" is the chat
# endpoint in local server mode.
APIS = ("openai", "openai-responses", "anthropic", "gemini", "azure", "bedrock", "local")
_LIMITS = (
    "anthropic_rpm",
    "anthropic_itpm",
    "anthropic_otpm",
    "gemini_rpm",
    "gemini_tpm",
    "gemini_rpd",
    "azure_rpm",
    "azure_tpm",
    "bedrock_rpm",
    "bedrock_tpm",
)


@dataclass(frozen=True, kw_only=True)
class DemoSettings:
    """Behaviour of the demo provider. All rates are shares in [0, 1]; times are seconds.

    Limits, each per API key and each optional, checked in this order: ``max_in_flight``
    requests answered at once (``max_in_flight_status`` without a hint: 429, or 503 as a local
    server such as Ollama answers when its queue is full), the token bucket (``rps``, ``burst``), the
    fixed window (``window_limit`` requests per ``window_seconds``, windows aligned to multiples
    of ``window_seconds`` on the server's clock) and the ``quota``, counted on the paths under
    ``quota_endpoints`` and for the keys in ``quota_keys`` (None: every path, every key; a key
    may be listed that is not accepted, so revoking one needs no second change). Then faults:
    every ``fault_every``-th request that passed them all, and a ``fault_rate`` share drawn at
    random, answered ``fault_status`` (a 5xx, or 429: a strict bucket's refusal of a call the
    network bunched, with ``fault_retry_after`` as its hint).

    The chat endpoint adds OpenAI's per-minute limits per key, ``chat_rpm`` requests and
    ``chat_tpm`` tokens (prompt + completion), each a bucket refilling continuously that holds
    ``chat_bucket_seconds`` worth of its limit. ``chat_invalid_json_rate`` of JSON answers
    are invalid JSON. Batches finish ``batch_seconds`` after they are created; in Anthropic's and
    Gemini's, ``batch_expired_rate`` of the requests expire unanswered (see `dialect_batches`).

    The other dialects' endpoints (see docs/demo.md) add their providers' own limits per key,
    each optional:

    - Anthropic (``/v1/messages``): ``anthropic_rpm`` requests, ``anthropic_itpm`` input tokens
      and ``anthropic_otpm`` output tokens per minute, each a bucket holding a minute's limit and
      refilling continuously; output tokens are charged as ``max_tokens`` on arrival and
      adjusted to the answer's count when it is sent.
    - Gemini (``:generateContent``): ``gemini_rpm`` requests and ``gemini_tpm`` input tokens per
      minute, counted in windows of a minute; ``gemini_rpd`` requests per day of
      ``gemini_day_seconds`` (a day's window opens at a key's first request).
    - Azure OpenAI (``/openai/deployments/...``): ``azure_rpm`` requests and ``azure_tpm``
      tokens per minute, enforced as a sixth of each per window of ``azure_window_seconds``
      (10), tokens charged as prompt + ``max_tokens`` on arrival.
    - Bedrock (``/model/{id}/converse``): ``bedrock_rpm`` requests and ``bedrock_tpm`` tokens
      per minute, each a bucket holding a minute's limit.
    - Overload: while overloaded, the LLM endpoints of the dialects in ``overload_apis`` (None:
      every one) refuse as their provider does (Anthropic 529 ``overloaded_error``, Gemini 503
      ``UNAVAILABLE``, the others 503): for ``overload_seconds`` at the start of every
      ``overload_period`` seconds of the server's clock, and a further ``overload_rate`` share
      drawn at random.  ``overload_seconds`` needs ``overload_period`` and the period needs the
      seconds: either alone is refused, as it would do nothing.
    - A local server: with ``local_slots`` set, ``/v1/chat/completions`` asks for no key and
      answers ``local_slots`` requests at once, each taking ``local_service_seconds``, with up
      to ``local_queue`` more waiting; past that it answers 503 at once, as Ollama does.  ``local_queue`` and
      ``local_service_seconds`` without ``local_slots`` are refused (they would do nothing).
    """

    api_keys: tuple[str, ...] = (DEMO_KEY,)
    rps: float | None = None
    burst: int = 10
    window_limit: int | None = None
    window_seconds: float = 1.0
    max_in_flight: int | None = None
    max_in_flight_status: int = 429
    retry_after_format: str = "seconds"
    quota: int | None = None
    quota_reset: float = 3600.0
    quota_endpoints: tuple[str, ...] | None = None
    quota_keys: tuple[str, ...] | None = None
    latency: float = 0.0
    fault_rate: float = 0.0
    fault_status: int = 503
    fault_retry_after: float | None = None
    fault_every: int | None = None
    slow_rate: float = 0.0
    slow_latency: float = 1.0
    malformed_rate: float = 0.0
    miss_rate: float = 0.2
    job_seconds: float = 2.0
    chat_rpm: int | None = None
    chat_tpm: int | None = None
    chat_bucket_seconds: float = 1.0
    chat_invalid_json_rate: float = 0.0
    batch_seconds: float = 2.0
    batch_expired_rate: float = 0.0
    anthropic_rpm: int | None = None
    anthropic_itpm: int | None = None
    anthropic_otpm: int | None = None
    gemini_rpm: int | None = None
    gemini_tpm: int | None = None
    gemini_rpd: int | None = None
    gemini_day_seconds: float = 86400.0
    azure_rpm: int | None = None
    azure_tpm: int | None = None
    azure_window_seconds: float = 10.0
    bedrock_rpm: int | None = None
    bedrock_tpm: int | None = None
    overload_seconds: float = 0.0
    overload_period: float | None = None
    overload_rate: float = 0.0
    overload_apis: tuple[str, ...] | None = None
    local_slots: int | None = None
    local_queue: int = 0
    local_service_seconds: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "api_keys", _keys("api_keys", self.api_keys))
        set_(self, "rps", _number("rps", self.rps, low=0.0, open_low=True, optional=True))
        set_(self, "burst", _integer("burst", self.burst, low=1))
        set_(self, "window_limit", _integer("window_limit", self.window_limit, low=1, optional=True))
        set_(self, "window_seconds", _number("window_seconds", self.window_seconds, low=0.0, open_low=True))
        set_(self, "max_in_flight", _integer("max_in_flight", self.max_in_flight, low=1, optional=True))
        if self.max_in_flight_status not in (429, 503):
            raise ValueError(f"max_in_flight_status must be 429 or 503; got {self.max_in_flight_status!r}")
        if self.retry_after_format not in RETRY_AFTER_FORMATS:
            raise ValueError(
                f"retry_after_format must be one of {', '.join(RETRY_AFTER_FORMATS)}; got {self.retry_after_format!r}"
            )
        set_(self, "quota", _integer("quota", self.quota, low=0, optional=True))
        set_(self, "quota_reset", _number("quota_reset", self.quota_reset, low=0.0, open_low=True))
        set_(self, "quota_endpoints", _prefixes(self.quota_endpoints))
        set_(
            self,
            "quota_keys",
            None if self.quota_keys is None else _keys("quota_keys", self.quota_keys, or_none=True),
        )
        for name in ("latency", "slow_latency", "job_seconds", "batch_seconds"):
            set_(self, name, _number(name, getattr(self, name), low=0.0))
        set_(self, "chat_rpm", _integer("chat_rpm", self.chat_rpm, low=1, optional=True))
        set_(self, "chat_tpm", _integer("chat_tpm", self.chat_tpm, low=1, optional=True))
        set_(
            self,
            "chat_bucket_seconds",
            _number("chat_bucket_seconds", self.chat_bucket_seconds, low=0.0, open_low=True),
        )
        self._check_dialects()
        for name in (
            "fault_rate",
            "slow_rate",
            "malformed_rate",
            "miss_rate",
            "chat_invalid_json_rate",
            "batch_expired_rate",
            "overload_rate",
        ):
            set_(self, name, _number(name, getattr(self, name), low=0.0, high=1.0))
        status = _integer("fault_status", self.fault_status, low=429)
        if status != 429 and not 500 <= status <= 599:
            raise ValueError(f"fault_status must be a 5xx status such as 503 or 500, or 429; got {status!r}")
        set_(
            self,
            "fault_retry_after",
            _number("fault_retry_after", self.fault_retry_after, low=0.0, optional=True),
        )
        set_(self, "fault_every", _integer("fault_every", self.fault_every, low=1, optional=True))
        set_(self, "seed", _integer("seed", self.seed))

    def _check_dialects(self) -> None:
        set_ = object.__setattr__
        for name in _LIMITS:
            set_(self, name, _integer(name, getattr(self, name), low=1, optional=True))
        for name in ("gemini_day_seconds", "azure_window_seconds"):
            set_(self, name, _number(name, getattr(self, name), low=0.0, open_low=True))
        set_(self, "overload_seconds", _number("overload_seconds", self.overload_seconds, low=0.0))
        period = _number("overload_period", self.overload_period, low=0.0, open_low=True, optional=True)
        if period is not None and self.overload_seconds > period:
            raise ValueError(
                f"overload_seconds must be at most overload_period ({period:g}); got {self.overload_seconds:g}"
            )
        set_(self, "overload_period", period)
        set_(self, "overload_apis", _apis(self.overload_apis))
        set_(self, "local_slots", _integer("local_slots", self.local_slots, low=1, optional=True))
        set_(self, "local_queue", _integer("local_queue", self.local_queue, low=0))
        set_(
            self,
            "local_service_seconds",
            _number("local_service_seconds", self.local_service_seconds, low=0.0),
        )
        self._check_inert()

    def _check_inert(self) -> None:
        """A setting that does nothing without another is refused, naming the one it needs."""
        if self.overload_period is not None and self.overload_seconds == 0:
            raise ValueError(
                f"overload_period={self.overload_period:g} does nothing with overload_seconds=0: set overload_seconds "
                "(seconds overloaded at the start of each period), or overload_period=None"
            )
        if self.overload_seconds > 0 and self.overload_period is None:
            raise ValueError(
                f"overload_seconds={self.overload_seconds:g} needs overload_period (seconds between the starts of "
                "two overloads); for overloads drawn at random, set overload_rate instead"
            )
        if self.local_slots is None:
            for name, value in (
                ("local_queue", self.local_queue),
                ("local_service_seconds", self.local_service_seconds),
            ):
                if value:
                    raise ValueError(
                        f"{name}={value:g} does nothing without local_slots (requests a local server answers at once): "
                        "set local_slots too"
                    )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The names of all settings, in declaration order."""
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def from_kwargs(cls, **settings: Any) -> DemoSettings:
        """Build settings, naming any unknown setting in the error."""
        _check_names(settings)
        return cls(**settings)

    def replace(self, **changes: Any) -> DemoSettings:
        """A copy with `changes` applied (validated like the constructor)."""
        _check_names(changes)
        return dataclasses.replace(self, **changes) if changes else self

    def public(self) -> dict[str, Any]:
        """A JSON-able view for the admin endpoints: everything but the keys themselves."""
        out = dataclasses.asdict(self)
        out["api_keys"] = len(self.api_keys)
        out["quota_keys"] = None if self.quota_keys is None else len(self.quota_keys)
        if self.quota_endpoints is not None:
            out["quota_endpoints"] = list(self.quota_endpoints)
        if self.overload_apis is not None:
            out["overload_apis"] = list(self.overload_apis)
        return out


def down_seconds(value: Any) -> float:
    """Validate a restart's ``down`` (seconds the port stays closed)."""
    return _number("down", value, low=0.0)


def _check_names(settings: dict[str, Any]) -> None:
    known = DemoSettings.names()
    unknown = sorted(set(settings) - set(known))
    if unknown:
        near = _nearest(unknown[0], known)
        hint = f" (did you mean {near!r}?)" if near else ""
        raise TypeError(f"unknown demo setting {unknown[0]!r}{hint}; known settings: {', '.join(known)}")


def _nearest(name: str, known: tuple[str, ...]) -> str | None:
    """The known setting ``name`` misspells: one with the same letters swapped round (``gemini_rdp``
    is ``gemini_rpd``, where difflib would say ``gemini_rpm``), else the closest spelling."""
    swapped = [k for k in known if sorted(k) == sorted(name)]
    if swapped:
        return swapped[0]
    found = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    return found[0] if found else None


@overload
def _number(
    name: str,
    value: Any,
    *,
    low: float | None = ...,
    high: float | None = ...,
    open_low: bool = ...,
    optional: Literal[False] = ...,
) -> float: ...
@overload
def _number(
    name: str,
    value: Any,
    *,
    low: float | None = ...,
    high: float | None = ...,
    open_low: bool = ...,
    optional: bool,
) -> float | None: ...
def _number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    optional: bool = False,
) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        kind = "a finite number or None" if optional else "a finite number"
        raise ValueError(f"{name} must be {kind}; got {value!r}")
    number = float(value)
    if low is not None and (number <= low if open_low else number < low):
        raise ValueError(f"{name} must be {'>' if open_low else '>='} {low:g}; got {number:g}")
    if high is not None and number > high:
        raise ValueError(f"{name} must be <= {high:g}; got {number:g}")
    return number


@overload
def _integer(name: str, value: Any, *, low: int | None = ..., optional: Literal[False] = ...) -> int: ...
@overload
def _integer(name: str, value: Any, *, low: int | None = ..., optional: bool) -> int | None: ...
def _integer(name: str, value: Any, *, low: int | None = None, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an integer or None" if optional else "an integer"
        raise ValueError(f"{name} must be {kind}; got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}; got {value}")
    return value


def _keys(name: str, value: Any, *, or_none: bool = False) -> tuple[str, ...]:
    # The error never repeats the values: they are credentials, even if only demo ones. An empty
    # `quota_keys` is refused too: it would read as "no key" to one reader and "every key" to another.
    keys = (value,) if isinstance(value, str) else value
    if not isinstance(keys, (tuple, list)) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(
            f"{name} must be {'None (every key) or ' if or_none else ''}a non-empty tuple of non-empty strings"
        )
    return tuple(keys)


def _prefixes(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    prefixes = (value,) if isinstance(value, str) else value
    if not isinstance(prefixes, (tuple, list)) or not all(
        isinstance(p, str) and p.startswith("/") for p in prefixes
    ):
        raise ValueError(
            f"quota_endpoints must be None or a tuple of path prefixes like '/v1/email'; got {value!r}"
        )
    return tuple(prefixes)


def _apis(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    apis = (value,) if isinstance(value, str) else value
    if not isinstance(apis, (tuple, list)) or not apis or any(a not in APIS for a in apis):
        raise ValueError(
            f"overload_apis must be None (every one) or a tuple of {', '.join(APIS)}; got {value!r}"
        )
    return tuple(apis)
