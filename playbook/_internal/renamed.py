"""Old spellings kept for one release: each says, when used, what it is called now.

Every word of the API means one thing (docs "Names"); a name that changed keeps working for one
release as a deprecated alias that warns, naming the new spelling, so a notebook written against
the old one goes on and is told what to write instead.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, ParamSpec, TypeVar

__all__ = [
    "RenamedKeys",
    "RenamedWarning",
    "asked_by_user",
    "callers_frame",
    "deprecated",
    "keyword_renamed",
    "old_attribute",
    "renamed",
]

P = ParamSpec("P")
R = TypeVar("R")

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Frames between the user's line and ours that are nobody's code to change: IPython's magic machinery.
_PASSING = ("<decorator-gen", os.sep + "IPython" + os.sep)


class RenamedWarning(DeprecationWarning):
    """A ``DeprecationWarning`` of playbook's own: the command line shows these (a play's module is
    not ``__main__`` there, where Python would hide a plain one)."""


def renamed(old: str, new: str) -> None:
    """Warn that ``old`` is deprecated and ``new`` is its name now, at the user's line (the
    first frame outside playbook), where Python and IPython show a ``DeprecationWarning``."""
    deprecated(f"{old} is deprecated and goes in the next release; use {new}")


def deprecated(message: str) -> None:
    """Warn ``message`` (:class:`RenamedWarning`) at the user's line: the first frame outside playbook."""
    warnings.warn(message, RenamedWarning, stacklevel=_users_level())


def _users_level() -> int:
    frame = sys._getframe(2)  # the caller of deprecated()
    level = 2
    while frame.f_back is not None and _ours(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level


def asked_by_user(depth: int = 2) -> bool:
    """Whether the code ``depth`` frames up (from the caller of this) is the user's, not playbook's:
    an old name answers users, while playbook's own probing (``getattr(x, "fn", None)``) is told it
    is not there."""
    return not _ours(sys._getframe(depth).f_code.co_filename)


def _ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE) or any(part in filename for part in _PASSING)


def old_attribute(owner: object, name: str, old: Mapping[str, Callable[[Any], Any]]) -> Any:
    """What a class's ``__getattr__`` answers for ``name``: a deprecated attribute, served from
    there so that ``dir()`` (and tab completion) leaves it out while it still works,
    ``old[name](owner)``, which warns; any other name is Python's AttributeError."""
    answer = old.get(name)
    if answer is None:
        raise AttributeError(
            f"{type(owner).__name__!r} object has no attribute {name!r}", name=name, obj=owner
        )
    return answer(owner)


def keyword_renamed(old: str, new: str, where: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A function whose keyword ``old`` is now ``new``: ``old=`` still works, warning (``where``
    names the function in the message); both at once is a ``TypeError``."""

    def wrap(function: Callable[P, R]) -> Callable[P, R]:
        # How many positional arguments reach ``new``: passed that way it is given as much as by keyword.
        place = list(inspect.signature(function).parameters).index(new)

        @functools.wraps(function)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if old in kwargs:
                if new in kwargs or len(args) > place:
                    raise TypeError(f"{where}: {old}= and {new}= are one argument: pass only {new}=")
                renamed(f"{where}(..., {old}=)", f"{where}(..., {new}=)")
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return call

    return wrap


def callers_frame(frame: FrameType) -> FrameType:
    """``frame``, or the frame that called it when it is a :func:`keyword_renamed` wrapper's."""
    while frame.f_code is _WRAPPER and frame.f_back is not None:
        frame = frame.f_back
    return frame


class RenamedKeys(dict[str, Any]):
    """A dict of results whose renamed keys still read, warning (``{old: new}``; ``where`` names
    the dict in the message), ``.get()`` them and ``in`` finds them (warning too); the old keys are
    not listed (not in ``keys()``, not in its JSON)."""

    __slots__ = ("_old", "_where")

    def __init__(self, values: dict[str, Any], old: dict[str, str], where: str) -> None:
        super().__init__(values)
        self._old = old
        self._where = where

    def __missing__(self, key: str) -> Any:
        if key not in self._old:
            raise KeyError(key)
        new = self._old[key]
        renamed(f"{self._where}[{key!r}]", f"{self._where}[{new!r}]")
        return self[new]

    def get(self, key: str, default: Any = None) -> Any:
        """``[key]``, old keys too (warning), or ``default``."""
        if dict.__contains__(self, key) or key in self._old:
            return self[key]
        return default

    def __contains__(self, key: object) -> bool:
        """True for an old key too (it was there), warning with its new spelling."""
        if dict.__contains__(self, key):
            return True
        if isinstance(key, str) and key in self._old:
            new = self._old[key]
            renamed(f"{key!r} in {self._where}", f"{new!r} in {self._where}")
            return dict.__contains__(self, new)
        return False


_WRAPPER = keyword_renamed("", "new", "")(lambda new: None).__code__
