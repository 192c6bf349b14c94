"""The leases of a store on Redis: Lua scripts, atomic on the server and expiring by its clock
(machines whose clocks disagree agree), under ``{prefix}:lease:{key}``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from playbook.store.protocol import Damaged, Found
from playbook.store.redis.format import found_of, text

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

__all__ = ["RedisLeases"]


class RedisLeases:
    """``take``, ``take_and_look``, ``renew``, ``release`` and ``holder`` of
    :class:`~playbook.store.redis.backend.RedisBackend`."""

    _client: redis.Redis
    _prefix: str
    _take: Script  # LEASE_TAKE, registered with the client
    _keep: Script  # LEASE_KEEP
    _failing: Callable[[], AbstractContextManager[None]]
    _writable: Callable[[], None]
    lookup_many: Callable[[Sequence[str]], list[Found | Damaged | None]]

    def take(self, keys: Sequence[str], owner: str, ttl: float) -> list[bool]:
        self._writable()
        if not keys:
            return []
        with self._failing():
            got = self._take(keys=self.lease_names(keys), args=[owner, max(1, round(ttl * 1000))])
        return [bool(ok) for ok in got]

    def take_and_look(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> tuple[list[bool], list[Found | Damaged | None]]:
        self._writable()
        if not keys:
            return [], []
        leases = self.lease_names(keys)
        with self._failing():
            # in order, on one connection: the reads see the leases taken
            pipe = self._client.pipeline(transaction=False)
            pipe.evalsha(self._take.sha, len(leases), *leases, owner, max(1, round(ttl * 1000)))
            pipe.mget([self._prefix + key for key in keys])
            got, values = pipe.execute(raise_on_error=False)
        if isinstance(got, Exception) or isinstance(values, Exception):
            # the script is not on the server yet (new or restarted)
            return self.take(keys, owner, ttl), self.lookup_many(keys)
        return [bool(ok) for ok in got], [None if value is None else found_of(value) for value in values]

    def renew(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        self._writable()
        if keys:
            with self._failing():
                self._keep(keys=self.lease_names(keys), args=[owner, max(1, round(ttl * 1000))])

    def release(self, keys: Sequence[str], owner: str) -> None:
        self._writable()
        if keys:
            with self._failing():
                self._keep(keys=self.lease_names(keys), args=[owner])

    def holder(self, key: str) -> tuple[str, float] | None:
        (name,) = self.lease_names([key])
        with self._failing():
            pipe = self._client.pipeline(transaction=True)
            pipe.get(name)
            pipe.pttl(name)
            owner, left = pipe.execute()
        if owner is None or left == -2:  # -2: it expired between the two
            return None
        return text(owner), (left / 1000 if left >= 0 else math.inf)

    def lease_names(self, keys: Sequence[str]) -> list[str]:
        """The Redis keys of the leases on ``keys``."""
        return [f"{self._prefix}lease:{key}" for key in keys]
