"""Message batches in Anthropic's shape and batch jobs in Gemini's, beside OpenAI's (`batches`).

Each request of a batch is answered when the batch is created, by the chat endpoint's own
`complete` over the request translated to a chat request (so the same prompt gets the same
answer in every dialect), and the answer translated back to the dialect's own reply:

- Anthropic: ``{"custom_id", "params"}`` with ``params`` a Messages request (``max_tokens``
  required; structured output as a forced tool, or ``output_format``); the reply a Message
  (a ``tool_use`` block for a forced tool). A request the chat endpoint refuses is ``errored``.
- Gemini: ``{"request": GenerateContentRequest, "metadata": {"key"}}``; the reply a
  GenerateContentResponse. A request it refuses answers an ``error`` (a google.rpc.Status).

A batch reads in progress for its ``batch_seconds`` (Gemini: ``BATCH_STATE_PENDING`` for the first
tenth, then ``_RUNNING``), then ended with every answer. ``batch_expired_rate`` of requests
(drawn by batch and request) are never answered: Anthropic's result ``expired``; a Gemini batch
that draws one expires whole (``BATCH_STATE_EXPIRED``, no responses), as Gemini's do.
`DialectBatches` is not thread-safe: the demo state calls it under its lock.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from playbook.demo.chat import ChatRequestError, complete
from playbook.demo.fakedata import digest, unit

__all__ = ["ANTHROPIC", "GEMINI", "BatchProblem", "DialectBatch", "DialectBatches", "Line"]

ANTHROPIC, GEMINI = "anthropic", "gemini"
MAX_REQUESTS = 100_000
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PENDING = 0.1  # share of batch_seconds a Gemini batch reads pending


class BatchProblem(ValueError):
    """A batch the endpoint refuses whole (a 400 naming the field at fault)."""


@dataclass(frozen=True, slots=True)
class Line:
    """One request's fate: its key, the dialect's answer or error, the chat completion it was made
    of (what the counters count) and whether it expires unanswered."""

    key: str | None
    answer: dict[str, Any] | None
    error: dict[str, Any] | None
    chat: dict[str, Any] | None
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
            doc["response"] = {
                "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput",
                "inlinedResponses": {"inlinedResponses": inlined},
            }
        return doc

    def answered(self) -> list[dict[str, Any]]:
        """The chat completions behind the answers it gave, once ended: what is billed."""
        if self.expired():
            return []
        return [line.chat for line in self.lines if line.chat is not None and not line.expired]


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

    def settle(self, now: float) -> list[dict[str, Any]]:
        """The answers of batches that ended by `now` and were not counted yet."""
        answered: list[dict[str, Any]] = []
        for batch in self.batches.values():
            if not batch.counted and batch.ended(now):
                batch.counted = True
                answered += batch.answered()
        return answered


# -- preparing: each request answered at creation ------------------------------------------------


def anthropic_lines(body: Any, batch_id: str, expired_rate: float) -> tuple[Line, ...]:
    """The lines of a Message Batch request body, or BatchProblem."""
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not 1 <= len(requests) <= MAX_REQUESTS:
        raise BatchProblem(f"requests: must be a list of 1 to {MAX_REQUESTS} requests")
    seen: set[str] = set()
    lines = []
    for i, request in enumerate(requests):
        key = request.get("custom_id") if isinstance(request, dict) else None
        if not isinstance(key, str) or not _CUSTOM_ID.match(key):
            raise BatchProblem(f"requests.{i}.custom_id: must be 1 to 64 letters, digits, '_' or '-'")
        if key in seen:
            raise BatchProblem(f"requests.{i}.custom_id: {key!r} is used twice; each must be unique")
        seen.add(key)
        params = request.get("params")
        expired = bool(expired_rate) and unit(digest("expired", batch_id, key)) < expired_rate
        try:
            chat = complete(_anthropic_chat(params))
        except (ChatRequestError, BatchProblem) as exc:
            error = {"type": "invalid_request_error", "message": str(exc)}
            lines.append(Line(key, None, error, None, expired))
            continue
        lines.append(Line(key, _anthropic_message(params, chat), None, chat, expired))
    return tuple(lines)


def _anthropic_chat(params: Any) -> dict[str, Any]:
    """A Messages request as the chat request the demo answers."""
    if not isinstance(params, dict):
        raise BatchProblem("params: must be an object (a Messages request)")
    if not isinstance(params.get("max_tokens"), int):
        raise BatchProblem("max_tokens: Field required")
    system = params.get("system")
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(system)}] if system else []
    for m in params.get("messages") or []:
        if isinstance(m, dict):
            messages.append({"role": m.get("role"), "content": _text(m.get("content"))})
    chat: dict[str, Any] = {"model": params.get("model"), "messages": messages}
    if isinstance(params.get("temperature"), (int, float)):
        chat["temperature"] = params["temperature"]
    schema = _anthropic_schema(params)
    if schema is not None:
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    else:
        chat["max_tokens"] = params["max_tokens"]
    return chat


def _anthropic_schema(params: dict[str, Any]) -> dict[str, Any] | None:
    """The schema of a forced tool (``tool_choice`` naming one) or of ``output_format``."""
    choice = params.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "tool":
        for tool in params.get("tools") or []:
            if isinstance(tool, dict) and tool.get("name") == choice.get("name"):
                schema = tool.get("input_schema")
                return schema if isinstance(schema, dict) else None
    form = params.get("output_format")
    if isinstance(form, dict) and isinstance(form.get("schema"), dict):
        return form["schema"]  # type: ignore[no-any-return]
    return None


def _anthropic_message(params: dict[str, Any], chat: dict[str, Any]) -> dict[str, Any]:
    choice = chat["choices"][0]
    text, usage = choice["message"]["content"], chat["usage"]
    forced = params.get("tool_choice")
    content: list[dict[str, Any]]
    stop = "max_tokens" if choice["finish_reason"] == "length" else "end_turn"
    if isinstance(forced, dict) and forced.get("type") == "tool":
        tool_id = f"toolu_{digest('tool', chat['id']):016x}"
        content, stop = (
            [{"type": "tool_use", "id": tool_id, "name": forced.get("name"), "input": json.loads(text)}],
            "tool_use",
        )
    else:
        content = [{"type": "text", "text": text}]
    return {
        "id": f"msg_{digest('message', chat['id']):024x}",
        "type": "message",
        "role": "assistant",
        "model": chat["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def gemini_lines(batch: Any, model: str, batch_id: str, expired_rate: float) -> tuple[Line, ...]:
    """The lines of a batchGenerateContent ``batch``, or BatchProblem."""
    config = _field(batch, "inputConfig", "input_config")
    holder = _field(config, "requests")
    requests = _field(holder, "requests")
    if not isinstance(requests, list) or not requests:
        raise BatchProblem(
            "batch.input_config.requests.requests: must be a non-empty list (or give a file_name)"
        )
    lines = []
    for i, item in enumerate(requests):
        meta = _field(item, "metadata")
        key = meta.get("key") if isinstance(meta, dict) else None
        expired = bool(expired_rate) and unit(digest("expired", batch_id, str(key or i))) < expired_rate
        try:
            chat = complete(_gemini_chat(_field(item, "request"), model))
        except (ChatRequestError, BatchProblem) as exc:
            error = {"code": 400, "message": str(exc), "status": "INVALID_ARGUMENT"}
            lines.append(Line(key, None, error, None, expired))
            continue
        lines.append(Line(key, _gemini_response(chat), None, chat, expired))
    return tuple(lines)


def _field(doc: Any, *names: str) -> Any:
    """A field of a JSON object by any of its spellings (proto JSON takes camelCase and snake_case)."""
    if not isinstance(doc, dict):
        return None
    return next((doc[name] for name in names if name in doc), None)


def _gemini_chat(request: Any, model: str) -> dict[str, Any]:
    """A GenerateContentRequest as the chat request the demo answers."""
    if not isinstance(request, dict):
        raise BatchProblem("request: must be a GenerateContentRequest object")
    system = _field(request, "systemInstruction", "system_instruction")
    messages: list[dict[str, Any]] = [{"role": "system", "content": _parts(system)}] if system else []
    for content in _field(request, "contents") or []:
        role = "assistant" if _field(content, "role") == "model" else "user"
        messages.append({"role": role, "content": _parts(content)})
    chat: dict[str, Any] = {"model": model, "messages": messages}
    config = _field(request, "generationConfig", "generation_config") or {}
    schema = _field(config, "responseJsonSchema", "response_json_schema") or _lowered(
        _field(config, "responseSchema", "response_schema")
    )
    if isinstance(schema, dict):
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": schema},
        }
    elif isinstance(_field(config, "maxOutputTokens", "max_output_tokens"), int):
        chat["max_tokens"] = _field(config, "maxOutputTokens", "max_output_tokens")
    temperature = _field(config, "temperature")
    if isinstance(temperature, (int, float)):
        chat["temperature"] = temperature
    return chat


def _lowered(schema: Any) -> Any:
    """An OpenAPI schema as Gemini's ``responseSchema`` spells it (``"type": "OBJECT"``), in JSON
    Schema's lower case."""
    if isinstance(schema, dict):
        return {
            k: v.lower() if k == "type" and isinstance(v, str) else _lowered(v) for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_lowered(v) for v in schema]
    return schema


def _gemini_response(chat: dict[str, Any]) -> dict[str, Any]:
    choice, usage = chat["choices"][0], chat["usage"]
    return {
        "candidates": [
            {
                "content": {"parts": [{"text": choice["message"]["content"]}], "role": "model"},
                "finishReason": "MAX_TOKENS" if choice["finish_reason"] == "length" else "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": usage["prompt_tokens"],
            "candidatesTokenCount": usage["completion_tokens"],
            "totalTokenCount": usage["prompt_tokens"] + usage["completion_tokens"],
        },
        "modelVersion": chat["model"],
        "responseId": f"{digest('response', chat['id']):016x}",
    }


def _text(content: Any) -> str:
    """Anthropic content (a string, or blocks of which the text ones count) as text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def _parts(content: Any) -> str:
    parts = _field(content, "parts")
    if not isinstance(parts, list):
        return ""
    return "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
