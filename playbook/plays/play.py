"""Plays: ``async def play(row, ctx)`` functions, and the fingerprint that decides reuse.

The fingerprint covers the play's name, version and code (as a tool's identity does: comments and
layout do not count), its output model's schema when it declares one, and what its code reads
through the names it uses (:mod:`.reads`): the tools and plays it reaches, the functions it calls,
the values it reads from outside its code, as they are when a run starts.  So editing the play, a
helper it calls, its model or a value it reads (a template at the top of its module), or pointing
it at another tool (a tool renamed in the cell above), makes every row run again, while its tool
calls still hit their receipts: only changed calls cost.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias, overload, runtime_checkable

from playbook.addresses import code_fingerprint, digest
from playbook.errors import PlayDefinitionError
from playbook.plays.outputs import OutputModel
from playbook.plays.reads import reads

__all__ = [
    "Play",
    "PlayFn",
    "PlayLike",
    "Playable",
    "as_play",
    "current_fingerprint",
    "defined",
    "play",
    "play_name",
]

PlayFn = Callable[[Any, Any], Awaitable[Any]]  # async def play(row, ctx)


@runtime_checkable
class Playable(Protocol):
    """What this package knows of a tool (and of a play): its name, its fingerprint, and how it
    runs as a play of its own.  A play's fingerprint counts the ones it names by name and
    fingerprint; ``map()`` runs one through ``__play__``.  Tools implement it (a tool's play binds
    its inputs from the row's columns), so this package never imports them: tools sit above plays."""

    @property
    def name(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    def __play__(self) -> Play: ...


# What map() runs: a play, a bare async function (wrapped as one), or a tool bound to columns.
PlayLike: TypeAlias = "Play | Playable | PlayFn"

# What each tool and play name means in this process now: the fingerprint of its latest
# definition.  A row memo remembers the fingerprints of the tools and sub-plays it used; when one
# of them is defined anew (a cell run again, or an edited file imported by the next process), the
# memos made with the old definition no longer answer for it.
_current: dict[str, str] = {}


def defined(name: str, fingerprint: str) -> None:
    """``name`` (a tool's, or a :func:`play_name`) is defined now, as ``fingerprint``."""
    _current[name] = fingerprint


def current_fingerprint(name: str) -> str | None:
    """The fingerprint of the latest definition of ``name`` in this process, if any."""
    return _current.get(name)


def play_name(name: str) -> str:
    """How a play is named among the tools a memo used (a tool and a play may share a name)."""
    return "play:" + name


class Play:
    """A named, versioned async row function with a fingerprint; ``output``: its declared output
    model (:class:`~playbook.plays.outputs.OutputModel`), or None; ``reads_index``: it reads its
    row's index label (``row.index``), which is then part of each row's identity."""

    __slots__ = (
        "fn",
        "name",
        "version",
        "output",
        "fingerprint",
        "notes",
        "reads_index",
        "__wrapped__",
        "_own",
        "_named",
        "_tools",
        "_sent",
    )

    fn: PlayFn
    name: str
    version: str | None
    output: OutputModel | None
    fingerprint: str
    # what a run of it must say, by value ("name (type)"): what it reads that cannot be counted
    notes: dict[str, str]
    reads_index: bool
    __wrapped__: PlayFn

    def __init__(
        self,
        fn: PlayFn,
        *,
        name: str | None = None,
        version: str | None = None,
        output: Any = None,
        source: str | None = None,
    ) -> None:
        if isinstance(fn, Play):
            if output is None and fn.output is not None:
                output = fn.output.model
            fn = fn.fn
        if not callable(fn):
            raise PlayDefinitionError(f"a play must be an async function (row, ctx), not {type(fn).__name__}")
        label = name or _name(fn)
        if inspect.isasyncgenfunction(fn):
            raise PlayDefinitionError(
                f"play {label!r} yields: a play returns the row's output once (use return, not yield)"
            )
        if not inspect.iscoroutinefunction(fn):
            raise PlayDefinitionError(
                f"play {label!r} must be defined with 'async def {label}(row, ctx)': playbook awaits it for each row"
            )
        try:
            inspect.signature(fn).bind(None, None)
        except TypeError:
            raise PlayDefinitionError(f"play {label!r} must take exactly two arguments: (row, ctx)") from None
        self.fn = fn
        self.name = label
        self.version = None if version is None else str(version)
        self.output = None if output is None else OutputModel(output, label)
        parts = [label, self.version or "", source or code_fingerprint(fn)]
        if self.output is not None:  # a play without a model keeps the fingerprint (and the row memos) it had
            parts.append(self.output.fingerprint)
        self._own = digest("\x1f".join(parts))
        self.__wrapped__ = fn
        self._tools = source is None  # a %%play cell's source names its tools; a tool's play is its tool
        self._named, self.notes, self._sent, self.reads_index = "", {}, False, False
        self._fingerprint()
        self.current()

    def _fingerprint(self) -> None:
        # A play that reads nothing (no tool, helper or value) keeps the fingerprint (and the row
        # memos) it had.
        self.fingerprint = digest(self._own + "\x1f" + self._named) if self._named else self._own
        defined(play_name(self.name), self.fingerprint)  # a play that runs it as a sub-play sees an edit

    def current(self) -> Play:
        """This play as it runs now: its fingerprint again from what it reads now (see
        :mod:`~playbook.plays.reads`): a value edited, a tool renamed in a cell run again after
        this one.  Asked once per run.  A play that was sent here pickled (to a Dask worker)
        keeps the fingerprint it was sent with: where it was made is what the run is of."""
        if self._sent or id(self) in _refreshing.ids:
            return self  # a play reached again through the plays it reaches
        _refreshing.ids.add(id(self))
        subs: list[Play] = []

        def refresh(value: Any) -> None:
            if isinstance(value, Play):
                subs.append(value.current())

        try:
            found = reads(self.fn, named=(Playable,) if self._tools else (), refresh=refresh)
        finally:
            _refreshing.ids.discard(id(self))
        notes = {f"{name} ({kind})": _unstable_note(self.name, name, kind) for name, kind in found.unstable}
        notes.update((what, _unknown_note(self.name, does)) for what, does in found.unknown)
        for sub in subs:  # a value it reads itself is said of it, once
            notes = {**sub.notes, **notes}
        self.notes = notes
        self.reads_index = found.label
        if found.text != self._named:
            self._named = found.text
            self._fingerprint()
        return self

    def __getstate__(self) -> dict[str, Any]:
        self.current()  # what it reads where it is sent from is what it is
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self._sent = True  # a worker's globals and environment are not the sender's

    def __call__(self, row: Any, ctx: Any) -> Awaitable[Any]:
        return self.fn(row, ctx)

    def __play__(self) -> Play:
        return self.current()

    def __repr__(self) -> str:
        v = f" v{self.version}" if self.version else ""
        return f"<Play {self.name!r}{v} fingerprint={self.fingerprint[:8]}>"


class _Refreshing(threading.local):
    def __init__(self) -> None:
        self.ids: set[int] = set()


_refreshing = _Refreshing()


def _unstable_note(play: str, name: str, kind: str) -> str:
    return (
        f"play {play!r} reads {name} ({kind}), which has no stable form: its row memos still answer when it changes. "
        "If it changes what the play returns, give the play a version= or call it through a tool"
    )


def _unknown_note(play: str, does: str) -> str:
    return (
        f"play {play!r} {does}: its row memos still answer when that changes. "
        "If it changes what the play returns, give the play a version= or call it through a tool"
    )


def _name(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        return _name(fn.func)
    return getattr(fn, "__name__", None) or type(fn).__name__


@overload
def play(
    fn: PlayFn, *, name: str | None = None, version: str | None = None, output: type[Any] | None = None
) -> Play: ...
@overload
def play(
    fn: None = None, *, name: str | None = None, version: str | None = None, output: type[Any] | None = None
) -> Callable[[PlayFn], Play]: ...
def play(
    fn: PlayFn | None = None,
    *,
    name: str | None = None,
    version: str | None = None,
    output: type[Any] | None = None,
) -> Play | Callable[[PlayFn], Play]:
    """Declare a play: ``@pb.play`` or ``@pb.play(name=..., version=..., output=Model)``.

    ``output``: a pydantic model or a TypedDict class.  Its fields are the play's output columns,
    in its order and with dtypes from its annotations, present even when no row succeeds; each
    row's output is validated by it (a field error fails the row, naming the field) and only its
    fields are kept.
    """

    def wrap(f: PlayFn) -> Play:
        return Play(f, name=name, version=version, output=output)

    return wrap if fn is None else wrap(fn)


def as_play(obj: Any) -> Play:
    """What ``map()`` runs: a play as it is now, a tool's own play (see :class:`Playable`), a bare
    async function wrapped."""
    if isinstance(obj, Playable):
        return obj.__play__()
    return Play(obj)
