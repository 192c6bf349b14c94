"""What the runtime tells its views, as it happens: a row started, a call finished, a provider
held its rows...  Events are named tuples: the runtime emits several per row and a view only reads
them, so they must be immutable and cheap (a tuple costs a fifth of a frozen dataclass) rather
than validated like the records of :mod:`playbook.records`.
"""

from __future__ import annotations

from typing import NamedTuple

from playbook.records import Status

__all__ = [
    "CallFailed",
    "CallFinished",
    "Event",
    "KeyRetired",
    "ProviderDown",
    "ProviderHoldLifted",
    "ProviderHoldSet",
    "ProviderUp",
    "RateChanged",
    "RowDeferred",
    "RowFinished",
    "RowHeld",
    "RowParked",
    "RowRequeued",
    "RowResumed",
    "RowSleeping",
    "RowStarted",
    "RunCounted",
    "RunFinished",
    "RunNotice",
    "RunProgress",
    "RunStarted",
    "WaterfallFinished",
]


class RunStarted(NamedTuple):
    """An execution starts: ``total`` rows join the run's count (a run's first execution, its
    frame's rows; a retry's, the rows it runs again; a pilot's further round, the rows it adds)."""

    run_id: str
    play: str
    total: int


class RunCounted(NamedTuple):
    """Rows join the run's count (``rows`` < 0: rows it leaves out after all: the rows a pilot
    does not sample; > 0: a declined estimate's rows, settled as skipped)."""

    rows: int


class RowStarted(NamedTuple):
    position: int


class CallFinished(NamedTuple):
    tool: str
    provider: str | None
    reused: bool
    cost: float
    local: bool = False  # a free call that never left the process (no provider, no cost, not HTTP)
    shared: bool = False  # reused from a receipt written during this run (an identical call of another row)
    tokens: float = 0.0  # a paid call: the tokens its answer counted (an LLM's usage)
    unpriced: bool = False  # its model has no price: ``cost`` is 0 and says nothing
    position: int = -1  # the row that made the call (-1: not known)


class CallFailed(NamedTuple):
    """A request sent that brought back nothing to keep (a 5xx, a timeout, a 429): the provider
    saw it, and may count it."""

    tool: str
    provider: str | None
    position: int = -1  # the row that sent it (-1: not known)


class RowFinished(NamedTuple):
    position: int
    status: Status
    error: str | None
    copies: int = 1  # rows with the same key share this outcome
    ran: bool = True  # False for rows settled without running (reused, skipped)
    held: bool = False  # the row was waiting in the retry queue (settled by a stop)
    calls: int = 0  # a reused row: the calls its memo saved (all reused)
    cost: float = 0.0  # and what they cost
    group: str | None = None  # a failed row: its error's group (see playbook.runtime.rows.grouping)
    # Money this attempt paid that bought nothing kept: all it paid, when the row failed; else
    # what answers validation refused cost (run.stats.cost_failed).
    cost_failed: float = 0.0
    unpriced: int = 0  # a reused row: of its calls, those with no price (not in ``cost``)


class RowHeld(NamedTuple):
    """A row stepped aside: it waits for ``provider`` (``"sleep"`` in ``ctx.sleep``) until ``until``
    (epoch seconds)."""

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


class KeyRetired(NamedTuple):
    """One key of a provider's pool is out of the pool for this run: refused (401/402/403), or its
    variable is not set in this process.  The provider's other keys carry its calls."""

    provider: str
    key: str  # the key as shown: its variable and its last characters
    why: str  # "HTTP 401", or "its variable is not set here"
    left: int  # keys still in the pool

    def said(self) -> str:
        """What a user hears of it, said as what happened: it stays among a run's notices after a
        retry or the next run has tried the key again."""
        said = f"provider {self.provider!r}: key {self.key} left the pool for the run ({self.why}); "
        if self.left:
            return said + f"{self.left} other key(s) went on"
        return said + "no key was left, so the run stopped (run.retry() tries every key again)"


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


class RowSleeping(NamedTuple):
    """A row stepped aside in ``ctx.sleep``: it wakes at ``until`` (epoch seconds).  A sleep is
    not a provider's hold: no provider, whatever its name, holds a sleeping row."""

    position: int
    until: float


class RunProgress(NamedTuple):
    """The counters moved without a row event here: a cluster's workers reported (``done`` rows now)."""

    done: int


# Every event a run emits (one name: ``playbook.runtime.state.reading.RunEvent`` was the same).
Event = (
    RunStarted
    | RunCounted
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
    | KeyRetired
    | WaterfallFinished
    | RunNotice
    | RowSleeping
    | RowDeferred
    | RunProgress
)
