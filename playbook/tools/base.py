"""Tools: the paid or slow things a play calls, and what makes two of them the same tool.

A tool's *input* is a mapping of its parameter names to values.  Its *identity* is part of every
receipt key: the ``version=`` the user pinned, or else a fingerprint of the function's code, so
an edited tool is a new tool (as with joblib.Memory) and never answers from the old one's
receipts.  Its *fingerprint* covers everything that shapes what a play gets back (for an HTTP
tool, also ``pick``): a row memo made with another fingerprint of a tool is not reused.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar, overload

from playbook.addresses import code_fingerprint, digest, key_text, receipt_address
from playbook.errors import PlaybookError, PlayDefinitionError, ToolError
from playbook.plays.play import Play, defined
from playbook.providers.provider import Provider
from playbook.tagged import encode
from playbook.tools.failures import translate

if TYPE_CHECKING:
    import httpx

__all__ = ["NO_INPUT", "CallEnv", "Spent", "Tool", "is_local", "tool"]


_NAME = re.compile(r"^[A-Za-z_][\w.\-]*$")
NO_INPUT: Any = object()  # "no positional input": None is a valid input

R = TypeVar("R", covariant=True)  # what a call of the tool gives a play
T = TypeVar("T")


class Tool(Generic[R]):
    """A named, cached callable.  Create with :func:`tool`, :func:`http_tool` or :func:`llm_tool`.

    ``Tool[R]``: a call answers an ``R`` (a ``@pb.tool`` function's return type, awaited when it
    is async), so ``await ctx.tool(t, ...)`` is an ``R`` to a type checker, and a forgotten
    ``await`` is an error it shows."""

    remote = False  # does a call leave the process (and so count as paid, with or without a cost)?

    __slots__ = (
        "name",
        "version",
        "identity",
        "fingerprint",
        "provider",
        "cost",
        "batch_size",
        "retry_on",
        "params",
        "fn",
        "_is_async",
        "_param_set",
        "_spent",
        "defaults",
    )

    def __init__(
        self,
        name: str,
        *,
        params: Sequence[str],
        fn: Callable[..., Any] | None = None,
        version: str | None = None,
        provider: Provider | None = None,
        cost: float = 0.0,
        batch_size: int | None = None,
        retry_on: type[Exception] | tuple[type[Exception], ...] = (),
        identity: str | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise PlayDefinitionError(
                f"tool name {name!r} must start with a letter and use letters, digits, '.', '-' or '_'"
            )
        if (
            isinstance(cost, bool)
            or not isinstance(cost, (int, float))
            or not cost >= 0
            or cost == float("inf")
        ):
            raise PlayDefinitionError(f"tool {name!r}: cost must be a finite number >= 0, not {cost!r}")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise PlayDefinitionError(
                f"tool {name!r}: batch_size must be a whole number >= 1, not {batch_size!r}"
            )
        if provider is not None and not isinstance(provider, Provider):
            raise PlayDefinitionError(
                f"tool {name!r}: provider must be a pb.Provider, not {type(provider).__name__}"
            )
        if fn is not None and provider is not None and provider.keys is not None:
            raise PlayDefinitionError(
                f"tool {name!r}: provider {provider.name!r} pools keys (keys=), which only pb.http_tool and pb.llm_tool send (as "
                "their {secret} or bearer token); a Python tool cannot be told which key a call goes under: give it a provider "
                "without keys=, or make it a pb.http_tool"
            )
        if version is not None and (
            not isinstance(version, (str, int)) or isinstance(version, bool) or str(version) == ""
        ):
            raise PlayDefinitionError(
                f"tool {name!r}: version must be a non-empty string (or int), not {version!r}"
            )
        self.name = name
        self.version = None if version is None else str(version)
        self.provider = provider
        self.cost = float(cost)
        self._spent = Spent(self.cost, None, 1)  # every answer of a plain tool costs the same
        self.batch_size = batch_size
        # Part of the definition, not of the identity: how often a call is tried changes no answer.
        self.retry_on = _retry_types(name, retry_on)
        self.params = tuple(params)
        self._param_set = frozenset(self.params)
        # A parameter's default, for a call that does not pass it: part of the call's input
        # (its receipt key), as if passed, so passing it or not is the same call.
        self.defaults = dict(defaults or {})
        self.fn = fn
        self._is_async = fn is not None and inspect.iscoroutinefunction(fn)
        if identity is None:
            identity = self.version if self.version is not None else "src:" + code_fingerprint(fn)[:16]
        self.identity = identity
        self.fingerprint = self._definition()
        defined(name, self.fingerprint)

    def _definition(self) -> str:
        """The fingerprint row memos check (see the module docstring): 16 hex digits."""
        return digest(self.identity)[:16]

    @property
    def account(self) -> str:
        """The provider account this tool's receipts belong to."""
        return self.provider.account if self.provider is not None else "default"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the tool's own function, as a test of it would: no receipt, no provider, no run (an
        ``async`` tool gives a coroutine to await).  An HTTP or LLM tool has no function of its
        own to run: calling it says how to try it."""
        if self.fn is None:
            example = ", ".join(f"{p}=..." for p in self.params)
            row = ", ".join(f"{p!r}: ..." for p in self.params)
            raise TypeError(
                f"{type(self).__name__} {self.name!r} calls a provider, so calling it directly would pay with no receipt: "
                f"call it in a play (await ctx.tool(tool, {example})), or try it on one row: "
                f"pd.DataFrame([{{{row}}}]).play.map(tool), which keeps its receipt"
            )
        return self.fn(*args, **kwargs)

    def __play__(self) -> Play:
        """The tool as a play of its own (``map(tool)``): its inputs bound from the row's columns
        of their names, its answer in a column named after it."""
        tool, params, column = self, self.params, self.name

        async def tool_play(row: Any, ctx: Any) -> dict[str, Any]:
            # A parameter with a default and no column of its name takes its default.
            return {column: await ctx.tool(tool, {p: row[p] for p in params if p in row})}

        return Play(tool_play, name=self.name, source=f"tool:{self.name}:{self.fingerprint}")

    def __repr__(self) -> str:
        via = f", provider={self.provider.name!r}" if self.provider is not None else ""
        version = f" v{self.version}" if self.version is not None else f" {self.identity}"
        return f"<Tool {self.name!r}{version}({', '.join(self.params)}){via}>"

    def bind(self, input: Any, kwargs: Mapping[str, Any]) -> Any:
        """The call's input as ``{param: value}``, from a positional input and/or keywords.

        A batch tool's input is one item of its list: the positional input, or the keywords.
        """
        if self.batch_size is not None:
            if input is NO_INPUT:
                return dict(kwargs)
            if kwargs:
                raise ToolError(
                    f"batch tool {self.name!r}: pass one input, or keywords, not both", tool=self.name
                )
            return input
        if input is NO_INPUT and kwargs.keys() == self._param_set:
            return dict(kwargs)  # the common case, checked in one comparison
        one = self.params[0] if len(self.params) == 1 else None
        if input is NO_INPUT:
            values = dict(kwargs)
        elif one is not None and not kwargs and not (isinstance(input, Mapping) and set(input) == {one}):
            values = {one: input}
        elif isinstance(input, Mapping):
            values = {**input, **kwargs}
        else:
            raise ToolError(
                f"tool {self.name!r} takes ({', '.join(self.params)}): pass them by keyword or as one mapping",
                tool=self.name,
            )
        if self.defaults and len(values) < len(self.params):
            values = {**values, **{p: v for p, v in self.defaults.items() if p not in values}}
        unknown = [k for k in values if k not in self.params]
        missing = [p for p in self.params if p not in values]
        if unknown or missing:
            parts = []
            if missing:
                parts.append("missing " + ", ".join(missing))
            if unknown:
                parts.append("unexpected " + ", ".join(unknown))
            near = [
                (k, close[0])
                for k in unknown
                if (close := difflib.get_close_matches(k, missing or self.params, n=1))
            ]
            hint = "".join(f"; did you mean {right!r} for {wrong!r}?" for wrong, right in near)
            raise ToolError(
                f"tool {self.name!r} takes ({', '.join(self.params)}): {'; '.join(parts)}{hint}",
                tool=self.name,
            )
        return values

    def key(self, values: Any) -> str:
        """The receipt key of a call with these input values (``Unencodable`` if one has no JSON form)."""
        return receipt_address(self.name, self.identity, key_text(values), self.account)

    def stored_input(self, values: Any) -> Any:
        """The input as its receipt keeps it."""
        return encode(values)

    def read(self, answer: Any, miss: bool) -> tuple[Any, bool]:
        """What a play gets from a stored answer: the answer itself (an HTTP tool picks from it)."""
        return answer, miss

    def submits(self) -> bool:
        """Are this tool's calls submitted as batch jobs (answered later) rather than sent?"""
        return False

    def weigh(self, values: Any) -> float | None:
        """The tokens a call with these inputs is expected to use (``None``: not weighed by tokens)."""
        return None

    def price(self, values: Any) -> float:
        """The cost reserved against ``max_cost`` before a call with these inputs is sent."""
        return self.cost

    def spent(self, answer: Any) -> Spent:
        """What an answer cost, as stored in its receipt: the same when it is replayed."""
        return self._spent

    async def invoke(self, inputs: Any, call: CallEnv) -> tuple[Any, bool]:
        """Run the tool once; returns ``(answer, miss)``.  Python tools: ``None`` is a miss."""
        fn = self.fn
        assert fn is not None
        if self._is_async:
            out = await fn(**inputs)
        else:
            # Sync tools run in a worker thread so a slow one never blocks the loop.
            out = await asyncio.to_thread(functools.partial(fn, **inputs))
        return out, out is None

    async def invoke_batch(self, items: list[Any]) -> list[Any]:
        """Run a batch tool on a list of inputs; returns one answer (or exception) per input."""
        fn = self.fn
        assert fn is not None
        try:
            outs = await fn(items) if self._is_async else await asyncio.to_thread(fn, items)
        except PlaybookError:
            raise
        except Exception as exc:
            # The batch's own failure goes to the governor, which understands ToolErrors.
            error = translate(
                exc,
                tool=self.name,
                provider=self.provider.name if self.provider else None,
                retry_on=self.retry_on,
            )
            if error is None:
                raise
            raise error from exc
        if not isinstance(outs, (list, tuple)) or len(outs) != len(items):
            got = f"{len(outs)} outputs" if isinstance(outs, (list, tuple)) else f"a {type(outs).__name__}"
            raise ToolError(
                f"batch tool {self.name!r} returned {got} for {len(items)} inputs; it must return a list, one output per input",
                tool=self.name,
            )
        return list(outs)


