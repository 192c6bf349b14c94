"""The provider governor in virtual time: pacing, concurrency, holds, budgets, retries."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from typing import Any

import pytest
from vtime import run_virtual

import playbook as pb
from playbook._internal.flow import OnHold, WaitBudget
from playbook.events import ProviderHoldLifted, ProviderHoldSet, RateChanged
from playbook.providers.limits import Backoff
from playbook.providers.provider import HEADROOM, Provider, Ticket, governor


class Script:
    """A send() that records when it was called and answers from a script (then ``default``)."""

    def __init__(self, *outcomes: Any, default: Any = "ok", takes: float = 0.0) -> None:
        self.outcomes = list(outcomes)
        self.default = default
        self.takes = takes  # seconds each send is in flight
        self.times: list[float] = []
        self.in_flight = self.peak = 0

    async def __call__(self) -> Any:
        self.times.append(asyncio.get_running_loop().time())
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.takes:
                await asyncio.sleep(self.takes)
            outcome = self.outcomes.pop(0) if self.outcomes else self.default
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        finally:
            self.in_flight -= 1


def _ticket(*, suspend: bool = True, budget: float = 120.0) -> Ticket:
    return Ticket("lookup", WaitBudget(budget), suspend=suspend)


def _refused(retry_after: float | None = None) -> pb.ToolError:
    return pb.ToolError("slow down", status=429, retry_after=retry_after)


def _down(retry_after: float | None = None) -> pb.ToolError:
    return pb.ToolError("service unavailable", status=503, retryable=True, retry_after=retry_after)


async def _later(delay: float, provider: Provider, send: Script, ticket: Ticket | None = None) -> Any:
    await asyncio.sleep(delay)
    return await governor(provider).dispatch(send, ticket)


async def _resuming(provider: Provider, send: Script, ticket: Ticket) -> Any:
    """Dispatch as a row does: a call whose row steps aside (``OnHold``) comes back at its time."""
    while True:
        try:
            return await governor(provider).dispatch(send, ticket)
        except OnHold as held:
            await asyncio.sleep(held.until - asyncio.get_running_loop().time())


def _gather(*calls: Any) -> list[Any]:
    async def main() -> list[Any]:
        return list(await asyncio.gather(*calls))

    return run_virtual(main())


# -- pacing and concurrency ----------------------------------------------------------------


def test_rps_spaces_sends() -> None:
    """rps=10: twenty concurrent calls are sent 1/(0.98 x 10) s apart (2% under the limit), the first at once."""
    provider, send = Provider("p", rps=10), Script()
    assert _gather(*(governor(provider).dispatch(send) for _ in range(20))) == ["ok"] * 20
    assert send.times == pytest.approx([0.1 / HEADROOM * i for i in range(20)], abs=1e-6)


def test_burst_lets_calls_through_at_once() -> None:
    """burst=5 sends five calls at once, then spaces the rest at the rate."""
    provider, send = Provider("p", rps=10, burst=5), Script()
    _gather(*(governor(provider).dispatch(send) for _ in range(10)))
    step = 0.1 / HEADROOM
    assert send.times == pytest.approx([0.0] * 5 + [step * k for k in range(1, 6)], abs=1e-6)


def test_concurrency_bounds_calls_in_flight() -> None:
    """concurrency=3 never has more than three sends in flight."""
    provider, send = Provider("p", concurrency=3), Script(takes=1.0)
    _gather(*(governor(provider).dispatch(send) for _ in range(9)))
    assert send.peak == 3
    assert send.times == pytest.approx([0, 0, 0, 1, 1, 1, 2, 2, 2], abs=1e-6)


# -- 429 with a hint: holds ----------------------------------------------------------------


def test_short_hold_waits_in_place_and_holds_provider() -> None:
    """A 429 asking for 0.5 s: the call retries at 0.5 and no other call is sent before then."""
    provider, send = Provider("p"), Script(_refused(0.5))
    events: list[Any] = []
    governor(provider).subscribe(events.append)
    results = _gather(governor(provider).dispatch(send, _ticket()), _later(0.1, provider, send, _ticket()))
    assert results == ["ok", "ok"]
    assert send.times == pytest.approx([0.0, 0.5, 0.5], abs=1e-6)
    assert [type(e) for e in events] == [ProviderHoldSet, ProviderHoldLifted]
    assert events[0].provider == "p" and events[0].status == 429
    assert events[0].until == pytest.approx(time.time() + 0.5, abs=5)


def test_hinted_refusal_cuts_configured_rate_and_reports_it() -> None:
    """A 429 with a hint longer than a second soon after sending began cuts a configured rate
    deeply (0.75x: what was measured is the provider's burst), says so, and holds the provider."""
    provider, send = Provider("p", rps=10), Script(_refused(2.0))
    events: list[Any] = []
    governor(provider).subscribe(events.append)
    _gather(_resuming(provider, send, _ticket()))
    assert isinstance(events[0], RateChanged)
    assert events[0].provider == "p" and events[0].rate == pytest.approx(10 * HEADROOM * 0.75)
    assert [type(e) for e in events[1:3]] == [ProviderHoldSet, ProviderHoldLifted]
    assert events[1].status == 429


def test_a_lone_short_refusal_at_a_known_rate_waits_alone() -> None:
    """Jitter: one 429 saying "Retry-After: 1" among calls paced at a configured rate is a lone
    one: that call alone waits its second, the others keep their slots, the rate stays and the
    provider is not held.  A third refusal that soon is a pattern: held, and the rate cut."""
    provider, send = Provider("p", rps=10), Script("ok", "ok", "ok", _refused(1.0))
    events: list[Any] = []
    governor(provider).subscribe(events.append)
    assert (
        _gather(*(governor(provider).dispatch(send, _ticket(suspend=False)) for _ in range(8))) == ["ok"] * 8
    )
    step = 0.1 / HEADROOM
    assert send.times[:8] == pytest.approx([step * k for k in range(8)], abs=1e-6)  # nobody else waited
    assert send.times[8] == pytest.approx(3 * step + 1.0, abs=1e-6)  # the refused call, its hint later
    assert events == [] and provider.status().rate == pytest.approx(10 * HEADROOM)

    again, send = Provider("q", rps=10), Script("ok", "ok", "ok", _refused(1.0), _refused(1.0), _refused(1.0))
    governor(again).subscribe(events.append)
    _gather(*(governor(again).dispatch(send, _ticket(suspend=False)) for _ in range(8)))
    assert [type(e) for e in events[:2]] == [RateChanged, ProviderHoldSet]
    assert again.status().rate < 10 * HEADROOM


def test_hold_stops_calls_waiting_for_their_slot() -> None:
    """Calls already waiting for a pace slot when a hold arrives are not sent before it ends."""
    provider, send = Provider("p", rps=10), Script(_refused(2.0))
    assert _gather(*(_resuming(provider, send, _ticket()) for _ in range(3))) == ["ok"] * 3
    assert send.times[0] == 0.0
    assert send.times[1] == pytest.approx(2.0, abs=1e-6)
    assert all(t >= 2.0 - 1e-6 for t in send.times[1:])


def test_hold_stops_calls_waiting_at_the_gate() -> None:
    """A call waiting on the concurrency gate when a hold arrives waits for the hold too."""
    provider, send = Provider("p", concurrency=1), Script(_refused(1.0), takes=0.2)
    _gather(
        governor(provider).dispatch(send, _ticket(suspend=False)),
        governor(provider).dispatch(send, _ticket(suspend=False)),
    )
    assert send.times == pytest.approx([0.0, 1.2, 1.4], abs=1e-6)


def test_long_hold_suspends_the_row() -> None:
    """A 429 asking for 30 s raises OnHold (not an Exception) with the provider and the deadline."""
    provider, send = Provider("p"), Script(_refused(30))
    ticket = _ticket()

    async def main() -> OnHold:
        with pytest.raises(OnHold) as info:
            await governor(provider).dispatch(send, ticket)
        return info.value

    held = run_virtual(main())
    assert not isinstance(held, Exception)
    assert held.provider is provider
    assert held.until == pytest.approx(30.0, abs=1e-6)
    assert held.wall == pytest.approx(time.time() + 30, abs=5)
    assert held.status == 429 and held.budget is ticket.budget
    assert send.times == [0.0]
    assert provider.status().held


def test_a_call_that_cannot_suspend_still_steps_aside_for_a_long_hold() -> None:
    """suspend=False (a batch): a 30 s provider hold still raises OnHold, so the rows it serves step aside."""
    provider, send = Provider("p"), Script(_refused(30))
    with pytest.raises(OnHold):
        run_virtual(governor(provider).dispatch(send, _ticket(suspend=False)))


def test_a_call_that_cannot_suspend_waits_out_its_own_backoff() -> None:
    """suspend=False: the call's own backoff after a 503, longer than a second, is waited in place."""
    provider, send = Provider("p"), Script(_down())
    governor(provider).backoff = Backoff(base=4.0, cap=4.0, rng=random.Random(7))
    ticket = _ticket(suspend=False)
    assert _gather(governor(provider).dispatch(send, ticket)) == ["ok"]
    assert len(send.times) == 2 and 2.0 <= send.times[1] <= 4.0
    assert ticket.budget.left == pytest.approx(120.0 - send.times[1], abs=1e-6)


def test_hold_past_budget_exhausts() -> None:
    """A hold past the wait budget raises ProviderExhausted at once, for this and every later call."""
    provider, send = Provider("acme"), Script(_refused(3600))

    async def main() -> list[pb.ProviderExhausted]:
        errors = []
        for _ in range(2):
            started = asyncio.get_running_loop().time()
            with pytest.raises(pb.ProviderExhausted) as info:
                await governor(provider).dispatch(send, _ticket())
            assert asyncio.get_running_loop().time() == started  # no waiting
            errors.append(info.value)
            await asyncio.sleep(10)
        return errors

    for error in run_virtual(main()):
        assert error.retry_at == pytest.approx(time.time() + 3600, abs=30)
        assert error.provider == "acme" and error.tool == "lookup" and error.status == 429
        assert "'acme'" in str(error) and "'lookup'" in str(error)
    assert send.times == [0.0]


# -- transient failures --------------------------------------------------------------------


def test_5xx_retried_then_unavailable() -> None:
    """retries=2: a 503 is sent three times, with backoff waits, then ProviderUnavailable."""
    provider, error = Provider("acme", retries=2), _down()
    send = Script(default=error)
    with pytest.raises(pb.ProviderUnavailable) as info:
        run_virtual(governor(provider).dispatch(send, _ticket(suspend=False)))
    assert type(info.value) is pb.ProviderUnavailable
    assert "'acme'" in str(info.value) and info.value.provider == "acme" and info.value.status == 503
    assert info.value.__cause__ is error
    assert len(send.times) == 3
    first, second = send.times[1] - send.times[0], send.times[2] - send.times[1]
    assert 0.25 <= first <= 0.5  # Backoff(0.5): try 0 waits in [0.25, 0.5]
    assert 0.5 <= second <= 1.0  # try 1 waits in [0.5, 1]


def test_5xx_with_hint_retries_that_call_only() -> None:
    """A 503 with Retry-After is a failure of that call: it retries after the hint, while the
    other calls go on at once; the rate is not cut and the provider is not held."""
    provider, send = Provider("p", rps=10), Script(_down(retry_after=0.5))
    events: list[Any] = []
    governor(provider).subscribe(events.append)
    calls = (
        governor(provider).dispatch(send, _ticket(suspend=False)),
        _later(0.15, provider, send, _ticket()),
    )
    assert _gather(*calls) == ["ok", "ok"]
    assert send.times == pytest.approx([0.0, 0.15, 0.5], abs=1e-6)
    assert not any(isinstance(e, (ProviderHoldSet, RateChanged)) for e in events)
    assert provider.status().rate == pytest.approx(10 * HEADROOM)


def test_a_long_retry_wait_gives_the_worker_up() -> None:
    """A call whose own retry waits longer than a moment suspends its row (OnHold, until its retry),
    so the row's worker serves other rows meanwhile; the provider is not held."""
    provider, send = Provider("p"), Script(_down(retry_after=2.0))
    with pytest.raises(OnHold) as info:
        run_virtual(governor(provider).dispatch(send, _ticket()))
    assert info.value.until == pytest.approx(2.0 + 0.0, abs=0.01)
    assert not provider.status().held and governor(provider).limiter.hold_until_t == 0.0


def test_5xx_past_budget_gives_up() -> None:
    """A retry whose backoff would pass the wait budget is not waited for."""
    provider, send = Provider("p"), Script(default=_down())
    with pytest.raises(pb.ProviderUnavailable, match="wait budget"):
        run_virtual(governor(provider).dispatch(send, _ticket(budget=0.1)))
    assert send.times == [0.0]


@pytest.mark.parametrize("kind", [TimeoutError, ConnectionError, ConnectionResetError])
def test_timeouts_and_dropped_connections_retried(kind: type[Exception]) -> None:
    """Timeouts and connection errors from send are retried, then ProviderUnavailable."""
    provider, send = Provider("p", retries=1), Script(kind("boom"), "ok")
    assert run_virtual(governor(provider).dispatch(send)) == "ok"
    assert 0.25 <= send.times[1] - send.times[0] <= 0.5
    send = Script(default=kind("boom"))
    with pytest.raises(pb.ProviderUnavailable) as info:
        run_virtual(governor(provider).dispatch(send))
    assert isinstance(info.value.__cause__, kind)
    assert len(send.times) == 2


@pytest.mark.parametrize(
    "error",
    [
        pb.ToolError("bad request", status=400),
        pb.ToolError("not found", status=404),
        pb.ToolError("unprocessable", status=422),
        ValueError("bad value"),
        pb.RunFatal("no credit", status=402),
    ],
    ids=["400", "404", "422", "ValueError", "RunFatal"],
)
def test_final_errors_raised_after_one_send(error: Exception) -> None:
    """Errors that retrying cannot help are sent once and re-raised as they are."""
    provider, send = Provider("p"), Script(error)
    with pytest.raises(type(error)) as info:
        run_virtual(governor(provider).dispatch(send, _ticket()))
    assert info.value is error
    assert send.times == [0.0]
    assert not provider.status().held


# -- 429 without a hint: this call backs off -----------------------------------------------


def test_unhinted_refusal_backs_off_only_that_call() -> None:
    """A 429 with no hint backs off the refused call; other calls go through meanwhile."""
    provider, send = Provider("p"), Script(_refused())
    events: list[Any] = []
    governor(provider).subscribe(events.append)
    assert _gather(
        governor(provider).dispatch(send, _ticket(suspend=False)), _later(0.1, provider, send, _ticket())
    ) == ["ok", "ok"]
    assert send.times[:2] == pytest.approx([0.0, 0.1], abs=1e-6)
    assert 0.25 <= send.times[2] <= 0.5
    assert not provider.status().held and not any(isinstance(e, ProviderHoldSet) for e in events)


def test_unhinted_refusals_back_off_exponentially() -> None:
    """Repeated unhinted 429s wait longer each time: [0.25, 0.5], [0.5, 1], [1, 2] s."""
    provider, send = Provider("p"), Script(_refused(), _refused(), _refused())
    run_virtual(governor(provider).dispatch(send, _ticket(suspend=False)))
    gaps = [b - a for a, b in zip(send.times, send.times[1:])]
    assert len(gaps) == 3
    for n, gap in enumerate(gaps):
        assert 0.25 * 2**n <= gap <= 0.5 * 2**n


def test_endless_unhinted_refusals_are_bounded_by_budget() -> None:
    """A provider that always refuses without a hint exhausts the wait budget; it is not retried forever."""
    provider = Provider("p")
    send = Script(*[_refused()] * 30, default=RuntimeError("retried without bound"))  # fail, don't hang

    async def main() -> float:
        with pytest.raises(pb.ProviderExhausted):
            await governor(provider).dispatch(send, _ticket(suspend=False, budget=120.0))
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) <= 120.0 + 1e-6
    assert 3 < len(send.times) < 20


