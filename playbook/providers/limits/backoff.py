"""Waiting after a refusal: exponential backoff with jitter, and reading a server's "come back
later" headers and the limits an LLM provider announces in them (:func:`announced`, in every
dialect's names).  None reads a clock: ``retry_after`` takes the wall-clock ``now``."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import NamedTuple

from playbook.providers.limits.weights import Rates

__all__ = ["Announced", "Backoff", "announced", "body_retry_delay", "duration", "retry_after"]

_EPOCH_FLOOR = 1e9  # a reset value this large is a Unix timestamp, not a number of seconds


def retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds the server asks us to wait, from ``Retry-After-Ms`` (milliseconds, as OpenAI
    sends), ``Retry-After`` (seconds or an HTTP date), ``RateLimit-Reset`` / ``RateLimit: ...;
    reset=N`` (seconds) or ``X-RateLimit-Reset`` (a Unix timestamp, or seconds when small); else
    the reset of an LLM provider's limit it says is used up (``remaining`` 0): OpenAI's
    ``x-ratelimit-reset-*`` durations, Anthropic's ``anthropic-ratelimit-*-reset`` RFC 3339 times.
    ``now`` is the wall-clock time (epoch seconds).

    ``None`` when no header gives a usable value; garbage is ignored, never trusted.
    """
    value = headers.get("retry-after-ms")
    if value is not None:
        millis = _seconds(value)
        if millis is not None:  # more precise than Retry-After, which it comes with: preferred
            return millis / 1000.0
    value = headers.get("retry-after")
    if value is not None:
        seconds = _seconds(value)
        if seconds is None:
            try:
                when = parsedate_to_datetime(value.strip())
            except (TypeError, ValueError, IndexError):
                when = None
            if when is not None:
                if when.tzinfo is None:  # asctime dates carry no zone: HTTP dates are GMT
                    when = when.replace(tzinfo=UTC)
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
    return _exhausted_reset(headers, now)


# A google.protobuf.Duration in JSON: seconds with up to nine decimals and an "s" ("45.8s").
_PROTO_DURATION = re.compile(r"^\s*(\d+(?:\.\d{1,9})?)s\s*$")


def body_retry_delay(content: bytes | str) -> float | None:
    """The wait a Google API's error body gives (the Gemini API's 429 puts it only there, no
    ``Retry-After``): ``error.details[]``' ``google.rpc.RetryInfo`` ``retryDelay``, e.g.
    ``"45.8s"`` -> 45.8.  https://cloud.google.com/apis/design/errors#error_payloads

    ``None`` when the body holds none, or garbage."""
    try:
        error = json.loads(content).get("error")
        details = error.get("details") or []
    except (ValueError, AttributeError, TypeError):
        return None
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, Mapping) and detail.get("@type") == "type.googleapis.com/google.rpc.RetryInfo":
            found = _PROTO_DURATION.match(str(detail.get("retryDelay") or ""))
            if found is not None:
                return float(found.group(1))
    return None


_OPENAI = ("requests", "tokens")
# Anthropic's budgets; its "tokens" is whichever of the token limits binds now, not a budget of its own.
_ANTHROPIC = ("requests", "input-tokens", "output-tokens", "tokens")


def _exhausted_reset(headers: Mapping[str, str], now: float) -> float | None:
    """An LLM provider's refusal without Retry-After: the reset of a limit it says is used up
    (``remaining`` 0): OpenAI's ``x-ratelimit-reset-tokens: "1.5s"`` (a duration) or Anthropic's
    ``anthropic-ratelimit-output-tokens-reset: "2025-01-01T00:00:30Z"`` (an RFC 3339 time).  The
    soonest, when several are."""
    waits = []
    for kind in _OPENAI:
        reset = _used_up(headers, f"x-ratelimit-remaining-{kind}", f"x-ratelimit-reset-{kind}")
        wait = duration(reset) if reset is not None else None
        if wait is not None:
            waits.append(wait)
    for kind in _ANTHROPIC:
        prefix = f"anthropic-ratelimit-{kind}"
        reset = _used_up(headers, f"{prefix}-remaining", f"{prefix}-reset")
        when = _rfc3339(reset) if reset is not None else None
        if when is not None:
            waits.append(max(0.0, when - now))
    return min(waits) if waits else None


