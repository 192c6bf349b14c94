"""What ``await ctx.tool(...)`` does, as a pipeline of small steps::

    key      the receipt key of the call (its input in key form; a forgotten await caught here)
    lookup   a receipt answers (or the same call, in flight for another row, is waited for)
    lease    this process takes the call, or waits for the process paying for it
    budget   max_cost is reserved, or the row parks
    dispatch through the provider's governor (holds, rate, retries), a batch, or directly
    land     the answer becomes a receipt before anything else happens to the row
    release  the lease and the in-flight marker go, once the receipt is on disk

*Landing* (invoke, then record) is protected: a run that is stopped, or interrupted with Ctrl-C,
cancels its rows, but not those whose call is already sent; each of those lands its receipt
(within a grace period) and then stops, so what was paid for is not paid for again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .errors import PlaybookError, RunFatal, ToolError
from .keys import digest
from .signals import Held
from .store import MISSING
from .store.records import record as receipt_record
from .tagged import Unencodable, decode, encode
from .tools import CallEnv, Tool
from .tools.failures import translate

if TYPE_CHECKING:
    from .context import Context

__all__ = ["call_tool", "not_storable"]

Send = Callable[[], Awaitable[tuple[Any, bool]]]


async def call_tool(ctx: Context, tool: Tool, input: Any, force: bool, ttl: float | None, kwargs: dict[str, Any]) -> tuple[Any, bool]:
    """``(value, miss)`` of one call: from its receipt, or paid for and recorded."""
    run = ctx.run
    values = tool.bind(input, kwargs)
    key = _key(ctx, tool, values)
    logical = f"{ctx.row_key}/{tool.name}/{ctx.occurrence(tool.name)}"
    forced = (force or run.force_all) and run.must_force(logical)
    ctx.used(tool)
    if not forced:
        store = run.store
        found = store.lookup(key, ttl)
        if found is MISSING and key in store.inflight:
            found = await _existing(store, key, ttl)
        if found is not MISSING:
            return _reused(ctx, tool, found)
    return await _pay(ctx, tool, key, values, logical, forced, ttl)


def _key(ctx: Context, tool: Tool, values: Any) -> str:
    try:
        return tool.key(values)
    except Unencodable as exc:
        hint = ": " + ctx.forgotten_await(exc.value) if exc.awaitable else ""
        raise ToolError(f"tool {tool.name!r}: {_culprit(values, exc)} cannot be part of a receipt key ({exc.why}){hint}", tool=tool.name) from None


def _culprit(values: Any, exc: Unencodable) -> str:
    """``input domain=<...>`` for the parameter whose value has no JSON form, and where in it."""
    where = exc.where
    if isinstance(values, dict) and where.startswith("['"):
        param, _, rest = where[2:].partition("']")
        if param in values:
            inside = f" (at {rest})" if rest else ""
            return f"input {param}={_short(values[param])}{inside}"
    return f"its input {_short(values)}" + (f" (at {where})" if where else "")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


async def _existing(store: Any, key: str, ttl: float | None) -> Any:
    """The receipt for ``key``; while the same call is in flight for another row, wait for it."""
    while True:
        record = store.lookup(key, ttl)
        if record is not MISSING:
            return record
        pending = store.inflight.get(key)
        if pending is None:
            return MISSING
        await asyncio.wait((pending,))  # don't pay twice: its receipt is coming


def _reused(ctx: Context, tool: Tool, found: tuple[Any, bool, str | None]) -> tuple[Any, bool]:
    value, miss, error = found
    if error is not None:
        raise ToolError(not_storable(tool, error, paid_now=False), tool=tool.name)
    ctx.count(tool, reused=True)
    return tool.read(value, miss)


async def _pay(ctx: Context, tool: Tool, key: str, values: Any, logical: str, forced: bool, ttl: float | None) -> tuple[Any, bool]:
    run, store = ctx.run, ctx.run.store
    done = store.inflight[key] = asyncio.get_running_loop().create_future()
    try:
        found = await _lease(store, key, ttl, forced)
        if found is not MISSING:
            return _reused(ctx, tool, found)
        run.reserve(tool)
        try:
            send = _sender(ctx, tool, key, values, forced, logical)
            answer, miss = await _dispatch(ctx, tool, key, values, send, logical)
        except BaseException:
            run.refund(tool)
            raise
        if forced:
            run.forced(logical)
        return tool.read(answer, miss)
    finally:
        _release(store, key, done)


async def _lease(store: Any, key: str, ttl: float | None, forced: bool) -> Any:
    """Take this call's lease; returns a receipt instead if another process paid for it meanwhile."""
    leases = store.leases
    if not await leases.take(key):
        # Another process is paying for this call right now: wait for its receipt.
        check = (lambda: MISSING) if forced else (lambda: store.lookup(key, ttl))
        found = await leases.wait(key, check, MISSING)
        if found is not MISSING:
            leases.release(key)
        return found
    if forced:
        return MISSING
    # Another process may have paid and let go between our lookup and our lease.
    return store.lookup(key, ttl)


