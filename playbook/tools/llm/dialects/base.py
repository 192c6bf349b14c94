"""What an LLM tool's engine asks of its dialect (:class:`Dialect`), and the small readings every
dialect shares: a conversation split into its system text and its turns, a turn's text, and
usage given in the provider's own names put in OpenAI's.

The engine keeps a call's conversation in Chat Completions form (``[{"role", "content"}]``, the
system prompt its first message): that is what ``prompt=`` and ``messages=`` bind to, whatever the
dialect.  A dialect makes the request body of it, and reads the answer back into the reply a
receipt keeps (:func:`normalized`), usage in OpenAI's names::

    {"content", "refusal", "finish_reason", "model", "usage", "requests": 1[, "api"]}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import httpx

from playbook.errors import PlaybookError, PlayDefinitionError, ToolError
from playbook.providers.limits import retry_after

if TYPE_CHECKING:
    from playbook.tools.llm.structured import Structured

__all__ = [
    "Common",
    "Dialect",
    "Target",
    "Turns",
    "normalized",
    "shape_error",
    "split",
    "text_of",
    "usage_of",
]


class Target(NamedTuple):
    """Where one tool's calls go: its base URL (no query), model, and the options some dialects
    take (``api_version`` for Azure, ``region`` for Bedrock)."""

    base_url: str
    model: str
    api_version: str | None
    region: str | None


class Dialect(Protocol):
    """One provider's API, as an LLM tool's engine speaks it.  A dialect holds no state of a
    call's: each tool keeps its own :class:`Target`, and a module-level dialect serves them all."""

    @property
    def name(self) -> str:
        """What ``api=`` calls it."""
        ...

    @property
    def secret(self) -> str | None:
        """The environment variable of its default key (None: no key, or signed otherwise)."""
        ...

    @property
    def takes(self) -> frozenset[str]:
        """Which of ``api_version`` and ``region`` it takes."""
        ...

    @property
    def max_tokens(self) -> int | None:
        """Sent when the user gives none (a dialect whose API requires the field)."""
        ...

    @property
    def charges_max_tokens(self) -> Literal["reserved", "counted"] | None:
        """How its provider counts a request's ``max_tokens`` against its token limits: None, by
        what the answer uses; "reserved", held when the request starts, then the answer's real
        count (Anthropic's output budget); "counted", on arrival, whatever the answer uses (Azure)."""
        ...

    @property
    def fields(self) -> frozenset[str]:
        """The documented request fields ``**fields`` may set."""
        ...

    @property
    def reserved(self) -> frozenset[str]:
        """Request fields the tool sets itself."""
        ...

    @property
    def renamed(self) -> Mapping[str, str]:
        """Its own spelling of an llm_tool option -> that option (``maxOutputTokens`` -> ``max_tokens``)."""
        ...

    def target(
        self, tool: str, base_url: str | None, model: str, api_version: str | None, region: str | None
    ) -> Target:
        """The tool's target with this dialect's defaults filled in (a PlayDefinitionError naming
        the option that has no usable value)."""
        ...

    def url(self, target: Target) -> tuple[str, dict[str, str]]:
        """The URL of a call (no query) and its query parameters."""
        ...

    def headers(self, keyed: bool) -> dict[str, str]:
        """The request's headers: where the key goes (as ``{secret}``, when ``keyed``) and any the
        API requires."""
        ...

    def body(
        self,
        tool: str,
        model: str,
        messages: list[dict[str, Any]],
        request: Mapping[str, Any],
        structured: Structured | None,
    ) -> dict[str, Any]:
        """The request body: the conversation, ``request`` (``temperature``, ``max_tokens`` and
        the fields given) in their places, and the output schema in this dialect's form."""
        ...

    def reply(self, tool: str, data: Any, model: str) -> dict[str, Any]:
        """The answer as a receipt keeps it (see the module docstring); a ToolError naming the
        tool when it has not that shape."""
        ...

    def denied(self, status: int, content: bytes) -> bool:
        """Whether an answer that is not a 401 or 403 says the key was refused all the same
        (Gemini's 400 ``API_KEY_INVALID``): then it is a refused key everywhere, as a 401 is."""
        ...

    def refused(self, error: ToolError, content: bytes, headers: httpx.Headers, now: float) -> PlaybookError:
        """The error a refusal (HTTP 4xx/5xx, not 401-403) raises, read further from its body as
        this dialect defines it (``now``: the wall clock, epoch seconds)."""
        ...

    def signer(self, target: Target) -> httpx.Auth | None:
        """What signs each request (None: the key in its header is enough)."""
        ...


class Turns(NamedTuple):
    """A conversation as dialects without a system role take it: the system text apart."""

    system: str | None
    turns: list[dict[str, Any]]


