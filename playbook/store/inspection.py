"""Looking at a store: one receipt, every receipt as a DataFrame, counts, and clearing a tool;
and the words for a receipt that cannot be read."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, TypeVar, cast

import pandas as pd

from playbook._internal.renamed import RenamedKeys
from playbook.errors import ReceiptError
from playbook.records import Receipt
from playbook.store.protocol import Backend, Damaged, StoreFailure, cannot_read
from playbook.store.records import Record, checked, damage, receipt_of
from playbook.tools.protocol import NO_INPUT
from playbook.tools.tool import engine_of

if TYPE_CHECKING:
    from playbook.tools.tool import Tool

__all__ = ["Inspection", "StoreStats", "unreadable"]

# receipts(): the columns of text, numbers and flags; input and output stay the objects returned
_RECEIPT_DTYPES: dict[str, type] = {
    "address": str,
    "tool": str,
    "version": str,
    "account": str,
    "miss": bool,
    "cost": float,
    "created_at": float,
}

T = TypeVar("T")


class StoreStats(TypedDict):
    """What :meth:`Inspection.stats` (``store.stats()``) says of a store."""

    location: str  # where it is, as shown (a URL's password masked)
    receipts: int
    by_tool: dict[str, int]  # receipts per tool
    row_memos: int
    cost_stored: float  # what the receipts it holds cost
    bytes: int
    notes: NotRequired[list[str]]  # what the store is (a Redis Cluster: what a failover loses), when said


class Inspection:
    """What users and ``python -m playbook cache`` look at in a store: a part of
    :class:`~playbook.store.engine.StoreEngine`.  ``drain`` writes what the store still has
    queued, before a look; ``cleared`` marks the store once a clearing is done (marks.py)."""

    def __init__(
        self,
        backend: Backend,
        *,
        location: str,
        drain: Callable[[], None],
        cleared: Callable[[], None],
        about: Sequence[str] = (),
    ) -> None:
        self._backend = backend
        self._about = about
        self._location = location
        self._drain = drain
        self._cleared = cleared

    def __repr__(self) -> str:
        return f"<Inspection of {self._location}>"

    def get(self, tool: Tool[object], input: object = NO_INPUT, /, **kwargs: object) -> Receipt | None:
        """The receipt for calling ``tool`` with this input, or ``None`` if it was never paid for.

        Raises ``ReceiptError`` if the receipt is there but cannot be read.
        """
        engine = engine_of(tool)
        key = engine.address(engine.bind(input, kwargs))
        found = self._inspect(lambda: self._backend.get(key))
        if found is None:
            return None
        try:
            if type(found) is Damaged:
                problem = found.problem
            else:
                return receipt_of(checked(found))
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            problem = damage(exc)
        raise ReceiptError(
            f"{unreadable(self._backend, key, problem)}. A run that needs it makes the call again and replaces it; "
            f"`python -m playbook cache clear --store {self._location} --tool {tool.name}` drops all of that tool's receipts."
        )

    def records(self, tool: str | None = None) -> Iterator[tuple[str, Record | None]]:
        """Every receipt (or one tool's) as ``(key, record)``, oldest first, values in stored
        form; ``record`` is ``None`` for one that cannot be read."""
        for key, found in self._inspect(lambda: list(self._backend.records(tool))):
            try:
                yield key, None if type(found) is Damaged else checked(found)
            except ValueError:
                yield key, None

    def receipts(self, tool: str | Tool[object] | None = None) -> pd.DataFrame:
        """All readable receipts (or one tool's) as a DataFrame, oldest first.

        ``input`` and ``output`` hold the values as first returned, whatever they are (a miss's
        ``None`` does not turn a column of ints into floats); ``miss`` is boolean, ``cost`` a
        float and ``created_at`` a UTC datetime."""
        name = _tool_name(tool)
        receipts = []
        for _, record in self.records(name):
            if record is None:
                continue
            try:
                receipts.append(receipt_of(record))
            except (ValueError, TypeError, KeyError, IndexError):
                continue  # a tag this playbook does not know: left out, as an unreadable record is
        columns: dict[str, Any] = {}
        for field in Receipt.model_fields:
            values = [getattr(r, field) for r in receipts]
            columns[field] = pd.Series(values, dtype=_RECEIPT_DTYPES.get(field, object))
        columns["created_at"] = pd.to_datetime(columns["created_at"], unit="s", utc=True).astype(
            "datetime64[us, UTC]"
        )
        return pd.DataFrame(columns)

    def stats(self) -> StoreStats:
        """How many receipts (per tool) and row memos the store holds, and its size (bytes)."""
        self._drain()
        counts = self._inspect(self._backend.counts)
        found: StoreStats = {
            "location": self._location,
            "receipts": sum(n for n, _ in counts.by_tool.values()),
            "by_tool": {name: n for name, (n, _) in sorted(counts.by_tool.items())},
            "row_memos": counts.memos,
            "cost_stored": round(sum(cost for _, cost in counts.by_tool.values()), 6),
            "bytes": counts.bytes,
        }
        if self._about:
            found["notes"] = list(self._about)
        return cast(StoreStats, RenamedKeys(dict(found), {"path": "location"}, "ReceiptStore.stats()"))

    def clear(self, tool: str | Tool[object] | None = None) -> int:
        """Remove one tool's receipts, and the row memos of rows that used it, so the next run
        pays for that tool again; or, without ``tool``, everything.  Returns the records removed."""
        self._drain()
        name = _tool_name(tool)
        try:
            removed = self._backend.clear(name)
        except StoreFailure as exc:
            raise ReceiptError(f"cannot clear the receipt store at {self._location}: {exc.reason}") from None
        self._cleared()  # fewer receipts, on purpose: the store is not lost
        return removed

    def memo_count(self, tool: str) -> int:
        """How many row memos used ``tool`` (what :meth:`clear` of it drops besides its receipts)."""
        self._drain()
        return self._inspect(lambda: self._backend.memo_count(tool))

    def _inspect(self, work: Callable[[], T]) -> T:
        try:
            return work()
        except StoreFailure as exc:
            raise cannot_read(self._location, exc) from None


def unreadable(backend: Backend, key: str, problem: str) -> str:
    """What is said of the record ``key`` in ``backend`` that cannot be read (``problem``: how)."""
    try:
        tool = backend.tool_of(key)
    except StoreFailure:
        tool = None
    named = f" of tool {tool!r}" if tool else ""
    return f"receipt {key}{named} in {backend.location} cannot be read: {problem}"


def _tool_name(tool: str | Tool[object] | None) -> str | None:
    return tool if tool is None or isinstance(tool, str) else tool.name
