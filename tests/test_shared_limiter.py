"""Limiters as peers: the local one and the one shared through a real Redis keep the same
promises (rate, calls in flight, holds, cuts, weights); then what only sharing gives: one budget
for every process on the account, holds and cuts seen by all, slots of a killed process back
after their expiry, and a Redis out of reach treated like a provider that is down.

The local limiter reads only its loop's clock, so its half of each promise runs in virtual time
(tests/vtime.py): no waiting, and exact intervals.  The shared one reads Redis's clock, which
cannot be made virtual: its half runs in real time, with small rates, short waits, and bounds a
loaded machine's delays stay inside but a broken promise does not (a limiter never grants early,
so lower bounds hold under any load).  What needs another process or a real expiry is marked slow.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pandas as pd
import pytest
import redis
import warm
from vtime import run_virtual
from warm import Warm

import playbook as pb
from playbook._internal import redis_nodes
from playbook.demo.redis_server import RedisClusterServer, RedisServer
from playbook.providers.limits import Limiter, LocalLimiter, Permit, Rates, Tokens, Verdict
from playbook.providers.limits.shared import RedisLimiter
from playbook.providers.provider import governor

T = TypeVar("T")
LOADED = 1.5  # seconds a loaded machine may add to a shared limiter's few round trips


class Factory:
    """Builds a limiter of one kind with the same options, and runs a test's coroutine on the
    clock that kind keeps: the local limiter reads only the loop's clock, so it runs in virtual
    time (tests/vtime.py: its waits take no time, and its intervals are exact); the shared one
    reads Redis's clock, which cannot be made virtual, so it runs in real time."""

    def __init__(self, url: str | None) -> None:
        self.url = url

    def __call__(
        self,
        rate: float | None = None,
        burst: float | None = None,
        concurrency: int | None = None,
        account: str = "acme:default",
        tokens: float | Rates | None = None,
    ) -> Limiter:
        if self.url is None:
            return LocalLimiter(rate, burst, concurrency, tokens)
        return RedisLimiter(
            self.url, account, provider="acme", rate=rate, burst=burst, concurrency=concurrency, tokens=tokens
        )

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_virtual(coro) if self.url is None else asyncio.run(coro)

    def late(self, seconds: float) -> float:
        """The latest what takes ``seconds`` may end, on this kind's clock: virtual time is exact;
        in real time a loaded machine adds its stalls to a handful of Redis round trips (never
        subtracts: a limiter never grants early, so lower bounds stay as they are)."""
        return seconds if self.url is None else seconds + LOADED


@pytest.fixture(params=["local", "shared"])
def make(request: pytest.FixtureRequest) -> Factory:
    """A limiter of either kind with the same options (the shared one on a real Redis)."""
    return Factory(None if request.param == "local" else request.getfixturevalue("redis_url"))


@pytest.fixture(params=["local", "shared", "cluster"])
def every(request: pytest.FixtureRequest) -> Factory:
    """As ``make``, and shared on a Redis Cluster too: the promises whose scripts touch most of an
    account's keys, kept with every key in the account's slot."""
    where = {"local": None, "shared": "redis_url", "cluster": "cluster_url"}[request.param]
    return Factory(None if where is None else request.getfixturevalue(where))


def _now() -> float:
    """The running loop's clock: virtual for the local limiter, real for the shared one."""
    return asyncio.get_running_loop().time()


async def _go(limiter: Limiter, weight: float = 1.0) -> Permit:
    permit = await limiter.acquire(weight)
    assert permit is not None
    return permit


def test_permits_are_spaced_at_the_rate(every: Factory) -> None:
    """rate=20, burst=1: ten permits in a row take at least 9/20 s, and not much more."""

    async def main() -> float:
        limiter = every(rate=20.0)
        start = _now()
        for _ in range(10):
            await limiter.settle(await _go(limiter))
        return _now() - start

    elapsed = every.run(main())
    assert 0.43 <= elapsed < every.late(0.5)


def test_burst_lets_permits_through_at_once(make: Factory) -> None:
    """burst=5 at 2/s: five permits at once, the sixth half a second later."""

    async def main() -> list[float]:
        limiter = make(rate=2.0, burst=5)
        start, times = _now(), []
        for _ in range(6):
            await limiter.settle(await _go(limiter))
            times.append(_now() - start)
        return times

    times = make.run(main())
    # Counted from the first permit: a shared limiter's first call also connects to Redis and
    # loads its script, which on a loaded machine has taken a second and more.
    since_first = [t - times[0] for t in times]
    assert since_first[4] < make.late(0.1) and 0.35 <= since_first[5] < make.late(0.6)


