"""The demo provider's request counters, as `/_stats` shows them.

Chat usage is counted per model for answered (200) chat requests and for the requests of
finished batches, so a test can check that the usage its client summed from the answers,
times a price, is exactly what the provider would bill.

Each place a request carried a key in is counted too (``key_places``), so a test can check that
a client sends its key where its tool's definition puts it and nowhere else.

Requests are also counted per API key (``by_key``), so a client that pools several keys can
be checked key by key. A key is shown by its label (`key_label`), never whole: "…" and its
last four characters ("…ey-a" for "key-a"), "none" without a bearer. Two keys ending alike
share a label, so a test gives its keys distinct endings.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["API_FIELDS", "KEY_FIELDS", "Counters", "key_label"]

# What `by_key` counts for each key: requests seen, let past every limit, answered 200,
# refused by a rate limit (bucket, window, in flight, chat per-minute), refused by the quota,
# and refused as an invalid (revoked or unknown) key.
KEY_FIELDS = ("requests", "admitted", "ok", "rate_limited", "quota_exceeded", "rejected")
# What `by_api` counts for each LLM dialect: requests, answered 200, refused 429 (its rate
# limits or quotas), refused as overloaded (503, 529), and the input and output tokens of its
# answers; plus `by_status`, every status it answered.
API_FIELDS = ("requests", "ok", "rate_limited", "overloaded", "input_tokens", "output_tokens")


def key_label(key: str | None) -> str:
    """How `by_key` names a bearer key: "…" and its last four characters; "none" for no key."""
    if key is None:
        return "none"
    # A key of four characters or fewer loses its first one, so no label is a whole key.
    return "…" + key[len(key) - min(4, len(key) - 1) :]


class Counters:
    """Plain counters; the demo state updates them under its lock."""

    __slots__ = (
        "admitted",
        "admitted_first",
        "admitted_last",
        "admitted_most_in_a_second",
        "admitted_recent",
        "auth_ok",
        "auth_rejected",
        "batches_created",
        "bulk_items",
        "by_api",
        "by_endpoint",
        "by_key",
        "by_status",
        "chat",
        "chat_batch",
        "chat_invalid",
        "chat_rate_limited",
        "duplicate_idempotency_keys",
        "idempotency_keys",
        "in_flight",
        "jobs_submitted",
        "key_places",
        "max_in_flight",
        "quota_exceeded",
        "rate_limited",
        "requests",
    )

    def __init__(self) -> None:
        self.requests = 0
        # Requests let past every limit (answered, or failed by a fault), and when the first and
        # the last were, on the provider's clock: the rate the provider granted, measured where
        # it is enforced rather than where the client sends from.
        self.admitted = 0
        self.admitted_first: float | None = None
        self.admitted_last: float | None = None
        # The most let in within any one second: the rate the provider granted where the client
        # kept it busy, which the client's pauses elsewhere in the run (starting workers, a
        # loaded machine) do not dilute as they do the span from first to last.
        self.admitted_most_in_a_second = 0
        self.admitted_recent: deque[float] = deque()  # when those of the last second were let in
        self.by_endpoint: dict[str, int] = {}
        # Per LLM dialect ("anthropic", "gemini", ...): its requests, answers, refusals and the
        # input and output tokens of its answers, so goodput and refusal shares read per dialect.
        self.by_api: dict[str, dict[str, Any]] = {}
        self.by_status: dict[int, int] = {}
        self.by_key: dict[str, dict[str, int]] = {}  # key_label -> KEY_FIELDS -> count
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
        self.chat: dict[str, list[int]] = {}  # model -> [requests, prompt_tokens, completion_tokens]
        self.chat_batch: dict[str, list[int]] = {}  # the part of `chat` that came from batches
        # the part of `chat` answered invalid on purpose (billed, refused by clients)
        self.chat_invalid: dict[str, list[int]] = {}
        self.chat_rate_limited = {"requests": 0, "tokens": 0}
        self.batches_created = 0
        # Where a request carried one of the provider's keys, whole ("header authorization",
        # "query", "path", "body"): a client should send its key only where its tool says.
        self.key_places: dict[str, int] = {}

    def admit(self, now: float, label: str) -> None:
        """One request, by the key labelled ``label``, passed every limit at ``now`` (the provider's
        clock)."""
        self.admitted += 1
        self.count_key(label, "admitted")
        if self.admitted_first is None:
            self.admitted_first = now
        self.admitted_last = now
        recent = self.admitted_recent
        recent.append(now)
        while recent[0] <= now - 1.0:
            recent.popleft()
        self.admitted_most_in_a_second = max(self.admitted_most_in_a_second, len(recent))

    def count_key(self, label: str, field: str) -> None:
        """One more of ``field`` (one of `KEY_FIELDS`) for the key labelled ``label``."""
        row = self.by_key.get(label)
        if row is None:
            row = self.by_key[label] = dict.fromkeys(KEY_FIELDS, 0)
        row[field] += 1

    def api_row(self, api: str) -> dict[str, Any]:
        """The counters of dialect `api` (see `API_FIELDS`), made on first use."""
        row = self.by_api.get(api)
        if row is None:
            row = self.by_api[api] = {**dict.fromkeys(API_FIELDS, 0), "by_status": {}}
        return row

    def count_api_status(self, api: str, status: int) -> None:
        """One request to dialect `api` answered with `status`."""
        row = self.api_row(api)
        row["requests"] += 1
        row["by_status"][str(status)] = row["by_status"].get(str(status), 0) + 1
        if status == 200:
            row["ok"] += 1
        elif status == 429:
            row["rate_limited"] += 1
        elif status in (503, 529):
            row["overloaded"] += 1

    def count_api_usage(self, api: str, input_tokens: int, output_tokens: int) -> None:
        """The tokens of one answer of dialect `api`."""
        row = self.api_row(api)
        row["input_tokens"] += input_tokens
        row["output_tokens"] += output_tokens

    def count_chat(self, answer: dict[str, Any], *, batch: bool = False, garbled: bool = False) -> None:
        """Count one answered chat completion's usage under its model (and apart, when it came
        from a batch or was answered invalid on purpose)."""
        usage = answer["usage"]
        tables = [self.chat]
        if batch:
            tables.append(self.chat_batch)
        if garbled:
            tables.append(self.chat_invalid)
        for table in tables:
            row = table.setdefault(answer["model"], [0, 0, 0])
            row[0] += 1
            row[1] += usage["prompt_tokens"]
            row[2] += usage["completion_tokens"]

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "admitted": self.admitted,
            "admitted_seconds": (self.admitted_last or 0.0) - (self.admitted_first or 0.0),
            "admitted_most_in_a_second": self.admitted_most_in_a_second,
            "by_endpoint": dict(self.by_endpoint),
            "by_api": {
                api: {**row, "by_status": dict(sorted(row["by_status"].items()))}
                for api, row in sorted(self.by_api.items())
            },
            "by_status": {str(status): n for status, n in sorted(self.by_status.items())},
            "by_auth": {"ok": self.auth_ok, "rejected": self.auth_rejected},
            "by_key": {label: dict(row) for label, row in sorted(self.by_key.items())},
            "idempotency_keys": dict(self.idempotency_keys),
            "duplicate_idempotency_keys": self.duplicate_idempotency_keys,
            "bulk_items": self.bulk_items,
            "jobs_submitted": self.jobs_submitted,
            "rate_limited": self.rate_limited,
            "quota_exceeded": self.quota_exceeded,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "chat": _usage(self.chat),
            "chat_batch": _usage(self.chat_batch),
            "chat_invalid": _usage(self.chat_invalid),
            "chat_rate_limited": dict(self.chat_rate_limited),
            "batches_created": self.batches_created,
            "key_places": dict(sorted(self.key_places.items())),
        }


def _usage(table: dict[str, list[int]]) -> dict[str, dict[str, int]]:
    return {
        model: {"requests": requests, "prompt_tokens": prompt, "completion_tokens": completion}
        for model, (requests, prompt, completion) in sorted(table.items())
    }
