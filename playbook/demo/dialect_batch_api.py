"""The HTTP surface of Anthropic's Message Batches and Gemini's batch mode (see `dialect_batches`
for what they do)::

    POST /v1/messages/batches                          {"requests": [{"custom_id", "params"}]}
    GET  /v1/messages/batches                          ?limit=&after_id=  newest first
    GET  /v1/messages/batches/{id}                     -> message_batch
    GET  /v1/messages/batches/{id}/results             -> JSON Lines, once ended
    POST /v1beta/models/{model}:batchGenerateContent   {"batch": {"displayName", "inputConfig"}}
    GET  /v1beta/batches                               ?pageSize=&pageToken=  -> {"operations"}
    GET  /v1beta/batches/{id}                          -> the batch's operation

Each refuses in its provider's error shape. The app wraps each in its guard (auth, limits,
counting), like every other route.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from playbook.demo.dialect_batches import ANTHROPIC, GEMINI, BatchProblem, anthropic_lines, gemini_lines
from playbook.demo.responses import json_response
from playbook.demo.state import DemoState

__all__ = ["PATHS", "routes"]

Handler = Callable[[Request], Awaitable[Response]]

PATHS = re.compile(r"^/v1/messages/batches(/[^/]+(/results)?)?$")


def routes(state: DemoState) -> list[tuple[str, str, Handler]]:
    """(method, path, handler) for each route; the app guards them."""
    return [
        ("POST", "/v1/messages/batches", _anthropic_create(state)),
        ("GET", "/v1/messages/batches", _anthropic_list(state)),
        ("GET", "/v1/messages/batches/{batch_id}", _anthropic_batch(state, results=False)),
        ("GET", "/v1/messages/batches/{batch_id}/results", _anthropic_batch(state, results=True)),
        ("POST", "/v1beta/models/{model}:batchGenerateContent", _gemini_create(state)),
        ("GET", "/v1beta/batches", _gemini_list(state)),
        ("GET", "/v1beta/batches/{batch_id}", _gemini_batch(state)),
    ]


def anthropic_error(status: int, kind: str, message: str) -> Response:
    return json_response({"type": "error", "error": {"type": kind, "message": message}}, status)


def gemini_error(status: int, code: str, message: str) -> Response:
    return json_response({"error": {"code": status, "message": message, "status": code}}, status)


async def _body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        return None


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _anthropic_create(state: DemoState) -> Handler:
    async def create(request: Request) -> Response:
        body = await _body(request)
        batch_id = state.dialect_batch_id(ANTHROPIC)
        try:
            # Answered outside the state's lock: a big batch must not hold up other requests.
            lines = anthropic_lines(body, batch_id, state.settings.batch_expired_rate)
        except BatchProblem as exc:
            return anthropic_error(400, "invalid_request_error", str(exc))
        batch, now = state.add_dialect_batch(ANTHROPIC, batch_id, lines)
        return json_response(batch.anthropic_doc(now, _base(request)))

    return create


def _anthropic_batch(state: DemoState, *, results: bool) -> Handler:
    async def batch(request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        found, now = state.dialect_batch(batch_id)
        if found is None or found.api != ANTHROPIC:
            return anthropic_error(404, "not_found_error", f"No message batch with id {batch_id!r}.")
        if not results:
            return json_response(found.anthropic_doc(now, _base(request)))
        if not found.ended(now):
            return anthropic_error(
                400, "invalid_request_error", f"Message batch {batch_id} has not ended: no results yet."
            )
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
            return anthropic_error(400, "invalid_request_error", "limit: must be an integer from 1 to 1000")
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
            return gemini_error(400, "INVALID_ARGUMENT", "batch: required (a GenerateContentBatch)")
        name = batch.get("displayName", batch.get("display_name"))
        if not isinstance(name, str) or not name:
            return gemini_error(400, "INVALID_ARGUMENT", "batch.display_name: required")
        model = request.path_params["model"]
        batch_id = state.dialect_batch_id(GEMINI)
        try:
            lines = gemini_lines(batch, model, batch_id, state.settings.batch_expired_rate)
        except BatchProblem as exc:
            return gemini_error(400, "INVALID_ARGUMENT", str(exc))
        made, now = state.add_dialect_batch(GEMINI, batch_id, lines, model=model, name=name)
        return json_response(made.gemini_doc(now))

    return create


def _gemini_batch(state: DemoState) -> Handler:
    async def batch(request: Request) -> Response:
        batch_id = "batches/" + request.path_params["batch_id"]
        found, now = state.dialect_batch(batch_id)
        if found is None or found.api != GEMINI:
            return gemini_error(404, "NOT_FOUND", f"Batch {batch_id} not found.")
        return json_response(found.gemini_doc(now))

    return batch


def _gemini_list(state: DemoState) -> Handler:
    async def listing(request: Request) -> Response:
        query = request.query_params
        try:
            size = int(query.get("pageSize", "50"))
            start = int(query.get("pageToken") or 0)
        except ValueError:
            return gemini_error(400, "INVALID_ARGUMENT", "pageSize and pageToken: must be integers")
        size = min(max(size, 1), 1000)
        batches, now = state.dialect_batch_list(GEMINI)
        page = batches[start : start + size]
        doc: dict[str, Any] = {"operations": [b.gemini_doc(now) for b in page]}
        if start + size < len(batches):
            doc["nextPageToken"] = str(start + size)
        return json_response(doc)

    return listing
