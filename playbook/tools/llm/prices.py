"""What an LLM call costs, from the usage its answer keeps: by the user's ``prices`` table when
the tool has one, else by the price table of the ``genai-prices`` package for the model that
answered; ``None`` (unpriced) for a model neither knows, never 0.

The usage is read in the names of OpenAI's chat completions, whatever the dialect
(``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``, and
``cache_creation_tokens`` there for tokens written to a cache)::

    cost = uncached input x input price + cached input x cache-read price
           + tokens written to a cache x cache-write price + output x output price

An answer of a batch job (``"batch": true`` in it) costs the table's batch price, or half the
online price where the table has none (every provider's batch APIs take half); its online
price is kept beside (``Spent.online``: the estimate shows both).  Receipts keep usage, never cost: a new price re-prices the receipts as they are replayed.

The table is the package's bundled data (no network at import or during a run); a newer
``genai-prices`` brings newer prices, and ``genai_prices.UpdatePrices`` fetches the latest
into the running process (see docs/llm.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NamedTuple

from playbook.errors import PlayDefinitionError
from playbook.providers import limits
from playbook.tools.protocol import Spent

if TYPE_CHECKING:
    from genai_prices.data_snapshot import DataSnapshot
    from genai_prices.types import ModelPrice

__all__ = ["PROVIDERS", "Pricing", "Tokens", "checked", "tokens_of"]

# The dialect's provider in the price table: the same model name costs what its provider asks.
PROVIDERS: dict[str, str] = {
    "openai": "openai",
    "openai-responses": "openai",
    "anthropic": "anthropic",
    "gemini": "google",
    "google": "google",
    "azure": "azure",
    "bedrock": "aws",
    "aws": "aws",
}

Given = tuple[float, float, float]  # per 1M input, output, cached input tokens


class Tokens(NamedTuple):
    """An answer's usage as priced: ``prompt`` counts every input token, ``cached`` those of them
    read from the provider's cache and ``written`` those written to it."""

    prompt: float
    completion: float
    cached: float = 0
    written: float = 0


