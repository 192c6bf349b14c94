"""What a row's context and its calls may use of the run, and nothing more.

The scheduler builds one :class:`RunScope` per run and hands it to every ``ctx``; the call
pipeline reaches the store, the cost budget, the providers' tickets and the run's events
through it.  Nothing here knows the scheduler: a stop or a fatal error is a callable it gave.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import httpx

from playbook._internal.flow import Parked, WaitBudget
from playbook._internal.words import money
from playbook.errors import RunFatal
from playbook.events import CallFailed, CallFinished, Event, WaterfallFinished
from playbook.providers.provider import Ticket
from playbook.runtime.calls.batching import Batches
from playbook.runtime.calls.jobs import Jobs
from playbook.runtime.calls.level import Level
from playbook.runtime.rows.table import RowTable
from playbook.tools.protocol import ToolEngine, is_local
from playbook.tools.transport import default_client

if TYPE_CHECKING:
    from playbook.providers.provider import Provider
    from playbook.runtime.calls.observed import CallObserver
    from playbook.store import StoreEngine
    from playbook.store.fixtures import Fixtures, Recorder, Replay

__all__ = ["Ahead", "CostBudget", "Landing", "RunScope", "Tickets", "said_once"]

_SAID: ContextVar[set[str] | None] = ContextVar("said", default=None)


@contextlib.contextmanager
def said_once() -> Iterator[None]:
    """The runs started inside say each of what their plays read and cannot count once between
    them, not once each: the command line's runs over a file's chunks are one command."""
    token = _SAID.set(set())
    try:
        yield
    finally:
        _SAID.reset(token)


class CostBudget:
    """``max_cost``: paid calls are counted against it before they are sent, at their estimate,
    and at their real cost once answered.  A call that does not fit while others are in flight
    waits for them to settle (they may cost less than reserved); with none in flight, its row parks."""

    __slots__ = ("limit", "committed", "pending", "_settled")

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.committed = 0.0
        self.pending = 0  # calls reserved and not yet settled
        self._settled: asyncio.Event | None = None

    def __repr__(self) -> str:
        limit = "unlimited" if self.limit is None else money(self.limit)
        return f"<CostBudget {money(self.committed)} of {limit} ({self.pending} in flight)>"

    async def reserve(self, tool: ToolEngine, cost: float | None, *, wait: bool = True) -> None:
        """Count a paid call's expected ``cost`` before dispatch; park the row if it won't fit
        (``wait``: once the calls in flight have settled).  A call with no price stops the run
        before it goes: the budget could not count it."""
        if self.limit is None:
            return
        if cost is None:
            raise unpriced(tool, self.limit)
        if not cost:
            return
        while not self.take(cost):
            if not (wait and self.pending):
                raise Parked(
                    "budget",
                    f"budget: calling {tool.name!r} (cost {money(cost)}) would pass max_cost={money(self.limit)}",
                )
            if self._settled is None:
                self._settled = asyncio.Event()
            await self._settled.wait()
        self.pending += 1

    def take(self, cost: float) -> bool:
        """Count ``cost`` as committed if it fits under the limit; False (and nothing counted) if not."""
        if self.committed + cost > self.limit + 1e-9:  # type: ignore[operator]  # called with a limit
            return False
        self.committed += cost
        return True

    def add(self, amount: float) -> None:
        """Count ``amount`` more as committed (less, when negative)."""
        self.committed += amount

    def refund(self, cost: float | None) -> None:
        """A reserved call did not complete: give its cost back."""
        if cost and self.limit is not None:
            self.add(-cost)
            self._done()

    def charge(self, reserved: float | None, cost: float | None) -> None:
        """A call reserved at ``reserved`` was answered and cost ``cost``: the budget counts that
        instead (so a budget is passed by at most what the calls in flight cost over their estimates)."""
        if self.limit is not None and reserved is not None:
            if cost is not None and cost != reserved:
                self.add(cost - reserved)
            if reserved:
                self._done()

    def _done(self) -> None:
        self.pending -= 1
        if self._settled is not None:
            self._settled.set()
            self._settled = None


def unpriced(tool: ToolEngine, limit: float) -> RunFatal:
    """``max_cost`` met a call it cannot count: a tool whose model has no price."""
    model = getattr(tool, "model", None)
    which = f"model {model!r}" if isinstance(model, str) else "its calls"
    fix = (
        f"prices={{{model!r}: (usd_per_1M_input, usd_per_1M_output)}}" if isinstance(model, str) else "a cost"
    )
    return RunFatal(
        f"max_cost={money(limit)} cannot count tool {tool.name!r}: the price table has no price for {which} "
        f"(unpriced), so nothing of it was sent; give the tool {fix}, or run without max_cost",
        tool=tool.name,
    )


class Tickets:
    """Each logical call's standing with its provider (kept across the row's replays: a replayed
    call keeps its retry count), over its row's wait budget for that provider."""

    __slots__ = ("_table", "_max_wait", "_watch", "_tickets")

    def __init__(self, table: RowTable, max_wait: float | None, watch: Callable[[Provider], None]) -> None:
        self._table = table
        self._max_wait = max_wait  # the run's override of the providers' own max_wait
        self._watch = watch  # the run follows each provider its rows call
        self._tickets: dict[str, Ticket] = {}

    def __repr__(self) -> str:
        return f"<Tickets {len(self._tickets)} calls>"

    def budget(self, pos: int, provider: Provider) -> WaitBudget:
        """The wait row ``pos`` has left on ``provider``, until it settles."""
        self._watch(provider)
        budgets = self._table.budgets.get(pos)
        if budgets is None:
            budgets = self._table.budgets[pos] = {}
        found = budgets.get(provider.name)
        if found is None:
            wait = self._max_wait if self._max_wait is not None else provider.max_wait
            found = budgets[provider.name] = WaitBudget(wait)
        return found

    def get(self, call_id: str, tool: ToolEngine, pos: int, request: str | None = None) -> Ticket:
        """``request``: the call's address, by which its provider knows a request that failed on
        its own."""
        found = self._tickets.get(call_id)
        if found is None:
            assert tool.provider is not None
            found = self._tickets[call_id] = Ticket(
                tool.name, self.budget(pos, tool.provider), request=request
            )
        return found

    def done(self, call_id: str) -> None:
        self._tickets.pop(call_id, None)


