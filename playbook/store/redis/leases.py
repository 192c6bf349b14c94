"""The leases of a store on Redis: Lua scripts, atomic on the server and expiring by its clock
(machines whose clocks disagree agree), under ``{prefix}:lease:{{prefix}:key}``: the hash tag is
the receipt's own key, so a lease is in its receipt's slot on a cluster, and taking leases and
reading their receipts is one script a slot (one for a whole batch on one server; each master's
slots run by one script on a cluster: slots.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from playbook.store.protocol import Damaged, Found
from playbook.store.redis.format import LEASE_KEEP, LEASE_TAKE, TAKE_LOOK, found_of, text
from playbook.store.redis.slots import Call, Slots

__all__ = ["RedisLeases"]


class RedisLeases:
    """``take``, ``take_and_look``, ``renew``, ``release`` and ``holder`` of
    :class:`~playbook.store.redis.backend.RedisBackend`."""

    _client: Any
    _slots: Slots
    _prefix: str
    _failing: Callable[[], AbstractContextManager[None]]
    _writable: Callable[[], None]

    def _each_group(
        self, script: str, keys: Sequence[str], args: Sequence[Any], *, look: bool = False
    ) -> list[Any]:
        """``script`` on the leases of ``keys`` (and, with ``look``, their receipts), a group at a
        time; the answers of each group, in the order of ``keys``."""
        prefix = self._prefix
        groups = self._slots.groups(keys)
        calls = [
            Call(
                script,
                [
                    *self.lease_names([keys[at] for at in group]),
                    *((prefix + keys[at] for at in group) if look else ()),
                ],
                args,
            )
            for group in groups
        ]
        with self._failing():
            answers = self._slots.run(calls)
        found: list[Any] = [None] * (2 * len(keys) if look else len(keys))
        for group, answer in zip(groups, answers):
            for i, at in enumerate(group):
                if look:
                    found[at], found[len(keys) + at] = answer[i], answer[len(group) + i]
                elif answer is not None:
                    found[at] = answer[i]
        return found

    def take(self, keys: Sequence[str], owner: str, ttl: float) -> list[bool]:
        self._writable()
        if not keys:
            return []
        return [bool(ok) for ok in self._each_group(LEASE_TAKE, keys, [owner, max(1, round(ttl * 1000))])]

    def take_and_look(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> tuple[list[bool], list[Found | Damaged | None]]:
        self._writable()
        if not keys:
            return [], []
        both = self._each_group(TAKE_LOOK, keys, [owner, max(1, round(ttl * 1000))], look=True)
        n = len(keys)
        return [bool(ok) for ok in both[:n]], [
            None if value is None else found_of(value) for value in both[n:]
        ]

    def renew(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        self._writable()
        if keys:
            self._keep(keys, [owner, max(1, round(ttl * 1000))])

    def release(self, keys: Sequence[str], owner: str) -> None:
        self._writable()
        if keys:
            self._keep(keys, [owner])

    def _keep(self, keys: Sequence[str], args: Sequence[Any]) -> None:
        groups = self._slots.groups(keys)
        calls = [Call(LEASE_KEEP, self.lease_names([keys[at] for at in group]), args) for group in groups]
        with self._failing():
            self._slots.run(calls)

    def holder(self, key: str) -> tuple[str, float] | None:
        name = self.lease_name(key)
        with self._failing():
            pipe = (
                self._client.pipeline(transaction=True)
                if not self._slots.cluster
                else self._client.pipeline()
            )
            pipe.get(name)
            pipe.pttl(name)
            owner, left = pipe.execute()
        if owner is None or left == -2:  # -2: it expired between the two
            return None
        return text(owner), (left / 1000 if left >= 0 else math.inf)

    def lease_name(self, key: str) -> str:
        """The Redis key of the lease on ``key``: tagged with the receipt's key, in its slot."""
        return f"{self._prefix}lease:{{{self._prefix}{key}}}"

    def lease_names(self, keys: Sequence[str]) -> list[str]:
        """The Redis keys of the leases on ``keys``."""
        prefix = self._prefix
        return [f"{prefix}lease:{{{prefix}{key}}}" for key in keys]
