"""The HTTP surface of Anthropic's Message Batches and Gemini's batch mode (see `dialect_batches`
for what they do)::

    POST /v1/messages/batches                          {"requests": [{"custom_id", "params"}]}
    GET  /v1/messages/batches                          ?limit=&after_id=  newest first
    GET  /v1/messages/batches/{id}                     -> message_batch
    GET  /v1/messages/batches/{id}/results             -> JSON Lines, once ended
    POST /v1beta/models/{model}:batchGenerateContent   {"batch": {"displayName", "inputConfig"}}
    GET  /v1beta/batches                               ?pageSize=&pageToken=  -> {"operations"}
    GET  /v1beta/batches/{id}                          -> the batch's operation

Each request is answered when its batch is created, by the dialect's online endpoint's own code
(`api_anthropic`, `api_gemini`): the same question gets the same answer, online or in a batch.
Each refuses in its provider's error shape. The app wraps each in its guard (its dialect's key,
limits, counting), like every other route.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from playbook.demo import api_anthropic, api_gemini
from playbook.demo.dialect import DialectError, answer
from playbook.demo.dialect_batches import ANTHROPIC, GEMINI, BatchProblem, Line, expires
from playbook.demo.responses import json_response
from playbook.demo.state import DemoState

__all__ = ["PATHS", "routes"]

Handler = Callable[[Request], Awaitable[Response]]

PATHS = re.compile(r"^/v1/messages/batches(/[^/]+(/results)?)?$")
MAX_REQUESTS = 100_000  # in one Message Batch
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def routes(state: DemoState) -> list[tuple[str, str, str, Handler]]:
    """(dialect, method, path, handler) for each route; the app guards them as the dialect's."""
    return [
        (ANTHROPIC, "POST", "/v1/messages/batches", _anthropic_create(state)),
        (ANTHROPIC, "GET", "/v1/messages/batches", _anthropic_list(state)),
        (ANTHROPIC, "GET", "/v1/messages/batches/{batch_id}", _anthropic_batch(state, results=False)),
        (ANTHROPIC, "GET", "/v1/messages/batches/{batch_id}/results", _anthropic_batch(state, results=True)),
        (GEMINI, "POST", "/v1beta/models/{model}:batchGenerateContent", _gemini_create(state)),
        (GEMINI, "GET", "/v1beta/batches", _gemini_list(state)),
        (GEMINI, "GET", "/v1beta/batches/{batch_id}", _gemini_batch(state)),
    ]


def anthropic_error(status: int, message: str) -> Response:
    return api_anthropic.error(status, message)


def gemini_error(status: int, message: str) -> Response:
    return api_gemini.error(status, message)


# -- each request answered as the online endpoint answers it --------------------------------------


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
        try:
            if not isinstance(params, dict):
                raise DialectError(400, "params: must be an object (a Messages request)")
            chat, tool = api_anthropic.chat_body(params)
            reply = answer(chat)
        except DialectError as exc:
            error = {"type": "invalid_request_error", "message": exc.message}
            # A request the provider cannot read is errored as it is read, before any could expire.
            lines.append(Line(key, None, error, None, False))
            continue
        message = api_anthropic.message_of(params["model"], chat, reply, tool, params["max_tokens"])
        usage = (params["model"], reply.input_tokens, int(message["usage"]["output_tokens"]))
        lines.append(Line(key, message, None, usage, expires(expired_rate, batch_id, key)))
    return tuple(lines)


def gemini_lines(batch: dict[str, Any], model: str, batch_id: str, expired_rate: float) -> tuple[Line, ...]:
    """The lines of a batchGenerateContent ``batch`` (its requests inlined), or BatchProblem."""
    config = _field(batch, "inputConfig", "input_config")
    requests = _field(_field(config, "requests"), "requests")
    if not isinstance(requests, list) or not requests:
        raise BatchProblem("batch.input_config.requests.requests: must be a non-empty list")
    lines = []
    for i, item in enumerate(requests):
        meta = _field(item, "metadata")
        key = meta.get("key") if isinstance(meta, dict) else None
        expired = expires(expired_rate, batch_id, str(key or i))
        request = _field(item, "request")
        try:
            if not isinstance(request, dict):
                raise DialectError(400, f"requests[{i}].request: must be a GenerateContentRequest")
            chat, json_kind = api_gemini.chat_body(model, request)
            reply = answer(chat)
        except DialectError as exc:
            error = {"code": exc.status, "message": exc.message, "status": "INVALID_ARGUMENT"}
            lines.append(Line(key, None, error, None, expired))
            continue
        content = reply.content if json_kind != "object" else json.dumps({"answer": reply.content})
        usage = (model, reply.input_tokens, reply.output_tokens)
        lines.append(Line(key, api_gemini.response_of(model, content, reply), None, usage, expired))
    return tuple(lines)


