"""Where a store is: a directory (SQLite), a ``redis://`` URL, or ``"memory"``; and its backend."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from ..errors import ReceiptError
from .protocol import Backend

__all__ = ["home", "is_url", "masked_in", "open_backend"]

_URLS = ("redis://", "rediss://", "unix://")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")  # two letters or more: "C:" is a drive, not a scheme


def masked_in(text: str) -> bool:
    """``text`` already names a store's URL (a backend's message does, with its password masked)."""
    return any(scheme in text for scheme in _URLS)


def is_url(location: str | os.PathLike[str]) -> bool:
    """A store that is not a directory: a ``redis://`` URL, or ``"memory"``.  ``ReceiptError``
    for what looks like a URL but is not one playbook can use (``redis:/host``, ``http://…``):
    taken for a directory, it would quietly keep receipts in a folder of that name."""
    text = os.fspath(location)
    if text == "memory":
        return True
    if isinstance(location, os.PathLike):
        return False  # a Path is a directory, whatever its name
    scheme = _SCHEME.match(text)
    if scheme is None:
        return False
    if scheme.group(1).lower() + "://" in _URLS and text[scheme.end() :].startswith("//"):
        return True
    raise ReceiptError(
        f"store {text!r} is neither a directory nor a Redis URL: write redis://host:6379/0 (or rediss://, unix://), "
        f"or ./{text} for a directory of that name"
    )


def home() -> Path | str:
    """``$PLAYBOOK_HOME`` (a directory or a ``redis://`` URL), or ``.playbook`` in the working directory."""
    where = os.environ.get("PLAYBOOK_HOME") or ".playbook"
    return where if is_url(where) else Path(where)


def open_backend(location: str | os.PathLike[str], *, readonly: bool = False, notify: Callable[[str], None] | None = None) -> Backend:
    """The backend for a directory (SQLite), a ``redis://`` URL, or ``"memory"``."""
    text = os.fspath(location)
    if is_url(location) and text != "memory":
        from .redis import RedisBackend

        scheme, rest = text.split(":", 1)
        return RedisBackend(scheme.lower() + ":" + rest, readonly=readonly)
    if text == "memory":
        from .memory import MemoryBackend

        return MemoryBackend()
    from .sqlite import SqliteBackend

    return SqliteBackend(Path(text), readonly=readonly, notify=notify)
