"""``ctx``: what a play uses to call tools (and steps, sleeps, sub-plays).  One per row attempt.

Each call has a *logical identity* (run, row, tool, occurrence): the n-th call of a tool in a
row.  A row that is replayed re-enters with the same identities, so its earlier calls hit their
receipts and a call made with ``refresh=True`` is paid for again once per run, not once per replay.

``ctx.tool(...)`` and its siblings remember the line that called them, so a coroutine that was
never awaited (``domain = ctx.tool(...)`` without ``await``) fails its row naming that line, and
is closed rather than left to warn at garbage collection.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from playbook._internal.flow import Sleeping, Suspend
from playbook._internal.renamed import keyword_renamed, old_attribute, renamed
from playbook.addresses import step_address, step_name
from playbook.errors import (
    PlaybookError,
    PlayDefinitionError,
    ProviderExhausted,
    ProviderUnavailable,
    RunFatal,
    ToolError,
)
from playbook.providers.provider import IN_PLACE
from playbook.runtime.calls.ledger import RowLedger
from playbook.runtime.calls.pipeline import call_tool
from playbook.runtime.calls.subplays import run_play
from playbook.store import MISSING
from playbook.store.records import record
from playbook.tagged import Unencodable, decode, encode
from playbook.tools import NO_INPUT, Tool

if TYPE_CHECKING:
    from playbook.runtime.calls.scope import RunScope

R = TypeVar("R")

__all__ = ["Context", "Leg", "ledger"]

_logger = logging.getLogger("playbook")


class _Unsaid:
    """``refresh=`` not given: false as ``False`` is (the call path only asks ``refresh or ...``),
    and shown as ``False`` in the signature, yet told apart from ``refresh=False`` when ``force=``,
    its old spelling, is given, at no cost to the calls that do not give it."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "False"


_UNSAID: Any = _Unsaid()


def ledger(ctx: Context) -> RowLedger:
    """What the runtime keeps behind ``ctx``."""
    return ctx._ledger