def split(tool: str, messages: list[dict[str, Any]], *, api: str, user: bool = True) -> Turns:
    """The leading system (or developer) messages joined as the system text, and the user and
    assistant turns after them, each turn's content its text.  A system message later in the
    conversation, a tool message, no turn at all, or (``user``: an API that answers only a user
    turn, as Anthropic's, Gemini's and Bedrock's) no user turn has no place in these APIs: the
    row's error, before anything is sent."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role in ("system", "developer") and not turns:
            system.append(text_of(tool, m.get("content"), i))
        elif role in ("user", "assistant"):
            turns.append({"role": role, "content": text_of(tool, m.get("content"), i)})
        else:
            where = "after the first turn " if role in ("system", "developer") else ""
            raise ToolError(
                f"llm tool {tool!r}: messages[{i}] has role {role!r} {where}which api={api!r} does not take "
                "(system messages come first; then user and assistant turns)",
                tool=tool,
            )
    if not turns:
        raise ToolError(f"llm tool {tool!r}: messages hold no turn to answer (api={api!r})", tool=tool)
    if user and not any(t["role"] == "user" for t in turns):  # the API would refuse it with a 400
        raise ToolError(
            f"llm tool {tool!r}: messages hold no user turn to answer, which api={api!r} needs "
            "(add a {'role': 'user', 'content': ...} message)",
            tool=tool,
        )
    return Turns("\n\n".join(system) if system else None, turns)


def text_of(tool: str, content: Any, index: int) -> str:
    """A message's content as text: a string, or Chat Completions' text parts joined."""
    if isinstance(content, str):
        return content
    parts = []
    for part in content if isinstance(content, list) else [content]:
        if (
            not isinstance(part, Mapping)
            or part.get("type") != "text"
            or not isinstance(part.get("text"), str)
        ):
            raise ToolError(
                f"llm tool {tool!r}: messages[{index}] holds a part this dialect is not sent ({str(part)[:60]!r}): "
                "only text parts ({'type': 'text', 'text': ...})",
                tool=tool,
            )
        parts.append(part["text"])
    return "".join(parts)


def usage_of(prompt: Any, completion: Any, cached: Any = None, **details: Any) -> dict[str, Any] | None:
    """Usage in OpenAI's names (``prompt_tokens``, ``completion_tokens``, ``total_tokens``, and
    ``prompt_tokens_details`` when the provider said what was cached); None when it said nothing."""
    if not isinstance(prompt, int) and not isinstance(completion, int):
        return None
    p, c = int(prompt or 0), int(completion or 0)
    usage: dict[str, Any] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    said = {k: int(v) for k, v in {"cached_tokens": cached, **details}.items() if isinstance(v, int)}
    if said:
        usage["prompt_tokens_details"] = said
    return usage


def part(data: Any, key: str) -> Mapping[str, Any]:
    """``data[key]`` when both are JSON objects, else an empty one: answers are read leniently."""
    found = data.get(key) if isinstance(data, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def normalized(
    api: str,
    *,
    content: str | None,
    refusal: str | None,
    finish_reason: str | None,
    model: Any,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """The reply a receipt keeps, from any dialect (see the module docstring)."""
    return {
        "content": content,
        "refusal": refusal,
        "finish_reason": finish_reason,
        "model": model if isinstance(model, str) else None,
        "usage": usage,
        "requests": 1,
        "api": api,
    }


def shape_error(tool: str, api: str, what: str, data: Any) -> ToolError:
    """An answer that has not the shape ``api`` defines."""
    return ToolError(f"llm tool {tool!r}: the {api} answer has no {what}: {str(data)[:120]!r}", tool=tool)


class Common:
    """What most dialects do alike, for a dialect class to inherit: a default base URL, the key in
    one header, no options of Azure's or Bedrock's, nothing more read from a refusal's body than
    HTTP says (an overload's 529 retried), no signing."""

    name = ""
    secret: str | None = None
    takes: frozenset[str] = frozenset()
    max_tokens: int | None = None
    charges_max_tokens: Literal["reserved", "counted"] | None = None
    fields: frozenset[str] = frozenset()
    reserved: frozenset[str] = frozenset()
    renamed: Mapping[str, str] = {}
    base_url: str | None = None  # the default
    key_header = ("Authorization", "Bearer {secret}")

    def __repr__(self) -> str:
        return f"<dialect {self.name}>"

    def target(
        self, tool: str, base_url: str | None, model: str, api_version: str | None, region: str | None
    ) -> Target:
        url = base_url if base_url is not None else self.base_url
        if url is None:
            raise PlayDefinitionError(
                f"llm_tool {tool!r}: api={self.name!r} needs base_url= (it has no default)"
            )
        return Target(url, model, api_version, region)

    def headers(self, keyed: bool) -> dict[str, str]:
        return {self.key_header[0]: self.key_header[1]} if keyed else {}

    def denied(self, status: int, content: bytes) -> bool:
        return False

    def refused(self, error: ToolError, content: bytes, headers: httpx.Headers, now: float) -> PlaybookError:
        if error.status == 529 and not error.retryable:  # "overloaded" (Anthropic's): the provider's, retried
            error.retryable = True
            error.retry_after = retry_after(headers, now=now)  # none is given today: any is honoured
        return error

    def signer(self, target: Target) -> httpx.Auth | None:
        return None