def test_calls_whose_slots_came_due_while_the_loop_stalled_do_not_go_at_once(make: Factory) -> None:
    """rate=20, burst=1: eight calls wait for their slots (a shared limiter reserves them up to
    half a second ahead) when the loop stalls for 0.4 s (a blocking cell, a busy machine).  The
    slots that came due meanwhile are gone: after the stall the calls still go one interval
    apart, not together (which a strict provider answers with 429s)."""

    async def main() -> list[float]:
        limiter = make(rate=20.0)
        await limiter.settle(await _go(limiter))  # connected: the first call's set-up is no part of it
        sent: list[float] = []

        async def one() -> None:
            permit = await _go(limiter)
            sent.append(time.monotonic())
            await limiter.settle(permit)

        tasks = [asyncio.create_task(one()) for _ in range(8)]
        await asyncio.sleep(0.08)  # every call has asked for its slot; one or two have gone
        time.sleep(0.4)  # noqa: ASYNC251  # the stall itself
        await asyncio.gather(*tasks)
        return sent

    sent = asyncio.run(main())
    bunched = max(sum(1 for t in sent if start <= t < start + 0.025) for start in sent)
    assert bunched <= 2, [round(t - sent[0], 3) for t in sent]


def test_a_call_late_on_its_own_keeps_its_slot(redis_url: str) -> None:
    """rate=20: one call waits for its slot while the loop stalls 0.3 s, with no call of this
    process just before it.  It goes on the slot it had when the loop runs again: it neither
    gives the slot back nor asks Redis for another (a busy machine's late timers cost no slots),
    so the only script run meanwhile is the check for a hold."""
    server = redis.Redis.from_url(redis_url)

    def scripts_run() -> int:
        stats = server.info("commandstats")
        return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))

    async def main() -> int:
        limiter = RedisLimiter(redis_url, "acme:default", provider="acme", rate=20.0)
        await limiter.settle(await _go(limiter))  # connected, its scripts loaded
        waiting = asyncio.create_task(_go(limiter))
        await asyncio.sleep(
            0.02
        )  # its slot is reserved (0.05 s after the first call's): it sleeps until then
        before = scripts_run()
        time.sleep(0.3)  # noqa: ASYNC251  # the stall itself
        permit = await waiting
        run = scripts_run() - before
        await limiter.settle(permit)
        return run

    assert asyncio.run(main()) == 1


def test_concurrency_bounds_permits_out(every: Factory) -> None:
    """concurrency=3: a fourth permit waits until one of the three is given back."""

    async def main() -> tuple[bool, Permit]:
        limiter = every(concurrency=3)
        held = [await _go(limiter) for _ in range(3)]
        fourth = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0.3)
        waited = not fourth.done()
        await limiter.release(held[0])
        permit = await asyncio.wait_for(fourth, 5)
        assert permit is not None
        for p in (*held[1:], permit):
            await limiter.release(p)
        return waited, permit

    waited, permit = every.run(main())
    assert waited and permit.level == 3


