"""The governor against real providers' shapes, in virtual time: token buckets, fixed windows,
in-flight limits, flaky 5xx, configured rates above the real limit, nothing listening.

Each test runs 300 rows (one call each, 32 worker slots) through a :class:`Provider` and holds
the figure the governor must reach on that shape: goodput against the shape's limit, and the
share of requests refused.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from shapes import (
    Closed,
    FailingInputs,
    FixedWindow,
    Flaky,
    InFlightLimit,
    Jittered,
    Overloaded,
    Queued,
    RandomFailures,
    Shape,
    TokenBucket,
    drive,
)
from vtime import run_virtual

import playbook as pb
from playbook._internal.flow import WaitBudget
from playbook.events import ProviderDown, ProviderHoldSet, ProviderUp, RateChanged
from playbook.providers.limits import Backoff, Health, Standing, Window
from playbook.providers.provider import Provider, Ticket, governor


def _run(provider: Provider, shape: Shape, rows: int = 300, **options: object):
    governor(provider).backoff = Backoff(rng=random.Random(0))
    return run_virtual(drive(provider, shape, rows, **options))  # type: ignore[arg-type]


def _share(shape: Shape) -> float:
    return shape.refused / shape.requests


@pytest.mark.parametrize(
    "shape", [TokenBucket(rps=20, burst=5), FixedWindow(limit=20)], ids=["bucket", "window"]
)
def test_configured_rate_reaches_the_limit_without_429s(shape: Shape) -> None:
    """rps=20 against a 20/s token bucket or fixed window: >= 0.95 of the limit, no 429."""
    out = _run(Provider("p", rps=20), shape)
    assert out.ok == 300 and out.goodput() >= 0.95 * 20
    assert shape.refused == 0


def test_a_few_bunched_refusals_with_whole_second_hints_neither_cut_nor_hold_the_rate() -> None:
    """rps=20 on a strict bucket (burst 2) whose 429s say ``Retry-After: 1``: three refusals of
    calls the network bunched, within half a second, are jitter: each refused call waits its
    second alone, the rate stays and nothing is held: >= 0.95 of the limit (it fell to 0.86)."""
    shape = Jittered(rps=20, burst=2, latency=0.15, bunched=(150, 152, 160))
    provider = Provider("p", rps=20)
    events: list = []
    governor(provider).subscribe(events.append)
    out = _run(provider, shape, rows=400)
    assert out.ok == 400 and shape.refused == 3
    assert out.goodput() >= 0.95 * 20, out.goodput()
    assert not [e for e in events if isinstance(e, (RateChanged, ProviderHoldSet))]
    assert provider.status().rate == pytest.approx(20 * 0.98)


def test_a_burst_of_overload_529s_holds_every_call_and_fails_no_row() -> None:
    """rps=20 with every request answered 529 (overloaded_error, no hint) for 4 s: an overload is
    the provider's, so every call waits with a growing backoff and no try is used up: no row
    fails or parks, the provider never goes down, and the run loses little more than the burst."""
    shape = Overloaded(rps=20, burst=2, start=2.0, end=6.0)
    provider = Provider("p", rps=20)
    events: list = []
    governor(provider).subscribe(events.append)
    out = _run(provider, shape, rows=400)
    assert (out.ok, out.failed, out.parked) == (400, 0, {}), out.errors[:3]
    assert not [e for e in events if isinstance(e, ProviderDown)]
    assert any(isinstance(e, ProviderHoldSet) and e.status == 529 for e in events)
    assert shape.failed <= 60  # the calls in flight as it began, then one probe per backoff
    assert out.seconds <= 400 / 20 / 0.9 + 4.0  # >= 0.9 of the limit outside the burst


@pytest.mark.parametrize(
    "down", [False, "refused", "503"], ids=["queue-full", "nothing-listening", "every-call-503"]
)
def test_a_local_servers_503s_past_its_queue_bound_calls_in_flight(down: bool | str) -> None:
    """A local server with 4 decode slots and a queue of 4 answers 503 without a hint past them,
    concurrency=64 configured: while it answers other calls, its 503s bound calls in flight as
    unhinted 429s do: <= 1.4 x its capacity in time, <= 10% 503s, no row fails.  A server
    failing every call is down as before (its rows park)."""
    shape = (
        Queued(slots=4, queue=4, latency=0.5)
        if not down
        else Closed()
        if down == "refused"
        else RandomFailures(share=1.0)
    )
    provider = Provider("p", concurrency=64)
    out = _run(provider, shape, rows=200, concurrency=64, max_wait=5.0)
    if down:
        assert provider.status().down and out.parked.get("down") == 200
        return
    capacity = 200 * 0.5 / 4  # 25 s: four slots busy all the time
    assert (out.ok, out.failed, out.parked) == (200, 0, {}), out.errors[:3]
    assert out.seconds <= 1.4 * capacity, out.seconds
    assert shape.failed / shape.requests <= 0.10, (shape.failed, shape.requests)
    assert provider.status().in_flight_limit is not None and provider.status().in_flight_limit <= 10


def test_a_configured_window_sends_each_allowance_at_once_and_is_never_refused() -> None:
    """window=(50, 5) against 50 calls per aligned 5 s window: each window's allowance goes at
    once (no pacing between), none is refused, >= 0.95 of the allowed 10/s."""
    shape = FixedWindow(limit=50, period=5.0)
    out = _run(Provider("p", window=(50, 5)), shape, rows=400)
    assert out.ok == 400 and shape.refused == 0
    ideal = (400 - 50) / 10  # the first allowance at once, then 50 every 5 s
    assert ideal / out.seconds >= 0.95


def test_an_unknown_window_is_learnt_from_its_refusals() -> None:
    """No limits given, 50 calls per 5 s window: the first window's end refuses every call in
    flight; from then on the allowance read from it goes at once and the window's end costs one
    refusal: <= 5% 429s over the run, at <= 1.2 x the ideal time."""
    shape = FixedWindow(limit=50, period=5.0, latency=0.05)
    provider = Provider("p")
    out = _run(provider, shape, rows=500, concurrency=16)
    assert out.ok == 500
    assert _share(shape) <= 0.05, (shape.refused, shape.requests)
    assert out.seconds <= 1.2 * (500 - 50) / 10
    assert governor(provider).limiter.allowance.limit == 50


@pytest.mark.parametrize(
    ("period", "phase"),
    [(5.0, 0.3), (5.0, 2.5), (10.0, 1.7), (10.0, 6.0)],
    ids=["5s-early", "5s-midway", "10s-early", "10s-late"],
)
def test_a_learnt_windows_end_holds_until_its_reset_and_cuts_no_rate(period: float, phase: float) -> None:
    """50 calls per window of 5 or 10 s (Azure's), not configured, the run starting anywhere in
    one, refusals saying Retry-After in whole seconds: once the allowance is read, a refusal
    past it is the window's end even when it says "1", so it holds until the reset and cuts
    no rate: the rate stays well above the window's average (it sank to it, pacing each
    allowance out over its window, and the allowance read as 102), <= 5% 429s, <= 1.2 x ideal."""
    shape = FixedWindow(limit=50, period=period, phase=phase, latency=0.05)
    provider = Provider("p")
    out = _run(provider, shape, rows=500, concurrency=16)
    assert out.ok == 500
    assert governor(provider).limiter.allowance.limit == 50
    assert _share(shape) <= 0.05, (shape.refused, shape.requests)
    assert out.seconds <= 1.2 * (500 - 50) / (50 / period)
    rate = provider.status().rate
    assert rate is None or rate >= 4 * 50 / period, rate


@pytest.mark.parametrize(
    "shape",
    [TokenBucket(rps=20, burst=5), TokenBucket(rps=20, burst=5, hints=False), FixedWindow(limit=20)],
    ids=["bucket", "bucket-no-hint", "window"],
)
def test_discovered_rate_converges(shape: Shape) -> None:
    """No rps: the rate is found from the 429s (each Retry-After: 1 costs a second of silence; 300
    rows last 15 s at best), at >= 0.75 of the limit over the run, with few refusals (<= 5%)."""
    provider = Provider("p")
    out = _run(provider, shape)
    assert out.ok == 300 and out.goodput() >= 0.75 * 20
    assert _share(shape) <= 0.05
    assert 15 <= provider.status().rate <= 22


def test_discovered_rate_with_slow_answers_does_not_crawl() -> None:
    """Answers taking 2 s (an LLM) behind a 20/s bucket: what got in is counted by when it was
    sent, so slow answers do not pass for a slow provider: >= 0.6 of the limit (it crawled at 0.25)."""
    shape = TokenBucket(rps=20, burst=5, latency=2.0)
    provider = Provider("p")
    out = _run(provider, shape, concurrency=64)
    assert out.ok == 300 and out.goodput() >= 0.6 * 20
    assert _share(shape) <= 0.05


def test_configured_rate_above_the_real_limit_converges() -> None:
    """rps=20 when the account allows 10: >= 0.85 of 10/s, 429s <= 2%, and the rate settles near 10."""
    shape = TokenBucket(rps=10, burst=5)
    provider = Provider("p", rps=20)
    out = _run(provider, shape)
    assert out.ok == 300 and out.goodput() >= 0.85 * 10
    assert _share(shape) <= 0.02
    assert 8 <= provider.status().rate <= 11


def test_in_flight_limit_is_discovered() -> None:
    """429s (no hint) past 4 calls in flight: the window settles at 4, >= 0.9 of the 40/s it
    allows, 429s <= 10%, the rate left alone; the window is reported."""
    shape = InFlightLimit(limit=4, latency=0.1)
    provider = Provider("p")
    events: list = []
    governor(provider).subscribe(events.append)
    out = _run(provider, shape)
    assert out.ok == 300 and out.goodput() >= 0.9 * 40
    assert _share(shape) <= 0.10 and shape.most_in_flight <= Window.INITIAL  # the opening, never the run's 32
    assert provider.status().in_flight_limit in (4, 5) and provider.status().rate is None
    assert f"in_flight_limit={provider.status().in_flight_limit}" in repr(provider)
    assert any(isinstance(e, RateChanged) and e.concurrency == 4 for e in events)


def test_flaky_5xx_slow_nobody_else() -> None:
    """A 503 with Retry-After: 1 on every 7th request: rows retry after the hint while the others
    go on; >= 0.7 of the clean run's throughput, no hold, no rate cut, nothing fails."""
    clean = _run(Provider("p-clean", rps=50), Flaky(every=0))  # its own governor: each run has its own clock
    shape = Flaky(every=7)
    provider = Provider("p", rps=50)
    events: list = []
    governor(provider).subscribe(events.append)
    out = _run(provider, shape)
    assert out.ok == 300 and shape.failed >= 40
    assert out.goodput() >= 0.7 * clean.goodput()
    assert provider.status().rate == pytest.approx(50 * 0.98) and not provider.status().down
    assert not [e for e in events if not isinstance(e, RateChanged)]


