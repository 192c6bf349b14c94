"""What an LLM call costs: the user's ``prices`` table checked when the tool is defined, and an
answer's usage priced by it (a re-asked answer's refused first half counted apart, for
``run.stats.cost_failed``).  Without a table a call costs 0 and its tokens are still counted."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from playbook.errors import PlayDefinitionError
from playbook.providers.limits import Tokens
from playbook.tools.protocol import Spent

__all__ = ["Prices", "checked", "cost", "spent"]

Prices = tuple[float, float]  # per 1M prompt tokens, per 1M completion tokens


def checked(name: str, model: str, prices: Mapping[str, Any] | None) -> Prices | None:
    """``prices[model]`` as ``(input, output)`` per million tokens, or a PlayDefinitionError naming
    the tool."""
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


def cost(prices: Prices | None, prompt: float, completion: float) -> float:
    """What these tokens cost (0 with no price table)."""
    return (prompt * prices[0] + completion * prices[1]) / 1e6 if prices is not None else 0.0


def spent(prices: Prices | None, answer: Any) -> Spent:
    """What a stored answer cost, from the usage it keeps: the same each time it is replayed."""
    usage = answer.get("usage") if isinstance(answer, Mapping) else None
    if not isinstance(usage, Mapping):
        return Spent(0.0, None, 1)
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    refused = answer.get("refused_usage")
    return Spent(
        cost(prices, prompt, completion),
        Tokens(prompt, completion),
        int(answer.get("requests") or 1),
        cost(prices, int(refused.get("prompt_tokens") or 0), int(refused.get("completion_tokens") or 0))
        if isinstance(refused, Mapping)
        else 0.0,
    )
