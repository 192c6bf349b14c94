"""The shape of what the store keeps, and of what its lookups return.

Kept: one row per receipt (or step record), :class:`Record`, and one per row memo,
:class:`MemoRow`.  Values are tagged JSON text (:mod:`playbook.tagged`); ``flags`` says which
columns hold tags, so a plain value is read with one ``json.loads`` and nothing else.  The fields
a lookup needs are columns of their own: replaying a receipt parses its output, not an envelope
around it.

Returned: a receipt lookup gives a :class:`Hit` (the value as first returned) or ``MISSING``; a
memo lookup a :class:`Memo`.  Both are named tuples made on the hot path of a replay, a million
times at a million rows: there they are made with ``tuple.__new__(Hit, (...))``, a C call, not
with a named tuple's own constructor, a Python function that costs as much again as the tuple.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, NamedTuple

from playbook.addresses import RECEIPT
from playbook.records import Receipt
from playbook.tagged import Unencodable, decode, dumps, encode, loads

_new = tuple.__new__

__all__ = [
    "COLUMNS",
    "INPUT_TAGGED",
    "MISSING",
    "OUTPUT_TAGGED",
    "REFUSED",
    "Hit",
    "Memo",
    "MemoFields",
    "MemoRow",
    "Missing",
    "Record",
    "Refusal",
    "checked",
    "damage",
    "is_receipt",
    "memo_flags",
    "memo_local",
    "memo_tools",
    "memo_unpriced",
    "parse_tools",
    "receipt_of",
    "record",
]

OUTPUT_TAGGED = 1  # the output holds tags: decode it when read
INPUT_TAGGED = 2  # the input does
# A memo's flags above this bit count the free local calls among its calls (a memo of before: none),
# and above the next its calls with no price (unpriced: a memo of before, none).
_MEMO_LOCAL_SHIFT = 8
_MEMO_UNPRICED_SHIFT = 40
# the provider refused the call (a client error): the output is its status (or [status, sent,
# written]), ``error`` what it said
REFUSED = 4


class Refusal(NamedTuple):
    """A call the provider refused with a client error (HTTP 422, 404 not counted as a miss...):
    its answer, kept as a receipt so that it is not asked again."""

    status: int
    message: str
    literal: tuple[str, str] | None = None  # the request as sent, as the tool wrote it (ToolError.literal)


_NO_INPUT: Final = object()


class Hit(NamedTuple):
    """What a receipt lookup finds: the ``value`` as first returned (``None`` for a refusal),
    whether the answer was a ``miss`` (a "not found"), and ``error``: the text of a paid answer
    that had no JSON form, or the :class:`Refusal` the provider answered; ``at``: when it was
    stored (epoch seconds)."""

    value: Any
    miss: bool
    error: str | Refusal | None
    at: float


class Memo(NamedTuple):
    """What a row-memo lookup finds: a finished row's ``output``, how many ``calls`` it made
    (``local`` of them of free local tools), their ``cost``, and the ``tools`` it used (name ->
    fingerprint; the rows of one play share one mapping); ``unpriced`` of its calls had no price."""

    output: dict[str, Any]
    calls: int
    cost: float
    local: int
    tools: Mapping[str, str]
    unpriced: int = 0


class Record(NamedTuple):
    """One row of the ``receipt`` table (receipts ``r…``, and steps and sleeps ``s…``)."""

    key: str
    tool: str
    version: str
    account: str
    at: float
    cost: float
    miss: bool
    flags: int
    input: str | None
    output: str
    error: str | None  # set when a paid answer had no JSON form: the call is not made again


COLUMNS = "key, tool, version, account, at, cost, miss, flags, input, output, error"


class MemoRow(NamedTuple):
    """One row memo: a finished row's output (``flags`` as for a record) and what it used."""

    key: str
    play: str
    tools: str  # " name=fingerprint name=fingerprint " (memo_tools): clearing a tool finds its memos
    calls: int
    cost: float
    flags: int
    output: str


# A memo as a backend reads it: a MemoRow, or its fields as a plain tuple (a million rows' memos
# are read without making a million named tuples).
MemoFields = tuple[str, str, str, int, float, int, str]


def is_receipt(key: str) -> bool:
    """A tool call's receipt (not a step or sleep record)."""
    return key.startswith(RECEIPT)


