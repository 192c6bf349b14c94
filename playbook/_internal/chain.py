"""A chain of runs over one frame (a run, its retry, the retry's retry...): which is the latest."""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

__all__ = ["Chain"]

R = TypeVar("R")


class Chain(Generic[R]):
    """Shared by the runs of a chain: the latest of them, held weakly (a run its user dropped
    goes; a run holding itself through this would be a cycle)."""

    __slots__ = ("_latest",)

    def __init__(self, first: R) -> None:
        self._latest = weakref.ref(first)

    def __repr__(self) -> str:
        return f"<Chain latest={self._latest()!r}>"

    def follow(self, run: R) -> None:
        """``run`` (a retry) is the latest now."""
        self._latest = weakref.ref(run)

    def latest(self, asking: R) -> R:
        """The latest run (``asking`` when that one is gone: nothing can be running after it)."""
        found = self._latest()
        return found if found is not None else asking
