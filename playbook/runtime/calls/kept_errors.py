"""Errors kept as a call's answer, so that the call is not paid for again.

A client error is the provider's answer to an input: kept as the call's receipt, so that no
rerun, and no identical call of another row, asks again (and is counted, often billed, again).
A paid answer with no JSON form is kept as a receipt saying so.  A call whose input has no JSON
form has no address, and is not sent: its error names the input at fault."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from playbook.errors import ToolError
from playbook.store.records import Refusal
from playbook.store.records import record as receipt_record
from playbook.tagged import Unencodable
from playbook.tools.protocol import Spent, ToolEngine

if TYPE_CHECKING:
    from playbook.runtime.calls.scope import RunScope

__all__ = ["ONE_REQUEST", "not_storable", "refusal", "refused", "replayed", "unkeyable"]

ONE_REQUEST = Spent(0.0, None, 1)  # what a refusal costs: one request, no money


def refusal(exc: ToolError) -> bool:
    """A client error (4xx) is the provider's answer to this input: asking again gets the same,
    and is counted (often billed) again.  Not a refusal: 401/402/403 (fatal), 429 and the
    retryable 408/409/425 (the governor tries again)."""
    return exc.status is not None and 400 <= exc.status < 500 and not exc.retryable and type(exc) is ToolError


async def refused(scope: RunScope, tool: ToolEngine, key: str, values: Any, exc: ToolError) -> None:
    """Keep a refusal as the call's receipt (its status and what the provider said), so that no
    rerun, and no identical call of another row, asks again; ``refresh=True`` (on the call, or
    the run's ``refresh="all"``) does.  The caller counts the request (``ONE_REQUEST``)."""
    assert exc.status is not None
    exc.args = (
        f"{exc} (kept as this call's answer: ctx.tool(..., refresh=True) or the run option refresh='all' asks again)",
        *exc.args[1:],
    )
    meta = {
        "tool": tool.name,
        "version": tool.identity,
        "account": tool.account,
        "cost": 0.0,
        "input": values,
    }
    # the group of its replays shows the tool's URL too
    stored = exc.status if exc.literal is None else [exc.status, *exc.literal]
    record = receipt_record(
        key, stored=stored, tagged=False, at=scope.clock(), error=str(exc), refused=True, **meta
    )
    await scope.store.commit(record, paid=1)


def replayed(tool: ToolEngine, kept: Refusal) -> ToolError:
    """The error a kept refusal answers with: the first one's message, status and group."""
    error = ToolError(kept.message, tool=tool.name, status=kept.status)
    error.literal = kept.literal
    return error


def not_storable(tool: ToolEngine, problem: str, *, paid_now: bool) -> str:
    """Why a paid answer has no receipt value, and the way out."""
    when = "was paid for" if paid_now else "was paid for in an earlier run"
    bump = (
        "change its version= "
        if tool.version is not None
        else "edit the tool (an edited tool is a new tool) "
    )
    return (
        f"tool {tool.name!r} {when}, but its answer cannot be stored: {problem}. It is not paid for again: "
        f"this call keeps failing until you return plain data from the tool (e.g. return model.model_dump(), "
        f"or a dict of the fields you need) and {bump}so that the call is made afresh"
    )


def unkeyable(tool: ToolEngine, values: Any, exc: Unencodable, hint: str) -> ToolError:
    """The error of a call whose input cannot be part of its address (``hint``: a forgotten await)."""
    return ToolError(
        f"tool {tool.name!r}: {_culprit(values, exc)} cannot be part of an address ({exc.why}){hint}",
        tool=tool.name,
    )


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
