"""What every LLM dialect of the demo shares: how its endpoints read a key and refuse, and the
one deterministic answer they all give.

A `Dialect` tells the app's guard where a request of that dialect carries its key and how
that provider words a refusal (its status, body and headers), so the guard's own limits and
faults (the ``rps`` bucket, windows, quota, faults, a wrong key) answer in each dialect's shape.

Every dialect translates its request into a chat completions body and asks `chat.complete_judged`:
the same question gets the same answer, and the same token counts, whatever dialect asks it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from playbook.demo.chat import ChatRequestError, complete_judged
from playbook.demo.wire import encode

__all__ = ["Answer", "Dialect", "DialectError", "answer", "forced_format", "json_body", "pause", "text_of"]

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Dialect:
    """An LLM dialect's endpoints as the guard sees them: `api` names it in the counters, `key`
    reads the key a request presents (None: none), `refuse` answers a refusal (status, message,
    seconds to wait or None) in the provider's own shape."""

    api: str
    key: Callable[[Request], str | None]
    refuse: Callable[[int, str, float | None], Response]


class DialectError(Exception):
    """A request the dialect's endpoint refuses with `status`; `kind` is the provider's name for
    the error, where it has one."""

    def __init__(self, status: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Answer:
    """The demo's answer to a request, in chat completions' terms."""

    content: str
    finish: str  # "stop" or "length"
    input_tokens: int
    output_tokens: int
    garbled: bool  # made invalid JSON on purpose (``chat_invalid_json_rate``)


def answer(body: dict[str, Any], *, invalid_json_rate: float = 0.0) -> Answer:
    """The answer to a chat completions `body`; a bad one is a 400 `DialectError`."""
    try:
        reply, garbled = complete_judged(body, invalid_json_rate=invalid_json_rate)
    except ChatRequestError as exc:
        raise DialectError(400, str(exc)) from None
    usage = reply["usage"]
    choice = reply["choices"][0]
    return Answer(
        choice["message"]["content"],
        choice["finish_reason"],
        usage["prompt_tokens"],
        usage["completion_tokens"],
        garbled,
    )


def forced_format(name: str, schema: Any) -> dict[str, Any]:
    """The chat ``response_format`` that makes the answer a value of a forced tool's input schema."""
    if not isinstance(schema, dict):
        raise DialectError(400, f"tool {name!r}: its input schema must be a JSON Schema object")
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": False}}


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object; anything else is a 400 `DialectError`."""
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise DialectError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise DialectError(400, "request body must be a JSON object")
    return body


async def pause(request: Request) -> None:
    """Spend the request's latency (the guard leaves it to the endpoint, which holds what it
    reserved on arrival until its answer goes out)."""
    delay = getattr(request.state, "delay", 0.0)
    if delay > 0:
        await asyncio.sleep(delay)


def text_of(content: Any, where: str) -> str:
    """The text of a message's content: a string, or the text of its blocks (``{"text": ...}``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
        return "\n".join(texts)
    raise DialectError(400, f"{where}: expected a string or a list of content blocks")


def dumps(value: Any) -> str:
    return str(encode(value))
