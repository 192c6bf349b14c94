"""One event loop's connection to a shared limiter's Redis.

A redis-py asyncio client, its registered scripts, an ``asyncio.Lock`` and a task all belong to
the loop they were made on, and a provider is shared by every thread of the process, each running
its ``map()`` on a loop of its own.  So the :class:`~playbook.providers.limits.shared.RedisLimiter` keeps
its rate, holds and calls in flight for the whole process, and one :class:`Link` per loop for
talking to Redis: the client, the one task at a time that asks for a permit, the permits this
loop's calls hold (renewed while they do).  A link that has nothing under way closes its client,
so none outlives the loop that opened it (a notebook's next run may be on another loop).

Also here: importing redis-py with a hint to install it, and taking playbook's own options
(``?permit_ttl=``) out of a ``shared=`` URL before it reaches redis-py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from playbook._internal.dist import install_hint
from playbook.errors import PlayDefinitionError

__all__ = ["Link", "import_redis", "split_options"]

PERMIT_TTL = 30.0  # seconds a permit outlives its process; renewed every third of it


class Link:
    """This loop's client and permits (``renew(keys)`` renews the permits still held)."""

    __slots__ = (
        "loop",
        "turn",
        "freed",
        "permits",
        "busy",
        "_open",
        "_client",
        "_scripts",
        "_renew",
        "_renewer",
        "_every",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        open_client: Callable[[], tuple[Any, dict[str, Any]]],
        renew: Callable[[Link, list[str]], Awaitable[None]],
        every: float,
    ) -> None:
        self.loop = loop
        self.turn = asyncio.Lock()  # one asker for a permit at a time; the rest wait here, in order
        self.freed = asyncio.Event()  # a slot came back: the asker asks again now, not at its next poll
        self.permits: set[str] = set()  # ids holding a slot, renewed while they do
        self.busy = 0  # scripts under way, and acquirers waiting: the client stays open meanwhile
        self._open = open_client
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._renew = renew
        self._renewer: asyncio.Task[None] | None = None
        self._every = every

    def __repr__(self) -> str:
        state = "open" if self._client is not None else "closed"
        return f"<Link {state} permits={len(self.permits)} busy={self.busy}>"

    @property
    def client(self) -> Any:
        """The client, while open (None: closed)."""
        return self._client

    @property
    def idle(self) -> bool:
        return not self.busy and not self.permits

    def connect(self) -> tuple[Any, dict[str, Any]]:
        if self._client is None:
            self._client, self._scripts = self._open()
        return self._client, self._scripts

    async def close(self) -> None:
        client, self._client, self._scripts = self._client, None, {}
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    def keep(self, key: str) -> None:
        self.permits.add(key)
        if self._renewer is None:
            self._renewer = self.loop.create_task(self._renewing())

    def drop(self, key: str) -> None:
        self.permits.discard(key)
        self.freed.set()
        if not self.permits and self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None

    async def _renewing(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            if self.permits:
                await self._renew(self, sorted(self.permits))


def import_redis() -> Any:
    try:
        import redis.asyncio
        import redis.exceptions
    except ImportError as exc:
        raise ImportError(f"shared= limits need redis-py: {install_hint('redis')}") from exc
    return redis


def split_options(url: str, provider: str) -> tuple[str, float]:
    """Take playbook's own options out of the URL: ``(url for redis-py, permit_ttl)``.  A store's
    ``durability=`` goes too: one URL may name the store and the shared limits (a cluster's does)."""
    parts = urlsplit(url)
    ours = [(k, v) for k, v in parse_qsl(parts.query) if k == "permit_ttl"]
    rest = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("permit_ttl", "durability")]
    ttl = PERMIT_TTL
    if ours:
        try:
            ttl = float(ours[-1][1])
        except ValueError:
            ttl = -1.0
        if not 0.1 <= ttl <= 86400:
            raise PlayDefinitionError(
                f"Provider {provider!r}: permit_ttl in shared= must be seconds in [0.1, 86400], not {ours[-1][1]!r}"
            )
    return urlunsplit(parts._replace(query=urlencode(rest))), ttl