def test_a_hold_stops_permits_until_it_ends(every: Factory) -> None:
    """hold(now + 0.4): acquire answers None (step aside) until then, a permit after.  The hold's
    end comes back on this loop's clock, off by at most the time the call took (the shared
    limiter reads Redis's clock in it); in real time the hold is longer than a loaded machine's
    stalls, so the call inside it is inside it."""
    span = every.late(0.4)

    async def main() -> tuple[Any, float, float, Any]:
        limiter = every(rate=50.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        until = await limiter.hold(start + span)
        took = loop.time() - start
        during = await limiter.acquire()
        await asyncio.sleep(max(0.0, limiter.hold_until_t - loop.time()) + 0.05)
        after = await limiter.acquire()
        assert after is not None
        await limiter.release(after)
        return during, until - start, took, after

    during, held, took, after = every.run(main())
    assert during is None and abs(held - span) <= took + 0.05 and isinstance(after, Permit)


def test_a_refusal_cuts_the_rate_once_per_episode(every: Factory) -> None:
    """A 429 for a call sent before any cut cuts the rate; another for a call sent before that
    cut says nothing new; one for a call sent after it cuts again."""

    async def main() -> list[float | None]:
        limiter = every(rate=20.0, burst=5)
        first, second = await _go(limiter), await _go(limiter)
        rates = [limiter.rate]
        assert await limiter.refused(first, hinted=True) is Verdict.LOWERED
        rates.append(limiter.rate)
        assert await limiter.refused(second, hinted=True) is Verdict.NOTED
        rates.append(limiter.rate)
        await asyncio.sleep(0.01)
        third = await _go(limiter)
        assert await limiter.refused(third, hinted=True) is Verdict.LOWERED
        rates.append(limiter.rate)
        return rates

    configured, cut, same, again = every.run(main())
    assert configured == pytest.approx(20.0)
    assert cut == pytest.approx(
        20.0 * 0.75, rel=0.01
    )  # refused right after sending began: a burst was measured
    assert same == cut and again is not None and again < cut


def test_a_refusal_while_sending_starts_up_cuts_from_the_rate(make: Factory) -> None:
    """Refused in the first second (sending still starting up: workers importing, connections
    opening, calls bunched): the cut starts from the rate, not from the little let in so far,
    which held a run at half the provider's limit."""

    async def main() -> tuple[Verdict, float | None]:
        limiter = make(rate=10.0, burst=2)
        for _ in range(2):
            await limiter.settle(await _go(limiter))
            await asyncio.sleep(0.2)
        verdict = await limiter.refused(await _go(limiter), hinted=False)  # 3 sent over 0.4 s: 7.5/s
        return verdict, limiter.rate

    verdict, rate = make.run(main())
    assert verdict is Verdict.LOWERED
    assert rate == pytest.approx(10.0 * 0.75, rel=0.01)  # DEEP of the rate (of the 5/s let in: 3.75)


def test_settling_a_heavier_call_delays_the_next(every: Factory) -> None:
    """At 10 tokens/s (5 at once), a call acquired as 10 tokens and settled as 15 pushes the next permit ~1.1 s later."""

    async def main() -> float:
        limiter = every(tokens=10.0)
        await limiter.settle(await _go(limiter, 10.0), actual=15.0)
        start = _now()
        await limiter.release(await _go(limiter, 1.0))
        return _now() - start

    assert 0.9 <= every.run(main()) < every.late(1.2)


def test_tokens_are_paced_evenly_with_at_most_a_second_at_once(make: Factory) -> None:
    """At 200 tokens/s, eight calls of 50 tokens: two go at once (half a second's worth), the rest 0.25 s apart."""

    async def main() -> float:
        limiter = make(tokens=200.0)
        start = _now()
        for _ in range(8):
            await limiter.settle(await _go(limiter, 50.0))
        return _now() - start

    assert 1.35 <= make.run(main()) < make.late(1.6)


def test_the_request_rate_counts_calls_whatever_their_tokens(make: Factory) -> None:
    """With a request rate and no token limit, a heavy call takes one request slot, not its weight."""

    async def main() -> float:
        limiter = make(rate=10.0)
        start = _now()
        for _ in range(3):
            await limiter.settle(await _go(limiter, 500.0))
        return _now() - start

    assert 0.15 <= make.run(main()) < make.late(0.3)


def test_announced_limits_lower_the_rate_and_add_a_token_limit(make: Factory) -> None:
    """learn(): a request limit lower than the configured rate, and a first token limit, are kept to; a higher one is not."""

    async def main() -> tuple[Any, ...]:
        limiter = make(rate=10.0)
        first = limiter.learn(5.0, 100.0)
        await limiter.settle(await _go(limiter, 1.0))
        higher = limiter.learn(50.0, 1000.0)
        start = _now()
        for _ in range(3):
            await limiter.settle(await _go(limiter, 1.0))
        return first, higher, limiter.token_rate, _now() - start

    first, higher, tokens, elapsed = make.run(main())
    assert first is True and higher is False and tokens == 100.0
    assert 0.5 <= elapsed < make.late(0.7)  # 5/s, not 10/s


def test_a_lone_short_refusal_among_many_calls_changes_nothing(make: Factory) -> None:
    """At a known rate, one or two 429s with a short hint among the calls sent lately are lone ones
    (the network's jitter): the rate stays.  A third that soon is a pattern: the rate is cut."""

    async def main() -> list[Any]:
        limiter = make(rate=100.0, burst=5)
        for _ in range(28):
            await limiter.settle(await _go(limiter))
        permits = [await _go(limiter) for _ in range(3)]
        seen: list[Any] = []
        for permit in permits:
            seen += [await limiter.refused(permit, hinted=True, short=True), limiter.rate]
        return seen

    lone, kept, second, still, third, cut = make.run(main())
    assert lone is second is Verdict.LONE and kept == still == pytest.approx(100.0, rel=0.01)
    assert third is Verdict.LOWERED and cut < 100.0


@pytest.mark.parametrize("coarse", [True, False], ids=["whole-seconds", "fine"])
def test_a_few_bunched_refusals_with_whole_second_hints_are_lone_among_a_span_of_calls(
    make: Factory, coarse: bool
) -> None:
    """At 25/s, three 429s together after 80 calls: with ``Retry-After: 1`` (whole seconds, 25
    intervals: the server's rounding) they are judged among the span's calls, jitter still, and
    the rate stays; with a fine hint the third is a pattern over the last two seconds, and cuts."""

    async def main() -> list[Any]:
        limiter = make(rate=25.0, burst=2)
        for _ in range(80):
            await limiter.settle(await _go(limiter))
        permits = [await _go(limiter) for _ in range(3)]
        return [await limiter.refused(p, hinted=True, short=True, coarse=coarse) for p in permits] + [
            limiter.rate
        ]

    *verdicts, rate = make.run(main())
    if coarse:
        assert verdicts == [Verdict.LONE] * 3 and rate == pytest.approx(25.0, rel=0.01)
    else:
        assert verdicts[:2] == [Verdict.LONE] * 2 and verdicts[2] is Verdict.LOWERED and rate < 25.0


def test_an_unhinted_refusal_above_the_levels_that_went_through_bounds_concurrency(make: Factory) -> None:
    """Calls at levels 1-2 went through and one at level 3 got a 429 without a hint: calls in
    flight, not the rate, were refused: the bound becomes 2 and the rate stays."""

    async def main() -> tuple[int | None, float | None, bool]:
        limiter = make(rate=50.0, burst=10, concurrency=10)
        permits = [await _go(limiter) for _ in range(3)]
        await limiter.settle(permits[0])
        await limiter.settle(permits[1])
        verdict = await limiter.refused(permits[2], hinted=False)
        return limiter.in_flight_limit, limiter.rate, verdict

    limit, rate, verdict = make.run(main())
    assert verdict is Verdict.LOWERED and limit == 2 and rate == pytest.approx(50.0, rel=0.01)


# -- what only sharing gives ---------------------------------------------------------------------


def _shared(url: str, account: str = "acme:default", **options: Any) -> RedisLimiter:
    return RedisLimiter(url, account, provider="acme", **options)


async def _calls(limiter: Limiter, n: int, weight: float, actual: float | None = None) -> float:
    """``n`` calls one after another, each charged ``weight`` and settled as ``actual``: the seconds they took."""
    start = _now()
    for _ in range(n):
        await limiter.settle(await _go(limiter, weight), actual)
    return _now() - start


@pytest.mark.parametrize(
    ("rates", "weight"),
    [
        (Rates(input=10_000.0, output=400.0), Tokens(300, 100)),
        (Rates(input=400.0, output=10_000.0), Tokens(100, 300)),
    ],
    ids=["output-binds", "input-binds"],
)
def test_input_and_output_tokens_are_paced_apart(make: Factory, rates: Rates, weight: Tokens) -> None:
    """At 400 tokens/s of one kind and 10,000/s of the other, twelve calls of 100 and 300 go at the
    binding budget's pace: two at once (half a second's worth), then 0.25 s apart: all of it
    (>= 0.9), never more; the other budget's tokens count only there."""
    elapsed = make.run(_calls(make(tokens=rates), 12, weight))
    assert 2.45 <= elapsed < make.late(2.75)


def test_max_tokens_reserved_at_dispatch_is_given_back_and_only_answers_are_paced(make: Factory) -> None:
    """At 2,000 output tokens/s, 16 calls at a time each reserving 400 (their max_tokens, as Anthropic
    charges them), expected to use 50 and answering 50 after 0.25 s: the 6,000 tokens answered take
    ~2.8 s, the budget used in full (>= 0.9) and never more (>= 2.5 s, half a second's worth at once),
    not the 24 s max_tokens charged for good would take, nor the ~4.4 s of calls each waiting for the
    one before to give its reservation back."""
    left = list(range(120))

    async def main() -> float:
        limiter = make(tokens=Rates(input=100_000.0, output=2_000.0))

        async def worker() -> None:
            while left:
                left.pop()
                permit = await _go(limiter, Tokens(10, 400, "reserved", usual=50))
                await asyncio.sleep(0.25)
                await limiter.settle(permit, Tokens(10, 50))

        start = _now()
        await asyncio.gather(*(worker() for _ in range(16)))
        return _now() - start

    assert 2.5 <= make.run(main()) < make.late(3.2)


def test_a_reservation_ends_when_its_call_is_refused_or_fails(every: Factory) -> None:
    """Calls reserving 1,600 output tokens (at 6,400/s) that are refused or fail give the reservation
    back: four answered calls after them take 0.25 s, as after none, not 0.75 s (kept charged)."""
    reserving = Tokens(0, 1_600, "reserved")

    async def main() -> float:
        limiter = every(tokens=Rates(output=6_400.0))
        await limiter.refused(await _go(limiter, reserving), hinted=True, short=True)
        await limiter.release(await _go(limiter, reserving))
        return await _calls(limiter, 4, reserving, Tokens(0, 1_600))

    assert 0.24 <= every.run(main()) < every.late(0.3)


def test_two_limiters_on_one_account_share_its_output_budget(redis_url: str) -> None:
    """Two limiters at 400 output tokens/s on one account: 16 calls of 100 between them take ~3.5 s
    (one budget), not ~1.75 s (a budget each)."""

    async def main() -> float:
        a, b = (_shared(redis_url, tokens=Rates(input=10_000.0, output=400.0)) for _ in range(2))
        start = time.monotonic()
        await asyncio.gather(_calls(a, 8, Tokens(300, 100)), _calls(b, 8, Tokens(300, 100)))
        return time.monotonic() - start

    assert 3.45 <= asyncio.run(main()) < 3.5 + LOADED


def test_two_limiters_on_one_account_share_one_rate(any_redis_url: str) -> None:
    """Two limiters (two clients) at 20/s on one account: 20 permits between them take ~1 s, not ~0.5 s."""

    async def main() -> float:
        a, b = _shared(any_redis_url, rate=20.0), _shared(any_redis_url, rate=20.0)
        start = time.monotonic()

        async def take(limiter: RedisLimiter) -> None:
            for _ in range(10):
                await limiter.settle(await _go(limiter))

        await asyncio.gather(take(a), take(b))
        return time.monotonic() - start

    assert 0.9 <= asyncio.run(main()) < 3.0


def test_other_accounts_do_not_share(redis_url: str) -> None:
    """A limiter on another account is not slowed by this one's permits or held by its hold."""

    async def main() -> tuple[float, Any]:
        a, b = _shared(redis_url, rate=5.0), _shared(redis_url, "acme:other", rate=5.0)
        await a.hold(asyncio.get_running_loop().time() + 5)
        start = time.monotonic()
        permit = await b.acquire()
        elapsed = time.monotonic() - start
        if permit is not None:
            await b.release(permit)
        return elapsed, permit

    elapsed, permit = asyncio.run(main())
    assert isinstance(permit, Permit) and elapsed < 0.5


def test_concurrency_is_bounded_across_limiters(any_redis_url: str) -> None:
    """concurrency=4 on two limiters: four permits out between them, the fifth waits for one back."""

    async def main() -> tuple[bool, int]:
        a, b = _shared(any_redis_url, concurrency=4), _shared(any_redis_url, concurrency=4)
        held = [await _go(a), await _go(b), await _go(a), await _go(b)]
        fifth = asyncio.ensure_future(b.acquire())
        await asyncio.sleep(0.3)
        waited = not fifth.done()
        await a.release(held[0])
        permit = await asyncio.wait_for(fifth, 5)
        assert permit is not None
        for p, limiter in zip((*held[1:], permit), (b, a, b, b)):
            await limiter.release(p)
        return waited, permit.level

    waited, level = asyncio.run(main())
    assert waited and level == 4


_OTHER = """
import asyncio, sys, time
from playbook.providers.limits.shared import RedisLimiter
url, action = sys.argv[1], sys.argv[2]
async def main():
    limiter = RedisLimiter(url, "acme:default", provider="acme", rate=20.0, concurrency=3)
    loop = asyncio.get_running_loop()
    if action == "hold":
        await limiter.hold(loop.time() + 10.0)
    elif action == "cut":
        permit = await limiter.acquire()
        await limiter.refused(permit, hinted=True)
    elif action == "hog":
        permits = [await limiter.acquire() for _ in range(3)]
        print("holding", flush=True)
        await asyncio.sleep(3600)
    print(limiter.rate, flush=True)
asyncio.run(main())
"""


@pytest.fixture
def other(redis_url: str) -> Iterator[Callable[..., Warm]]:
    """Another process on the same account doing one thing: hold, cut or hog every slot (started
    warm, tests/warm.py: a process of its own, with its own pid, without importing pandas anew)."""
    started: list[Warm] = []

    def start(action: str, ttl: float = 1.5) -> Warm:
        url = redis_url.replace("/0", f"/0?permit_ttl={ttl}")
        proc = warm.start(None, url, action, code=_OTHER)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(60)


def _done(proc: Warm) -> str:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    return out


def test_a_hold_set_by_another_process_is_seen_here(redis_url: str, other: Callable[..., Warm]) -> None:
    """Another process holds the account for 10 s: acquire here steps aside and learns until when
    (the hold outlasts a loaded machine's start of this process by far: nothing waits it out)."""
    _done(other("hold"))

    async def main() -> tuple[Any, float]:
        limiter = _shared(redis_url, rate=20.0)
        permit = await limiter.acquire()
        return permit, limiter.hold_until_t - asyncio.get_running_loop().time()

    permit, left = asyncio.run(main())
    assert permit is None and 1.0 < left <= 10.0


def test_a_cut_made_by_another_process_is_seen_here(redis_url: str, other: Callable[..., Warm]) -> None:
    """Another process's 429 cuts the shared rate: this process paces at the cut rate at its next permit."""
    cut = float(_done(other("cut")).split()[-1])

    async def main() -> float | None:
        limiter = _shared(redis_url, rate=20.0)
        await limiter.release(await _go(limiter))
        return limiter.rate

    assert cut < 20.0 and asyncio.run(main()) == pytest.approx(cut)


def test_slots_of_a_process_killed_on_this_machine_come_back_at_once(
    redis_url: str, other: Callable[..., Warm]
) -> None:
    """A process on this machine holding all 3 slots is killed with SIGKILL: its slots come back
    as soon as the account is found full (its pid is gone), not when their permits expire."""
    proc = other("hog", 30)
    assert proc.readline().strip() == "holding"
    proc.kill()
    proc.wait()

    async def main() -> float:
        limiter = _shared(redis_url.replace("/0", "/0?permit_ttl=30"), concurrency=3)
        started = time.monotonic()
        permit = await asyncio.wait_for(limiter.acquire(), 10)
        assert permit is not None
        await limiter.release(permit)
        return time.monotonic() - started

    assert asyncio.run(main()) < 3.0, "the dead process's slots waited for their 30 s expiry"


@pytest.mark.slow
def test_slots_held_on_another_machine_come_back_after_their_expiry(redis_url: str) -> None:
    """Slots held by a process on another host (which may be alive) are waited out: they come back
    when their permits expire, not before."""
    client = redis.Redis.from_url(redis_url)
    seconds, micros = client.time()
    expires = seconds + micros / 1e6 + 1.5
    client.zadd(
        "playbook:limit:{acme:default}:permits", {f"otherhost:{n}:abcd:1": expires for n in (101, 102, 103)}
    )

    async def main() -> tuple[bool, float]:
        limiter = _shared(redis_url, concurrency=3)
        started = time.monotonic()
        early = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0.5)
        blocked = not early.done()
        permit = await asyncio.wait_for(early, 10)
        assert permit is not None
        await limiter.release(permit)
        return blocked, time.monotonic() - started

    blocked, after = asyncio.run(main())
    assert blocked, "slots held on another machine were taken at once"
    assert 1.2 <= after < 8.0


