"""What a play reads from outside its code, as it counts for the play's fingerprint.

A row memo answers for a play only while the play would compute the same output.  So besides
its code, the fingerprint covers what its code reaches through the names it looks up when a run
starts:

- the tools and plays it names, by their fingerprints, and the functions of its own module it
  calls, by their code, followed into theirs (the first rules: a play that reads nothing else
  keeps the fingerprint, and the row memos, it had);
- the values it reads: module and notebook globals, closure cells, class attributes
  (``Config.TEMPLATE``), and those read by the functions it calls in the user's other modules
  (not the standard library's, an installed package's or playbook's), by their key form
  (:func:`~playbook.keys.key_text`); a pandas, numpy or Polars frame or array by its content;
- the environment variables its code names, when it reads ``os.environ`` or ``os.getenv``
  (the string constants shaped like a variable's name), by a digest of their values: a key may
  be one of them.

Whether it reads the row's index label (``row.index``, ``row.Index``) is found the same way, in
its code and the functions it reaches: any attribute (or string constant) of either name counts,
``list.index`` included.  A play that does makes the label part of each row's identity.

Modules, library classes and functions, builtins, loggers, locks and playbook's own objects
count by what they are (not at all).  A value with no stable form (a client, a session, a model
object) cannot be counted: it is reported, so the run can say so, and memos still answer.
"""

from __future__ import annotations

import dataclasses
import dis
import enum
import functools
import hashlib
import inspect
import logging
import os
import re
import site
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import PurePath
from typing import Any, NamedTuple

from ..keys import code_fingerprint, digest, key_text

__all__ = ["Reads", "global_names", "helper_fingerprint", "reads", "user_code"]

_MISSING = object()
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]+")
_ENV_READERS = frozenset(("environ", "getenv"))
_INDEX = frozenset(("index", "Index"))  # how a play reads its row's index label
# A global or a cell called through one of these is written to (a list of calls a play keeps).
_MUTATORS = frozenset(("append", "extend", "add", "update", "insert", "pop", "remove", "discard", "clear", "setdefault", "appendleft"))
_LOCKS = tuple(type(t) for t in (threading.Lock(), threading.RLock())) + (threading.Semaphore, threading.Event, threading.Condition)
_SILENT = (types.ModuleType, logging.Logger, logging.LoggerAdapter, *_LOCKS, types.BuiltinFunctionType, types.MethodWrapperType)


class Reads(NamedTuple):
    """``text``: what counts, as sorted ``name=...`` entries ("" when nothing does); ``unstable``:
    the values read that have no stable form, as (name, type); ``label``: its code (or a function
    it reaches) names an attribute ``index`` or ``Index``, as reading the row's index label does."""

    text: str
    unstable: tuple[tuple[str, str], ...]
    label: bool = False


class _Walk:
    """One traversal: the functions to read, and what was found."""

    def __init__(self, fn: Any, named: tuple[type, ...], refresh: Callable[[Any], None]) -> None:
        self.fn, self.named, self.refresh = fn, named, refresh
        self.found: set[str] = set()
        self.unstable: dict[str, str] = {}
        self.index = False
        self.todo: list[Any] = [fn]
        self.seen: set[int] = {id(fn)}

    def follow(self, fn: Any) -> bool:
        if id(fn) in self.seen:
            return False
        self.seen.add(id(fn))
        self.todo.append(fn)
        return True


def reads(fn: Any, *, named: tuple[type, ...] = (), refresh: Callable[[Any], None] = lambda value: None) -> Reads:
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
        walk.index = walk.index or _names_index(f.__code__)
        if _ENV_READERS.intersection(global_names(f.__code__)):
            for name in _env_names(f.__code__):
                value = os.environ.get(name)
                walk.found.add(f"$env:{name}=" + ("<unset>" if value is None else digest("env\x1f" + value)))
    return Reads(" ".join(sorted(walk.found)), tuple(sorted(walk.unstable.items())), walk.index)


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
    for name, attribute in _loads(f.__code__)[0]:
        value = space.get(name, _MISSING)
        if value is _MISSING:
            continue  # a builtin, or a name not defined yet
        if isinstance(value, types.ModuleType) and attribute and _user_module(value):
            name, value = f"{name}.{attribute}", getattr(value, attribute, _MISSING)
            if value is _MISSING or isinstance(value, types.ModuleType):
                continue
        if inspect.isfunction(value) and value.__globals__ is space:
            continue  # counted by the first rules
        _read(walk, name, value)