class Landing:
    """Rows whose call is being sent and recorded: a stop lets them land the receipt first."""

    __slots__ = ("tasks", "stopping")

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stopping = False

    def __repr__(self) -> str:
        return f"<Landing {len(self.tasks)} calls{' stopping' if self.stopping else ''}>"

    def enter(self) -> asyncio.Task[Any]:
        """A call is about to be sent (then recorded): a stop now leaves this row's task to land
        the receipt (see :meth:`leave`).  Returns the task, to give back to :meth:`leave`."""
        if self.stopping:
            # Nothing new goes out after a stop, a retry of a call that failed meanwhile included:
            # past the grace period its answer would be cut off, paid for and never written.
            raise asyncio.CancelledError("the run was stopped before this call was sent")
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        return task

    def leave(self, task: asyncio.Task[Any], landed: bool) -> None:
        """The call was recorded (``landed``) or failed: a stop meanwhile stops the row here (it
        is settled as skipped).  Kept apart from ``enter`` rather than a context manager: it is
        on every call's path."""
        self.tasks.discard(task)
        if landed and self.stopping:
            raise asyncio.CancelledError("the run was stopped; this call's receipt is written")


class Ahead:
    """Whether a call's receipt is looked up before its lease is taken, learnt per tool from the
    run's calls.

    Looked up first, a call that has its receipt (a replay) takes no lease.  Leased first, a call
    that has none (a first run) is looked up once instead of twice: the receipt is looked up once
    the lease is held in either order (another process may have paid meanwhile), so no order pays
    twice; a wrong guess costs a lookup or a lease, no more.
    """

    __slots__ = ("_found",)

    FIRST = 0.25  # looked up first while at least this share of a tool's recent calls had their receipt

    def __init__(self) -> None:
        self._found: dict[str, float] = {}  # tool -> share of its recent calls that had a receipt

    def __repr__(self) -> str:
        return f"<Ahead {self._found!r}>"

    def first(self, tool: str) -> bool:
        return self._found.get(tool, 1.0) >= self.FIRST

    def learn(self, tool: str, found: bool) -> None:
        """A call of ``tool`` had its receipt (``found``) or not: about the last sixteen count."""
        share = self._found.get(tool, 1.0)
        self._found[tool] = share + (found - share) / 16


