"""Message batches in Anthropic's shape and batch jobs in Gemini's, beside OpenAI's (`batches`).

Each request of a batch is answered when the batch is created, as the dialect's online
endpoint answers it (see `dialect_batch_api`), into a `Line`: its key, its answer or its error.

- Anthropic: ``{"custom_id", "params"}``; the reply a Message; a request the Messages endpoint
  refuses is ``errored``.
- Gemini: ``{"request": GenerateContentRequest, "metadata": {"key"}}``; the reply a
  GenerateContentResponse; a request it refuses answers an ``error`` (a google.rpc.Status).

A batch reads in progress for its ``batch_seconds`` (Gemini: ``BATCH_STATE_PENDING`` for the first
tenth, then ``_RUNNING``), then ended with every answer. ``batch_expired_rate`` of requests
(drawn by batch and request) are never answered: Anthropic's result ``expired``; a Gemini batch
that draws one expires whole (``BATCH_STATE_EXPIRED``, no responses), as Gemini's do.
`DialectBatches` is not thread-safe: the demo state calls it under its lock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from playbook.demo.fakedata import digest, unit

__all__ = ["ANTHROPIC", "GEMINI", "BatchProblem", "DialectBatch", "DialectBatches", "Line", "expires"]

ANTHROPIC, GEMINI = "anthropic", "gemini"
_PENDING = 0.1  # share of batch_seconds a Gemini batch reads pending


class BatchProblem(ValueError):
    """A batch the endpoint refuses whole (a 400 naming the field at fault)."""


def expires(rate: float, batch_id: str, key: str) -> bool:
    """Is the request `key` of `batch_id` among the `rate` share left unanswered?"""
    return bool(rate) and unit(digest("expired", batch_id, key)) < rate


@dataclass(frozen=True, slots=True)
class Line:
    """One request's fate: its key, the dialect's answer or error, what an answer used
    ``(model, input tokens, output tokens)``: what the counters count, and whether it expires
    unanswered."""

    key: str | None
    answer: dict[str, Any] | None
    error: dict[str, Any] | None
    usage: tuple[str, int, int] | None
    expired: bool


@dataclass(slots=True)
class DialectBatch:
    id: str
    api: str
    lines: tuple[Line, ...]
    seconds: float
    born: float  # the state's clock at creation
    wall: float  # the wall time at creation
    model: str = ""
    display_name: str = ""
    counted: bool = False

    def ended(self, now: float) -> bool:
        return now - self.born >= self.seconds

    def expired(self) -> bool:
        """A Gemini batch with a request drawn to expire expires whole."""
        return self.api == GEMINI and any(line.expired for line in self.lines)

    def stamp(self, after: float) -> str:
        return datetime.fromtimestamp(self.wall + after, UTC).isoformat().replace("+00:00", "Z")

    def anthropic_doc(self, now: float, base: str) -> dict[str, Any]:
        ended = self.ended(now)
        counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        for line in self.lines:
            kind = _anthropic_kind(line) if ended else "processing"
            counts["succeeded" if kind == "succeeded" else kind] += 1
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": counts,
            "ended_at": self.stamp(self.seconds) if ended else None,
            "created_at": self.stamp(0.0),
            "expires_at": self.stamp(86400.0),
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": f"{base}/v1/messages/batches/{self.id}/results" if ended else None,
        }

    def anthropic_results(self) -> bytes:
        rows = []
        for line in self.lines:
            kind = _anthropic_kind(line)
            result: dict[str, Any] = {"type": kind}
            if kind == "succeeded":
                result["message"] = line.answer
            elif kind == "errored":
                result["error"] = {"type": "error", "error": line.error}
            rows.append(json.dumps({"custom_id": line.key, "result": result}, ensure_ascii=False))
        return ("\n".join(rows) + "\n").encode("utf-8")

    def gemini_doc(self, now: float) -> dict[str, Any]:
        ended = self.ended(now)
        if ended:
            state = "BATCH_STATE_EXPIRED" if self.expired() else "BATCH_STATE_SUCCEEDED"
        else:
            state = (
                "BATCH_STATE_PENDING" if now - self.born < self.seconds * _PENDING else "BATCH_STATE_RUNNING"
            )
        done = state == "BATCH_STATE_SUCCEEDED"
        failed = sum(1 for line in self.lines if line.error is not None) if done else 0
        meta: dict[str, Any] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch",
            "model": f"models/{self.model}",
            "displayName": self.display_name,
            "createTime": self.stamp(0.0),
            "updateTime": self.stamp(min(now - self.born, self.seconds)),
            "batchStats": {
                "requestCount": str(len(self.lines)),
                "successfulRequestCount": str(len(self.lines) - failed if done else 0),
                "failedRequestCount": str(failed),
                "pendingRequestCount": str(0 if ended else len(self.lines)),
            },
            "state": state,
            "name": self.id,
        }
        doc: dict[str, Any] = {"name": self.id, "metadata": meta}
        if ended:
            meta["endTime"] = self.stamp(self.seconds)
            doc["done"] = True
        if done:
            inlined = [
                {
                    "metadata": {"key": line.key},
                    **({"error": line.error} if line.error else {"response": line.answer}),
                }
                for line in self.lines
            ]
            output = {"inlinedResponses": {"inlinedResponses": inlined}}
            # The batch's output (what the SDK reads), and the operation's response (what REST readers do).
            meta["output"] = output
            doc["response"] = {
                "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput",
                **output,
            }
        return doc

    def answered(self) -> list[tuple[str, int, int]]:
        """What the answers it gave used, once ended: what is billed."""
        if self.expired():
            return []
        return [line.usage for line in self.lines if line.usage is not None and not line.expired]


def _anthropic_kind(line: Line) -> str:
    if line.expired:
        return "expired"
    return "errored" if line.error is not None else "succeeded"


class DialectBatches:
    """The Anthropic and Gemini batches of one demo state, with ids unique to its `salt`."""

    __slots__ = ("_made", "_salt", "batches")

    def __init__(self, salt: str = "") -> None:
        self.batches: dict[str, DialectBatch] = {}
        self._salt = salt
        self._made = 0

    def __repr__(self) -> str:
        return f"<DialectBatches {len(self.batches)}>"

    def create(self, batch: DialectBatch) -> DialectBatch:
        self.batches[batch.id] = batch
        return batch

    def new_id(self, api: str) -> str:
        self._made += 1
        number = digest(api, self._salt, str(self._made))
        return f"msgbatch_{number:024x}" if api == ANTHROPIC else f"batches/{number:016x}"

    def listing(self, api: str) -> list[DialectBatch]:
        """The dialect's batches, newest first."""
        return [b for b in reversed(self.batches.values()) if b.api == api]

    def settle(self, now: float) -> list[tuple[str, tuple[str, int, int]]]:
        """``(dialect, usage)`` of the answers of batches that ended by `now`, not counted yet."""
        answered: list[tuple[str, tuple[str, int, int]]] = []
        for batch in self.batches.values():
            if not batch.counted and batch.ended(now):
                batch.counted = True
                answered += [(batch.api, usage) for usage in batch.answered()]
        return answered
