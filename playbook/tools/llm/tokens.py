"""Token estimates for an LLM call, made before it is sent (a provider paced by ``tpm`` weighs
each call by them): a prompt's characters over the characters per token this endpoint's answers
showed, four tokens a message more, and the completion its answers usually take."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Usage", "chars"]


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

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> float:
        """The prompt's tokens, estimated: its characters over those a token took lately, 4 a message more."""
        return chars(messages) / self.chars_per_token() + 4 * len(messages)

    def add(self, chars: int, usage: Mapping[str, Any]) -> None:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int) and prompt > 0:
            self.chars += chars
            self.prompt += prompt
            self.completions += completion
            self.answers += 1


def chars(messages: list[dict[str, Any]]) -> int:
    """The characters of the messages' text."""
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return total
