"""A batch of a store's keys, sent to one Redis server or to the masters of a Redis Cluster.

The store has one code path for both.  A script runs on the keys of one *group*: the whole batch
on one server, the keys of one hash slot on a cluster (a script's declared keys must share a
slot).  On a cluster every master's groups go as one script (``allow-cross-slot-keys``, Redis 7:
a script may use the keys of every slot its node serves): the group's script made a function,
run on each group in turn, after it checked that the node serves all of that group's keys
(:func:`whole`); reads and plain sets go the same way, one script per master.  The masters' scripts
are written on a connection to each at once, then the answers read: one round trip for all, and
a write ends with ``WAIT 1`` on that same connection, so that what a master acknowledged is on a
replica before the store counts it written: a failover then loses at most the writes in flight.

A group the node did not serve (its slot moved: ``MOVED``, ``ASK``, a slot on the move), a
master that failed, or a server older than 7.0 (which knows no script flags) falls back to the
slot at a time: each group's script on its own (``EVALSHA``), every master's at once, and, should
that fail again, through the cluster client, which finds where the slot is now and retries for
as long as a replica takes to be promoted.  Writes are safe to send twice: they set values, and
a script counts a receipt only when its key did not exist.

Each slot has its own counter of receipts, a key in that slot: ``{prefix}:n{T}``, where ``T`` is
a short tag whose CRC16 falls in the slot (:func:`tag`).
"""

from __future__ import annotations

import functools
import hashlib
import string
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["WAIT_MS", "Call", "Slots", "str_of", "tag", "whole"]

WAIT_MS = 1000  # how long a write waits for a replica before it goes on (the marks see a loss)
_SLOTS = 16384
_ALPHABET = (string.ascii_letters + string.digits).encode()
_TAGS: list[str] = []
# The counters of the slots one master serves, summed (their names in ARGV: keys of many slots,
# which a script may read on its own node when it says so).
_SUM = """#!lua flags=no-writes,allow-cross-slot-keys
local n = 0
for _, key in ipairs(ARGV) do n = n + (tonumber(redis.call('GET', key)) or 0) end
return n"""
# The values of the keys in ARGV (of many slots, on this node); a key the node does not serve
# (its slot moved) answers 0, which no value is (a value is a string or nil).
_GET = """#!lua flags=no-writes,allow-cross-slot-keys
local out = {}
for i, key in ipairs(ARGV) do
  local value = redis.pcall('GET', key)
  if type(value) == 'table' then out[i] = 0 else out[i] = value end
end
return out"""
# Set each key of ARGV (name, value, name, value…) to its value; returns the positions (from 1)
# of the pairs the node did not set (their slot moved).
_SET = """#!lua flags=allow-cross-slot-keys
local failed = {}
for i = 1, #ARGV, 2 do
  local done = redis.pcall('SET', ARGV[i], ARGV[i + 1])
  if done.err then failed[#failed + 1] = (i + 1) / 2 end
end
return failed"""
_WHOLE = """#!lua flags=allow-cross-slot-keys
local function group(KEYS, ARGV)
{script}
end
local out, at = {{}}, 2
for g = 1, tonumber(ARGV[1]) do
  local nk, na = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  local keys = {{unpack(ARGV, at + 2, at + 1 + nk)}}
  local args = {{unpack(ARGV, at + 2 + nk, at + 1 + nk + na)}}
  at = at + 2 + nk + na
  local done, answer = false, nil
  if type(redis.pcall('EXISTS', unpack(keys))) ~= 'table' then done, answer = pcall(group, keys, args) end
  if done then out[g] = {{answer}} else out[g] = false end
end
return out"""


@functools.cache
def whole(script: str) -> str:
    """``script`` (a group's, its keys in one slot) run on every group of a master's part of a
    batch, in one script.  ARGV: the number of groups, then each group's count of keys, count of
    arguments, keys and arguments.  Each group's keys are first touched at once (``EXISTS``,
    which fails, writing nothing, unless the node serves every one of them: not its slot, or a
    slot on the move whose keys are not all here yet); a group that fails is answered ``false``
    and left as it was, any other ``{answer}`` (``{}``: none).  A script runs whole, so no slot
    moves between the check and the writes.  A group whose own script fails (a key of another
    type) is answered ``false`` too, and the groups after it still run: sent again on its own,
    it fails where the error can be told."""
    return _WHOLE.format(script=script)


