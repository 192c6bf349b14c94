"""Gemini's ``generateContent``, as the demo speaks it:
``POST /v1beta/models/{model}:generateContent`` (and ``/v1/...``).

- the key in ``x-goog-api-key`` (or ``?key=``); a wrong one is Google's 400 ``API_KEY_INVALID``;
- ``contents`` (``role`` user or model, ``parts`` of ``text``), ``systemInstruction``,
  ``generationConfig`` (``temperature``, ``maxOutputTokens``, ``responseMimeType``,
  ``responseSchema`` in Google's OpenAPI subset, or ``responseJsonSchema``);
- the answer in ``candidates[0].content.parts[0].text`` with ``finishReason``, and
  ``usageMetadata`` (``promptTokenCount``, ``candidatesTokenCount``, ``totalTokenCount``);
- limits per key: ``gemini_rpm`` requests and ``gemini_tpm`` input tokens in windows of a
  minute, refused ``429 RESOURCE_EXHAUSTED`` with the wait only in the body (a
  ``google.rpc.RetryInfo`` ``retryDelay`` beside a ``QuotaFailure`` naming the per-minute
  quota), never in a header; ``gemini_rpd`` requests per day, refused with a ``QuotaFailure``
  naming ``GenerateRequestsPerDayPerProjectPerModel``; an overload is ``503 UNAVAILABLE``.

As documented at https://ai.google.dev/api/generate-content,
https://ai.google.dev/gemini-api/docs/rate-limits and https://cloud.google.com/apis/design/errors
(google.rpc.Status with RetryInfo and QuotaFailure details), and as ``google-genai`` calls it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from playbook.demo.dialect import Answer, Dialect, DialectError, answer, json_body, pause, text_of
from playbook.demo.dialect_limits import Refusal
from playbook.demo.responses import json_response
from playbook.demo.state import DemoState

__all__ = ["DIALECT", "PATH", "chat_body", "response_of", "routes"]

PATH = re.compile(r"^/v1(beta)?/models/[^/:]+:generateContent$")
_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_RATE_LIMITS = "https://ai.google.dev/gemini-api/docs/rate-limits"
_QUOTAS = {
    "requests": ("generate_content_requests", "GenerateRequestsPerMinutePerProjectPerModel"),
    "tokens": ("generate_content_input_token_count", "GenerateContentInputTokensPerModelPerMinute"),
    "requests_per_day": ("generate_content_requests", "GenerateRequestsPerDayPerProjectPerModel"),
}


def error(status: int, message: str, details: list[dict[str, Any]] | None = None) -> Response:
    """Google's error body: ``{"error": {"code", "message", "status", "details"?}}``."""
    body: dict[str, Any] = {"code": status, "message": message, "status": _STATUSES.get(status, "UNKNOWN")}
    if details:
        body["details"] = details
    return json_response({"error": body}, status)


def retry_delay(seconds: float) -> str:
    """A protobuf Duration as JSON writes it ("45.8s"), rounded up to the millisecond."""
    ms = max(1, -(-round(seconds * 1e6) // 1000))
    whole, frac = divmod(ms, 1000)
    return f"{whole}.{frac:03d}".rstrip("0").rstrip(".") + "s"


def _retry_info(seconds: float) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay(seconds)}


def _refuse(status: int, message: str, wait: float | None) -> Response:
    if status == 401:
        reason = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "API_KEY_INVALID",
            "domain": "googleapis.com",
            "metadata": {"service": "generativelanguage.googleapis.com"},
        }
        return error(400, "API key not valid. Please pass a valid API key.", [reason])
    if status == 429:
        # Google puts the wait in the body only; a client that looks for Retry-After finds none.
        return error(
            429, f"Resource has been exhausted ({message}).", None if wait is None else [_retry_info(wait)]
        )
    return error(status, message)


def _key(request: Request) -> str | None:
    return request.headers.get("x-goog-api-key") or request.query_params.get("key") or None


DIALECT = Dialect("gemini", _key, _refuse)


def routes(state: DemoState) -> list[tuple[str, str, Any]]:
    # v1beta as the REST reference has it; v1 as the SDK of today calls it.
    handler = _generate(state)
    return [("POST", f"/{version}/models/{{model}}:generateContent", handler) for version in ("v1beta", "v1")]


def _generate(state: DemoState) -> Any:
    async def generate(request: Request) -> Response:
        model = request.path_params["model"]
        try:
            body = await json_body(request)
            chat, json_kind = chat_body(model, body)
            reply = answer(chat, invalid_json_rate=state.settings.chat_invalid_json_rate)
        except DialectError as exc:
            return error(exc.status, exc.message)
        if state.overloaded("gemini"):
            return error(503, "The model is overloaded. Please try again later.")
        refusal, day_reset = state.gemini_admit(_key(request) or "", reply.input_tokens)
        if day_reset is not None:
            return _exhausted(Refusal("requests_per_day", day_reset), model, state.settings.gemini_rpd or 0)
        if refusal is not None:
            settings = state.settings
            limit = settings.gemini_rpm if refusal.kind == "requests" else settings.gemini_tpm
            return _exhausted(refusal, model, limit or 0)
        content = reply.content if json_kind != "object" else json.dumps({"answer": reply.content})
        await pause(request)
        state.count_usage("gemini", reply.input_tokens, reply.output_tokens)
        return json_response(response_of(model, content, reply))

    return generate


