"""A store backend on a Redis server: one store shared by every kernel and machine that names it.

Layout, every key under ``{prefix}:`` (``playbook`` unless told)::

    {prefix}:{r… or s…}      hash   one record: tool version account at cost miss flags [input] output [error]
    {prefix}:receipts        zset   receipt keys scored by ``at``: listing oldest first
    {prefix}:tool:{tool}     set    one tool's receipt keys: clearing a tool
    {prefix}:{m…}            hash   one row memo: play tools calls cost flags output
    {prefix}:memos           set    every memo key: counting them
    {prefix}:memos:{tool}    set    the memos of rows that used ``tool``: clearing it drops them too
    {prefix}:lease:{r…}      string the owner of a lease, expiring by Redis's own clock

A batch of records and their index entries go in one MULTI/EXEC (all or none), so no receipt
escapes the clearing of its tool; reads are pipelined (one round trip per batch).  Leases are Lua
scripts, atomic on the server and expiring by its clock: machines whose clocks disagree agree.
The server must keep what it is given (``maxmemory-policy noeviction``, the default): a receipt
evicted is a call paid for again.  Prefixes must not nest (``a``, ``a:b``): clearing one clears both.
"""

from __future__ import annotations

import errno
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import ReceiptError
from .protocol import Counts, Damaged, Found, StoreFailure
from .records import MemoRow, Record, is_receipt, parse_tools

if TYPE_CHECKING:
    import redis
    from redis.typing import EncodableT, FieldT

__all__ = ["RedisBackend"]

T = TypeVar("T")

_CHUNK = 1000  # keys per pipelined round trip when there can be very many (memos, listings, clearing)
_RECORD = ["tool", "version", "account", "at", "cost", "miss", "flags", "output", "input", "error"]  # the first 8 always there
_FOUND = ["output", "miss", "flags", "error", "at"]
_MEMO = ["play", "tools", "calls", "cost", "flags", "output"]
_NOT_TEXT = "its value is not UTF-8 text (damaged)"
_NOT_OURS = "it is not a record playbook wrote (fields missing or not numbers)"

# Each lease script handles every key of a batch in one round trip, atomically on the server.
# KEYS: lease keys; ARGV[1]: the owner; ARGV[2]: the lease time in milliseconds.  Taking is
# SET NX PX, except that the owner may take its own lease again (and so extend it).
_TAKE = """local got = {}
for i, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  got[i] = 0
  if (not held) or held == ARGV[1] then redis.call('SET', key, ARGV[1], 'PX', ARGV[2]); got[i] = 1 end
end
return got"""
_KEEP = """for _, key in ipairs(KEYS) do  -- renew (ARGV[2] given) or release the owner's leases
  if redis.call('GET', key) == ARGV[1] then
    if ARGV[2] then redis.call('PEXPIRE', key, ARGV[2]) else redis.call('DEL', key) end
  end
end"""


