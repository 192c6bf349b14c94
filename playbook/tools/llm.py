"""``pb.llm_tool``: a tool over any OpenAI-compatible Chat Completions endpoint.

A call is ``ctx.tool(llm, prompt="...")`` or ``ctx.tool(llm, messages=[...])``.  Its receipt
answers for the request as sent to that endpoint (model, messages, temperature, max_tokens, the
other parameters and the output schema) and holds the answer's text, usage and model, so::

    changing the prompt, the model or the schema   pays once for each changed call
    changing ``prices``                             changes what the receipts say they cost, nothing else

With ``output=Model`` the request carries the model's JSON schema (strict ``json_schema``); an
answer that is not valid JSON for it is asked again once, in the same call (both requests are
paid and counted), and the call returns the model's fields as a dict: a play returning it makes
one column per field.  An answer still invalid after the re-ask stays in its receipt (it was
paid for) and fails its row each time, naming the problem; ``refresh=True`` asks again.

Each call weighs its estimated tokens against the provider's ``tpm`` (characters over the
characters per token seen so far in this endpoint's answers, plus the completion expected) and
is charged its real usage once answered; the ``x-ratelimit-limit-*`` headers of every answer
teach the provider limits nobody configured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx

from playbook.addresses import digest, key_text, receipt_address
from playbook.errors import PlayDefinitionError, ToolError
from playbook.providers.limits import announced
from playbook.providers.provider import Provider
from playbook.secrets import Secret, secret
from playbook.tools.base import NO_INPUT, CallEnv, Spent, Tool
from playbook.tools.http import HttpTool
from playbook.tools.structured import Structured

__all__ = ["LlmTool", "llm_tool", "reply_of"]

OPENAI_API_KEY = secret("OPENAI_API_KEY")  # the default key: read from the environment at call time
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_REASK = "Your answer could not be used: {why}. Answer again with only a JSON object that matches the schema, and nothing else."


class _Endpoint(HttpTool):
    """The chat completions endpoint as an HTTP tool: errors classified as HTTP answers, and the
    limits the provider announces in each answer's headers passed on."""

    def heard(self, headers: httpx.Headers, call: CallEnv) -> None:
        found = announced(headers)
        if found is not None:
            call.announced = found


class Usage:
    """What this endpoint's answers taught about tokens: characters per prompt token, and the
    completion's usual length (a call is weighed before it is sent)."""

    __slots__ = ("chars", "prompt", "completions", "answers")

    def __init__(self) -> None:
        self.chars = self.prompt = self.completions = 0.0
        self.answers = 0

    def __repr__(self) -> str:
        return f"<Usage {self.chars_per_token():.2f} chars/token, ~{self.completion(None):.0f} completion tokens>"

    def chars_per_token(self) -> float:
        return self.chars / self.prompt if self.prompt >= 200 else 4.0  # the usual ratio until measured

    def completion(self, max_tokens: int | None) -> float:
        seen = self.completions / self.answers if self.answers else 64.0
        return min(seen, max_tokens) if max_tokens is not None else seen

    def add(self, chars: int, usage: Mapping[str, Any]) -> None:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int) and prompt > 0:
            self.chars += chars
            self.prompt += prompt
            self.completions += completion
            self.answers += 1


