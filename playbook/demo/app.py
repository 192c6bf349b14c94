"""The demo provider's HTTP surface: a Starlette app over a `DemoState`.

Every /v1 route goes through `_guarded`, which applies, in order: request counting, auth,
the per-key limits (in flight, token bucket, fixed window, quota), slowness and fault
draws, latency, the endpoint itself, and the malformed-body draw. The chat endpoint then
weighs its answer against its own per-minute limits (requests and tokens, OpenAI's way), and
files and batches (see `batch_api`) answer in OpenAI's shape, message batches and Gemini's batches
in their own (see `dialect_batch_api`). The /_ admin routes skip
all of that so a test or a notebook can observe and steer a server running in another
process with plain HTTP; POST /_restart closes the port for a while.

Handlers stay cheap on purpose (benchmarks push thousands of requests through this):
no pandas, cached fake data, one compact JSON encoding per response.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import quote, quote_plus

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from playbook.demo import (
    api_anthropic,
    api_azure,
    api_bedrock,
    api_gemini,
    api_responses,
    batch_api,
    dialect_batch_api,
)
from playbook.demo.chat import ChatRequestError, complete_judged
from playbook.demo.dialect import Dialect
from playbook.demo.fakedata import (
    company_profile,
    digest,
    domain_error,
    email_answer,
    normalize_domain,
)
from playbook.demo.responses import json_response
from playbook.demo.settings import DemoSettings, down_seconds
from playbook.demo.state import DemoState, Rejection
from playbook.demo.wire import encode, openai_error

__all__ = ["BULK_MAX_ITEMS", "build_app"]

BULK_MAX_ITEMS = 100
_MALFORMED = b'{"email": "truncated@'  # what a proxy cutting a response short looks like
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_KNOWN_PATHS = frozenset(
    {
        "/v1/company",
        "/v1/email",
        "/v1/email/bulk",
        "/v1/jobs",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
    }
)
_KNOWN_TEMPLATES = (
    re.compile(r"^/v1/jobs/"),
    re.compile(r"^/v1/status/"),
    batch_api.PATHS,
    dialect_batch_api.PATHS,
    api_gemini.PATH,
)  # paths with an id in them

Handler = Callable[[Request], Awaitable[Response]]


class _Invalid(Exception):
    """A request the endpoint refuses; becomes {"error": message} with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": message}, status, headers)