class RedisBackend:
    """Records, row memos and leases on the Redis server at ``url`` (``redis://``, ``rediss://``
    or ``unix://``), under keys that start with ``prefix:``."""

    remote = True

    def __init__(self, url: str, *, prefix: str = "playbook", readonly: bool = False) -> None:
        try:
            import redis
            from redis.backoff import ExponentialWithJitterBackoff
            from redis.retry import Retry
        except ImportError:
            raise ReceiptError("a store on Redis needs the redis package: pip install redis") from None
        self.location = masked(url)
        self.readonly = readonly
        self._prefix = prefix + ":"
        self._memos = self._prefix + "memos"
        self._receipts = self._prefix + "receipts"
        try:
            # The pool is thread-safe and resets itself in a forked child (it compares pids).  Two
            # quick retries ride out a restarted server or a dropped idle connection, and are safe:
            # every write sets values (a record, one owner's lease), so twice changes nothing.
            retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2)
            self._client: redis.Redis = redis.Redis.from_url(
                url, socket_timeout=10.0, socket_connect_timeout=5.0, health_check_interval=30, retry=retry
            )
        except ValueError as exc:
            raise StoreFailure(f"{self.location} is not a Redis URL ({exc})", "EINVAL") from None
        self._take = self._client.register_script(_TAKE)
        self._keep = self._client.register_script(_KEEP)
        with self._failing():
            self._client.ping()  # a wrong URL fails here, naming it, not in the middle of a run
        self.notices = self._durability()

    def _durability(self) -> list[str]:
        """What the user should know when this server could lose receipts: paid answers kept only
        in memory (no append-only file, no snapshots), or evicted when memory runs short."""
        from redis.exceptions import RedisError

        try:
            config = self._client.config_get("*")
        except RedisError:
            return []  # a managed server that hides its configuration: assume it is looked after
        said = []
        if config.get("appendonly") == "no" and not config.get("save"):
            said.append(f"the Redis server at {self.location} keeps receipts in memory only (no appendonly, no save): "
                        "a restart of that server loses them, and the calls are paid for again; start it with --appendonly yes")  # fmt: skip
        policy = config.get("maxmemory-policy", "noeviction")
        if policy != "noeviction":
            said.append(f"the Redis server at {self.location} evicts keys when memory runs short (maxmemory-policy {policy}): "
                        "receipts it evicts are paid for again; set maxmemory-policy noeviction")  # fmt: skip
        return said

    def __repr__(self) -> str:
        return f"<RedisBackend {self.location} prefix={self._prefix[:-1]!r}>"

    @contextmanager
    def _failing(self) -> Iterator[None]:
        from redis.exceptions import RedisError

        try:
            yield
        except (RedisError, OSError) as exc:
            raise failure(exc, self.location) from None

    def _writable(self) -> None:
        if self.readonly:
            raise StoreFailure("the store was opened read-only", "READONLY")

    def _fetch(self, keys: Sequence[str], fields: list[str]) -> list[Any]:
        """``HMGET fields`` of every key in one round trip (an error in place of a key not a hash)."""
        with self._failing():
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(self._prefix + key, fields)
            return pipe.execute(raise_on_error=False)

    # -- receipts and step records -------------------------------------------------------------

    def lookup(self, key: str) -> Found | Damaged | None:
        return self.lookup_many([key])[0]

    def lookup_many(self, keys: Sequence[str]) -> list[Found | Damaged | None]:
        return [_found(values) for values in self._fetch(keys, _FOUND)] if keys else []

    def tool_of(self, key: str) -> str | None:
        reply = self._fetch([key], ["tool"])[0]  # an exception when the key is not a hash (not ours)
        return None if isinstance(reply, Exception) or reply[0] is None else _text(reply[0])

    def get(self, key: str) -> Record | Damaged | None:
        return _record(key, self._fetch([key], _RECORD)[0])

    def write(self, records: Sequence[Record]) -> None:
        self._writable()
        if not records:
            return
        with self._failing():
            pipe = self._client.pipeline(transaction=True)
            for row in records:
                name = self._prefix + row.key
                pipe.delete(name)  # a replaced record keeps no field of the old one (an input it no longer has)
                pipe.hset(name, mapping=_fields(row))
                if is_receipt(row.key):
                    pipe.zadd(self._receipts, {row.key: row.at})
                    pipe.sadd(f"{self._prefix}tool:{row.tool}", row.key)
            pipe.execute()

    def records(self, tool: str | None = None) -> Iterable[tuple[str, Record | Damaged]]:
        chunks = _chunks(self._receipt_keys(tool))
        read = [(key, _record(key, values)) for chunk in chunks for key, values in zip(chunk, self._fetch(chunk, _RECORD))]
        return [(key, record) for key, record in read if record is not None]  # None: cleared since it was listed

    def _receipt_keys(self, tool: str | None) -> list[str]:
        """Receipt keys (all, or one tool's), oldest first."""
        with self._failing():
            if tool is None:
                return [_text(key) for key in self._client.zrange(self._receipts, 0, -1)]
            members = [_text(key) for key in self._client.smembers(f"{self._prefix}tool:{tool}")]
            pipe = self._client.pipeline(transaction=False)
            for key in members:
                pipe.zscore(self._receipts, key)
            scores = pipe.execute()
        return [key for _, key in sorted((at, key) for key, at in zip(members, scores) if at is not None)]

    # -- row memos -------------------------------------------------------------------------------

    def memos(self, keys: Sequence[str]) -> tuple[list[MemoRow], list[str]]:
        read = [(key, _memo(key, values)) for chunk in _chunks(keys) for key, values in zip(chunk, self._fetch(chunk, _MEMO))]
        return [memo for _, memo in read if isinstance(memo, MemoRow)], [key for key, memo in read if isinstance(memo, Damaged)]

    def write_memos(self, rows: Sequence[MemoRow]) -> None:
        self._writable()
        for chunk in _chunks(rows):
            with self._failing():
                # A memo and its index entries together: one that clearing a tool cannot find
                # would replay a row the user asked to pay for again.
                pipe = self._client.pipeline(transaction=True)
                for row in chunk:
                    pipe.hset(self._prefix + row.key, mapping=_fields(row))
                    pipe.sadd(self._memos, row.key)
                    for name in parse_tools(row.tools):
                        pipe.sadd(f"{self._memos}:{name}", row.key)
                pipe.execute()

    # -- upkeep ----------------------------------------------------------------------------------

    def counts(self) -> Counts:
        """Receipts per tool (one pipelined pass), memos, and the memory the whole Redis server uses."""
        by_tool: dict[str, tuple[int, float]] = {}
        with self._failing():
            for chunk in _chunks([_text(key) for key, _ in self._client.zscan_iter(self._receipts, count=_CHUNK)]):
                for found in self._fetch(chunk, ["tool", "cost"]):
                    pair = _parse(found, 2, lambda t: (str(t[0]), float(t[1])))
                    if pair is not None and not isinstance(pair, Damaged):  # damaged: only by hand
                        count, cost = by_tool.get(pair[0], (0, 0.0))
                        by_tool[pair[0]] = (count + 1, cost + pair[1])
            memos = self._client.scard(self._memos)
            used = self._client.info("memory").get("used_memory", 0)
        return Counts(by_tool, int(memos), int(used))

    def clear(self, tool: str | None = None) -> int:
        self._writable()
        with self._failing():
            return self._clear_all() if tool is None else self._clear_tool(tool)

    def _clear_tool(self, tool: str) -> int:
        removed = 0
        # SPOP, not SMEMBERS then DEL: a receipt written meanwhile stays listed, to be cleared
        # with the next chunk or kept, never orphaned.
        while keys := self._client.spop(f"{self._prefix}tool:{tool}", _CHUNK):
            pipe = self._client.pipeline(transaction=True)
            pipe.unlink(*[self._prefix + _text(key) for key in keys])
            pipe.zrem(self._receipts, *keys)
            removed += int(pipe.execute()[0])
        while keys := self._client.spop(f"{self._memos}:{tool}", _CHUNK):
            memos = [_text(key) for key in keys]
            used = self._fetch(memos, ["tools"])
            pipe = self._client.pipeline(transaction=True)
            pipe.unlink(*[self._prefix + key for key in memos])
            pipe.srem(self._memos, *memos)
            for key, reply in zip(memos, used):
                for name in _tool_names(reply):  # so that memo_count of its other tools stays right
                    pipe.srem(f"{self._memos}:{name}", key)
            pipe.execute()
        return removed

    def _clear_all(self) -> int:
        """Every key under the prefix but the leases: a call being paid for stays leased."""
        removed = 0
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self._prefix) + "*"
        names = [_text(name) for name in self._client.scan_iter(match=pattern, count=_CHUNK)]
        doomed = [name for name in names if not name.startswith(self._prefix + "lease:")]
        for chunk in _chunks(doomed):
            self._client.unlink(*chunk)
            # Records and memos are named by their key alone (no ':'); indexes have other names.
            removed += sum(":" not in (rest := name[len(self._prefix) :]) and rest not in ("receipts", "memos") for name in chunk)
        return removed

    def memo_count(self, tool: str) -> int:
        with self._failing():
            return int(self._client.scard(f"{self._memos}:{tool}"))

    # -- leases ----------------------------------------------------------------------------------

    def take(self, keys: Sequence[str], owner: str, ttl: float) -> list[bool]:
        self._writable()
        if not keys:
            return []
        with self._failing():
            got = self._take(keys=self._leases(keys), args=[owner, max(1, round(ttl * 1000))])
        return [bool(ok) for ok in got]

    def renew(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        self._writable()
        if keys:
            with self._failing():
                self._keep(keys=self._leases(keys), args=[owner, max(1, round(ttl * 1000))])

    def release(self, keys: Sequence[str], owner: str) -> None:
        self._writable()
        if keys:
            with self._failing():
                self._keep(keys=self._leases(keys), args=[owner])

    def holder(self, key: str) -> tuple[str, float] | None:
        (name,) = self._leases([key])
        with self._failing():
            pipe = self._client.pipeline(transaction=True)
            pipe.get(name)
            pipe.pttl(name)
            owner, left = pipe.execute()
        if owner is None or left == -2:  # -2: it expired between the two
            return None
        return _text(owner), (left / 1000 if left >= 0 else math.inf)

    def _leases(self, keys: Sequence[str]) -> list[str]:
        return [f"{self._prefix}lease:{key}" for key in keys]

    def close(self) -> None:
        self._client.close()  # and its pool: from_url made the pool for this client alone


# -- values as stored ----------------------------------------------------------------------------


def _fields(row: Record | MemoRow) -> dict[FieldT, EncodableT]:
    """The hash of a record or memo: every field but the key; ``None`` (no input, no error) left out.
    redis-py writes a float as its repr, so it comes back bit for bit (``at`` decides staleness)."""
    return {name: int(value) if isinstance(value, bool) else value for name, value in row._asdict().items()
            if name != "key" and value is not None}  # fmt: skip


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    return (items[start : start + _CHUNK] for start in range(0, len(items), _CHUNK))


def _tool_names(reply: Any) -> list[str]:
    """The tools a memo used, from ``HMGET tools``."""
    try:
        return list(parse_tools(bytes(reply[0]).decode("utf-8")))
    except (TypeError, ValueError):
        return []  # damaged or gone: its entries in other tools' sets only overcount memo_count


def _parse(values: Any, required: int, build: Callable[[list[Any]], T]) -> T | Damaged | None:
    """``build`` over ``values`` (an HMGET reply) as text; ``None`` when none is there; the first
    ``required`` must be there."""
    if isinstance(values, Exception):  # WRONGTYPE: something else wrote that key
        return Damaged(_NOT_OURS)
    if all(value is None for value in values):
        return None
    try:
        text = [None if value is None else bytes(value).decode("utf-8") for value in values]
        if None in text[:required]:
            raise ValueError("fields missing")
        return build(text)
    except UnicodeDecodeError:  # before ValueError, its base
        return Damaged(_NOT_TEXT)
    except (TypeError, ValueError):
        return Damaged(_NOT_OURS)


def _found(values: Any) -> Found | Damaged | None:
    # output, miss, flags, error, at
    return _parse(values, 3, lambda t: Found(t[0], t[1] == "1", int(t[2]), t[3], float(t[4])))


def _record(key: str, values: Any) -> Record | Damaged | None:
    # tool, version, account, at, cost, miss, flags, output, input, error
    return _parse(values, 8, lambda t: Record(key, t[0], t[1], t[2], float(t[3]), float(t[4]), t[5] == "1", int(t[6]), t[8], t[7], t[9]))


def _memo(key: str, values: Any) -> MemoRow | Damaged | None:
    # play, tools, calls, cost, flags, output
    return _parse(values, 6, lambda t: MemoRow(key, t[0], t[1], int(t[2]), float(t[3]), int(t[4]), t[5]))


# -- the URL and failures, in words --------------------------------------------------------------


def masked(url: str) -> str:
    """``url`` with its password (in the authority or a ``password=`` parameter) shown as ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if colon else netloc
    query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)], safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def failure(exc: BaseException, where: str) -> StoreFailure:
    """What went wrong talking to Redis at ``where``, in words a user can act on."""
    from redis import exceptions as e

    text = str(exc).strip()
    if isinstance(exc, (e.TimeoutError, TimeoutError)):
        return StoreFailure(f"Redis at {where} did not answer in time ({text or 'timed out'})", "ETIMEDOUT")
    if isinstance(exc, e.AuthenticationError) and "***" not in where:
        return StoreFailure(f"Redis at {where} asks for a password: put it in the URL (redis://:PASSWORD@host:port/db)", "NOAUTH")
    if isinstance(exc, e.AuthenticationError):
        return StoreFailure(f"Redis at {where} refused the user or password in the URL ({text})", "WRONGPASS")
    if isinstance(exc, (e.ConnectionError, OSError)):
        os_error = _os_error(exc)
        if os_error is None:
            return StoreFailure(f"cannot reach Redis at {where} ({text})", "ECONNECTION")
        return StoreFailure(f"cannot reach Redis at {where} ({os_error.strerror or text})", errno.errorcode.get(os_error.errno or 0))
    if isinstance(exc, e.InvalidResponse):
        return StoreFailure(f"what answers at {where} is not Redis ({text})", "EPROTO")
    if isinstance(exc, e.ReadOnlyError):
        return StoreFailure(f"Redis at {where} is a read-only replica: name its primary in the URL", "READONLY")
    if isinstance(exc, e.OutOfMemoryError) or "OOM command not allowed" in text:
        return StoreFailure(f"Redis at {where} is out of memory (maxmemory reached): raise its maxmemory, or clear receipts "
                            "no longer needed", "OOM")  # fmt: skip
    if isinstance(exc, e.NoPermissionError):
        return StoreFailure(f"the Redis user in {where} may not do this ({text})", "NOPERM")
    word = text.split(" ", 1)[0]
    return StoreFailure(f"Redis at {where} failed: {text}", word if word.isupper() else "REDIS")


def _os_error(exc: BaseException) -> OSError | None:
    """The socket error behind a redis-py error ("Error 111 connecting to…" keeps it as its context)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