# -- construction and display --------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("rps", 0),
        ("rps", -1),
        ("rps", "10"),
        ("rps", True),
        ("rps", math.nan),
        ("burst", 0),
        ("burst", 1.5),
        ("burst", -2),
        ("concurrency", 0),
        ("concurrency", 2.5),
        ("concurrency", True),
        ("max_wait", -1),
        ("max_wait", None),
        ("max_wait", "60"),
        ("max_wait", math.nan),
        ("retries", -1),
        ("retries", 1.5),
        ("retries", None),
        ("rpm", 0),
        ("rpm", "600"),
        ("tpm", -5),
        ("tpm", math.inf),
        ("tpm", True),
        ("itpm", 0),
        ("itpm", "40000"),
        ("itpm", math.nan),
        ("otpm", -8000),
        ("otpm", False),
        ("otpm", [8000]),
        ("window", 50),
        ("window", (50,)),
        ("window", (0, 5)),
        ("window", (50, 0)),
        ("window", (50.5, 5)),
        ("window", ("50", 5)),
        ("window", (50, math.inf)),
        ("window", (True, 5)),
    ],
)
def test_bad_options_rejected(option: str, value: object) -> None:
    """A bad rps, rpm, tpm, itpm, otpm, burst, window, concurrency, max_wait or retries is a PlayDefinitionError naming it."""
    with pytest.raises(pb.PlayDefinitionError, match=option):
        Provider("p", **{option: value})


