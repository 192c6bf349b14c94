"""The engine of ``pb.llm_tool``: a call is one request in the tool's dialect
(:mod:`.dialects`: Chat Completions, the Responses API, Anthropic's Messages, Gemini, Azure,
Bedrock), made of its messages; the dialect reads the answer into the reply a receipt keeps, the
same shape in every dialect (:func:`reply_of` is Chat Completions').

A call is ``ctx.tool(llm, prompt="...")`` or ``ctx.tool(llm, messages=[...])``, in every dialect.
Its receipt answers for the request as sent (the URL and the body: model, messages, temperature,
max_tokens, the other request fields and the output schema) and holds the answer's text, usage
and model, so::

    changing the prompt, the model or the schema   pays once for each changed call
    changing ``prices``                             changes what the receipts say they cost, nothing else

With ``output=Model`` the request carries the model's JSON schema (:mod:`.structured`); an
answer that is not valid JSON for it is asked again once (:mod:`.reask`), and the call returns
the model's fields as a dict: a play returning it makes one column per field.  An answer still
invalid after the re-ask stays in its receipt (it was paid for) and fails its row each time,
naming the problem; ``refresh=True`` asks again.

What a call is expected to use and cost before it is sent is :mod:`.tokens` and :mod:`.prices`;
what the endpoint's headers teach the provider is :mod:`.endpoint`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any, Literal

import httpx

from playbook.addresses import digest, key_text, receipt_address
from playbook.errors import ToolError
from playbook.providers import limits
from playbook.providers.provider import Provider
from playbook.secrets import Secret
from playbook.tools.engine import Engine
from playbook.tools.llm.dialects import Dialect, Target
from playbook.tools.llm.dialects.openai import chat_reply
from playbook.tools.llm.endpoint import Endpoint
from playbook.tools.llm.prices import Pricing
from playbook.tools.llm.prices import Tokens as Priced
from playbook.tools.llm.reask import again, combined
from playbook.tools.llm.structured import Structured
from playbook.tools.llm.tokens import Usage, chars
from playbook.tools.protocol import NO_INPUT, CallEnv, Spent

__all__ = ["LlmEngine", "reply_of"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class LlmEngine(Engine):
    """The engine of an LLM tool: one request in its dialect per call (see the module docstring)."""

    remote = True

    __slots__ = (
        "model",
        "base_url",
        "query",
        "system",
        "structured",
        "pricing",
        "request",
        "mode",
        "endpoint",
        "usage",
        "dialect",
        "defaulted",
        "charges_max_tokens",
    )

    def __init__(
        self,
        name: str,
        *,
        dialect: Dialect,
        target: Target,
        query: dict[str, str],
        secret: Secret | None,
        provider: Provider | None,
        system: str | None,
        output: Any,
        prices: Mapping[str, tuple[float, float] | tuple[float, float, float]] | None,
        request: dict[str, Any],
        mode: str,
        timeout: float,
        client: httpx.AsyncClient | None,
        defaulted: bool = False,
    ) -> None:
        """``target``: where the calls go (its base URL without a query); ``query``: a query
        written in ``base_url``, sent with every request beside the dialect's own parameters
        (Azure's ``api-version``, which wins); ``defaulted``: ``provider`` is the one a tool given
        none gets (see :func:`~playbook.tools.llm.tool.default_provider`)."""
        self.dialect, self.defaulted = dialect, defaulted
        self.model, self.system, self.mode = target.model, system, mode
        self.structured = Structured(output, f"llm_tool {name!r}") if output is not None else None
        # priced at the dialect's provider in the price table, or at the one base_url is the API of
        self.pricing = Pricing(name, target.model, api=dialect.name, base_url=target.base_url, prices=prices)
        self.request = request  # temperature, max_tokens and the other fields, before the dialect places them
        pooled = provider is not None and provider.keys is not None  # each call sends its pool's chosen key
        url, own = dialect.url(target)
        self.base_url, self.query = target.base_url, {**query, **own}
        self.endpoint = Endpoint(
            name,
            dialect=dialect,
            target=target,
            method="POST",
            url=url,
            query=dict(self.query),
            body="{request}",
            headers=dialect.headers(secret is not None or pooled),
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
        # Chat Completions' receipts were written under "llm:" + base URL before there were other
        # dialects: kept, so they still answer.
        where = self.base_url if dialect.name == "openai" else f"{dialect.name}:{self.base_url}"
        super().__init__(name, inputs=("prompt",), provider=provider, identity="llm:" + where)
        # How the provider counts a request's max_tokens, as its dialect says: None, what answers
        # use (a call is weighed by what they usually take); "reserved", held from the start and
        # given back but for what the answer used (Anthropic's output budget); "counted", on
        # arrival, whatever the answer uses (Azure's token budget).
        self.charges_max_tokens: Literal["reserved", "counted"] | None = dialect.charges_max_tokens

    @property
    def account(self) -> str:
        # A default provider paces the calls; the receipts stay those of a tool without one.
        return "default" if self.defaulted else super().account

    def _definition(self) -> str:
        schema = self.structured.schema if self.structured is not None else None
        shape = [self.identity, self.model, self.system, self.request, schema] + (
            [self.query] if self.query else []
        )
        return digest(key_text(shape))[:16]

    def __repr__(self) -> str:
        return f"<LlmEngine {self.name!r} {self.dialect.name} {self.model} at {self.base_url}>"

    def submits(self) -> bool:
        return self.mode == "batch"

    # -- inputs and addresses ------------------------------------------------------------------

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
        if not prompt.strip():  # every API refuses an empty turn (a 400), so it is not sent
            raise ToolError(
                f"llm tool {self.name!r}: prompt is empty ({prompt!r}): there is nothing to answer",
                tool=self.name,
            )
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*system, {"role": "user", "content": str(prompt)}]

    def _messages(self, messages: Any) -> list[dict[str, Any]]:
        if not isinstance(messages, list) or not messages:
            raise ToolError(
                f"llm tool {self.name!r}: messages must be a non-empty list of {{'role', 'content'}} dicts",
                tool=self.name,
            )
        for i, m in enumerate(messages):
            role = m.get("role") if isinstance(m, Mapping) else None
            if isinstance(role, str) and role not in _ROLES:
                near = difflib.get_close_matches(role.lower(), sorted(_ROLES), n=1, cutoff=0.5)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ToolError(
                    f"llm tool {self.name!r}: messages[{i}] has role {role!r}{hint}; a role is one of "
                    + ", ".join(sorted(_ROLES)),
                    tool=self.name,
                )
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
        """The request body as sent, in the tool's dialect: the receipt's address is made of it."""
        return self.dialect.body(self.name, self.model, messages, self.request, self.structured)

    def address(self, values: Any) -> str:
        sent: dict[str, Any] = {"url": self.endpoint.url, "body": self.body(values["messages"])}
        if self.query:
            sent["query"] = self.query
        return receipt_address(self.name, self.identity, key_text(sent), self.account)

    # -- weight and cost -----------------------------------------------------------------------

    def weigh(self, values: Any) -> limits.Tokens:
        """The prompt's tokens as input; as output the ``max_tokens`` a provider that charges it
        (``charges_max_tokens``) counts, else what answers usually take."""
        prompt = math.ceil(self.usage.prompt_tokens(values["messages"]))
        cap = self.request.get("max_tokens", self.dialect.max_tokens)
        usual = math.ceil(self.usage.completion(cap))
        if self.charges_max_tokens is not None and isinstance(cap, int) and not isinstance(cap, bool):
            return limits.Tokens(prompt, cap, self.charges_max_tokens, usual)
        return limits.Tokens(prompt, usual)

    def price(self, values: Any) -> float | None:
        # What answers usually take, not the cap; None: the model has no price.
        completion = self.usage.completion(self.request.get("max_tokens"))
        tokens = Priced(self.usage.prompt_tokens(values["messages"]), completion)
        return self.pricing.cost(tokens, batch=self.mode == "batch")

    def spent(self, answer: Any) -> Spent:
        return self.pricing.spent(answer)

    # -- the call ------------------------------------------------------------------------------

    async def invoke(self, values: Any, call: CallEnv) -> tuple[Any, bool]:
        messages = values["messages"]
        # A first answer paid for by an earlier try whose re-ask failed (a 429, a 5xx): kept, not
        # asked for again.
        reply = call.partial or await self._ask(messages, call)
        if self.structured is not None and reply.get("refusal") is None:
            _, why = self.structured.parse(reply.get("content"))
            if why is not None:
                call.partial = reply
                env = CallEnv(call.client, call.idempotency_key + ":reask")
                second = await self._ask(again(messages, reply, why), env, call)
                call.partial = None
                reply = combined(reply, second)
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
        reply = self.dialect.reply(self.name, data, self.model)
        usage = reply.get("usage")
        if isinstance(usage, Mapping):
            self.usage.add(chars(messages), usage)
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
    return chat_reply(name, data)
