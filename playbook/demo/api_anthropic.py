"""Anthropic's Messages API, as the demo speaks it: ``POST /v1/messages``.

- the key in ``x-api-key`` (or ``Authorization: Bearer``, as the SDK sends it now) and an
  ``anthropic-version`` header are required (401 ``authentication_error``,
  400 ``invalid_request_error``), as is ``max_tokens``;
- ``system`` (a string or text blocks), ``messages`` (string or block content), ``tools`` with
  ``tool_choice`` naming one (or ``any`` of a single tool): the answer is a ``tool_use`` block
  whose ``input`` fills the tool's ``input_schema``; otherwise a ``text`` block;
- ``usage``: ``input_tokens``, ``output_tokens`` and the cache fields (0);
- limits per key (``anthropic_rpm``, ``anthropic_itpm``, ``anthropic_otpm``): output tokens are
  charged as ``max_tokens`` on arrival and settled to the answer's count when it is sent; every
  answer carries ``anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,
  remaining,reset}`` (resets in RFC 3339), a 429 ``rate_limit_error`` a whole-second
  ``retry-after``; an overload is ``529 overloaded_error`` without one.

As documented at https://docs.claude.com/en/api/messages, https://docs.claude.com/en/api/rate-limits
and https://docs.claude.com/en/api/errors, and as the ``anthropic`` SDK sends and parses it.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from playbook.demo.chat import tokens
from playbook.demo.dialect import (
    Dialect,
    DialectError,
    answer,
    dumps,
    forced_format,
    json_body,
    pause,
    text_of,
)
from playbook.demo.dialect_limits import Refusal
from playbook.demo.fakedata import digest
from playbook.demo.responses import json_response
from playbook.demo.state import DemoState

__all__ = ["DIALECT", "chat_body", "message_of", "routes"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_HEADER_NAMES = {"requests": "requests", "input_tokens": "input-tokens", "output_tokens": "output-tokens"}


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return json_response({"type": "error", "error": {"type": kind, "message": message}}, status, headers)


def _refuse(status: int, message: str, wait: float | None) -> Response:
    if status == 401:
        message = "invalid x-api-key"
    headers = None if wait is None else {"retry-after": str(max(1, math.ceil(wait)))}
    return error(status, message, headers)


def _key(request: Request) -> str | None:
    # The SDK of today sends the key as a bearer; older clients in x-api-key. Anthropic takes both.
    given = request.headers.get("x-api-key")
    if given:
        return given
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


DIALECT = Dialect("anthropic", _key, _refuse)


def routes(state: DemoState) -> list[tuple[str, str, Any]]:
    return [("POST", "/v1/messages", _messages(state))]


def _messages(state: DemoState) -> Any:
    async def messages(request: Request) -> Response:
        key = _key(request) or ""
        try:
            if not request.headers.get("anthropic-version"):
                raise DialectError(400, "anthropic-version: header is required")
            body = await json_body(request)
            chat, tool = chat_body(body)
            max_tokens = body["max_tokens"]
            reply = answer(chat, invalid_json_rate=state.settings.chat_invalid_json_rate)
        except DialectError as exc:
            return error(exc.status, exc.message, _limit_headers(state.anthropic_settle(key, 0, 0)))
        if state.overloaded("anthropic"):
            return error(529, "Overloaded", _limit_headers(state.anthropic_settle(key, 0, 0)))
        refusal, limits = state.anthropic_admit(key, reply.input_tokens, max_tokens)
        if refusal is not None:
            return _rate_limited(refusal, limits, body["model"])
        message = message_of(body["model"], chat, reply, tool, max_tokens)
        used = message["usage"]["output_tokens"]
        try:
            await pause(request)
        finally:
            # Settled however the request ends: a client gone mid-answer used its tokens too.
            limits = state.anthropic_settle(key, max_tokens, used)
        state.count_usage("anthropic", reply.input_tokens, used)
        return json_response(message, 200, _limit_headers(limits))

    return messages


def chat_body(body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The chat completions body asking what `body` asks, and the forced tool's name (or None)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise DialectError(400, "model: Field required")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise DialectError(400, "max_tokens: Field required")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise DialectError(400, f"max_tokens: must be an integer of at least 1; got {max_tokens!r}")
    if body.get("stream"):
        raise DialectError(400, "stream: the demo provider does not stream")
    chat: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        chat.append({"role": "system", "content": text_of(system, "system")})
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise DialectError(400, "messages: Field required (a non-empty list)")
    for i, message in enumerate(given):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise DialectError(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
        chat.append({"role": role, "content": text_of(message.get("content"), f"messages.{i}.content")})
    out: dict[str, Any] = {"model": model, "messages": chat}
    tool = _forced_tool(body)
    if tool is None:
        out["max_tokens"] = max_tokens
        return out, None
    out["response_format"] = forced_format(tool["name"], tool.get("input_schema"))
    return out, tool["name"]


def _forced_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    tools: list[dict[str, Any]] = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("name") for t in tools):
        raise DialectError(400, "tools: each tool must be an object with a name and an input_schema")
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        named = [t for t in tools if t["name"] == choice.get("name")]
        if not named:
            raise DialectError(400, f"tool_choice.name: no tool named {choice.get('name')!r} in tools")
        return named[0]
    if kind == "any" and tools:
        return tools[0]  # the demo always picks the first tool it may use
    if kind not in ("auto", "any", "none"):
        raise DialectError(400, f"tool_choice.type: {kind!r} is not one of 'auto', 'any', 'tool', 'none'")
    return None


def message_of(
    model: str, chat: dict[str, Any], reply: Any, tool: str | None, max_tokens: int
) -> dict[str, Any]:
    msg_id = f"msg_{digest('anthropic', dumps(chat)):016x}"
    if tool is None:
        content: list[dict[str, Any]] = [{"type": "text", "text": reply.content}]
        stop, output = ("max_tokens" if reply.finish == "length" else "end_turn"), reply.output_tokens
    elif tokens(reply.content) > max_tokens:
        content, stop, output = [], "max_tokens", max_tokens  # the tool's input was cut off
    else:
        try:
            value = json.loads(reply.content)
        except ValueError:  # garbled on purpose: a tool input the model never finished
            value = {}
        content = [{"type": "tool_use", "id": f"toolu_{msg_id[4:]}", "name": tool, "input": value}]
        stop, output = "tool_use", reply.output_tokens
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": reply.input_tokens,
            "output_tokens": output,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "service_tier": "standard",
        },
    }


def _rfc3339(seconds_from_now: float) -> str:
    # Whole seconds, rounded up: a client waiting until then is never early.
    at = datetime.fromtimestamp(math.ceil(time.time() + seconds_from_now), UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _limit_headers(limits: dict[str, tuple[int, int, float]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, (limit, remaining, reset) in limits.items():
        prefix = f"anthropic-ratelimit-{_HEADER_NAMES[name]}"
        headers.update(
            {
                f"{prefix}-limit": str(limit),
                f"{prefix}-remaining": str(remaining),
                f"{prefix}-reset": _rfc3339(reset),
            }
        )
    # "tokens": the most restrictive of the token limits now, as Anthropic reports it.
    token_limits = [limits[n] for n in ("input_tokens", "output_tokens") if n in limits]
    if token_limits:
        limit, remaining, reset = min(token_limits, key=lambda t: t[1])
        headers.update(
            {
                "anthropic-ratelimit-tokens-limit": str(limit),
                "anthropic-ratelimit-tokens-remaining": str(remaining),
                "anthropic-ratelimit-tokens-reset": _rfc3339(reset),
            }
        )
    return headers


def _rate_limited(refusal: Refusal, limits: dict[str, tuple[int, int, float]], model: str) -> Response:
    what = {"requests": "requests", "input_tokens": "input tokens", "output_tokens": "output tokens"}[
        refusal.kind
    ]
    limit = limits[refusal.kind][0]
    message = (
        f"This request would exceed the rate limit for your organization (org-demo) of {limit} {what} per "
        f"minute for {model}. For details, refer to: https://docs.claude.com/en/api/rate-limits."
    )
    headers = _limit_headers(limits)
    headers["retry-after"] = str(max(1, math.ceil(refusal.wait)))
    return error(429, message, headers)