def test_edge_options_accepted() -> None:
    """max_wait=0 and retries=0 are valid: never wait, never retry."""
    provider = Provider("p", rps=0.5, burst=1, concurrency=1, max_wait=0, retries=0)
    assert provider.max_wait == 0.0 and provider.retries == 0


def test_rpm_is_rps_spelled_per_minute() -> None:
    """rpm=600 paces like rps=10 (98% of it) and shows as given; tpm is kept."""
    provider = Provider("llm", rpm=600, tpm=60_000)
    assert provider.rps == 10.0 and provider.rpm == 600 and provider.tpm == 60_000
    assert provider.status().rate == pytest.approx(10 * HEADROOM)
    assert repr(provider).startswith("<Provider 'llm' rpm=600 tpm=60000 rate=9.8/s")


def test_input_and_output_token_budgets_are_kept_per_key_shown_and_paced() -> None:
    """itpm and otpm are kept as given (one per key, as tpm), shown, travel with the provider, and
    make the limiter's input and output budgets (98% of them, per second) beside tpm's."""
    import pickle

    provider = Provider("anthropic", rpm=50, itpm=40_000, otpm=8_000)
    assert (provider.itpm, provider.otpm, provider.tpm) == (40_000, 8_000, None)
    assert "itpm=40000 otpm=8000" in repr(provider)
    copy = pickle.loads(pickle.dumps(provider))
    assert (copy.itpm, copy.otpm) == (40_000, 8_000) and governor(copy) is governor(provider)
    assert governor(provider).limiter.token_rates == (
        None,
        pytest.approx(40_000 / 60 * HEADROOM),
        pytest.approx(8_000 / 60 * HEADROOM),
    )
    pooled = Provider("anthropic-pool", keys=[pb.secret("KEY_A"), pb.secret("KEY_B")], otpm=[8_000, 16_000])
    assert pooled.otpm == (8_000, 16_000) and pooled.itpm is None
    rates = [lane.governor.limiter.token_rates.output for lane in governor(pooled).lanes]  # type: ignore[union-attr]
    assert rates == [pytest.approx(8_000 / 60 * HEADROOM), pytest.approx(16_000 / 60 * HEADROOM)]