def tokens_of(usage: Mapping[str, Any]) -> Tokens:
    """The tokens of a normalized usage (OpenAI's chat completions names)."""
    details = usage.get("prompt_tokens_details")
    cached = written = 0
    if isinstance(details, dict):  # JSON: a replay of many receipts reads each (no ABC checks)
        cached = _count(details.get("cached_tokens"))
        written = _count(details.get("cache_creation_tokens"))
    return Tokens(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")), cached, written)


def _count(value: Any) -> int:
    if type(value) is int:
        return value if value > 0 else 0
    return int(value) if type(value) is float and value > 0 else 0


def checked(name: str, model: str, prices: Mapping[str, Any] | None) -> Given | None:
    """``prices[model]`` as ``(input, output, cached input)`` per million tokens (cached input at
    the input price unless a third price is given), or a PlayDefinitionError naming the tool."""
    if prices is None:
        return None
    if not isinstance(prices, Mapping) or model not in prices:
        known = ", ".join(map(repr, prices)) if isinstance(prices, Mapping) else repr(prices)
        raise PlayDefinitionError(
            f"llm_tool {name!r}: prices has no entry for model {model!r} (it has {known}); "
            f"give prices={{{model!r}: (usd_per_1M_input, usd_per_1M_output)}}"
        )
    pair = prices[model]
    ok = isinstance(pair, (tuple, list)) and len(pair) in (2, 3)
    if not ok or any(
        isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < math.inf for p in pair
    ):
        raise PlayDefinitionError(
            f"llm_tool {name!r}: prices[{model!r}] must be (price_per_1M_input_tokens, price_per_1M_output_tokens) "
            f"or (input, output, cached_input), not {pair!r}"
        )
    return float(pair[0]), float(pair[1]), float(pair[2] if len(pair) == 3 else pair[0])


class Pricing:
    """What one LLM tool's calls cost: its ``prices`` when given, else the price table's prices
    for the answering model (then the tool's ``model``) at the dialect's provider, or at the
    provider whose API ``base_url`` is (OpenRouter, Groq, Together... speak OpenAI's dialect)."""

    __slots__ = ("model", "provider", "url", "given")

    def __init__(
        self, name: str, model: str, *, api: str = "openai", base_url: str | None = None, prices: Any = None
    ) -> None:
        self.model = model
        self.provider = PROVIDERS.get(api)
        self.url = base_url
        self.given = checked(name, model, prices)

    def __repr__(self) -> str:
        by = "prices=" if self.given is not None else f"the price table ({self.provider})"
        return f"<Pricing {self.model} by {by}>"

    def cost(self, tokens: Tokens, model: str | None = None, *, batch: bool = False) -> float | None:
        """What these tokens cost, answered by ``model`` (None: the tool's), in a batch job or not."""
        given = self.given
        if given is not None:
            uncached = max(tokens.prompt - tokens.cached, 0)
            money = (uncached * given[0] + tokens.cached * given[2] + tokens.completion * given[1]) / 1e6
            return money / 2 if batch else money
        for name in (model, self.model) if model and model != self.model else (self.model,):
            rates = _rates(name, self.provider, self.url, batch)
            if rates is not None:
                return rates.cost(tokens)
        return None

    def spent(self, answer: Any) -> Spent:
        """What a stored answer cost, from the usage it keeps: the same each time it is replayed
        (while the prices stay).  An answer that says no usage (some local servers) is unpriced."""
        usage = answer.get("usage") if isinstance(answer, dict) else None
        if not isinstance(usage, dict):
            requests = answer.get("requests") if isinstance(answer, dict) else None
            return Spent(None, None, requests if type(requests) is int and requests > 0 else 1)
        model = answer.get("model")
        model = model if isinstance(model, str) else None
        batch = answer.get("batch") is True
        tokens = tokens_of(usage)
        refused = answer.get("refused_usage")
        cost = self.cost(tokens, model, batch=batch)
        lost = self.cost(tokens_of(refused), model, batch=batch) if isinstance(refused, dict) else 0.0
        # A batch job's answer: what it would have cost asked online, beside (the estimate shows both).
        online = self.cost(tokens, model) if batch else None
        # input and output apart: what the provider's token budgets are charged when it is answered
        used = limits.Tokens(tokens.prompt, tokens.completion)
        return Spent(cost, used, int(answer.get("requests") or 1), lost or 0.0, online)


class _Rates(NamedTuple):
    """A model's prices per token at a provider (``tiered``: the table's own reckoning, for
    prices that change with the prompt's length)."""

    input: float
    output: float
    cached: float
    written: float
    share: float  # of the table's price (a batch call where the table has no batch price: half)
    tiered: ModelPrice | None

    def cost(self, tokens: Tokens) -> float:
        if self.tiered is not None:
            from genai_prices import Usage

            price = self.tiered
            usage = Usage(
                input_tokens=tokens.prompt,
                cache_read_tokens=min(tokens.cached, tokens.prompt),
                cache_write_tokens=min(tokens.written, max(tokens.prompt - tokens.cached, 0)),
                output_tokens=tokens.completion,
            )
            return float(price.calc_price(usage)["total_price"]) * self.share
        uncached = max(tokens.prompt - tokens.cached - tokens.written, 0)
        return (
            uncached * self.input
            + tokens.cached * self.cached
            + tokens.written * self.written
            + tokens.completion * self.output
        ) * self.share


_cache: dict[tuple[Any, ...], _Rates | None] = {}
_table: list[Any] = [None]  # the table the cache was made of (genai_prices.UpdatePrices replaces it)


def _rates(model: str, provider: str | None, url: str | None, batch: bool) -> _Rates | None:
    """The table's prices for ``model`` (None: it does not know it), looked up once a day per
    table: a replay of many receipts prices each by arithmetic."""
    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    if snapshot is not _table[0]:
        _cache.clear()
        _table[0] = snapshot
    key = (int(time.time() // 86400), model, provider, url, batch)
    if key not in _cache:
        if len(_cache) > 4096:
            _cache.clear()
        _cache[key] = _looked_up(snapshot, model, provider, url, batch)
    return _cache[key]


def _looked_up(
    snapshot: DataSnapshot, model: str, provider: str | None, url: str | None, batch: bool
) -> _Rates | None:
    import datetime as dt

    found = None
    # The provider whose API the URL is first (a loopback or unknown URL names none), then the dialect's.
    for by_id, by_url in ((None, url), (provider, None)):
        if by_id is None and by_url is None:
            continue
        try:
            found = snapshot.find_provider_model(model, None, by_id, by_url)
            break
        except LookupError:
            continue
    if found is None:
        return None
    where, info = found
    now = dt.datetime.now(dt.UTC)
    price = info.get_prices(now)
    share = 1.0
    if batch:
        own = any(m is info for m in where.models)
        batched = info.get_prices(now, {"processing": "batch"}) if own else price
        price, share = (batched, 1.0) if batched != price else (price, 0.5)
    values = [getattr(price, k) for k in ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok")]
    if any(v is not None and not isinstance(v, Decimal) for v in values):
        return _Rates(0.0, 0.0, 0.0, 0.0, share, price)
    inp, out, cached, written = (float(v) / 1e6 if v is not None else None for v in values)
    if inp is None and out is None:
        return None  # priced by other units (images, seconds): not a token price
    inp, out = inp or 0.0, out or 0.0
    return _Rates(
        inp, out, inp if cached is None else cached, inp if written is None else written, share, None
    )