@pytest.mark.slow
def test_permits_in_flight_are_renewed_past_their_expiry(redis_url: str) -> None:
    """A call in flight longer than permit_ttl keeps its slot: renewed, it is not evicted.  The
    permit is renewed every third of its 2 s, so only a loop stalled over 1.3 s could lose it."""

    async def main() -> bool:
        url = redis_url.replace("/0", "/0?permit_ttl=2")
        a, b = _shared(url, concurrency=1), _shared(url, concurrency=1)
        permit = await _go(a)
        try:
            await asyncio.wait_for(b.acquire(), 4.5)
        except TimeoutError:
            return True
        finally:
            await a.release(permit)
        return False

    assert asyncio.run(main())


# -- Redis out of reach, or not a Redis --------------------------------------------------------


def test_an_unreachable_redis_parks_or_fails_rows_naming_the_provider_and_url(store: pb.ReceiptStore) -> None:
    """shared= at a closed port: the provider is down, so once its probes pass the rows' wait
    budget the run returns, every row failed or parked, and the message names the provider and the URL."""
    provider = pb.Provider("acme", rps=50, shared="redis://127.0.0.1:1/0", max_wait=0.5)
    calls: list[int] = []

    @pb.tool(provider=provider)
    async def lookup(n: int) -> int:
        calls.append(n)
        return n

    out = pd.DataFrame({"n": range(20)}).play.map(lookup, store=store, progress=False, concurrency=8)
    assert calls == []
    assert set(out["play_status"]) <= {"failed", "parked"} and len(out) == 20
    errors = " ".join(str(e) for e in out["play_error"])
    assert "'acme'" in errors and "redis://127.0.0.1:1/0" in errors


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    """A Redis that asks for a password ("s3cret")."""
    with RedisServer() as server:
        redis.Redis.from_url(server.url).config_set("requirepass", "s3cret")  # once it answers PING
        yield server


