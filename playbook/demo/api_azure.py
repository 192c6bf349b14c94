"""Azure OpenAI's chat completions, as the demo speaks it:
``POST /openai/deployments/{deployment}/chat/completions?api-version=...``.

- the key in the ``api-key`` header (401 without a valid one), ``api-version`` required (404
  without, as Azure answers); the deployment names the model;
- the body and the answer are OpenAI's chat completions (see `chat`);
- limits per key as Azure enforces them: ``azure_rpm`` and ``azure_tpm`` per minute, a sixth of
  each per 10-second window, tokens charged as prompt + ``max_tokens`` on arrival (so 429s come
  below the per-minute quota); the answers carry only ``x-ratelimit-remaining-requests`` and
  ``x-ratelimit-remaining-tokens``; a 429 carries ``retry-after`` (whole seconds) and
  ``retry-after-ms``.

As documented at https://learn.microsoft.com/azure/ai-foundry/openai/reference and
https://learn.microsoft.com/azure/ai-foundry/openai/how-to/quota (per-minute limits enforced
over 1 or 10 second periods; max_tokens counted on arrival), and as ``openai.AzureOpenAI`` calls it.
"""

from __future__ import annotations

import math
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from playbook.demo.chat import ChatRequestError, complete_judged
from playbook.demo.dialect import Dialect, DialectError, json_body, pause
from playbook.demo.responses import json_response
from playbook.demo.state import DemoState

__all__ = ["DIALECT", "routes"]

_ACCESS_DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key "
    "for an active subscription and use a correct regional API endpoint for your resource."
)


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """Azure's error body: ``{"error": {"code": "<status>", "message"}}``."""
    return json_response({"error": {"code": str(status), "message": message}}, status, headers)


def _retry_headers(wait: float) -> dict[str, str]:
    ms = max(1, math.ceil(wait * 1000 - 1e-9))
    return {"retry-after": str(max(1, math.ceil(ms / 1000))), "retry-after-ms": str(ms)}


def _refuse(status: int, message: str, wait: float | None) -> Response:
    if status == 401:
        message = _ACCESS_DENIED
    return error(status, message, None if wait is None else _retry_headers(wait))


def _key(request: Request) -> str | None:
    return request.headers.get("api-key") or None


DIALECT = Dialect("azure", _key, _refuse)


def routes(state: DemoState) -> list[tuple[str, str, Any]]:
    return [("POST", "/openai/deployments/{deployment}/chat/completions", _chat(state))]


def _chat(state: DemoState) -> Any:
    async def chat(request: Request) -> Response:
        deployment = request.path_params["deployment"]
        version = request.query_params.get("api-version")
        if not version:
            return error(404, "Resource not found")
        try:
            body = await json_body(request)
        except DialectError as exc:
            return error(exc.status, exc.message)
        body["model"] = deployment  # the deployment names the model, whatever the body says
        try:
            reply, _garbled = complete_judged(body, invalid_json_rate=state.settings.chat_invalid_json_rate)
        except ChatRequestError as exc:
            return json_response(exc.body(), 400)
        if state.overloaded("azure"):
            return error(
                503, "The service is temporarily unable to process your request. Please try again later."
            )
        usage = reply["usage"]
        most = body.get("max_completion_tokens", body.get("max_tokens"))
        # Charged on arrival: the prompt and the most the answer may take (the answer itself when
        # no cap is given, which the demo knows from the start).
        weight = usage["prompt_tokens"] + (most if isinstance(most, int) else usage["completion_tokens"])
        refusal, (requests_left, tokens_left) = state.azure_admit(_key(request) or "", weight)
        headers = {}
        if requests_left is not None:
            headers["x-ratelimit-remaining-requests"] = str(requests_left)
        if tokens_left is not None:
            headers["x-ratelimit-remaining-tokens"] = str(tokens_left)
        if refusal is not None:
            limit = "call rate limit" if refusal.kind == "requests" else "token rate limit"
            seconds = max(1, math.ceil(refusal.wait))
            message = (
                f"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version {version} have "
                f"exceeded {limit} of your current OpenAI S0 pricing tier. Please retry after {seconds} "
                f"second{'s' if seconds != 1 else ''}. Please go here: https://aka.ms/oai/quotaincrease if you "
                "would like to further increase the default rate limit."
            )
            return error(429, message, headers | _retry_headers(refusal.wait))
        await pause(request)
        state.count_usage("azure", usage["prompt_tokens"], usage["completion_tokens"])
        return json_response(reply, 200, headers)

    return chat
