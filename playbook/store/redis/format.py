"""How a record, a row memo and a hint look in Redis (see backend.py for the keys they live under)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from playbook.store.protocol import Damaged, Found
from playbook.store.records import MemoRow, Record, parse_tools
from playbook.tagged import loads

__all__ = [
    "CHUNK",
    "HEAD",
    "LEASE_KEEP",
    "LEASE_TAKE",
    "REMOVE",
    "TAKE_LOOK",
    "WRITE",
    "chunks",
    "found_of",
    "grouped",
    "head_of",
    "memo_of",
    "memo_value",
    "record_of",
    "record_value",
    "split",
    "text",
    "tool_names",
]

T = TypeVar("T")

CHUNK = 1000  # keys per pipelined round trip when there can be very many (memos, listings, clearing)
HEAD = 511  # bytes of a value read for its header alone (GETRANGE 0 HEAD): a longer one is read whole
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_NOT_TEXT = "its value is not UTF-8 text (damaged)"
_NOT_OURS = "it is not a record playbook wrote (fields missing or not numbers)"


def record_value(row: Record) -> bytes:
    """A whole record in one string: ``[at, miss, flags, error, tool, version, account, cost, n]``
    as JSON (``n``: the output's length in bytes), a newline, the output, then a newline and the
    input when it has one.  A replay reads the first four fields and the output: a record an
    older playbook wrote (``[at, miss, flags, error]``, then the output alone) reads the same.
    ``at`` as JSON is its repr: it comes back bit for bit (it decides staleness)."""
    output = row.output.encode("utf-8")
    cost: float | int = int(row.cost) if row.cost == int(row.cost) else row.cost  # "0", not "0.0"
    head = _dumps(
        [row.at, int(row.miss), row.flags, row.error, row.tool, row.version, row.account, cost, len(output)]
    )
    value = head.encode("utf-8") + b"\n" + output
    return value if row.input is None else value + b"\n" + row.input.encode("utf-8")


def memo_value(row: MemoRow) -> str:
    return _dumps([row.play, row.tools, row.calls, row.cost, row.flags]) + "\n" + row.output


def split(value: bytes) -> tuple[list[Any], bytes]:
    """A stored value's JSON header and what follows it (bytes); ``UnicodeDecodeError`` or
    ``ValueError`` if damaged."""
    head, _, rest = bytes(value).partition(b"\n")
    header = loads(head)
    if type(header) is not list:
        raise ValueError("no header")
    return header, rest


def _output(header: list[Any], rest: bytes) -> tuple[str, str | None]:
    """A record's output and input (None: none), from its header and what follows it."""
    if len(header) < 9:  # written by an older playbook: the output alone
        return rest.decode("utf-8"), None
    n = int(header[8])
    output = rest[:n].decode("utf-8")
    if len(rest) < n or (len(rest) > n and rest[n : n + 1] != b"\n"):
        raise ValueError("cut short")
    return output, (rest[n + 1 :].decode("utf-8") if len(rest) > n else None)


def head_of(value: Any) -> list[Any] | None:
    """A value's header alone (from a whole value or its first bytes), None when it cannot be read."""
    try:
        head = bytes(value).partition(b"\n")[0]
        header = loads(head)
    except (TypeError, ValueError):
        return None
    return header if type(header) is list else None


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
        header, rest = split(value)
        at, miss, flags, error = header[:4]
        return Found(_output(header, rest)[0], bool(miss), int(flags), error, float(at))

    return parsed(build)


def record_of(key: str, value: Any, info: Any = None) -> Record | Damaged | None:
    """A whole record from its value (``info``: the hash an older playbook kept beside it, for
    a record not yet rewritten: tool, version, account, cost, input)."""
    if value is None:
        return None

    def build() -> Record:
        header, rest = split(value)
        at, miss, flags, error = header[:4]
        output, input = _output(header, rest)
        if len(header) >= 9:
            tool, version, account, cost = header[4:8]
        else:
            # an older playbook kept a call without input as "" (an input is JSON text, never empty)
            tool, version, account, cost, input = (
                None if v is None or (field == 4 and not v) else bytes(v).decode("utf-8")
                for field, v in enumerate(info or (None,) * 5)
            )
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
        return MemoRow(
            key, str(play), str(tools), int(calls), float(cost), int(flags), output.decode("utf-8")
        )

    return parsed(build)


# The scripts run on the keys of one slot (a cluster's unit), or of a whole batch on one server.
# Leases: KEYS: lease keys; ARGV[1]: the owner; ARGV[2]: the lease time in milliseconds.  Taking is
# SET NX PX, except that the owner may take its own lease again (and so extend it).
LEASE_TAKE = """local got = {}
for i, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  got[i] = 0
  if (not held) or held == ARGV[1] then redis.call('SET', key, ARGV[1], 'PX', ARGV[2]); got[i] = 1 end
end
return got"""
# Take leases and read the receipts they are for, at once.  KEYS: n lease keys, then their n
# receipt keys; ARGV as LEASE_TAKE's.  Returns n flags then n values (nil: none).
TAKE_LOOK = """local n = #KEYS / 2
local got = {}
for i = 1, n do
  local held = redis.call('GET', KEYS[i])
  got[i] = 0
  if (not held) or held == ARGV[1] then redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2]); got[i] = 1 end
end
for i = 1, n do got[n + i] = redis.call('GET', KEYS[n + i]) end
return got"""
LEASE_KEEP = """for _, key in ipairs(KEYS) do  -- renew (ARGV[2] given) or release the owner's leases
  if redis.call('GET', key) == ARGV[1] then
    if ARGV[2] then redis.call('PEXPIRE', key, ARGV[2]) else redis.call('DEL', key) end
  end
end"""
# Write records, count the receipts new to the store, give back the owner's leases.  KEYS: the
# counter, n record keys, then lease keys; ARGV: n, the owner, n flags ("1": a receipt, counted),
# n values.  A receipt is counted when its key did not exist: a script run again (its answer lost
# with a connection) counts nothing twice.  Returns how many receipts it added.
WRITE = """local n = tonumber(ARGV[1])
local added = 0
for i = 1, n do
  local key = KEYS[i + 1]
  if ARGV[2 + i] == '1' and redis.call('EXISTS', key) == 0 then added = added + 1 end
  redis.call('SET', key, ARGV[2 + n + i])
end
if added > 0 then redis.call('INCRBY', KEYS[1], added) end
for i = n + 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[2] then redis.call('DEL', KEYS[i]) end
end
return added"""
# Remove records and count down the receipts among them.  KEYS: the counter, then record keys;
# ARGV: a flag for each ("1": a receipt).  Returns how many records went.
REMOVE = """local gone = 0
local receipts = 0
for i = 2, #KEYS do
  if redis.call('UNLINK', KEYS[i]) == 1 then
    gone = gone + 1
    if ARGV[i - 1] == '1' then receipts = receipts + 1 end
  end
end
if receipts > 0 then redis.call('DECRBY', KEYS[1], receipts) end
return gone"""
