"""What a Redis server keeps of the receipts it is given, asked of the server, not assumed.

A receipt is what was paid for: a server that loses it makes a rerun pay again, and change the
value.  Stock ``redis-server`` keeps its data in memory and writes RDB snapshots now and then
(``save 3600 1 300 100 60 10000``): killed or restarted between two, it comes back without the
receipts written since.  With an append-only file (``appendonly yes``, ``appendfsync everysec``)
a killed server or a crashed machine loses at most the last second or two (a write is held back
up to 2 s while a slow sync is under way); ``appendfsync always`` loses nothing.  A server that
evicts keys when its memory is full (any ``maxmemory-policy`` but ``noeviction``) drops receipts
while the run goes on.

At opening the store reads the server's persistence (``CONFIG GET``) and ``INFO``.  The store's
``durability`` says what the user accepts:

* ``"strict"`` (the default): a server without an append-only file, or one whose file is synced
  only when the OS pleases, is said loudly (a notice in the panel, the summary and
  ``run.notices``, and a logged warning) with the line that fixes it; a server that evicts keys
  is refused.
* ``"best-effort"``: the user knows.  A server without an append-only file is accepted quietly;
  one that evicts keys is accepted, and the keys it evicts are counted during each run.

A managed server that hides its configuration (``CONFIG`` refused) is taken at its word.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from playbook.store.protocol import StoreFailure

__all__ = [
    "DURABILITIES",
    "FAILOVER",
    "Evictions",
    "Persistence",
    "durability_in",
    "evicted",
    "judge",
    "kept_by",
    "persistence",
]

DURABILITIES = ("strict", "best-effort")


@dataclass(frozen=True)
class Persistence:
    """The server's answer: ``appendonly``, ``appendfsync``, ``save``, ``maxmemory-policy``,
    its role (``master`` or ``slave``) and ``evicted_keys`` so far."""

    appendonly: bool
    appendfsync: str
    save: str
    policy: str
    role: str
    evicted: int

    @property
    def evicting(self) -> bool:
        return self.policy != "noeviction"


def durability_in(url: str, given: str | None) -> tuple[str, str]:
    """``(url for redis-py, durability)``: ``?durability=`` taken out of the URL (so every process
    that opens the URL, a cluster's workers too, keeps to it); ``given`` wins; "strict" when neither
    says.  Raises ``ValueError`` naming a value that is neither."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    said = [value for key, value in query if key == "durability"]
    chosen = given if given is not None else said[-1] if said else "strict"
    if chosen not in DURABILITIES:
        raise ValueError(f"durability={chosen!r} is not one of {', '.join(map(repr, DURABILITIES))}")
    if said:
        url = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "durability"])))
    return url, chosen


def persistence(client: Any) -> Persistence | None:
    """Ask the server (two round trips); None when it does not say (``CONFIG`` refused)."""
    from redis.exceptions import RedisError

    try:
        config = client.config_get("*")
        info = client.info()
    except RedisError:
        return None
    return Persistence(
        appendonly=config.get("appendonly", "no") == "yes",
        appendfsync=config.get("appendfsync", "everysec"),
        save=config.get("save", ""),
        policy=config.get("maxmemory-policy", "noeviction"),
        role=str(info.get("role", "master")),
        evicted=int(info.get("evicted_keys", 0)),
    )


