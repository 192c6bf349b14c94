"""What a watcher of a run's calls hears: each call as the play made it, and what it cost and took.

The pipeline tells a :class:`CallObserver` (``RunScope.observer``, set by a pilot) of every call a
row makes (:class:`Called`: its inputs, before any receipt is looked up), every answer counted, and
every request sent and back.  The estimate's pilot log implements it; the calls room knows nothing
of the estimate built on what it hears.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from playbook.tools.protocol import Spent, ToolEngine

__all__ = ["CallObserver", "Called", "Observers", "joined"]


class Called(NamedTuple):
    """A call as the play made it: its positional input, keywords, ttl, and whether it was refreshed
    (paid for again)."""

    input: Any
    kwargs: dict[str, Any]
    ttl: float | None
    refreshed: bool


class CallObserver(Protocol):
    """What the pipeline and the ledger tell a watcher of the calls, row by row."""

    def called(self, position: int, tool: ToolEngine, occurrence: tuple[str, int], call: Called) -> None:
        """Row ``position`` calls ``tool`` with these inputs (``occurrence``: the row's id and the
        call's place among its calls of the tool)."""

    def counted(
        self, position: int, tool: ToolEngine, reused: bool, spent: Spent, shared: bool = False
    ) -> None:
        """A call answered: paid now, or reused from a receipt (``shared``: one this run paid for)."""

    def began(self, position: int, tool: ToolEngine) -> float:
        """A request to the tool is sent now; returns when (the observer's clock)."""

    def sent(
        self,
        position: int,
        tool: ToolEngine,
        began: float,
        *,
        failed: bool,
        refused: bool = False,
        status: int | None = None,
    ) -> None:
        """The request sent at ``began`` came back (``refused``: with a client error kept as the
        call's answer) or failed with nothing to keep (``status``: the HTTP status it failed with,
        if it had one)."""


class Observers:
    """Several watchers of the calls as one (a pilot's log and the run's telemetry): each hears
    every call; a request's start is the first's (each reads ``time.monotonic``)."""

    __slots__ = ("each",)

    def __init__(self, *each: CallObserver) -> None:
        self.each = each

    def __repr__(self) -> str:
        return f"<Observers {self.each!r}>"

    def called(self, position: int, tool: ToolEngine, occurrence: tuple[str, int], call: Called) -> None:
        for one in self.each:
            one.called(position, tool, occurrence, call)

    def counted(
        self, position: int, tool: ToolEngine, reused: bool, spent: Spent, shared: bool = False
    ) -> None:
        for one in self.each:
            one.counted(position, tool, reused, spent, shared)

    def began(self, position: int, tool: ToolEngine) -> float:
        starts = [one.began(position, tool) for one in self.each]  # each keeps its own note of it
        return starts[0]

    def sent(
        self,
        position: int,
        tool: ToolEngine,
        began: float,
        *,
        failed: bool,
        refused: bool = False,
        status: int | None = None,
    ) -> None:
        for one in self.each:
            one.sent(position, tool, began, failed=failed, refused=refused, status=status)


def joined(first: CallObserver | None, second: CallObserver | None) -> CallObserver | None:
    """``first`` and ``second`` as one watcher (either may be ``None``)."""
    if first is None or second is None:
        return first if second is None else second
    return Observers(first, second)
