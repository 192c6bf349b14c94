"""The demo provider's mutable state: admission, fault draws, jobs, files, batches and counters.

The server's event loop updates it while other threads (a test, a notebook cell) read
stats or reset it, so every access goes through one lock. Each request takes the lock
twice (admit, finish) for a few microseconds: cheaper than a round-trip into the loop.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from playbook.demo.batches import BatchStore, Prepared, StoredFile
from playbook.demo.counters import Counters, key_label
from playbook.demo.dialect_batches import DialectBatch, DialectBatches, Line
from playbook.demo.dialect_limits import (
    AnthropicLimits,
    BucketLimits,
    LocalSlots,
    Refusal,
    WindowLimits,
    overloaded,
)
from playbook.demo.limits import ChatLimits, ChatVerdict, FixedWindows, QuotaWindows, RateLimiter
from playbook.demo.settings import DemoSettings

__all__ = ["Admission", "DemoState", "Rejection"]

# (status, error message, seconds the client should wait or None)
Rejection = tuple[int, str, float | None]


class Admission:
    """One /v1 request's fate, from `admit` to `finish`."""

    __slots__ = ("api", "epoch", "headers", "key", "label", "rejection", "slow")

    def __init__(self, epoch: int, api: str | None = None) -> None:
        self.epoch = epoch
        self.api = api  # the LLM dialect whose endpoint this is, counted in `by_api`  # bumped by reset(): a request admitted before it is not counted after it
        self.rejection: Rejection | None = None
        self.slow = 0.0  # extra seconds to be slow
        self.headers: dict[str, str] | None = None  # added to the response, whatever it is
        self.key: str | None = None  # the API key holding an in-flight slot until `finish`
        self.label = "none"  # the bearer's `key_label`, which `by_key` counts it under


