"""The limiter shared through Redis: one rate, one bound on calls in flight and one hold for every
process and machine that names the same provider account at the same Redis.

Each decision is one Lua script (:mod:`playbook.providers.limits.scripts`), run with EVALSHA through
redis-py's ``register_script``, on Redis's clock. A permit is a member of a sorted set scored by its
expiry; this process renews its permits while their calls are in flight, so a process killed
mid-call (``kill -9``) gives its slots back ``permit_ttl`` seconds later. The rate is paced by
reserving GCRA slots at most ``HORIZON`` seconds ahead: a cut or a hold set meanwhile reaches the
next reservation, not calls already queued a minute ahead.

Each thread's loop talks to Redis over a connection of its own
(:class:`~playbook.providers.limits.redis_link.Link`); what the limiter learns (the rate, holds,
calls in flight) is the whole process's. Only one task per loop asks for a permit at a time (the
others queue there, in order): while the account has no room, that one polls, and a slot this
process frees wakes it at once. What Redis cannot answer (it is down, refuses connections) is a
retryable ``ToolError`` naming the provider and the URL, so the governor treats it as it treats a
provider that refuses connections: retried, then *down*: its rows wait for its probes within their
``max_wait``, then park with that message.  A URL that cannot work however long they wait (a
password, a database a cluster lacks, TLS at a plain Redis) is a ``RunFatal`` naming ``shared=``:
the run stops at its first call.  A slot that cannot be given back for an outage comes back by
expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import random
import threading
from collections import deque
from typing import Any, Literal

from playbook._internal.dist import install_hint
from playbook._internal.owners import HOST, dead
from playbook._internal.redis_nodes import async_client, is_cluster, remember
from playbook._internal.redis_tls import TLS_HINT, plain_behind_tls
from playbook._internal.urls import masked
from playbook.errors import PlayDefinitionError, RunFatal, ToolError
from playbook.providers.limits import scripts
from playbook.providers.limits.allowance import Allowance
from playbook.providers.limits.base import Permit, Verdict, rate_news
from playbook.providers.limits.budgets import token_burst
from playbook.providers.limits.clock import RemoteClock
from playbook.providers.limits.gates import Window
from playbook.providers.limits.pace import Pace
from playbook.providers.limits.redis_link import Link, import_redis, split_options
from playbook.providers.limits.scripts import key_prefix, maybe_float, optional
from playbook.providers.limits.waiters import here
from playbook.providers.limits.weights import Rates, counted, parts, reserved, settled

__all__ = ["RedisLimiter"]

HORIZON = 0.5  # seconds ahead a rate slot may be reserved
POLL = 0.025  # seconds between asks while the account has no room (a local release asks at once)
# seconds late past which a slot is missed, however high the rate (a timer's own lateness is not)
MISSED = 0.01
_SCRIPTS = {
    "acquire": scripts.ACQUIRE,
    "held": scripts.HELD,
    "settle": scripts.SETTLE,
    "refused": scripts.REFUSED,
    "release": scripts.RELEASE,
    "hold": scripts.HOLD,
    "renew": scripts.RENEW,
    "tokens": scripts.TOKENS,
    "charge": scripts.CHARGE,
}
_ids = itertools.count(1)
_VERDICTS = {b"lone": Verdict.LONE, b"cut": Verdict.LOWERED, b"noted": Verdict.NOTED}


class RedisLimiter:
    """``RedisLimiter(url, account, provider=..., rate=..., burst=..., concurrency=...)``: the
    :class:`~playbook.providers.limits.base.Limiter` whose state lives at ``url``, under ``account``.

    ``url`` is a redis-py URL; ``?permit_ttl=S`` (taken out before it reaches redis-py) sets how
    long a dead process's permits keep their slots (default 30 s).
    """

    def __init__(
        self,
        url: str,
        account: str,
        *,
        provider: str,
        rate: float | None = None,
        burst: int | None = None,
        concurrency: int | None = None,
        tokens: float | Rates | None = None,
        window: tuple[int, float] | None = None,
    ) -> None:
        try:
            self._redis = import_redis()
        except ImportError as exc:
            raise PlayDefinitionError(
                f"Provider {provider!r}: shared={masked(url)!r} needs redis-py: {install_hint('redis')}"
            ) from exc
        self.url, self.provider = url, provider
        self._url, self.permit_ttl = split_options(url, provider)
        try:
            self._redis.connection.parse_url(self._url)
        except ValueError as exc:
            raise PlayDefinitionError(
                f"Provider {provider!r}: shared={masked(url)!r} is not a Redis URL ({exc})"
            ) from exc
        self.prefix = key_prefix(account)
        self._cluster: bool | None = None  # whether the URL is a Redis Cluster's, once asked
        self.ceiling, self.burst, self.floor = (
            rate,
            burst or 1,
            rate / 10 if rate is not None else Pace(None).floor,
        )
        self.window = Window(concurrency)  # discovers a bound from the account-wide levels 429s meet
        self.rate: float | None = rate  # the shared rate, as last read
        # tokens a second of each budget (configured or announced); none: calls are not weighed
        self.token_rates = tokens if isinstance(tokens, Rates) else Rates(tokens)
        # A configured window's calls and span (Allowance's arithmetic) for the scripts; [0, 0]: learnt.
        self.window_args: list[Any] = (
            [window[0], f"{Allowance(*window).span:.6f}"] if window is not None else [0, 0]
        )
        self.hold_until_t = 0.0  # loop clock
        self._room_at = 0.0  # loop clock: the account had no slot before this, as last answered
        self.in_flight = 0  # this process's calls on the wire
        self._shown = rate  # the rate last reported as changed
        self._clock = RemoteClock()  # Redis's clock against this loop's
        self._host = f"{HOST}:{os.getpid()}:{random.getrandbits(32):08x}"
        self._reaped = -math.inf  # loop clock: when permits of dead processes were last looked for
        self._sent: deque[float] = deque(maxlen=self.burst)  # loop clock: when this process's last calls went
        self._links: dict[asyncio.AbstractEventLoop, Link] = {}  # each loop's connection, while it has one
        self._lock = threading.Lock()  # threads share the window and the count of calls on the wire

    def __repr__(self) -> str:
        rate = "unlimited" if self.rate is None else f"{self.rate:.3g}/s"
        limit = self.in_flight_limit
        return (
            f"<RedisLimiter {masked(self.url)} {self.prefix}* rate={rate} in_flight_limit={limit} "
            f"on_wire={self.in_flight} permits={self._held()} hold_until_t={self.hold_until_t:.3f}>"
        )

    @property
    def in_flight_limit(self) -> int | None:
        return self.window.known_limit

    @property
    def token_rate(self) -> float | None:
        return self.token_rates.tokens

    def expected_wait(self, weight: float) -> float:
        # The account's queue is in Redis: only asking tells.  The last answer that said "not
        # before" (a window used up, a rate's queue) is what this process knows meanwhile.
        loop = here()
        return max(0.0, self._room_at - loop.time()) if loop is not None else 0.0

    def turn_away(self) -> None:
        """Its waiters ask Redis in turn: each finds its key retired when its slot comes, and gives
        the slot back."""

    def learn(self, requests: float | None, tokens: float | Rates | None) -> bool:
        changed = False
        if requests is not None and (self.ceiling is None or requests < self.ceiling):
            self.ceiling = requests  # the shared rate comes down to it at the next script
            self.floor = requests / 10
            changed = True
        rates = tokens if isinstance(tokens, Rates) else Rates(tokens)
        lower = Rates(
            *(
                new if new is not None and (old is None or new < old) else old
                for old, new in zip(self.token_rates, rates)
            )
        )
        if lower != self.token_rates:
            self.token_rates = lower
            changed = True
        return changed

    # -- the Limiter protocol ------------------------------------------------------------------

    async def acquire(self, weight: float = 1.0, patience: float = math.inf) -> Permit | None:
        while True:
            # each round on this loop's link as it is now: a missed slot given back may have closed it
            loop, link = self._link()
            key = f"{self._host}:{next(_ids)}"
            link.busy += 1
            try:
                async with link.turn:  # one asker per loop; the rest wait here, in order
                    granted = await self._reserve(key, weight, loop, link, patience)
            except BaseException:
                link.busy -= 1
                await self._idle(link)
                raise
            link.busy -= 1
            if granted is None:
                await self._idle(link)
                return None
            weighed = self.token_rates != Rates()  # as _reserve charged it, just now
            permit = await self._due(Permit(weight, granted[0], granted[1], key, weighed=weighed), loop, link)
            if permit is not False:
                return permit

    async def _due(
        self, permit: Permit, loop: asyncio.AbstractEventLoop, link: Link
    ) -> Permit | Literal[False] | None:
        """Wait for the permit's slot: the permit, None when a hold came first, or False when
        it would go in a bunch (see :meth:`_bunched`): the slots that came due while the loop
        stalled are the account's loss, and a fresh one is asked for, so calls reserved ahead do
        not all go together when the loop runs again (a strict provider refuses them)."""
        permit.offset = self._clock.offset
        try:
            if permit.sent_at > loop.time():
                await asyncio.sleep(permit.sent_at - loop.time())
                # A hold set meanwhile, here or by another process: this slot is not to be used.
                reply = await self._script(link, "held", ["hold"], [])
                self._learn(reply[0], reply[1], None, loop)
            if self.hold_until_t > loop.time():
                await self._give_back(permit, on_wire=False)
                return None
            if self._bunched(permit, loop.time()):
                await self._give_back(permit, on_wire=False)
                return False
        except BaseException:
            await self._give_back(permit, on_wire=False)
            raise
        permit.sent_at = loop.time()
        with self._lock:
            self.in_flight += 1
            self._sent.append(permit.sent_at)
        return permit

    def _bunched(self, permit: Permit, now: float) -> bool:
        """Woken over an interval late, when this process's last calls (as many as the burst)
        went within the last interval: the loop stalled, and the calls whose slots came due
        meanwhile would go together.  (A call late alone goes: its slot is worth a round trip.)"""
        interval, sent = 1.0 / self.rate if self.rate else math.inf, self._sent  # no rate: no slots to bunch
        return (
            now - permit.sent_at > max(interval, MISSED)
            and len(sent) == sent.maxlen
            and now - sent[0] < interval
        )

    async def settle(self, permit: Permit, actual: float | None = None, left: Rates | None = None) -> bool:
        # ``left`` is not read: the budgets shared on Redis pace evenly at the announced limits.
        if not self._landed(permit):
            return False
        charges, held = (
            (self._charged(permit.weight, actual), reserved(permit.weight)) if permit.weighed else ([], 0.0)
        )
        if actual is not None:
            permit.weight = counted(permit.weight, actual)  # as its provider counts it
        with self._lock:
            grew = self.window.success(permit.level, self._now(), permit.sent_at)
        await self._charge(charges, held)
        args = [permit.key, 0, optional(self.ceiling), f"{permit.sent_at + permit.offset:.6f}"]
        reply = await self._quietly(
            "settle", ["gcra", "permits", "aimd", "allow", "allowlog"], args, permit.key
        )
        if reply is not None:
            self.rate = maybe_float(reply[1])
        return self._changed() or grew

    async def refused(
        self, permit: Permit, *, hinted: bool, short: bool = False, coarse: bool = False
    ) -> Verdict:
        if not self._landed(permit):
            return Verdict.NOTED
        with self._lock:
            concurrency = bool(permit.level) and self.window.refused(permit.level, self._now(), hinted=hinted)
        await self._unreserve(permit)
        if concurrency:
            await self._quietly("release", ["permits"], [permit.key], permit.key)
            return Verdict.LOWERED
        sent_at = permit.sent_at + permit.offset
        # a token limit's refusal: not the request rate's
        judge = "0" if hinted and self.token_rates != Rates() else "1"
        hint = ("coarse" if coarse else "short") if short else "long" if hinted else "none"
        args = [
            permit.key,
            f"{sent_at:.6f}",
            judge,
            optional(self.ceiling),
            self.floor,
            hint,
            "0" if self.window_args[0] else "1",
        ]
        reply = await self._quietly("refused", ["permits", "aimd", "allow", "allowlog"], args, permit.key)
        if reply is None:
            return Verdict.NOTED
        self.rate = maybe_float(reply[1])
        verdict = _VERDICTS[reply[2]]
        if verdict is Verdict.LOWERED:
            self._shown = self.rate
        return verdict

    async def busy(self, permit: Permit) -> bool:
        if not self._landed(permit):
            return False
        with self._lock:
            # the account's calls out as it went, itself aside (what is out now is Redis's to know)
            bounded = bool(permit.level) and self.window.busy(permit.level, permit.level - 1, self._now())
        await self._quietly("release", ["permits"], [permit.key], permit.key)
        await asyncio.shield(self._unreserve(permit))
        return bounded

    async def release(self, permit: Permit) -> None:
        await self._give_back(permit, on_wire=True)

    async def hold(self, until: float) -> float:
        loop = asyncio.get_running_loop()
        # this process keeps to it even if Redis cannot hear it
        self.hold_until_t = max(self.hold_until_t, until)
        reply = await self._quietly("hold", ["hold", "aimd"], [max(0.0, until - loop.time())], None)
        if reply is not None:
            self._learn(reply[0], reply[1], None, loop)
        return self.hold_until_t

    # -- asking Redis --------------------------------------------------------------------------

    async def _tokens(self, weight: float, loop: asyncio.AbstractEventLoop, link: Link) -> float:
        """Reserve a call's tokens in each of the account's token budgets; returns when they are
        all due (loop clock)."""
        input, output = parts(weight)
        keys: list[str] = []
        args: list[Any] = [reserved(weight)]
        units = (input + output, input, output)
        for key, rate, n in zip(("tokens", "input", "output"), self.token_rates, units, strict=True):
            if rate is not None:
                keys.append(key)
                args += [n, rate, token_burst(rate), "0" if key == "input" else "1"]
        reply = await self._script(link, "tokens", [*keys, "held"], args)
        self._clock.read(float(reply[0]), loop.time())
        return self._clock.here(float(reply[0]) + float(reply[1]))

    def _charged(self, weight: float, actual: float | None) -> list[tuple[str, float, float]]:
        """``(budget, extra tokens, rate)`` of each token budget where a call charged ``weight``
        counts another amount once answered (``actual``; None: as charged)."""
        if actual is None:
            return []
        input, output = parts(weight)
        used_in, used_out = settled(weight, actual)
        extras = (used_in + used_out - input - output, used_in - input, used_out - output)
        return [
            (key, n, rate)
            for key, rate, n in zip(("tokens", "input", "output"), self.token_rates, extras, strict=True)
            if rate is not None and n
        ]

    async def _charge(self, charges: list[tuple[str, float, float]], unreserve: float) -> None:
        """Move the token budgets by ``charges`` (:meth:`_charged`) and end a reservation of
        ``unreserve`` output tokens; nothing to ask when neither is."""
        if charges or unreserve:
            keys = [key for key, _, _ in charges]
            args = [unreserve, *(x for _, n, rate in charges for x in (n, rate))]
            await self._quietly("charge", [*keys, "held"], args, None)

    async def _unreserve(self, permit: Permit) -> None:
        """A call that reserved output ended with no answer: its reservation is given back."""
        back = reserved(permit.weight) if permit.weighed else 0.0
        if back:
            rates = (("tokens", self.token_rates.tokens), ("output", self.token_rates.output))
            await self._charge([(key, -back, rate) for key, rate in rates if rate is not None], back)

    async def _reserve(
        self, key: str, weight: float, loop: asyncio.AbstractEventLoop, link: Link, patience: float
    ) -> tuple[int, float] | None:
        """Ask until the account has room and a rate slot within ``HORIZON``: ``(level, slot_t)``, the
        slot on this loop's clock (clock.py); None when a hold is in force or the slot is past
        ``patience`` (``expected_wait`` says when, to the governor: its row parks, or steps aside)."""
        try:
            while True:
                if self.hold_until_t > loop.time():
                    await self._forget(link, key)
                    return None
                link.freed.clear()
                limit = self.window.limit or 0
                args = [
                    key,
                    1,
                    limit,
                    self.permit_ttl,
                    optional(self.ceiling),
                    self.burst,
                    HORIZON,
                    *self.window_args,
                ]
                reply = await self._script(
                    link, "acquire", ["gcra", "hold", "permits", "aimd", "allow", "allowlog", "winlog"], args
                )
                status = reply[0]
                self._learn(reply[1], reply[2], reply[3], loop)
                if status == b"held":
                    self._drop(link, key)
                    return None
                if status == b"full":
                    await self._reap(loop, link)
                    await _poll(link.freed, POLL * (0.5 + random.random()))
                    continue
                link.keep(key)
                if status == b"wait":
                    self._room_at = loop.time() + float(reply[5])
                    if float(reply[5]) > patience:
                        await self._forget(link, key)
                        return None
                    await asyncio.sleep(float(reply[5]) - HORIZON / 2)
                    continue
                slot_t = self._clock.here(float(reply[1]) + float(reply[5]))
                if self.token_rates != Rates():  # the call's tokens too, in the account's token budgets
                    slot_t = max(slot_t, await self._tokens(weight, loop, link))
                return int(reply[4]), slot_t
        except BaseException:
            await self._forget(link, key)
            raise

    async def _reap(self, loop: asyncio.AbstractEventLoop, link: Link) -> None:
        """The account is full: give back at once the slots of processes on this machine that no
        longer run (killed mid-call), instead of waiting for their permits to expire.  At most
        once a second: it reads every permit."""
        if loop.time() < self._reaped + 1.0:
            return
        self._reaped = loop.time()
        name = self.prefix + "permits"
        with contextlib.suppress(
            ToolError,
            self._redis.exceptions.RedisError,
            self._redis.exceptions.RedisClusterException,
            OSError,
        ):
            # then they expire, as elsewhere
            client, _ = await self._connect(link)
            gone = [
                permit
                for permit in await client.zrange(name, 0, -1)
                if dead(permit.decode("utf-8", "replace"))
            ]
            if gone:
                await client.zrem(name, *gone)

    async def _connect(self, link: Link) -> tuple[Any, dict[str, Any]]:
        """This loop's client and its scripts.  Whether the URL is a cluster's is asked once, off
        the loop (a server that does not answer would stall it for the connect timeout)."""
        if self._cluster is None:
            try:
                self._cluster = await asyncio.to_thread(
                    is_cluster, self._url, socket_connect_timeout=5, socket_timeout=10
                )
            except (self._redis.exceptions.RedisError, OSError) as exc:
                raise self._unreachable(exc) from exc
        try:
            return link.connect()
        except ValueError as exc:  # a cluster URL naming a database other than 0
            raise self._unreachable(exc) from exc

    async def _script(self, link: Link, name: str, keys: list[str], args: list[Any]) -> Any:
        link.busy += 1
        try:
            client, scripts = await self._connect(link)
            # A script a node lacks (NOSCRIPT: a replica promoted by a failover, a restart, SCRIPT
            # FLUSH) is loaded again and run by redis-py's registered script, on every master.
            return await scripts[name](
                keys=[self.prefix + k for k in keys], args=[self.prefix, *args], client=client
            )
        except (
            self._redis.exceptions.RedisError,
            self._redis.exceptions.RedisClusterException,
            OSError,
        ) as exc:
            raise self._unreachable(exc) from exc
        finally:
            link.busy -= 1

    def _unreachable(self, exc: BaseException) -> ToolError | RunFatal:
        """What Redis could not answer, as a retryable error naming the provider and the URL (on a
        cluster: after its client retried through a failover, for about 20 s); a URL that cannot
        work however long the rows wait (a password, a database, TLS) stops the run instead."""
        why = f"{type(exc).__name__}: {exc}"
        wrong = self._misconfigured(exc)
        if wrong is not None:
            return RunFatal(
                f"Provider {self.provider!r}: shared={masked(self.url)!r} {wrong} ({why})",
                provider=self.provider,
            )
        said = f"at {masked(self.url)} are out of reach ({why})"
        if self._cluster:
            said = f"are out of reach: Redis Cluster at {masked(self.url)} lost a master, or is down ({why})"
        return ToolError(
            f"shared limits of provider {self.provider!r} {said}",
            provider=self.provider,
            retryable=True,
        )

    def _misconfigured(self, exc: BaseException) -> str | None:
        """What is wrong with the ``shared=`` URL itself, if that is why Redis did not answer."""
        text = str(exc)
        if isinstance(exc, self._redis.exceptions.AuthenticationError) or text.startswith(
            ("NOAUTH", "WRONGPASS")
        ):
            return "has no password, or a wrong one, for that Redis: put it in the URL (redis://:PASSWORD@host:port/0)"
        if isinstance(exc, ValueError) or "SELECT is not allowed in cluster mode" in text:
            return "names a database a Redis Cluster does not have: a cluster has one database, /0"
        if "DB index is out of range" in text:
            return "names a database that Redis does not have"
        if plain_behind_tls(self._url, exc):
            return f"did not complete a TLS handshake: {TLS_HINT}"
        return None

    async def _quietly(self, name: str, keys: list[str], args: list[Any], key: str | None) -> Any:
        """A script whose failure must not fail a call that was answered: its slot, if any,
        comes back by expiry instead."""
        _, link = self._link()
        try:
            return await self._script(link, name, keys, args)
        except ToolError:
            return None
        finally:
            if key is not None:
                self._drop(link, key)
            await self._idle(link)

    async def _give_back(self, permit: Permit, *, on_wire: bool) -> None:
        if permit.done:
            return
        if on_wire:
            self._landed(permit)
        permit.done = True
        # Shielded: a call cancelled on the wire still hands its slot to the next one now.
        await asyncio.shield(self._quietly("release", ["permits"], [permit.key], permit.key))
        await asyncio.shield(self._unreserve(permit))

    async def _forget(self, link: Link, key: str) -> None:
        if key in link.permits:
            await asyncio.shield(self._quietly("release", ["permits"], [key], key))

    def _landed(self, permit: Permit) -> bool:
        landed = permit.land()
        with self._lock:
            self.in_flight -= landed
        return landed

    def _learn(self, now: bytes, hold: bytes, rate: bytes | None, loop: asyncio.AbstractEventLoop) -> None:
        """Read Redis's clock, the hold and the rate from an answer."""
        offset = self._clock.read(float(now), loop.time())
        ends = maybe_float(hold)
        if ends is not None and ends - offset > self.hold_until_t:
            self.hold_until_t = ends - offset
        if rate is not None:
            self.rate = maybe_float(rate)

    def _changed(self) -> bool:
        if rate_news(self._shown, self.rate, self.ceiling):
            self._shown = self.rate
            return True
        return False

    # -- each loop's connection, the permits it renews --------------------------------------

    def _link(self) -> tuple[asyncio.AbstractEventLoop, Link]:
        loop = asyncio.get_running_loop()
        link = self._links.get(loop)
        if link is None:
            with self._lock:
                link = self._links.setdefault(loop, Link(loop, self._open, self._renew, self.permit_ttl / 3))
        return loop, link

    def _open(self) -> tuple[Any, dict[str, Any]]:
        client = async_client(self._url, socket_connect_timeout=5, socket_timeout=10)
        return client, {name: client.register_script(source) for name, source in _SCRIPTS.items()}

    def _held(self) -> int:
        return sum(len(link.permits) for link in list(self._links.values()))

    async def _idle(self, link: Link) -> None:
        """Nothing under way on this loop: close its connections, so none outlives the loop that
        opened them; the next call opens them again."""
        if not link.idle:
            return
        with self._lock:
            if self._links.get(link.loop) is link:
                del self._links[link.loop]
        if link.client is not None:
            remember(self._url, link.client)  # the next link starts from the nodes alive now
        await link.close()

    def _drop(self, link: Link, key: str) -> None:
        """``key``'s slot is given back (or never was taken): an asker on any loop may go now."""
        link.drop(key)
        for other in list(self._links.values()):
            if other is not link:
                with contextlib.suppress(RuntimeError):  # a closed loop asks for nothing any more
                    other.loop.call_soon_threadsafe(other.freed.set)

    async def _renew(self, link: Link, keys: list[str]) -> None:
        with contextlib.suppress(ToolError):
            await self._script(link, "renew", ["permits"], [self.permit_ttl, *keys])

    def _now(self) -> float:
        return asyncio.get_running_loop().time()


async def _poll(freed: asyncio.Event, seconds: float) -> None:
    """Wait up to ``seconds`` for a slot to be freed.  A cancellation that lands as the wait times
    out is still a cancellation: Python 3.11's ``wait_for`` may then raise TimeoutError instead,
    and a waiting ``acquire`` that took it for a timeout would poll on for good (under an outer
    ``wait_for``, holding its caller until another process frees a slot)."""
    try:
        await asyncio.wait_for(freed.wait(), seconds)
    except TimeoutError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError from None