def record(
    key: str,
    *,
    tool: str,
    stored: object,
    tagged: bool,
    at: float,
    miss: bool = False,
    version: str = "",
    account: str = "",
    cost: float = 0.0,
    input: object = _NO_INPUT,
    error: str | None = None,
    refused: bool = False,
) -> Record:
    """A row for ``stored`` (an :func:`encode`\\ d value; ``tagged`` if encoding changed it);
    ``refused``: a refusal, ``stored`` its status and ``error`` what the provider said."""
    flags = (OUTPUT_TAGGED if tagged else 0) | (REFUSED if refused else 0)
    input_text = None
    if input is not _NO_INPUT:
        try:
            encoded = encode(input)
        except Unencodable:
            encoded = None  # keyed all the same; only the listing of this receipt lacks its input
        flags |= INPUT_TAGGED if encoded is not input else 0
        input_text = dumps(encoded)
    fields = (
        key,
        tool,
        version,
        account,
        float(at),
        float(cost),
        bool(miss),
        flags,
        input_text,
        dumps(stored),
        error,
    )
    return _new(Record, fields)  # once per call paid for (module docstring)


def receipt_of(row: Record) -> Receipt:
    """A ``Receipt`` (values as first returned) from a row of the receipt table; ``ValueError`` if damaged."""
    key, tool, version, account, at, cost, miss, flags, input_text, output_text, _ = row
    output = loads(output_text)
    data = None if input_text is None else loads(input_text)
    return Receipt(
        address=key,
        tool=tool,
        version=version,
        account=account,
        miss=bool(miss),
        cost=cost,
        created_at=at,
        input=decode(data) if flags & INPUT_TAGGED else data,
        output=decode(output) if flags & OUTPUT_TAGGED else output,
    )


def memo_flags(tagged: bool, local: int, unpriced: int = 0) -> int:
    """A memo's flags: whether its output holds tags, how many of its calls were of free local
    tools (a rerun that reuses the row counts those as local, the rest as answered by receipts),
    and how many had no price (their cost is not in the memo's)."""
    return (
        (OUTPUT_TAGGED if tagged else 0) | (local << _MEMO_LOCAL_SHIFT) | (unpriced << _MEMO_UNPRICED_SHIFT)
    )


def memo_local(flags: int) -> int:
    """The free local calls a memo's ``flags`` count (:func:`memo_flags`)."""
    return (flags >> _MEMO_LOCAL_SHIFT) & ((1 << (_MEMO_UNPRICED_SHIFT - _MEMO_LOCAL_SHIFT)) - 1)


def memo_unpriced(flags: int) -> int:
    """The calls with no price a memo's ``flags`` count (:func:`memo_flags`)."""
    return flags >> _MEMO_UNPRICED_SHIFT


def memo_tools(tools: dict[str, str]) -> str:
    """The tools a row used, as the memo table keeps them: `` name=fingerprint name=fingerprint ``,
    so that clearing a tool finds the memos of rows that used it in SQL."""
    return " " + " ".join(f"{name}={fp}" for name, fp in tools.items()) + " "


@functools.lru_cache(maxsize=1024)
def parse_tools(text: str) -> Mapping[str, str]:
    """The tools of :func:`memo_tools`' text (read-only: the rows of one play share one)."""
    return MappingProxyType(dict(part.split("=", 1) for part in text.split()))


def checked(record: Record) -> Record:
    """``record`` if its values are JSON; ``ValueError`` if not."""
    loads(record.output)
    if record.input is not None:
        loads(record.input)
    return record


def damage(exc: BaseException) -> str:
    """What is wrong with a record that cannot be read."""
    if isinstance(exc, UnicodeDecodeError):
        return "its value is not UTF-8 text (damaged)"
    if isinstance(exc, ValueError) and str(exc).startswith("unknown tag"):
        return f"its value cannot be decoded ({exc})"
    if isinstance(exc, ValueError):
        return "its value is not valid JSON (truncated or overwritten)"
    return f"its value is not a record playbook wrote ({type(exc).__name__}: {exc})"


class Missing(enum.Enum):
    """The type of ``MISSING``, "no receipt": a tool may legitimately return ``None``.  One member,
    so that ``found is not MISSING`` tells a type checker that ``found`` is a :class:`Hit`."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = Missing.MISSING