@pytest.mark.parametrize("wrong", ["cluster db 3", "no password", "wrong password", "rediss to plain"])
def test_a_misconfigured_shared_url_stops_the_run_naming_the_option(
    wrong: str, store: pb.ReceiptStore, locked_redis: RedisServer, request: pytest.FixtureRequest
) -> None:
    """shared= naming a cluster's db 3, a wrong or missing password, or rediss:// to a server without
    TLS stops the run at its first call with an error naming the provider and shared=, paying nothing:
    not an outage the rows wait out."""
    port = locked_redis.port
    url = {
        "cluster db 3": lambda: request.getfixturevalue("cluster_url").rsplit("/", 1)[0] + "/3",
        "no password": lambda: f"redis://127.0.0.1:{port}/0",
        "wrong password": lambda: f"redis://:nope@127.0.0.1:{port}/0",
        "rediss to plain": lambda: request.getfixturevalue("redis_url").replace("redis://", "rediss://"),
    }[wrong]()
    said = {
        "cluster db 3": "database",
        "no password": "password",
        "wrong password": "password",
        "rediss to plain": "does the server speak TLS",
    }[wrong]
    provider = pb.Provider("acme", rps=50, shared=url, max_wait=3)
    calls: list[int] = []

    @pb.tool(provider=provider)
    async def lookup(n: int) -> int:
        calls.append(n)
        return n

    started = time.monotonic()
    with pytest.raises(pb.RunFatal, match=f"(?s)'acme'.*shared=.*{said}"):
        pd.DataFrame({"n": range(20)}).play.map(lookup, store=store, progress=False, concurrency=8)
    assert calls == []
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    "url", ["http://localhost:6379", "redis//x", "redis://h/0?permit_ttl=0", "redis://h/0?permit_ttl=x"]
)
def test_a_bad_shared_url_is_rejected_when_the_provider_is_made(url: str) -> None:
    """A URL that is not a Redis URL (or a bad permit_ttl) is a PlayDefinitionError naming the provider."""
    with pytest.raises(pb.PlayDefinitionError, match="'acme'"):
        pb.Provider("acme", shared=url)


