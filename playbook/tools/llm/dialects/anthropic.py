"""Anthropic's Messages API: ``POST {base_url}/v1/messages`` with the key in ``x-api-key`` and
``anthropic-version: 2023-06-01``.  https://docs.anthropic.com/en/api/messages

The system prompt is the top-level ``system``; the turns are ``messages`` (user and assistant).
``max_tokens`` is required there: a tool that gives none sends :data:`MAX_TOKENS` (4096), which
a provider charging output tokens at dispatch also counts.  An output model is a forced tool:
``tools=[{"name", "description", "input_schema"}]`` with ``tool_choice={"type": "tool", "name"}``,
and the answer is that ``tool_use`` block's ``input`` (kept as its JSON text, as the other
dialects' answers are).  ``stop_reason`` becomes ``finish_reason`` (``end_turn`` -> ``stop``,
``max_tokens`` -> ``length``, ``tool_use`` -> ``tool_calls``, ``refusal`` -> ``content_filter``
with the refusal kept).  ``usage``'s ``input_tokens``, ``cache_read_input_tokens`` and
``cache_creation_input_tokens`` together are the prompt's tokens (cache reads as
``cached_tokens``, cache writes as ``cache_creation_tokens``).  A 529 ``overloaded_error`` is
retried as the provider's overload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from playbook.errors import PlaybookError, ToolError
from playbook.tools.llm.dialects.base import Common, Target, normalized, part, shape_error, split, usage_of

if TYPE_CHECKING:
    from playbook.tools.llm.structured import Structured

__all__ = ["MAX_TOKENS", "VERSION", "Anthropic"]

VERSION = "2023-06-01"  # the anthropic-version header: the API as this module reads it
MAX_TOKENS = 4096  # what a call may answer when the tool sets no max_tokens (the API requires one)

# MessageCreateParams of the official SDK (anthropic-sdk-python), with top_k and top_p that the
# 2023-06-01 version takes, less those the tool sets (model, messages, system, stream) and its own
# options (max_tokens, temperature).
_FIELDS = frozenset(
    {
        "cache_control",
        "container",
        "diagnostics",
        "inference_geo",
        "metadata",
        "output_config",
        "service_tier",
        "speed",
        "stop_sequences",
        "thinking",
        "tool_choice",
        "tools",
        "top_k",
        "top_p",
        "user_profile_id",
        "workspace_id",
        "extra_body",
    }
)
_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


class Anthropic(Common):
    """The Messages API (see the module docstring)."""

    name = "anthropic"
    secret = "ANTHROPIC_API_KEY"
    base_url = "https://api.anthropic.com"
    key_header = ("x-api-key", "{secret}")
    max_tokens = MAX_TOKENS
    # Output tokens are charged from max_tokens when a request starts, then its real count
    # https://docs.anthropic.com/en/api/rate-limits
    charges_max_tokens = "reserved"
    fields = _FIELDS
    reserved = frozenset({"model", "messages", "system", "stream"})

    def url(self, target: Target) -> tuple[str, dict[str, str]]:
        return f"{target.base_url}/v1/messages", {}

    def headers(self, keyed: bool) -> dict[str, str]:
        return {**super().headers(keyed), "anthropic-version": VERSION}

    def body(
        self,
        tool: str,
        model: str,
        messages: list[dict[str, Any]],
        request: Mapping[str, Any],
        structured: Structured | None,
    ) -> dict[str, Any]:
        system, turns = split(tool, messages, api=self.name)
        body: dict[str, Any] = {"model": model, "max_tokens": request.get("max_tokens", MAX_TOKENS)}
        if system is not None:
            body["system"] = system
        body["messages"] = turns
        body.update((k, v) for k, v in request.items() if k not in ("max_tokens", "extra_body"))
        if structured is not None:
            answer = {
                "name": structured.name,
                "description": f"Give the answer as {structured.name}.",
                "input_schema": structured.schema,
            }
            body["tools"] = [*(body.get("tools") or []), answer]
            body["tool_choice"] = {"type": "tool", "name": structured.name}
        body.update(request.get("extra_body") or {})
        return body

    def reply(self, tool: str, data: Any, model: str) -> dict[str, Any]:
        blocks = data.get("content") if isinstance(data, Mapping) else None
        if not isinstance(blocks, list):
            raise shape_error(tool, self.name, "content list", data)
        texts, used = [], None
        for block in blocks:
            if not isinstance(block, Mapping):
                continue
            if block.get("type") == "text":
                texts.append(str(block.get("text") or ""))
            elif block.get("type") == "tool_use" and used is None:
                used = json.dumps(block.get("input"), ensure_ascii=False)
        stop = data.get("stop_reason")
        text = "".join(texts) if texts else None
        usage = part(data, "usage")
        read, wrote = usage.get("cache_read_input_tokens"), usage.get("cache_creation_input_tokens")
        prompt = usage.get("input_tokens")
        if isinstance(prompt, int):
            prompt += (read if isinstance(read, int) else 0) + (wrote if isinstance(wrote, int) else 0)
        return normalized(
            self.name,
            content=None if stop == "refusal" else used if used is not None else text,
            refusal=(text or "refused") if stop == "refusal" else None,
            finish_reason=_STOP.get(stop, stop) if isinstance(stop, str) else None,
            model=data.get("model"),
            usage=usage_of(prompt, usage.get("output_tokens"), read, cache_creation_tokens=wrote),
        )

    def refused(self, error: ToolError, content: bytes, headers: httpx.Headers, now: float) -> PlaybookError:
        if error.status == 400 and b"temperature" in content:
            # Newer models refuse the field llm_tool sends by default.
            error.args = (f"{error.args[0]} (temperature=None leaves temperature out of the request)",)
        return super().refused(error, content, headers, now)
