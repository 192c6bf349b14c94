"""``pb.llm_tool``: a tool over an LLM API in one of its dialects (:mod:`.dialects`), checked
when it is defined (each error naming its option), and the :class:`LlmTool` a user holds.  What a
call does is its engine's (:mod:`.engine`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx

from playbook.errors import PlayDefinitionError
from playbook.providers.provider import Provider
from playbook.secrets import Secret
from playbook.secrets import secret as secret_of
from playbook.tools.llm.batch import BATCHED
from playbook.tools.llm.dialects import DIALECTS, Dialect, Target, checked_fields, dialect
from playbook.tools.llm.engine import LlmEngine
from playbook.tools.tool import Tool

__all__ = ["DIALECT_KEY", "LlmTool", "default_provider", "llm_tool"]


class _DialectKey:
    """``secret=``'s default: the dialect's own key (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``...)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<the dialect's key>"


DIALECT_KEY: Any = _DialectKey()


class LlmTool(Tool[Any]):
    """A tool over an LLM API (see :func:`llm_tool`): its model shows."""

    __slots__ = ("_llm",)

    def __init__(self, engine: LlmEngine) -> None:
        super().__init__(engine)
        self._llm = engine

    @property
    def model(self) -> str:
        return self._llm.model

    def __repr__(self) -> str:
        llm = self._llm
        api = f" api={llm.dialect.name!r}" if llm.dialect.name != "openai" else ""
        out = f", output={llm.structured.model.__name__}" if llm.structured is not None else ""
        via = f", provider={llm.provider.name!r}" if llm.provider is not None and not llm.defaulted else ""
        return f"<LlmTool {llm.name!r}{api} {llm.model} at {llm.base_url}{out}{via}>"


