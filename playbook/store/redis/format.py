"""How a record, a row memo and a hint look in Redis (see backend.py for the keys they live under)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from playbook.store.protocol import Damaged, Found
from playbook.store.records import MemoRow, Record, parse_tools
from playbook.tagged import loads

if TYPE_CHECKING:
    from redis.typing import EncodableT

__all__ = [
    "CHUNK",
    "INFO",
    "INFO_WRITE",
    "LEASE_KEEP",
    "LEASE_TAKE",
    "chunks",
    "found_of",
    "grouped",
    "memo_of",
    "memo_value",
    "record_info",
    "record_of",
    "record_value",
    "split",
    "text",
    "tool_names",
]

T = TypeVar("T")

CHUNK = 1000  # keys per pipelined round trip when there can be very many (memos, listings, clearing)
INFO = ["tool", "version", "account", "cost", "input"]
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_NOT_TEXT = "its value is not UTF-8 text (damaged)"
_NOT_OURS = "it is not a record playbook wrote (fields missing or not numbers)"


def record_value(row: Record) -> str:
    """What a replay reads of a record.  ``at`` as JSON is its repr: it comes back bit for bit (it
    decides staleness)."""
    return _dumps([row.at, row.miss, row.flags, row.error]) + "\n" + row.output


def record_info(rows: Sequence[Record]) -> list[EncodableT]:
    """The rest of each record, as :data:`INFO_WRITE`'s arguments: five per record, an input of
    ``""`` for none (an input is JSON text, never empty)."""
    return [
        v
        for row in rows
        for v in (row.tool, row.version, row.account, row.cost, "" if row.input is None else row.input)
    ]


def memo_value(row: MemoRow) -> str:
    return _dumps([row.play, row.tools, row.calls, row.cost, row.flags]) + "\n" + row.output


def split(value: bytes) -> tuple[list[Any], str]:
    """A stored value's JSON header and its output text; ``UnicodeDecodeError`` or ``ValueError`` if
    damaged."""
    head, _, output = value.partition(b"\n")
    header = loads(head)
    if type(header) is not list:
        raise ValueError("no header")
    return header, output.decode("utf-8")


def text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    return (items[start : start + CHUNK] for start in range(0, len(items), CHUNK))


def grouped(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name, key in pairs:
        groups.setdefault(name, []).append(key)
    return groups


def tool_names(value: Any) -> list[str]:
    """The tools a memo used, from its stored value."""
    try:
        return list(parse_tools(split(value)[0][1]))
    except (TypeError, ValueError, IndexError, AttributeError):
        return []  # damaged or gone: its entries in other tools' sets only overcount memo_count


def parsed(build: Callable[[], T]) -> T | Damaged:
    try:
        return build()
    except UnicodeDecodeError:  # before ValueError, its base
        return Damaged(_NOT_TEXT)
    except (TypeError, ValueError, IndexError):
        return Damaged(_NOT_OURS)


def found_of(value: bytes) -> Found | Damaged:
    def build() -> Found:
        (at, miss, flags, error), output = split(value)
        return Found(output, bool(miss), int(flags), error, float(at))

    return parsed(build)


def record_of(key: str, value: Any, info: Any) -> Record | Damaged | None:
    if value is None:
        return None

    def build() -> Record:
        (at, miss, flags, error), output = split(value)
        tool, version, account, cost, input = (None if v is None else bytes(v).decode("utf-8") for v in info)
        return Record(
            key,
            str(tool),
            str(version),
            str(account),
            float(at),
            float(cost or 0),
            bool(miss),
            int(flags),
            input,
            output,
            error,
        )

    return parsed(build)


def memo_of(key: str, value: bytes) -> MemoRow | Damaged:
    def build() -> MemoRow:
        (play, tools, calls, cost, flags), output = split(value)
        return MemoRow(key, str(play), str(tools), int(calls), float(cost), int(flags), output)

    return parsed(build)


# Each lease script handles every key of a batch in one round trip, atomically on the server.
# KEYS: lease keys; ARGV[1]: the owner; ARGV[2]: the lease time in milliseconds.  Taking is
# SET NX PX, except that the owner may take its own lease again (and so extend it).
LEASE_TAKE = """local got = {}
for i, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  got[i] = 0
  if (not held) or held == ARGV[1] then redis.call('SET', key, ARGV[1], 'PX', ARGV[2]); got[i] = 1 end
end
return got"""
# The rest of each record (its hash under ``{prefix}:info:``), written anew: a replaced record
# keeps no field of the old one (an input it no longer has).  One command for a whole batch, as
# redis-py spends more encoding two commands a record than the server takes to run them.
# KEYS: info keys; ARGV: tool, version, account, cost, input ("": none) for each.
INFO_WRITE = """for i, key in ipairs(KEYS) do
  local at = (i - 1) * 5
  redis.call('DEL', key)
  redis.call('HSET', key, 'tool', ARGV[at + 1], 'version', ARGV[at + 2], 'account', ARGV[at + 3], 'cost', ARGV[at + 4])
  if ARGV[at + 5] ~= '' then redis.call('HSET', key, 'input', ARGV[at + 5]) end
end"""
LEASE_KEEP = """for _, key in ipairs(KEYS) do  -- renew (ARGV[2] given) or release the owner's leases
  if redis.call('GET', key) == ARGV[1] then
    if ARGV[2] then redis.call('PEXPIRE', key, ARGV[2]) else redis.call('DEL', key) end
  end
end"""