def test_shared_without_redis_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without redis-py, shared= fails at once with the line that installs the redis extra."""
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    with pytest.raises(pb.PlayDefinitionError, match=r'pip install "playbook-df\[redis\]"'):
        pb.Provider("acme", shared="redis://localhost:6379/0")


def test_repr_shows_the_shared_url_without_its_password() -> None:
    """repr names where the limits are shared, with the password masked."""
    provider = pb.Provider("acme", rps=10, shared="redis://:s3cret@localhost:6379/0")
    shown = repr(provider)
    assert "shared=redis://:***@localhost:6379/0" in shown and "s3cret" not in shown
    assert "s3cret" not in repr(governor(provider).limiter)


def test_a_hinted_refusal_under_a_token_limit_leaves_the_request_rate_alone(make: Factory) -> None:
    """With a token limit, a 429 that says when to come back is the tokens' (its hold waits): no request rate is set or cut."""

    async def main() -> tuple[Verdict, float | None]:
        limiter = make(tokens=1000.0)
        cut = await limiter.refused(await _go(limiter, 10.0), hinted=True)
        return cut, limiter.rate

    assert make.run(main()) == (Verdict.NOTED, None)


@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
def test_a_window_used_up_past_max_wait_parks_the_rows_that_would_wait(
    shared: bool, request: pytest.FixtureRequest, store
) -> None:  # type: ignore[no-untyped-def]
    """window=(2, 3600): two calls go, the others' turn is an hour away, past max_wait: their rows
    park at once ("paces calls"), none sleeps through the hour, locally or with the limits shared."""
    url = request.getfixturevalue("redis_url") if shared else None
    provider = pb.Provider("hourly", window=(2, 3600), max_wait=5, shared=url)

    @pb.tool(provider=provider, name="hourly.lookup", version="1")
    async def lookup(n: int) -> int:
        return n

    started = time.monotonic()
    out = pd.DataFrame({"n": range(4)}).play.map(lookup, store=store, progress=False, concurrency=4)
    assert out["play_status"].value_counts().to_dict() == {"ok": 2, "parked": 2}
    assert time.monotonic() - started < 5
    assert out.loc[out["play_status"] == "parked", "play_error"].str.contains("paces calls").all()