@pytest.mark.parametrize("concurrency", [32, 4])
def test_one_input_that_always_fails_costs_its_row_its_retries_not_the_provider(concurrency: int) -> None:
    """Every 10th row's request always gets a 503 while the others are answered: that row fails
    after its retries, naming its tool and saying the request fails on its own; the provider is
    never held nor down, and no other row fails or parks."""
    provider = Provider("p", rps=40)
    events: list = []
    governor(provider).subscribe(events.append)
    shape = FailingInputs(every=10)
    out = _run(provider, shape, concurrency=concurrency)
    assert (out.ok, out.failed, out.parked) == (270, 30, {})
    assert shape.failed == 30 * (1 + provider.retries)  # each failing row spent its retries, no more
    # The last row's tries find nothing answered after them (every other row is done): with no
    # word on the others, they are the provider's, so it gave up as before; the rest fail on their own.
    own = [
        e
        for e in out.errors
        if "this request fails on its own (provider 'p' answers other calls): HTTP 503" in e
    ]
    assert len(own) >= 28 and all(
        e.startswith("tool 'tool") and e.endswith("(gave up after 5 tries)") for e in own
    )
    assert not [e for e in events if isinstance(e, (ProviderDown, ProviderHoldSet))]
    assert not provider.status().down and not provider.status().held