def _used_up(headers: Mapping[str, str], remaining: str, reset: str) -> str | None:
    """The reset header's text when the remaining header says 0; else None."""
    left, when = headers.get(remaining), headers.get(reset)
    return when if left is not None and when is not None and _seconds(left) == 0 else None


def _rfc3339(text: str) -> float | None:
    """Epoch seconds of an RFC 3339 time (``2025-01-01T00:00:30Z``, ``...+01:00``, fractions);
    None for anything else, a time without its offset too (its zone is a guess)."""
    try:
        when = datetime.fromisoformat(text.strip().strip('"').upper())  # RFC 3339 allows a lower-case t and z
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


class Announced(NamedTuple):
    """The limits per minute an LLM provider announced in an answer's headers: requests, tokens
    (one budget for input and output together, as OpenAI and Azure count them), input tokens
    and output tokens (apart, as Anthropic counts them).  None: not announced.  ``remaining``:
    the tokens each budget's bucket held when the answer was sent (Anthropic's
    ``anthropic-ratelimit-*-remaining``; not a rate), which the limiter's own count of the bucket
    is corrected from."""

    requests: float | None = None
    tokens: float | None = None
    input: float | None = None
    output: float | None = None
    remaining: Rates = Rates()


def announced(headers: Mapping[str, str]) -> Announced | None:
    """The limits an LLM provider announces in every answer: ``x-ratelimit-limit-requests`` /
    ``-tokens`` (OpenAI, Azure and most proxies), ``anthropic-ratelimit-requests-limit`` /
    ``-input-tokens-limit`` / ``-output-tokens-limit`` (Anthropic); ``None`` when it announces
    none.  Anthropic's ``anthropic-ratelimit-tokens-*`` tell whichever token limit binds now, not a
    budget of input and output together: they teach no limit.  What Anthropic's input and output
    buckets hold (``-input-tokens-remaining``, ``-output-tokens-remaining``) is read too: its
    buckets hold a minute's worth, as documented.  OpenAI's ``x-ratelimit-remaining-*`` is not:
    it enforces a minute's limit over shorter periods, so what its bucket holds may not be sent
    at once.  Garbage is ignored."""
    found = Announced(
        _limit(headers.get("x-ratelimit-limit-requests"))
        or _limit(headers.get("anthropic-ratelimit-requests-limit")),
        _limit(headers.get("x-ratelimit-limit-tokens")),
        _limit(headers.get("anthropic-ratelimit-input-tokens-limit")),
        _limit(headers.get("anthropic-ratelimit-output-tokens-limit")),
        Rates(
            None,
            _count(headers.get("anthropic-ratelimit-input-tokens-remaining")),
            _count(headers.get("anthropic-ratelimit-output-tokens-remaining")),
        ),
    )
    return None if found == (None, None, None, None, Rates()) else found


def _count(text: str | None) -> float | None:
    """A whole number of tokens, 0 included (a bucket used up); None: absent or garbage."""
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _limit(text: str | None) -> float | None:
    value = _seconds(text) if text is not None else None
    return value if value else None


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float | None:
    """Seconds in a duration as LLM providers write their resets: ``"6m0s"``, ``"1.5s"``,
    ``"20ms"``, ``"1h2m3s"``, or a bare number of seconds; ``None`` for anything else."""
    text = text.strip().lower()
    bare = _seconds(text)
    if bare is not None:
        return bare
    total, number, i = 0.0, "", 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else ch
        if not number or unit not in _UNITS:
            return None
        try:
            total += float(number) * _UNITS[unit]
        except ValueError:
            return None
        number, i = "", i + len(unit)
    return None if number or not text else total


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

    def delay(self, n: int, cap: float | None = None) -> float:
        """The ``n``-th wait (from 0), under ``cap`` when given, else this backoff's own."""
        high = min(self.cap if cap is None else cap, self.base * 2.0 ** min(n, 60))
        return self._rng.uniform(high / 2, high)

    def __repr__(self) -> str:
        return f"<Backoff base={self.base:g}s cap={self.cap:g}s>"