def build_app(
    settings: DemoSettings | None = None,
    state: DemoState | None = None,
    *,
    restart: Callable[[float], Awaitable[None]] | None = None,
) -> Starlette:
    """The demo provider as an ASGI app.

    `state` is served when given (the server keeps a handle on it for stats and resets);
    otherwise a fresh one is made from `settings` (defaults when None). `restart(down)` is
    what POST /_restart runs once its answer is sent: only the server that owns the listening
    socket can close it, so an app without one answers 501.
    """
    if state is None:
        state = DemoState(settings or DemoSettings())

    def guarded(method: str, path: str, handler: Handler, *, public: bool = False) -> Route:
        name = f"{method} {path}"
        return Route(path, _guarded(state, name, handler, public=public), methods=[method])

    def spoken(dialect: Dialect | None, api: str, method: str, path: str, handler: Handler) -> Route:
        name = f"{method} {path}"
        guard = _guarded(state, name, handler, dialect=dialect, api=api, timed=True)
        return Route(path, guard, methods=[method])

    dialects = [
        (None, "openai-responses", api_responses),
        (api_anthropic.DIALECT, "anthropic", api_anthropic),
        (api_gemini.DIALECT, "gemini", api_gemini),
        (api_azure.DIALECT, "azure", api_azure),
        (api_bedrock.DIALECT, "bedrock", api_bedrock),
    ]

    batch_dialects = {"anthropic": api_anthropic.DIALECT, "gemini": api_gemini.DIALECT}
    routes = [
        guarded("GET", "/v1/company", _company),
        guarded("GET", "/v1/email", _email(state)),
        guarded("POST", "/v1/email/bulk", _email_bulk(state)),
        guarded("POST", "/v1/jobs", _submit_job(state)),
        guarded("GET", "/v1/jobs/{job_id}", _job_status(state)),
        Route(
            "/v1/chat/completions",
            _guarded(state, "POST /v1/chat/completions", _chat(state), local=True),
            methods=["POST"],
        ),
        *(
            spoken(dialect, api, method, path, handler)
            for dialect, api, module in dialects
            for method, path, handler in module.routes(state)
        ),
        guarded("GET", "/v1/status/{code}", _status, public=True),  # as httpbin's: no key asked
        *(guarded(method, path, handler) for method, path, handler in batch_api.routes(state)),
        # Keys and refusals as the dialect's; not counted among its LLM requests (``by_api``).
        *(
            Route(
                path,
                _guarded(state, f"{method} {path}", handler, dialect=batch_dialects[api]),
                methods=[method],
            )
            for api, method, path, handler in dialect_batch_api.routes(state)
        ),
        Route("/v1/{path:path}", _guarded(state, "* /v1/{path}", _unknown), methods=_ALL_METHODS),
        Route("/_health", _health, methods=["GET"]),
        Route("/_stats", _admin_stats(state), methods=["GET"]),
        Route("/_settings", _admin_settings(state), methods=["GET"]),
        Route("/_reset", _admin_change(state, state.reset), methods=["POST"]),
        Route("/_configure", _admin_change(state, state.configure), methods=["POST"]),
        Route("/_restart", _admin_restart(restart), methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.demo = state
    return app


# -- the guard --------------------------------------------------------------------------------


def _guarded(
    state: DemoState,
    name: str,
    handler: Handler,
    *,
    public: bool = False,
    dialect: Dialect | None = None,
    api: str | None = None,
    timed: bool = False,
    local: bool = False,
) -> Handler:
    """`handler` behind the demo's guard. ``dialect``: where the request carries its key and how
    a refusal is worded (None: a bearer key, the demo's own ``{"error": message}``); ``api``: the
    LLM dialect counted in ``by_api``; ``timed``: the handler spends the latency itself (it holds
    what it reserved on arrival meanwhile); ``local``: the chat endpoint, which in local server
    mode (``local_slots``) asks for no key."""

    async def endpoint(request: Request) -> Response:
        headers = request.headers
        settings = state.settings
        state.witness(_key_places(request, await request.body(), settings.api_keys))
        is_local = local and settings.local_slots is not None
        admission = state.admit(
            name,
            request.scope["path"],
            _authorization(request) if dialect is None else _as_bearer(dialect.key(request)),
            headers.get("idempotency-key"),
            public=public or is_local,
            api=("local" if is_local else "openai") if local else api,
        )
        status = 500
        try:
            delay = settings.latency + admission.slow
            if timed and admission.rejection is None:
                request.state.delay = delay
            elif delay > 0:
                await asyncio.sleep(delay)
            if admission.rejection is not None:
                if dialect is not None:
                    response = dialect.refuse(*admission.rejection)
                else:
                    response = _reject(admission.rejection, settings.retry_after_format)
            else:
                try:
                    response = await handler(request)
                except _Invalid as exc:
                    response = _error(exc.status, exc.message)
                except ClientDisconnect:
                    # The client went away mid-request (a process killed): nobody to answer,
                    # nothing served; nginx's 499 for the counters, no traceback in the log.
                    response = Response(b"", 499)
            status = response.status_code
        finally:
            malformed = state.finish(status, admission)
        if malformed:
            response = Response(_MALFORMED, 200, media_type="application/json")
        if admission.headers:
            response.headers.update(admission.headers)
        return response

    return endpoint


def _authorization(request: Request) -> str | None:
    """The key a request presents, as a bearer: ``Authorization: Bearer``, else the ``x-api-key``
    header (Anthropic's spelling) or the ``key`` query parameter (Gemini's)."""
    headers = request.headers
    given = headers.get("authorization")
    if given is None and (key := headers.get("x-api-key") or request.query_params.get("key")):
        given = f"Bearer {key}"
    return given


def _as_bearer(key: str | None) -> str | None:
    return None if key is None else f"Bearer {key}"


def _key_places(request: Request, body: bytes, keys: tuple[str, ...]) -> list[str]:
    """Where the request carries one of ``keys``, in any of the spellings a URL or JSON gives it."""
    forms = [
        f.encode() for key in keys for f in {key, quote(key, safe=""), quote_plus(key), json.dumps(key)[1:-1]}
    ]
    parts = [
        ("path", request.scope.get("raw_path") or b""),
        ("query", request.scope.get("query_string") or b""),
        ("body", body),
    ]
    parts += [(f"header {name.decode('latin-1')}", value) for name, value in request.scope["headers"]]
    return [place for place, raw in parts if any(form in raw for form in forms)]


def _reject(rejection: Rejection, retry_format: str) -> Response:
    status, message, wait = rejection
    headers = None if wait is None else _retry_headers(wait, retry_format)
    return _error(status, message, headers)


def _retry_headers(wait: float, retry_format: str) -> dict[str, str] | None:
    # Whole seconds, rounded up and at least 1: a client that obeys the hint to the
    # letter must never arrive early and be refused again.
    seconds = max(1, math.ceil(wait))
    if retry_format == "seconds":
        return {"Retry-After": str(seconds)}
    if retry_format == "http-date":
        return {"Retry-After": formatdate(math.ceil(time.time() + seconds), usegmt=True)}
    if retry_format == "reset":
        return {"X-RateLimit-Reset": str(math.ceil(time.time() + seconds)), "RateLimit-Reset": str(seconds)}
    return None


# -- /v1 endpoints ----------------------------------------------------------------------------


def _domain_param(value: str | None, where: str = "query parameter 'domain'") -> str:
    if value is None or not value.strip():
        raise _Invalid(422, f"missing {where}")
    domain = normalize_domain(value)
    problem = domain_error(domain)
    if problem is not None:
        raise _Invalid(422, problem if where.startswith("query") else f"{where}: {problem}")
    return domain


def _name_param(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid(422, f"missing {where}")
    return value.strip()


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except ValueError:
        raise _Invalid(400, "request body is not valid JSON") from None


async def _company(request: Request) -> Response:
    return json_response(company_profile(_domain_param(request.query_params.get("domain"))))


def _email(state: DemoState) -> Handler:
    async def email(request: Request) -> Response:
        query = request.query_params
        domain = _domain_param(query.get("domain"))
        first = _name_param(query.get("first"), "query parameter 'first'")
        answer = email_answer(domain, first, query.get("last") or "", state.settings.miss_rate)
        return _error(404, "not found") if answer is None else json_response(answer)

    return email


def _email_bulk(state: DemoState) -> Handler:
    async def email_bulk(request: Request) -> Response:
        body = await _json_body(request)
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise _Invalid(422, "body must be a JSON object with an 'items' array")
        if len(items) > BULK_MAX_ITEMS:
            raise _Invalid(422, f"'items' holds {len(items)} entries; at most {BULK_MAX_ITEMS} are allowed")
        queries = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise _Invalid(422, f"items[{i}] must be an object with domain, first and optional last")
            domain = _domain_param(item.get("domain"), f"items[{i}].domain")
            first = _name_param(item.get("first"), f"items[{i}].first")
            last = item.get("last") or ""
            if not isinstance(last, str):
                raise _Invalid(422, f"items[{i}].last must be a string")
            queries.append((domain, first, last))
        state.count_bulk_items(len(queries))
        miss_rate = state.settings.miss_rate
        return json_response({"results": [email_answer(d, f, l_, miss_rate) for d, f, l_ in queries]})

    return email_bulk


def _submit_job(state: DemoState) -> Handler:
    async def submit_job(request: Request) -> Response:
        payload = await _json_body(request)
        if not isinstance(payload, dict):
            raise _Invalid(422, "body must be a JSON object")
        if "domain" in payload:
            result = company_profile(_domain_param(payload["domain"], "field 'domain'"))
        else:
            result = {"input": payload, "digest": f"{digest('job', encode(payload)):016x}"}
        job_id = state.submit_job(result)
        return json_response({"job_id": job_id, "status": "queued"}, 202, {"Location": f"/v1/jobs/{job_id}"})

    return submit_job


def _job_status(state: DemoState) -> Handler:
    async def job_status(request: Request) -> Response:
        doc = state.job(request.path_params["job_id"])
        return _error(404, "job not found") if doc is None else json_response(doc)

    return job_status


def _chat(state: DemoState) -> Handler:
    async def chat(request: Request) -> Response:
        if state.settings.local_slots is not None:
            return await _local(state, request, answer)
        return await answer(request)

    async def answer(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return json_response(ChatRequestError("request body is not valid JSON").body(), 400)
        try:
            answer, garbled = complete_judged(body, invalid_json_rate=state.settings.chat_invalid_json_rate)
        except ChatRequestError as exc:
            return json_response(exc.body(), 400)
        api = "openai" if state.settings.local_slots is None else "local"
        if state.overloaded(api):
            return json_response(openai_error("The server is overloaded.", kind="server_error"), 503)
        # The answer is worked out first: its tokens are what the request weighs.
        verdict = state.chat_admit(_authorization(request), answer, garbled, api=api)
        if verdict.body is not None:
            return json_response(verdict.body, 429, verdict.headers)
        return json_response(answer, 200, verdict.headers)

    return chat


async def _local(state: DemoState, request: Request, answer: Handler) -> Response:
    """The chat endpoint as a local server answers it: a decode slot per request, a short queue
    in front of them, and 503 at once past that (as Ollama answers when its queue is full)."""
    claim = state.local_claim()
    if claim is False:
        return json_response(
            {"error": "server busy, please try again.  maximum pending requests exceeded"}, 503
        )
    if isinstance(claim, asyncio.Future):
        try:
            await claim
        except BaseException:
            state.local_forget(claim)
            raise
    try:
        if state.settings.local_service_seconds > 0:
            await asyncio.sleep(state.settings.local_service_seconds)
        return await answer(request)
    finally:
        state.local_release()


async def _status(request: Request) -> Response:
    """The status the path names, as httpbin's ``/status/{code}`` answers: an input that always
    gets a 503 (or any other status) while every other request is answered."""
    text = request.path_params["code"]
    code = int(text) if text.isdigit() else 0
    if not 200 <= code <= 599:
        raise _Invalid(422, f"path /v1/status/{{code}}: {text!r} is not an HTTP status from 200 to 599")
    if code in (204, 304):  # answers that carry no body
        return Response(b"", code)
    if code < 300:
        return json_response({"status": code}, code)
    return _error(code, f"status {code}, as the path asked")


async def _unknown(request: Request) -> Response:
    path = request.scope["path"]
    if path in _KNOWN_PATHS or any(template.match(path) for template in _KNOWN_TEMPLATES):
        return _error(405, f"method {request.method} not allowed on {path}")
    return _error(404, f"no such endpoint: {path}")


# -- admin endpoints (no auth, no limits, not counted) ----------------------------------------


async def _health(request: Request) -> Response:
    return json_response({"ok": True})


def _admin_stats(state: DemoState) -> Handler:
    async def stats(request: Request) -> Response:
        return json_response(state.stats())

    return stats


def _admin_settings(state: DemoState) -> Handler:
    async def settings(request: Request) -> Response:
        return json_response(state.settings.public())

    return settings


async def _admin_object(request: Request, what: str) -> dict[str, Any] | Response:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return _error(400, "request body is not valid JSON")
    if not isinstance(body, dict):
        return _error(422, f"body must be a JSON object of {what}")
    return body


def _admin_change(state: DemoState, change: Callable[..., DemoSettings]) -> Handler:
    async def admin_change(request: Request) -> Response:
        changes = await _admin_object(request, "settings")
        if isinstance(changes, Response):
            return changes
        try:
            settings = change(**changes)
        except (TypeError, ValueError) as exc:
            return _error(422, str(exc))
        return json_response({"ok": True, "settings": settings.public()})

    return admin_change


def _admin_restart(restart: Callable[[float], Awaitable[None]] | None) -> Handler:
    async def admin_restart(request: Request) -> Response:
        if restart is None:
            return _error(
                501, "restart needs the demo served by DemoServer (pb.demo.serve or python -m playbook.demo)"
            )
        body = await _admin_object(request, 'options, like {"down": 2}')
        if isinstance(body, Response):
            return body
        unknown = sorted(set(body) - {"down"})
        if unknown:
            return _error(422, f"unknown restart option {unknown[0]!r}; the only one is 'down'")
        try:
            down = down_seconds(body.get("down", 0.0))
        except ValueError as exc:
            return _error(422, str(exc))
        # A background task runs after the answer is sent: this connection is not cut short.
        return Response(
            encode({"ok": True, "down": down}).encode("utf-8"),
            200,
            media_type="application/json",
            background=BackgroundTask(restart, down),
        )

    return admin_restart
