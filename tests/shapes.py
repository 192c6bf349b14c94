"""Providers' shapes in virtual time: how real APIs limit, refuse and fail, as Python ``send``
functions for :meth:`Provider.dispatch`, and a driver that runs rows through a provider the way
the scheduler does (a worker slot per row; a held row gives its slot up until its deadline).

The answers mirror what an ``http_tool`` raises: a 429 or 5xx is a ``ToolError`` with the status
and the ``Retry-After`` hint a server would send (whole seconds, rounded up, at least 1); a
refused connection is a retryable ``ToolError`` without a status.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import playbook as pb
from playbook._internal.flow import OnHold, WaitBudget
from playbook.errors import ProviderExhausted, ProviderUnavailable
from playbook.providers.provider import Provider, Ticket, governor


def _hint(wait: float) -> float:
    return float(max(1, math.ceil(wait - 1e-9)))


def _refusal(wait: float | None, message: str = "rate limited") -> pb.ToolError:
    return pb.ToolError(message, status=429, retry_after=None if wait is None else _hint(wait))


@dataclass
class Shape:
    """A provider: ``answer(now)`` decides each request on arrival; ``latency`` seconds per answer."""

    latency: float = 0.02
    requests: int = 0
    refused: int = 0
    failed: int = 0
    in_flight: int = 0
    most_in_flight: int = 0
    hints: bool = True

    def decide(self, now: float) -> Exception | None:  # pragma: no cover - overridden
        return None

    def send_for(self, row: int) -> Callable[[], Awaitable[str]]:
        """What row ``row`` sends (the same request on each of its tries)."""
        return self.send

    async def send(self) -> str:
        loop = asyncio.get_running_loop()
        self.requests += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            error = self.decide(loop.time())
            if error is not None:
                await asyncio.sleep(0.002)  # a refusal is answered at once
                if isinstance(error, pb.ToolError) and error.status == 429:
                    self.refused += 1
                else:
                    self.failed += 1
                raise error
            await asyncio.sleep(self.latency)
            return "ok"
        finally:
            self.in_flight -= 1


@dataclass
class TokenBucket(Shape):
    rps: float = 20.0
    burst: int = 5
    _tokens: float = -1.0
    _at: float = 0.0

    def decide(self, now: float) -> Exception | None:
        if self._tokens < 0:
            self._tokens, self._at = float(self.burst), now
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rps)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return _refusal((1.0 - self._tokens) / self.rps if self.hints else None)


@dataclass
class Jittered(TokenBucket):
    """A strict bucket that also refuses the requests numbered in ``bunched`` (counted from 1):
    calls the network bunched, each refused with ``Retry-After: 1`` as a server rounds it."""

    bunched: tuple[int, ...] = ()

    def decide(self, now: float) -> Exception | None:
        if self.requests in self.bunched:
            return _refusal(0.01)
        return super().decide(now)


@dataclass
class FixedWindow(Shape):
    limit: int = 20
    period: float = 1.0
    phase: float = 0.0  # seconds into a window when the run starts (the server's windows are its own)
    _window: int = -1
    _used: int = 0

    def decide(self, now: float) -> Exception | None:
        window = int((now + self.phase) // self.period)
        if window != self._window:
            self._window, self._used = window, 0
        if self._used < self.limit:
            self._used += 1
            return None
        return _refusal((window + 1) * self.period - self.phase - now if self.hints else None)


@dataclass
class Overloaded(TokenBucket):
    """A bucket that answers every request from ``start`` to ``end`` (loop seconds) with 529
    ``overloaded_error`` and no hint, as Anthropic does in a burst of overload."""

    start: float = 2.0
    end: float = 6.0

    def decide(self, now: float) -> Exception | None:
        if self.start <= now < self.end:
            return pb.ToolError("HTTP 529: overloaded_error", status=529, retryable=True)
        return super().decide(now)


@dataclass
class Queued(Shape):
    """A local server (vLLM, Ollama) with ``slots`` decode slots and a short queue of ``queue``:
    a request past both is answered 503 at once, without a hint; one in the queue waits for a
    slot, then takes ``latency``."""

    slots: int = 4
    queue: int = 4
    _free: asyncio.Semaphore | None = None

    async def send(self) -> str:
        self._free = self._free or asyncio.Semaphore(self.slots)
        self.requests += 1
        if self.in_flight >= self.slots + self.queue:
            await asyncio.sleep(0.002)
            self.failed += 1
            raise pb.ToolError("HTTP 503: server busy", status=503, retryable=True)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            async with self._free:
                await asyncio.sleep(self.latency)
            return "ok"
        finally:
            self.in_flight -= 1


@dataclass
class InFlightLimit(Shape):
    limit: int = 4

    def decide(self, now: float) -> Exception | None:
        if self.in_flight > self.limit:  # this request is counted already
            return _refusal(None, "too many concurrent requests")
        return None


@dataclass
class Flaky(Shape):
    every: int = 7
    retry_after: float | None = 1.0
    status: int = 503

    def decide(self, now: float) -> Exception | None:
        if self.every and self.requests % self.every == 0:
            return pb.ToolError(
                "service unavailable", status=self.status, retryable=True, retry_after=self.retry_after
            )
        return None


@dataclass
class FailingInputs(Shape):
    """Every ``every``-th row sends a request that always gets a 503 (a path built from the row,
    like ``/status/503``); every other request is answered."""

    every: int = 10

    def send_for(self, row: int) -> Callable[[], Awaitable[str]]:
        if row % self.every != self.every - 1:
            return self.send

        async def failing() -> str:
            self.requests += 1
            self.failed += 1
            await asyncio.sleep(0.002)
            raise pb.ToolError(f"HTTP 503 (GET /status/503?row={row})", status=503, retryable=True)

        return failing


@dataclass
class RandomFailures(Shape):
    """Each request fails with a 503 at random, ``share`` of them (a provider that is overloaded)."""

    share: float = 0.7
    seed: int = 0
    _rng: random.Random | None = None

    def decide(self, now: float) -> Exception | None:
        self._rng = self._rng or random.Random(self.seed)
        if self._rng.random() < self.share:
            return pb.ToolError("service unavailable", status=503, retryable=True)
        return None


@dataclass
class Closed(Shape):
    """Nothing listening: every connection is refused at once."""

    def decide(self, now: float) -> Exception | None:
        return pb.ToolError("connection refused", retryable=True)


@dataclass
class Outcome:
    ok: int = 0
    failed: int = 0
    parked: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    ok_seconds: float = 0.0  # when the last row that succeeded did
    errors: list[str] = field(default_factory=list)  # the failed rows' messages
    trace: list[tuple[float, float | None, int | None]] = field(default_factory=list)

    def goodput(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


async def drive(
    provider: Provider,
    shape: Shape,
    rows: int,
    *,
    concurrency: int = 32,
    max_wait: float = 120.0,
    on_trace: Callable[[float], None] | None = None,
) -> Outcome:
    """Run ``rows`` rows of one call each through ``provider`` with ``concurrency`` worker slots."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(concurrency)
    out = Outcome()
    start = loop.time()

    async def row(i: int) -> None:
        ticket = Ticket(f"tool{i}", WaitBudget(max_wait))
        send = shape.send_for(i)
        while True:
            async with slots:
                try:
                    await governor(provider).dispatch(send, ticket)
                except OnHold as held:
                    until = held.until
                except ProviderExhausted as exc:
                    out.parked[exc.reason] = out.parked.get(exc.reason, 0) + 1
                    return
                except (ProviderUnavailable, pb.ToolError) as exc:
                    out.failed += 1
                    out.errors.append(str(exc))
                    return
                else:
                    out.ok += 1
                    out.ok_seconds = loop.time() - start
                    return
            ticket.budget.left -= max(0.0, until - loop.time())
            await asyncio.sleep(max(0.0, until - loop.time()))

    async def sample() -> None:
        while True:
            await asyncio.sleep(0.5)
            out.trace.append((loop.time() - start, provider.status().rate, provider.status().in_flight_limit))

    sampler = asyncio.ensure_future(sample())
    await asyncio.gather(*(row(i) for i in range(rows)))
    sampler.cancel()
    out.seconds = loop.time() - start
    return out
