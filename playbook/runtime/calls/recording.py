"""The last step of a paid call (see pipeline.py): its answer becomes a receipt, written before
anything else happens to the row, and the row goes on with the answer as stored."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from playbook.errors import ReceiptError, ToolError
from playbook.runtime.calls.kept_errors import not_storable
from playbook.store.records import Record
from playbook.store.records import record as receipt_record
from playbook.tagged import Unencodable, decode, encode
from playbook.tools.protocol import ToolEngine

if TYPE_CHECKING:
    from playbook.runtime.calls.scope import RunScope

__all__ = ["record"]


async def record(
    scope: RunScope,
    tool: ToolEngine,
    key: str,
    values: Any,
    answer: Any,
    miss: bool,
    cost: float,
    requests: int = 1,
) -> tuple[Any, bool]:
    """Write the receipt of a paid answer (``cost``: what it cost; ``requests``: those it took, as
    ``calls_executed`` counts them); returns the answer as stored, so the first run sees exactly
    what every replay will (a pydantic model as its dict, a tuple as a tuple)."""
    store = scope.store
    try:
        stored = encode(answer)
    except Unencodable as exc:
        # Paid for, but it has no JSON form: keep a receipt saying so, so no rerun pays again.
        await store.commit(
            _receipt(tool, key, values, None, False, scope.clock(), miss, cost, str(exc)),
            paid=requests,
            cost=cost,
        )
        raise ToolError(not_storable(tool, str(exc), paid_now=True), tool=tool.name) from None
    tagged = stored is not answer
    receipt = _receipt(tool, key, values, stored, tagged, scope.clock(), miss, cost, None)
    try:  # store.commit, its first try awaited here: a coroutine less on every call paid for
        await store.write(receipt, paid=requests, cost=cost)
    except ReceiptError as exc:
        await store.rewrite(receipt, exc)
    if scope.recorder is not None:
        scope.recorder.add(tool, values, stored, miss, cost)
    return (decode(stored) if tagged else answer), miss


def _receipt(
    tool: ToolEngine,
    key: str,
    values: Any,
    stored: Any,
    tagged: bool,
    at: float,
    miss: bool,
    cost: float,
    error: str | None,
) -> Record:
    """The receipt of ``tool``'s answer for ``key`` (its fields named here, not gathered in a
    dict: once per call paid for)."""
    return receipt_record(
        key,
        tool=tool.name,
        version=tool.identity,
        account=tool.account,
        cost=cost,
        input=values,
        stored=stored,
        tagged=tagged,
        at=at,
        miss=miss,
        error=error,
    )