async def _dispatch(ctx: Context, tool: Tool, key: str, values: Any, send: Send, logical: str) -> tuple[Any, bool]:
    run = ctx.run
    if tool.batch_size is not None:
        # The batch is sent by a task of its own, which also records each member's receipt.
        return await run.batcher(tool).call(values, lambda answer, miss: paid(ctx, tool, key, values, answer, miss))
    if tool.provider is None:
        return await send()
    ticket = run.ticket(logical, tool, ctx.position)  # outlives a suspension: a replayed call keeps its retry count
    try:
        result = await tool.provider.dispatch(send, ticket)
    except Held:
        raise
    except BaseException:
        run.ticket_done(logical)
        raise
    run.ticket_done(logical)
    return result


def _sender(ctx: Context, tool: Tool, key: str, values: Any, forced: bool, logical: str) -> Send:
    """The ``send`` a governor calls once per try: invoke, then record the receipt."""
    run = ctx.run
    idem = digest(f"{key}\x1f{run.run_id}\x1f{logical}") if forced else key
    env = CallEnv(run.http_client, idem)

    async def send() -> tuple[Any, bool]:
        with run.landing():  # a stop now lets this call land its receipt, then stops the row
            return await paid(ctx, tool, key, values, *await invoke(tool, values, env))

    return send


async def paid(ctx: Context, tool: Tool, key: str, values: Any, answer: Any, miss: bool) -> tuple[Any, bool]:
    """An answer came back: it is paid for (counted, whatever happens next), and recorded."""
    try:
        return await record(ctx.run, tool, key, values, answer, miss)
    finally:
        ctx.count(tool, reused=False)


async def invoke(tool: Tool, values: Any, env: CallEnv) -> tuple[Any, bool]:
    """One try of the tool, with its errors classified: an SDK's HTTP errors as HTTP answers
    (see ``tools.failures``), a Python tool's credential error as fatal."""
    try:
        return await tool.invoke(values, env)
    except ToolError as exc:
        if exc.status in (401, 402, 403):  # a Python tool's "bad credentials" stops the run as HTTP's does
            raise RunFatal(f"tool {tool.name!r}: {exc} (status {exc.status})", tool=tool.name, provider=exc.provider, status=exc.status) from exc
        raise
    except PlaybookError:
        raise
    except Exception as exc:
        error = translate(exc, tool=tool.name, provider=tool.provider.name if tool.provider else None, retry_on=tool.retry_on)
        if error is not None:
            raise error from exc
        # A tool's own exception stays the row's error, with the tool named on it.
        exc.add_note(f"raised by tool {tool.name!r}")
        raise


async def record(run: Any, tool: Tool, key: str, values: Any, answer: Any, miss: bool) -> tuple[Any, bool]:
    """Write the receipt of a paid answer; returns the answer as stored, so the first run sees
    exactly what every replay will (a pydantic model as its dict, a tuple as a tuple)."""
    store = run.store
    meta = {"tool": tool.name, "version": tool.identity, "account": tool.account, "cost": tool.cost, "input": values}
    try:
        stored = encode(answer)
    except Unencodable as exc:
        # Paid for, but it has no JSON form: keep a receipt saying so, so no rerun pays again.
        await store.commit(receipt_record(key, stored=None, tagged=False, at=run.store_clock(), miss=miss, error=str(exc), **meta))
        raise ToolError(not_storable(tool, str(exc), paid_now=True), tool=tool.name) from None
    tagged = stored is not answer
    await store.commit(receipt_record(key, stored=stored, tagged=tagged, at=run.store_clock(), miss=miss, **meta))
    return (decode(stored) if tagged else answer), miss


def not_storable(tool: Tool, problem: str, *, paid_now: bool) -> str:
    """Why a paid answer has no receipt value, and the way out."""
    when = "was paid for" if paid_now else "was paid for in an earlier run"
    bump = "change its version= " if tool.version is not None else "edit the tool (an edited tool is a new tool) "
    return (
        f"tool {tool.name!r} {when}, but its answer cannot be stored: {problem}. It is not paid for again: "
        f"this call keeps failing until you return plain data from the tool (e.g. return model.model_dump(), "
        f"or a dict of the fields you need) and {bump}so that the call is made afresh"
    )


def _release(store: Any, key: str, done: asyncio.Future[None]) -> None:
    """Let the call go, once its receipt is on disk (or it never went out)."""
    store.leases.release(key)  # a waiting process then finds the receipt
    if store.inflight.get(key) is done:
        del store.inflight[key]
    if not done.done():
        done.set_result(None)