def llm_tool(
    name: str = "llm",
    *,
    model: str,
    api: str = "openai",
    base_url: str | None = None,
    secret: Secret | None = DIALECT_KEY,
    provider: Provider | None = None,
    system: str | None = None,
    output: Any = None,
    prices: Mapping[str, tuple[float, float] | tuple[float, float, float]] | None = None,
    temperature: float | None = 0.0,
    max_tokens: int | None = None,
    api_version: str | None = None,
    region: str | None = None,
    mode: str = "sync",
    timeout: float = 120.0,
    client: httpx.AsyncClient | None = None,
    **fields: Any,
) -> LlmTool:
    """A tool over an LLM API: ``await ctx.tool(llm, prompt="...")`` (or ``messages=[...]``)
    returns the answer's text, or with ``output=Model`` (a pydantic model or TypedDict) a dict of
    its fields, the same in every dialect.

    ``api`` names the dialect: ``"openai"`` (Chat Completions; also vLLM, Ollama, LM Studio,
    llama.cpp, OpenRouter, a LiteLLM proxy), ``"openai-responses"`` (the Responses API),
    ``"anthropic"`` (Messages), ``"gemini"`` (``generateContent``), ``"azure"`` (``model=`` is the
    deployment; ``api_version=``) or ``"bedrock"`` (Converse, signed with SigV4; ``region=``; the
    ``bedrock`` extra).  Each has its default ``base_url`` and key: ``secret=`` defaults to
    ``pb.secret`` of ``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ``GEMINI_API_KEY`` or
    ``AZURE_OPENAI_API_KEY``; Bedrock reads the AWS credential chain.  ``secret=None`` sends no key
    (a local server).

    Each call costs its usage at the model's prices in the ``genai-prices`` package's table
    (cached input and batch jobs at their own prices; a model the table does not know is
    "unpriced", and ``max_cost`` refuses it); ``prices={"model": (per_1M_input, per_1M_output)}``
    (or ``(input, output, cached_input)``) overrides the table, in the currency given (see
    docs/llm.md, "Prices").  ``provider=pb.Provider(..., rpm=, tpm=)`` paces the
    calls by requests and tokens.  Without ``provider=`` the tool gets a default one, as every LLM
    API limits its calls: named after the dialect for its default ``base_url`` (``"openai"``,
    ``"anthropic"``, ``"gemini"``, ``"bedrock"``) or after ``base_url``'s host otherwise, its
    account the key's variable (``account="OPENAI_API_KEY"``: two keys are two accounts), with no
    limits configured: a 429, 529 or 503 is waited out and retried as for any provider, and the
    limits its answers announce are learnt.  The tools of one process with the same default share
    it.  Its receipts are kept as a tool's without a provider.  ``**fields``: other request fields the dialect's API reference
    documents (``top_p``, ``seed``, ``reasoning_effort``... for Chat Completions; ``topK`` for
    Gemini), which go into the request body (and so into the receipt's address); any other is
    refused here, with its nearest spelling.  ``extra_body={...}`` merges a server's own fields
    into the body as given (not one the tool sets itself: the model, the conversation, ``stream``).
    ``base_url`` is sent as written: a ``{`` or ``}`` in it is refused (Azure's is
    ``https://YOUR-RESOURCE.openai.azure.com``, with your resource's name).

    ``mode="batch"`` (``api="openai"``, ``"anthropic"`` or ``"gemini"``): calls that miss their
    receipts are submitted together as one batch job (OpenAI's Batch API, Anthropic's Message
    Batches, Gemini's batch mode; half the price, answered within 24 hours) and their rows sleep
    until it finishes; a rerun after a restart waits for the same job and never submits a call
    twice.  Each answer's receipt is the online call's (same address, same reply), marked
    ``"batch": true``.
    """
    speaks = dialect(name, api)
    if mode not in ("sync", "batch"):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: mode must be 'sync' (one request per call) or 'batch' (a Batch API job), not {mode!r}"
        )
    if mode == "batch" and speaks.name not in BATCHED:
        raise PlayDefinitionError(
            f"llm_tool {name!r}: mode='batch' sends batch jobs, which api={speaks.name!r} does not take: "
            f"use api={' or '.join(map(repr, BATCHED))}, or mode='sync'"
        )
    if not isinstance(model, str) or not model:
        raise PlayDefinitionError(
            f"llm_tool {name!r}: model must be a model name like 'gpt-4o-mini', not {model!r}"
        )
    if base_url is not None and (
        not isinstance(base_url, str) or not base_url.startswith(("http://", "https://"))
    ):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: base_url must be an http(s) URL like 'https://api.openai.com/v1', not {base_url!r}"
        )
    if base_url is not None and ("{" in base_url or "}" in base_url):
        raise PlayDefinitionError(f"llm_tool {name!r}: {_literal(base_url)}")
    for option, value in (("api_version", api_version), ("region", region)):
        if value is not None and option not in speaks.takes:
            raise PlayDefinitionError(f"llm_tool {name!r}: {option}= is not an option of api={speaks.name!r}")
    secret = _key(name, speaks, secret, provider, mode)
    if system is not None and not isinstance(system, str):
        raise PlayDefinitionError(f"llm_tool {name!r}: system must be text, not {type(system).__name__}")
    _check_request(name, temperature, max_tokens, timeout)
    checked_fields(name, speaks, fields)
    request: dict[str, Any] = {"temperature": temperature} if temperature is not None else {}
    if max_tokens is not None or speaks.max_tokens is not None:
        request["max_tokens"] = max_tokens if max_tokens is not None else speaks.max_tokens
    request.update(fields)
    if region is None and "region" in speaks.takes:
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
    target = speaks.target(name, base_url, model, api_version, region)
    split = urlsplit(target.base_url)  # a query in base_url goes with every request, after the path
    defaulted = provider is None
    if provider is None:
        provider = default_provider(speaks, target, secret)
    engine = LlmEngine(
        name,
        dialect=speaks,
        target=target._replace(base_url=urlunsplit(split._replace(query="", fragment="")).rstrip("/")),
        query=dict(parse_qsl(split.query)),
        secret=secret,
        provider=provider,
        system=system,
        output=output,
        prices=prices,
        request=request,
        mode=mode,
        timeout=float(timeout),
        client=client,
        defaulted=defaulted,
    )
    return LlmTool(engine)


