"""The demo provider's mutable state: admission, fault draws, jobs and counters.

The server's event loop updates it while other threads (a test, a notebook cell) read
stats or reset it, so every access goes through one lock. Each request takes the lock
twice (admit, finish) for a few microseconds: cheaper than a round-trip into the loop.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from playbook.demo.limits import QuotaWindows, RateLimiter
from playbook.demo.settings import DemoSettings

__all__ = ["DemoState", "Rejection"]

# (status, error message, seconds the client should wait or None)
Rejection = tuple[int, str, float | None]


class _Counters:
    __slots__ = (
        "auth_ok",
        "auth_rejected",
        "bulk_items",
        "by_endpoint",
        "by_status",
        "duplicate_idempotency_keys",
        "idempotency_keys",
        "in_flight",
        "jobs_submitted",
        "max_in_flight",
        "quota_exceeded",
        "rate_limited",
        "requests",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.by_endpoint: dict[str, int] = {}
        self.by_status: dict[int, int] = {}
        self.auth_ok = 0
        self.auth_rejected = 0
        self.idempotency_keys: dict[str, int] = {}
        self.duplicate_idempotency_keys = 0
        self.bulk_items = 0
        self.jobs_submitted = 0
        self.rate_limited = 0
        self.quota_exceeded = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_endpoint": dict(self.by_endpoint),
            "by_status": {str(status): n for status, n in sorted(self.by_status.items())},
            "by_auth": {"ok": self.auth_ok, "rejected": self.auth_rejected},
            "idempotency_keys": dict(self.idempotency_keys),
            "duplicate_idempotency_keys": self.duplicate_idempotency_keys,
            "bulk_items": self.bulk_items,
            "jobs_submitted": self.jobs_submitted,
            "rate_limited": self.rate_limited,
            "quota_exceeded": self.quota_exceeded,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
        }


class DemoState:
    """Everything `reset()` zeroes, plus the current settings."""

    def __init__(self, settings: DemoSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = threading.Lock()
        self.clock = clock
        self.initial = settings
        self.settings = settings
        self._limiter = RateLimiter(settings.rps, settings.burst)
        self._quota = QuotaWindows(settings.quota, settings.quota_reset)
        self._counters = _Counters()
        self._jobs: dict[str, tuple[float, dict[str, Any]]] = {}
        self._epoch = 0  # bumped by reset(), so requests admitted before it are not counted after it
        self._seed(settings.seed)

    def _seed(self, seed: int) -> None:
        # One generator per behaviour, so turning one knob does not reshuffle the others.
        self._fault_rng = random.Random(f"{seed}:fault")
        self._slow_rng = random.Random(f"{seed}:slow")
        self._malformed_rng = random.Random(f"{seed}:malformed")

    # -- control ---------------------------------------------------------------------------

    def reset(self, **changes: Any) -> DemoSettings:
        """Zero counters, limits, quotas, jobs and random draws.

        Settings return to those the state was created with, then `changes` apply: a
        reset server behaves like a freshly started one, whatever earlier tests configured.
        """
        settings = self.initial.replace(**changes)  # validate before touching anything
        with self.lock:
            self.settings = settings
            self._limiter = RateLimiter(settings.rps, settings.burst)
            self._quota = QuotaWindows(settings.quota, settings.quota_reset)
            self._counters = _Counters()
            self._jobs = {}
            self._epoch += 1
            self._seed(settings.seed)
        return settings

    def configure(self, **changes: Any) -> DemoSettings:
        """Apply `changes` to the current settings; keep counters, buckets, quotas and jobs."""
        with self.lock:
            settings = self.settings.replace(**changes)
            if settings.seed != self.settings.seed:
                self._seed(settings.seed)
            self.settings = settings
            self._limiter.rps, self._limiter.burst = settings.rps, settings.burst
            self._quota.limit, self._quota.period = settings.quota, settings.quota_reset
        return settings

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return self._counters.snapshot()

    # -- per request -----------------------------------------------------------------------

    def admit(
        self, endpoint: str, path: str, authorization: str | None, idempotency_key: str | None
    ) -> tuple[Rejection | None, float, int]:
        """Count a /v1 request and decide its fate.

        Returns (rejection or None, extra seconds to be slow, epoch to hand to `finish`).
        """
        with self.lock:
            epoch = self._epoch
            c = self._counters
            c.requests += 1
            c.by_endpoint[endpoint] = c.by_endpoint.get(endpoint, 0) + 1
            c.in_flight += 1
            if c.in_flight > c.max_in_flight:
                c.max_in_flight = c.in_flight
            if idempotency_key is not None:
                seen = c.idempotency_keys.get(idempotency_key, 0) + 1
                c.idempotency_keys[idempotency_key] = seen
                if seen == 2:
                    c.duplicate_idempotency_keys += 1
            settings = self.settings
            key = _bearer(authorization)
            if key is None or key not in settings.api_keys:
                c.auth_rejected += 1
                return (401, "invalid api key", None), 0.0, epoch
            c.auth_ok += 1
            now = self.clock()
            wait = self._limiter.acquire(key, now)
            if wait:
                c.rate_limited += 1
                return (429, "rate limited", wait), 0.0, epoch
            prefixes = settings.quota_endpoints
            if settings.quota is not None and (prefixes is None or path.startswith(prefixes)):
                wait = self._quota.acquire(key, now)
                if wait:
                    c.quota_exceeded += 1
                    return (429, "daily quota exceeded", wait), 0.0, epoch
            slow = 0.0
            if settings.slow_rate and self._slow_rng.random() < settings.slow_rate:
                slow = settings.slow_latency
            if settings.fault_rate and self._fault_rng.random() < settings.fault_rate:
                fault = (settings.fault_status, "service unavailable", settings.fault_retry_after)
                return fault, slow, epoch
            return None, slow, epoch

    def finish(self, status: int, epoch: int) -> bool:
        """Count a response's status; True when this 200 response should be malformed."""
        with self.lock:
            if epoch != self._epoch:  # admitted before a reset: belongs to zeroed counters
                return False
            c = self._counters
            c.by_status[status] = c.by_status.get(status, 0) + 1
            c.in_flight -= 1
            rate = self.settings.malformed_rate
            return status == 200 and bool(rate) and self._malformed_rng.random() < rate

    def count_bulk_items(self, n: int) -> None:
        with self.lock:
            self._counters.bulk_items += n

    # -- jobs ------------------------------------------------------------------------------

    def submit_job(self, result: dict[str, Any]) -> str:
        """Register a job whose `result` becomes visible after `job_seconds`."""
        with self.lock:
            self._counters.jobs_submitted += 1
            job_id = f"job_{self._counters.jobs_submitted:06d}"
            self._jobs[job_id] = (self.clock() + self.settings.job_seconds, result)
            return job_id

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The job's public status document, or None for an unknown id."""
        with self.lock:
            entry = self._jobs.get(job_id)
            now = self.clock()
        if entry is None:
            return None
        done_at, result = entry
        if now < done_at:
            return {"job_id": job_id, "status": "running"}
        return {"job_id": job_id, "status": "done", "result": result}

    def __repr__(self) -> str:
        c = self._counters
        return f"<DemoState requests={c.requests} in_flight={c.in_flight} jobs={len(self._jobs)} {self._limiter!r}>"


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