def test_every_request_failing_still_takes_the_provider_down_with_few_requests() -> None:
    """Every request gets a 503 and only three rows run: with nothing answered between a call's
    tries, each retry counts, so the provider goes down and the rows park ("down") as before,
    rather than each failing alone after its retries."""
    provider = Provider("p", rps=40)
    out = _run(provider, RandomFailures(share=1.0), rows=3, max_wait=20.0)
    assert provider.status().down
    assert (out.ok, out.failed, out.parked) == (0, 0, {"down": 3})


def test_failures_dominating_across_distinct_requests_still_hold_the_provider() -> None:
    """70% of requests fail at random (an overloaded provider): most distinct requests fail, so
    failures dominate and the provider holds every call (each retry spares it), as before."""
    provider = Provider("p", rps=40)
    events: list = []
    governor(provider).subscribe(events.append)
    _run(provider, RandomFailures(share=0.7), rows=100)
    assert len([e for e in events if isinstance(e, ProviderHoldSet)]) >= 5


def test_health_judges_distinct_calls() -> None:
    """A call's retries count while nothing sent since it failed is answered; once a call sent
    after it is answered, it fails on its own: its failures count no more."""
    health = Health()
    alone = Standing()
    for t in range(6):
        assert health.failure(float(t), alone) is False
    assert health.failures == 6 and not alone.own  # nothing answered between: each try counts
    health, mine = Health(), Standing()
    health.failure(10.0, mine)
    health.success(sent_at=9.0)  # sent before it failed: no word on now
    health.failure(11.0, mine)
    assert health.failures == 1 and not mine.own  # counted
    health.success(sent_at=11.5)  # another call, sent after it failed, answered
    for t in range(12, 40):  # counted, these would take it down
        assert health.failure(float(t), mine) is False
    assert mine.own and health.failures == 0 and not health.dominated() and not health.down


