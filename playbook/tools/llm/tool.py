"""``pb.llm_tool``: a tool over any OpenAI-compatible Chat Completions endpoint, checked when it
is defined (each error naming its option), and the :class:`LlmTool` a user holds.  What a call
does is its engine's (:mod:`.engine`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from playbook.errors import PlayDefinitionError
from playbook.providers.provider import Provider
from playbook.secrets import Secret, secret
from playbook.tools.llm.engine import LlmEngine
from playbook.tools.tool import Tool

__all__ = ["OPENAI_API_KEY", "LlmTool", "llm_tool"]

OPENAI_API_KEY = secret("OPENAI_API_KEY")  # the default key: read from the environment at call time


class LlmTool(Tool[Any]):
    """A tool over an OpenAI-compatible chat completions endpoint (see :func:`llm_tool`): its
    model shows."""

    __slots__ = ("_llm",)

    def __init__(self, engine: LlmEngine) -> None:
        super().__init__(engine)
        self._llm = engine

    @property
    def model(self) -> str:
        return self._llm.model

    def __repr__(self) -> str:
        llm = self._llm
        out = f", output={llm.structured.model.__name__}" if llm.structured is not None else ""
        via = f", provider={llm.provider.name!r}" if llm.provider is not None else ""
        return f"<LlmTool {llm.name!r} {llm.model} at {llm.base_url}{out}{via}>"


def llm_tool(
    name: str = "llm",
    *,
    model: str,
    base_url: str = "https://api.openai.com/v1",
    secret: Secret | None = OPENAI_API_KEY,
    provider: Provider | None = None,
    system: str | None = None,
    output: Any = None,
    prices: Mapping[str, tuple[float, float] | tuple[float, float, float]] | None = None,
    temperature: float | None = 0.0,
    max_tokens: int | None = None,
    mode: str = "sync",
    timeout: float = 120.0,
    client: httpx.AsyncClient | None = None,
    **fields: Any,
) -> LlmTool:
    """A tool over an OpenAI-compatible Chat Completions endpoint (OpenAI, Azure, vLLM, Ollama,
    OpenRouter, a LiteLLM proxy...): ``await ctx.tool(llm, prompt="...")`` returns the answer's
    text, or with ``output=Model`` (a pydantic model or TypedDict) a dict of its fields.

    Each call costs its usage at the model's prices in the ``genai-prices`` package's table
    (cached input and batch jobs at their own prices; a model the table does not know is
    "unpriced", and ``max_cost`` refuses it); ``prices={"model": (per_1M_input, per_1M_output)}``
    (or ``(input, output, cached_input)``) overrides the table, in the currency given (see
    docs/llm.md, "Prices").  ``provider=pb.Provider(..., rpm=, tpm=)`` paces the
    calls by requests and tokens.  ``secret=None`` sends no key (a local server).  ``**fields``:
    other request fields of the endpoint (``top_p``, ``seed``, ``reasoning_effort``...), which go
    into the request body as given (and so into the receipt's address).

    ``mode="batch"``: calls that miss their receipts are submitted together as a Batch API job
    (``/v1/files``, ``/v1/batches``; cheaper, answered within 24 hours) and their rows sleep until
    it finishes; a rerun after a restart waits for the same job and never submits a call twice.
    """
    if mode not in ("sync", "batch"):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: mode must be 'sync' (one request per call) or 'batch' (a Batch API job), not {mode!r}"
        )
    if not isinstance(model, str) or not model:
        raise PlayDefinitionError(
            f"llm_tool {name!r}: model must be a model name like 'gpt-4o-mini', not {model!r}"
        )
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: base_url must be an http(s) URL like 'https://api.openai.com/v1', not {base_url!r}"
        )
    if secret is not None and not isinstance(secret, Secret):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: secret must come from pb.secret('ENV_VAR'), not a plain value"
        )
    if provider is not None and getattr(provider, "keys", None) is not None:
        if secret is not OPENAI_API_KEY:
            raise PlayDefinitionError(
                f"llm_tool {name!r}: provider {provider.name!r} pools keys (keys=), and each call sends one of them as its "
                "bearer token: drop secret="
            )
        if mode == "batch":
            raise PlayDefinitionError(
                f"llm_tool {name!r}: mode='batch' needs a provider with one key (a batch is read back under the key that "
                f"submitted it), and provider {provider.name!r} pools keys: give the batch tool its own secret= and a provider without keys="
            )
        secret = None
    if system is not None and not isinstance(system, str):
        raise PlayDefinitionError(f"llm_tool {name!r}: system must be text, not {type(system).__name__}")
    _check_request(name, temperature, max_tokens, timeout, fields)
    request: dict[str, Any] = {"temperature": temperature} if temperature is not None else {}
    if max_tokens is not None:
        request["max_tokens"] = max_tokens
    request.update(fields)
    engine = LlmEngine(
        name,
        model=model,
        base_url=base_url,
        secret=secret,
        provider=provider,
        system=system,
        output=output,
        prices=prices,
        request=request,
        mode=mode,
        timeout=float(timeout),
        client=client,
    )
    return LlmTool(engine)


def _check_request(
    name: str, temperature: Any, max_tokens: Any, timeout: Any, fields: Mapping[str, Any]
) -> None:
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
    for reserved in ("model", "messages", "response_format", "stream", "n"):
        if reserved in fields:
            raise PlayDefinitionError(
                f"llm_tool {name!r}: {reserved}= is set by the tool itself, not a request field"
            )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise PlayDefinitionError(
            f"llm_tool {name!r}: timeout must be a number of seconds > 0, not {timeout!r}"
        )