def _field(doc: Any, *names: str) -> Any:
    """A field of a JSON object by any of its spellings (proto JSON takes camelCase and snake_case)."""
    if not isinstance(doc, dict):
        return None
    return next((doc[name] for name in names if name in doc), None)


# -- the routes ---------------------------------------------------------------------------------


async def _body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        return None


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _anthropic_create(state: DemoState) -> Handler:
    async def create(request: Request) -> Response:
        if not request.headers.get("anthropic-version"):
            return anthropic_error(400, "anthropic-version: header is required")
        body = await _body(request)
        batch_id = state.dialect_batch_id(ANTHROPIC)
        try:
            # Answered outside the state's lock: a big batch must not hold up other requests.
            lines = anthropic_lines(body, batch_id, state.settings.batch_expired_rate)
        except BatchProblem as exc:
            return anthropic_error(400, str(exc))
        batch, now = state.add_dialect_batch(ANTHROPIC, batch_id, lines)
        return json_response(batch.anthropic_doc(now, _base(request)))

    return create


def _anthropic_batch(state: DemoState, *, results: bool) -> Handler:
    async def batch(request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        found, now = state.dialect_batch(batch_id)
        if found is None or found.api != ANTHROPIC:
            return anthropic_error(404, f"No message batch with id {batch_id!r}.")
        if not results:
            return json_response(found.anthropic_doc(now, _base(request)))
        if not found.ended(now):
            return anthropic_error(400, f"Message batch {batch_id} has not ended: no results yet.")
        return Response(found.anthropic_results(), 200, media_type="application/binary")

    return batch


def _anthropic_list(state: DemoState) -> Handler:
    async def listing(request: Request) -> Response:
        query = request.query_params
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 1000:
            return anthropic_error(400, "limit: must be an integer from 1 to 1000")
        batches, now = state.dialect_batch_list(ANTHROPIC)
        after = query.get("after_id")
        if after is not None:
            ids = [b.id for b in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        page, base = batches[:limit], _base(request)
        return json_response(
            {
                "data": [b.anthropic_doc(now, base) for b in page],
                "has_more": len(batches) > limit,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            }
        )

    return listing


def _gemini_create(state: DemoState) -> Handler:
    async def create(request: Request) -> Response:
        body = await _body(request)
        batch = body.get("batch") if isinstance(body, dict) else None
        if not isinstance(batch, dict):
            return gemini_error(400, "batch: required (a GenerateContentBatch)")
        name = batch.get("displayName", batch.get("display_name"))
        if not isinstance(name, str) or not name:
            return gemini_error(400, "batch.display_name: required")
        model = request.path_params["model"]
        batch_id = state.dialect_batch_id(GEMINI)
        try:
            lines = gemini_lines(batch, model, batch_id, state.settings.batch_expired_rate)
        except BatchProblem as exc:
            return gemini_error(400, str(exc))
        made, now = state.add_dialect_batch(GEMINI, batch_id, lines, model=model, name=name)
        return json_response(made.gemini_doc(now))

    return create


def _gemini_batch(state: DemoState) -> Handler:
    async def batch(request: Request) -> Response:
        batch_id = "batches/" + request.path_params["batch_id"]
        found, now = state.dialect_batch(batch_id)
        if found is None or found.api != GEMINI:
            return gemini_error(404, f"Batch {batch_id} not found.")
        return json_response(found.gemini_doc(now))

    return batch


def _gemini_list(state: DemoState) -> Handler:
    async def listing(request: Request) -> Response:
        query = request.query_params
        try:
            size = int(query.get("pageSize", "50"))
            start = int(query.get("pageToken") or 0)
        except ValueError:
            return gemini_error(400, "pageSize and pageToken: must be integers")
        size = min(max(size, 1), 1000)
        batches, now = state.dialect_batch_list(GEMINI)
        page = batches[start : start + size]
        doc: dict[str, Any] = {"operations": [b.gemini_doc(now) for b in page]}
        if start + size < len(batches):
            doc["nextPageToken"] = str(start + size)
        return json_response(doc)

    return listing