def chat_body(model: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The chat completions body asking what `body` asks, and the JSON asked for: "" (text),
    "object" (JSON without a schema) or "schema"."""
    chat: list[dict[str, Any]] = []
    system = body.get("systemInstruction") or body.get("system_instruction")
    if system is not None:
        parts = system.get("parts") if isinstance(system, dict) else None
        chat.append({"role": "system", "content": text_of(parts, "systemInstruction.parts")})
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise DialectError(400, "* GenerateContentRequest.contents: contents is not specified")
    for i, content in enumerate(contents):
        if not isinstance(content, dict):
            raise DialectError(400, f"* GenerateContentRequest.contents[{i}]: must be an object")
        role = content.get("role") or "user"
        if role not in ("user", "model"):
            raise DialectError(400, f"* GenerateContentRequest.contents[{i}].role: must be 'user' or 'model'")
        text = text_of(content.get("parts"), f"* GenerateContentRequest.contents[{i}].parts")
        chat.append({"role": "user" if role == "user" else "assistant", "content": text})
    if not any(m["role"] == "user" and m["content"] for m in chat):  # said in Gemini's names, not chat's
        raise DialectError(400, "* GenerateContentRequest.contents: must contain a user turn with text")
    out: dict[str, Any] = {"model": model, "messages": chat}
    config = body.get("generationConfig") or body.get("generation_config") or {}
    if not isinstance(config, dict):
        raise DialectError(400, "* GenerateContentRequest.generation_config: must be an object")
    most = config.get("maxOutputTokens", config.get("max_output_tokens"))
    if most is not None:
        out["max_tokens"] = most
    mime = config.get("responseMimeType", config.get("response_mime_type")) or "text/plain"
    schema = config.get("responseJsonSchema", config.get("response_json_schema"))
    if schema is None and (given := config.get("responseSchema", config.get("response_schema"))) is not None:
        schema = json_schema(given)
    if schema is not None and mime != "application/json":
        raise DialectError(
            400,
            "* GenerateContentRequest.generation_config.response_mime_type: a response "
            "schema needs responseMimeType application/json",
        )
    if mime == "text/plain":
        return out, ""
    if mime != "application/json":
        raise DialectError(
            400,
            f"* GenerateContentRequest.generation_config.response_mime_type: {mime!r} "
            "is not supported; use text/plain or application/json",
        )
    if schema is None:
        return out, "object"
    out.pop("max_tokens", None)  # a structured answer is given whole
    out["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    return out, "schema"


def json_schema(schema: Any) -> Any:
    """Google's OpenAPI subset (``responseSchema``: upper-case types, ``nullable``,
    ``propertyOrdering``) as the JSON Schema it stands for."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for name, value in schema.items():
        if name == "type" and isinstance(value, str):
            out["type"] = value.lower()
        elif name in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[name] = {k: json_schema(v) for k, v in value.items()}
        elif name in ("items", "anyOf", "oneOf", "allOf"):
            out[name] = json_schema(value)
        elif name not in ("nullable", "propertyOrdering", "property_ordering"):
            out[name] = value
    if schema.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def response_of(model: str, content: str, reply: Answer) -> dict[str, Any]:
    finish = "MAX_TOKENS" if reply.finish == "length" else "STOP"
    return {
        "candidates": [
            {"content": {"parts": [{"text": content}], "role": "model"}, "finishReason": finish, "index": 0}
        ],
        "usageMetadata": {
            "promptTokenCount": reply.input_tokens,
            "candidatesTokenCount": reply.output_tokens,
            "totalTokenCount": reply.input_tokens + reply.output_tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": reply.input_tokens}],
        },
        "modelVersion": model,
    }


def _exhausted(refusal: Refusal, model: str, limit: int) -> Response:
    metric, quota_id = _QUOTAS[refusal.kind]
    violation = {
        "quotaMetric": f"generativelanguage.googleapis.com/{metric}",
        "quotaId": quota_id,
        "quotaDimensions": {"location": "global", "model": model},
        "quotaValue": str(limit),
    }
    details: list[dict[str, Any]] = [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [violation]},
        {
            "@type": "type.googleapis.com/google.rpc.Help",
            "links": [{"description": "Learn more about Gemini API quotas", "url": _RATE_LIMITS}],
        },
    ]
    message = (
        "You exceeded your current quota, please check your plan and billing details. For more information "
        f"on this error, head to: {_RATE_LIMITS}.\n* Quota exceeded for metric: {violation['quotaMetric']}, "
        f"limit: {limit}, model: {model}"
    )
    if refusal.kind != "requests_per_day":
        # Only the per-minute quotas say when to come back; the day's resets at midnight Pacific.
        details.append(_retry_info(refusal.wait))
        message += f"\nPlease retry in {retry_delay(refusal.wait)[:-1]}s."
    return error(429, message, details)
