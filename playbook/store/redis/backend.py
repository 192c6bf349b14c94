"""A store backend on a Redis server: one store shared by every kernel and machine that names it.

Layout, every key under ``{prefix}:`` (``playbook`` unless told)::

    {prefix}:{r… or s…}      string  what a replay reads: ``[at, miss, flags, error]`` as JSON, a
                                     newline, then the output's JSON text
    {prefix}:info:{r… or s…} hash    the rest of the record, for listings: tool version account cost [input]
    {prefix}:receipts        zset    addresses scored by ``at``: listing oldest first
    {prefix}:tool:{tool}     set     one tool's addresses: clearing a tool
    {prefix}:{m…}            string  one row memo: ``[play, tools, calls, cost, flags]``, a newline, the output
    {prefix}:memos           set     every memo key: counting them
    {prefix}:memos:{tool}    set     the memos of rows that used ``tool``: clearing it drops them too
    {prefix}:lease:{r…}      string  the owner of a lease, expiring by Redis's own clock
    {prefix}:used:{play}:{row} string  the addresses the row used when it last finished: a
                                     rerun of an edited play reads them ahead, a chunk of rows
                                     in one round trip
    {prefix}:spend           hash    what runs spent: ``[day, provider, tool, figure]`` -> amount
    {prefix}:identity        string  an id made with the data: a server wiped makes another
    {prefix}:mark            string  the store's mark, as text (marks.py)

What a replay reads is one string per key, so the lookups of many rows are one ``MGET``: one
command to encode and one round trip, whatever their number.  (Hashes read with one ``HMGET``
each cost redis-py more in encoding the commands than the server takes to answer them.)  A batch
of records or memos and their index entries go in one MULTI/EXEC (all or none), so no receipt
escapes the clearing of its tool.  Leases are Lua
scripts, atomic on the server and expiring by its clock: machines whose clocks disagree agree.
The server must keep what it is given (``maxmemory-policy noeviction``, the default): a receipt
evicted is a call paid for again.  Prefixes must not nest (``a``, ``a:b``): clearing one clears both.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from playbook._internal.dist import install_hint
from playbook._internal.urls import masked
from playbook.errors import ReceiptError
from playbook.store.protocol import Counts, Damaged, Found, SpendRow, StoreFailure, Tally
from playbook.store.records import MemoFields, MemoRow, Record, is_receipt, parse_tools
from playbook.store.redis.durability import durability_in, kept_by
from playbook.store.redis.failures import failure
from playbook.store.redis.format import (
    CHUNK,
    INFO,
    INFO_WRITE,
    LEASE_KEEP,
    LEASE_TAKE,
    chunks,
    found_of,
    grouped,
    memo_of,
    memo_value,
    record_info,
    record_of,
    record_value,
    text,
    tool_names,
)
from playbook.store.redis.leases import RedisLeases

# the figures of a line of spend (a line written by an older playbook has no unpriced ones: 0)
_SPEND = ("calls_paid", "cost_paid", "calls_reused", "cost_saved", "calls_unpriced", "reused_unpriced")
if TYPE_CHECKING:
    import redis

__all__ = ["RedisBackend"]

T = TypeVar("T")
TALLY_TTL = 86_400  # seconds a cluster job's tally outlives its last paid call


class RedisBackend(RedisLeases):
    """Records, row memos and leases on the Redis server at ``url`` (``redis://``, ``rediss://``
    or ``unix://``), under keys that start with ``prefix:``."""

    remote = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "playbook",
        readonly: bool = False,
        durability: str | None = None,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        try:
            import redis
            from redis.backoff import ExponentialWithJitterBackoff
            from redis.retry import Retry
        except ImportError:
            raise ReceiptError(f"a store on Redis needs the redis package: {install_hint('redis')}") from None
        self.location = masked(url)
        try:
            url, durability = durability_in(url, durability)
        except ValueError as exc:
            raise StoreFailure(str(exc), "EINVAL") from None
        self._notify = notify
        self.readonly = readonly
        self._prefix = prefix + ":"
        self._memos = self._prefix + "memos"
        self._receipts = self._prefix + "receipts"
        self._spend = self._prefix + "spend"
        try:
            # The pool is thread-safe and resets itself in a forked child (it compares pids).  Two
            # quick retries ride out a restarted server or a dropped idle connection, and are safe:
            # every write sets values (a record, one owner's lease), so twice changes nothing.
            retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2)
            self._client: redis.Redis = redis.Redis.from_url(
                url, socket_timeout=10.0, socket_connect_timeout=5.0, health_check_interval=30, retry=retry
            )
        except ValueError as exc:
            raise StoreFailure(
                f"{self.location} is not a Redis URL playbook can use ({exc})", "EINVAL"
            ) from None
        self._take = self._client.register_script(LEASE_TAKE)
        self._keep = self._client.register_script(LEASE_KEEP)
        try:
            with self._failing():
                self._client.ping()  # a wrong URL fails here, naming it, not in the middle of a run
        except (
            TypeError,
            IndexError,
        ) as exc:  # an option in the query redis-py does not know, met when it connects
            cause: BaseException | None = exc
            while cause is not None and not isinstance(cause, TypeError):
                cause = cause.__context__
            raise StoreFailure(
                f"{self.location} is not a Redis URL playbook can use ({cause or exc})", "EINVAL"
            ) from None
        self.notices: list[str] = []
        # What this server cannot promise, said by every run; an evicting server's count of what it evicted.
        self.standing, self._evictions = kept_by(self._client, self.location, durability, self._notify)

    def watch(self, *, final: bool = False) -> None:
        """On a server that evicts keys: count what it evicted (durability.Evictions)."""
        if self._evictions is not None:
            self._evictions.check(self._client, final=final)

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

    def _get(self, keys: Sequence[str]) -> list[Any]:
        """The string values of ``keys`` (``None`` where absent) in one ``MGET``."""
        if not keys:
            return []
        prefix = self._prefix
        with self._failing():
            return self._client.mget([prefix + key for key in keys])

    # -- receipts and step records -------------------------------------------------------------

    def lookup(self, key: str) -> Found | Damaged | None:
        return self.lookup_many([key])[0]

    def lookup_many(self, keys: Sequence[str]) -> list[Found | Damaged | None]:
        return [None if value is None else found_of(value) for value in self._get(keys)]

    def tool_of(self, key: str) -> str | None:
        with self._failing():
            tool = self._client.hget(f"{self._prefix}info:{key}", "tool")
        return None if tool is None else text(tool)

    def get(self, key: str) -> Record | Damaged | None:
        return self._records([key])[0]

    def _records(self, keys: Sequence[str]) -> list[Record | Damaged | None]:
        """Whole records: the replayed part and the rest, in one round trip."""
        with self._failing():
            pipe = self._client.pipeline(transaction=False)
            pipe.mget([self._prefix + key for key in keys])
            for key in keys:
                pipe.hmget(f"{self._prefix}info:{key}", INFO)
            values, *infos = pipe.execute(raise_on_error=False)
        return [record_of(key, value, info) for key, value, info in zip(keys, values, infos)]

    def write(
        self,
        records: Sequence[Record],
        released: Sequence[str] = (),
        owner: str = "",
        *,
        tally: Tally | None = None,
    ) -> int:
        """Records and their index entries, all or none; ``tally`` counted with them; ``released``:
        leases of ``owner`` given back in the same transaction (of the calls these receipts answer:
        another process that takes one finds the receipt), not in a round trip of their own.
        Returns how many receipts it added (the index's ZADD says)."""
        self._writable()
        if not records:
            return 0
        receipts = [row for row in records if is_receipt(row.key)]
        with self._failing():
            pipe = self._client.pipeline(transaction=True)
            pipe.mset({self._prefix + row.key: record_value(row) for row in records})
            infos = [f"{self._prefix}info:{row.key}" for row in records]
            # EVAL, not EVALSHA: a server that has not seen the script (new, or restarted) runs it
            # all the same, in this transaction.
            pipe.eval(INFO_WRITE, len(infos), *infos, *record_info(records))
            if receipts:
                pipe.zadd(self._receipts, {row.key: row.at for row in receipts})
                for tool, keys in grouped((row.tool, row.key) for row in receipts).items():
                    pipe.sadd(f"{self._prefix}tool:{tool}", *keys)
            if tally is not None:
                pipe.hincrby(tally.key, f"{tally.field}:calls", tally.calls)
                pipe.hincrbyfloat(tally.key, f"{tally.field}:cost", tally.cost)
                pipe.expire(tally.key, TALLY_TTL)
            if released:
                leases = self.lease_names(released)
                pipe.evalsha(self._keep.sha, len(leases), *leases, owner)
            answers = pipe.execute(raise_on_error=False)
            errors = [answer for answer in answers if isinstance(answer, Exception)]
            if errors and not (released and errors == answers[-1:]):
                raise errors[0]
        if errors:  # the script is not on the server yet (a new or restarted one): given back on their own
            self.release(released, owner)
        self.watch()
        return int(answers[2]) if receipts else 0  # MSET, the info script, then ZADD

    def count(self, key: str, field: str, n: int) -> None:
        """Add ``n`` to ``field`` of the hash ``key`` (a cluster job's requests sent, see :class:`Tally`)."""
        with self._failing():
            pipe = self._client.pipeline(transaction=True)
            pipe.hincrby(key, field, n)
            pipe.expire(key, TALLY_TTL)
            pipe.execute()

    def records(self, tool: str | None = None) -> Iterable[tuple[str, Record | Damaged]]:
        read = [
            (key, record)
            for chunk in chunks(self._receipt_keys(tool))
            for key, record in zip(chunk, self._records(chunk))
        ]
        # None: cleared since it was listed
        return [(key, record) for key, record in read if record is not None]

    def _receipt_keys(self, tool: str | None) -> list[str]:
        """Receipt keys (all, or one tool's), oldest first."""
        with self._failing():
            if tool is None:
                return [text(key) for key in self._client.zrange(self._receipts, 0, -1)]
            members = [text(key) for key in self._client.smembers(f"{self._prefix}tool:{tool}")]
            pipe = self._client.pipeline(transaction=False)
            for key in members:
                pipe.zscore(self._receipts, key)
            scores = pipe.execute()
        return [key for _, key in sorted((at, key) for key, at in zip(members, scores) if at is not None)]

    # -- row memos -------------------------------------------------------------------------------

    def memos(self, keys: Sequence[str]) -> tuple[Sequence[MemoFields], list[str]]:
        read = [
            (key, memo_of(key, value))
            for chunk in chunks(keys)
            for key, value in zip(chunk, self._get(chunk))
            if value is not None
        ]
        return [memo for _, memo in read if isinstance(memo, MemoRow)], [
            key for key, memo in read if isinstance(memo, Damaged)
        ]

    def fold_memos(self) -> None:
        pass  # found as written

    def write_memos(self, rows: Sequence[MemoRow]) -> None:
        self._writable()
        for chunk in chunks(rows):
            with self._failing():
                # A memo and its index entries together: one that clearing a tool cannot find
                # would replay a row the user asked to pay for again.
                pipe = self._client.pipeline(transaction=True)
                pipe.mset({self._prefix + row.key: memo_value(row) for row in chunk})
                pipe.sadd(self._memos, *[row.key for row in chunk])
                used = grouped((name, row.key) for row in chunk for name in parse_tools(row.tools))
                for name, keys in used.items():
                    pipe.sadd(f"{self._memos}:{name}", *keys)
                pipe.execute()
        self.watch()

    def hints(self, play: str, rows: Sequence[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for chunk in chunks(rows):
            for row, keys in zip(chunk, self._get([f"used:{play}:{row}" for row in chunk])):
                if keys is not None:
                    found[row] = text(keys).split()
        return found

    def write_hints(self, hints: Sequence[tuple[str, str, str]]) -> None:
        self._writable()
        for chunk in chunks(hints):
            with self._failing():
                self._client.mset({f"{self._prefix}used:{play}:{row}": keys for play, row, keys in chunk})

    # -- what runs spent: one hash, a field per day, provider, tool and figure ---------------------

    def write_spend(self, rows: Sequence[SpendRow]) -> None:
        self._writable()
        pipe = self._client.pipeline(transaction=True)
        for day, provider, tool, *figures in rows:
            for name, value in zip(_SPEND, figures):
                if not value and name.endswith("unpriced"):
                    continue  # most lines: no field for nothing
                pipe.hincrbyfloat(self._spend, json.dumps([day, provider, tool, name]), value)
        with self._failing():
            pipe.execute()

    def spend_rows(self) -> list[SpendRow]:
        lines: dict[tuple[str, str, str], list[float]] = {}
        with self._failing():
            fields = self._client.hgetall(self._spend)
        for field, value in fields.items():
            day, provider, tool, name = json.loads(field)
            lines.setdefault((day, provider, tool), [0.0] * len(_SPEND))[_SPEND.index(name)] = float(value)
        return [
            (*where, int(a), b, int(c), d, int(e), int(f))
            for where, (a, b, c, d, e, f) in sorted(lines.items())
        ]

    # -- upkeep ----------------------------------------------------------------------------------

    def counts(self) -> Counts:
        """Receipts per tool (one pipelined pass), memos, and the memory the whole Redis server uses."""
        by_tool: dict[str, tuple[int, float]] = {}
        with self._failing():
            for chunk in chunks(
                [text(key) for key, _ in self._client.zscan_iter(self._receipts, count=CHUNK)]
            ):
                pipe = self._client.pipeline(transaction=False)
                for key in chunk:
                    pipe.hmget(f"{self._prefix}info:{key}", ["tool", "cost"])
                for tool, cost in pipe.execute(raise_on_error=False):
                    try:
                        count, total = by_tool.get(text(tool), (0, 0.0))
                        by_tool[text(tool)] = (count + 1, total + float(cost))
                    except (TypeError, ValueError):
                        continue  # damaged by hand, or cleared meanwhile: not counted
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
        while keys := self._client.spop(f"{self._prefix}tool:{tool}", CHUNK):
            names = [text(key) for key in keys]
            pipe = self._client.pipeline(transaction=True)
            pipe.unlink(*[self._prefix + key for key in names])
            pipe.unlink(*[f"{self._prefix}info:{key}" for key in names])
            pipe.zrem(self._receipts, *keys)
            removed += int(pipe.execute()[0])
        while keys := self._client.spop(f"{self._memos}:{tool}", CHUNK):
            memos = [text(key) for key in keys]
            used = self._get(memos)
            pipe = self._client.pipeline(transaction=True)
            pipe.unlink(*[self._prefix + key for key in memos])
            pipe.srem(self._memos, *memos)
            for key, value in zip(memos, used):
                for name in tool_names(value):  # so that memo_count of its other tools stays right
                    pipe.srem(f"{self._memos}:{name}", key)
            pipe.execute()
        return removed

    def _clear_all(self) -> int:
        """Every key under the prefix but the leases (a call being paid for stays leased) and the
        shared limiters' state (``{prefix}:limit:…``: clearing receipts must not lift a provider's
        hold, forget its rate or free the slots of calls in flight), and what runs spent (money
        paid stays paid)."""
        removed = 0
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self._prefix) + "*"
        names = [text(name) for name in self._client.scan_iter(match=pattern, count=CHUNK)]
        kept = (self._prefix + "lease:", self._prefix + "limit:")
        doomed = [name for name in names if not name.startswith(kept) and name != self._spend]
        for chunk in chunks(doomed):
            self._client.unlink(*chunk)
            # Records and memos are named by their key alone (no ':'); indexes have other names.
            removed += sum(
                ":" not in (rest := name[len(self._prefix) :]) and rest not in ("receipts", "memos")
                for name in chunk
            )
        return removed

    def memo_count(self, tool: str) -> int:
        with self._failing():
            return int(self._client.scard(f"{self._memos}:{tool}"))

    # -- its mark (marks.py) -----------------------------------------------------------------------

    def receipt_count(self) -> int:
        with self._failing():
            return int(self._client.zcard(self._receipts))

    @property
    def identity(self) -> str:
        """The id of the data under this prefix, made with it: a server wiped makes another."""
        with self._failing():
            self._client.set(self._prefix + "identity", uuid.uuid4().hex, nx=True)
            return text(self._client.get(self._prefix + "identity") or b"")

    def read_mark(self) -> str | None:
        with self._failing():
            found = self._client.get(self._prefix + "mark")
        return None if found is None else text(found)

    def write_mark(self, mark: str) -> None:
        with self._failing():
            self._client.set(self._prefix + "mark", mark)

    def close(self) -> None:
        self._client.close()  # and its pool: from_url made the pool for this client alone
