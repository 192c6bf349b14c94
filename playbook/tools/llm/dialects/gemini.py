"""Google's Gemini API: ``POST {base_url}/v1beta/models/{model}:generateContent`` with the key in
``x-goog-api-key``.  https://ai.google.dev/api/generate-content

The system prompt is ``systemInstruction``; the turns are ``contents`` with roles ``user`` and
``model``, each ``parts: [{"text"}]``.  ``temperature`` and ``max_tokens`` go in
``generationConfig`` (``maxOutputTokens``), and so do its other fields given as keywords
(``topP=``, ``seed=``, ``thinkingConfig=``...); the request's own (``safetySettings``,
``tools``, ``toolConfig``, ``cachedContent``) stay at the top.  An output model is
``generationConfig.responseMimeType = "application/json"`` with ``responseJsonSchema``: JSON
Schema as pydantic writes it (``$defs`` and ``anyOf`` included), where ``responseSchema`` would
take only OpenAPI's subset of it.

The answer's text is ``candidates[0].content.parts[].text`` (thought parts left out);
``finishReason`` becomes ``finish_reason`` (``STOP`` -> ``stop``, ``MAX_TOKENS`` -> ``length``, a
safety block -> ``content_filter``, kept as the refusal); a prompt blocked before any candidate
(``promptFeedback.blockReason``) is a refusal too.  ``usageMetadata``: ``promptTokenCount`` (with
``toolUsePromptTokenCount``), ``candidatesTokenCount`` + ``thoughtsTokenCount`` as the
completion, ``cachedContentTokenCount`` as cached.

A refusal's body says more than its status (https://ai.google.dev/gemini-api/docs/rate-limits):
a 429 ``RESOURCE_EXHAUSTED`` puts its wait only in ``error.details``' ``google.rpc.RetryInfo``
(``retryDelay: "45.8s"``), and a ``google.rpc.QuotaFailure`` whose ``quotaId`` names a per-day
quota (``GenerateRequestsPerDayPerProjectPerModel-FreeTier``) is spent until midnight Pacific
time: ``ToolError.quota`` names it and ``retry_after`` is the wait until then.  A 400 whose
``ErrorInfo.reason`` is ``API_KEY_INVALID`` is the key refused, as a 401 is (:meth:`Gemini.denied`):
the run stops naming the key's variable, or a pool of keys retires that key.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx

from playbook.errors import PlaybookError, ToolError
from playbook.providers.limits import body_retry_delay
from playbook.tools.llm.dialects.base import Common, Target, normalized, part, shape_error, split, usage_of

if TYPE_CHECKING:
    from playbook.tools.llm.structured import Structured

__all__ = ["Gemini", "until_pacific_midnight"]

# GenerateContentRequest's own fields (the tool sets model, contents, systemInstruction and
# generationConfig), then GenerationConfig's, as the API reference and the official SDK
# (google-genai, writing its GenerateContentConfig for the Gemini API) place them.  temperature
# and maxOutputTokens are llm_tool's temperature= and max_tokens=; responseMimeType and the
# schemas come with output=.
_TOP = frozenset(
    {"safetySettings", "tools", "toolConfig", "cachedContent", "labels", "serviceTier", "store", "extra_body"}
)
_CONFIG = frozenset(
    {
        "stopSequences",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "responseModalities",
        "candidateCount",
        "topP",
        "topK",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "responseLogprobs",
        "logprobs",
        "enableEnhancedCivicAnswers",
        "speechConfig",
        "thinkingConfig",
        "imageConfig",
        "mediaResolution",
        "audioTranscriptionConfig",
    }
)
_FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}
_BLOCKED = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE"}
)
_TYPES = "type.googleapis.com/google.rpc."


class Gemini(Common):
    """The Gemini API (see the module docstring)."""

    name = "gemini"
    secret = "GEMINI_API_KEY"
    base_url = "https://generativelanguage.googleapis.com"
    key_header = ("x-goog-api-key", "{secret}")
    fields = _TOP | _CONFIG
    reserved = frozenset({"model", "contents", "systemInstruction", "generationConfig", "stream"})
    renamed: Mapping[str, str] = {"maxOutputTokens": "max_tokens"}

    def url(self, target: Target) -> tuple[str, dict[str, str]]:
        model = target.model.removeprefix("models/")
        return f"{target.base_url}/v1beta/models/{quote(model, safe='')}:generateContent", {}

    def body(
        self,
        tool: str,
        model: str,
        messages: list[dict[str, Any]],
        request: Mapping[str, Any],
        structured: Structured | None,
    ) -> dict[str, Any]:
        system, turns = split(tool, messages, api=self.name)
        body: dict[str, Any] = {
            "contents": [
                {"role": "model" if t["role"] == "assistant" else "user", "parts": [{"text": t["content"]}]}
                for t in turns
            ]
        }
        if system is not None:
            body["systemInstruction"] = {"parts": [{"text": system}]}
        config: dict[str, Any] = {}
        for k, v in request.items():
            if k == "max_tokens":
                config["maxOutputTokens"] = v
            elif k == "temperature" or k in _CONFIG:
                config[k] = v
            elif k != "extra_body":
                body[k] = v
        if structured is not None:
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = structured.schema
        if config:
            body["generationConfig"] = config
        body.update(request.get("extra_body") or {})
        return body

    def reply(self, tool: str, data: Any, model: str) -> dict[str, Any]:
        if not isinstance(data, Mapping):
            raise shape_error(tool, self.name, "candidates", data)
        candidates = data.get("candidates")
        usage = part(data, "usageMetadata")
        prompt, done = usage.get("promptTokenCount"), usage.get("candidatesTokenCount")
        extra, thoughts = usage.get("toolUsePromptTokenCount"), usage.get("thoughtsTokenCount")
        if isinstance(prompt, int) and isinstance(extra, int):
            prompt += extra
        if isinstance(thoughts, int):
            done = (done if isinstance(done, int) else 0) + thoughts
        used = usage_of(prompt, done, usage.get("cachedContentTokenCount"))
        first = candidates[0] if isinstance(candidates, list) and candidates else None
        if not isinstance(first, Mapping):
            blocked = (data.get("promptFeedback") or {}).get("blockReason")
            if not blocked:
                raise shape_error(tool, self.name, "candidates", data)
            return normalized(
                self.name,
                content=None,
                refusal=f"the prompt was blocked ({blocked})",
                finish_reason="content_filter",
                model=data.get("modelVersion"),
                usage=used,
            )
        parts = (first.get("content") or {}).get("parts") or []
        texts = [
            str(p.get("text"))
            for p in parts
            if isinstance(p, Mapping) and isinstance(p.get("text"), str) and not p.get("thought")
        ]
        reason = first.get("finishReason")
        blocked = reason in _BLOCKED
        return normalized(
            self.name,
            content="".join(texts) if texts and not blocked else None,
            refusal=f"the answer was blocked ({reason})" if blocked else None,
            finish_reason="content_filter"
            if blocked
            else _FINISH.get(reason, str(reason).lower())
            if reason
            else None,
            model=data.get("modelVersion"),
            usage=used,
        )

    def denied(self, status: int, content: bytes) -> bool:
        return status == 400 and any(
            d.get("reason") == "API_KEY_INVALID" for d in _details(content).get("ErrorInfo", [])
        )

    def refused(self, error: ToolError, content: bytes, headers: httpx.Headers, now: float) -> PlaybookError:
        details = _details(content)
        if error.retry_after is None:
            error.retry_after = body_retry_delay(content)
        for failure in details.get("QuotaFailure", []):
            for violation in failure.get("violations") or []:
                quota = violation.get("quotaId") if isinstance(violation, Mapping) else None
                if isinstance(quota, str) and "PerDay" in quota:
                    error.quota = quota
                    error.retry_after = until_pacific_midnight(now)
                    error.retryable = True
        return super().refused(error, content, headers, now)


def _details(content: bytes) -> dict[str, list[Mapping[str, Any]]]:
    """A Google error body's ``error.details``, by their type's short name (``RetryInfo``...)."""
    try:
        error = json.loads(content).get("error")
    except (ValueError, AttributeError):
        return {}
    found: dict[str, list[Mapping[str, Any]]] = {}
    for detail in (error.get("details") if isinstance(error, Mapping) else None) or []:
        kind = detail.get("@type") if isinstance(detail, Mapping) else None
        if isinstance(kind, str) and kind.startswith(_TYPES):
            found.setdefault(kind.removeprefix(_TYPES), []).append(detail)
    return found


def until_pacific_midnight(now: float) -> float:
    """Seconds from ``now`` (epoch seconds) to the next midnight in US Pacific time, when the
    Gemini API's per-day quotas reset."""
    try:
        zone: dt.tzinfo = ZoneInfo("America/Los_Angeles")
    except (
        ZoneInfoNotFoundError
    ):  # no time zone database here: Pacific standard time, an hour late in summer at worst
        zone = dt.timezone(dt.timedelta(hours=-8))
    here = dt.datetime.fromtimestamp(now, zone)
    midnight = dt.datetime.combine(here.date() + dt.timedelta(days=1), dt.time(), zone)
    return max(0.0, midnight.timestamp() - now)