def default_provider(speaks: Dialect, target: Target, secret: Secret | None) -> Provider:
    """The provider of an LLM tool given none: every LLM API limits its calls, so they are paced
    and retried as any provider's, under the limits its answers teach (none configured).  It is
    named after the dialect when ``base_url`` is a dialect's default (``"openai"``,
    ``"anthropic"``, ``"gemini"``, ``"bedrock"``) or after the endpoint's host (and port), and
    its account is the key's variable (each key its own limits; Bedrock's: the region).  Equal
    ones share one governor in a process (Provider's own rule), so the tools of one account share
    its limit."""
    host = urlsplit(target.base_url)
    named = next((d.name for d in DIALECTS.values() if _default_url(d) == target.base_url.rstrip("/")), None)
    if (
        speaks.name == "bedrock"
        and target.base_url == f"https://bedrock-runtime.{target.region}.amazonaws.com"
    ):
        named = "bedrock"
    account = secret.env_var if secret is not None else (target.region or "default")
    return Provider(named or host.netloc or target.base_url, account=account)


def _default_url(speaks: Dialect) -> str | None:
    url = getattr(speaks, "base_url", None)
    return url.rstrip("/") if isinstance(url, str) else None


def _key(name: str, speaks: Dialect, secret: Any, provider: Provider | None, mode: str) -> Secret | None:
    """The key the tool's calls send: its own, the dialect's default, or none (a provider that
    pools keys sends one of its own with each call)."""
    if speaks.secret is None and secret is not DIALECT_KEY:
        raise PlayDefinitionError(
            f"llm_tool {name!r}: api={speaks.name!r} signs each request with the AWS credentials botocore finds "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, a role): drop secret="
        )
    if secret is not None and secret is not DIALECT_KEY and not isinstance(secret, Secret):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: secret must come from pb.secret('ENV_VAR'), not a plain value"
        )
    if provider is not None and getattr(provider, "keys", None) is not None:
        if speaks.secret is None:
            raise PlayDefinitionError(
                f"llm_tool {name!r}: provider {provider.name!r} pools keys (keys=), but api={speaks.name!r} signs its "
                "requests with AWS credentials, not a key: give it a provider without keys="
            )
        if secret is not DIALECT_KEY:
            raise PlayDefinitionError(
                f"llm_tool {name!r}: provider {provider.name!r} pools keys (keys=), and each call sends one of them as its "
                "key: drop secret="
            )
        if mode == "batch":
            raise PlayDefinitionError(
                f"llm_tool {name!r}: mode='batch' needs a provider with one key (a batch is read back under the key that "
                f"submitted it), and provider {provider.name!r} pools keys: give the batch tool its own secret= and a provider without keys="
            )
        return None
    if secret is DIALECT_KEY:
        return secret_of(speaks.secret) if speaks.secret is not None else None
    return secret


def _literal(base_url: str) -> str:
    """Why ``base_url`` with braces is refused: it is sent as written, not filled in."""
    hole = re.search(r"\{([^{}]*)\}", base_url)
    what = hole.group(0) if hole else "the braces"
    instead = {
        "{resource}": f"replace {what} with your Azure resource's name",
        "{region}": f"replace {what} with the AWS region (e.g. us-east-1)",
        "{secret}": f"remove {what}: the key goes in its header (secret=), never in the URL",
    }.get(what, f"replace {what} with its value")
    return f"base_url is sent as written, and no placeholder in it is filled in ({base_url!r}): {instead}"


def _check_request(name: str, temperature: Any, max_tokens: Any, timeout: Any) -> None:
    """The request options of ``llm_tool`` checked when the tool is defined, each error naming its option."""
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0 <= temperature <= 2
    ):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: temperature must be a number from 0 to 2 (or None to leave it out), not {temperature!r}"
        )
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: max_tokens must be a whole number >= 1, not {max_tokens!r}"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise PlayDefinitionError(
            f"llm_tool {name!r}: timeout must be a number of seconds > 0, not {timeout!r}"
        )