def test_a_window_is_calls_per_seconds_and_shows_as_given() -> None:
    """window=(50, 5) (or a list, as JSON gives it, or numpy numbers, as a frame's cells are) is kept
    as plain numbers, shown, and travels with the provider."""
    import pickle

    import numpy as np

    provider = Provider("api", window=[np.int64(50), 5], concurrency=np.int64(8))
    assert (
        provider.window == (50, 5) and type(provider.window[0]) is int and type(provider.concurrency) is int
    )
    assert repr(provider).startswith("<Provider 'api' window=(50, 5) concurrency=8")
    assert pickle.loads(pickle.dumps(provider)).window == (50, 5)


def test_rps_and_rpm_together_rejected() -> None:
    """Giving both rps and rpm is an error naming both."""
    with pytest.raises(pb.PlayDefinitionError, match="rps.*rpm"):
        Provider("llm", rps=10, rpm=600)


def test_options_are_frozen_and_state_lives_in_the_governor() -> None:
    """A provider's options cannot change after it is made; its live state is the governor's."""
    provider = Provider("p", rps=10)
    with pytest.raises(AttributeError, match="frozen"):
        provider.rps = 20  # type: ignore[misc]
    assert governor(provider).limiter is governor(provider).limiter and provider.account == "p:default"


def test_empty_name_rejected() -> None:
    """A provider needs a name."""
    with pytest.raises(pb.PlayDefinitionError, match="name"):
        Provider(" ")


