"""Plays: ``async def play(row, ctx)`` functions, and the fingerprint that decides reuse.

The fingerprint covers the play's name, version and code (as a tool's identity does: comments and
layout do not count), so editing the play makes every row run again, while its tool calls still
hit their receipts: only changed calls cost.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, overload

from .errors import PlayDefinitionError
from .keys import code_fingerprint, digest

__all__ = ["Play", "as_play", "play"]

PlayFn = Callable[[Any, Any], Awaitable[Any]]


class Play:
    """A named, versioned async row function with a fingerprint."""

    __slots__ = ("fn", "name", "version", "fingerprint", "__wrapped__")

    fn: PlayFn
    name: str
    version: str | None
    fingerprint: str
    __wrapped__: PlayFn

    def __init__(self, fn: PlayFn, *, name: str | None = None, version: str | None = None, source: str | None = None) -> None:
        if isinstance(fn, Play):
            fn = fn.fn
        if not callable(fn):
            raise PlayDefinitionError(f"a play must be an async function (row, ctx), not {type(fn).__name__}")
        label = name or _name(fn)
        if inspect.isasyncgenfunction(fn):
            raise PlayDefinitionError(f"play {label!r} yields: a play returns the row's output once (use return, not yield)")
        if not inspect.iscoroutinefunction(fn):
            raise PlayDefinitionError(f"play {label!r} must be defined with 'async def {label}(row, ctx)': playbook awaits it for each row")
        try:
            inspect.signature(fn).bind(None, None)
        except TypeError:
            raise PlayDefinitionError(f"play {label!r} must take exactly two arguments: (row, ctx)") from None
        self.fn = fn
        self.name = label
        self.version = None if version is None else str(version)
        self.fingerprint = digest("\x1f".join([label, self.version or "", source or code_fingerprint(fn)]))
        self.__wrapped__ = fn

    def __call__(self, row: Any, ctx: Any) -> Awaitable[Any]:
        return self.fn(row, ctx)

    def __repr__(self) -> str:
        v = f" v{self.version}" if self.version else ""
        return f"<Play {self.name!r}{v} fingerprint={self.fingerprint[:8]}>"


def _name(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        return _name(fn.func)
    return getattr(fn, "__name__", None) or type(fn).__name__


@overload
def play(fn: PlayFn, *, name: str | None = None, version: str | None = None) -> Play: ...
@overload
def play(fn: None = None, *, name: str | None = None, version: str | None = None) -> Callable[[PlayFn], Play]: ...
def play(fn: PlayFn | None = None, *, name: str | None = None, version: str | None = None) -> Play | Callable[[PlayFn], Play]:
    """Declare a play: ``@pb.play`` or ``@pb.play(name=..., version=...)``."""

    def wrap(f: PlayFn) -> Play:
        return Play(f, name=name, version=version)

    return wrap if fn is None else wrap(fn)


def as_play(obj: Any) -> Play:
    """What ``map()`` runs: a Play as is, a bare async function wrapped, a Tool bound to columns."""
    from .tools import Tool

    if isinstance(obj, Play):
        return obj
    if isinstance(obj, Tool):
        return _tool_play(obj)
    return Play(obj)


def _tool_play(tool: Any) -> Play:
    params, column = tool.params, tool.name

    async def tool_play(row: Any, ctx: Any) -> dict[str, Any]:
        return {column: await ctx.tool(tool, {p: row[p] for p in params})}

    return Play(tool_play, name=tool.name, source=f"tool:{tool.name}:{tool.fingerprint}")
