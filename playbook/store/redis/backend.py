"""A store backend on Redis: one store shared by every kernel and machine that names it, on one
server or on a Redis Cluster (found, not configured: ``redis_nodes.sync_client``).

Layout, every key under ``{prefix}:`` (``playbook``: users have no way to set another)::

    {prefix}:{r… or s…}      string  a whole record: ``[at, miss, flags, error, tool, version,
                                     account, cost, n]`` as JSON, a newline, the output (``n``
                                     bytes), then a newline and the input if it has one.  A
                                     replay reads the first four fields and the output.
    {prefix}:{m…}            string  one row memo: ``[play, tools, calls, cost, flags]``, a newline, the output
    {prefix}:count           string  how many receipts the store holds (one server)
    {prefix}:n{T}            string  how many receipts the slot of the tag ``T`` holds (a cluster:
                                     a counter in each slot, beside what it counts)
    {prefix}:lease:{{prefix}:r…} string  the owner of a lease, expiring by Redis's own clock;
                                     its hash tag is the receipt's key: the same slot
    {prefix}:used:{play}:{row} string  the addresses the row used when it last finished: a
                                     rerun of an edited play reads them ahead, a chunk of rows
                                     in one round trip
    {prefix}:spend           hash    what runs spent: ``[day, provider, tool, figure]`` -> amount
    {prefix}:identity        string  an id made with the data: a server wiped makes another
    {prefix}:mark            string  the store's mark, as text (marks.py)

Each record is one key that says all about itself: no index spans keys, so nothing crosses a
cluster's slots.  Listing, counting and clearing walk the keys (``SCAN``, on every master of a
cluster) and read their headers.  What a replay reads is one string per key, so the lookups of
many rows are one ``MGET`` (one script per master on a cluster).  Writes, leases and counts are
Lua scripts, one per group of keys (the whole batch on one server, a slot on a cluster, each
master's slots run by one script: ``slots.py``), atomic on the server and expiring by its clock:
machines whose clocks disagree agree.  The script that writes records counts the receipts new to the store in the same step, so
a counter never disagrees with what it counts, even on a replica promoted without the last writes.

A store an older playbook wrote (a ``receipts`` sorted set and ``info:`` hashes beside the
records) is rewritten to this layout when it is first opened to write (``legacy.py``).

The server must keep what it is given (``maxmemory-policy noeviction``, the default): a receipt
evicted is a call paid for again.  Prefixes must not nest (``a``, ``a:b``): clearing one clears both.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from playbook._internal.dist import install_hint
from playbook._internal.urls import masked
from playbook.errors import ReceiptError
from playbook.store.protocol import Counts, Damaged, Found, SpendRow, StoreFailure, Tally
from playbook.store.records import MemoFields, MemoRow, Record, is_receipt, parse_tools
from playbook.store.redis.durability import FAILOVER, durability_in, kept_by
from playbook.store.redis.failures import failure
from playbook.store.redis.format import (
    HEAD,
    REMOVE,
    WRITE,
    chunks,
    found_of,
    head_of,
    memo_of,
    memo_value,
    record_of,
    record_value,
    text,
)
from playbook.store.redis.leases import RedisLeases
from playbook.store.redis.legacy import INFO, migrate, rewritten
from playbook.store.redis.slots import Call, Slots

# the figures of a line of spend (a line written by an older playbook has no unpriced ones: 0)
_SPEND = ("calls_paid", "cost_paid", "calls_reused", "cost_saved", "calls_unpriced", "reused_unpriced")

__all__ = ["RedisBackend"]

_DOWN_RECHECK_S = 1.0  # how often a cluster found down is asked whether it is back
TALLY_TTL = 86_400  # seconds a cluster job's tally outlives its last paid call


def _client(url: str) -> Any:
    """A client for the server or cluster at ``url``."""
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.retry import Retry

    from playbook._internal.redis_nodes import sync_client

    # The pool is thread-safe and resets itself in a forked child (it compares pids).  Two
    # quick retries ride out a restarted server or a dropped idle connection, and are safe:
    # every write sets values (a record, one owner's lease), so twice changes nothing.  A
    # cluster's client retries through a failover on its own (redis_nodes).
    retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2)
    return sync_client(
        url, socket_timeout=10.0, socket_connect_timeout=5.0, health_check_interval=30, retry=retry
    )


class RedisBackend(RedisLeases):
    """Records, row memos and leases on the Redis server or cluster at ``url`` (``redis://``,
    ``rediss://`` or ``unix://``), under keys that start with ``prefix:``."""

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
            import redis  # noqa: F401
        except ImportError:
            raise ReceiptError(f"a store on Redis needs the redis package: {install_hint('redis')}") from None
        self.location = masked(url)
        if "{" in prefix or "}" in prefix:
            raise StoreFailure(
                f"the store's prefix {prefix!r} has a brace: on a Redis Cluster it would choose its keys' slots; "
                "name it without '{' or '}'",
                "EINVAL",
            )
        try:
            url, durability = durability_in(url, durability)
        except ValueError as exc:
            raise StoreFailure(str(exc), "EINVAL") from None
        self._notify = notify
        self.readonly = readonly
        self._prefix = prefix + ":"
        self._spend = self._prefix + "spend"
        self._url = url
        self._client = self._connect(url)
        self._slots = Slots(self._client, self._prefix)
        # A cluster found down (a master lost, no replica took over): since when it was last
        # asked, and what to raise.  Meanwhile the store's calls fail at once, not after the
        # cluster client's ~20 s of retries each: a run over a cluster that stays down ends.
        self._down: tuple[float, StoreFailure] | None = None
        self.notices: list[str] = []
        # What this server cannot promise, said by every run; an evicting server's count of what it evicted.
        self.standing, self._evictions = kept_by(
            self._client, self.location, durability, self._notify, cluster=self._slots.cluster
        )
        # What the store is, said once where the user meets it (engine.StoreEngine.about).
        self.about = [FAILOVER.format(location=self.location)] if self._slots.cluster else []
        if not readonly and not self._slots.cluster:
            with self._failing():
                if migrate(self._client, self._prefix) is not None:
                    self.notices.append(rewritten(self.location))

    def _connect(self, url: str) -> Any:
        """The client, its server asked once (a wrong URL fails here, naming it, not in the middle of a run)."""
        try:
            with self._failing():
                client = _client(url)
                client.ping()
        except ValueError as exc:  # a URL redis-py cannot read, or a cluster's database not 0
            raise StoreFailure(
                f"{self.location} is not a Redis URL playbook can use ({exc})", "EINVAL"
            ) from None
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
        return client

    def watch(self, *, final: bool = False) -> None:
        """On a server that evicts keys: count what it evicted (durability.Evictions)."""
        if self._evictions is not None:
            self._evictions.check(self._client, final=final)

    def __repr__(self) -> str:
        return f"<RedisBackend {self.location} prefix={self._prefix[:-1]!r}>"

    @contextmanager
    def _failing(self) -> Iterator[None]:
        from redis.exceptions import RedisClusterException, RedisError

        cluster = getattr(self, "_slots", None) is not None and self._slots.cluster
        if cluster and getattr(self, "_down", None) is not None:
            self._still_down()
        try:
            yield
        except (RedisError, RedisClusterException, OSError) as exc:
            found = failure(exc, self.location, cluster=cluster)
            if cluster and found.code == "CLUSTERDOWN":
                self._down = (time.monotonic(), found)
            raise found from None

    def _still_down(self) -> None:
        """Raise what the cluster last failed with while it is still down: asked again (``CLUSTER
        INFO`` of the nodes it knows, each answering at once or not at all) once a second at most."""
        assert self._down is not None
        since, found = self._down
        if time.monotonic() - since < _DOWN_RECHECK_S:
            raise found
        if self._slots.cluster_ok():
            self._down = None
            return
        self._down = (time.monotonic(), found)
        raise found

    def _writable(self) -> None:
        if self.readonly:
            raise StoreFailure("the store was opened read-only", "READONLY")

    def _get(self, keys: Sequence[str]) -> list[Any]:
        """The string values of ``keys`` (``None`` where absent): one ``MGET`` (a script per master on a cluster)."""
        prefix = self._prefix
        with self._failing():
            return self._slots.get([prefix + key for key in keys])

    # -- receipts and step records -------------------------------------------------------------

    def lookup(self, key: str) -> Found | Damaged | None:
        return self.lookup_many([key])[0]

    def lookup_many(self, keys: Sequence[str]) -> list[Found | Damaged | None]:
        return [None if value is None else found_of(value) for value in self._get(keys)]

    def tool_of(self, key: str) -> str | None:
        (value,) = self._get([key])
        header = None if value is None else head_of(value)
        if header is None or len(header) < 9:
            return None
        return str(header[4])

    def get(self, key: str) -> Record | Damaged | None:
        return self._records([key])[0]

    def _records(self, keys: Sequence[str]) -> list[Record | Damaged | None]:
        values = self._get(keys)
        infos: list[Any] = [None] * len(keys)
        older = [at for at, value in enumerate(values) if value is not None and len(head_of(value) or ()) < 9]
        if older and not self._slots.cluster:  # an older layout not rewritten yet (opened read-only)
            with self._failing():
                pipe = self._client.pipeline(transaction=False)
                for at in older:
                    pipe.hmget(f"{self._prefix}info:{keys[at]}", INFO)
                for at, info in zip(older, pipe.execute()):
                    infos[at] = info
        return [record_of(key, value, info) for key, value, info in zip(keys, values, infos)]

    def write(
        self,
        records: Sequence[Record],
        released: Sequence[str] = (),
        owner: str = "",
        *,
        tally: Tally | None = None,
    ) -> int:
        """Records, each group's (a slot's, on a cluster) all or none, the receipts new to the
        store counted with them; ``released``: leases of ``owner`` given back in the same script
        (of the calls these receipts answer: another process that takes one finds the receipt).
        ``tally`` is counted with them on one server, after them on a cluster (its own slot).
        Returns how many receipts it added."""
        self._writable()
        if not records:
            return 0
        keys = [row.key for row in records]
        calls = self._write_calls(keys, [record_value(row) for row in records], released, owner)
        with self._failing():
            if self._slots.cluster:
                added = sum(int(n) for n in self._slots.run(calls, wait=True))
                if tally is not None:
                    self._tally(self._slots.pipeline(), tally).execute()
            else:
                # one transaction: the records, the tally, and the leases given back
                pipe = self._client.pipeline(transaction=True)
                for call in calls:
                    pipe.eval(call.script, len(call.keys), *call.keys, *call.args)
                if tally is not None:
                    self._tally(pipe, tally)
                added = sum(int(n) for n in pipe.execute()[: len(calls)])
        self.watch()
        return added

    def _write_calls(
        self, keys: Sequence[str], values: Sequence[bytes], released: Sequence[str], owner: str
    ) -> list[Call]:
        """The WRITE script of each group of ``keys``, with the leases of that group to give back."""
        prefix, slots = self._prefix, self._slots
        leases: dict[str, list[str]] = {}
        for key in released:
            leases.setdefault(slots.counter(key), []).append(key)
        calls = []
        for group in slots.groups(keys):
            counter = slots.counter(keys[group[0]])
            flags = ["1" if is_receipt(keys[at]) else "0" for at in group]
            calls.append(
                Call(
                    WRITE,
                    [
                        counter,
                        *(prefix + keys[at] for at in group),
                        *self.lease_names(leases.pop(counter, [])),
                    ],
                    [len(group), owner, *flags, *(values[at] for at in group)],
                )
            )
        rest = [key for group in leases.values() for key in group]
        if rest:  # leases whose receipts are not in this batch: given back on their own
            self.release(rest, owner)
        return calls

    def _tally(self, pipe: Any, tally: Tally) -> Any:
        pipe.hincrby(tally.key, f"{tally.field}:calls", tally.calls)
        pipe.hincrbyfloat(tally.key, f"{tally.field}:cost", tally.cost)
        pipe.expire(tally.key, TALLY_TTL)
        return pipe

    def count(self, key: str, field: str, n: int) -> None:
        """Add ``n`` to ``field`` of the hash ``key`` (a cluster job's requests sent, see :class:`Tally`)."""
        with self._failing():
            pipe = self._slots.pipeline()
            pipe.hincrby(key, field, n)
            pipe.expire(key, TALLY_TTL)
            pipe.execute()

    def records(self, tool: str | None = None) -> Iterable[tuple[str, Record | Damaged]]:
        """Every receipt (or one tool's), oldest first: the keys found by ``SCAN``, read a chunk at a time."""
        read = []
        for chunk in chunks(self._keys("r")):
            for key, record in zip(chunk, self._records(chunk)):
                # None: cleared since it was listed
                if record is not None and (tool is None or (type(record) is Record and record.tool == tool)):
                    read.append((key, record))
        read.sort(key=lambda found: found[1].at if type(found[1]) is Record else 0.0)
        return read

    def _keys(self, kind: str) -> list[str]:
        """The store keys (without the prefix) of one kind: ``r`` receipts, ``s`` steps, ``m`` memos."""
        with self._failing():
            names = self._slots.scan(_escaped(self._prefix) + kind + "*")
        start = len(self._prefix)
        return [name[start:] for name in names if _is_record(name[start:])]

    def _heads(self, keys: Sequence[str]) -> list[list[Any] | None]:
        """The headers of ``keys`` (None: gone or unreadable), the first bytes of each value read."""
        with self._failing():
            values = self._slots.each("GETRANGE", [self._prefix + key for key in keys], 0, HEAD)
            heads = [head_of(value) if b"\n" in value else None for value in values]
            longer = [at for at, (value, head) in enumerate(zip(values, heads)) if value and head is None]
            for at, value in zip(longer, self._get([keys[at] for at in longer])):
                heads[at] = None if value is None else head_of(value)
        return heads

    def _older_heads(self, keys: Sequence[str], heads: list[list[Any] | None]) -> list[list[Any] | None]:
        """``heads`` with those of an older layout not rewritten yet (opened read-only: four
        fields) completed from the ``info:`` hash beside them, as today's header has them."""
        older = [at for at, head in enumerate(heads) if head is not None and len(head) < 9]
        if not older or self._slots.cluster:
            return heads
        with self._failing():
            pipe = self._client.pipeline(transaction=False)
            for at in older:
                pipe.hmget(f"{self._prefix}info:{keys[at]}", INFO[:4])
            for at, info in zip(older, pipe.execute()):
                if info[0] is not None:
                    heads[at] = [*heads[at][:4], *(text(v) if v is not None else None for v in info), None]  # type: ignore[index]
        return heads

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
                self._mset({self._prefix + row.key: memo_value(row) for row in chunk})
        self.watch()

    def _mset(self, values: dict[str, Any]) -> None:
        self._slots.set(values)

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
                self._mset({f"{self._prefix}used:{play}:{row}": keys for play, row, keys in chunk})

    # -- what runs spent: one hash, a field per day, provider, tool and figure ---------------------

    def write_spend(self, rows: Sequence[SpendRow]) -> None:
        self._writable()
        pipe = self._client.pipeline() if self._slots.cluster else self._client.pipeline(transaction=True)
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
        """Receipts per tool and memos (their keys walked, their headers read), and the memory
        the whole server (or every master of a cluster) uses."""
        by_tool: dict[str, tuple[int, float]] = {}
        for chunk in chunks(self._keys("r")):
            for header in self._older_heads(chunk, self._heads(chunk)):
                try:
                    tool, cost = str(header[4]), float(header[7] or 0)  # type: ignore[index]
                except (TypeError, ValueError, IndexError):
                    continue  # damaged by hand, or cleared meanwhile: not counted
                count, total = by_tool.get(tool, (0, 0.0))
                by_tool[tool] = (count + 1, total + cost)
        memos = len(self._keys("m"))
        with self._failing():
            masters = (
                [self._client.get_redis_connection(node) for node in self._client.get_primaries()]
                if self._slots.cluster
                else [self._client]
            )
            used = sum(int(master.info("memory").get("used_memory", 0)) for master in masters)
        return Counts(by_tool, memos, used)

    def clear(self, tool: str | None = None) -> int:
        self._writable()
        with self._failing():
            return self._clear_all() if tool is None else self._clear_tool(tool)

    def _clear_tool(self, tool: str) -> int:
        """Remove ``tool``'s receipts (counted down in their slot's counter) and the memos of rows that used it."""
        removed = 0
        for chunk in chunks(self._keys("r")):
            doomed = [
                key
                for key, head in zip(chunk, self._heads(chunk))
                if head and len(head) >= 9 and head[4] == tool
            ]
            removed += self._remove(doomed)
        for chunk in chunks(self._keys("m")):
            used = [
                key
                for key, head in zip(chunk, self._heads(chunk))
                if head and len(head) >= 2 and tool in _tools(head)
            ]
            if used:
                self._unlink(used)
        return removed

    def _remove(self, keys: Sequence[str]) -> int:
        """Remove records, counting their receipts down: how many went."""
        prefix, slots = self._prefix, self._slots
        calls = [
            Call(
                REMOVE,
                [slots.counter(keys[group[0]]), *(prefix + keys[at] for at in group)],
                ["1" if is_receipt(keys[at]) else "0" for at in group],
            )
            for group in slots.groups(keys)
        ]
        return sum(int(n) for n in slots.run(calls))

    def _unlink(self, keys: Sequence[str]) -> None:
        self._slots.each("UNLINK", [self._prefix + key for key in keys])

    def _clear_all(self) -> int:
        """Every key under the prefix but the leases (a call being paid for stays leased) and the
        shared limiters' state (``{prefix}:limit:…``: clearing receipts must not lift a provider's
        hold, forget its rate or free the slots of calls in flight), and what runs spent (money
        paid stays paid)."""
        removed = 0
        names = self._slots.scan(_escaped(self._prefix) + "*")
        kept = (self._prefix + "lease:", self._prefix + "limit:")
        doomed = [name for name in names if not name.startswith(kept) and name != self._spend]
        start = len(self._prefix)
        for chunk in chunks(doomed):
            self._unlink([name[start:] for name in chunk])
            removed += sum(_is_record(name[start:]) for name in chunk)
        return removed

    def memo_count(self, tool: str) -> int:
        return sum(
            1
            for chunk in chunks(self._keys("m"))
            for head in self._heads(chunk)
            if head and len(head) >= 2 and tool in _tools(head)
        )

    # -- its mark (marks.py) -----------------------------------------------------------------------

    def receipt_count(self) -> int:
        """The sum of the counters (one on a server, a slot's each on a cluster): what the
        scripts that wrote and removed receipts counted, in the same steps."""
        with self._failing():
            if self._slots.cluster:
                return self._slots.counted()
            # and the receipts of an older layout not rewritten yet (opened read-only): each
            # leaves its sorted set as the rewrite counts it, in one step
            pipe = self._client.pipeline(transaction=False)
            pipe.get(self._prefix + "count")
            pipe.zcard(self._prefix + "receipts")
            count, older = pipe.execute()
            return int(count or 0) + int(older)

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
        from playbook._internal.redis_nodes import remember

        remember(self._url, self._client)  # a cluster's nodes, for the next store of this URL here
        self._client.close()  # and its pool: from_url made the pool for this client alone


def _tools(head: list[Any]) -> list[str]:
    """The tools a memo used, from its header."""
    try:
        return list(parse_tools(str(head[1])))
    except (TypeError, ValueError):
        return []


_HEX = frozenset("0123456789abcdef")


def _is_record(rest: str) -> bool:
    """Whether a key's name after the prefix is a record's or a memo's (a letter, then hex digits),
    not the store's other keys (``mark``, ``count``, ``migrating``…)."""
    return len(rest) > 1 and rest[0] in "rsm" and _HEX.issuperset(rest[1:])


def _escaped(prefix: str) -> str:
    """``prefix`` as a ``SCAN`` pattern matching itself alone."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