def test_repr_shows_live_state() -> None:
    """repr shows the limits, current rate, calls in flight, 429s and a hold."""
    provider = Provider("acme", rps=10, concurrency=2)
    assert repr(provider) == "<Provider 'acme' rps=10 concurrency=2 rate=9.8/s in_flight=0 429s=0>"
    seen: list[str] = []

    async def send() -> None:
        seen.append(repr(provider))
        raise _refused(30)

    with pytest.raises(OnHold):
        run_virtual(governor(provider).dispatch(send, _ticket()))
    assert "in_flight=1" in seen[0]
    shown = repr(provider)
    assert "rate=7.35/s" in shown and "in_flight=0" in shown and "429s=1" in shown
    assert "held until" in shown


def test_hold_lifted_event_comes_at_the_deadline_without_another_call() -> None:
    """ProviderHoldLifted arrives when the hold ends, even if no call comes along to notice."""
    provider, send = Provider("p"), Script(_refused(30))
    events: list[tuple[float, Any]] = []
    governor(provider).subscribe(lambda e: events.append((asyncio.get_running_loop().time(), e)))

    async def main() -> None:
        with pytest.raises(OnHold):
            await governor(provider).dispatch(send, _ticket())
        await asyncio.sleep(60)

    run_virtual(main())
    lifted = [t for t, e in events if isinstance(e, ProviderHoldLifted)]
    assert lifted == [pytest.approx(30.0, abs=1e-6)]
    assert not provider.status().held