class Spent(NamedTuple):
    """What one paid answer cost: money (in the tool's own unit), tokens (``None``: not counted),
    requests (an answer that needed a re-ask took two), and the part of the money that bought an
    answer validation refused (the first of a re-asked pair)."""

    cost: float
    tokens: float | None
    requests: int
    refused: float = 0.0


def is_local(tool: Tool[Any], cost: float) -> bool:
    """A call that costs nothing and goes nowhere (a plain Python tool): counted apart from paid ones."""
    return tool.provider is None and not cost and not tool.remote


class CallEnv:
    """What a tool needs from the run to make one call, and what it tells back: the limits its
    provider announced in the answer (``announced``: requests and tokens per minute)."""

    __slots__ = ("client", "idempotency_key", "announced", "partial")

    def __init__(self, client: Callable[[], httpx.AsyncClient], idempotency_key: str) -> None:
        self.client = client
        self.idempotency_key = idempotency_key
        self.announced: tuple[float | None, float | None] | None = None
        # What a try got before it failed, kept for the next try of the same call (an LLM
        # answer whose re-ask failed is not asked for again).
        self.partial: Any = None


class _ToolDecorator(Protocol):
    @overload
    def __call__(self, fn: Callable[..., Awaitable[T]], /) -> Tool[T]: ...
    @overload
    def __call__(self, fn: Callable[..., T], /) -> Tool[T]: ...


