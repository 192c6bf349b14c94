"""Records that cross a boundary: receipts on disk, run statistics, holds, row outcomes, events.

Persisted and user-facing records (receipts, run statistics, holds) are pydantic models (validated, documented fields).  Events are
named tuples instead: the runtime emits several per row and a view only reads them, so they must
be immutable and cheap (a tuple costs a fifth of a frozen dataclass) rather than validated.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

__all__ = [
    "CallFailed",
    "CallFinished",
    "Event",
    "ProviderDown",
    "ProviderHold",
    "ProviderHoldLifted",
    "ProviderHoldSet",
    "ProviderUp",
    "RateChanged",
    "Receipt",
    "RowFinished",
    "RowHeld",
    "RowParked",
    "RowRequeued",
    "RowResumed",
    "RowStarted",
    "RunFinished",
    "RunNotice",
    "RunStarted",
    "RunStats",
    "Status",
    "WaterfallFinished",
]


def time_of_day(epoch: float) -> str:
    """The local time of day of an epoch timestamp: how a hold's or a parked row's deadline reads;
    with its date when that is not today ("Dec 03 21:13:52": a two-day hold must not read as five minutes)."""
    when = time.localtime(epoch)
    same_day = when[:3] == time.localtime()[:3]
    return time.strftime("%H:%M:%S" if same_day else "%b %d %H:%M:%S", when)


def short_count(n: float) -> str:
    """12 / 9,500 / 28.4k / 1.2M / 3.4G: a count at a glance."""
    if n < 1e4:
        return f"{n:,.0f}"
    unit, size = next((u, size) for u, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)) if n >= size)
    return f"{n / size:.3g}{unit}"


def duration(seconds: float) -> str:
    """45s / 2m 10s / 3h 05m / 2d 4h."""
    s = round(seconds) if math.isfinite(seconds) and seconds > 0 else 0
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


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
    held: int = 0
    calls_executed: int = 0  # calls paid for: sent to a provider, or with a cost
    calls_reused: int = 0  # calls answered by receipts of earlier runs
    calls_shared: int = 0  # identical calls answered by a receipt this run paid for (another row's)
    calls_failed: int = 0  # requests sent that brought back nothing to keep (5xx, timeouts, 429s)
    calls_local: int = 0  # calls of free local tools (no provider, no cost) that ran
    cost_spent: float = 0.0
    cost_saved: float = 0.0
    elapsed: float = 0.0
    receipts_lost: int = 0  # paid calls whose receipts could not be written (the store failed)

    @property
    def done(self) -> int:
        """Rows that reached a final status."""
        return self.ok + self.reused + self.failed + self.parked + self.skipped


class ProviderHold(BaseModel):
    """A provider that holds rows back: until when (epoch seconds), how many rows wait on it
    (held in this run, or parked until it lets calls through again), the last status seen."""

    model_config = ConfigDict(frozen=True)

    provider: str
    until: float | None
    waiting_rows: int
    parked_rows: int = 0
    last_status: int | None = None
    reason: str = "hold"  # "hold": the provider asked to wait; "down": it refuses connections or keeps failing
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
    local: bool = False  # a free call that never left the process (no provider, no cost, not HTTP)
    shared: bool = False  # reused from a receipt written during this run (an identical call of another row)


class CallFailed(NamedTuple):
    """A request sent that brought back nothing to keep (a 5xx, a timeout, a 429): the provider
    saw it, and may count it."""

    tool: str
    provider: str | None


class RowFinished(NamedTuple):
    position: int
    status: Status
    error: str | None
    copies: int = 1  # rows with the same key share this outcome
    ran: bool = True  # False for rows settled without running (reused, skipped)
    held: bool = False  # the row was waiting in the retry queue (settled by a stop)
    calls: int = 0  # a reused row: the calls its memo saved (all reused)
    cost: float = 0.0  # and what they cost
    group: str | None = None  # a failed row: its error's group (see playbook.runtime.grouping)


class RowHeld(NamedTuple):
    """A row stepped aside: it waits for ``provider`` (``"sleep"`` in ``ctx.sleep``) until ``until`` (epoch seconds)."""

    position: int
    provider: str
    until: float
    status: int | None


class RowResumed(NamedTuple):
    """A held row is re-admitted at its deadline."""

    position: int


class RowDeferred(NamedTuple):
    """A row stepped back (another process is paying for one of its calls): it runs again once
    the rows not started yet are taken, from the receipts that process writes."""

    position: int


class RowParked(NamedTuple):
    """A row left this run (followed by its ``RowFinished``): why, on which provider, until when."""

    position: int
    reason: str
    provider: str | None
    ready_at: float | None


class ProviderHoldSet(NamedTuple):
    provider: str
    until: float  # epoch seconds
    status: int | None


class ProviderHoldLifted(NamedTuple):
    provider: str


class RateChanged(NamedTuple):
    provider: str
    rate: float | None  # calls per second; None while unlimited
    concurrency: int | None = None  # calls in flight it allows now (configured or discovered); None: no bound


class ProviderDown(NamedTuple):
    """The provider refuses connections or keeps failing: rows waiting on it park ("down") and
    one probe call at a time tests whether it is back."""

    provider: str
    error: str  # the last failure, in words


class ProviderUp(NamedTuple):
    """A probe call went through: the provider takes calls again."""

    provider: str


class WaterfallFinished(NamedTuple):
    """One waterfall evaluated: each leg's outcome (hit, miss, unavailable, not reached)."""

    key: str
    tools: tuple[str, ...]
    outcomes: tuple[str, ...]


class RowRequeued(NamedTuple):
    """A settled row admitted again (``run.retry()``); its old status no longer counts."""

    position: int
    previous: Status
    copies: int = 1


class RunFinished(NamedTuple):
    run_id: str
    stopped: bool


class RunNotice(NamedTuple):
    """Something the user must hear about the run as a whole (the store failed, was replaced...);
    ``lost``: paid calls whose receipts could not be written."""

    message: str
    lost: int = 0


Event = (
    RunStarted
    | RowStarted
    | CallFinished
    | CallFailed
    | RowFinished
    | RowRequeued
    | RunFinished
    | RowHeld
    | RowResumed
    | RowParked
    | ProviderHoldSet
    | ProviderHoldLifted
    | RateChanged
    | ProviderDown
    | ProviderUp
    | WaterfallFinished
    | RunNotice
)


class RowSleeping(NamedTuple):
    """A row stepped aside in ``ctx.sleep``: it wakes at ``until`` (epoch seconds).  A sleep is
    not a provider's hold: no provider, whatever its name, holds a sleeping row."""

    position: int
    until: float


class RunProgress(NamedTuple):
    """The counters moved without a row event here: a cluster's workers reported (``done`` rows now)."""

    done: int


__all__ += ["RowDeferred", "RowSleeping", "RunProgress", "duration", "short_count", "time_of_day"]