def _cells(walk: _Walk, f: Any) -> None:
    """``f``'s closure cells that its code fingerprint counts by type (a list, a dict, a
    function): by value here.  The others are in its code fingerprint already."""
    written = _loads(f.__code__)[1]
    for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
        if name in written:
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
            walk.found.add(f"{name}={helper_fingerprint(value)}")
        return
    if isinstance(value, type):
        if _user_class(value):
            walk.found.add(f"{name}={_class_text(walk, value)}")
        return
    text = stable_text(value)
    if text is None:
        walk.unstable.setdefault(name, f"{type(value).__module__}.{type(value).__qualname__}")
    elif text:
        walk.found.add(f"{name}=v:{digest(text)}")


def _class_text(walk: _Walk, cls: type) -> str:
    """A user's class as it counts: its methods' code (followed) and its attributes' values,
    those of its user-defined bases included."""
    parts = []
    for klass in cls.__mro__:
        if not _user_class(klass):
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
            else:
                text = stable_text(value)
                if text is None and attr.startswith("_"):
                    continue  # a library's machinery on the class (abc's _abc_impl)
                if text is None:
                    walk.unstable.setdefault(f"{cls.__qualname__}.{attr}", f"{type(value).__module__}.{type(value).__qualname__}")
                elif text:
                    parts.append(f"{attr}=v:{digest(text)}")
    return digest(cls.__qualname__ + "\x1f" + "\x1f".join(parts))


def stable_text(value: Any) -> str | None:
    """``value``'s stable form as text: "" when it counts by what it is (a module, a library's
    function or class, a lock, a logger, a tool), None when it has none (a client object)."""
    kind = type(value)
    module = kind.__module__
    if isinstance(value, _SILENT) or inspect.isroutine(value) or isinstance(value, type):
        return ""
    if value is os.environ or module in ("typing", "typing_extensions") or module.split(".")[0] in ("playbook", "asyncio"):
        return ""  # environment variables count by the names the code reads, not as a whole
    frame = _frame_digest(value)
    if frame is not None:
        return frame
    try:
        return key_text(_plainly(value))
    except Exception:  # whatever a value's own methods raise (a mapping's items()), it has no stable form
        return None


