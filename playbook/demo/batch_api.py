"""The HTTP surface of files and batches, in OpenAI's shape (see `batches` for what they do).

    POST /v1/files                   multipart: purpose=batch, file=<JSONL>  -> file object
    GET  /v1/files/{id}              -> file object
    GET  /v1/files/{id}/content      -> the file's bytes
    POST /v1/batches                 {"input_file_id", "endpoint", "completion_window": "24h", "metadata"?}
    GET  /v1/batches                 ?limit=&after=  -> {"object": "list", "data": [...], "has_more"}
    GET  /v1/batches/{id}            -> batch object
    POST /v1/batches/{id}/cancel     -> batch object

The app wraps each of these in its guard (auth, limits, counting), like every /v1 route.
Uploads are parsed here rather than with Starlette's form parser, which would need another
package for a demo that only ever reads one small form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from email.message import Message
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from playbook.demo.batches import ENDPOINTS, prepare
from playbook.demo.responses import json_response
from playbook.demo.state import DemoState
from playbook.demo.wire import openai_error

__all__ = ["PATHS", "routes"]

Handler = Callable[[Request], Awaitable[Response]]

# Paths answered here, for the app's 405s: collections and templated members.
PATHS = re.compile(r"^/v1/(files|batches)(/[^/]+(/content|/cancel)?)?$")
_PURPOSES = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})
_MAX_METADATA = 16


def routes(state: DemoState) -> list[tuple[str, str, Handler]]:
    """(method, path, handler) for each route; the app guards them."""
    return [
        ("POST", "/v1/files", _upload(state)),
        ("GET", "/v1/files/{file_id}", _file(state, content=False)),
        ("GET", "/v1/files/{file_id}/content", _file(state, content=True)),
        ("POST", "/v1/batches", _create(state)),
        ("GET", "/v1/batches", _list(state)),
        ("GET", "/v1/batches/{batch_id}", _batch(state)),
        ("POST", "/v1/batches/{batch_id}/cancel", _cancel(state)),
    ]


def _refuse(status: int, message: str, param: str | None = None, code: str | None = None) -> Response:
    return json_response(openai_error(message, param=param, code=code), status)


def _upload(state: DemoState) -> Handler:
    async def upload(request: Request) -> Response:
        fields = _form(request.headers.get("content-type", ""), await request.body())
        if fields is None:
            return _refuse(400, "The body must be multipart/form-data with 'purpose' and 'file'.")
        purpose, upload = fields.get("purpose"), fields.get("file")
        if upload is None:
            return _refuse(400, "Missing required parameter: 'file'.", "file", "missing_required_parameter")
        if purpose is None:
            return _refuse(
                400, "Missing required parameter: 'purpose'.", "purpose", "missing_required_parameter"
            )
        text = purpose[1].decode("utf-8", "replace").strip()
        if text not in _PURPOSES:
            return _refuse(
                400,
                f"Invalid value for 'purpose': {text!r}. Use one of {', '.join(sorted(_PURPOSES))}.",
                "purpose",
            )
        return json_response(state.add_file(upload[0] or "upload.jsonl", text, upload[1]))

    return upload


def _file(state: DemoState, *, content: bool) -> Handler:
    async def file(request: Request) -> Response:
        file_id = request.path_params["file_id"]
        stored = state.file(file_id)
        if stored is None:
            return _refuse(404, f"No such File object: {file_id}", "id")
        if content:
            return Response(stored.data, 200, media_type="application/octet-stream")
        return json_response(stored.doc())

    return file


def _create(state: DemoState) -> Handler:
    async def create(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _refuse(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return _refuse(400, "The body must be a JSON object.")
        problem = _batch_problem(body)
        if problem is not None:
            return _refuse(400, *problem)
        stored = state.file(body["input_file_id"])
        if stored is None:
            return _refuse(404, f"No such File object: {body['input_file_id']}", "input_file_id")
        if stored.purpose != "batch":
            return _refuse(
                400,
                f"The file {stored.id} has purpose {stored.purpose!r}; a batch needs purpose 'batch'.",
                "input_file_id",
            )
        # The answers are worked out here, outside the state's lock: a big batch must not
        # hold up every other request for its duration.
        prepared = prepare(
            stored.data, body["endpoint"], invalid_json_rate=state.settings.chat_invalid_json_rate
        )
        return json_response(state.create_batch(stored.id, body["endpoint"], body.get("metadata"), prepared))

    return create


def _batch_problem(body: dict[str, Any]) -> tuple[str, str] | None:
    """(message, param) for the first invalid parameter of a batch, or None."""
    if not isinstance(body.get("input_file_id"), str):
        return "Missing required parameter: 'input_file_id'.", "input_file_id"
    if body.get("endpoint") not in ENDPOINTS:
        return (
            f"Invalid value for 'endpoint': {body.get('endpoint')!r}. Supported: {', '.join(ENDPOINTS)}.",
            "endpoint",
        )
    if body.get("completion_window") != "24h":
        return (
            f"Invalid value for 'completion_window': {body.get('completion_window')!r}. Supported: '24h'.",
            "completion_window",
        )
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict)
        or len(metadata) > _MAX_METADATA
        or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in metadata.items()
        )
    ):
        return (
            f"'metadata' must be an object of at most {_MAX_METADATA} string keys (≤ 64 chars) and string values (≤ 512 chars).",
            "metadata",
        )
    return None


def _batch(state: DemoState) -> Handler:
    async def batch(request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        doc = state.batch(batch_id)
        return _refuse(404, f"No such Batch object: {batch_id}", "id") if doc is None else json_response(doc)

    return batch


def _cancel(state: DemoState) -> Handler:
    async def cancel(request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        doc, refused = state.cancel_batch(batch_id)
        if doc is None:
            return _refuse(404, f"No such Batch object: {batch_id}", "id")
        if refused is not None:
            return _refuse(400, f"Cannot cancel a batch with status {refused!r}.", "id")
        return json_response(doc)

    return cancel


def _list(state: DemoState) -> Handler:
    async def listing(request: Request) -> Response:
        query = request.query_params
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            return _refuse(
                400,
                f"Invalid 'limit': {query.get('limit')!r}. Expected an integer between 1 and 100.",
                "limit",
            )
        docs, more = state.batch_list(limit, query.get("after"))
        first, last = (docs[0]["id"], docs[-1]["id"]) if docs else (None, None)
        return json_response(
            {"object": "list", "data": docs, "first_id": first, "last_id": last, "has_more": more}
        )

    return listing


def _form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]] | None:
    """A multipart/form-data body's fields: name -> (filename, bytes); None when it is not one."""
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str) or not boundary:
        return None
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in body.split(b"--" + boundary.encode("latin-1"))[1:]:
        if part.startswith(b"--"):  # the closing delimiter
            break
        head, sep, data = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not sep:
            return None
        headers = Message()
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, colon, value = line.partition(":")
            if colon:
                headers[name.strip()] = value.strip()
        field = headers.get_param("name", header="content-disposition")
        filename = headers.get_param("filename", header="content-disposition")
        if isinstance(field, str):
            fields[field] = (filename if isinstance(filename, str) else None, data.removesuffix(b"\r\n"))
    return fields
