"""A store an older playbook wrote on Redis, rewritten to today's layout when it is first opened
to write, so that every receipt already paid for still replays, and counts.

The older layout kept, beside each record, a hash ``{prefix}:info:{key}`` (tool, version,
account, cost, input) and indexes: the sorted set ``{prefix}:receipts`` of every receipt, a set
``{prefix}:tool:{tool}`` per tool, and the sets ``{prefix}:memos`` and ``{prefix}:memos:{tool}``.
Today each record holds all of it in its own value, and a counter counts the receipts (see
backend.py).  The rewrite goes a chunk of receipts at a time, each chunk one script that takes
the receipts out of the sorted set as it counts them: a chunk done twice (a process that died
mid-way, another that opens the store at the same time) counts nothing twice, and a process that
dies leaves the rest for the next one.  Two processes that open the store at once take turns: a
lock key, expiring, held while one rewrites; the other waits for it to finish.

The rewrite is one way: an older playbook reads the rewritten store as one that lost its
receipts (its sorted set is gone).  The process that rewrites says so (``rewritten``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from playbook.store.records import Record
from playbook.store.redis.format import CHUNK, record_of, record_value

__all__ = ["INFO", "migrate", "rewritten"]

INFO = ["tool", "version", "account", "cost", "input"]  # the fields of an older layout's info hash

LOCK_MS = 30_000  # how long a rewrite may go without news before another process takes it over
# KEYS: the counter, the sorted set, then each receipt's key and its info hash; ARGV: each
# receipt's name in the set, then its value rewritten ("": left as it is).
_CHUNK = """local n = (#KEYS - 2) / 2
local count = 0
for i = 1, n do
  if redis.call('ZREM', KEYS[2], ARGV[i]) == 1 and redis.call('EXISTS', KEYS[1 + 2 * i]) == 1 then
    count = count + 1
    if ARGV[n + i] ~= '' then redis.call('SET', KEYS[1 + 2 * i], ARGV[n + i]) end
  end
  redis.call('DEL', KEYS[2 + 2 * i])
end
if count > 0 then redis.call('INCRBY', KEYS[1], count) end
return count"""


def _older(client: Any, prefix: str) -> bool:
    return bool(client.exists(prefix + "receipts", prefix + "memos"))


def rewritten(location: str) -> str:
    """What a store rewritten here tells its user: the rewrite is one way."""
    from playbook import __version__

    return (
        f"the receipt store at {location} was rewritten to playbook {__version__}'s layout; releases before it "
        "can no longer read it: upgrade every process that uses it. An older release pointed at it refuses it "
        "as lost: do not accept the loss there (that pays every call again), upgrade it"
    )


def migrate(client: Any, prefix: str) -> int | None:
    """Rewrite the older layout under ``prefix`` (a server's client), if there is one; returns the
    receipts this process counted (0 when another process did it), None when there was none."""
    if not _older(client, prefix):
        return None
    lock, token = prefix + "migrating", uuid.uuid4().hex
    while _older(client, prefix):
        if client.set(lock, token, nx=True, px=LOCK_MS):
            try:
                return _rewrite(client, prefix, lock)
            finally:
                if client.get(lock) == token.encode():
                    client.delete(lock)
        time.sleep(0.1)  # another process is rewriting it: wait for it (its lock expires if it died)
    return 0


def _new_values(prefix: str, keys: list[str], values: list[Any], infos: list[Any]) -> list[bytes | str]:
    """Each record's value in today's form ("": gone, damaged, or already so)."""
    out: list[bytes | str] = []
    for key, value, info in zip(keys, values, infos):
        found = None if value is None or not any(v is not None for v in info) else record_of(key, value, info)
        out.append(record_value(found) if isinstance(found, Record) else "")
    return out


def _read(client: Any, prefix: str, keys: list[str]) -> tuple[list[Any], list[Any]]:
    pipe = client.pipeline(transaction=False)
    pipe.mget([prefix + key for key in keys])
    for key in keys:
        pipe.hmget(f"{prefix}info:{key}", INFO)
    values, *infos = pipe.execute()
    return values, infos


def _rewrite(client: Any, prefix: str, lock: str) -> int:
    counted = 0
    script = client.register_script(_CHUNK)
    while members := client.zrange(prefix + "receipts", 0, CHUNK - 1):
        keys = [member.decode("utf-8") for member in members]
        values, infos = _read(client, prefix, keys)
        names = [name for key in keys for name in (prefix + key, f"{prefix}info:{key}")]
        counted += int(
            script(
                keys=[prefix + "count", prefix + "receipts", *names],
                args=[*keys, *_new_values(prefix, keys, values, infos)],
            )
        )
        client.pexpire(lock, LOCK_MS)
    # step records (never in the sorted set), and any hash left
    start = len(prefix) + len("info:")
    infos_left = [
        name.decode("utf-8")[start:]
        for name in client.scan_iter(match=_pattern(prefix) + "info:*", count=CHUNK)
    ]
    for at in range(0, len(infos_left), CHUNK):
        keys = infos_left[at : at + CHUNK]
        values, infos = _read(client, prefix, keys)
        pipe = client.pipeline(transaction=True)
        for key, value in zip(keys, _new_values(prefix, keys, values, infos)):
            if value:
                pipe.set(prefix + key, value)
            pipe.delete(f"{prefix}info:{key}")
        pipe.execute()
        client.pexpire(lock, LOCK_MS)
    for pattern in ("tool:*", "memos:*"):
        for name in client.scan_iter(match=_pattern(prefix) + pattern, count=CHUNK):
            client.unlink(name)
    client.unlink(prefix + "receipts", prefix + "memos")  # last: what says the store is of the older layout
    return counted


def _pattern(prefix: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