# -- Redis's clock, read from a busy loop --------------------------------------------------------------


def test_a_remote_clock_keeps_the_answer_with_the_least_delay() -> None:
    """Answers read late (a busy loop) say the clocks differ by less than they do: the clock keeps
    the largest difference seen, so a slot is not made late by its own answer's delay."""
    from playbook.providers.limits.clock import RemoteClock

    clock, true = RemoteClock(), 1000.0  # Redis's time is the loop's plus 1000 s
    for here, delay in ((1.0, 0.004), (1.1, 0.0002), (1.2, 0.03), (1.3, 0.012)):
        clock.read(here - delay + true, here)  # Redis read its time `delay` before this loop read the answer
    assert clock.offset == pytest.approx(true - 0.0002)
    assert clock.here(true + 5.0) == pytest.approx(5.0002)  # a slot at 5 s on this loop's clock, not 5.03


def test_a_remote_clock_follows_a_clock_that_steps_after_its_span() -> None:
    """Samples older than the span are forgotten: a clock stepped back (NTP) is followed within it."""
    from playbook.providers.limits.clock import RemoteClock

    clock = RemoteClock()
    clock.read(1000.0, 0.0)
    clock.read(990.5, 1.0)  # stepped back by ~10 s: within the span, the old best stands
    assert clock.offset == pytest.approx(1000.0)
    clock.read(990.0 + RemoteClock.SPAN + 1, RemoteClock.SPAN + 1)
    assert clock.offset == pytest.approx(990.0)


# -- on a Redis Cluster: one slot per account, scripts lost, a master killed -----------------------


