"""What a play reads from outside its code, as it counts for the play's fingerprint.

A row memo answers for a play only while the play would compute the same output.  So besides
its code, the fingerprint covers what its code reaches through the names it looks up when a run
starts:

- the tools and plays it names, by their fingerprints, and the functions of its own module it
  calls, by their code, followed into theirs (the first rules: a play that reads nothing else
  keeps the fingerprint, and the row memos, it had);
- the values it reads: module and notebook globals, closure cells, class attributes
  (``Config.TEMPLATE``, ``Settings.LLM.MODEL``: a class inside a class too), and those read by
  the functions it calls in the user's other modules (not the standard library's, an installed
  package's or playbook's), by their stable form (:mod:`.stable`);
- the environment variables its code names, when it reads ``os.environ`` or ``os.getenv`` (the
  string constants, and the string values of the globals it reads, shaped like a variable's
  name), by a digest of their values: a key may be one of them.

Whether it reads the row's index label (``row.index``, ``row.Index``) is found the same way, in
its code and the functions it reaches: any attribute (or string constant) of either name counts,
``list.index`` included.  A play that does makes the label part of each row's identity.

Modules, library classes and functions, builtins, loggers, locks and playbook's own objects
count by what they are (not at all), and so does what the play keeps as its own record: a list
it appends to, a global it rebinds (``global N; N += 1``).  What cannot be counted is reported,
so the run can say so, and memos still answer: a value with no stable form (a client, a
session), what the code reaches through ``globals()``, ``vars()``, ``eval`` or ``exec``, an
environment variable whose name it builds, and a dict or list it both reads and fills.
"""

from __future__ import annotations

import dis
import functools
import inspect
import os
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from playbook.addresses import digest, key_text
from playbook.plays.bytecode import ENV_NAME, SIMPLE, codes, env_built, env_names, names_index
from playbook.plays.stable import (
    helper_fingerprint,
    plain_object,
    stable_text,
    user_class,
    user_code,
    user_module,
)

__all__ = ["Reads", "global_names", "reads"]

_MISSING = object()
_ENV_READERS = frozenset(("environ", "getenv"))
# A global or a cell called through one of these is written to (a list of calls a play keeps).
_MUTATORS = frozenset(
    (
        "append",
        "extend",
        "add",
        "update",
        "insert",
        "pop",
        "remove",
        "discard",
        "clear",
        "setdefault",
        "appendleft",
    )
)
_DYNAMIC = ("eval", "exec", "globals", "vars")  # builtins that read names no code names
_Key = tuple[int, str]  # a global: its module's namespace, its name


class Reads(NamedTuple):
    """``text``: what counts, as sorted ``name=...`` entries ("" when nothing does); ``unstable``:
    the values read that have no stable form, as (name, type); ``unknown``: what else the code
    does that cannot be counted, as (what, "writes to CACHE and reads it"); ``label``: its code (or
    a function it reaches) names an attribute ``index`` or ``Index``, as reading the row's index
    label does."""

    text: str
    unstable: tuple[tuple[str, str], ...]
    unknown: tuple[tuple[str, str], ...] = ()
    label: bool = False


class _Walk:
    """One traversal: the functions to read, and what was found."""

    def __init__(self, fn: Any, named: tuple[type, ...], refresh: Callable[[Any], None]) -> None:
        self.fn, self.named, self.refresh = fn, named, refresh
        self.found: set[str] = set()
        self.unstable: dict[str, str] = {}
        self.unknown: dict[str, str] = {}
        self.index = False
        self.todo: list[Any] = [fn]
        self.seen: set[int] = {id(fn)}
        self.dynamic: set[str] = set()
        # A global's entries wait until every function is read: one that rebinds it makes it a record.
        self.key: _Key | None = None
        self.held: dict[_Key, list[tuple[str, str]]] = {}
        self.rebound: set[_Key] = set()
        self.classes: set[int] = set()  # the classes being counted (a class holding itself)

    def follow(self, fn: Any) -> bool:
        if id(fn) in self.seen:
            return False
        self.seen.add(id(fn))
        self.todo.append(fn)
        return True

    def add(self, entry: str) -> None:
        if self.key is None:
            self.found.add(entry)
        else:
            self.held.setdefault(self.key, []).append(("", entry))

    def unsure(self, name: str, kind: str) -> None:
        if self.key is None:
            self.unstable.setdefault(name, kind)
        else:
            self.held.setdefault(self.key, []).append((name, kind))

    def done(self) -> Reads:
        for key, entries in self.held.items():
            if key not in self.rebound:
                for name, entry in entries:
                    if name:
                        self.unstable.setdefault(name, entry)
                    else:
                        self.found.add(entry)
        if self.dynamic:
            called = ", ".join(f"{name}()" for name in sorted(self.dynamic))
            self.unknown[called] = (
                f"calls {called}: what it reads through them cannot be known, and does not count"
            )
        return Reads(
            " ".join(sorted(self.found)),
            tuple(sorted(self.unstable.items())),
            tuple(sorted(self.unknown.items())),
            self.index,
        )