class LlmTool(Tool[Any]):
    """A tool over an OpenAI-compatible chat completions endpoint (see :func:`llm_tool`)."""

    remote = True

    __slots__ = (
        "model",
        "base_url",
        "query",
        "system",
        "structured",
        "prices",
        "request",
        "mode",
        "endpoint",
        "usage",
    )

    def __init__(
        self,
        name: str,
        *,
        model: str,
        base_url: str,
        secret: Secret | None,
        provider: Provider | None,
        system: str | None,
        output: Any,
        prices: Mapping[str, tuple[float, float]] | None,
        request: dict[str, Any],
        mode: str,
        timeout: float,
        client: httpx.AsyncClient | None,
    ) -> None:
        self.model, self.system, self.mode = model, system, mode
        self.structured = Structured(output, f"llm_tool {name!r}") if output is not None else None
        self.prices = _prices(name, model, prices)
        self.request = request  # temperature, max_tokens and the other parameters, as sent
        pooled = provider is not None and provider.keys is not None  # each call sends its pool's chosen key
        headers = {"Authorization": "Bearer {secret}"} if secret is not None or pooled else {}
        # A query in base_url (Azure's ?api-version=...) goes with every request, after the path.
        split = urlsplit(base_url)
        self.base_url, self.query = (
            urlunsplit(split._replace(query="", fragment="")).rstrip("/"),
            dict(parse_qsl(split.query)),
        )
        self.endpoint = _Endpoint(
            name,
            method="POST",
            url=f"{self.base_url}/chat/completions",
            query=dict(self.query),
            body="{request}",
            headers=headers,
            pick=None,
            miss_status=frozenset(),
            secret=secret,
            timeout=timeout,
            client=client,
            version="1",
            provider=provider,
            cost=0.0,
        )
        self.usage = Usage()
        super().__init__(name, params=("prompt",), provider=provider, identity="llm:" + self.base_url)

    def _definition(self) -> str:
        schema = self.structured.schema if self.structured is not None else None
        shape = [self.identity, self.model, self.system, self.request, schema] + (
            [self.query] if self.query else []
        )
        return digest(key_text(shape))[:16]

    def __repr__(self) -> str:
        out = f", output={self.structured.model.__name__}" if self.structured is not None else ""
        via = f", provider={self.provider.name!r}" if self.provider is not None else ""
        return f"<LlmTool {self.name!r} {self.model} at {self.base_url}{out}{via}>"

    def submits(self) -> bool:
        return self.mode == "batch"

    # -- inputs and keys -----------------------------------------------------------------------

    def bind(self, input: Any, kwargs: Mapping[str, Any]) -> Any:
        """``{"messages": [...]}`` from ``prompt=``, ``messages=`` or one positional of either."""
        if input is not NO_INPUT:
            if kwargs:
                raise ToolError(
                    f"llm tool {self.name!r}: pass the prompt positionally or by keyword, not both",
                    tool=self.name,
                )
            if isinstance(input, Mapping):  # a tool mapped over a frame binds {"prompt": column}
                kwargs = dict(input)
            else:
                kwargs = {"messages" if isinstance(input, list) else "prompt": input}
        unknown = sorted(set(kwargs) - {"prompt", "messages"})
        if unknown or len(kwargs) != 1:
            got = f" (got {', '.join(unknown or sorted(kwargs)) or 'nothing'})"
            raise ToolError(
                f"llm tool {self.name!r} takes prompt='...' or messages=[...]{got}", tool=self.name
            )
        if "prompt" in kwargs:
            return {"messages": self._prompted(kwargs["prompt"])}
        return {"messages": self._messages(kwargs["messages"])}

    def _prompted(self, prompt: Any) -> list[dict[str, Any]]:
        if not isinstance(prompt, str):
            shown = (
                "NaN (a missing value)"
                if isinstance(prompt, float) and math.isnan(prompt)
                else repr(prompt)[:60]
            )
            raise ToolError(f"llm tool {self.name!r}: prompt must be text, not {shown}", tool=self.name)
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*system, {"role": "user", "content": str(prompt)}]

    def _messages(self, messages: Any) -> list[dict[str, Any]]:
        if not isinstance(messages, list) or not messages:
            raise ToolError(
                f"llm tool {self.name!r}: messages must be a non-empty list of {{'role', 'content'}} dicts",
                tool=self.name,
            )
        for i, m in enumerate(messages):
            if (
                not isinstance(m, Mapping)
                or m.get("role") not in _ROLES
                or not isinstance(m.get("content"), (str, list))
            ):
                raise ToolError(
                    f"llm tool {self.name!r}: messages[{i}] must be a dict with a role ({', '.join(sorted(_ROLES))}) "
                    f"and a text content, not {m!r:.80}",
                    tool=self.name,
                )
        out = [dict(m) for m in messages]
        if self.system is not None and out[0]["role"] not in ("system", "developer"):
            out.insert(0, {"role": "system", "content": self.system})
        return out

    def body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The request body as sent: the receipt key is made of it."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.request}
        if self.structured is not None:
            body["response_format"] = self.structured.response_format()
        return body

    def key(self, values: Any) -> str:
        sent: dict[str, Any] = {"url": self.endpoint.url, "body": self.body(values["messages"])}
        if self.query:
            sent["query"] = self.query
        return receipt_address(self.name, self.identity, key_text(sent), self.account)

    # -- weight and cost -----------------------------------------------------------------------

    def weigh(self, values: Any) -> float:
        return math.ceil(self._prompt_tokens(values) + self.usage.completion(self.request.get("max_tokens")))

    def price(self, values: Any) -> float:
        if self.prices is None:
            return 0.0
        completion = self.usage.completion(
            self.request.get("max_tokens")
        )  # what answers usually take, not the cap
        return (self._prompt_tokens(values) * self.prices[0] + completion * self.prices[1]) / 1e6

    def _prompt_tokens(self, values: Any) -> float:
        """The prompt's tokens, estimated: its characters over those a token took lately, 4 a message more."""
        messages = values["messages"]
        return _chars(messages) / self.usage.chars_per_token() + 4 * len(messages)

    def spent(self, answer: Any) -> Spent:
        usage = answer.get("usage") if isinstance(answer, Mapping) else None
        if not isinstance(usage, Mapping):
            return Spent(0.0, None, 1)
        prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        refused = answer.get("refused_usage")
        return Spent(
            self._cost(prompt, completion),
            float(prompt + completion),
            int(answer.get("requests") or 1),
            self._cost(int(refused.get("prompt_tokens") or 0), int(refused.get("completion_tokens") or 0))
            if isinstance(refused, Mapping)
            else 0.0,
        )

    def _cost(self, prompt: int, completion: int) -> float:
        return (
            (prompt * self.prices[0] + completion * self.prices[1]) / 1e6 if self.prices is not None else 0.0
        )

    # -- the call ------------------------------------------------------------------------------

    async def invoke(self, inputs: Any, call: CallEnv) -> tuple[Any, bool]:
        messages = inputs["messages"]
        # A first answer paid for by an earlier try whose re-ask failed (a 429, a 5xx): kept, not asked for again.
        reply = call.partial or await self._ask(messages, call)
        if self.structured is not None and reply.get("refusal") is None:
            _, why = self.structured.parse(reply.get("content"))
            if why is not None:
                again = [
                    *messages,
                    {"role": "assistant", "content": reply.get("content") or ""},
                    {"role": "user", "content": _REASK.format(why=why)},
                ]
                call.partial = reply
                second = await self._ask(again, CallEnv(call.client, call.idempotency_key + ":reask"), call)
                call.partial = None
                reply = _combined(reply, second)
        return reply, False

    async def _ask(
        self, messages: list[dict[str, Any]], call: CallEnv, told: CallEnv | None = None
    ) -> dict[str, Any]:
        """One request; the answer as its receipt keeps it."""
        try:
            data, _ = await self.endpoint.invoke({"request": self.body(messages)}, call)
        finally:
            if told is not None and call.announced is not None:
                told.announced = call.announced
        reply = reply_of(self.name, data)
        usage = reply.get("usage")
        if isinstance(usage, Mapping):
            self.usage.add(_chars(messages), usage)
        return reply

    def read(self, answer: Any, miss: bool) -> tuple[Any, bool]:
        if not isinstance(answer, Mapping):
            return None, True
        if answer.get("refusal") is not None:
            return None, True  # the model declined: no value, like a lookup that found nothing
        content = answer.get("content")
        if self.structured is None:
            return content, content is None
        fields, why = self.structured.parse(content)
        if why is not None:
            tries = "after a re-ask " if int(answer.get("requests") or 1) > 1 else ""
            raise ToolError(
                f"llm tool {self.name!r}: {why} {tries}(paid for and kept in its receipt: pass ctx.tool(..., refresh=True) to ask again)",
                tool=self.name,
            )
        return fields, False


