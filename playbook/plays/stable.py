"""A value's stable form, as a play's fingerprint counts it, and whose code a function is.

A value counts by its key form (:func:`~playbook.addresses.key_text`), with a tag for what key_text has
none for: a path, a pattern, an enum member, a ``types.SimpleNamespace``, an instance of a plain
class of the user's (by its class and its attributes, a few objects deep), a ``functools.partial``
(its function and arguments), ``operator.itemgetter``/``attrgetter``/``methodcaller`` (by their
repr); a pandas, numpy or Polars frame or array by its content.  Whose code a function is: the
user's, unless it is the standard library's, an installed package's or playbook's.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import logging
import operator
import os
import re
import site
import sys
import sysconfig
import threading
import types
from pathlib import PurePath
from typing import Any

from playbook.addresses import code_fingerprint, key_text

__all__ = ["helper_fingerprint", "plain_object", "stable_text", "user_class", "user_code", "user_module"]

_LOCKS = tuple(type(t) for t in (threading.Lock(), threading.RLock())) + (
    threading.Semaphore,
    threading.Event,
    threading.Condition,
)
_SILENT = (
    types.ModuleType,
    logging.Logger,
    logging.LoggerAdapter,
    *_LOCKS,
    types.BuiltinFunctionType,
    types.MethodWrapperType,
)
_GETTERS = (operator.itemgetter, operator.attrgetter, operator.methodcaller)
_DEPTH = 6  # objects inside objects counted by their attributes; deeper (or a cycle) has no stable form


def stable_text(value: Any) -> str | None:
    """``value``'s stable form as text: "" when it counts by what it is (a module, a library's
    function or class, a lock, a logger, a tool), None when it has none (a client object)."""
    kind = type(value)
    module = kind.__module__
    if isinstance(value, _SILENT) or inspect.isroutine(value) or isinstance(value, type):
        return ""
    if (
        value is os.environ
        or module in ("typing", "typing_extensions")
        or module.split(".")[0] in ("playbook", "asyncio")
    ):
        return ""  # environment variables count by the names the code reads, not as a whole
    frame = _frame_digest(value)
    if frame is not None:
        return frame
    try:
        return key_text(_plainly(value))
    except Exception:  # whatever a value's own methods raise (a mapping's items()), it has no stable form
        return None


def _plainly(value: Any, depth: int = 0) -> Any:
    """``value`` with what key_text has no tag for given one (a path, a pattern, an enum member,
    a namespace, a plain object of the user's, a partial, a getter)."""
    kind = type(value)
    if kind in (list, tuple, set, frozenset):
        return kind(_plainly(v, depth) for v in value)
    if kind is dict:
        return {k: _plainly(v, depth) for k, v in value.items()}
    if isinstance(value, PurePath):
        return {"$path": [kind.__name__, str(value)]}
    if isinstance(value, re.Pattern):
        return {"$re": [value.pattern, value.flags]}
    if isinstance(value, enum.Enum):
        return {"$enum": [kind.__qualname__, _plainly(value.value, depth)]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            "$" + kind.__qualname__: {
                f.name: _plainly(getattr(value, f.name), depth) for f in dataclasses.fields(value)
            }
        }
    if isinstance(value, _GETTERS):
        return {"$getter": repr(value)}  # operator.itemgetter('a'): its repr says all it does
    if isinstance(value, functools.partial):
        func = value.func
        form = helper_fingerprint(func) if inspect.isfunction(func) and user_code(func) else _routine(func)
        return {"$partial": [form, _plainly(list(value.args), depth), _plainly(dict(value.keywords), depth)]}
    if kind is types.SimpleNamespace or plain_object(value):
        if depth >= _DEPTH:
            raise ValueError("objects nested too deeply, or holding each other")
        return {"$object": [kind.__qualname__, _plainly(dict(vars(value)), depth + 1)]}
    return value


def _routine(fn: Any) -> str:
    """A library's function as it counts in a partial: by its name (another partial inside: its form)."""
    if isinstance(fn, functools.partial):
        return key_text(_plainly(fn))
    if not inspect.isroutine(fn) and not isinstance(fn, type):
        raise ValueError("a partial of a callable object")
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"


def plain_object(value: Any) -> bool:
    """True for an instance of a plain class of the user's: its classes the user's, or object."""
    kind = type(value)
    return hasattr(value, "__dict__") and all(k is object or user_class(k) for k in kind.__mro__)


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

            h.update(
                repr(
                    (
                        type(value).__name__,
                        value.shape,
                        list(map(str, getattr(value, "columns", ()))),
                        str(value.dtypes),
                    )
                ).encode()
            )
            h.update(pd.util.hash_pandas_object(value, index=True).to_numpy().tobytes())
        elif module == "numpy" and hasattr(value, "dtype") and getattr(value, "ndim", 0) > 0:
            h.update(repr((value.dtype.str, value.shape)).encode())
            h.update(
                key_text(value.tolist()).encode() if value.dtype.kind == "O" else value.tobytes(order="C")
            )
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


def helper_fingerprint(fn: Any) -> str:
    """A helper's fingerprint, by its compiled code: a Dask worker, which has no source for it,
    finds the same one (the play's own comes with it, made where the source is)."""
    return (
        _compiled_fingerprint(fn.__code__) if fn.__closure__ is None else code_fingerprint(fn, source=False)
    )


@functools.lru_cache(maxsize=1024)
def _compiled_fingerprint(code: Any) -> str:
    return code_fingerprint(types.FunctionType(code, {}), source=False)


def user_code(fn: Any) -> bool:
    """True when ``fn`` is the user's: not the standard library's, an installed package's or playbook's."""
    return _user_file(fn.__code__.co_filename)


def user_module(module: types.ModuleType) -> bool:
    file = getattr(module, "__file__", None)
    return module.__name__ == "__main__" or (file is not None and _user_file(file))


def user_class(cls: type) -> bool:
    for value in vars(cls).values():  # where its methods were written, which a notebook's class knows best
        value = getattr(value, "__func__", value)
        if inspect.isfunction(value):
            return user_code(value)
    module = sys.modules.get(cls.__module__)
    return module is not None and cls.__module__ not in sys.builtin_module_names and user_module(module)


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
