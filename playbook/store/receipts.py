"""The receipt store users hold: where receipts live, and how to look at them.

:class:`ReceiptStore` is the public face of :class:`~playbook.store.engine.StoreEngine`, which
does the work (runs, the command line and the cluster use the engine through :func:`engine`).
It shows what a user opens, reads and clears, and nothing of the hot path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from playbook._internal.renamed import deprecated, old_attribute, renamed
from playbook.store.engine import StoreEngine
from playbook.store.health import GRACE_S
from playbook.tools.protocol import NO_INPUT

if TYPE_CHECKING:
    import pandas as pd

    from playbook.records import Receipt
    from playbook.store.inspection import StoreStats
    from playbook.store.records import Record
    from playbook.tools.tool import Tool

__all__ = ["ReceiptStore", "engine"]


class ReceiptStore:
    """Durable receipts of tool calls and memos of finished rows.

    ``ReceiptStore()`` uses ``$PLAYBOOK_HOME``, else ``.playbook/`` at the top of the project;
    ``ReceiptStore("a/directory")`` an SQLite file there; ``ReceiptStore("redis://host:6379/0")``
    a Redis server that many kernels and machines share; ``ReceiptStore("memory")`` nothing
    durable (tests).  ``readonly=True`` opens an existing store only to look at it (what
    ``python -m playbook cache stats/list/export`` do), which works on a full disk or a
    read-only mount too.

    ``durability="strict"`` (the default): a receipt is on the disk (fsync'd) before its row
    goes on, and a Redis server that could lose receipts is said loudly (no append-only file) or
    refused (it evicts keys).  ``durability="best-effort"`` accepts both: SQLite commits survive
    the process being killed but not always the machine crashing, and a Redis server's losses
    are the user's to know (keys it evicts are counted during runs).  On Redis the URL may say
    it too (``redis://host:6379/0?durability=best-effort``), for every process that opens it.

    Pass it to a run as ``store=``.  ``with pb.ReceiptStore(path) as store:`` closes it at the end.
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        *,
        readonly: bool = False,
        durability: str | None = None,
        clock: Callable[[], float] = time.time,
        lease_ttl: float = 30.0,
        write_grace: float = GRACE_S,
    ) -> None:
        # clock and lease_ttl: what "now" is and how long a claim on a call lasts, for tests.  write_grace:
        # how long a store refusing writes is waited for before the rows that would pay park (health.py).
        self._engine = StoreEngine(
            location,
            clock=clock,
            lease_ttl=lease_ttl,
            readonly=readonly,
            durability=durability,
            write_grace=write_grace,
        )

    def __repr__(self) -> str:
        return f"ReceiptStore({self.location!r})"

    def __getattr__(self, name: str) -> Any:
        return old_attribute(self, name, _OLD)

    def __enter__(self) -> ReceiptStore:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def location(self) -> str:
        """Where it is, to show: a directory, ``"memory"``, or a URL with its password masked."""
        return self._engine.location

    @property
    def lost(self) -> str | None:
        """Why this store is taken for one that lost its receipts (a run on it refuses to
        start), or ``None``.  :meth:`accept_loss` accepts what it holds."""
        return self._engine.lost

    def get(self, tool: Tool[object], input: object = NO_INPUT, /, **kwargs: object) -> Receipt | None:
        """The receipt for calling ``tool`` with this input, or ``None`` if it was never paid for.

        Raises ``ReceiptError`` if the receipt is there but cannot be read.
        """
        return self._engine.get(tool, input, **kwargs)

    def receipts(self, tool: str | Tool[object] | None = None) -> pd.DataFrame:
        """All readable receipts (or one tool's) as a DataFrame, oldest first.

        ``input`` and ``output`` hold the values as first returned, whatever they are (a miss's
        ``None`` does not turn a column of ints into floats); ``miss`` is boolean, ``cost`` a
        float and ``created_at`` a UTC datetime."""
        return self._engine.receipts(tool)

    def stats(self) -> StoreStats:
        """How many receipts (per tool) and row memos the store holds, and its size (bytes)."""
        return self._engine.stats()

    def spend(self, by: str | Sequence[str] = ("provider", "tool", "day")) -> pd.DataFrame:
        """What runs on this store spent: one row per ``by`` (any of ``"provider"``, ``"tool"``,
        ``"day"``, a UTC date), with ``calls_paid`` and ``cost_paid`` (sent to a provider, or with
        a cost), ``calls_reused`` and ``cost_saved`` (answered by receipts or row memos instead),
        and of those calls ``calls_unpriced`` and ``reused_unpriced``: an LLM's whose model has no
        price, left out of the money (NaN where no call of a line had a price).
        Each run adds its figures as it ends; rows reused whole count under ``"play <name>"``."""
        return self._engine.spend(by)

    def clear(self, tool: str | Tool[object] | None = None) -> int:
        """Remove one tool's receipts, and the row memos of rows that used it, so the next run
        pays for that tool again; or, without ``tool``, everything.  Returns the records removed."""
        return self._engine.clear(tool)

    def accept_loss(self) -> None:
        """Accept what a lost store holds now (see :attr:`lost`): its mark starts again from here,
        and runs on it go on (paying again for the calls whose receipts are gone).  Unlike
        :meth:`clear`, it removes nothing."""
        self._engine.accept_loss()

    def close(self) -> None:
        """Write what is still queued, and close the connection or file."""
        self._engine.close()


def _path(store: ReceiptStore) -> Path | str:
    """The directory as a :class:`~pathlib.Path`; a URL as given."""
    renamed("ReceiptStore.path", "ReceiptStore.location")
    return store._engine.path


def _records(store: ReceiptStore) -> Callable[[str | None], Iterator[tuple[str, Record | None]]]:
    """Every receipt (or one tool's) as ``(address, record)``, oldest first, values in stored form."""
    deprecated(_RECORDS_GONE)
    return store._engine.records


def _reset(store: ReceiptStore) -> Callable[[], None]:
    renamed("ReceiptStore.reset()", "ReceiptStore.accept_loss()")
    return store.accept_loss


# Deprecated names, served by __getattr__: they work (warning) and dir(store) leaves them out.
_OLD: dict[str, Callable[[Any], Any]] = {"path": _path, "records": _records, "reset": _reset}

# records() yielded pairs and receipts() is a frame: the message says the loop to write instead.
_RECORDS_GONE = (
    "ReceiptStore.records() is deprecated and goes in the next release; use ReceiptStore.receipts(), "
    "a DataFrame with one row per receipt (columns address, tool, input, output, miss, cost, ...): "
    "for r in store.receipts().itertuples(): r.address, r.output"
)


def engine(store: ReceiptStore) -> StoreEngine:
    """The engine behind ``store``, for runs, the command line and the cluster."""
    return store._engine
