"""Records that cross a boundary: receipts on disk, run statistics, holds, row outcomes, events.

Persisted and user-facing records (receipts, run statistics, holds) are pydantic models (validated, documented fields).  Events are
named tuples instead: the runtime emits several per row and a view only reads them, so they must
be immutable and cheap (a tuple costs a fifth of a frozen dataclass) rather than validated.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

__all__ = [
    "CallFinished",
    "Event",
    "ProviderHold",
    "Receipt",
    "RowFinished",
    "RowRequeued",
    "RowStarted",
    "RunFinished",
    "RunStarted",
    "RunStats",
    "Status",
]

Status = Literal["ok", "reused", "failed", "parked", "skipped"]


class Receipt(BaseModel):
    """One paid-for tool result as stored on disk (JSON).  ``miss`` marks a "not found" answer."""

    model_config = ConfigDict(frozen=True)

    key: str
    tool: str
    version: str
    account: str
    input: Any
    output: Any
    miss: bool
    cost: float
    created_at: float


class RunStats(BaseModel):
    """Counts of a run at one moment; ``elapsed`` in seconds."""

    model_config = ConfigDict(frozen=True)

    total: int = 0
    ok: int = 0
    reused: int = 0
    failed: int = 0
    parked: int = 0
    skipped: int = 0
    calls_executed: int = 0
    calls_reused: int = 0
    cost_spent: float = 0.0
    cost_saved: float = 0.0
    elapsed: float = 0.0

    @property
    def done(self) -> int:
        """Rows that reached a final status."""
        return self.ok + self.reused + self.failed + self.parked + self.skipped


class ProviderHold(BaseModel):
    """A provider that holds rows back: until when, how many rows wait, the last status seen."""

    model_config = ConfigDict(frozen=True)

    provider: str
    until: float
    waiting_rows: int
    last_status: int | None = None


class RunStarted(NamedTuple):
    run_id: str
    play: str
    total: int


class RowStarted(NamedTuple):
    position: int


class CallFinished(NamedTuple):
    tool: str
    provider: str | None
    reused: bool
    cost: float


class RowFinished(NamedTuple):
    position: int
    status: Status
    error: str | None
    copies: int = 1  # rows with the same key share this outcome
    ran: bool = True  # False for rows settled without running (reused, skipped)


class RowRequeued(NamedTuple):
    """A settled row admitted again (``run.retry()``); its old status no longer counts."""

    position: int
    previous: Status
    copies: int = 1


class RunFinished(NamedTuple):
    run_id: str
    stopped: bool


Event = RunStarted | RowStarted | CallFinished | RowFinished | RowRequeued | RunFinished
