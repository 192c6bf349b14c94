"""What ``await ctx.tool(...)`` does, as a pipeline of small steps::

    key      the address of the call (its input in key form; a forgotten await caught here)
    lookup   a receipt answers (or the same call, in flight for another row, is waited for);
             a tool whose recent calls had none is looked up once its lease is held, not before
    lease    this process takes the call; or, while rows not started yet wait, the row steps
             back for one of them (another process is paying for it: processes on the same
             rows share them out); or it waits for that process's receipt
    store    the store takes writes (a call it cannot record is not paid for): while it
             refuses them the call waits, for the store's grace, then the row parks
    budget   max_cost is reserved, or the row parks
    route    a batch (coalesced with other rows' calls), the provider's governor (holds, rate,
             retries, over the row's wait budget), or straight to the tool
    dispatch one try of the tool, its errors classified
    record   the answer becomes a receipt before anything else happens to the row
    release  the lease and the in-flight marker go, once the receipt is on disk

*Landing* (dispatch, then record) is protected: a run that is stopped, or interrupted with Ctrl-C,
cancels its rows, but not those whose call is already sent; each of those lands its receipt
(within a grace period) and then stops, so what was paid for is not paid for again.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from playbook._internal.flow import Leased, OnHold
from playbook.addresses import key_text, refreshed_address
from playbook.errors import PlaybookError, RunFatal, ToolError
from playbook.runtime.calls.kept_errors import (
    ONE_REQUEST,
    not_storable,
    refusal,
    refused,
    replayed,
    unkeyable,
)
from playbook.runtime.calls.observed import Called
from playbook.runtime.calls.recording import record
from playbook.runtime.state.upstream import dispatch as governed
from playbook.runtime.state.upstream import learn
from playbook.store import MISSING
from playbook.store.records import Hit, Missing, Refusal
from playbook.tagged import Unencodable, encode
from playbook.tools.failures import translate
from playbook.tools.llm.engine import LlmEngine
from playbook.tools.protocol import CallEnv, Spent, ToolEngine, is_local
from playbook.tools.tool import Tool, engine_of

if TYPE_CHECKING:
    from playbook.providers.provider import Ticket
    from playbook.runtime.calls.scope import RunScope
    from playbook.store import StoreEngine

__all__ = ["Caller", "call_tool", "invoke", "paid"]

Send = Callable[[], Awaitable[tuple[Any, bool]]]


class Caller(Protocol):
    """The row making a call, as the pipeline needs it (a :class:`~.ledger.RowLedger`)."""

    @property
    def scope(self) -> RunScope: ...
    @property
    def row_id(self) -> str: ...
    @property
    def position(self) -> int: ...
    def occurrence(self, name: str) -> int: ...
    def used(self, tool: ToolEngine, key: str | None) -> None: ...
    def count(self, tool: ToolEngine, *, reused: bool, spent: Spent, shared: bool = False) -> None: ...
    def forgotten_await(self, value: Any) -> str: ...


class Pending(NamedTuple):
    """A call that missed its receipt, on its way to being paid for."""

    key: str
    values: Any
    logical: str  # (row, tool, occurrence): the same across the row's replays
    refreshed: bool
    ttl: float | None
    leg: bool  # a waterfall's leg: a provider that is down passes to the next leg at once


def call_tool(
    ctx: Caller,
    held: Tool[Any],
    input: Any,
    refresh: bool,
    ttl: float | None,
    kwargs: dict[str, Any],
    *,
    leg: bool = False,
) -> tuple[Any, bool] | Awaitable[tuple[Any, bool]]:
    """``(value, miss)`` of one call (``leg``: as a waterfall's leg): at once when a receipt on
    this machine answers it (a tuple); else the coroutine to await, that finds it or pays for it
    and records it.  A plain function: the caller's coroutine is the call's only one until it
    waits for something.  From here on the pipeline works with the tool's engine."""
    scope = ctx.scope
    tool = engine_of(held)
    values = tool.bind(input, kwargs)
    if scope.replay is not None and scope.store is scope.replay.store:
        return _replayed(ctx, tool, values)
    key = _key(ctx, tool, values)
    occurrence = ctx.occurrence(tool.name)
    logical = f"{ctx.row_id}/{tool.name}/{occurrence}"
    ctx.used(tool, key)
    refreshed = (refresh or scope.refresh_all) and scope.must_refresh(logical)
    if scope.observer is not None:  # a pilot: which calls the rows left share is read from these inputs
        scope.observer.called(
            ctx.position, tool, (ctx.row_id, occurrence), Called(input, kwargs, ttl, refreshed)
        )
    call = Pending(key, values, logical, refreshed, ttl, leg)
    if refreshed:
        return _pay(ctx, tool, call)
    # A call sent as a batch job takes no lease, so nothing looks it up after one: it is looked up first.
    ahead = scope.ahead.first(tool.name) or tool.submits()
    found = _at_once(scope.store, key, ttl, ahead)
    if found is None:
        return _looked_up(ctx, tool, call, ahead)
    return _pay(ctx, tool, call) if found is MISSING else _found(ctx, tool, values, found)


async def _looked_up(ctx: Caller, tool: ToolEngine, call: Pending, ahead: bool) -> tuple[Any, bool]:
    """A lookup that waits (across the network, or for the same call in flight), then the call
    reused or paid for."""
    found = await lookup(ctx.scope.store, call.key, call.ttl, ahead)
    return await _pay(ctx, tool, call) if found is MISSING else _found(ctx, tool, call.values, found)


def _found(ctx: Caller, tool: ToolEngine, values: Any, found: Hit) -> tuple[Any, bool]:
    """Its receipt answered the call before any lease: the tool is looked up first next time."""
    ctx.scope.ahead.learn(tool.name, True)
    return _reused(ctx, tool, values, found)


def _replayed(ctx: Caller, tool: ToolEngine, values: Any) -> tuple[Any, bool]:
    """A call answered by the run's fixtures in their own store, where the file is the receipts
    too: no address, store, lease or provider; one dictionary lookup."""
    replay = ctx.scope.replay
    assert replay is not None
    answer, miss, reused = replay.answer(tool, _key(ctx, tool, values, key_text))
    ctx.used(tool, None)
    ctx.count(tool, reused=reused, spent=tool.spent(answer))
    return tool.read(answer, miss)


# -- key ------------------------------------------------------------------------------


def _key(ctx: Caller, tool: ToolEngine, values: Any, form: Callable[[Any], str] | None = None) -> str:
    """The call's address (or, with ``form``, its input in that form)."""
    try:
        return tool.address(values) if form is None else form(values)
    except Unencodable as exc:
        raise unkeyable(
            tool, values, exc, ": " + ctx.forgotten_await(exc.value) if exc.awaitable else ""
        ) from None


# -- lookup ---------------------------------------------------------------------------


async def lookup(store: StoreEngine, key: str, ttl: float | None, ahead: bool = True) -> Hit | Missing:
    """The receipt for ``key``, or ``MISSING``; while the same call is in flight for another row
    of this process, its receipt is waited for (don't pay twice).  Not ``ahead``: only that wait
    (the receipt is looked up once the call's lease is taken; see ``scope.Ahead``)."""
    if not ahead:
        found: Hit | Missing = MISSING
    else:  # on this machine, at once: no coroutine to make and await
        found = await store.alookup(key, ttl) if store.remote else store.lookup(key, ttl)
    while found is MISSING:
        ended = store.inflight.ended(key)
        if ended is None:
            return MISSING
        await asyncio.wait((ended,))
        found = await store.alookup(key, ttl)
    return found


def _at_once(store: StoreEngine, key: str, ttl: float | None, ahead: bool) -> Hit | Missing | None:
    """:func:`lookup`'s answer when it needs no wait (no coroutine made: once per call), else
    ``None``: a read across the network, or the same call in flight for another row."""
    if ahead and store.remote:
        return None
    found = store.lookup(key, ttl) if ahead else MISSING
    return None if found is MISSING and key in store.inflight else found


def _reused(ctx: Caller, tool: ToolEngine, values: Any, found: Hit) -> tuple[Any, bool]:
    value, miss, error, at = found
    # answered during this run (an identical call of another row), not before it
    shared = at >= ctx.scope.started
    if type(error) is Refusal:
        ctx.count(tool, reused=True, spent=ONE_REQUEST, shared=shared)
        raise replayed(tool, error)
    if error is not None:
        raise ToolError(not_storable(tool, str(error), paid_now=False), tool=tool.name)
    spent = tool.spent(value)
    if ctx.scope.recorder is not None:
        ctx.scope.recorder.add(tool, values, encode(value), miss, spent.cost or 0.0)
    ctx.count(tool, reused=True, spent=spent, shared=shared)
    return tool.read(value, miss)


# -- lease, budget, release -----------------------------------------------------------


async def _pay(ctx: Caller, tool: ToolEngine, call: Pending) -> tuple[Any, bool]:
    if tool.submits() and ctx.scope.replay is None:
        return await _submitted(ctx, tool, call)
    store = ctx.scope.store
    store.inflight.start(call.key, call)
    try:
        # The lease's batch answered here (a coroutine less); not a refresh: with the receipt as
        # the store has it then (another process may have paid and let go before our lease).
        taken, read = await store.leases.ask(call.key, not call.refreshed)
        found = _leased(ctx, tool, store, call, read) if taken else await _held(ctx, store, call)
        if found is not MISSING:
            return _reused(ctx, tool, call.values, found)
        if store.health.reason is not None:  # it refuses writes: wait for it, or park (see store.health)
            await store.health.writable(store.location)
        scope = ctx.scope
        # no max_cost: nothing to reserve, the call is routed from here (a coroutine less)
        answer, miss = await (
            _route(ctx, tool, call) if scope.costs.limit is None else _spend(ctx, tool, call)
        )
        if call.refreshed:
            scope.refreshed(call.logical)
        return tool.read(answer, miss)
    finally:
        _release(store, call)


def _leased(ctx: Caller, tool: ToolEngine, store: StoreEngine, call: Pending, read: Any) -> Hit | Missing:
    """The lease is ours: the receipt read with it, if another process paid for it meanwhile."""
    if call.refreshed:
        return MISSING
    found = store.answer(call.key, read, call.ttl)
    ctx.scope.ahead.learn(tool.name, found is not MISSING)
    return found


async def _held(ctx: Caller, store: StoreEngine, call: Pending) -> Hit | Missing:
    """Another process holds the call's lease: step back for a fresh row, or wait for its receipt."""
    key, ttl, leases = call.key, call.ttl, store.leases
    if not call.refreshed and ctx.scope.fresh(ctx.position):
        raise Leased(key)  # another process pays for it now: take a fresh row, come back later
    # Another process is paying for this call right now: wait for its receipt.
    check: Callable[[], Hit | Missing] = (
        (lambda: MISSING) if call.refreshed else (lambda: store.lookup(key, ttl))
    )
    found = await leases.wait(key, check)
    if found is not MISSING:
        leases.release(key)
    return found


async def _spend(ctx: Caller, tool: ToolEngine, call: Pending) -> tuple[Any, bool]:
    """Reserve the call's cost against max_cost, then route it; the cost comes back if it does not
    complete."""
    costs = ctx.scope.costs
    estimate = tool.price(call.values)
    await costs.reserve(tool, estimate)
    try:
        answer, miss = await _route(ctx, tool, call)
    except BaseException:
        costs.refund(estimate)
        raise
    costs.charge(estimate, tool.spent(answer).cost)
    return answer, miss


async def _submitted(ctx: Caller, tool: ToolEngine, call: Pending) -> tuple[Any, bool]:
    """A call answered by a batch job: its row sleeps until the job is done (see ``jobs``).  Every
    row asking the same call (here or in another process) wakes to its answer: one lands it, under
    the call's lease, and the others read its receipt, so it is paid for once."""
    scope = ctx.scope
    assert isinstance(tool, LlmEngine)  # the one engine that submits()
    answer = await scope.jobs.answer(scope, tool, call.key, call.values)
    store = scope.store
    # another row of this process landed it, or lands it now: its receipt, waited for
    found = MISSING if call.refreshed else await lookup(store, call.key, call.ttl)
    store.inflight.start(call.key, call)
    try:
        if found is MISSING:
            taken, read = await store.leases.ask(call.key, not call.refreshed)
            found = _leased(ctx, tool, store, call, read) if taken else await _held(ctx, store, call)
        if found is not MISSING:
            scope.costs.refund(scope.jobs.reserved.pop(call.key, None))
            return _reused(ctx, tool, call.values, found)
        scope.costs.charge(scope.jobs.reserved.pop(call.key, 0.0), tool.spent(answer).cost)
        answer, miss = await paid(ctx, tool, call.key, call.values, answer, False)
    finally:
        _release(store, call)
    return tool.read(answer, miss)


def _release(store: StoreEngine, call: Pending) -> None:
    """Let the call go, once its receipt is on disk (or it never went out)."""
    store.leases.release(call.key)  # a waiting process then finds the receipt
    store.inflight.end(call.key, call)


# -- route: batch, governor, or straight ----------------------------------------------


def _route(ctx: Caller, tool: ToolEngine, call: Pending) -> Awaitable[tuple[Any, bool]]:
    """The step that answers the call, to await (a plain function: a coroutine less a call)."""
    replay = ctx.scope.replay
    if replay is not None:
        # Fixtures replayed into a store the run named: the file answers as the provider would,
        # and the answer is a receipt there (budget, leases and in-flight waits as for a live call).
        answer, miss, _ = replay.answer(tool, _key(ctx, tool, call.values, key_text))
        return paid(ctx, tool, call.key, call.values, answer, miss)
    if tool.batch_size is not None:
        return _batched(ctx, tool, call)
    if tool.provider is None:
        if tool.remote:
            ctx.scope.level.unlimited()
        return _send(ctx, tool, call, _env(ctx, call))
    if tool.remote:
        # The run's HTTP client is made (its transport imported) before a slot is taken, not in the
        # slot: a worker's first call would otherwise leave a quarter of a second late, and the
        # calls whose slots came meanwhile would reach a strict provider together.
        ctx.scope.http_client()
    ticket = ctx.scope.tickets.get(call.logical, tool, ctx.position, call.key)
    ticket.falls_through = call.leg
    # The call's environment outlives a suspension with its ticket: what a try got before it
    # failed (an LLM answer whose re-ask was refused) is still there when the row replays.
    env = ticket.carry if isinstance(ticket.carry, CallEnv) else _env(ctx, call)
    ticket.carry = env
    return _governed(ctx, tool, call, ticket, functools.partial(_send, ctx, tool, call, env), env)


async def _batched(ctx: Caller, tool: ToolEngine, call: Pending) -> tuple[Any, bool]:
    """Join a batch; its task dispatches and records each member's receipt.  The member waits on
    the provider against its own row's wait budget."""
    scope = ctx.scope
    budget = scope.tickets.budget(ctx.position, tool.provider) if tool.provider is not None else None

    async def land(answer: Any, miss: bool) -> tuple[Any, bool]:
        return await paid(ctx, tool, call.key, call.values, answer, miss)

    return await scope.batches.batcher(tool).call(call.values, land, budget)


async def _governed(
    ctx: Caller, tool: ToolEngine, call: Pending, ticket: Ticket, send: Send, env: CallEnv
) -> tuple[Any, bool]:
    """Through the provider's governor, with this logical call's ticket: it outlives a
    suspension, so a replayed call keeps its retry count.  A call weighed by its tokens carries
    its estimate on the ticket and its real usage back; limits the provider announced in its
    answer (or its refusal) reach the governor."""
    tickets, level = ctx.scope.tickets, ctx.scope.level
    provider = tool.provider
    assert provider is not None
    ticket.weight = tool.weigh(call.values)
    # Only a call weighed by its tokens (an LLM tool's) has usage and limits to report back.
    send = send if ticket.weight is None else _weighed(tool, ticket, send, env)
    waiting = level.waiting(provider)
    try:
        result = await governed(provider, send if waiting is None else waiting.around(send), ticket)
    except OnHold:
        level.held()
        raise
    except BaseException:
        tickets.done(call.logical)
        raise
    finally:
        if waiting is not None:
            waiting.done()
    tickets.done(call.logical)
    return result


def _weighed(tool: ToolEngine, ticket: Ticket, send: Send, env: CallEnv) -> Send:
    """``send``, telling the governor the call's real usage and the limits its provider announced."""
    provider = tool.provider
    assert provider is not None

    async def weighed() -> tuple[Any, bool]:
        ticket.left = None  # an earlier try's word is stale
        try:
            answer, miss = await send()
        finally:
            if env.announced is not None:
                learn(provider, env.announced)
                # the limiter reads the buckets once it has charged this answer (it counts in them)
                ticket.left = env.announced.remaining
                env.announced = None
        ticket.actual = tool.spent(answer).tokens
        return answer, miss

    return weighed


def _env(ctx: Caller, call: Pending) -> CallEnv:
    scope = ctx.scope
    # A call paid for again is a new request to the provider: its idempotency key must differ from the
    # receipt's, once per logical call of this run (a replay of the row sends the same one).
    idem = refreshed_address(call.key, scope.run_id, call.logical) if call.refreshed else call.key
    return CallEnv(scope.http_client, idem)


async def _send(ctx: Caller, tool: ToolEngine, call: Pending, env: CallEnv) -> tuple[Any, bool]:
    """One try (a governor's ``send``): dispatch, then record the receipt.  A stop meanwhile lets
    this call land its receipt, then stops the row."""
    scope = ctx.scope
    landing = scope.landing
    task = landing.enter()
    observer = scope.observer  # a pilot's log: how long each request took
    began = observer.began(ctx.position, tool) if observer is not None else 0.0
    kept = False  # a refusal: the call's answer, kept (not a request that failed)
    try:
        try:
            if not is_local(tool, 0.0):
                scope.store.sending()
            answer, miss = await invoke(tool, call.values, env)
        except ToolError as exc:
            if refusal(exc):
                kept = True
                try:
                    await refused(scope, tool, call.key, call.values, exc)
                finally:
                    ctx.count(tool, reused=False, spent=ONE_REQUEST)
            elif not is_local(tool, 0.0):
                scope.call_failed(tool, ctx.position)  # sent, and no answer to keep: counted all the same
            raise
        landed = await paid(ctx, tool, call.key, call.values, answer, miss)
    except BaseException as exc:
        landing.leave(task, False)
        if observer is not None:
            status = exc.status if isinstance(exc, ToolError) else None
            observer.sent(ctx.position, tool, began, failed=not kept, refused=kept, status=status)
        raise
    landing.leave(task, True)
    if observer is not None:
        observer.sent(ctx.position, tool, began, failed=False)
    return landed


# -- dispatch and record --------------------------------------------------------------


async def invoke(tool: ToolEngine, values: Any, env: CallEnv) -> tuple[Any, bool]:
    """One try of the tool, with its errors classified: an SDK's HTTP errors as HTTP answers
    (see ``tools.failures``), a Python tool's credential error as fatal."""
    try:
        return await tool.invoke(values, env)
    except ToolError as exc:
        # A Python tool's "bad credentials" stops the run as HTTP's does (an HTTP tool says so itself).
        if exc.status in (401, 402, 403) and not tool.remote:
            raise RunFatal(
                f"tool {tool.name!r}: {exc} (status {exc.status})",
                tool=tool.name,
                provider=exc.provider,
                status=exc.status,
            ) from exc
        raise
    except PlaybookError:
        raise
    except Exception as exc:
        error = translate(
            exc,
            tool=tool.name,
            provider=tool.provider.name if tool.provider else None,
            retry_on=tool.retry_on,
        )
        if error is not None:
            raise error from exc
        # A tool's own exception stays the row's error, with the tool named on it.
        exc.add_note(f"raised by tool {tool.name!r}")
        raise


def paid(
    ctx: Caller, tool: ToolEngine, key: str, values: Any, answer: Any, miss: bool
) -> Awaitable[tuple[Any, bool]]:
    """An answer came back: it is paid for (counted at once, whatever happens next), and recorded
    (await it: the answer as its receipt keeps it)."""
    spent = tool.spent(answer)
    ctx.count(tool, reused=False, spent=spent)
    return record(
        ctx.scope,
        tool,
        key,
        values,
        answer,
        miss,
        spent.cost or 0.0,  # a receipt keeps the usage: an unpriced answer is priced when replayed
        0 if is_local(tool, spent.cost) else spent.requests,
    )
