"""OpenAI's Responses API: ``POST {base_url}/responses``.
https://platform.openai.com/docs/api-reference/responses/create

The system prompt goes in ``instructions`` and the turns in ``input`` (``[{"role", "content"}]``);
``max_tokens`` is sent as ``max_output_tokens``, and an output model as ``text.format``
(``{"type": "json_schema", "name", "schema", "strict": true}``).  The key goes in
``Authorization: Bearer``.  The answer's ``output`` is a list of items: the text is in the
``output_text`` parts of its ``message`` items, a refusal in their ``refusal`` parts; ``status``
``incomplete`` says why in ``incomplete_details.reason``; ``usage`` counts ``input_tokens``
(``input_tokens_details.cached_tokens`` of them cached) and ``output_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from playbook.tools.llm.dialects.base import Common, Target, normalized, part, shape_error, split, usage_of

if TYPE_CHECKING:
    from playbook.tools.llm.structured import Structured

__all__ = ["Responses"]

# ResponseCreateParams of the official SDK (openai-python), less those the tool sets (model, input,
# instructions, stream, stream_options) and its own options (temperature; max_output_tokens is
# max_tokens=).
_FIELDS = frozenset(
    {
        "access_programs",
        "background",
        "background_options",
        "context_management",
        "conversation",
        "image",
        "include",
        "max_tool_calls",
        "metadata",
        "moderation",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
        "extra_body",
    }
)
# incomplete_details.reason -> Chat Completions' finish_reason
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


class Responses(Common):
    """The Responses API (see the module docstring)."""

    name = "openai-responses"
    secret = "OPENAI_API_KEY"
    base_url = "https://api.openai.com/v1"
    fields = _FIELDS
    reserved = frozenset({"model", "input", "instructions", "stream", "stream_options"})
    renamed: Mapping[str, str] = {"max_output_tokens": "max_tokens"}

    def url(self, target: Target) -> tuple[str, dict[str, str]]:
        return f"{target.base_url}/responses", {}

    def body(
        self,
        tool: str,
        model: str,
        messages: list[dict[str, Any]],
        request: Mapping[str, Any],
        structured: Structured | None,
    ) -> dict[str, Any]:
        system, turns = split(tool, messages, api=self.name, user=False)
        body: dict[str, Any] = {"model": model}
        if system is not None:
            body["instructions"] = system
        body["input"] = turns
        for k, v in request.items():
            if k == "max_tokens":
                body["max_output_tokens"] = v
            elif k != "extra_body":
                body[k] = v
        if structured is not None:
            text = body.get("text")
            body["text"] = {
                **(text if isinstance(text, Mapping) else {}),
                "format": {
                    "type": "json_schema",
                    "name": structured.name,
                    "schema": structured.schema,
                    "strict": True,
                },
            }
        body.update(request.get("extra_body") or {})
        return body

    def reply(self, tool: str, data: Any, model: str) -> dict[str, Any]:
        output = data.get("output") if isinstance(data, Mapping) else None
        if not isinstance(output, list):
            raise shape_error(tool, self.name, "output list", data)
        texts: list[str] = []
        refusals: list[str] = []
        for item in output:
            if not isinstance(item, Mapping) or item.get("type") != "message":
                continue  # reasoning, tool calls: not the answer's text
            for piece in item.get("content") or []:
                if isinstance(piece, Mapping) and piece.get("type") == "output_text":
                    texts.append(str(piece.get("text") or ""))
                elif isinstance(piece, Mapping) and piece.get("type") == "refusal":
                    refusals.append(str(piece.get("refusal") or ""))
        status = data.get("status")
        finish = "stop" if status == "completed" else status if isinstance(status, str) else None
        if status == "incomplete":
            why = (data.get("incomplete_details") or {}).get("reason")
            finish = _INCOMPLETE.get(why, why) if isinstance(why, str) else "incomplete"
        usage = part(data, "usage")
        details = usage.get("input_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
        return normalized(
            self.name,
            content="".join(texts) if texts else None,
            refusal="".join(refusals) if refusals else None,
            finish_reason="content_filter" if refusals and finish == "stop" else finish,
            model=data.get("model"),
            usage=usage_of(usage.get("input_tokens"), usage.get("output_tokens"), cached),
        )
