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

__all__ = ["CallObserver", "Called"]


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
        self, position: int, tool: ToolEngine, began: float, *, failed: bool, refused: bool = False
    ) -> None:
        """The request sent at ``began`` came back (``refused``: with a client error kept as the
        call's answer) or failed with nothing to keep."""