@overload
def tool(  # an async function's tool answers what its coroutine gives
    fn: Callable[..., Awaitable[T]],
    *,
    name: str | None = None,
    version: str | None = None,
    provider: Provider | None = None,
    cost: float = 0.0,
    batch_size: int | None = None,
    retry_on: type[Exception] | tuple[type[Exception], ...] = (),
) -> Tool[T]: ...
@overload
def tool(
    fn: Callable[..., T],
    *,
    name: str | None = None,
    version: str | None = None,
    provider: Provider | None = None,
    cost: float = 0.0,
    batch_size: int | None = None,
    retry_on: type[Exception] | tuple[type[Exception], ...] = (),
) -> Tool[T]: ...
@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    version: str | None = None,
    provider: Provider | None = None,
    cost: float = 0.0,
    batch_size: int | None = None,
    retry_on: type[Exception] | tuple[type[Exception], ...] = (),
) -> _ToolDecorator: ...
def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    version: str | None = None,
    provider: Provider | None = None,
    cost: float = 0.0,
    batch_size: int | None = None,
    retry_on: type[Exception] | tuple[type[Exception], ...] = (),
) -> Tool[Any] | _ToolDecorator:
    """Make a cached tool of a sync or async function; usable bare or with options.

    Without ``version`` the tool is identified by its code: edit it and its next calls are paid
    for again (the old receipts stay, answering only the old code).  With ``version="2"`` you
    decide: edits keep the receipts until you change the version.

    An SDK's errors are classified like HTTP answers (``openai.RateLimitError`` holds the
    provider for its ``Retry-After``, a 5xx or a dropped connection is retried, a 401 stops the
    run); ``retry_on=(SomeError, ...)`` has the provider retry these exception types too.
    """

    def wrap(f: Callable[..., Any]) -> Tool[Any]:
        if not callable(f):
            raise PlayDefinitionError(f"@tool needs a function, not {type(f).__name__}")
        label = name or getattr(f, "__name__", None) or type(f).__name__
        sig = inspect.signature(f)
        if batch_size is not None:
            if len(sig.parameters) != 1:
                raise PlayDefinitionError(f"batch tool {label!r} must take one parameter: the list of inputs")
            return Tool(
                label,
                params=(),
                fn=f,
                version=version,
                provider=provider,
                cost=cost,
                batch_size=batch_size,
                retry_on=retry_on,
            )
        params, defaults = [], {}
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
                raise PlayDefinitionError(
                    f"tool {label!r}: parameter {p.name!r} must be a plain named parameter (no *args, **kwargs or /)"
                )
            params.append(p.name)
            if p.default is not p.empty:
                defaults[p.name] = p.default
        return Tool(
            label,
            params=params,
            fn=f,
            version=version,
            provider=provider,
            cost=cost,
            batch_size=batch_size,
            retry_on=retry_on,
            defaults=defaults,
        )

    return wrap if fn is None else wrap(fn)


def _retry_types(name: str, retry_on: Any) -> tuple[type[Exception], ...]:
    """``retry_on`` as a tuple of exception classes, or a PlayDefinitionError naming the tool."""
    types = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    for kind in types:
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise PlayDefinitionError(
                f"tool {name!r}: retry_on must be an exception class or a tuple of them, e.g. retry_on=(TimeoutError,), not {retry_on!r}"
            )
        if issubclass(kind, PlaybookError):
            raise PlayDefinitionError(
                f"tool {name!r}: retry_on={kind.__name__} has no effect: playbook's own errors say themselves whether to retry"
            )
    return types