def _plainly(value: Any) -> Any:
    """``value`` with what key_text has no tag for given one (a path, a pattern, an enum member)."""
    if isinstance(value, PurePath):
        return {"$path": [type(value).__name__, str(value)]}
    if isinstance(value, re.Pattern):
        return {"$re": [value.pattern, value.flags]}
    if isinstance(value, enum.Enum):
        return {"$enum": [type(value).__qualname__, _plainly(value.value)]}
    if type(value) in (list, tuple):
        return type(value)(_plainly(v) for v in value)
    if type(value) is dict:
        return {k: _plainly(v) for k, v in value.items()}
    if type(value) in (set, frozenset):
        return type(value)(_plainly(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"$" + type(value).__qualname__: {f.name: _plainly(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    return value


def _frame_digest(value: Any) -> str | None:
    """A pandas, numpy or Polars frame, series or array by its content (and its shape, dtypes,
    labels); None for anything else, or one whose cells cannot be hashed."""
    module = type(value).__module__.split(".")[0]
    if module not in ("pandas", "numpy", "polars"):
        return None
    h = hashlib.blake2b(digest_size=16)
    try:
        if module == "pandas" and hasattr(value, "dtypes"):
            import pandas as pd

            h.update(repr((type(value).__name__, value.shape, list(map(str, getattr(value, "columns", ()))), str(value.dtypes))).encode())
            h.update(pd.util.hash_pandas_object(value, index=True).to_numpy().tobytes())
        elif module == "numpy" and hasattr(value, "dtype") and getattr(value, "ndim", 0) > 0:
            h.update(repr((value.dtype.str, value.shape)).encode())
            h.update(key_text(value.tolist()).encode() if value.dtype.kind == "O" else value.tobytes(order="C"))
        elif module == "polars" and hasattr(value, "schema"):
            h.update(repr((type(value).__name__, value.shape, str(value.schema))).encode())
            h.update(value.hash_rows().to_numpy().tobytes())
        elif module == "polars" and hasattr(value, "dtype"):
            h.update(repr(("Series", value.name, len(value), str(value.dtype))).encode())
            h.update(value.hash().to_numpy().tobytes())
        else:
            return None
    except Exception:
        return None  # cells with no hash (lists in an object column): it has no stable form
    return f'{{"$frame":"{h.hexdigest()}"}}'


def _hashable_key(value: Any) -> bool:
    """True when a code fingerprint counts ``value`` (a closure cell's) by value already."""
    try:
        hash(value)
        key_text(value)
    except (TypeError, ValueError, RecursionError):
        return getattr(value, "fingerprint", None) is not None and not isinstance(value, type)
    return True


def helper_fingerprint(fn: Any) -> str:
    """A helper's fingerprint, by its compiled code: a Dask worker, which has no source for it,
    finds the same one (the play's own comes with it, made where the source is)."""
    return _compiled_fingerprint(fn.__code__) if fn.__closure__ is None else code_fingerprint(fn, source=False)


@functools.lru_cache(maxsize=1024)
def _compiled_fingerprint(code: Any) -> str:
    return code_fingerprint(types.FunctionType(code, {}), source=False)


@functools.lru_cache(maxsize=1024)  # a sub-play's, asked for each row that runs it
def global_names(code: Any) -> tuple[str, ...]:
    """Names ``code`` (and the functions, lambdas and comprehensions inside it) looks up, sorted."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names.update(global_names(const))
    return tuple(sorted(names))


@functools.lru_cache(maxsize=1024)
def _loads(code: Any) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
    """The globals ``code`` (and the code inside it) reads, each with the
    attribute it reads of it first ("" if none), and the globals and cells it writes to: a list it appends
    to, a dict it updates (``CALLS.append(x)``), is its own record of what it did, not an input,
    and counts for nothing."""
    found: set[tuple[str, str]] = set()
    written: set[str] = set()
    for inner in _codes(code):
        instructions = list(dis.get_instructions(inner))
        for i, ins in enumerate(instructions):
            if ins.opname not in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"):
                continue
            after = instructions[i + 1] if i + 1 < len(instructions) else None
            attribute = after.argval if after is not None and after.opname in ("LOAD_ATTR", "LOAD_METHOD") else ""
            if attribute in _MUTATORS:
                written.add(ins.argval)
            elif ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                found.add((ins.argval, attribute))
    return tuple(sorted(r for r in found if r[0] not in written)), frozenset(written)


def _codes(code: Any) -> Iterator[Any]:
    yield code
    for const in code.co_consts:
        if inspect.iscode(const):
            yield from _codes(const)


@functools.lru_cache(maxsize=1024)
def _names_index(code: Any) -> bool:
    """True when ``code`` (or the code inside it) names ``index`` or ``Index``: as an attribute
    (``row.Index``, and ``items.index(x)`` too: a play wrongly thought to read the label only
    runs its rows of a reindexed frame again, from receipts), or as a string (``getattr(row, "index")``)."""
    for inner in _codes(code):
        if _INDEX.intersection(inner.co_names) or _INDEX.intersection(c for c in inner.co_consts if isinstance(c, str)):
            return True
    return False


def _env_names(code: Any) -> list[str]:
    """The string constants of ``code`` (and the code inside it) shaped like environment variables' names."""
    return sorted({c for inner in _codes(code) for c in inner.co_consts if isinstance(c, str) and _ENV_NAME.fullmatch(c)})


def user_code(fn: Any) -> bool:
    """True when ``fn`` is the user's: not the standard library's, an installed package's or playbook's."""
    return _user_file(fn.__code__.co_filename)


def _user_module(module: types.ModuleType) -> bool:
    file = getattr(module, "__file__", None)
    return module.__name__ == "__main__" or (file is not None and _user_file(file))


def _user_class(cls: type) -> bool:
    for value in vars(cls).values():  # where its methods were written, which a notebook's class knows best
        value = getattr(value, "__func__", value)
        if inspect.isfunction(value):
            return user_code(value)
    module = sys.modules.get(cls.__module__)
    return module is not None and cls.__module__ not in sys.builtin_module_names and _user_module(module)


@functools.lru_cache(maxsize=4096)
def _user_file(filename: str) -> bool:
    if filename.startswith("<"):
        return not filename.startswith("<frozen")  # exec'd code, a notebook cell
    path = os.path.realpath(filename)
    return not any(path.startswith(d) for d in _library_dirs())


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    dirs += [*site.getsitepackages(), site.getusersitepackages(), os.path.dirname(os.path.dirname(__file__))]
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)
