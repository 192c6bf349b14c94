"""Where a store is: a directory (SQLite), a ``redis://`` URL, or ``"memory"``; and its backend."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from playbook.errors import ReceiptError
from playbook.store.db import FILE
from playbook.store.protocol import Backend, StoreFailure
from playbook.store.redis.durability import DURABILITIES

__all__ = ["announcement", "home", "is_url", "masked_in", "open_backend", "project_of"]

_URLS = ("redis://", "rediss://", "unix://")
_MARKERS = ("pyproject.toml", ".git")  # what makes a folder a project's top
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
    """Where the default store is: ``$PLAYBOOK_HOME`` (a directory or a ``redis://`` URL), else
    ``.playbook`` in the project (see :func:`project_of`) of the working directory."""
    where = os.environ.get("PLAYBOOK_HOME")
    if where:
        # Absolute, so the same store is found (and cached as one) after a change of directory.
        return where if is_url(where) else Path(where).expanduser().absolute()
    return project_of(Path.cwd())[0] / ".playbook"


def project_of(folder: Path) -> tuple[Path, bool]:
    """The project ``folder`` is in: the nearest folder from ``folder`` up holding ``pyproject.toml``
    or ``.git`` (a folder, or the file of a worktree or submodule), and True; else ``folder``, False.

    Receipts then follow the project, not the directory a script or notebook was started from:
    run from ``notebooks/`` or ``scripts/``, a rerun still finds what the first run paid for.  The
    user's home and the root are never a project: a ``~/.git`` is a dotfiles repository, and a
    store there would quietly gather the receipts of every folder under it.
    """
    never = {Path(folder.anchor)}
    with contextlib.suppress(RuntimeError, KeyError):  # no home directory to be found
        never.add(Path.home().resolve())
    for candidate in (folder, *folder.parents):
        if candidate in never:
            break
        if any((candidate / marker).exists() for marker in _MARKERS):
            return candidate, True
    return folder, False


def announcement(where: Path | str) -> str | None:
    """The line to say when the default store is about to be made at ``where``: where it is and why
    there.  None when it exists already, or when ``$PLAYBOOK_HOME`` named it (the user chose)."""
    if not isinstance(where, Path) or os.environ.get("PLAYBOOK_HOME") or (where / FILE).exists():
        return None
    folder, found = project_of(where.parent)
    why = (
        f"the project's store, for {folder}"
        if found
        else f"no pyproject.toml or .git in {folder} or above it"
    )
    return f"playbook: keeping receipts in {where} ({why}); pass store= or set $PLAYBOOK_HOME to keep them elsewhere"


def open_backend(
    location: str | os.PathLike[str],
    *,
    readonly: bool = False,
    notify: Callable[[str], None] | None = None,
    durability: str | None = None,
) -> Backend:
    """The backend for a directory (SQLite), a ``redis://`` URL, or ``"memory"``; ``durability``
    (``"strict"``, the default, or ``"best-effort"``): see ``ReceiptStore``."""
    text = os.fspath(location)
    if is_url(location) and text != "memory":
        from playbook.store.redis.backend import RedisBackend

        scheme, rest = text.split(":", 1)
        return RedisBackend(
            scheme.lower() + ":" + rest, readonly=readonly, durability=durability, notify=notify
        )
    if durability not in (None, *DURABILITIES):
        raise StoreFailure(
            f"durability={durability!r} is not one of {', '.join(map(repr, DURABILITIES))}", "EINVAL"
        )
    if text == "memory":
        from playbook.store.memory import MemoryBackend

        return MemoryBackend()
    from playbook.store.sqlite import SqliteBackend

    return SqliteBackend(Path(text), readonly=readonly, notify=notify, synced=durability != "best-effort")