class Context:
    """Per-row handle: ``await ctx.tool(tool, ...)``, ``ctx.leg(...)`` and ``ctx.waterfall(...)``,
    ``ctx.step(...)``, ``ctx.sleep(...)``, ``ctx.run_play(...)``, ``ctx.log(...)``; who the row
    is: ``ctx.row_id``, ``ctx.run_id``, ``ctx.attempt``."""

    __slots__ = ("_ledger",)

    def __init__(self, scope: RunScope, row_id: str, position: int, attempt: int) -> None:
        self._ledger = RowLedger(scope, row_id, position, attempt)

    @property
    def row_id(self) -> str:
        """The row's identity: a digest of its ``id_columns``' values, or of all its input values."""
        return self._ledger.row_id

    @property
    def run_id(self) -> str:
        """The run this row attempt belongs to."""
        return self._ledger.scope.run_id

    @property
    def attempt(self) -> int:
        """How many times this row has started in this run before (0 the first time)."""
        return self._ledger.attempt

    def __getattr__(self, name: str) -> Any:
        return old_attribute(self, name, _OLD)

    def __repr__(self) -> str:
        book = self._ledger
        return f"<Context row={book.position} id={book.row_id[:8]} attempt={book.attempt} run={self.run_id}>"

    def log(self, msg: Any) -> None:
        """Note a message for this row: kept on the context and sent to the ``playbook`` logger."""
        book = self._ledger
        if book.logs is None:
            book.logs = []
        text = str(msg)
        book.logs.append(text)
        _logger.info("%s row %s: %s", book.scope.play, book.scope.label(book.position), text)

    def tool(
        self,
        tool: Tool[R],
        input: Any = NO_INPUT,
        /,
        *,
        refresh: bool = _UNSAID,
        ttl: float | None = None,
        on_exhausted: str = "park",
        **kwargs: Any,
    ) -> Coroutine[Any, Any, R]:
        """Call ``tool`` (await it): its receipt if one exists, else dispatch through its provider.

        ``refresh=True`` pays for the call again even when a receipt answers it (once per run: a
        row replayed after a hold does not pay again); ``ttl`` (seconds) takes older receipts
        for misses.

        A provider that cannot answer within the row's wait budget (held past ``max_wait``, or
        down past it) raises :class:`~playbook.errors.ProviderExhausted`, and the row *parks*
        even if the play catches it (a broad ``except`` cannot turn it into a finished row with a
        fallback value, memoised for good).  ``on_exhausted="raise"`` is the opt-in to handle it
        yourself: the play's ``except pb.ProviderExhausted:`` then decides, and what the row
        returns is its output.  (``ctx.waterfall`` falls through to its next leg as well.)
        """
        if not isinstance(tool, Tool):
            raise ToolError(
                f"ctx.tool() needs a tool made with @pb.tool or pb.http_tool, not {type(tool).__name__}"
            )
        if on_exhausted not in ("park", "raise"):
            # A mistake in the play, not in the row: it fails the row even if the play catches it.
            error = self._ledger.signal = PlayDefinitionError(
                f"ctx.tool({tool.name!r}): on_exhausted must be 'park' or 'raise', not {on_exhausted!r}"
            )
            raise error
        if "force" in kwargs:  # the old spelling (kept inline: ctx.tool is the hot path)
            refresh = _old_force(refresh, kwargs, "ctx.tool")
        return self._ledger.made_here(self._tool(tool, input, refresh, ttl, on_exhausted == "park", kwargs))

    async def _tool(
        self,
        tool: Tool[Any],
        input: Any,
        refresh: bool,
        ttl: float | None,
        parks: bool,
        kwargs: dict[str, Any],
    ) -> Any:
        # _call's work, in the one coroutine a call makes here (a frame less on every call)
        book = self._ledger
        if book.signal is not None:
            raise book.signal  # a suspension (or a park) the play caught: the row still steps aside
        try:
            got = call_tool(book, tool, input, refresh, ttl, kwargs)
            # a tuple: answered at once (a receipt on this machine), with no coroutine of its own
            return (got if isinstance(got, tuple) else await got)[0]
        except ProviderExhausted as exc:
            if parks:
                book.signal = exc  # sticky: the row parks even if the play catches it
            raise
        except Suspend as signal:
            book.signal = signal
            raise
        except RunFatal as exc:
            book.signal = exc
            book.scope.fatal_stop(exc)
            raise

    def run_play(self, play: Any, /, **inputs: Any) -> Coroutine[Any, Any, dict[str, Any]]:
        """Run another play as a step of this row (await it) over a row of ``inputs``; returns its
        output dict.  It has its own row memo (its fingerprint and inputs), so any play, or a map
        of it over a frame of those columns, reuses what it paid for; its holds and parks step
        this row aside, and its errors are this row's."""
        return self._ledger.made_here(self._run_play(play, inputs))

    def _child(self, row_id: str) -> tuple[Context, RowLedger]:
        """A context for a sub-play this row runs: its own row identity, this row's place (and so
        its wait budgets) and attempt."""
        book = self._ledger
        child = Context(book.scope, row_id, book.position, book.attempt)
        return child, child._ledger

    async def _run_play(self, play: Any, inputs: dict[str, Any]) -> Any:
        if self._ledger.signal is not None:
            raise self._ledger.signal
        try:
            return await run_play(self._ledger, play, inputs, self._child)
        except (Suspend, ProviderExhausted) as signal:
            self._ledger.signal = signal  # a sub-play that steps aside or parks takes this row with it
            raise
        except RunFatal as exc:
            self._ledger.signal = exc
            raise

    def leg(
        self,
        tool: Tool[Any],
        input: Any = NO_INPUT,
        /,
        *,
        refresh: bool = _UNSAID,
        ttl: float | None = None,
        **kwargs: Any,
    ) -> Leg:
        """A leg of :meth:`waterfall`: the call is made only if the waterfall reaches it (building
        it calls nothing).  Takes what :meth:`tool` takes."""
        if not isinstance(tool, Tool):
            raise ToolError(
                f"ctx.leg() needs a tool made with @pb.tool or pb.http_tool, not {type(tool).__name__}"
            )
        if "force" in kwargs:
            refresh = _old_force(refresh, kwargs, "ctx.leg")
        return Leg(tool, input, refresh, ttl, kwargs)

    @keyword_renamed("key", "name", "ctx.waterfall")
    def waterfall(
        self,
        name: str,
        legs: Sequence[Leg],
        *,
        accept: Callable[[Any], bool] = bool,
        with_source: bool = False,
    ) -> Coroutine[Any, Any, Any]:
        """Try ``legs`` in order (await it); the first accepted value wins (default: the first truthy one).

        A leg passes to the next when its value is not accepted, it is a miss, or its provider is
        unavailable or holds calls past the wait budget (it falls through at once, no waiting).
        If no leg is accepted the result is ``None``.  With ``with_source=True`` the result is
        ``(value, tool name)``, or ``(None, None)``.
        """
        return self._ledger.made_here(self._waterfall(name, legs, accept, with_source))

    async def _waterfall(
        self, name: str, legs: Sequence[Leg], accept: Callable[[Any], bool], with_source: bool
    ) -> Any:
        if not isinstance(name, str) or not name:
            raise PlayDefinitionError(
                f"ctx.waterfall(): the name must be a non-empty string naming the waterfall, not {name!r}"
            )
        legs = list(legs)
        if not legs:
            raise PlayDefinitionError(f"waterfall {name!r} needs at least one leg: ctx.leg(tool, ...)")
        for i, leg in enumerate(legs):
            if not isinstance(leg, Leg):
                raise PlayDefinitionError(
                    f"waterfall {name!r}: leg {i} is {type(leg).__name__}, not ctx.leg(tool, ...)"
                    + (
                        " (was it awaited? pass ctx.leg(...), not await ctx.tool(...))"
                        if not isinstance(leg, Tool)
                        else ""
                    )
                )
        outcomes: list[str] = []
        value: Any = None
        source: str | None = None
        try:
            for leg in legs:
                try:
                    out, miss = await self._call(
                        leg.tool, leg.input, leg.refresh, leg.ttl, leg.kwargs, leg=True
                    )
                except ProviderUnavailable:  # ProviderExhausted too: a long hold falls through at once
                    outcomes.append("unavailable")
                    continue
                if miss or not accept(out):
                    outcomes.append("miss")
                    continue
                outcomes.append("hit")
                value, source = out, leg.tool.name
                break
        except Exception:
            outcomes.append("error")
            self._ledger.scope.waterfall_done(name, [leg.tool.name for leg in legs], outcomes)
            raise
        self._ledger.scope.waterfall_done(name, [leg.tool.name for leg in legs], outcomes)
        return (value, source) if with_source else value

    @keyword_renamed("key", "name", "ctx.step")
    def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Coroutine[Any, Any, Any]:
        """Run ``fn(*args)`` once for this row and remember its value durably (await it).

        A replay (after a hold) or a rerun (after a crash, a restart or an edit of the play) gets
        the remembered value without running ``fn`` again: use it for side effects that must
        happen once, like submitting a job.  The value comes back exactly as first returned (a
        datetime as a datetime, a tuple as a tuple).  Steps are kept per play name, row and
        ``name`` (the n-th step with one name in a row is its own step); change the name to run a
        step afresh.
        """
        return self._ledger.made_here(self._step(name, fn, args))

    async def _step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self._ledger.signal is not None:
            raise self._ledger.signal
        if not isinstance(name, str) or not name:
            raise PlayDefinitionError(
                f"ctx.step(): the name must be a non-empty string naming the step, not {name!r}"
            )
        if not callable(fn):
            raise PlayDefinitionError(f"ctx.step({name!r}, fn): fn must be callable, not {type(fn).__name__}")
        store = self._ledger.scope.store
        address = self._step_address("step", name)
        found = await store.alookup(address)
        if found is not MISSING:
            return found.value
        value = await fn(*args) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, *args)
        if inspect.isawaitable(value):
            value = await value
        try:
            stored = encode(value)
        except Unencodable as exc:
            raise PlaybookError(
                f"step {name!r} returned a value with no JSON form ({exc}); return data: numbers, text, dates, lists and dicts of them"
            ) from None
        await store.commit(
            record(address, tool=f"step:{name}", stored=stored, tagged=stored is not value, at=store.clock())
        )
        return decode(stored) if stored is not value else value

    def sleep(self, seconds: float) -> Coroutine[Any, Any, None]:
        """Sleep durably (await it): the row steps aside (its slot goes to another row) and comes
        back when the time is up.  The wake time is stored, so a replay skips a sleep already
        over, and a rerun after a restart wakes the row at the time first set, not ``seconds`` later."""
        return self._ledger.made_here(self._sleep(seconds))

    async def _sleep(self, seconds: float) -> None:
        if self._ledger.signal is not None:
            raise self._ledger.signal
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or seconds < 0
        ):
            raise PlayDefinitionError(f"ctx.sleep(): seconds must be a finite number >= 0, not {seconds!r}")
        if self._ledger.scope.replay is not None:
            return  # replaying fixtures: no provider to wait for, so no waiting
        store = self._ledger.scope.store
        address = self._step_address("sleep", "")
        found = await store.alookup(address)
        now = store.clock()
        if found is MISSING:
            wake = now + seconds
            await store.commit(record(address, tool="sleep", stored=wake, tagged=False, at=now))
        else:
            wake = found.value
        left = wake - store.clock()
        if left <= 0:
            return
        if left <= IN_PLACE:
            await asyncio.sleep(left)
            return
        signal = self._ledger.signal = Sleeping(asyncio.get_running_loop().time() + left, wake)
        raise signal

    def _step_address(self, kind: str, name: str) -> str:
        book = self._ledger
        name = step_name(kind, name)
        return step_address(book.scope.play, book.row_id, name, book.occurrence(name))

    async def _call(
        self,
        tool: Tool[Any],
        input: Any,
        refresh: bool,
        ttl: float | None,
        kwargs: dict[str, Any],
        *,
        leg: bool = False,
    ) -> tuple[Any, bool]:
        if self._ledger.signal is not None:
            raise self._ledger.signal  # a suspension (or a park) the play caught: the row still steps aside
        try:
            got = call_tool(self._ledger, tool, input, refresh, ttl, kwargs, leg=leg)
            return got if isinstance(got, tuple) else await got
        except Suspend as signal:
            self._ledger.signal = signal
            raise
        except RunFatal as exc:
            self._ledger.signal = exc
            self._ledger.scope.fatal_stop(exc)
            raise