class DemoState:
    """Everything `reset()` zeroes, plus the current settings."""

    def __init__(self, settings: DemoSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = threading.Lock()
        self.clock = clock
        self.initial = settings
        self.settings = settings
        self._limiter = RateLimiter(settings.rps, settings.burst)
        self._window = FixedWindows(settings.window_limit, settings.window_seconds)
        self._quota = QuotaWindows(settings.quota, settings.quota_reset)
        self._busy: dict[str, int] = {}  # key -> requests in flight holding a slot
        self._passed = 0  # requests past auth and limits, which `fault_every` counts
        self._counters = Counters()
        self._jobs: dict[str, tuple[float, dict[str, Any]]] = {}
        self._chat = ChatLimits(settings.chat_rpm, settings.chat_tpm, settings.chat_bucket_seconds)
        self._store = BatchStore()
        self._dialect_batches = DialectBatches()
        self._dialects = _DialectLimits(settings)
        self._local = LocalSlots()
        self._epoch = 0  # bumped by reset(), so requests admitted before it are not counted after it
        self._seed(settings.seed)

    def _seed(self, seed: int) -> None:
        # One generator per behaviour, so turning one knob does not reshuffle the others.
        self._fault_rng = random.Random(f"{seed}:fault")
        self._slow_rng = random.Random(f"{seed}:slow")
        self._malformed_rng = random.Random(f"{seed}:malformed")
        self._overload_rng = random.Random(f"{seed}:overload")

    # -- control ---------------------------------------------------------------------------

    def reset(self, **changes: Any) -> DemoSettings:
        """Zero counters, limits, quotas, jobs, files, batches and random draws.

        Settings return to those the state was created with, then `changes` apply: a
        reset server behaves like a freshly started one, whatever earlier tests configured.
        """
        settings = self.initial.replace(**changes)  # validate before touching anything
        with self.lock:
            self.settings = settings
            self._limiter = RateLimiter(settings.rps, settings.burst)
            self._window = FixedWindows(settings.window_limit, settings.window_seconds)
            self._quota = QuotaWindows(settings.quota, settings.quota_reset)
            self._busy = {}
            self._passed = 0
            self._counters = Counters()
            self._jobs = {}
            self._chat = ChatLimits(settings.chat_rpm, settings.chat_tpm, settings.chat_bucket_seconds)
            self._dialects = _DialectLimits(settings)
            self._epoch += 1
            self._store = BatchStore(salt=str(self._epoch))  # ids of the cleared store never come back
            self._dialect_batches = DialectBatches(salt=str(self._epoch))
            self._seed(settings.seed)
        return settings

    def configure(self, **changes: Any) -> DemoSettings:
        """Apply `changes` to the current settings; keep counters, buckets, quotas, jobs and batches."""
        with self.lock:
            settings = self.settings.replace(**changes)
            if settings.seed != self.settings.seed:
                self._seed(settings.seed)
            self.settings = settings
            self._limiter.rps, self._limiter.burst = settings.rps, settings.burst
            self._window.limit, self._window.period = settings.window_limit, settings.window_seconds
            self._quota.limit, self._quota.period = settings.quota, settings.quota_reset
            self._chat.set(settings.chat_rpm, settings.chat_tpm, settings.chat_bucket_seconds)
            self._dialects.set(settings)
        return settings

    def restarted(self) -> None:
        """Forget what a provider keeps only in its process's memory: token buckets (the chat
        endpoint's too) and fixed windows start afresh. Counters, quotas (a provider bills them
        from a database), jobs, files, batches and settings stay."""
        with self.lock:
            self._limiter.clear()
            self._window.clear()
            self._chat.clear()
            self._dialects.clear()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            self._settle()  # a batch that finished since its last read is billed now
            return self._counters.snapshot()

    # -- per request -----------------------------------------------------------------------

    def witness(self, places: list[str]) -> None:
        """A request carried a key in each of ``places`` (see ``Counters.key_places``)."""
        if places:
            with self.lock:
                for place in places:
                    self._counters.key_places[place] = self._counters.key_places.get(place, 0) + 1

    def admit(
        self,
        endpoint: str,
        path: str,
        authorization: str | None,
        idempotency_key: str | None,
        *,
        public: bool = False,
        api: str | None = None,
    ) -> Admission:
        """Count a /v1 request and decide its fate; hand the result to `finish`.  ``public``: an
        endpoint that asks for no key (as httpbin's); a request without one is limited as one
        caller of its own.  ``api``: the LLM dialect the endpoint speaks, counted in ``by_api``."""
        with self.lock:
            admission = Admission(self._epoch, api)
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
            if public and key is None:
                key = ""  # the callers without a key, as one
            admission.label = "public" if key == "" else key_label(key)
            c.count_key(admission.label, "requests")
            if key is None or (key not in settings.api_keys and not public):
                c.auth_rejected += 1
                c.count_key(admission.label, "rejected")
                admission.rejection = (401, "invalid api key", None)
                return admission
            c.auth_ok += 1
            admission.rejection = self._limit(key, path, admission)
            if admission.rejection is not None:
                return admission
            c.admit(self.clock(), admission.label)
            if settings.slow_rate and self._slow_rng.random() < settings.slow_rate:
                admission.slow = settings.slow_latency
            self._passed += 1
            every = settings.fault_every is not None and self._passed % settings.fault_every == 0
            # Drawn whether or not `fault_every` already decided, so the random faults fall on
            # the same requests with or without it.
            drawn = bool(settings.fault_rate) and self._fault_rng.random() < settings.fault_rate
            if every or drawn:
                admission.rejection = (
                    settings.fault_status,
                    "rate limited" if settings.fault_status == 429 else "service unavailable",
                    settings.fault_retry_after,
                )
            return admission

    def _limit(self, key: str, path: str, admission: Admission) -> Rejection | None:
        """The key's limits, in order; the first that refuses answers. Called under the lock."""
        settings, c = self.settings, self._counters
        if settings.max_in_flight is not None:
            busy = self._busy.get(key, 0)
            if busy >= settings.max_in_flight:
                c.rate_limited += 1
                c.count_key(admission.label, "rate_limited")
                # No hint: a concurrency limit cannot know when a slot frees up.
                return (settings.max_in_flight_status, "too many concurrent requests", None)
        # Held from here until `finish`, whatever the answer: the server is busy with it.
        self._busy[key] = self._busy.get(key, 0) + 1
        admission.key = key
        now = self.clock()
        wait = self._limiter.acquire(key, now) or self._window.acquire(key, now)
        if wait:
            c.rate_limited += 1
            c.count_key(admission.label, "rate_limited")
            return (429, "rate limited", wait)
        prefixes, quota_keys = settings.quota_endpoints, settings.quota_keys
        if (
            settings.quota is not None
            and (prefixes is None or path.startswith(prefixes))
            and (quota_keys is None or key in quota_keys)
        ):
            wait = self._quota.acquire(key, now)
            admission.headers = {
                "X-RateLimit-Limit": str(settings.quota),
                "X-RateLimit-Remaining": str(self._quota.remaining(key, now)),
            }
            if wait:
                c.quota_exceeded += 1
                c.count_key(admission.label, "quota_exceeded")
                return (429, "daily quota exceeded", wait)
        return None

    def finish(self, status: int, admission: Admission) -> bool:
        """Count a response's status; True when this 200 response should be malformed."""
        with self.lock:
            if admission.epoch != self._epoch:  # admitted before a reset: belongs to zeroed counters
                return False
            c = self._counters
            c.by_status[status] = c.by_status.get(status, 0) + 1
            if admission.api is not None:
                c.count_api_status(admission.api, status)
            if status == 200:
                c.count_key(admission.label, "ok")
            c.in_flight -= 1
            if admission.key is not None:
                self._busy[admission.key] -= 1
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

    # -- chat ------------------------------------------------------------------------------

    def chat_admit(
        self, authorization: str | None, answer: dict[str, Any], garbled: bool = False, *, api: str = "openai"
    ) -> ChatVerdict:
        """Weigh a chat answer against the key's per-minute limits; count it when admitted
        (``garbled``: made invalid on purpose, billed all the same). The Responses API
        (``api="openai-responses"``) shares these limits, as OpenAI's do per organization."""
        usage = answer["usage"]
        key = _bearer(authorization)
        with self.lock:
            verdict = self._chat.admit(key or "", self.clock(), answer["model"], usage["total_tokens"])
            c = self._counters
            if verdict.kind is None:
                if api != "openai-responses":
                    c.count_chat(answer, garbled=garbled)
                c.count_api_usage(api, usage["prompt_tokens"], usage["completion_tokens"])
            else:
                c.rate_limited += 1
                c.count_key(key_label(key), "rate_limited")
                c.chat_rate_limited[verdict.kind] += 1
            return verdict

    # -- the other dialects ----------------------------------------------------------------

    def overloaded(self, api: str) -> bool:
        """Whether dialect `api` answers this request as overloaded (see the ``overload_*``
        settings)."""
        with self.lock:
            settings = self.settings
            if settings.overload_apis is not None and api not in settings.overload_apis:
                return False
            if overloaded(self.clock(), settings.overload_seconds, settings.overload_period):
                return True
            return bool(settings.overload_rate) and self._overload_rng.random() < settings.overload_rate

    def _refused(self, key: str, refusal: Refusal | None) -> Refusal | None:
        if refusal is not None:
            self._counters.rate_limited += 1
            self._counters.count_key(key_label(key), "rate_limited")
        return refusal

    def anthropic_admit(
        self, key: str, input_tokens: int, max_tokens: int
    ) -> tuple[Refusal | None, dict[str, tuple[int, int, float]]]:
        """Take a Messages request under the key's limits, reserving `max_tokens` of output:
        (the refusal or None, each limit's (limit, remaining, seconds until full))."""
        with self.lock:
            now, limits = self.clock(), self._dialects.anthropic
            refusal = self._refused(key, limits.admit(key, now, input_tokens, max_tokens))
            return refusal, limits.state(key, now)

    def anthropic_settle(self, key: str, reserved: int, used: int) -> dict[str, tuple[int, int, float]]:
        """An answer used `used` of its `reserved` output tokens; each limit's state after."""
        with self.lock:
            now, limits = self.clock(), self._dialects.anthropic
            limits.settle(key, now, reserved, used)
            return limits.state(key, now)

    def gemini_admit(self, key: str, tokens: int) -> tuple[Refusal | None, float | None]:
        """Count a generateContent request of `tokens` input tokens in the key's minute window
        and its day: (the per-minute refusal or None, the seconds until the day's quota resets
        when the day's is spent, else None)."""
        with self.lock:
            now, day = self.clock(), self._dialects.gemini_day
            if day.remaining(key, now) == 0:
                self._refused(key, Refusal("requests_per_day", 0.0))
                return None, day.acquire(key, now)
            refusal = self._refused(key, self._dialects.gemini.admit(key, now, tokens))
            if refusal is None:
                day.acquire(key, now)
            return refusal, None

    def azure_admit(self, key: str, weight: int) -> tuple[Refusal | None, tuple[int | None, int | None]]:
        """Count a request of `weight` tokens (prompt + max_tokens) in the key's 10 s window:
        (the refusal or None, the requests and tokens left in the window)."""
        with self.lock:
            now, limits = self.clock(), self._dialects.azure
            refusal = self._refused(key, limits.admit(key, now, weight))
            return refusal, limits.remaining(key, now)

    def bedrock_admit(self, key: str, weight: int) -> Refusal | None:
        with self.lock:
            return self._refused(key, self._dialects.bedrock.admit(key, self.clock(), weight))

    def count_usage(self, api: str, input_tokens: int, output_tokens: int) -> None:
        """The tokens of one answer of dialect `api` (see ``by_api``)."""
        with self.lock:
            self._counters.count_api_usage(api, input_tokens, output_tokens)

    def local_claim(self) -> bool | asyncio.Future[None]:
        """A decode slot of the local server: True when taken, a future to await when queued,
        False when the queue is full too."""
        with self.lock:
            settings = self.settings
            return self._local.claim(settings.local_slots or 1, settings.local_queue)

    def local_release(self) -> None:
        with self.lock:
            self._local.release()

    def local_forget(self, waiter: asyncio.Future[None]) -> None:
        """A queued request gave up; the slot it was handed, if any, goes on."""
        with self.lock:
            if not self._local.forget(waiter):
                self._local.release()

    # -- files and batches -----------------------------------------------------------------

    def _settle(self) -> None:
        """Publish finished batches and count their answers. Called under the lock."""
        for answer in self._store.complete_due(self.clock()):
            self._counters.count_chat(answer, batch=True)
        for api, (model, used_in, used_out) in self._dialect_batches.settle(self.clock()):
            usage = {"prompt_tokens": used_in, "completion_tokens": used_out}
            self._counters.count_chat({"model": model, "usage": usage}, batch=True)
            self._counters.count_api_usage(api, used_in, used_out)

    def add_file(self, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        with self.lock:
            return self._store.add_file(filename, purpose, data, time.time()).doc()

    def file(self, file_id: str) -> StoredFile | None:
        with self.lock:
            self._settle()
            return self._store.files.get(file_id)

    def create_batch(
        self, input_file_id: str, endpoint: str, metadata: dict[str, str] | None, prepared: Prepared
    ) -> dict[str, Any]:
        """Register a batch whose `prepared` answers are published after `batch_seconds`."""
        with self.lock:
            now, seconds = self.clock(), self.settings.batch_seconds
            batch = self._store.create(
                input_file_id, endpoint, metadata, prepared, seconds=seconds, now=now, wall=time.time()
            )
            self._counters.batches_created += 1
            self._settle()
            return batch.doc(now)

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        with self.lock:
            self._settle()
            batch = self._store.batches.get(batch_id)
            return None if batch is None else batch.doc(self.clock())

    def cancel_batch(self, batch_id: str) -> tuple[dict[str, Any] | None, str | None]:
        """(the batch, None) once asked to stop; (the batch, its status) when too late to."""
        with self.lock:
            self._settle()
            batch = self._store.batches.get(batch_id)
            if batch is None:
                return None, None
            now = self.clock()
            refused = self._store.cancel(batch, now)
            self._settle()
            return batch.doc(now), refused

    def batch_list(self, limit: int, after: str | None) -> tuple[list[dict[str, Any]], bool]:
        with self.lock:
            self._settle()
            batches, more = self._store.listing(limit, after)
            now = self.clock()
            return [b.doc(now) for b in batches], more

    def dialect_batch_id(self, api: str) -> str:
        """A new id for a batch of `api` ("anthropic" or "gemini"), before its answers are made."""
        with self.lock:
            return self._dialect_batches.new_id(api)

    def add_dialect_batch(
        self, api: str, batch_id: str, lines: tuple[Line, ...], *, model: str = "", name: str = ""
    ) -> tuple[DialectBatch, float]:
        """Register an Anthropic or Gemini batch of `lines`, answered after `batch_seconds`; the
        batch and the clock it reads by."""
        with self.lock:
            now = self.clock()
            batch = DialectBatch(
                batch_id, api, lines, self.settings.batch_seconds, now, time.time(), model, name
            )
            self._dialect_batches.create(batch)
            self._counters.batches_created += 1
            return batch, now

    def dialect_batch(self, batch_id: str) -> tuple[DialectBatch | None, float]:
        with self.lock:
            self._settle()
            return self._dialect_batches.batches.get(batch_id), self.clock()

    def dialect_batch_list(self, api: str) -> tuple[list[DialectBatch], float]:
        """The batches of `api`, newest first, and the clock they read by."""
        with self.lock:
            self._settle()
            return self._dialect_batches.listing(api), self.clock()

    def __repr__(self) -> str:
        c = self._counters
        return (
            f"<DemoState requests={c.requests} in_flight={c.in_flight} jobs={len(self._jobs)} "
            f"batches={len(self._store.batches)} {self._limiter!r} {self._window!r} {self._chat!r}>"
        )


class _DialectLimits:
    """The per-key limits of the other dialects, made from the settings."""

    def __init__(self, settings: DemoSettings) -> None:
        s = settings
        self.anthropic = AnthropicLimits(s.anthropic_rpm, s.anthropic_itpm, s.anthropic_otpm)
        self.gemini = WindowLimits(s.gemini_rpm, s.gemini_tpm, 60.0)
        self.gemini_day = QuotaWindows(s.gemini_rpd, s.gemini_day_seconds)
        self.azure = WindowLimits(s.azure_rpm, s.azure_tpm, s.azure_window_seconds)
        self.bedrock = BucketLimits(s.bedrock_rpm, s.bedrock_tpm)

    def set(self, s: DemoSettings) -> None:
        self.anthropic.set(s.anthropic_rpm, s.anthropic_itpm, s.anthropic_otpm)
        self.gemini.requests, self.gemini.tokens = s.gemini_rpm, s.gemini_tpm
        self.gemini_day.limit, self.gemini_day.period = s.gemini_rpd, s.gemini_day_seconds
        self.azure.requests, self.azure.tokens = s.azure_rpm, s.azure_tpm
        self.azure.period = s.azure_window_seconds
        self.bedrock.set(s.bedrock_rpm, s.bedrock_tpm)

    def clear(self) -> None:
        """Forget the buckets and windows a provider keeps in memory; the day's quota stays."""
        for limits in (self.anthropic, self.gemini, self.azure, self.bedrock):
            limits.clear()


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
