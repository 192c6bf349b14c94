"""What a store backend does: the few operations the receipt store needs, on stored text.

:class:`~playbook.store.engine.StoreEngine` is what runs on a backend: it decodes values, warns about
damaged records, groups writes of one event-loop turn into one transaction, keeps paid answers
that could not be written, and runs leases.  A backend only keeps records: SQLite in a directory
(the default), Redis (shared by many kernels and machines) or memory (tests).  Every backend
passes the same tests (``tests/test_store_backends.py``).

Records arrive and leave as text (:mod:`playbook.store.records` owns their shape), so a backend
never parses JSON.  A record it cannot even read as text (bad UTF-8) comes back as
:class:`Damaged`; an operation that cannot be done raises :class:`StoreFailure` with a reason in
words a user can act on, which the engine gives users as a ``ReceiptError`` (:func:`cannot_read`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol, final

from playbook.errors import ReceiptError
from playbook.store.records import MemoFields, MemoRow, Record

__all__ = [
    "ELSEWHERE",
    "Backend",
    "Counts",
    "Damaged",
    "Found",
    "SpendRow",
    "StoreFailure",
    "Tally",
    "cannot_read",
    "elsewhere",
]

ELSEWHERE = "pass store=pb.ReceiptStore('another/directory') to use another store"
# On Redis, another store would pay for every call again: the way out is the same store, back.
ON_REDIS = (
    "start the Redis server (or the cluster's node) again and check the store's URL; a run stopped by it "
    "can be run again and resumes: what it paid for is in the store"
)


def elsewhere(location: str) -> str:
    """What to do when the store at ``location`` fails: on Redis, bring it back; a directory's
    store may be swapped for another."""
    return ON_REDIS if location.startswith(("redis://", "rediss://", "unix://")) else ELSEWHERE


# One line of the spend ledger: UTC day ("2026-12-04"), provider ("" for none), tool, calls paid,
# what they cost, calls reused (answered by receipts or row memos), what those saved.
# day, provider, tool, calls paid, cost paid, calls reused, cost saved, calls paid and reused unpriced
SpendRow = tuple[str, str, str, int, float, int, float, int, int]


class StoreFailure(Exception):
    """A store operation failed; ``reason`` says why in words, ``code`` is the backend's or the OS's
    name for it."""

    def __init__(self, reason: str, code: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def cannot_read(location: str, failure: StoreFailure) -> ReceiptError:
    """What users are told when the store at ``location`` could not be read."""
    return ReceiptError(
        f"cannot read the receipt store at {location}: {failure.reason}; {elsewhere(location)}"
    )


class Found(NamedTuple):
    """What a receipt lookup needs of a record (its output still JSON text)."""

    output: str
    miss: bool
    flags: int
    error: str | None
    at: float


@final  # so that ``type(x) is Damaged`` tells a checker it is not some other record
class Damaged(NamedTuple):
    """A record that is there but cannot be read as text; ``problem`` says how."""

    problem: str


class Counts(NamedTuple):
    """What a store holds: receipts per tool as ``(count, total cost)``, row memos, bytes."""

    by_tool: dict[str, tuple[int, float]]
    memos: int
    bytes: int


class Tally(NamedTuple):
    """Paid calls counted with the receipts that record them, in the same transaction: what a
    cluster job's client reads of a partition whose worker died before it could say (on Redis,
    ``calls`` and ``cost`` added to the fields ``{field}:calls`` and ``{field}:cost`` of the hash ``key``)."""

    key: str
    field: str
    calls: int
    cost: float


class Backend(Protocol):
    """Where records live.  Methods are synchronous and safe to call from any thread."""

    location: str  # a directory or a URL, as messages show it
    readonly: bool
    # True when every read is a round trip over the network: the receipt store then looks up
    # the calls of one event-loop turn together (lookup_many) instead of one by one.
    remote: bool

    # -- receipts and step records ("r…", "s…") ----------------------------------------------

    def lookup(self, key: str) -> Found | Damaged | None: ...

    def lookup_many(self, keys: Sequence[str]) -> list[Found | Damaged | None]: ...

    def tool_of(self, key: str) -> str | None:
        """The tool a (possibly damaged) record belongs to, for messages."""
        ...

    def get(self, key: str) -> Record | Damaged | None:
        """The whole record, for inspection."""
        ...

    def write(self, records: Sequence[Record], released: Sequence[str] = (), owner: str = "") -> int:
        """Write (or replace) records, all or none, and give back ``owner``'s leases on the keys
        ``released`` with them (of the calls they answer: another process that takes one then
        finds the receipt).  Returns how many receipts it added (not those it replaced, nor step
        records): what the store's count of receipts grew by (marks.py)."""
        ...

    def records(self, tool: str | None = None) -> Iterable[tuple[str, Record | Damaged]]:
        """Every receipt (not step records), or one tool's, oldest first."""
        ...

    # -- row memos ("m…") ------------------------------------------------------------------------

    def memos(self, keys: Sequence[str]) -> tuple[Sequence[MemoFields], list[str]]:
        """The memos of ``keys`` that exist (in any order), and the keys of those that cannot be read."""
        ...

    def write_memos(self, rows: Sequence[MemoRow]) -> None:
        """Write (or replace) memos: :meth:`memos` finds them once :meth:`fold_memos` has run."""
        ...

    def fold_memos(self) -> None:
        """Put the memos written since the last fold where :meth:`memos` finds them (a store that
        finds them as written does nothing)."""
        ...

    # -- what a row looked up last time (a remote store reads those receipts ahead) ---------------

    def hints(self, play: str, rows: Sequence[str]) -> dict[str, list[str]]:
        """The addresses each row of ``play`` (by row id) used when it last finished."""
        ...

    def write_hints(self, hints: Sequence[tuple[str, str, str]]) -> None:
        """Remember ``(play, row, "key key ...")``: the receipts a finished row used."""
        ...

    # -- what runs spent ---------------------------------------------------------------------------

    def write_spend(self, rows: Sequence[SpendRow]) -> None:
        """Add each line's calls and money to the ledger's line of the same day, provider and tool."""
        ...

    def spend_rows(self) -> list[SpendRow]:
        """Every line of the ledger."""
        ...

    # -- upkeep ----------------------------------------------------------------------------------

    def counts(self) -> Counts: ...

    def clear(self, tool: str | None = None) -> int:
        """Remove one tool's receipts and the memos of rows that used it, or everything; returns
        how many records went."""
        ...

    def memo_count(self, tool: str) -> int: ...

    # -- its mark: how many receipts it held, and when (marks.py) ---------------------------------

    def receipt_count(self) -> int: ...

    @property
    def identity(self) -> str:
        """An id made with the data: a store made again has another."""
        ...

    def read_mark(self) -> str | None:
        """The text of the mark kept beside the data (:class:`~playbook.store.marks.Mark` reads
        it), or None when there is none or it cannot be read."""
        ...

    def write_mark(self, mark: str) -> None:
        """Keep ``mark`` (a mark's text) beside the data, in place of the one before."""
        ...

    # -- leases: which process pays for a call now ------------------------------------------------

    def take(self, keys: Sequence[str], owner: str, ttl: float) -> list[bool]:
        """Lease each key to ``owner`` for ``ttl`` seconds unless another owner's lease is live."""
        ...

    def take_and_look(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> tuple[list[bool], list[Found | Damaged | None]]:
        """:meth:`take`, then each key's receipt as :meth:`lookup_many` finds it once the leases
        are taken (on a store across the network, one round trip for both)."""
        ...

    def renew(self, keys: Sequence[str], owner: str, ttl: float) -> None: ...

    def release(self, keys: Sequence[str], owner: str) -> None: ...

    def holder(self, key: str) -> tuple[str, float] | None:
        """Who holds ``key`` and for how many more seconds, or ``None``."""
        ...

    def close(self) -> None: ...
