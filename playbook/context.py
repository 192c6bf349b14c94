"""``ctx``: what a play uses to call tools.  One per row attempt.

Each call has a *logical identity* (run, row, tool, occurrence): the n-th call of a tool in a
row.  A row that is replayed re-enters with the same identities, so its earlier calls hit their
receipts and a forced call is forced once per run, not once per replay.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import PlayDefinitionError, PlaybookError, ProviderUnavailable, RunFatal, ToolError
from .keys import canonical, digest, jsonable, receipt_key
from .receipts import MISSING
from .providers import IN_PLACE
from .signals import Held, Sleeping, Suspend
from .tools import NO_INPUT, CallEnv, Tool

if TYPE_CHECKING:
    from .runtime.scheduler import MapRun

__all__ = ["Call", "Context"]

_logger = logging.getLogger("playbook")


class Context:
    """Per-row handle: ``await ctx.tool(tool, ...)``, ``ctx.waterfall(...)``, ``ctx.step(...)``,
    ``ctx.sleep(...)``, ``ctx.log(...)``."""

    __slots__ = ("_run", "row_key", "position", "attempt", "_seen", "logs", "_signal", "calls", "cost")

    def __init__(self, run: MapRun, row_key: str, position: int, attempt: int) -> None:
        self._run = run
        self.row_key = row_key
        self.position = position
        self.attempt = attempt
        self._seen: dict[str, int] | None = None  # calls per tool so far: the occurrence index
        self.logs: list[str] | None = None
        self._signal: BaseException | None = None  # a suspension or fatal error, remembered
        # The row's calls, paid now or before, and what they cost: its memo keeps them, so a
        # rerun that reuses the row can say what it saved.
        self.calls = 0
        self.cost = 0.0

    @property
    def run_id(self) -> str:
        return self._run.run_id

    def __repr__(self) -> str:
        return f"<Context row={self.position} key={self.row_key[:8]} attempt={self.attempt} run={self.run_id}>"

    def log(self, msg: Any) -> None:
        """Note a message for this row: kept on the context and sent to the ``playbook`` logger."""
        if self.logs is None:
            self.logs = []
        text = str(msg)
        self.logs.append(text)
        _logger.info("%s row %s: %s", self._run.play.name, self._run.label(self.position), text)

    async def tool(self, tool: Tool, input: Any = NO_INPUT, /, *, force: bool = False, ttl: float | None = None, **kwargs: Any) -> Any:
        """Call ``tool``: its receipt if one exists, else dispatch through its provider."""
        if not isinstance(tool, Tool):
            raise ToolError(f"ctx.tool() needs a tool made with @pb.tool or pb.http_tool, not {type(tool).__name__}")
        return (await self._call(tool, input, force, ttl, kwargs))[0]

    def call(self, tool: Tool, input: Any = NO_INPUT, /, *, force: bool = False, ttl: float | None = None, **kwargs: Any) -> Call:
        """A call for :meth:`waterfall`, made only if the waterfall reaches it."""
        if not isinstance(tool, Tool):
            raise ToolError(f"ctx.call() needs a tool made with @pb.tool or pb.http_tool, not {type(tool).__name__}")
        return Call(tool, input, force, ttl, kwargs)

    async def waterfall(
        self,
        key: str,
        legs: Sequence[Call],
        *,
        accept: Callable[[Any], bool] = bool,
        with_source: bool = False,
    ) -> Any:
        """Try ``legs`` in order; the first accepted value wins (default: the first truthy one).

        A leg passes to the next when its value is not accepted, it is a miss, or its provider is
        unavailable or holds calls past the wait budget (it falls through at once, no waiting).
        If no leg is accepted the result is ``None``.  With ``with_source=True`` the result is
        ``(value, tool name)``, or ``(None, None)``.
        """
        if not isinstance(key, str) or not key:
            raise PlayDefinitionError(f"ctx.waterfall(): key must be a non-empty string naming the waterfall, not {key!r}")
        legs = list(legs)
        if not legs:
            raise PlayDefinitionError(f"waterfall {key!r} needs at least one leg: ctx.call(tool, ...)")
        for i, leg in enumerate(legs):
            if not isinstance(leg, Call):
                raise PlayDefinitionError(
                    f"waterfall {key!r}: leg {i} is {type(leg).__name__}, not ctx.call(tool, ...)"
                    + (" (was it awaited? pass ctx.call(...), not await ctx.tool(...))" if not isinstance(leg, Tool) else "")
                )
        outcomes: list[str] = []
        value: Any = None
        source: str | None = None
        try:
            for leg in legs:
                try:
                    out, miss = await self._call(leg.tool, leg.input, leg.force, leg.ttl, leg.kwargs)
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
            self._run.waterfall_done(key, legs, outcomes)
            raise
        self._run.waterfall_done(key, legs, outcomes)
        return (value, source) if with_source else value

    async def step(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` once for this row and remember its value durably.

        A replay (after a hold) or a rerun (after a crash, a restart or an edit of the play) gets
        the remembered value without running ``fn`` again: use it for side effects that must
        happen once, like submitting a job.  The value must have a JSON form, and comes back as
        that form (a tuple as a list).  Steps are kept per play name, row and ``key`` (the n-th
        step with one key in a row is its own step); change the key to run a step afresh.
        """
        if self._signal is not None:
            raise self._signal
        if not isinstance(key, str) or not key:
            raise PlayDefinitionError(f"ctx.step(): key must be a non-empty string naming the step, not {key!r}")
        if not callable(fn):
            raise PlayDefinitionError(f"ctx.step({key!r}, fn): fn must be callable, not {type(fn).__name__}")
        run = self._run
        skey = self._step_key("step", key)
        record = run.store.lookup(skey)
        if record is not MISSING:
            return record["out"]
        value = await fn(*args) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, *args)
        if inspect.isawaitable(value):
            value = await value
        try:
            stored = jsonable(value)
            canonical(stored)
        except (TypeError, ValueError) as exc:
            raise PlaybookError(
                f"step {key!r} returned a {type(value).__name__}, which has no JSON form ({exc}); "
                "return str, int, float, bool, None, or lists and dicts of them"
            ) from None
        await run.store.commit(skey, {"v": 1, "tool": f"step:{key}", "out": stored, "at": run.store_clock()}, tag=f"step:{run.play.name}")
        return stored

    async def sleep(self, seconds: float) -> None:
        """Sleep durably: the row steps aside (its slot goes to another row) and comes back when
        the time is up.  The wake time is stored, so a replay skips a sleep already over, and a
        rerun after a restart wakes the row at the time first set, not ``seconds`` later."""
        if self._signal is not None:
            raise self._signal
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise PlayDefinitionError(f"ctx.sleep(): seconds must be a finite number >= 0, not {seconds!r}")
        run = self._run
        skey = self._step_key("sleep", "")
        record = run.store.lookup(skey)
        now = run.store_clock()
        if record is MISSING:
            wake = now + seconds
            await run.store.commit(skey, {"v": 1, "tool": "sleep", "out": wake, "at": now}, tag=f"step:{run.play.name}")
        else:
            wake = record["out"]
        left = wake - run.store_clock()
        if left <= 0:
            return
        if left <= IN_PLACE:
            await asyncio.sleep(left)
            return
        signal = self._signal = Sleeping(asyncio.get_running_loop().time() + left, wake)
        raise signal

    def _step_key(self, kind: str, key: str) -> str:
        seen = self._seen
        if seen is None:
            seen = self._seen = {}
        name = f"\x1f{kind}:{key}"  # cannot collide with a tool's name
        n = seen[name] = seen.get(name, -1) + 1
        return "s" + digest(f"{self._run.play.name}\x1f{self.row_key}{name}\x1f{n}")

    async def _call(self, tool: Tool, input: Any, force: bool, ttl: float | None, kwargs: dict[str, Any]) -> tuple[Any, bool]:
        if self._signal is not None:
            raise self._signal  # a suspension the play caught: the row still steps aside
        try:
            return await self._dispatch(tool, input, force, ttl, kwargs)
        except Suspend as signal:
            self._signal = signal
            raise
        except RunFatal as exc:
            self._signal = exc
            self._run.fatal_stop(exc, self.position)
            raise

    def _count(self, tool: Tool, *, reused: bool) -> None:
        self.calls += 1
        self.cost += tool.cost
        if reused:
            self._run.call_reused(tool)
        else:
            self._run.call_executed(tool)

    async def _dispatch(self, tool: Tool, input: Any, force: bool, ttl: float | None, kwargs: dict[str, Any]) -> tuple[Any, bool]:
        run = self._run
        values = tool.bind(input, kwargs)
        try:
            payload = canonical(values)  # plain inputs need no normalising (the common case)
            normal = values
        except (TypeError, ValueError):
            normal = _normal_input(tool, values)
            payload = canonical(normal)
        key = "r" + receipt_key(tool.name, tool.version, payload, tool.account)
        seen = self._seen
        if seen is None:
            seen = self._seen = {}
        n = seen[tool.name] = seen.get(tool.name, -1) + 1
        logical = f"{self.row_key}/{tool.name}/{n}" if force or run.force_all else None
        force = logical is not None and run.must_force(logical)
        store = run.store
        while not force:
            record = store.lookup(key, ttl)
            if record is not MISSING:
                self._count(tool, reused=True)
                return record["out"], record["miss"]
            pending = store.inflight.get(key)
            if pending is None:
                break
            # The same call is in flight for another row: wait for its receipt, don't pay twice.
            await asyncio.wait((pending,))
        idem = digest(f"{key}\x1f{run.run_id}\x1f{logical}") if force else key
        send = _sender(tool, normal if tool.json_input else values, CallEnv(run.http_client, idem))
        done = store.inflight[key] = asyncio.get_running_loop().create_future()
        leases = store.leases
        try:
            if not await leases.take(key):
                # Another process is paying for this call right now: wait for its receipt.
                check = (lambda: MISSING) if force else (lambda: store.lookup(key, ttl))
                record = await leases.wait(key, check, MISSING)
                if record is not MISSING:
                    self._count(tool, reused=True)
                    return record["out"], record["miss"]
            elif not force:
                # Another process may have paid and let go between our lookup and our lease.
                record = store.lookup(key, ttl)
                if record is not MISSING:
                    self._count(tool, reused=True)
                    return record["out"], record["miss"]
            run.reserve(tool)
            try:
                if tool.batch_size is not None:
                    output, miss = await run.batcher(tool).call(normal)
                elif tool.provider is not None:
                    # The ticket outlives a suspension: a replayed call keeps its retry count.
                    call_id = logical or f"{self.row_key}/{tool.name}/{n}"
                    try:
                        output, miss = await tool.provider.dispatch(send, run.ticket(call_id, tool, self.position))
                    except Held:
                        raise
                    except BaseException:
                        run.ticket_done(call_id)
                        raise
                    run.ticket_done(call_id)
                else:
                    output, miss = await send()
            except BaseException:
                run.refund(tool)
                raise
            self._count(tool, reused=False)
            try:
                stored = jsonable(output)
            except (TypeError, ValueError) as exc:
                raise ToolError(f"tool {tool.name!r} returned a value that cannot be stored as JSON: {exc}", tool=tool.name) from None
            record = {
                "v": 1,
                "tool": tool.name,
                "ver": tool.version,
                "acct": tool.account,
                "in": normal,
                "out": stored,
                "miss": miss,
                "cost": tool.cost,
                "at": run.store_clock(),
            }
            await store.commit(key, record, tag=tool.name)
            if force:
                run.forced(logical)  # type: ignore[arg-type]
        finally:
            leases.release(key)  # after the receipt is committed: a waiting process finds it
            if store.inflight.get(key) is done:
                del store.inflight[key]
            done.set_result(None)
        return stored, miss


