"""The limits of the other LLM dialects the demo speaks, each enforced as its provider does.

- `AnthropicLimits`: requests, input tokens and output tokens per minute, each a bucket holding
  a minute's limit and refilling continuously; output tokens charged as ``max_tokens`` on
  arrival and adjusted to the answer's count when it is sent (Anthropic's token bucket).
- `WindowLimits`: requests and tokens per fixed window aligned on the clock: Gemini's per-minute
  windows, and Azure's per-minute limits enforced as a sixth of each per 10-second window.
- `BucketLimits`: requests and tokens per minute as buckets holding a minute (Bedrock).
- `overloaded`: whether the server's clock falls in an overload burst.
- `LocalSlots`: a local server's decode slots and the short queue in front of them (Ollama's
  ``OLLAMA_NUM_PARALLEL`` and ``OLLAMA_MAX_QUEUE``, llama.cpp's ``--parallel``).

Like `limits`, everything takes `now` from the caller and is serialised by the demo state's lock.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import NamedTuple

from playbook.demo.limits import MinuteBuckets

__all__ = [
    "AnthropicLimits",
    "BucketLimits",
    "LocalSlots",
    "Refusal",
    "WindowLimits",
    "overloaded",
]

_MINUTE = 60.0


class Refusal(NamedTuple):
    """A limit refused a request: which one ("requests", "input_tokens", ...) and the seconds until
    the request would fit."""

    kind: str
    wait: float


def _longest(waits: dict[str, float]) -> Refusal | None:
    # The request fits once the longest of its waits is over.
    refused = {kind: wait for kind, wait in waits.items() if wait > 0}
    if not refused:
        return None
    kind = max(refused, key=lambda k: refused[k])
    return Refusal(kind, refused[kind])


class AnthropicLimits:
    """Anthropic's per-key limits: requests (RPM), input tokens (ITPM), output tokens (OTPM)."""

    __slots__ = ("buckets",)

    def __init__(self, rpm: int | None, itpm: int | None, otpm: int | None) -> None:
        self.buckets = {
            "requests": MinuteBuckets(rpm, _MINUTE),
            "input_tokens": MinuteBuckets(itpm, _MINUTE),
            "output_tokens": MinuteBuckets(otpm, _MINUTE),
        }

    def set(self, rpm: int | None, itpm: int | None, otpm: int | None) -> None:
        for name, limit in zip(self.buckets, (rpm, itpm, otpm), strict=True):
            self.buckets[name].limit = limit

    def admit(self, key: str, now: float, input_tokens: int, max_tokens: int) -> Refusal | None:
        """Take a request of `input_tokens` reserving `max_tokens` of output, or refuse it."""
        weights = {"requests": 1, "input_tokens": input_tokens, "output_tokens": max_tokens}
        active = {name: b for name, b in self.buckets.items() if b.limit is not None}
        refusal = _longest({name: b.wait(key, now, weights[name]) for name, b in active.items()})
        if refusal is None:
            for name, b in active.items():
                b.take(key, now, weights[name])
        return refusal

    def settle(self, key: str, now: float, reserved: int, used: int) -> None:
        """The answer used `used` output tokens of the `reserved` ones: give back the rest."""
        bucket = self.buckets["output_tokens"]
        if bucket.limit is not None and reserved > used:
            bucket.give(key, now, reserved - used)

    def state(self, key: str, now: float) -> dict[str, tuple[int, int, float]]:
        """(limit, remaining, seconds until full) of each limit that is set, by name."""
        out = {}
        for name, b in self.buckets.items():
            if b.limit is not None:
                level = min(b.capacity, b.level(key, now))
                out[name] = (b.limit, max(0, math.floor(level + 1e-6)), b.reset_in(key, now))
        return out

    def clear(self) -> None:
        for b in self.buckets.values():
            b.clear()

    def __repr__(self) -> str:
        return f"<AnthropicLimits {' '.join(f'{n}={b!r}' for n, b in self.buckets.items())}>"