class RunScope:
    """The run as one row's calls see it: identity, store, budgets, tickets, events."""

    __slots__ = (
        "run_id",
        "play",
        "store",
        "clock",
        "refresh_all",
        "emit",
        "costs",
        "tickets",
        "landing",
        "batches",
        "jobs",
        "label",
        "_fatal",
        "_refreshed",
        "_client",
        "replay",
        "recorder",
        "rerun_rows",
        "fresh",
        "started",
        "ahead",
        "observer",
        "plays",
        "said",
        "level",
    )

    def __init__(
        self,
        *,
        run_id: str,
        play: str,
        store: StoreEngine,
        refresh_all: bool,
        rerun_rows: bool = False,
        emit: Callable[[Event], None],
        costs: CostBudget,
        tickets: Tickets,
        label: Callable[[int], Any],
        fatal: Callable[[BaseException], None],
        fixtures: Fixtures | None = None,
        level: Level,
        fresh: Callable[[int], bool] = lambda pos: False,
    ) -> None:
        self.run_id = run_id
        self.play = play
        self.store = store
        self.clock = store.clock  # receipts' and sleeps' times
        self.started = self.clock()  # a receipt written since was paid for in this run (calls shared)
        self.refresh_all = refresh_all  # refresh=True: every call is paid for again
        self.rerun_rows = rerun_rows  # refresh="rows" or True: no row (or sub-play) is reused from its memo
        self.emit = emit
        self.costs = costs
        self.tickets = tickets
        self.landing = Landing()
        self.batches = Batches()
        self.jobs = Jobs(self.batches.track)
        self.label = label  # position -> index label, for messages
        self._fatal = fatal
        # Are rows waiting that were never started (and has row ``pos`` not stepped back before)?
        # Then a row whose call another process is paying for steps back for one of them instead
        # of waiting on that process's lease.
        self.fresh = fresh
        self.level = level  # rows in flight: its calls tell it how long they wait for their providers
        self._refreshed: set[str] = set()
        self.ahead = Ahead()  # a call's receipt looked up before its lease, or after it only
        self._client: httpx.AsyncClient | None = None
        # Fixtures: a replay answers every call (no store, no provider); a recorder sees every answer.
        self.replay: Replay | None = fixtures.replay if fixtures is not None else None
        self.recorder: Recorder | None = fixtures.recorder if fixtures is not None else None
        # A pilot's log (estimate.pilot.PilotLog): each row's calls, what they cost and took.
        self.observer: CallObserver | None = None
        # The sub-plays run so far, as they were when this run first ran each (what they read is
        # read once per run, not per row), with what they were made from (kept: its id is the key).
        self.plays: dict[int, tuple[Any, Any]] = {}
        # the values read that the plays' notes said in this run (each once), or in the command's runs
        said = _SAID.get()
        self.said: set[str] = set() if said is None else said

    def __repr__(self) -> str:
        return f"<RunScope {self.run_id} {self.play!r}>"

    def must_refresh(self, logical: str) -> bool:
        """True until a logical call asked with ``refresh`` (or every call, under ``refresh=True``)
        has been paid for in this run: a row replayed after a hold does not pay for it again, and
        one held before it was paid still pays for it again."""
        return logical not in self._refreshed

    def refreshed(self, logical: str) -> None:
        self._refreshed.add(logical)

    def http_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = default_client()
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def call_finished(
        self,
        tool: ToolEngine,
        reused: bool,
        cost: float,
        shared: bool = False,
        tokens: float = 0.0,
        unpriced: bool = False,
        position: int = -1,
    ) -> None:
        provider = tool.provider.name if tool.provider is not None else None
        if reused:  # neither local nor its tokens: those were counted when it was paid
            local, tokens = False, 0.0
        else:
            local, shared = is_local(tool, None if unpriced else cost), False
        # tuple.__new__: a C call (CallFinished(...) is a Python one), on the path of every call
        self.emit(
            tuple.__new__(
                CallFinished, (tool.name, provider, reused, cost, local, shared, tokens, unpriced, position)
            )
        )

    def call_failed(self, tool: ToolEngine, position: int = -1) -> None:
        """A request went out and brought back nothing to keep (a 5xx, a timeout, a 429)."""
        self.emit(CallFailed(tool.name, tool.provider.name if tool.provider is not None else None, position))

    def waterfall_done(self, key: str, tools: Sequence[str], outcomes: list[str]) -> None:
        outcomes = outcomes + ["never"] * (len(tools) - len(outcomes))
        self.emit(WaterfallFinished(key, tuple(tools), tuple(outcomes)))

    def fatal_stop(self, exc: BaseException) -> None:
        """A fatal error (bad credentials, no credit): dispatch nothing more, stop the other rows now."""
        self._fatal(exc)
