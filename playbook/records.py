"""The records a user reads and the store keeps: receipts, run statistics, the providers rows wait on, a row's
status.  They are pydantic models: validated, with documented fields, and their JSON is stable.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from playbook._internal.renamed import renamed
from playbook._internal.words import time_of_day

__all__ = ["STATUSES", "STATUS_COLUMNS", "ProviderWait", "Receipt", "RunStats", "Status"]


Status = Literal["ok", "reused", "failed", "parked", "skipped"]
STATUSES: tuple[Status, ...] = get_args(Status)
# The columns playbook writes into a result, beside the play's own.
STATUS_COLUMNS = ("play_status", "play_error")


class Receipt(BaseModel):
    """One paid-for tool result as stored on disk (JSON).  ``address``: where the store keeps it
    (:mod:`playbook.addresses`); ``miss`` marks a "not found" answer."""

    model_config = ConfigDict(frozen=True)

    address: str
    tool: str
    version: str
    account: str
    input: Any
    output: Any
    miss: bool
    cost: float
    created_at: float

    def __getattr__(self, name: str) -> Any:
        if name == "key":  # deprecated ("key" is an API key's word); not in dir(), still read
            renamed("Receipt.key", "Receipt.address")
            return self.address
        return super().__getattr__(name)  # type: ignore[misc]


class RunStats(BaseModel):
    """Counts of a run at one moment; ``elapsed`` in seconds."""

    model_config = ConfigDict(frozen=True)

    total: int = 0
    ok: int = 0
    reused: int = 0
    failed: int = 0
    parked: int = 0
    skipped: int = 0
    # rows stepped aside now: waiting for a provider (its hold, or while it is down) or in ctx.sleep
    waiting: int = 0
    calls_executed: int = 0  # calls paid for: sent to a provider, or with a cost
    calls_reused: int = 0  # calls answered by receipts of earlier runs
    calls_shared: int = 0  # identical calls answered by a receipt this run paid for (another row's)
    calls_failed: int = 0  # requests sent that brought back nothing to keep (5xx, timeouts, 429s)
    calls_local: int = 0  # calls of free local tools (no provider, no cost) that ran
    # what the paid calls' answers counted (an LLM's usage; a tool that counts none adds nothing)
    tokens: int = 0
    cost_spent: float = 0.0
    cost_saved: float = 0.0
    # of cost_spent: paid for calls of rows that failed, or for answers validation refused
    cost_failed: float = 0.0
    # calls whose model has no price (unpriced): paid (of calls_executed) and reused; their cost is
    # not known, so it is in neither cost_spent nor cost_saved
    calls_unpriced: int = 0
    reused_unpriced: int = 0
    elapsed: float = 0.0
    receipts_lost: int = 0  # paid calls whose receipts could not be written (the store failed)

    def __getattr__(self, name: str) -> Any:
        if name == "held":  # deprecated ("hold" is a provider's; rows wait); not in dir(), still read
            renamed("RunStats.held", "RunStats.waiting")
            return self.waiting
        return super().__getattr__(name)  # type: ignore[misc]

    @property
    def done(self) -> int:
        """Rows that reached a final status."""
        return self.ok + self.reused + self.failed + self.parked + self.skipped


class ProviderWait(BaseModel):
    """A provider that rows wait on, for one of two reasons: its hold (``reason="hold"``: it asked
    to wait, ``until`` then, epoch seconds) or it is down (``reason="down"``: it refuses
    connections or keeps failing; ``until`` its next probe, ``error`` why).  How many rows wait
    on it (waiting in this run, or parked until it lets calls through again), the last status."""

    model_config = ConfigDict(frozen=True)

    provider: str
    until: float | None
    waiting_rows: int
    parked_rows: int = 0
    last_status: int | None = None
    # "hold": the provider asked to wait; "down": it refuses connections or keeps failing
    reason: str = "hold"
    error: str | None = None  # a down provider: the failure that took it down, in words

    def __str__(self) -> str:
        status = f", last status {self.last_status}" if self.last_status is not None else ""
        rows = f"{self.waiting_rows} rows waiting ({self.parked_rows} parked)"
        if self.reason == "down":
            why = f" ({self.error.strip().splitlines()[0]})" if self.error and self.error.strip() else ""
            probe = "" if self.until is None else ", next probe at " + time_of_day(self.until)
            return f"{self.provider}: down{why}{probe}, {rows}{status}"
        when = "no hold now" if self.until is None else "until " + time_of_day(self.until)
        return f"{self.provider}: {when}, {rows}{status}"
