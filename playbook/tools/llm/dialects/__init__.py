"""The dialects an LLM tool speaks, one module each, behind one protocol (:class:`Dialect`, in
:mod:`.base`) that users never see: ``pb.llm_tool(api=...)`` names one::

    openai            Chat Completions; also vLLM, Ollama, LM Studio, llama.cpp, OpenRouter
    openai-responses  OpenAI's Responses API
    anthropic         Anthropic's Messages API
    gemini            Google's Gemini API (generateContent)
    azure             Azure OpenAI (a deployment's chat completions)
    bedrock           AWS Bedrock's Converse API, signed with SigV4 (botocore: the bedrock extra)

:func:`dialect` finds one by name and :func:`checked_fields` holds the fields a tool gives to
those its dialect documents, each refused with its nearest spelling.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from playbook.errors import PlayDefinitionError
from playbook.tools.llm.dialects.anthropic import Anthropic
from playbook.tools.llm.dialects.azure import Azure
from playbook.tools.llm.dialects.base import Dialect, Target
from playbook.tools.llm.dialects.bedrock import Bedrock
from playbook.tools.llm.dialects.gemini import Gemini
from playbook.tools.llm.dialects.openai import OpenAi
from playbook.tools.llm.dialects.responses import Responses

__all__ = ["DIALECTS", "Dialect", "Target", "checked_fields", "dialect"]

# llm_tool's own options: a misspelt one arrives among the fields, and is told its name.
_OPTIONS = frozenset(
    {"api", "base_url", "secret", "provider", "system", "output", "prices", "temperature", "max_tokens"}
    | {"api_version", "region", "mode", "timeout", "client"}
)

DIALECTS: dict[str, Dialect] = {
    d.name: d for d in (OpenAi(), Responses(), Anthropic(), Gemini(), Azure(), Bedrock())
}


def dialect(tool: str, api: Any) -> Dialect:
    """The dialect ``api`` names, or a PlayDefinitionError listing them."""
    found = DIALECTS.get(api) if isinstance(api, str) else None
    if found is None:
        lower = {d.lower(): d for d in DIALECTS}
        near = difflib.get_close_matches(api.lower(), list(lower), n=1) if isinstance(api, str) else []
        near = [lower[n] for n in near]
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise PlayDefinitionError(
            f"llm_tool {tool!r}: api={api!r} is not a dialect playbook speaks{hint}; it speaks "
            + ", ".join(map(repr, DIALECTS))
        )
    return found


def checked_fields(tool: str, speaks: Dialect, fields: Mapping[str, Any]) -> None:
    """Every field a request field ``speaks`` documents, and none the tool sets itself; else a
    PlayDefinitionError naming the field, with its nearest spelling."""
    api = speaks.name
    for field in fields:
        _own(tool, speaks, field, f"{field}=")
        if field not in speaks.fields:
            near = _nearest(field, speaks.fields | set(speaks.renamed) | _OPTIONS)
            hint = f" (did you mean {near}=?)" if near else ""
            raise PlayDefinitionError(
                f"llm_tool {tool!r}: {field}= is not a request field of api={api!r}{hint}; its fields: "
                + ", ".join(sorted(speaks.fields))
            )
    extra = fields.get("extra_body")
    if extra is not None and not isinstance(extra, Mapping):
        raise PlayDefinitionError(
            f"llm_tool {tool!r}: extra_body must be a dict of fields merged into the request body, not {extra!r}"
        )
    for field in extra or {}:  # merged over the body last: it would replace what the tool sets
        _own(tool, speaks, field, f"extra_body's {field!r}")


def _own(tool: str, speaks: Dialect, field: str, said: str) -> None:
    """A PlayDefinitionError when ``field`` is one the tool sets itself (the model, the
    conversation, streaming...) or its own option under the dialect's name."""
    if field in speaks.reserved:
        raise PlayDefinitionError(f"llm_tool {tool!r}: {said} is set by the tool itself, not a request field")
    option = speaks.renamed.get(field)
    if option is not None:
        raise PlayDefinitionError(
            f"llm_tool {tool!r}: {said} is llm_tool's {option}= (api={speaks.name!r} sends it as {field})"
        )


def _nearest(field: str, known: set[str] | frozenset[str]) -> str | None:
    """The known field nearest ``field``, spellings compared without case or underscores (so
    ``top_p`` finds Gemini's ``topP``)."""
    plain = {k.replace("_", "").lower(): k for k in known}
    found = difflib.get_close_matches(field.replace("_", "").lower(), list(plain), n=1, cutoff=0.7)
    return plain[found[0]] if found else None