def test_equal_providers_share_one_governor_and_a_hold_reaches_both() -> None:
    """Two Provider("acme", rps=10) in one process are one account with one rate, calls in flight
    and hold (two cells or two tools that each made one); different limits pace apart."""
    first, second, other = (
        pb.Provider("acme", rps=10),
        pb.Provider("acme", rps=10),
        pb.Provider("acme", rps=20),
    )
    assert governor(first) is governor(second) and governor(other) is not governor(first)

    async def main() -> tuple[bool, bool]:
        async def refused() -> None:
            raise pb.ToolError("slow down", status=429, retry_after=30)

        with contextlib.suppress(BaseException):
            await governor(first).dispatch(refused, Ticket("t", WaitBudget(0.0)))
        return second.status().held, other.status().held

    assert run_virtual(main()) == (True, False)


def test_a_provider_shows_its_configuration_and_its_status() -> None:
    """pb.Provider's public names are its frozen options and status(), a snapshot of its state."""
    provider = pb.Provider("acme", rps=10, concurrency=4)
    public = {name for name in dir(provider) if not name.startswith("_")}
    assert public == {
        "name",
        "rps",
        "rpm",
        "burst",
        "window",
        "concurrency",
        "tpm",
        "itpm",
        "otpm",
        "account",
        "max_wait",
        "retries",
        "shared",
        "keys",
        "status",
    }
    status = provider.status()
    assert (status.name, status.held, status.down, status.in_flight, status.rate) == (
        "acme",
        False,
        False,
        0,
        pytest.approx(10 * HEADROOM),
    )
