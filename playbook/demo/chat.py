"""A deterministic stand-in for an OpenAI-compatible chat completions endpoint.

No model is involved: the answer is derived from the last user message (see `answers`), so
the same messages always get the same reply:

- a plain request gets text: an industry label when the prompt says "classify", else a
  one-line summary;
- ``response_format={"type": "json_schema", ...}`` gets a JSON object valid against the
  schema (see `schema_fill`); a strict schema is first held to OpenAI's strict-mode rules
  (see `schema_check`), and one that breaks them is a 400;
- ``{"type": "json_object"}`` gets ``{"answer": <the plain answer>}``.

``max_tokens`` (or ``max_completion_tokens``) cuts the content to that many tokens, with
``finish_reason: "length"``. Tokens are counted as OpenAI's rule of thumb has it: about four
characters each, plus four per message for the prompt.

``invalid_json_rate`` makes that share of JSON answers invalid (cut in half, as a model that
lost its way would leave them), chosen by a digest of the messages alone: the same
conversation always gets the same verdict, and one more message (a re-ask) draws again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from playbook.demo.answers import classify, summarise
from playbook.demo.fakedata import digest, unit
from playbook.demo.schema_check import SchemaError, check_format_name, check_strict
from playbook.demo.schema_fill import fill
from playbook.demo.wire import openai_error

__all__ = ["ChatRequestError", "complete", "complete_judged", "tokens"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_FORMATS = ("json_object", "json_schema", "text")


class ChatRequestError(ValueError):
    """A bad chat request; `param` names the offending field, OpenAI style."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return openai_error(str(self), param=self.param, code=self.code)


@dataclass(frozen=True, slots=True)
class _Request:
    model: str
    messages: list[dict[str, Any]]
    prompt: str  # the last user message's text
    answer_format: str  # "text", "json_object" or "json_schema"
    schema: dict[str, Any] | None
    schema_name: str
    max_tokens: int | None


def complete(body: Any, *, invalid_json_rate: float = 0.0) -> dict[str, Any]:
    """Answer a chat completions request body (already parsed from JSON)."""
    return complete_judged(body, invalid_json_rate=invalid_json_rate)[0]


def complete_judged(body: Any, *, invalid_json_rate: float = 0.0) -> tuple[dict[str, Any], bool]:
    """The answer, and whether it was made invalid on purpose: a billed answer its client must
    refuse, which the provider counts apart (``chat_invalid``)."""
    request = _parse(body)
    content = _content(request)
    texts = [[m["role"], _text(m.get("content"))] for m in request.messages]
    garbled = (
        request.answer_format != "text"
        and bool(invalid_json_rate)
        and unit(digest("invalid-json", json.dumps(texts))) < invalid_json_rate
    )
    if garbled:
        content = content[: max(1, len(content) // 2)]  # a strict prefix of an object is never valid JSON
    finish = "stop"
    if request.max_tokens is not None and tokens(content) > request.max_tokens:
        content, finish = content[: request.max_tokens * 4], "length"
    asked: list[Any] = [request.model, texts]
    if request.answer_format != "text" or request.max_tokens is not None:
        asked += [request.answer_format, request.schema, request.max_tokens]
    canonical = json.dumps(asked, ensure_ascii=False)
    prompt_tokens = sum(tokens(text) + 4 for _, text in texts)
    completion_tokens = tokens(content)
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    answer = {
        "id": f"chatcmpl-{digest('chat', canonical):016x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "system_fingerprint": "playbook-demo",
        "service_tier": "default",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
    }
    return answer, garbled


def tokens(text: str) -> int:
    """Tokens in `text` by the usual ~4 characters per token (at least one)."""
    return max(1, (len(text) + 3) // 4)


def _content(request: _Request) -> str:
    prompt = request.prompt
    if request.answer_format == "json_schema" and request.schema is not None:
        try:
            value = fill(request.schema, prompt)
        except SchemaError as exc:
            raise ChatRequestError(
                exc.describe(request.schema_name), "response_format", "invalid_json_schema"
            ) from None
        return json.dumps(value, ensure_ascii=False)
    answer = classify(prompt) if "classify" in prompt.lower() else summarise(prompt)
    if request.answer_format == "text":
        return answer
    return json.dumps({"answer": answer}, ensure_ascii=False)


def _parse(body: Any) -> _Request:
    if not isinstance(body, dict):
        raise ChatRequestError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ChatRequestError("'model' is required and must be a non-empty string", "model")
    messages = _messages(body.get("messages"))
    if body.get("stream"):
        raise ChatRequestError("stream=true is not supported by the demo provider", "stream")
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0 <= temperature <= 2
    ):
        raise ChatRequestError("'temperature' must be a number between 0 and 2", "temperature")
    if body.get("n", 1) != 1:
        raise ChatRequestError("the demo provider only returns n=1 choice", "n")
    limits = [_max_tokens(body, key) for key in ("max_tokens", "max_completion_tokens")]
    given = [n for n in limits if n is not None]
    answer_format, schema, name = _response_format(body.get("response_format"), messages)
    prompt = _text(messages[-1].get("content")) if messages[-1]["role"] == "user" else ""
    if not prompt:
        prompt = next(_text(m.get("content")) for m in reversed(messages) if m["role"] == "user")
    return _Request(model, messages, prompt, answer_format, schema, name, min(given) if given else None)


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("'messages' must be a non-empty array of messages", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ChatRequestError(
                f"messages[{i}].role must be one of {', '.join(sorted(_ROLES))}", f"messages[{i}].role"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ChatRequestError(
                f"messages[{i}].content must be a string or an array", f"messages[{i}].content"
            )
    if not any(m["role"] == "user" and _text(m.get("content")) for m in messages):
        raise ChatRequestError("'messages' must contain a user message with text", "messages")
    return messages


def _max_tokens(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ChatRequestError(
            f"Invalid '{key}': expected an integer of at least 1, but got {value!r} instead.",
            key,
            "integer_below_min_value",
        )
    return value


def _response_format(value: Any, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any] | None, str]:
    """The answer's format and, for json_schema, its schema (checked when strict) and name."""
    if value is None:
        return "text", None, ""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in _FORMATS:
        supported = ", ".join(repr(f) for f in _FORMATS)
        raise ChatRequestError(
            f"Invalid value: {kind!r}. Supported values are: {supported}.",
            "response_format.type",
            "invalid_value",
        )
    if kind == "json_object" and not any("json" in _text(m.get("content")).lower() for m in messages):
        raise ChatRequestError(
            "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'.",
            "messages",
        )
    if kind != "json_schema":
        return kind, None, ""
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ChatRequestError(
            "Missing required parameter: 'response_format.json_schema'.", "response_format.json_schema"
        )
    try:
        name = check_format_name(spec.get("name"))
    except ValueError as exc:
        raise ChatRequestError(str(exc), "response_format.json_schema.name") from None
    schema = spec.get("schema")
    if schema is None and not spec.get("strict"):
        return "json_object", None, name
    try:
        if spec.get("strict"):
            check_strict(schema)
        elif not isinstance(schema, dict):
            raise SchemaError("schema must be a JSON Schema object.")
    except SchemaError as exc:
        raise ChatRequestError(exc.describe(name), "response_format", "invalid_json_schema") from None
    return "json_schema", schema, name


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