def reads(
    fn: Any, *, named: tuple[type, ...] = (), refresh: Callable[[Any], None] = lambda value: None
) -> Reads:
    """What ``fn`` (a play's function) reads, followed into the functions it calls.  ``named``:
    the kinds (tools, plays) counted by their name and fingerprint; ``refresh(value)``: called
    for each of them it names before its fingerprint is read."""
    fn = getattr(fn, "func", fn)  # a functools.partial: its function
    if getattr(fn, "__code__", None) is None or getattr(fn, "__globals__", None) is None:
        return Reads("", ())
    walk = _Walk(fn, named, refresh)
    while walk.todo:
        f = walk.todo.pop()
        _names(walk, f)
        _values(walk, f)
        _cells(walk, f)
        walk.index = walk.index or names_index(f.__code__)
        if _ENV_READERS.intersection(global_names(f.__code__)):
            _environment(walk, f)
    return walk.done()


def _names(walk: _Walk, f: Any) -> None:
    """The first rules: the tools and plays ``f`` names, and the functions of its own module."""
    space = f.__globals__
    for name in global_names(f.__code__):
        value: Any = space.get(name)
        if getattr(value, "fn", None) is walk.fn:
            continue  # this play, running itself as a sub-play
        if walk.named and isinstance(value, walk.named):
            walk.refresh(value)
            walk.found.add(f"{name}={getattr(value, 'name', '')}:{getattr(value, 'fingerprint', '')}")
        elif inspect.isfunction(value) and value.__globals__ is space and walk.follow(value):
            walk.found.add(f"{name}={helper_fingerprint(value)}")


def _values(walk: _Walk, f: Any) -> None:
    """The values ``f`` reads through the globals it loads (and one attribute of a user module's)."""
    space = f.__globals__
    loads = _loads(f.__code__)
    walk.rebound.update((id(space), name) for name in loads.rebound)
    for name in loads.filled:
        if name in space:
            walk.unknown[f"{name} (filled)"] = f"writes to {name} and reads it: it is not counted"
    for name, attribute in loads.read:
        value = space.get(name, _MISSING)
        if value is _MISSING:
            if name in _DYNAMIC:
                walk.dynamic.add(name)  # the builtin, not a global of that name
            continue  # a builtin, or a name not defined yet
        key = (id(space), name)
        if isinstance(value, types.ModuleType) and attribute and user_module(value):
            key = (id(vars(value)), attribute)  # a global of that module: its functions may rebind it
            name, value = f"{name}.{attribute}", getattr(value, attribute, _MISSING)
            if value is _MISSING or isinstance(value, types.ModuleType):
                continue
        if inspect.isfunction(value) and value.__globals__ is space:
            continue  # counted by the first rules
        walk.key = key
        _read(walk, name, value)
        walk.key = None


def _cells(walk: _Walk, f: Any) -> None:
    """``f``'s closure cells that its code fingerprint counts by type (a list, a dict, a
    function): by value here.  The others are in its code fingerprint already."""
    loads = _loads(f.__code__)
    for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
        if name in loads.filled:
            walk.unknown[f"{name} (filled)"] = f"writes to {name} and reads it: it is not counted"
        if name in loads.written:
            continue
        try:
            value = cell.cell_contents
        except ValueError:
            continue  # not assigned yet
        if walk.named and isinstance(value, walk.named):
            walk.refresh(value)
        if _hashable_key(value):
            continue
        _read(walk, f"<closure {name}>", value)


def _read(walk: _Walk, name: str, value: Any) -> None:
    """Count ``value``, read as ``name``: a helper or a class of the user's by its code (followed),
    a value by its stable form, else reported."""
    wrapped = getattr(value, "__wrapped__", None)
    if inspect.isfunction(wrapped) and type(value).__module__.split(".")[0] != "playbook":
        value = wrapped  # a helper behind functools.lru_cache or a decorator of the user's
    if inspect.isfunction(value):
        if user_code(value) and walk.follow(value):
            walk.add(f"{name}={helper_fingerprint(value)}")
        return
    if isinstance(value, type):
        if user_class(value):
            walk.add(f"{name}={_class_text(walk, value)}")
        return
    text = stable_text(value)
    if text is None:
        walk.unsure(name, f"{type(value).__module__}.{type(value).__qualname__}")
    elif text:
        walk.add(f"{name}=v:{digest(text)}")
        if plain_object(value):
            walk.add(f"{name}:class={_class_text(walk, type(value))}")  # a plain object's methods