def test_health_remembers_requests_that_failed_on_their_own_until_one_goes_through() -> None:
    """A request that failed on its own is remembered: a later call of it (a retry() of its row)
    fails on its own from its first failure, with nothing answered between, and never takes the
    provider down; once it goes through it is forgotten.  Requests never seen failing on their
    own, failing alone, still take it down; the memory keeps the last KNOWN requests."""
    health = Health()
    first = Standing("req-a")
    health.failure(0.0, first)
    health.success(sent_at=0.5, through=True)
    health.failure(1.0, first)
    assert first.own
    for t in range(10, 20):  # only it, again and again: no call answered between
        later = Standing("req-a")
        assert health.failure(float(t), later) is False and later.own and later.behind
    assert health.failures == 0 and not health.down
    health.success(sent_at=30.0, standing=Standing("req-a"), through=True)  # it went through at last
    fresh = Standing("req-a")
    health.failure(31.0, fresh)
    assert not fresh.own and health.failures == 1  # forgotten: its first failure counts again
    outage = Health()
    assert any(
        outage.failure(float(t), Standing(f"other-{t}")) for t in range(Health.DOWN_AFTER + Health.RECENT)
    )
    full = Health()
    for i in range(Health.KNOWN + 1):
        full.remember(f"r{i}")
    assert not full.knows("r0") and full.knows("r1") and full.knows(f"r{Health.KNOWN}")


def _fails_on_its_own(health: Health, t: float) -> Standing:
    """A call that fails at ``t``, and again at ``t + 1`` after a call sent between was answered."""
    standing = Standing()
    health.failure(t, standing)
    health.success(sent_at=t + 0.5, through=True)
    health.failure(t + 1.0, standing)
    assert standing.own
    return standing


def test_health_learns_that_failed_calls_fail_on_their_own_and_unlearns_it() -> None:
    """Once the latest calls that failed went on to fail on their own, a call's first failure
    already sends its retry behind the fresh rows (still counting toward the provider's health),
    but for one in SAMPLE; a retry that goes through ends that at once."""
    health = Health()
    first = Standing()
    health.failure(0.0, first)
    assert not first.behind  # nothing learnt yet: it retries at once
    for t in (10.0, 20.0):
        _fails_on_its_own(health, t)
    firsts = [Standing() for _ in range(2 * Health.SAMPLE)]
    for i, standing in enumerate(firsts):
        health.failure(30.0 + i, standing)
        for _ in range(3):
            health.success(sent_at=30.5 + i, through=True)  # the others are answered
    assert [s.behind for s in firsts] == ([True] * (Health.SAMPLE - 1) + [False]) * 2
    assert not any(s.own for s in firsts) and health.failures == 0
    health.success(sent_at=40.0, standing=firsts[-1], through=True)  # the retry sent at once went through
    late = Standing()
    health.failure(41.0, late)
    assert not late.behind
    health.success(sent_at=41.5, standing=firsts[0])  # a 429 is an answer, not a retry going through
    for t in range(50, 50 + 10 * Health.FATES, 10):
        _fails_on_its_own(health, float(t))
    again = Standing()
    health.failure(200.0, again)
    assert again.behind  # the last FATES calls that failed all failed on their own


