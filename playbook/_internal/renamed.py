"""Old spellings kept for one release: each says, when used, what it is called now.

Every word of the API means one thing (docs "Names"); a name that changed keeps working for one
release as a deprecated alias that warns, naming the new spelling, so a notebook written against
the old one goes on and is told what to write instead.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["renamed"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Frames between the user's line and ours that are nobody's code to change: IPython's magic machinery.
_PASSING = ("<decorator-gen", os.sep + "IPython" + os.sep)


def renamed(old: str, new: str) -> None:
    """Warn that ``old`` is deprecated and ``new`` is its name now, at the user's line (the
    first frame outside playbook), where Python and IPython show a ``DeprecationWarning``."""
    warnings.warn(
        f"{old} is deprecated and goes in the next release; use {new}",
        DeprecationWarning,
        stacklevel=_users_level(),
    )


def _users_level() -> int:
    frame = sys._getframe(2)  # the caller of renamed()
    level = 2
    while frame.f_back is not None and _ours(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level


def _ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE) or any(part in filename for part in _PASSING)