@pytest.mark.parametrize("account", ["}acme{", "}", "acme}{x", "{acme}:default", ""])
def test_an_account_with_braces_keeps_all_its_keys_in_one_slot_of_a_cluster(
    cluster_url: str, account: str
) -> None:
    """An account whose name has braces (even one starting with ``}``, which would leave its hash tag
    empty) runs every script on a Redis Cluster: rate, calls in flight, cut, hold, tokens; all the
    keys it wrote are in one slot."""

    async def main() -> Verdict:
        limiter = _shared(cluster_url, account, rate=50.0, concurrency=2, tokens=Rates(output=10_000.0))
        await limiter.settle(await _go(limiter, Tokens(10, 100)), Tokens(10, 50))
        await limiter.release(await _go(limiter, Tokens(10, 100)))
        verdict = await limiter.refused(await _go(limiter, Tokens(10, 100)), hinted=False)
        await limiter.hold(asyncio.get_running_loop().time() + 0.05)
        return verdict

    assert asyncio.run(main()) is Verdict.LOWERED
    client = redis.RedisCluster.from_url(cluster_url)
    keys = list(client.scan_iter("playbook:limit:*"))
    assert len(keys) >= 5 and len({client.keyslot(key) for key in keys}) == 1, keys


def test_an_ordinary_account_keeps_the_keys_older_processes_use(cluster_url: str) -> None:
    """An account without braces keeps ``playbook:limit:{<account>}:``: a process of an older
    playbook on the same account shares its limits."""
    assert _shared(cluster_url, "acme:default").prefix == "playbook:limit:{acme:default}:"


def test_scripts_a_cluster_lost_are_loaded_again(cluster_url: str) -> None:
    """Every node's scripts flushed between calls (as a replica promoted by a failover has none):
    the next permit is still granted, at the rate."""

    async def main() -> float:
        limiter = _shared(cluster_url, rate=20.0)
        await limiter.settle(await _go(limiter))
        redis.RedisCluster.from_url(cluster_url).script_flush()
        return await _calls(limiter, 4, 1.0)

    assert 0.15 <= asyncio.run(main()) < 0.2 + LOADED


@pytest.mark.slow
def test_a_run_keeps_its_pace_through_the_failover_of_the_master_holding_its_account(
    store: pb.ReceiptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rps=10 shared on a Redis Cluster (named by the very master that holds the account's slot):
    that master is killed mid-run.  Calls wait for its replica to take over, then go on at the
    rate: every row ends ok, no second of the run let in more than the rate and its burst, and
    the next run in the process (its URL still naming the dead node) shares its limits too.  With
    the promoted replica killed as well, the account's slot has no node: as with a Redis that does
    not answer, the row fails or parks, its error naming the cluster that lost a master."""
    with RedisClusterServer() as cluster:
        owner = redis.RedisCluster.from_url(cluster.url).get_node_from_key(
            "playbook:limit:{acme:default}:gcra"
        )
        node = next(node for node in cluster.nodes if node.port == owner.port)
        provider = pb.Provider(
            "acme", rps=10, burst=1, concurrency=4, shared=f"redis://127.0.0.1:{node.port}/0"
        )
        sent: list[float] = []

        @pb.tool(provider=provider)
        async def lookup(n: int) -> int:
            sent.append(time.monotonic())
            if len(sent) == 10:
                cluster.kill(node)
            await asyncio.sleep(0.05)
            return n

        out = pd.DataFrame({"n": range(30)}).play.map(lookup, store=store, progress=False, concurrency=8)
        # the next run in this process: its URL names the dead node, its client starts from the others
        again = pd.DataFrame({"n": range(30, 35)}).play.map(lookup, store=store, progress=False)
        promoted = redis.RedisCluster.from_url(cluster.url).get_node_from_key(
            "playbook:limit:{acme:default}:gcra"
        )
        cluster.kill(next(node for node in cluster.nodes if node.port == promoted.port))
        # the cluster stays down: its client need not retry for 20 s to say so
        monkeypatch.setattr(redis_nodes, "FAILOVER_SECONDS", 1.0)
        down = pb.Provider("acme", rps=10, max_wait=0.5, shared=f"redis://127.0.0.1:{node.port}/0")

        @pb.tool(provider=down)
        async def other(n: int) -> int:
            return n

        lost = pd.DataFrame({"n": [99]}).play.map(other, store=store, progress=False)
    assert out["play_status"].value_counts().to_dict() == {"ok": 30}
    assert again["play_status"].value_counts().to_dict() == {"ok": 5}, again["play_error"].tolist()
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert max(gaps) >= 2.0, "no call waited for the failover"  # the replica took over in seconds
    busiest = max(sum(1 for t in sent if start <= t < start + 1.0) for start in sent)
    print(f"failover: the calls waited {max(gaps):.1f}s; the busiest second let in {busiest}")
    assert busiest <= 10 + 1, busiest
    assert lost["play_status"][0] in ("failed", "parked"), lost["play_error"].tolist()
    assert f"Redis Cluster at redis://127.0.0.1:{node.port}/0 lost a master" in lost["play_error"][0]