def test_calls_failing_on_their_own_teach_nothing_while_the_provider_is_failing() -> None:
    """While failures dominate or the provider is down, a call's failure never sends it behind
    the fresh rows on what was learnt: the provider's health decides when it goes."""
    health = Health()
    for t in (0.0, 10.0):
        _fails_on_its_own(health, t)
    calls = [Standing() for _ in range(6)]
    for i, standing in enumerate(calls):  # two failures for each answer: most calls fail
        health.failure(20.0 + i, Standing())
        health.failure(20.1 + i, standing)
        health.success(sent_at=20.2 + i, through=True)
    assert health.dominated() and not health.down and not any(s.behind for s in calls[2:])
    for t in range(30, 40):
        health.failure(float(t))
    down = Standing()
    health.failure(40.0, down)
    assert health.down and not down.behind


@pytest.mark.parametrize("max_wait", [0.5, 20.0], ids=["budget under the first probe", "budget of 20s"])
def test_nothing_listening_parks_every_row_once_its_wait_budget_is_spent(max_wait: float) -> None:
    """Connections refused: after a few failures the provider is down; the rows wait for its
    probes (one call each, 1, 1.5, 2.25... s apart) while the next falls within their max_wait,
    then park (reason "down"): 300 rows settle within the budget, with a handful of attempts."""
    shape = Closed()
    provider = Provider("p")
    events: list = []
    governor(provider).subscribe(events.append)
    out = _run(provider, shape, max_wait=max_wait)
    assert out.parked.get("down", 0) + out.failed == 300 and out.parked["down"] >= 280
    # Rows start as slots free up; each waits its max_wait at most, and only probes are sent meanwhile.
    assert out.seconds <= 2 * max_wait + 0.5 and shape.requests <= 40 + 8
    assert provider.status().down and provider.status().down_error == "connection refused"
    assert repr(provider).endswith("down (connection refused)>")
    assert [type(e) for e in events if isinstance(e, (ProviderDown, ProviderUp))] == [ProviderDown]


@pytest.mark.parametrize("back", [True, False], ids=["back", "still-down"])
def test_down_provider_is_probed_by_one_call_and_the_others_wait_for_its_word(back: bool) -> None:
    """While down, no call goes until the next probe is due: a waterfall's leg passes at once, a
    call with the budget waits for it.  Then one call probes and the calls that meet it wait for
    its word: the provider is back (they all go) or it is not (the next probe is past their
    budget: they park)."""

    def ticket(budget: float = 1.5, *, leg: bool = False) -> Ticket:
        return Ticket("t", WaitBudget(budget), suspend=False, falls_through=leg)

    async def main() -> tuple[list[str], int, float]:
        provider = Provider("p")
        governor(provider).backoff = Backoff(rng=random.Random(0))
        await drive(
            provider, Closed(), 20, concurrency=20, max_wait=0.5
        )  # the rows that take it down park at once
        assert provider.status().down
        early = []
        try:
            await governor(provider).dispatch(Flaky(every=0).send, ticket(leg=True))
        except pb.ProviderExhausted as exc:
            early.append(exc.reason)
        assert early == ["down"]  # a leg does not wait for the probe: no call goes
        loop = asyncio.get_running_loop()
        due = governor(provider).health.probe_t
        shape: Shape = Flaky(every=0, latency=0.5) if back else Closed()
        outcomes = []

        async def call() -> None:
            try:
                outcomes.append(await governor(provider).dispatch(shape.send, ticket()))
            except pb.ProviderExhausted as exc:
                outcomes.append(exc.reason)

        await asyncio.gather(*(call() for _ in range(3)))
        assert provider.status().down is not back
        return outcomes, shape.requests, loop.time() - due

    outcomes, requests, after = run_virtual(main())
    assert after >= 0  # nothing went before the probe was due
    if back:
        assert outcomes == ["ok"] * 3 and requests == 3
    else:
        assert outcomes == ["down"] * 3 and requests == 1  # one probe, no more


def test_an_answer_sent_before_the_outage_does_not_bring_it_back() -> None:
    """A call sent before the provider went down and answered after is no sign it is back."""
    health = Health()
    for i in range(10):
        health.failure(1.0 + i * 0.01)
    assert health.down
    assert health.success(sent_at=0.5) is False and health.down
    assert health.may_probe(5.0) and health.success(sent_at=5.0) is True and not health.down