def _old_force(refresh: bool, kwargs: dict[str, Any], where: str) -> bool:
    """``force=``, the old spelling of ``refresh=``, taken out of the tool's inputs (warning); both
    at once is a ``TypeError``, as for every renamed keyword."""
    if refresh is not _UNSAID:
        raise TypeError(f"{where}: force= and refresh= are one argument: pass only refresh=")
    renamed(f"{where}(..., force=)", f"{where}(..., refresh=)")
    return bool(kwargs.pop("force"))


def _row_key(ctx: Context) -> str:
    renamed("ctx.row_key", "ctx.row_id")
    return ctx.row_id


def _call(ctx: Context) -> Callable[..., Leg]:
    renamed("ctx.call()", "ctx.leg()")  # it builds a waterfall leg; it calls nothing
    return ctx.leg


# Deprecated names, served by __getattr__: they work (warning) and dir(ctx) leaves them out.
_OLD: dict[str, Callable[[Any], Any]] = {"row_key": _row_key, "call": _call}


class Leg:
    """A call not made yet: a leg of :meth:`Context.waterfall`, made by :meth:`Context.leg`."""

    __slots__ = ("tool", "input", "refresh", "ttl", "kwargs")

    def __init__(
        self, tool: Tool[Any], input: Any, refresh: bool, ttl: float | None, kwargs: dict[str, Any]
    ) -> None:
        self.tool = tool
        self.input = input
        self.refresh = refresh
        self.ttl = ttl
        self.kwargs = kwargs

    def __repr__(self) -> str:
        args = [] if self.input is NO_INPUT else [repr(self.input)]
        args += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"<Leg {self.tool.name}({', '.join(args)})>"
