"""Azure OpenAI's Chat Completions: ``model=`` names the deployment, reached as ``POST
{base_url}/openai/deployments/{deployment}/chat/completions?api-version={api_version}`` with the
key in an ``api-key`` header.  https://learn.microsoft.com/azure/ai-foundry/openai/reference

``base_url`` is the resource's endpoint (``https://YOUR-RESOURCE.openai.azure.com``): it has no
default.  ``api_version`` defaults to ``2024-10-21``, the latest generally available version of
this (deployments) API.  The body and the answer are Chat Completions' (:mod:`.openai`), with no
``model`` field: the deployment says which model answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from playbook.errors import PlayDefinitionError
from playbook.tools.llm.dialects.base import Target
from playbook.tools.llm.dialects.openai import OpenAi, chat_reply

if TYPE_CHECKING:
    from playbook.tools.llm.structured import Structured

__all__ = ["API_VERSION", "Azure"]

API_VERSION = "2024-10-21"


class Azure(OpenAi):
    """Azure OpenAI (see the module docstring)."""

    name = "azure"
    secret = "AZURE_OPENAI_API_KEY"
    base_url = None
    takes = frozenset({"api_version"})
    key_header = ("api-key", "{secret}")
    # Its token limit counts a request's prompt plus max_tokens on arrival, whatever it answers
    # https://learn.microsoft.com/azure/ai-services/openai/how-to/quota
    charges_max_tokens = "counted"

    def target(
        self, tool: str, base_url: str | None, model: str, api_version: str | None, region: str | None
    ) -> Target:
        if base_url is None:
            raise PlayDefinitionError(
                f"llm_tool {tool!r}: api='azure' needs base_url='https://YOUR-RESOURCE.openai.azure.com' (your "
                "resource's endpoint, YOUR-RESOURCE its name: it has no default)"
            )
        if api_version is not None and (not isinstance(api_version, str) or not api_version):
            raise PlayDefinitionError(
                f"llm_tool {tool!r}: api_version must be an Azure API version like {API_VERSION!r}, not {api_version!r}"
            )
        return Target(base_url, model, api_version or API_VERSION, None)

    def url(self, target: Target) -> tuple[str, dict[str, str]]:
        assert target.api_version is not None
        return (
            f"{target.base_url}/openai/deployments/{quote(target.model, safe='')}/chat/completions",
            {"api-version": target.api_version},
        )

    def body(
        self,
        tool: str,
        model: str,
        messages: list[dict[str, Any]],
        request: Mapping[str, Any],
        structured: Structured | None,
    ) -> dict[str, Any]:
        body = super().body(tool, model, messages, request, structured)
        del body["model"]  # the deployment, in the URL, says which model answers
        return body

    def reply(self, tool: str, data: Any, model: str) -> dict[str, Any]:
        return {**chat_reply(tool, data), "api": self.name}