def reply_of(name: str, data: Any) -> dict[str, Any]:
    """The part of a chat completion a receipt keeps: the text (or refusal), why it stopped,
    the model that answered and the usage."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ToolError(
            f"llm tool {name!r}: the answer has no choices[0].message: {str(data)[:120]!r}", tool=name
        ) from None
    return {
        "content": message.get("content"),
        "refusal": message.get("refusal"),
        "finish_reason": choice.get("finish_reason"),
        "model": data.get("model"),
        "usage": data.get("usage"),
        "requests": 1,
    }


def _combined(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The re-asked answer, carrying the usage of both requests (both were paid for), and that of
    the first apart: it bought an answer validation refused (``run.stats.cost_failed``)."""
    usage: dict[str, Any] = {}
    for reply in (first, second):
        for k, v in (reply.get("usage") or {}).items():
            if isinstance(v, int):
                usage[k] = usage.get(k, 0) + v
    return {**second, "usage": usage, "requests": 2, "refused_usage": first.get("usage")}


def _chars(messages: list[dict[str, Any]]) -> int:
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return total


def _prices(name: str, model: str, prices: Mapping[str, Any] | None) -> tuple[float, float] | None:
    if prices is None:
        return None
    if not isinstance(prices, Mapping) or model not in prices:
        known = ", ".join(map(repr, prices)) if isinstance(prices, Mapping) else repr(prices)
        raise PlayDefinitionError(
            f"llm_tool {name!r}: prices has no entry for model {model!r} (it has {known}); "
            f"give prices={{{model!r}: (usd_per_1M_input, usd_per_1M_output)}}"
        )
    pair = prices[model]
    ok = isinstance(pair, (tuple, list)) and len(pair) == 2
    if not ok or any(
        isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < math.inf for p in pair
    ):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: prices[{model!r}] must be (price_per_1M_input_tokens, price_per_1M_output_tokens), not {pair!r}"
        )
    return float(pair[0]), float(pair[1])