def judge(found: Persistence, location: str, durability: str) -> tuple[str | None, list[str]]:
    """``(refusal, notices)``: why a store may not open there (or None), and what to tell the user."""
    fix = "ReceiptStore(url, durability='best-effort') accepts it"
    said = []
    if found.role != "master":
        said.append(
            f"the Redis server at {location} is a replica (role {found.role}): receipts written there are not the "
            "primary's, and a replica refuses writes or drops them when it syncs again; name the primary in the URL"
        )
    if found.evicting:
        if durability == "strict":
            return (
                f"the Redis server there evicts keys when its memory is full (maxmemory-policy {found.policy}): each receipt "
                "it evicts is a call paid for again, with a new value. Set CONFIG SET maxmemory-policy noeviction (and "
                f"'maxmemory-policy noeviction' in redis.conf), or {fix}, with the keys it evicts counted during each run",
                said,
            )
        said.append(
            f"the Redis server at {location} evicts keys when its memory is full (maxmemory-policy {found.policy}): "
            "accepted (durability='best-effort'); the keys it evicts during a run are counted in the run's notices"
        )
    if durability == "strict" and not found.appendonly:
        snapshots = (
            f"its RDB snapshots (save {found.save!r}) keep only what was there at the last one"
            if found.save
            else "no snapshots either"
        )
        said.append(
            f"the Redis server at {location} does not keep receipts durably: no append-only file (appendonly no; {snapshots}). "
            "A restart or crash of that server loses the receipts written since, and a rerun pays for those calls again, "
            "with new values. Fix: CONFIG SET appendonly yes (and 'appendonly yes' in redis.conf), or " + fix
        )
    elif durability == "strict" and found.appendfsync == "no":
        said.append(
            f"the Redis server at {location} syncs its append-only file only when the OS flushes it (appendfsync no): a "
            "crash of its machine loses up to about 30 s of receipts. Fix: CONFIG SET appendfsync everysec, or "
            + fix
        )
    return None, said


class Evictions:
    """What an evicting server evicted since the store was opened (``evicted_keys`` at opening:
    ``opened``), told to ``notify`` when the count first grows, each time it doubles, and at the
    end of each run.  ``check`` asks the server at most once a second (or when ``final``)."""

    def __init__(
        self, opened: int, location: str, notify: Callable[[str], None] | None, *, cluster: bool = False
    ) -> None:
        self.opened = self.said = opened
        self.cluster = cluster
        self.location = location
        self.notify = notify
        self.asked = 0.0

    def check(self, client: Any, *, final: bool = False) -> None:
        if not final and time.monotonic() - self.asked < 1.0:
            return
        self.asked = time.monotonic()
        from redis.exceptions import RedisError

        try:
            now = evicted(client, self.cluster)
        except (RedisError, OSError, ValueError):
            return
        count, told = now - self.opened, self.said - self.opened
        if count > told and (final or told == 0 or count >= 2 * told):
            self.said = now
            if self.notify is not None:
                self.notify(
                    f"the Redis server at {self.location} has evicted {count:,} keys since this store was opened (its memory "
                    "is full): receipts among them are calls a rerun pays for again"
                )


FAILOVER = (
    "the store at {location} is on a Redis Cluster: a failover loses the receipts its replica had not received. "
    "playbook WAITs for one replica after each write, so a failover loses at most the writes in flight, and the "
    "store's mark notices a loss before a rerun pays for it again"
)


def _masters(client: Any, cluster: bool) -> list[Any]:
    """A client for each master: the server itself, or each master of a cluster."""
    if not cluster:
        return [client]
    return [client.get_redis_connection(node) for node in client.get_primaries()]


def evicted(client: Any, cluster: bool = False) -> int:
    """The keys the server (every master of a cluster) has evicted so far."""
    return sum(int(each.info("stats").get("evicted_keys", 0)) for each in _masters(client, cluster))


def kept_by(
    client: Any,
    location: str,
    durability: str,
    notify: Callable[[str], None] | None,
    *,
    cluster: bool = False,
) -> tuple[list[str], Evictions | None]:
    """What the server at ``location`` (every master, on a cluster) keeps, read as a store opens
    it: what to tell the user at every run, and, on a server that evicts keys, the count of what
    it evicts.  An evicting server the user has not accepted is refused (``StoreFailure``, its
    client closed)."""
    said: list[str] = []
    evicting: list[Persistence] = []
    for master in _masters(client, cluster):
        found = persistence(master)
        if found is None:
            continue  # a managed server that hides its configuration: taken at its word
        refusal, notices = judge(found, location, durability)
        if refusal is not None:
            client.close()
            raise StoreFailure(refusal, "EVICTING")
        said.extend(notice for notice in notices if notice not in said)
        if found.evicting:
            evicting.append(found)
    if not evicting:
        return said, None
    return said, Evictions(evicted(client, cluster), location, notify, cluster=cluster)
