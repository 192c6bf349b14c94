"""A batch of a store's keys, sent to one Redis server or to the masters of a Redis Cluster.

The store has one code path for both.  A script runs on the keys of one *group*: the whole batch
on one server, the keys of one hash slot on a cluster (a script's keys must share a slot).  On a
cluster each master's groups go in one plain pipeline on a connection to that master, one round
trip per master, and a write ends with ``WAIT 1`` on that same connection, so that what a master
acknowledged is on a replica before the store counts it written: a failover then loses at most
the writes in flight.  A group that met a failover (a node gone, ``MOVED``, ``ASK``, a script the
node has not seen) is sent again through the cluster client, which finds where its slot is now
and retries for as long as a replica takes to be promoted.  Writes are safe to send twice: they
set values, and a script counts a receipt only when its key did not exist.

Each slot has its own counter of receipts, a key in that slot: ``{prefix}:n{T}``, where ``T`` is
a short tag whose CRC16 falls in the slot (:func:`tag`).
"""

from __future__ import annotations

import hashlib
import itertools
import string
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["WAIT_MS", "Call", "Slots", "str_of", "tag"]

WAIT_MS = 1000  # how long a write waits for a replica before it goes on (the marks see a loss)
_TAGS: dict[int, str] = {}
# The counters of the slots one master serves, summed (their names in ARGV: keys of many slots,
# which a script may read on its own node when it says so).
_SUM = """#!lua flags=no-writes,allow-cross-slot-keys
local n = 0
for _, key in ipairs(ARGV) do n = n + (tonumber(redis.call('GET', key)) or 0) end
return n"""


def tag(slot: int) -> str:
    """A short string (one to four characters) whose hash slot is ``slot``: the table is made once
    per process, in about a tenth of a second."""
    if not _TAGS:
        from redis.crc import key_slot

        alphabet = string.ascii_letters + string.digits
        for size in range(1, 5):
            for letters in itertools.product(alphabet, repeat=size):
                name = "".join(letters)
                _TAGS.setdefault(key_slot(name.encode()), name)
            if len(_TAGS) == 16384:
                break
    return _TAGS[slot]


