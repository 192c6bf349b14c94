"""OpenAI's Responses API, as the demo speaks it: ``POST /v1/responses``.

- ``input`` (a string, or message items with string or ``input_text`` content),
  ``instructions``, ``text.format`` (``text``, ``json_object``, ``json_schema`` with ``name``,
  ``schema`` and ``strict``), ``max_output_tokens``;
- the answer: ``output`` holding one ``message`` item with an ``output_text`` part, ``status``
  ("incomplete" with ``incomplete_details.reason: max_output_tokens`` when cut), ``usage``
  (``input_tokens``, ``output_tokens``, ``total_tokens``, ``input_tokens_details.cached_tokens``);
- the bearer key and OpenAI's per-minute limits (``chat_rpm``, ``chat_tpm``), shared with chat
  completions, with OpenAI's headers and 429 body.

As documented at https://platform.openai.com/docs/api-reference/responses, and as the ``openai``
SDK's ``client.responses`` calls and parses it.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from playbook.demo.chat import ChatRequestError, complete_judged
from playbook.demo.dialect import DialectError, json_body, pause, text_of
from playbook.demo.fakedata import digest
from playbook.demo.responses import json_response
from playbook.demo.state import DemoState
from playbook.demo.wire import encode, openai_error

__all__ = ["routes"]


def routes(state: DemoState) -> list[tuple[str, str, Any]]:
    return [("POST", "/v1/responses", _responses(state))]


def _responses(state: DemoState) -> Any:
    async def responses(request: Request) -> Response:
        try:
            body = await json_body(request)
            chat = _chat_body(body)
            reply, garbled = complete_judged(chat, invalid_json_rate=state.settings.chat_invalid_json_rate)
        except DialectError as exc:
            return json_response(openai_error(exc.message), exc.status)
        except ChatRequestError as exc:
            param = exc.param.replace("response_format", "text.format") if exc.param else None
            return json_response(openai_error(str(exc), param=param, code=exc.code), 400)
        if state.overloaded("openai-responses"):
            return json_response(openai_error("The server is overloaded.", kind="server_error"), 503)
        verdict = state.chat_admit(
            request.headers.get("authorization"), reply, garbled, api="openai-responses"
        )
        if verdict.body is not None:
            return json_response(verdict.body, 429, verdict.headers)
        await pause(request)
        return json_response(_response(body, chat, reply), 200, verdict.headers)

    return responses


def _chat_body(body: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise DialectError(400, "Invalid type for 'instructions': expected a string.")
        messages.append({"role": "developer", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for i, item in enumerate(given):
            if not isinstance(item, dict) or item.get("type", "message") != "message":
                raise DialectError(400, f"Invalid 'input[{i}]': the demo provider takes message items only.")
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise DialectError(400, f"Invalid value for 'input[{i}].role': {role!r}.")
            messages.append({"role": role, "content": text_of(item.get("content"), f"input[{i}].content")})
    else:
        raise DialectError(400, "Missing required parameter: 'input'.")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    form = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(form, dict) and form.get("type") == "json_schema":
        spec = {k: form[k] for k in ("name", "schema", "strict") if k in form}
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif form is not None:
        chat["response_format"] = form
    if body.get("stream"):
        chat["stream"] = True
    return chat


def _response(body: dict[str, Any], chat: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    choice, usage = reply["choices"][0], reply["usage"]
    key = f"{digest('responses', encode([chat['messages'], chat.get('response_format'), chat.get('max_tokens')])):016x}"
    cut = choice["finish_reason"] == "length"
    text = {"type": "output_text", "text": choice["message"]["content"], "annotations": [], "logprobs": []}
    item = {
        "type": "message",
        "id": f"msg_{key}",
        "status": "incomplete" if cut else "completed",
        "role": "assistant",
        "content": [text],
    }
    form = body.get("text", {}).get("format") if isinstance(body.get("text"), dict) else None
    return {
        "id": f"resp_{key}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": reply["model"],
        "output": [item],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": form or {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
        "user": None,
        "metadata": {},
    }
