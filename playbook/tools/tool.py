"""The tool a user holds: :class:`Tool` (``@pb.tool``; ``pb.http_tool`` and ``pb.llm_tool``
make its subclasses), and :func:`engine_of`, the one way to what the pipeline needs of it.

A tool shows its name, version, inputs, provider, cost and fingerprint, how to call it, and a
repr (``tool.params``, the old spelling of ``tool.inputs``, still answers with a warning).  What
the pipeline asks of it (binding inputs, receipt addresses, prices, tokens, sending) is its
engine's (:mod:`.protocol`), reached through :func:`engine_of`, as httpx's ``Client`` keeps its
transport out of the user's way.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from playbook._internal.renamed import asked_by_user, deprecated, renamed
from playbook.errors import PlayDefinitionError
from playbook.plays.play import Play
from playbook.providers.provider import Provider
from playbook.tools.engine import Engine
from playbook.tools.protocol import ToolEngine

__all__ = ["Tool", "engine_of", "tool"]

R = TypeVar("R", covariant=True)  # what a call of the tool gives a play
T = TypeVar("T")


class Tool(Generic[R]):
    """A named, cached callable.  Create with :func:`tool`, :func:`~.http.http_tool` or
    :func:`~.llm.llm_tool`.

    ``Tool[R]``: a call answers an ``R`` (a ``@pb.tool`` function's return type, awaited when it
    is async), so ``await ctx.tool(t, ...)`` is an ``R`` to a type checker, and a forgotten
    ``await`` is an error it shows."""

    __slots__ = ("_engine",)

    def __init__(self, engine: Engine) -> None:
        """A tool over ``engine``: what :func:`tool`, ``http_tool`` and ``llm_tool`` make, and how a
        new kind of tool (an engine of its own, see :mod:`.protocol`) is held."""
        if not isinstance(engine, Engine):
            raise PlayDefinitionError(
                f"pb.Tool wraps a tool's engine, not {type(engine).__name__} {engine!r}: make a tool with "
                "@pb.tool (a Python function), pb.http_tool or pb.llm_tool"
            )
        self._engine = engine

    @property
    def name(self) -> str:
        return self._engine.name

    @property
    def version(self) -> str | None:
        """The version the user pinned (None: the tool is identified by its code)."""
        return self._engine.version

    @property
    def inputs(self) -> tuple[str, ...]:
        """The names of its inputs: keywords of ``ctx.tool(t, ...)``, columns of ``map(t)``."""
        return self._engine.inputs

    @property
    def provider(self) -> Provider | None:
        return self._engine.provider

    @property
    def cost(self) -> float:
        """What a call costs when it is paid for (an LLM tool's comes from each answer's usage)."""
        return self._engine.cost

    @property
    def fingerprint(self) -> str:
        """Its definition, as row memos check it: 16 hex digits that change when it does."""
        return self._engine.fingerprint

    if not TYPE_CHECKING:  # a type checker sees no fallback: a misspelt name stays an error there

        def __getattr__(self, name: str) -> Any:
            shown = getattr(type(self), name, None)
            if isinstance(shown, property):  # it raised AttributeError itself: say its own error
                return shown.__get__(self)
            if name.startswith("_") or not asked_by_user():
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            new, engine = _RENAMED.get(name), self._engine
            if new is not None:
                renamed(f"tool.{name}", new)
                return self.inputs if name == "params" else engine.address
            if hasattr(engine, name):  # what a tool showed before its engine was its own
                deprecated(
                    f"tool.{name} is no longer part of what a tool shows and goes in the next release "
                    f"(a tool shows {', '.join(_SHOWN)})"
                )
                return getattr(engine, name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the tool's own function, as a test of it would: no receipt, no provider, no run (an
        ``async`` tool gives a coroutine to await).  An HTTP or LLM tool has no function of its
        own to run: calling it says how to try it."""
        fn = self._engine.fn
        if fn is None:
            example = ", ".join(f"{p}=..." for p in self.inputs)
            row = ", ".join(f"{p!r}: ..." for p in self.inputs)
            raise TypeError(
                f"{type(self).__name__} {self.name!r} calls a provider, so calling it directly would pay with no receipt: "
                f"call it in a play (await ctx.tool(tool, {example})), or try it on one row: "
                f"pd.DataFrame([{{{row}}}]).play.map(tool), which keeps its receipt"
            )
        return fn(*args, **kwargs)

    def __play__(self) -> Play:
        """The tool as a play of its own (``map(tool)``): its inputs bound from the row's columns
        of their names, its answer in a column named after it."""
        tool, inputs, column = self, self.inputs, self.name

        async def tool_play(row: Any, ctx: Any) -> dict[str, Any]:
            # An input with a default and no column of its name takes its default.
            return {column: await ctx.tool(tool, {p: row[p] for p in inputs if p in row})}

        return Play(tool_play, name=self.name, source=f"tool:{self.name}:{self.fingerprint}")

    def __repr__(self) -> str:
        engine = self._engine
        via = f", provider={engine.provider.name!r}" if engine.provider is not None else ""
        version = f" v{engine.version}" if engine.version is not None else f" {engine.identity}"
        return f"<Tool {engine.name!r}{version}({', '.join(engine.inputs)}){via}>"


_RENAMED = {"params": "tool.inputs", "key": "its receipt address (no longer a tool's to show)"}
_SHOWN = ("name", "version", "inputs", "provider", "cost", "fingerprint", "calling it")


def engine_of(tool: Tool[Any]) -> ToolEngine:
    """What the pipeline works with: the engine behind a tool a user holds (see :mod:`.protocol`)."""
    return tool._engine


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
                Engine(
                    label,
                    inputs=(),
                    fn=f,
                    version=version,
                    provider=provider,
                    cost=cost,
                    batch_size=batch_size,
                    retry_on=retry_on,
                )
            )
        inputs, defaults = [], {}
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
                raise PlayDefinitionError(
                    f"tool {label!r}: parameter {p.name!r} must be a plain named parameter (no *args, **kwargs or /)"
                )
            inputs.append(p.name)
            if p.default is not p.empty:
                defaults[p.name] = p.default
        return Tool(
            Engine(
                label,
                inputs=inputs,
                fn=f,
                version=version,
                provider=provider,
                cost=cost,
                batch_size=batch_size,
                retry_on=retry_on,
                defaults=defaults,
            )
        )

    return wrap if fn is None else wrap(fn)