class WindowLimits:
    """Requests and tokens per key in fixed windows of `period` seconds aligned on the clock.

    ``per_minute`` limits are scaled to the window (Azure's 600 requests per minute are 100 per
    10 s window). A request heavier than a whole window's tokens still passes in an empty
    window, or it could never pass.
    """

    __slots__ = ("_used", "period", "requests", "tokens")

    def __init__(self, rpm: int | None, tpm: int | None, period: float) -> None:
        self.requests, self.tokens, self.period = rpm, tpm, period
        self._used: dict[str, tuple[int, int, int]] = {}  # key -> (window index, requests, tokens)

    def limits(self) -> tuple[int | None, int | None]:
        """The requests and tokens one window allows."""
        share = self.period / _MINUTE

        def scaled(limit: int | None) -> int | None:
            return None if limit is None else max(1, math.floor(limit * share + 1e-9))

        return scaled(self.requests), scaled(self.tokens)

    def _window(self, key: str, now: float) -> tuple[int, int, int]:
        index = math.floor(now / self.period)
        used = self._used.get(key)
        return used if used is not None and used[0] == index else (index, 0, 0)

    def admit(self, key: str, now: float, weight: int) -> Refusal | None:
        """Count a request of `weight` tokens in the key's window, or refuse it."""
        index, requests, tokens = self._window(key, now)
        most_requests, most_tokens = self.limits()
        left = max((index + 1) * self.period - now, 1e-9)
        waits = {
            "requests": left if most_requests is not None and requests >= most_requests else 0.0,
            "tokens": left
            if most_tokens is not None and tokens > 0 and tokens + weight > most_tokens
            else 0.0,
        }
        refusal = _longest(waits)
        if refusal is None:
            self._used[key] = (index, requests + 1, tokens + weight)
        return refusal

    def remaining(self, key: str, now: float) -> tuple[int | None, int | None]:
        """Requests and tokens left in the key's current window (None where no limit is set)."""
        _, requests, tokens = self._window(key, now)
        most_requests, most_tokens = self.limits()
        return (
            None if most_requests is None else max(0, most_requests - requests),
            None if most_tokens is None else max(0, most_tokens - tokens),
        )

    def clear(self) -> None:
        self._used.clear()

    def __repr__(self) -> str:
        requests, tokens = self.limits()
        return (
            f"<WindowLimits requests={requests} tokens={tokens} per {self.period:g}s keys={len(self._used)}>"
        )


class BucketLimits:
    """Requests and tokens per minute per key, each a bucket holding a minute's limit."""

    __slots__ = ("requests", "tokens")

    def __init__(self, rpm: int | None, tpm: int | None) -> None:
        self.requests = MinuteBuckets(rpm, _MINUTE)
        self.tokens = MinuteBuckets(tpm, _MINUTE)

    def set(self, rpm: int | None, tpm: int | None) -> None:
        self.requests.limit, self.tokens.limit = rpm, tpm

    def admit(self, key: str, now: float, weight: int) -> Refusal | None:
        pairs = [("requests", self.requests, 1), ("tokens", self.tokens, weight)]
        active = [(name, b, w) for name, b, w in pairs if b.limit is not None]
        refusal = _longest({name: b.wait(key, now, w) for name, b, w in active})
        if refusal is None:
            for _, b, w in active:
                b.take(key, now, w)
        return refusal

    def clear(self) -> None:
        self.requests.clear()
        self.tokens.clear()

    def __repr__(self) -> str:
        return f"<BucketLimits requests={self.requests!r} tokens={self.tokens!r}>"


def overloaded(now: float, seconds: float, period: float | None) -> bool:
    """Whether `now` falls in the first `seconds` of a `period` on the clock."""
    return period is not None and seconds > 0 and now % period < seconds


class LocalSlots:
    """A local server's decode slots and its queue: a request takes a free slot, else waits in
    the queue when it has room, else is refused. Waiters are woken first come, first served,
    in whatever event loop (or thread) they wait."""

    __slots__ = ("busy", "waiting")

    def __init__(self) -> None:
        self.busy = 0
        self.waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    def claim(self, slots: int, queue: int) -> bool | asyncio.Future[None]:
        """True: a slot is taken; a future: queued, done once a slot is handed over; False: full."""
        if self.busy < slots and not self.waiting:
            self.busy += 1
            return True
        if len(self.waiting) < queue:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            self.waiting.append((loop, future))
            return future
        return False

    def release(self) -> None:
        """A slot is free: hand it to the first waiter, or leave it free."""
        while self.waiting:
            loop, future = self.waiting.popleft()
            if not future.done():
                loop.call_soon_threadsafe(_wake, future)
                return
        self.busy -= 1

    def forget(self, future: asyncio.Future[None]) -> bool:
        """A waiter gave up: True when it was still queued (it holds no slot)."""
        for entry in self.waiting:
            if entry[1] is future:
                self.waiting.remove(entry)
                return True
        return False

    def __repr__(self) -> str:
        return f"<LocalSlots busy={self.busy} waiting={len(self.waiting)}>"


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
