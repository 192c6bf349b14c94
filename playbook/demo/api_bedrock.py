"""AWS Bedrock's Converse API, as the demo speaks it: ``POST /model/{modelId}/converse``.

- the request must be signed in SigV4's shape: ``Authorization: AWS4-HMAC-SHA256
  Credential=<access key>/<date>/<region>/bedrock/aws4_request, SignedHeaders=..., Signature=...``
  and an ``x-amz-date`` header; the access key id is the demo key (the signature itself is not
  checked: the demo holds no secret);
- ``messages`` (``role``, ``content`` of ``{"text"}``), ``system`` (``[{"text"}]``),
  ``inferenceConfig`` (``maxTokens``, ``temperature``, ...), ``toolConfig`` whose ``toolChoice``
  forces a tool: the answer is a ``toolUse`` block whose ``input`` fills its input schema;
- the answer: ``output.message``, ``stopReason``, ``usage`` (``inputTokens``, ``outputTokens``,
  ``totalTokens``), ``metrics``;
- limits per key: ``bedrock_rpm`` and ``bedrock_tpm`` (input + output tokens), refused with
  ``ThrottlingException`` as Bedrock sends it: HTTP 429, an ``x-amzn-ErrorType`` header and
  ``{"message": ...}``, saying nothing of which quota fired.

As documented at https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html
and https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-signing-request.html, and as
botocore's ``bedrock-runtime`` service model reads it (errors by ``x-amzn-ErrorType``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from playbook.demo.dialect import Dialect, DialectError, answer, forced_format, json_body, pause, text_of
from playbook.demo.fakedata import digest
from playbook.demo.responses import json_response
from playbook.demo.state import DemoState

__all__ = ["DIALECT", "routes"]

_SIGV4 = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/\s,]+)/\d{8}/[a-z0-9-]+/bedrock/aws4_request,\s*"
    r"SignedHeaders=[a-z0-9;-]+,\s*Signature=[0-9a-f]{64}$"
)
_ERRORS = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}


def error(status: int, message: str, kind: str | None = None) -> Response:
    """Bedrock's error: ``{"message"}`` with the exception's name in ``x-amzn-ErrorType``."""
    name = kind or _ERRORS.get(status, "InternalServerException")
    headers = {"x-amzn-ErrorType": f"{name}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    return json_response({"message": message}, status, headers)


def _refuse(status: int, message: str, wait: float | None) -> Response:
    if status == 401:
        return error(
            403, "The security token included in the request is invalid.", "UnrecognizedClientException"
        )
    if status == 429:
        return error(429, "Too many requests, please wait before trying again.")
    return error(status, message)


def _key(request: Request) -> str | None:
    """The access key id of a request signed in SigV4's shape; None for any other."""
    match = _SIGV4.match(request.headers.get("authorization", ""))
    if match is None or not request.headers.get("x-amz-date"):
        return None
    return match["key"]


DIALECT = Dialect("bedrock", _key, _refuse)


def routes(state: DemoState) -> list[tuple[str, str, Any]]:
    return [("POST", "/model/{model_id:path}/converse", _converse(state))]


def _converse(state: DemoState) -> Any:
    async def converse(request: Request) -> Response:
        model = request.path_params["model_id"]
        try:
            body = await json_body(request)
            chat, tool = _chat_body(model, body)
            reply = answer(chat, invalid_json_rate=state.settings.chat_invalid_json_rate)
        except DialectError as exc:
            return error(exc.status, exc.message)
        if state.overloaded("bedrock"):
            return error(503, "Bedrock is unable to process your request.")
        if state.bedrock_admit(_key(request) or "", reply.input_tokens + reply.output_tokens) is not None:
            return error(429, "Too many requests, please wait before trying again.")
        if tool is None:
            content: list[dict[str, Any]] = [{"text": reply.content}]
            stop = "max_tokens" if reply.finish == "length" else "end_turn"
        else:
            try:
                value = json.loads(reply.content)
            except ValueError:  # garbled on purpose
                value = {}
            use_id = f"tooluse_{digest('bedrock', reply.content):016x}"
            content, stop = [{"toolUse": {"toolUseId": use_id, "name": tool, "input": value}}], "tool_use"
        await pause(request)
        state.count_usage("bedrock", reply.input_tokens, reply.output_tokens)
        usage = {
            "inputTokens": reply.input_tokens,
            "outputTokens": reply.output_tokens,
            "totalTokens": reply.input_tokens + reply.output_tokens,
        }
        doc = {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop,
            "usage": usage,
            "metrics": {"latencyMs": round(getattr(request.state, "delay", 0.0) * 1000)},
        }
        return json_response(doc)

    return converse


def _chat_body(model: str, body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    chat: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        chat.append({"role": "system", "content": text_of(system, "system")})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DialectError(
            400, "1 validation error detected: Value at 'messages' failed to satisfy constraint"
        )
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise DialectError(400, f"messages.{i}.role: must be 'user' or 'assistant'")
        chat.append({"role": role, "content": text_of(message.get("content"), f"messages.{i}.content")})
    out: dict[str, Any] = {"model": model, "messages": chat}
    config = body.get("inferenceConfig") or {}
    tool = _forced_tool(body.get("toolConfig"))
    if tool is not None:
        spec = tool.get("inputSchema")
        schema = spec.get("json") if isinstance(spec, dict) else None
        out["response_format"] = forced_format(tool["name"], schema)
        return out, tool["name"]
    if isinstance(config, dict) and config.get("maxTokens") is not None:
        out["max_tokens"] = config["maxTokens"]
    return out, None


def _forced_tool(config: Any) -> dict[str, Any] | None:
    if config is None:
        return None
    tools = config.get("tools") if isinstance(config, dict) else None
    if not isinstance(tools, list) or not tools:
        raise DialectError(400, "toolConfig.tools: at least one tool is required")
    specs: list[Any] = [t.get("toolSpec") for t in tools if isinstance(t, dict)]
    if not all(isinstance(s, dict) and s.get("name") for s in specs):
        raise DialectError(400, "toolConfig.tools: each tool needs a toolSpec with a name and an inputSchema")
    choice = config.get("toolChoice") or {"auto": {}}
    if "tool" in choice:
        name = choice["tool"].get("name")
        named = [s for s in specs if s["name"] == name]
        if not named:
            raise DialectError(400, f"toolConfig.toolChoice.tool.name: no tool named {name!r}")
        return dict(named[0])
    if "any" in choice:
        return dict(specs[0])  # the demo always picks the first tool it may use
    return None
