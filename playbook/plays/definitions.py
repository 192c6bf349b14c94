"""What each tool and play name means in this process now: the fingerprint of its latest
definition.  A row memo remembers the fingerprints of the tools and sub-plays it used; when one
of them is defined anew (a cell run again, or an edited file imported by the next process), the
memos made with the old definition no longer answer for it."""

from __future__ import annotations

__all__ = ["current_fingerprint", "defined", "play_name"]

_current: dict[str, str] = {}  # name -> fingerprint of the latest definition


def defined(name: str, fingerprint: str) -> None:
    """``name`` is defined now, as ``fingerprint``."""
    _current[name] = fingerprint


def current_fingerprint(name: str) -> str | None:
    """The fingerprint of the latest definition of ``name`` in this process, if any."""
    return _current.get(name)


def play_name(name: str) -> str:
    """How a play is named among the tools a memo used (a tool and a play may share a name)."""
    return "play:" + name