def test_a_new_run_retests_a_down_provider_at_once() -> None:
    """retest() (each run calls it) lets the first call probe now, not at the backed-off time."""
    health = Health()
    for i in range(10):
        health.failure(float(i))
    health.may_probe(10.0)
    health.failure(10.0)
    assert health.probe_t > 11.0 and not health.may_probe(10.5)
    health.retest()
    assert health.may_probe(10.5)


def test_window_opens_gradually_and_a_burst_refusal_is_the_rates() -> None:
    """The window starts at INITIAL and grows one per success; a hinted 429 among levels that
    went through drops any window (a rate, not concurrency)."""
    window = Window()
    assert window.limit == Window.INITIAL and window.opening
    for level in range(1, 4):
        window.success(level, 0.1)
    assert window.limit == Window.INITIAL + 3
    assert window.refused(2, 0.2, hinted=True) is False
    assert window.limit is None and not window.opening


def test_window_reads_a_level_and_probes_above_it() -> None:
    """A 429 above every level that went through sets the limit to the highest that did; after a
    second at the limit without refusal, it grows by a quarter (at least one)."""
    window = Window()
    for level in (1, 2, 3, 4):
        window.success(level, 1.0)
    assert window.refused(5, 1.0) is True and window.limit == 4
    assert window.success(4, 2.5) is False
    assert window.success(4, 3.1) is True and window.limit == 5  # PROBE (2 s) at the limit without a refusal
    assert window.success(7, 3.2) is True and window.limit == 6  # a success above the limit: one more


def test_window_halves_once_on_refusals_before_anything_went_through() -> None:
    """Refusals before any success say nothing about levels (calls sent together arrive in any
    order): the window halves once, and again only after something went through."""
    window = Window()
    assert window.refused(2, 0.0) is True and window.limit == Window.INITIAL // 2
    assert window.refused(7, 0.0) is True and window.limit == Window.INITIAL // 2
    window.success(1, 0.1)
    assert window.refused(3, 3.0) is True and window.limit == 2


def test_window_never_exceeds_configured_concurrency() -> None:
    """concurrency=3: discovery moves the limit below 3, never above."""
    window = Window(3)
    assert window.limit == 3 and not window.opening
    window.success(1, 0.0)
    window.success(2, 0.0)
    assert window.refused(3, 0.1) is True and window.limit == 2
    window.success(2, 1.5)
    window.success(2, 3.0)
    assert window.limit == 3


def test_health_needs_failures_in_a_row_and_most_recent_calls_failing() -> None:
    """Five failures in a row among mostly successes is bad luck, not down; when failures are
    most of the recent calls, it is down; a probe's failure pushes the next probe further."""
    health = Health()
    for _ in range(12):
        health.success()
    for i in range(5):
        assert health.failure(float(i)) is False
    assert not health.down
    health = Health()
    went = [health.failure(float(i)) for i in range(10)]
    assert went == [False] * 9 + [True] and health.down
    assert health.probe_t == 9.0 + Health.PROBE_FIRST
    assert (
        health.may_probe(9.5) is False and health.may_probe(10.0) is True and health.may_probe(10.0) is False
    )
    health.failure(10.1)
    assert health.probe_t == pytest.approx(10.1 + Health.PROBE_GROWTH * Health.PROBE_FIRST)
    assert (
        health.may_probe(10.1 + Health.PROBE_GROWTH) is True and health.success() is True and not health.down
    )


def test_a_token_debt_past_the_wait_budget_parks_the_call_and_one_within_it_waits() -> None:
    """After a 5,000-token call at 6,000 tokens/min, the next call is ~50 s away: past a 20 s budget it parks, within 120 s it waits."""
    from playbook._internal.flow import WaitBudget

    async def main() -> float:
        provider = pb.Provider("paced-tokens", tpm=6_000)
        gov = governor(provider)

        async def send() -> str:
            return "ok"

        def ticket(budget: float, weight: float) -> Ticket:
            made = Ticket("llm", WaitBudget(budget))
            made.weight = weight
            return made

        await gov.dispatch(send, ticket(120, 5_000))
        with pytest.raises(
            pb.ProviderExhausted, match="paces calls: this one could go at .* past this row's wait budget"
        ):
            await gov.dispatch(send, ticket(20, 10))
        loop = asyncio.get_running_loop()
        start = loop.time()
        await gov.dispatch(send, ticket(120, 10))
        return loop.time() - start

    waited = run_virtual(main())
    assert 40 < waited < 55