def llm_tool(
    name: str = "llm",
    *,
    model: str,
    base_url: str = "https://api.openai.com/v1",
    secret: Secret | None = OPENAI_API_KEY,
    provider: Provider | None = None,
    system: str | None = None,
    output: Any = None,
    prices: Mapping[str, tuple[float, float]] | None = None,
    temperature: float | None = 0.0,
    max_tokens: int | None = None,
    mode: str = "sync",
    timeout: float = 120.0,
    client: httpx.AsyncClient | None = None,
    **params: Any,
) -> LlmTool:
    """A tool over an OpenAI-compatible Chat Completions endpoint (OpenAI, Azure, vLLM, Ollama,
    OpenRouter, a LiteLLM proxy...): ``await ctx.tool(llm, prompt="...")`` returns the answer's
    text, or with ``output=Model`` (a pydantic model or TypedDict) a dict of its fields.

    ``prices={"model": (per_1M_input, per_1M_output)}`` makes each call cost its usage, in the
    currency given (``max_cost`` counts it); ``provider=pb.Provider(..., rpm=, tpm=)`` paces the
    calls by requests and tokens.  ``secret=None`` sends no key (a local server).  Other keyword
    arguments (``top_p``, ``seed``, ``reasoning_effort``...) go into the request body as given.

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
    _check_request(name, temperature, max_tokens, timeout, params)
    request: dict[str, Any] = {"temperature": temperature} if temperature is not None else {}
    if max_tokens is not None:
        request["max_tokens"] = max_tokens
    request.update(params)
    return LlmTool(
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


def _check_request(
    name: str, temperature: Any, max_tokens: Any, timeout: Any, params: Mapping[str, Any]
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
        if reserved in params:
            raise PlayDefinitionError(
                f"llm_tool {name!r}: {reserved}= is set by the tool itself, not a request parameter"
            )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise PlayDefinitionError(
            f"llm_tool {name!r}: timeout must be a number of seconds > 0, not {timeout!r}"
        )
