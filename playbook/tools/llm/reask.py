"""Asking again: an answer that is not valid JSON for the tool's output model is asked for once
more, in the same call, with the first answer and what was wrong with it.  Both requests are
paid and counted; the first one's usage is kept apart, as money spent on a refused answer."""

from __future__ import annotations

from typing import Any

__all__ = ["REASK", "again", "combined"]

REASK = "Your answer could not be used: {why}. Answer again with only a JSON object that matches the schema, and nothing else."


def again(messages: list[dict[str, Any]], reply: dict[str, Any], why: str) -> list[dict[str, Any]]:
    """The conversation asked again: the first answer, then what was wrong with it."""
    return [
        *messages,
        {"role": "assistant", "content": reply.get("content") or ""},
        {"role": "user", "content": REASK.format(why=why)},
    ]


def combined(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The re-asked answer, carrying the usage of both requests (both were paid for), and that of
    the first apart: it bought an answer validation refused (``run.stats.cost_failed``)."""
    usage: dict[str, Any] = {}
    for reply in (first, second):
        _add(usage, reply.get("usage") or {})
    return {**second, "usage": usage, "requests": 2, "refused_usage": first.get("usage")}


def _add(total: dict[str, Any], usage: Any) -> None:
    """Token counts summed, nested ones too (``prompt_tokens_details.cached_tokens``)."""
    if not isinstance(usage, dict):
        return
    for k, v in usage.items():
        if isinstance(v, int) and not isinstance(v, bool):
            total[k] = total.get(k, 0) + v
        elif isinstance(v, dict):
            _add(total.setdefault(k, {}), v)