def _class_text(walk: _Walk, cls: type) -> str:
    """A user's class as it counts: its methods' code (followed), its attributes' values and the
    classes of the user's inside it (``Settings.LLM``), those of its user-defined bases included."""
    if id(cls) in walk.classes:
        return cls.__qualname__  # a class holding itself: counted where it was met first
    walk.classes.add(id(cls))
    parts = []
    for klass in cls.__mro__:
        if not user_class(klass):
            continue
        for attr, value in sorted(vars(klass).items()):
            if attr.startswith("_") and attr.endswith("_"):
                continue  # Python's own (__module__) and enum's (_member_map_)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = value.fget
            if inspect.isfunction(value):
                walk.follow(value)
                parts.append(f"{attr}={helper_fingerprint(value)}")
            elif isinstance(value, type):
                if user_class(value):
                    parts.append(f"{attr}=c:{_class_text(walk, value)}")
            else:
                text = stable_text(value)
                if text is None and attr.startswith("_"):
                    continue  # a library's machinery on the class (abc's _abc_impl)
                if text is None:
                    walk.unsure(
                        f"{cls.__qualname__}.{attr}", f"{type(value).__module__}.{type(value).__qualname__}"
                    )
                elif text:
                    parts.append(f"{attr}=v:{digest(text)}")
    walk.classes.discard(id(cls))
    return digest(cls.__qualname__ + "\x1f" + "\x1f".join(parts))


def _environment(walk: _Walk, f: Any) -> None:
    """The environment variables ``f`` reads, by a digest of their values: those named by its
    string constants and by the strings of the globals and cells it reads; a name it builds is
    reported."""
    code, space = f.__code__, f.__globals__
    names = set(env_names(code))
    read = _loads(code).read
    values = [space.get(name) for name, _ in read]
    # Settings.ENV_NAME, config.ENV_NAME
    owners = [(space.get(name), attribute) for name, attribute in read if attribute]
    values += [
        getattr(owner, attribute, None)
        for owner, attribute in owners
        if isinstance(owner, (type, types.ModuleType))
    ]
    for cell in f.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:
            continue
    names.update(v for v in values if isinstance(v, str) and ENV_NAME.fullmatch(v))
    for name in names:
        value = os.environ.get(name)
        walk.found.add(f"$env:{name}=" + ("<unset>" if value is None else digest("env\x1f" + value)))
    if env_built(code):
        walk.unknown["$env (built)"] = (
            "reads an environment variable by a name it builds or is given: which one cannot be known"
        )


def _hashable_key(value: Any) -> bool:
    """True when a code fingerprint counts ``value`` (a closure cell's) by value already."""
    try:
        hash(value)
        key_text(value)
    except (TypeError, ValueError, RecursionError):
        return getattr(value, "fingerprint", None) is not None and not isinstance(value, type)
    return True


@functools.lru_cache(maxsize=1024)  # a sub-play's, asked for each row that runs it
def global_names(code: Any) -> tuple[str, ...]:
    """Names ``code`` (and the functions, lambdas and comprehensions inside it) looks up, sorted."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names.update(global_names(const))
    return tuple(sorted(names))


class _Loads(NamedTuple):
    # the globals read, each with the attribute read of it first ("" if none)
    read: tuple[tuple[str, str], ...]
    # the globals and cells called through a mutator or stored into (CALLS.append(x), SEEN[k] = v)
    written: frozenset[str]
    filled: frozenset[str]  # those of them also read otherwise (CACHE.get(k))
    rebound: frozenset[str]  # the globals assigned (global N; N += 1)


@functools.lru_cache(maxsize=1024)
def _loads(code: Any) -> _Loads:
    """What ``code`` (and the code inside it) does with the globals and cells it names.  A list it
    appends to, a dict it updates or stores into (``CALLS.append(x)``, ``SEEN[k] = v``), an
    object whose attribute it sets (``STATS.n += 1``), a global it rebinds, is its own record of
    what it did, not an input, and counts for nothing."""
    found: set[tuple[str, str]] = set()
    written: set[str] = set()
    plain: set[str] = set()
    rebound: set[str] = set()
    for inner in codes(code):
        instructions = list(dis.get_instructions(inner))
        for i, ins in enumerate(instructions):
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                rebound.add(ins.argval)
            if ins.opname not in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"):
                continue
            after = instructions[i + 1] if i + 1 < len(instructions) else None
            attribute = (
                after.argval if after is not None and after.opname in ("LOAD_ATTR", "LOAD_METHOD") else ""
            )
            if attribute in _MUTATORS or _stores_into(instructions[i + 1 : i + 6]):
                written.add(ins.argval)
                continue
            plain.add(ins.argval)
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                found.add((ins.argval, attribute))
    read = tuple(sorted(r for r in found if r[0] not in written and r[0] not in rebound))
    return _Loads(read, frozenset(written), frozenset(written & plain - rebound), frozenset(rebound))


def _stores_into(following: list[Any]) -> bool:
    """Whether the object just loaded is stored into: ``X.n = v``, ``X.n += 1``, ``X[row.k] = v``,
    ``X[k] += 1``."""
    ops = [ins.opname for ins in following] + ["", ""]
    if ops[0] == "STORE_ATTR" or (ops[0] == "COPY" and ops[1] == "LOAD_ATTR"):
        return True
    if ops[0] not in SIMPLE:
        return False
    for op, then in zip(ops[1:], ops[2:]):  # the key, read whole or through attributes, then the store
        if op == "STORE_SUBSCR" or (op == "COPY" and then == "COPY"):
            return True
        if op not in SIMPLE and op != "LOAD_ATTR":
            return False
    return False
