"""OpenAI's Chat Completions (``POST {base_url}/chat/completions``), and every server that speaks
it: vLLM, Ollama, LM Studio, llama.cpp's server, OpenRouter, a LiteLLM proxy (a local server takes
``secret=None``: no key is sent).  https://platform.openai.com/docs/api-reference/chat/create

The body is the request as the reference defines it: ``model``, ``messages`` (the system prompt
their first), ``temperature``, ``max_tokens``, the other fields given, and with an output model
``response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}``.
The key goes in ``Authorization: Bearer``.  The answer's ``choices[0].message`` holds the text
(``content``) or the model's refusal (``refusal``); ``usage`` is already in the names every
dialect's reply uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from playbook.errors import ToolError
from playbook.tools.llm.dialects.base import Common, Target

if TYPE_CHECKING:
    from playbook.tools.llm.structured import Structured

__all__ = ["CHAT_FIELDS", "OpenAi", "chat_reply"]

# The request fields of Chat Completions besides those the tool sets itself (model, messages,
# response_format, stream, n) and its own options (temperature, max_tokens), as the API reference
# and the official SDK (openai-python's CompletionCreateParams) list them.  extra_body: fields of a
# server's own (vLLM's top_k, min_p...), merged into the body as the SDK's extra_body is.
CHAT_FIELDS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "metadata",
        "modalities",
        "moderation",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
        "extra_body",
    }
)


class OpenAi(Common):
    """Chat Completions (see the module docstring)."""

    name = "openai"
    secret = "OPENAI_API_KEY"
    base_url: str | None = "https://api.openai.com/v1"
    fields = CHAT_FIELDS
    reserved = frozenset({"model", "messages", "response_format", "stream", "stream_options", "n"})

    def url(self, target: Target) -> tuple[str, dict[str, str]]:
        return f"{target.base_url}/chat/completions", {}

    def body(
        self,
        tool: str,
        model: str,
        messages: list[dict[str, Any]],
        request: Mapping[str, Any],
        structured: Structured | None,
    ) -> dict[str, Any]:
        # The same dict, key for key, as before dialects: receipt addresses are made of it.
        extra = request.get("extra_body")
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            **{k: v for k, v in request.items() if k != "extra_body"},
        }
        if structured is not None:
            body["response_format"] = structured.response_format()
        if isinstance(extra, Mapping):
            body.update(extra)
        return body

    def reply(self, tool: str, data: Any, model: str) -> dict[str, Any]:
        return chat_reply(tool, data)


def chat_reply(tool: str, data: Any) -> dict[str, Any]:
    """The part of a chat completion a receipt keeps: the text (or refusal), why it stopped, the
    model that answered and the usage (kept as it came: old receipts replay as they were)."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ToolError(
            f"llm tool {tool!r}: the answer has no choices[0].message: {str(data)[:120]!r}", tool=tool
        ) from None
    return {
        "content": message.get("content"),
        "refusal": message.get("refusal"),
        "finish_reason": choice.get("finish_reason"),
        "model": data.get("model"),
        "usage": data.get("usage"),
        "requests": 1,
    }