class Call:
    """A call not made yet: a leg of :meth:`Context.waterfall`."""

    __slots__ = ("tool", "input", "force", "ttl", "kwargs")

    def __init__(self, tool: Tool, input: Any, force: bool, ttl: float | None, kwargs: dict[str, Any]) -> None:
        self.tool = tool
        self.input = input
        self.force = force
        self.ttl = ttl
        self.kwargs = kwargs

    def __repr__(self) -> str:
        args = [] if self.input is NO_INPUT else [repr(self.input)]
        args += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"<Call {self.tool.name}({', '.join(args)})>"


def _normal_input(tool: Tool, values: Any) -> Any:
    if not isinstance(values, dict):  # a batch tool's single input
        try:
            return jsonable(values)
        except (TypeError, ValueError) as exc:
            raise ToolError(f"tool {tool.name!r}: input {_short(values)} cannot be part of a receipt key ({exc})", tool=tool.name) from None
    normal = {}
    for name, value in values.items():
        try:
            normal[name] = jsonable(value)
        except (TypeError, ValueError) as exc:
            raise ToolError(
                f"tool {tool.name!r}: input {name}={_short(value)} cannot be part of a receipt key ({exc})",
                tool=tool.name,
            ) from None
    return normal


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _sender(tool: Tool, values: dict[str, Any], env: CallEnv) -> Any:
    async def send() -> tuple[Any, bool]:
        try:
            return await tool.invoke(values, env)
        except ToolError as exc:
            if exc.status in (401, 402, 403):  # a Python tool's "bad credentials" stops the run as HTTP's does
                raise RunFatal(f"tool {tool.name!r}: {exc} (status {exc.status})", tool=tool.name, provider=exc.provider, status=exc.status) from exc
            raise
        except PlaybookError:
            raise
        except Exception as exc:
            # A tool's own exception stays the row's error, with the tool named on it.
            exc.add_note(f"raised by tool {tool.name!r}")
            raise

    return send