def tag(slot: int) -> str:
    """A short string (one to three characters, letters and digits) whose hash slot is ``slot``:
    the first such string, the shorter first, then in the order of ``_ALPHABET``.  The table is
    made once per process, in a few hundredths of a second."""
    if not _TAGS:
        _TAGS.extend(_tags())
    return _TAGS[slot]


def _tags() -> list[str]:
    """Each slot's tag.  CRC16 (XMODEM, as Redis hashes keys) is linear: the CRC of a string is
    the XOR of the CRCs of each of its characters in its place among zero bytes, so the CRCs of
    every string of one length are XORs of a column per place (numpy), in the order of
    ``itertools.product(_ALPHABET, repeat=size)``."""
    from binascii import crc_hqx

    import numpy as np

    found: dict[int, str] = {}
    for size in range(1, 5):
        crcs = np.zeros(1, dtype=np.uint16)
        for place in range(size):
            column = [crc_hqx(bytes(place) + bytes([c]) + bytes(size - place - 1), 0) for c in _ALPHABET]
            crcs = (crcs[:, None] ^ np.array(column, dtype=np.uint16)[None, :]).ravel()
        slots, first = np.unique(crcs % _SLOTS, return_index=True)
        digits = np.array(
            [first // len(_ALPHABET) ** (size - 1 - place) % len(_ALPHABET) for place in range(size)]
        )
        names = np.frombuffer(_ALPHABET, dtype=np.uint8)[digits.T].tobytes().decode("ascii")
        for i, slot in enumerate(slots.tolist()):
            found.setdefault(slot, names[i * size : (i + 1) * size])
        if len(found) == _SLOTS:
            break
    return [found[slot] for slot in range(_SLOTS)]


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
        # Whether the masters run scripts of many slots (Redis 7's script flags): until one says not.
        self._whole = self.cluster
        self._counters: list[str] = []

    def cluster_ok(self) -> bool:
        """Whether a node the client knows says the cluster is ok (``cluster_state:ok``)."""
        for node in list(self.client.nodes_manager.nodes_cache.values()):
            if node.redis_connection is None:
                continue
            try:
                info = node.redis_connection.execute_command("CLUSTER INFO")
            except Exception:  # a node gone, or refusing: ask the next
                continue
            if isinstance(info, dict):
                state = info.get("cluster_state", info.get(b"cluster_state"))
                if str_of(state) == "ok":
                    return True
            elif "cluster_state:ok" in str_of(info):
                return True
        return False

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

        return self._counter(key_slot((self.prefix + key).encode()))

    def _counter(self, slot: int) -> str:
        if not self._counters:
            self._counters = [f"{self.prefix}n{{{tag(each)}}}" for each in range(_SLOTS)]
        return self._counters[slot]

    def counted(self) -> int:
        """The sum of the counters of receipts: one key on a server; on a cluster, every slot's,
        summed by one script on each master over the slots it serves, every master's at once, or
        read slot by slot where scripts may not (before Redis 7, or a slot that moved meanwhile)."""
        if not self.cluster:
            return int(self.client.get(self.prefix + "count") or 0)

        from redis.exceptions import ConnectionError, TimeoutError

        try:
            return self._counted()
        except (ConnectionError, TimeoutError, OSError):  # a master gone since the topology was read
            self._moved()
            return self._counted()

    def _counted(self) -> int:
        from redis.exceptions import SlotNotCoveredError

        cache = self.client.nodes_manager.slots_cache
        if len(cache) < _SLOTS:  # a count short of some slots would look like receipts lost
            raise SlotNotCoveredError(f"{_SLOTS - len(cache)} of the cluster's {_SLOTS} slots have no master")
        owned: dict[str, tuple[Any, list[str]]] = {}
        for slot, owners in cache.items():
            owned.setdefault(owners[0].name, (owners[0], []))[1].append(self._counter(slot))
        parts = list(owned.values())
        sums = (
            self._scripted([(node, [(_SUM, names)]) for node, names in parts])
            if self._whole
            else [[None]] * len(parts)
        )
        total = 0
        for (_, names), (counted,) in zip(parts, sums):
            if isinstance(counted, int):
                total += counted
            else:  # an older server, or a slot that moved meanwhile
                self._flags_known(counted)
                total += sum(int(n) for n in self.get(names) if n is not None)
        return total

    def _sha(self, script: str) -> str:
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        return sha

    def run(self, calls: Sequence[Call], *, wait: bool = False) -> list[Any]:
        """Each call's answer, in order; on a cluster, one script per master, every master's at
        once (then ``WAIT`` for a replica when ``wait``).  A call whose slot moved, or that met a
        failover or a server older than 7.0, is sent on its own, each master's at once (by
        ``EVALSHA``, then by ``EVAL`` to a node without the script), then, should it fail again,
        through the cluster client, which retries until a replica has taken over."""
        answers: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        if self._whole and todo:
            todo = self._on_masters_whole(todo, calls, answers, wait=wait)
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
        """``positions`` by the master of their call's slot."""
        return [
            (node, [positions[i] for i in mine])
            for node, mine in self._by_master([calls[at].keys[0] for at in positions])
        ]

    def _on_masters_whole(
        self, positions: Sequence[int], calls: Sequence[Call], answers: list[Any], *, wait: bool
    ) -> list[int]:
        """``calls[positions]`` on a cluster, each master's as one script (:func:`whole`), every
        master's at once; their answers put in ``answers``; returns the positions left to send a
        slot at a time (their slot moved, their master failed, or it is older than 7.0)."""
        from redis.exceptions import RedisError

        parts = []
        for node, mine in self._by_node(positions, calls):
            kinds: dict[str, list[int]] = {}
            for at in mine:
                kinds.setdefault(calls[at].script, []).append(at)
            scripts = []
            for script, ats in kinds.items():
                argv: list[Any] = [len(ats)]
                for at in ats:
                    call = calls[at]
                    argv += (len(call.keys), len(call.args), *call.keys, *call.args)
                scripts.append((whole(script), argv))
            parts.append((node, scripts, list(kinds.values())))
        failed: list[int] = []
        for (_, _, kinds_at), got in zip(parts, self._scripted([(n, s) for n, s, _ in parts], wait=wait)):
            for ats, answer in zip(kinds_at, got):
                if isinstance(answer, RedisError | OSError):
                    self._flags_known(answer)
                    failed.extend(ats)
                    continue
                for at, each in zip(ats, answer):
                    if each is None:  # a slot this master no longer serves (or not whole)
                        failed.append(at)
                    else:
                        answers[at] = each[0] if each else None
        if failed:
            self._moved()
        return failed

    def _scripted(
        self, parts: Sequence[tuple[Any, Sequence[tuple[str, Sequence[Any]]]]], *, wait: bool = False
    ) -> list[list[Any]]:
        """Each node's scripts (``(script, ARGV)``, no keys declared) run on that node, every
        node's at once (``EVALSHA``, then ``EVAL`` for those the node did not know), ending in
        ``WAIT`` when ``wait`` and the node has a replica.  Each node's answers in order: the
        script's, or the error met."""
        from redis.exceptions import NoScriptError

        def commands(node: Any, scripts: Sequence[tuple[str, Sequence[Any]]], again: bool) -> list[Any]:
            sent: list[Any] = [
                ("EVAL", script, 0, *argv) if again else ("EVALSHA", self._sha(script), 0, *argv)
                for script, argv in scripts
            ]
            if wait and self._replicated(node):
                sent.append(("WAIT", 1, WAIT_MS))
            return sent

        got = self._exchange([(node, commands(node, scripts, False)) for node, scripts in parts])
        unknown = [
            (i, [j for j, answer in enumerate(got[i][: len(scripts)]) if isinstance(answer, NoScriptError)])
            for i, (_, scripts) in enumerate(parts)
        ]
        unknown = [(i, js) for i, js in unknown if js]
        if unknown:  # a node that had not seen them (new, or promoted since): sent whole
            again = self._exchange(
                [
                    (parts[i][0], commands(parts[i][0], [parts[i][1][j] for j in js], True))
                    for i, js in unknown
                ]
            )
            for (i, js), answers in zip(unknown, again):
                for j, answer in zip(js, answers):
                    got[i][j] = answer
        return [answers[: len(scripts)] for answers, (_, scripts) in zip(got, parts)]

    def _flags_known(self, error: Any) -> None:
        """A server older than 7.0 cannot read a script's flags (its first line): the masters'
        parts go a slot at a time from then on."""
        from redis.exceptions import ResponseError

        if isinstance(error, ResponseError) and ("compiling" in str(error) or "shebang" in str(error)):
            self._whole = False

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
        server; on a cluster, one script per master, every master's at once (a slot that moved
        meanwhile, or every slot before Redis 7, read a slot at a time: :meth:`_get_slotwise`)."""
        if not names:
            return []
        if not self.cluster:
            return list(self.client.mget(names))
        answers: list[Any] = [None] * len(names)
        left = self._get_whole(names, answers) if self._whole else range(len(names))
        if left:
            for at, value in zip(left, self._get_slotwise([names[at] for at in left])):
                answers[at] = value
        return answers

    def _get_whole(self, names: Sequence[str], answers: list[Any]) -> list[int]:
        """``names`` read by one script per master (``_GET``), their values put in ``answers``;
        returns the positions a master did not read (not its slot, or it failed)."""
        from redis.exceptions import RedisError

        by_node = self._by_master(names)
        got = self._scripted([(node, [(_GET, [names[at] for at in mine])]) for node, mine in by_node])
        left: list[int] = []
        for (_, mine), (values,) in zip(by_node, got):
            if isinstance(values, RedisError | OSError):
                self._flags_known(values)
                left.extend(mine)
                continue
            for at, value in zip(mine, values):
                if isinstance(value, int):  # a slot this master does not serve
                    left.append(at)
                else:
                    answers[at] = value
        if left:
            self._moved()
        return left

    def _get_slotwise(self, names: Sequence[str]) -> list[Any]:
        """The values of ``names``: one ``MGET`` per slot, every master's at once (a slot that
        moved meanwhile read again through the cluster client)."""
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
        """Set each key (full names) to its value: one ``MSET`` on a server; on a cluster, one
        script per master, every master's at once (a slot that moved meanwhile, or every slot
        before Redis 7, set a slot at a time: :meth:`_set_slotwise`)."""
        if not values:
            return
        if not self.cluster:
            self.client.mset(values)
            return
        left = self._set_whole(values) if self._whole else values
        if left:
            self._set_slotwise(left)

    def _set_whole(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` set by one script per master (``_SET``); returns those a master did not set."""
        from redis.exceptions import RedisError

        names = list(values)
        by_node = self._by_master(names)
        got = self._scripted(
            [
                (node, [(_SET, [part for at in mine for part in (names[at], values[names[at]])])])
                for node, mine in by_node
            ]
        )
        left: dict[str, Any] = {}
        for (_, mine), (failed,) in zip(by_node, got):
            if isinstance(failed, RedisError | OSError):
                self._flags_known(failed)
                failed = range(1, len(mine) + 1)
            left.update((names[mine[i - 1]], values[names[mine[i - 1]]]) for i in failed)
        if left:
            self._moved()
        return left

    def _set_slotwise(self, values: dict[str, Any]) -> None:
        """Set ``values``: one ``MSET`` per slot, every master's at once (a slot that moved
        meanwhile set again through the cluster client)."""
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

    def _by_master(self, names: Sequence[str]) -> list[tuple[Any, list[int]]]:
        """The positions of ``names`` by the master that serves their slot."""
        from redis.crc import key_slot
        from redis.exceptions import SlotNotCoveredError

        by_node: dict[str, tuple[Any, list[int]]] = {}
        owners = self.client.nodes_manager.slots_cache  # read without the client's lock: it is replaced whole
        try:
            for at, name in enumerate(names):
                node = owners[key_slot(name.encode())][0]
                by_node.setdefault(node.name, (node, []))[1].append(at)
        except (KeyError, IndexError):
            raise SlotNotCoveredError(f"the slot of {names[at]!r} has no master") from None
        return list(by_node.values())

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