def str_of(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _packed(commands: Sequence[tuple[Any, ...]]) -> bytes:
    """``commands`` in the protocol's own form (RESP): what redis-py's ``pack_commands`` makes,
    for the few kinds of argument the store sends (text, bytes, integers), at a fraction of its cost."""
    out = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            data = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Call(NamedTuple):
    """A script to run on ``keys`` (all in one slot) with ``args``."""

    script: str
    keys: Sequence[str]
    args: Sequence[Any]


class Slots:
    """How a batch of keys goes to the server (``cluster`` False) or to a cluster's masters."""

    def __init__(self, client: Any, prefix: str) -> None:
        import redis

        self.client = client
        self.cluster = isinstance(client, redis.RedisCluster)
        self.prefix = prefix
        self._shas: dict[str, str] = {}
        self._replicas: dict[str, tuple[bool, float]] = {}  # node name -> (has a replica, when asked)

    def groups(self, keys: Sequence[str]) -> list[list[int]]:
        """The positions of ``keys`` (store keys, without the prefix) by group: one group on a
        server, one per hash slot on a cluster."""
        if not self.cluster:
            return [list(range(len(keys)))] if keys else []
        from redis.crc import key_slot

        found: dict[int, list[int]] = {}
        prefix = self.prefix.encode()
        for at, key in enumerate(keys):
            found.setdefault(key_slot(prefix + key.encode()), []).append(at)
        return list(found.values())

    def counter(self, key: str) -> str:
        """The counter of receipts in ``key``'s group (a store key, without the prefix)."""
        if not self.cluster:
            return self.prefix + "count"
        from redis.crc import key_slot

        return f"{self.prefix}n{{{tag(key_slot((self.prefix + key).encode()))}}}"

    def counted(self) -> int:
        """The sum of the counters of receipts: one key on a server; on a cluster, every slot's,
        summed by one script on each master over the slots it serves (a script may read keys of
        several slots of its own node), or read slot by slot where scripts may not (before Redis 7)."""
        if not self.cluster:
            return int(self.client.get(self.prefix + "count") or 0)

        from redis.exceptions import ConnectionError, TimeoutError

        try:
            return self._counted()
        except (ConnectionError, TimeoutError, OSError):  # a master gone since the topology was read
            self._moved()
            return self._counted()

    def _counted(self) -> int:
        from redis.exceptions import ResponseError, SlotNotCoveredError

        cache = self.client.nodes_manager.slots_cache
        if len(cache) < 16384:  # a count short of some slots would look like receipts lost
            raise SlotNotCoveredError(f"{16384 - len(cache)} of the cluster's 16384 slots have no master")
        owned: dict[str, tuple[Any, list[str]]] = {}
        for slot, owners in cache.items():
            owned.setdefault(owners[0].name, (owners[0], []))[1].append(f"{self.prefix}n{{{tag(slot)}}}")
        total = 0
        for node, names in owned.values():
            try:
                total += int(self.client.get_redis_connection(node).eval(_SUM, 0, *names))
            except ResponseError:  # an older server, or a slot that moved meanwhile
                total += sum(int(n) for n in self.get(names) if n is not None)
        return total

    def _sha(self, script: str) -> str:
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        return sha

    def run(self, calls: Sequence[Call], *, wait: bool = False) -> list[Any]:
        """Each call's answer, in order; on a cluster, one round trip per master (then ``WAIT``
        for a replica when ``wait``).  A call that met a failover or a node without the script is
        sent again the same way (by ``EVAL``, to where its slot is now), then, should it fail
        again, through the cluster client, which retries until a replica has taken over."""
        answers: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for again in (False, True):
            if not todo:
                break
            if not self.cluster:
                failed = self._on(self.client, todo, calls, answers, again=again)
            else:
                failed = self._on_masters(todo, calls, answers, wait=wait, again=again)
            todo = failed
        for at in todo:  # what failed twice: the client's own retries (a cluster's ride out a failover)
            call = calls[at]
            answers[at] = self.client.eval(call.script, len(call.keys), *call.keys, *call.args)
        return answers

    def _by_node(self, positions: Sequence[int], calls: Sequence[Call]) -> list[tuple[Any, list[int]]]:
        by_node: dict[str, tuple[Any, list[int]]] = {}
        for at in positions:
            node = self.client.get_node_from_key(calls[at].keys[0])
            by_node.setdefault(node.name, (node, []))[1].append(at)
        return list(by_node.values())

    def _replicated(self, node: Any) -> bool:
        """Whether ``node`` has a replica to wait for (a cluster without replicas would wait in
        vain), as the node said in the last half minute (``ROLE``: the replicas attached now)."""
        known = self._replicas.get(node.name)
        if known is not None and time.monotonic() - known[1] < 30.0:
            return known[0]
        try:
            role = self.client.get_redis_connection(node).execute_command("ROLE")
            attached = bool(role[2]) if role and str_of(role[0]) == "master" else False
        except Exception:
            attached = False
        self._replicas[node.name] = (attached, time.monotonic())
        return attached

    def _on(
        self, client: Any, positions: Sequence[int], calls: Sequence[Call], answers: list[Any], *, again: bool
    ) -> list[int]:
        """``calls[positions]`` in one pipeline on one server (``again``: by ``EVAL``), their
        answers put in ``answers``; returns the positions the server had no script for."""
        from redis.exceptions import RedisError

        pipe = client.pipeline(transaction=False)
        for at in positions:
            call = calls[at]
            if again:
                pipe.eval(call.script, len(call.keys), *call.keys, *call.args)
            else:
                pipe.evalsha(self._sha(call.script), len(call.keys), *call.keys, *call.args)
        got = pipe.execute(raise_on_error=False)
        failed = []
        for at, answer in zip(positions, got):
            if isinstance(answer, RedisError):
                failed.append(at)
            else:
                answers[at] = answer
        if again and failed:
            raise got[positions.index(failed[0])]  # an error of the script itself (out of memory)
        return failed

    def _command(self, call: Call, again: bool) -> tuple[Any, ...]:
        if again:
            return ("EVAL", call.script, len(call.keys), *call.keys, *call.args)
        return ("EVALSHA", self._sha(call.script), len(call.keys), *call.keys, *call.args)

    def _on_masters(
        self, positions: Sequence[int], calls: Sequence[Call], answers: list[Any], *, wait: bool, again: bool
    ) -> list[int]:
        """``calls[positions]`` on a cluster: each master's at once, ending in ``WAIT`` when
        ``wait`` and it has a replica; their answers put in ``answers``; returns the positions
        that failed (the topology asked anew if a node went or a slot moved)."""
        from redis.exceptions import NoScriptError, RedisError

        batches = []
        for node, mine in self._by_node(positions, calls):
            commands = [self._command(calls[at], again) for at in mine]
            if wait and self._replicated(node):
                commands.append(("WAIT", 1, WAIT_MS))
            batches.append((node, mine, commands))
        failed, moved = [], False
        for (_, mine, _), got in zip(
            batches, self._exchange([(node, commands) for node, _, commands in batches])
        ):
            for at, answer in zip(mine, got):
                if isinstance(answer, RedisError | OSError):
                    failed.append(at)
                    moved = moved or not isinstance(answer, NoScriptError)
                else:
                    answers[at] = answer
        if moved:
            self._moved()
        return failed

    def _exchange(self, batches: Sequence[tuple[Any, Sequence[tuple[Any, ...]]]]) -> list[list[Any]]:
        """Each node's commands written on a connection of its own, then every answer read: one
        round trip for all the masters at once, not one after the other.  An answer is the
        server's reply or the error met (in-band, or the connection's)."""
        from redis.exceptions import ConnectionError, ResponseError, TimeoutError

        gone = (ConnectionError, TimeoutError, OSError)
        taken: list[tuple[Any, Any]] = []
        errors: list[BaseException | None] = []
        try:
            for node, commands in batches:
                pool = self.client.get_redis_connection(node).connection_pool
                connection = None
                try:
                    connection = pool.get_connection()
                    connection.send_packed_command([_packed(commands)])
                    errors.append(None)
                except gone as exc:
                    errors.append(exc)
                    if connection is not None:
                        connection.disconnect()
                taken.append((pool, connection))
            out: list[list[Any]] = []
            for (_, connection), error, (_, commands) in zip(taken, errors, batches):
                answers: list[Any] = []
                try:
                    while error is None and len(answers) < len(commands):
                        try:
                            answers.append(connection.read_response())
                        except ResponseError as exc:
                            answers.append(exc)
                except gone as exc:
                    connection.disconnect()
                    error = exc
                out.append(answers + [error] * (len(commands) - len(answers)))
            return out
        except BaseException:
            for _, connection in taken:
                if connection is not None:
                    connection.disconnect()  # answers unread: never handed out again as they are
            raise
        finally:
            for pool, connection in taken:
                if connection is not None:
                    pool.release(connection)

    def _moved(self) -> None:
        """Ask the cluster where its slots are now."""
        self.client.nodes_manager.initialize()
        self._replicas.clear()

    def get(self, names: Sequence[str]) -> list[Any]:
        """The values of ``names`` (full key names; ``None`` where absent): one ``MGET`` on a
        server; on a cluster, one per slot, in one plain pipeline per master (a slot that moved
        meanwhile read again through the cluster client)."""
        if not names:
            return []
        if not self.cluster:
            return list(self.client.mget(names))
        from redis.exceptions import RedisError

        by_node = self._by_slot_and_node(names)
        answers: list[Any] = [None] * len(names)
        redo: list[int] = []
        batches = [
            (node, [("MGET", *(names[at] for at in positions)) for positions in groups])
            for node, groups in by_node
        ]
        for (_, groups), got in zip(by_node, self._exchange(batches)):
            for positions, values in zip(groups, got):
                if isinstance(values, RedisError | OSError | None):
                    redo.extend(positions)
                    continue
                for at, value in zip(positions, values):
                    answers[at] = value
        if redo:
            self._moved()
            for at, value in zip(redo, self.client.mget_nonatomic([names[at] for at in redo])):
                answers[at] = value
        return answers

    def set(self, values: dict[str, Any]) -> None:
        """Set each key (full names) to its value: one ``MSET`` on a server; on a cluster, one per
        slot, every master's at once (a slot that moved meanwhile set again through the cluster client)."""
        if not values:
            return
        if not self.cluster:
            self.client.mset(values)
            return
        from redis.exceptions import RedisError

        names = list(values)
        by_node = [
            (node, [[names[at] for at in positions] for positions in groups])
            for node, groups in self._by_slot_and_node(names)
        ]
        batches = [
            (node, [("MSET", *(part for name in group for part in (name, values[name]))) for group in groups])
            for node, groups in by_node
        ]
        redo = {}
        for (_, groups), got in zip(by_node, self._exchange(batches)):
            for group, answer in zip(groups, got):
                if isinstance(answer, RedisError | OSError | None):
                    redo.update({name: values[name] for name in group})
        if redo:
            self._moved()
            self.client.mset_nonatomic(redo)

    def _by_slot_and_node(self, names: Sequence[str]) -> list[tuple[Any, list[list[int]]]]:
        """The positions of ``names`` by slot, the slots by the master that serves them."""
        from redis.crc import key_slot

        by_slot: dict[int, list[int]] = {}
        for at, name in enumerate(names):
            by_slot.setdefault(key_slot(name.encode()), []).append(at)
        by_node: dict[str, tuple[Any, list[list[int]]]] = {}
        owners = self.client.nodes_manager.slots_cache
        for slot, positions in by_slot.items():
            node = owners[slot][0]  # its master (a slot no master serves: the KeyError the client raises too)
            by_node.setdefault(node.name, (node, []))[1].append(positions)
        return list(by_node.values())

    def each(self, command: str, names: Sequence[str], *args: Any) -> list[Any]:
        """``command name *args`` for each of ``names`` (full key names), the answers in order: one
        pipeline on a server; on a cluster, every master's at once (a key whose slot moved
        meanwhile sent again through the cluster client)."""
        if not names:
            return []
        if not self.cluster:
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.execute_command(command, name, *args)
            return list(pipe.execute())
        from redis.exceptions import RedisError

        by_node = [
            (node, [at for positions in groups for at in positions])
            for node, groups in self._by_slot_and_node(names)
        ]
        answers: list[Any] = [None] * len(names)
        redo = []
        batches = [(node, [(command, names[at], *args) for at in mine]) for node, mine in by_node]
        for (_, mine), got in zip(by_node, self._exchange(batches)):
            for at, answer in zip(mine, got):
                if isinstance(answer, RedisError | OSError):
                    redo.append(at)
                else:
                    answers[at] = answer
        if redo:
            self._moved()
            for at in redo:
                answers[at] = self.client.execute_command(command, names[at], *args)
        return answers

    def pipeline(self) -> Any:
        """A pipeline of single-key commands (on a cluster, sent to each key's master)."""
        return self.client.pipeline() if self.cluster else self.client.pipeline(transaction=False)

    def scan(self, match: str) -> list[str]:
        """Every key name matching ``match`` (on a cluster: on every master)."""
        return [
            name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            for name in self.client.scan_iter(match=match, count=1000)
        ]
