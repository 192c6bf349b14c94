"""A deterministic stand-in for an OpenAI-compatible chat completions endpoint.

No model is involved: the answer is derived from the last user message, so the same
messages always get the same reply. Two behaviours make it useful in a demo:

- a prompt containing "classify" gets an industry label, taken from a sample company named
  in the prompt (or a quoted name, or the text after the last colon); when the prompt lists
  industry labels, the answer is one of them;
- any other prompt gets a one-line summary built from the prompt's own words.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from functools import cache
from typing import Any

from playbook.demo.fakedata import INDUSTRIES, digest, industry_for, known_companies

__all__ = ["ChatRequestError", "complete"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_QUOTED = re.compile(r"[\"“]([^\"“”\n]{2,80})[\"”]")
_WORD = re.compile(r"[^\W_][\w'’-]*")
_STOPWORDS = frozenset(
    "about above after again against also among been before being below between both could does doing "  # noqa: SIM905 - a word list reads better as text
    "during each from further have having here into itself just more most other over please same should "
    "some such than that their them then there these they this those through under until very what when "
    "where which while with would your yours summarise summarize summary sentence following text page".split()
)
_SUMMARY_WORDS = 14


class ChatRequestError(ValueError):
    """A bad chat request; `param` names the offending field, OpenAI style."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": "invalid_request_error", "param": self.param, "code": None}}


def complete(body: Any) -> dict[str, Any]:
    """Answer a chat completions request body (already parsed from JSON)."""
    model, messages = _validate(body)
    prompt = _text(messages[-1]["content"]) if messages[-1]["role"] == "user" else ""
    if not prompt:
        prompt = next(_text(m["content"]) for m in reversed(messages) if m["role"] == "user")
    content = _classify(prompt) if "classify" in prompt.lower() else _summarise(prompt)
    canonical = json.dumps([model, [[m["role"], _text(m["content"])] for m in messages]], ensure_ascii=False)
    prompt_tokens = sum(_tokens(_text(m["content"])) + 4 for m in messages)
    completion_tokens = _tokens(content)
    return {
        "id": f"chatcmpl-{digest('chat', canonical):016x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "playbook-demo",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _validate(body: Any) -> tuple[str, list[dict[str, Any]]]:
    if not isinstance(body, dict):
        raise ChatRequestError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ChatRequestError("'model' is required and must be a non-empty string", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("'messages' must be a non-empty array of messages", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ChatRequestError(f"messages[{i}].role must be one of {', '.join(sorted(_ROLES))}", f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ChatRequestError(f"messages[{i}].content must be a string or an array", f"messages[{i}].content")
    if not any(m["role"] == "user" and _text(m.get("content")) for m in messages):
        raise ChatRequestError("'messages' must contain a user message with text", "messages")
    if body.get("stream"):
        raise ChatRequestError("stream=true is not supported by the demo provider", "stream")
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2
    ):
        raise ChatRequestError("'temperature' must be a number between 0 and 2", "temperature")
    if body.get("n", 1) != 1:
        raise ChatRequestError("the demo provider only returns n=1 choice", "n")
    return model, messages


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)  # the usual ~4 characters per token


@cache
def _company_names() -> tuple[str, ...]:
    # Longest first, so "Acme Robotics Europe" would win over "Acme Robotics".
    names = {name for name, _ in known_companies().values()}
    return tuple(sorted(names, key=lambda n: (-len(n), n)))


def _classify(prompt: str) -> str:
    lowered = prompt.lower()
    subject = next((n for n in _company_names() if n.lower() in lowered), None)
    if subject is None:
        quoted = _QUOTED.search(prompt)
        subject = quoted.group(1) if quoted else prompt.rsplit(":", 1)[-1] if ":" in prompt else None
    # Labels offered by the instruction, not ones that merely occur in the company's name.
    rest = lowered.replace(subject.lower(), " ") if subject else lowered
    offered = [label for label in INDUSTRIES if label.lower() in rest]
    label = industry_for(subject) if subject else None
    if label is None:
        # Look at the whole prompt, minus the offered labels themselves.
        stripped = rest
        for name in offered:
            stripped = stripped.replace(name.lower(), " ")
        label = industry_for(stripped)
    if label is None or (offered and label not in offered):
        pool = offered or INDUSTRIES
        label = pool[digest("classify", subject or prompt) % len(pool)]
    return label


def _summarise(prompt: str) -> str:
    # An instruction like "Summarise this page: <text>" is about the text after the colon.
    head, _, tail = prompt.rpartition(":")
    body = tail if head and len(tail.split()) >= 3 else prompt
    words = _WORD.findall(body)
    if not words:
        return "Summary: nothing to summarise."
    sentence = " ".join(words[:_SUMMARY_WORDS])
    summary = f"Summary: {sentence[:1].upper()}{sentence[1:]}" + ("…" if len(words) > _SUMMARY_WORDS else ".")
    if len(words) <= _SUMMARY_WORDS // 2:
        return summary
    counts = Counter(w.lower() for w in words if len(w) >= 5 and w.lower() not in _STOPWORDS)
    topics = [w for w, _ in counts.most_common(3)]
    return summary + (f" Key topics: {', '.join(topics)}." if topics else "")
