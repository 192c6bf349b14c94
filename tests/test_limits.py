"""The governor's exact primitives: reading wait headers, backoff, GCRA pacing and AIMD, window allowances."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta, timezone
from email.utils import formatdate

import httpx
import pytest

from playbook.providers.limits import HEADROOM, Announced, Backoff, Pace, announced, retry_after
from playbook.providers.limits.allowance import Allowance

NOW = 1_700_000_000.0  # a wall-clock "now", in epoch seconds


def _wait(**headers: str) -> float | None:
    """retry_after() over real response headers: names with dashes, any case."""
    return retry_after(httpx.Headers({k.replace("_", "-"): v for k, v in headers.items()}), now=NOW)


# -- retry_after ---------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [("120", 120.0), ("1.5", 1.5), ("0", 0.0), (' "7" ', 7.0)])
def test_retry_after_seconds(value: str, seconds: float) -> None:
    """Retry-After in seconds (integer or float) is the wait."""
    assert _wait(Retry_After=value) == seconds


def test_retry_after_http_date_counts_from_now() -> None:
    """Retry-After as an IMF-fixdate is the seconds from ``now`` to that moment."""
    assert _wait(Retry_After=formatdate(NOW + 30, usegmt=True)) == pytest.approx(30.0)


def test_retry_after_past_http_date_is_zero() -> None:
    """A Retry-After date already past means no wait, not a negative one."""
    assert _wait(Retry_After=formatdate(NOW - 600, usegmt=True)) == 0.0


def test_ratelimit_reset_is_seconds() -> None:
    """RateLimit-Reset gives the wait in seconds."""
    assert _wait(RateLimit_Reset="7") == 7.0


@pytest.mark.parametrize("value", ["limit=10, remaining=0, reset=5", "limit=10; remaining=0; reset=5"])
def test_combined_ratelimit_header_reset(value: str) -> None:
    """The combined draft header ``RateLimit: ..., reset=N`` gives N seconds."""
    assert _wait(RateLimit=value) == 5.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (str(int(NOW) + 42), 42.0),  # epoch seconds
        (str((int(NOW) + 42) * 1000), 42.0),  # epoch milliseconds
        ("30", 30.0),  # a small number is a delta
        (str(int(NOW) - 10), 0.0),  # a reset already past
    ],
)
def test_x_ratelimit_reset(value: str, seconds: float) -> None:
    """X-RateLimit-Reset is read as an epoch timestamp (s or ms) or, when small, as seconds."""
    assert _wait(X_RateLimit_Reset=value) == pytest.approx(seconds)


@pytest.mark.parametrize("garbage", ["soon", "", "-3", "nan", "inf", "Wed, 99 Foo 2024 10:00:00 GMT"])
@pytest.mark.parametrize("header", ["Retry-After", "RateLimit-Reset", "X-RateLimit-Reset"])
def test_garbage_is_not_trusted(header: str, garbage: str) -> None:
    """An unusable value gives no wait at all, never a made-up one."""
    assert retry_after(httpx.Headers({header: garbage}), now=NOW) is None


def test_garbage_falls_back_to_next_header() -> None:
    """A garbage Retry-After gives way to RateLimit-Reset, a garbage one of those to X-RateLimit-Reset."""
    assert _wait(Retry_After="soon", RateLimit_Reset="7") == 7.0
    assert _wait(RateLimit_Reset="later", X_RateLimit_Reset="9") == 9.0


def test_header_precedence() -> None:
    """Retry-After wins over RateLimit-Reset, which wins over X-RateLimit-Reset."""
    assert _wait(Retry_After="3", RateLimit_Reset="7", X_RateLimit_Reset="9") == 3.0
    assert _wait(RateLimit_Reset="7", X_RateLimit_Reset="9") == 7.0
    assert _wait(RateLimit="reset=5", X_RateLimit_Reset="9") == 5.0


def test_header_names_any_case() -> None:
    """Header names match in any case, as HTTP says."""
    assert retry_after(httpx.Headers({"RETRY-AFTER": "4"}), now=NOW) == 4.0
    assert retry_after(httpx.Headers({"x-ratelimit-reset": "6"}), now=NOW) == 6.0
    assert retry_after({"retry-after": "2"}, now=NOW) == 2.0  # a plain dict, lower-case keys


def test_no_headers_no_wait() -> None:
    """Without any rate-limit header there is no wait to report."""
    assert retry_after(httpx.Headers({"Content-Type": "application/json"}), now=NOW) is None


# -- Anthropic's headers -------------------------------------------------------------------

ANTHROPIC = {  # every budget a different number: a header read into another's budget shows
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-input-tokens-limit": "40000",
    "anthropic-ratelimit-output-tokens-limit": "8000",
    "anthropic-ratelimit-tokens-limit": "7000",
}


def _rfc3339(seconds_from_now: float) -> str:
    """The moment ``seconds_from_now`` after NOW, as Anthropic writes its resets."""
    return datetime.fromtimestamp(NOW + seconds_from_now, UTC).isoformat()


def test_each_anthropic_limit_header_is_read_into_its_own_budget() -> None:
    """anthropic-ratelimit-requests/-input-tokens/-output-tokens-limit are the requests, input and output
    budgets per minute, each its own; -tokens-limit (whichever token limit binds now) teaches no budget."""
    assert announced(httpx.Headers(ANTHROPIC)) == Announced(requests=50.0, input=40000.0, output=8000.0)
    assert announced({"anthropic-ratelimit-output-tokens-limit": "8000"}) == Announced(output=8000.0)
    assert announced({"anthropic-ratelimit-input-tokens-limit": "40000"}) == Announced(input=40000.0)
    assert announced({"anthropic-ratelimit-tokens-limit": "7000"}) is None


@pytest.mark.parametrize("garbage", ["lots", "", "-5", "nan", "inf", "0"])
@pytest.mark.parametrize("header", sorted(ANTHROPIC))
def test_a_garbage_anthropic_limit_is_ignored_and_the_others_kept(header: str, garbage: str) -> None:
    """An unusable value leaves its budget unknown (None), never a made-up one; the other headers still count."""
    said = announced({**ANTHROPIC, header: garbage})
    expected = announced(ANTHROPIC)
    assert said is not None and expected is not None
    field = {"requests": "requests", "input-tokens": "input", "output-tokens": "output"}.get(
        header.removeprefix("anthropic-ratelimit-").removesuffix("-limit")
    )
    assert said == (expected._replace(**{field: None}) if field else expected)


@pytest.mark.parametrize("kind", ["requests", "input-tokens", "output-tokens", "tokens"])
def test_an_anthropic_budget_used_up_waits_for_its_rfc3339_reset(kind: str) -> None:
    """No retry-after: a budget whose remaining is 0 gives the seconds to its reset (an RFC 3339 time);
    the others, not used up, give nothing."""
    headers = {
        f"anthropic-ratelimit-{other}-{field}": value
        for other in ("requests", "input-tokens", "output-tokens", "tokens")
        for field, value in (
            ("remaining", "0" if other == kind else "900"),
            ("reset", _rfc3339(7 if other == kind else 2)),
        )
    }
    assert retry_after(headers, now=NOW) == pytest.approx(7.0)


@pytest.mark.parametrize(
    "reset",
    [
        datetime.fromtimestamp(NOW + 12, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        datetime.fromtimestamp(NOW + 12, UTC).strftime("%Y-%m-%dt%H:%M:%Sz"),  # RFC 3339 allows lower case
        datetime.fromtimestamp(NOW + 12, UTC).astimezone(timezone(timedelta(hours=2))).isoformat(),
        datetime.fromtimestamp(NOW + 12, UTC).strftime("%Y-%m-%dT%H:%M:%S.250Z"),
    ],
)
def test_rfc3339_resets_in_any_form_are_read(reset: str) -> None:
    """Z, z, an offset or fractions: the same moment, the same wait (counted from ``now``)."""
    headers = {
        "anthropic-ratelimit-output-tokens-remaining": "0",
        "anthropic-ratelimit-output-tokens-reset": reset,
    }
    assert retry_after(headers, now=NOW) == pytest.approx(12.25 if ".250" in reset else 12.0)


@pytest.mark.parametrize("reset", ["soon", "", "2025-13-45T00:00:00Z", "2023-11-14T22:13:32", "1700000012"])
def test_a_garbage_or_zoneless_rfc3339_reset_is_not_trusted(reset: str) -> None:
    """A reset that is not an RFC 3339 time with its offset gives no wait (a time without a zone is a guess)."""
    headers = {
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": reset,
    }
    assert retry_after(headers, now=NOW) is None


def test_retry_after_wins_over_an_anthropic_reset_and_a_past_reset_is_no_wait() -> None:
    """Retry-After, when given, is the wait; a reset already past is 0 s, not a negative wait."""
    used_up = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": _rfc3339(30),
    }
    assert retry_after({**used_up, "retry-after": "4"}, now=NOW) == 4.0
    past = {**used_up, "anthropic-ratelimit-requests-reset": _rfc3339(-30)}
    assert retry_after(past, now=NOW) == 0.0


# -- Backoff -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 5, 6, 7, 60, 61, 10_000])
def test_backoff_within_bounds(n: int) -> None:
    """Try n waits between half and all of min(cap, base * 2**n)."""
    backoff = Backoff(0.5, 30.0, rng=random.Random(n))
    high = min(30.0, 0.5 * 2.0 ** min(n, 100))
    for _ in range(200):
        assert high / 2 <= backoff.delay(n) <= high


def test_backoff_grows_with_tries() -> None:
    """Every wait of try n+1 is at least every wait of try n, below the cap."""
    backoff = Backoff(0.5, 30.0, rng=random.Random(1))
    for n in range(5):  # try 6 is capped at 30s: [15, 30] overlaps try 5's [8, 16]
        assert max(backoff.delay(n) for _ in range(100)) <= min(backoff.delay(n + 1) for _ in range(100))


def test_backoff_never_exceeds_cap() -> None:
    """A huge try count waits no more than the cap (and does not overflow)."""
    backoff = Backoff(1.0, 5.0, rng=random.Random(2))
    assert all(2.5 <= backoff.delay(10_000) <= 5.0 for _ in range(100))


# -- Pace: GCRA spacing --------------------------------------------------------------------


def test_pace_spaces_calls_at_the_rate() -> None:
    """Calls at the same instant get slots 0, 1/r, 2/r, ... apart."""
    pace = Pace(10)
    assert [pace.reserve(0.0) for _ in range(5)] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4], abs=1e-9)


def test_pace_burst() -> None:
    """burst=b lets b calls through at once, then spaces the rest."""
    pace = Pace(10, burst=3)
    assert [pace.reserve(0.0) for _ in range(5)] == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2], abs=1e-9)


def test_pace_slow_calls_never_wait() -> None:
    """Calls arriving slower than the rate are sent at once."""
    pace = Pace(10)
    assert [pace.reserve(t * 0.2) for t in range(10)] == [0.0] * 10


def test_pace_unlimited() -> None:
    """rate=None never waits."""
    pace = Pace(None)
    assert [pace.reserve(0.0) for _ in range(100)] == [0.0] * 100


def test_delay_looks_take_spends() -> None:
    """delay() only reports the wait; take() spends the slot, reserve() does both."""
    pace = Pace(10)
    assert pace.delay(0.0) == pace.delay(0.0) == 0.0
    pace.take(0.0)
    assert pace.delay(0.0) == pytest.approx(0.1)
    assert pace.delay(0.04) == pytest.approx(0.06)
    assert pace.reserve(0.0) == pytest.approx(0.1)
    assert pace.delay(0.0) == pytest.approx(0.2)


@pytest.mark.parametrize("burst", [None, 5])
def test_pace_hold_pushes_next_slot(burst: int | None) -> None:
    """hold(until) sends nothing before ``until``, whatever the burst."""
    pace = Pace(10, burst)
    pace.reserve(0.0)
    pace.hold(5.0)
    assert 1.0 + pace.reserve(1.0) == pytest.approx(5.0, abs=1e-9)


# -- Pace: AIMD on a configured rate -------------------------------------------------------


def _traffic(pace: Pace, *times: float) -> None:
    """Calls sent at ``times`` and answered at once."""
    for t in times:
        pace.take(t)
        pace.success(t)


def test_limited_cuts_once_per_episode() -> None:
    """A 429 cuts the rate; a 429 for a call sent before (or as) that cut does not cut again."""
    pace = Pace(10)
    pace.take(0.0)
    assert pace.limited(0.5, sent_at=0.4) is True
    assert pace.rate == pytest.approx(10 * Pace.DEEP)  # refused soon after sending began: a deep cut
    assert pace.limited(0.6, sent_at=0.45) is False
    assert pace.limited(0.6, sent_at=0.5) is False
    assert pace.rate == pytest.approx(10 * Pace.DEEP)
    assert pace.limited(0.7, sent_at=0.55) is True  # sent after the cut: a new episode
    assert pace.rate == pytest.approx(10 * Pace.DEEP**2)


def test_limited_uses_accepted_rate_once_measured() -> None:
    """Long after sending began, a cut sends at CUT of what the provider accepted in the last second."""
    pace = Pace(10)
    pace.take(0.0)
    _traffic(pace, *(3.0 + i * 0.15 for i in range(1, 7)))  # 6 calls let in within the last second
    pace.take(3.95)  # and one refused
    assert pace.limited(4.0, sent_at=3.95) is True
    assert pace.rate == pytest.approx(6 * Pace.CUT)


def test_a_refusal_in_the_first_second_cuts_from_the_rate() -> None:
    """Refused within SOON of sending starting, the cut is DEEP of the rate: the 2 calls let in over 0.35 s
    measure how sending started, not the provider; later, what was let in is the base."""
    pace = Pace(10)
    _traffic(pace, 0.0, 0.15)
    pace.take(0.3)
    assert pace.accepted(0.35) is not None  # measurable: the old rule cut from it (~5/s)
    assert pace.limited(0.35, sent_at=0.3) is True
    assert pace.rate == pytest.approx(10 * Pace.DEEP)


def test_accepted_leaves_out_the_silence_of_a_hold() -> None:
    """What the provider accepted is counted over the time we were sending: a hold's silence is
    not the provider refusing."""
    pace = Pace(None)
    pace.take(0.0)
    _traffic(pace, *(i * 0.1 for i in range(1, 10)))  # 10/s until the hold
    pace.hold(1.6, now=1.0)
    assert pace.accepted(1.3) == pytest.approx(10.0)  # 7 over the 0.7 s of sending in the last second
    _traffic(pace, *(1.6 + i * 0.1 for i in range(1, 5)))  # 10/s again from the hold's end
    assert pace.accepted(2.0) == pytest.approx(10.0)  # 4 successes over the 0.4 s of sending


def test_a_cut_right_after_a_hold_does_not_compound() -> None:
    """A discovered rate refused again just after a hold is cut once, by DEEP (the last cut was not
    enough), from the rate itself: never from the hold's silence (nothing was measured), which
    would have driven it to the floor; a refusal for a call sent before that cut changes nothing."""
    pace = _discovered(20)
    rate = pace.rate
    pace.hold(12.0, now=2.5)
    assert pace.limited(12.05, sent_at=12.02) is True
    assert pace.rate == pytest.approx(rate * Pace.DEEP)
    assert pace.limited(12.06, sent_at=12.03) is False and pace.rate == pytest.approx(rate * Pace.DEEP)


def test_a_429_with_nothing_accepted_keeps_a_configured_rate_above_zero() -> None:
    """Refusals while nothing gets through trim a configured rate, down to a tenth of it at most."""
    pace = Pace(10)
    pace.take(0.0)
    for i in range(60):
        assert pace.limited(0.01 + 0.1 * i, sent_at=0.01 + 0.1 * i) is True
        assert pace.rate >= 1.0
    assert pace.rate == 1.0


def test_success_recovers_quickly_to_just_under_the_refused_level_then_probes() -> None:
    """After a cut, successes bring the rate back quickly to KNOWN of the refused level, then only
    by PROBE a second; without a refusal for FORGET seconds, back up to the configured rate."""
    pace = Pace(20)
    pace.take(0.0)
    _traffic(pace, *(3.0 + i * 0.1 for i in range(1, 11)))  # 10/s let in: the account allows 10, not 20
    pace.take(4.0)
    assert pace.limited(4.0, sent_at=4.0) is True
    assert pace.rate == pytest.approx(10 * Pace.CUT)
    t = 4.0
    for _ in range(200):
        t += 0.1
        pace.success(t)
    assert pace.rate == pytest.approx(10 * Pace.KNOWN, rel=0.05)  # not back up to 20
    assert pace.rate < 10
    t += Pace.FORGET
    for _ in range(2000):
        t += 0.05
        pace.success(t)
    assert pace.rate == 20


def test_success_reports_noticeable_changes_only() -> None:
    """success() is True when the rate moved >= 5% from the last rate shown, or reached the ceiling."""
    pace = Pace(10)
    pace.take(0.0)
    pace.limited(0.1, sent_at=0.0)
    shown, changes, t = pace.rate, 0, 100.0
    while pace.rate < 10:
        t += 0.01
        changed = pace.success(t)
        assert changed == (pace.rate == 10 or abs(pace.rate - shown) >= 0.05 * shown)
        if changed:
            shown, changes = pace.rate, changes + 1
    assert changes >= 2  # some noticeable step below the ceiling, then the ceiling itself
    assert pace.success(t + 0.01) is False  # at the ceiling and unchanged


# -- Pace: a discovered rate ---------------------------------------------------------------


def _discovered(per_second: int = 20) -> Pace:
    """An unlimited pace refused after two seconds of ``per_second`` successes."""
    pace = Pace(None)
    pace.take(0.0)
    _traffic(pace, *(i / per_second for i in range(1, 2 * per_second + 1)))
    assert pace.rate is None
    assert pace.limited(2.0, sent_at=2.0) is True
    return pace


def test_discovered_rate_below_accepted() -> None:
    """With no rps, the first measurable 429 sends at CUT of what got through in the last second."""
    pace = _discovered(20)
    assert pace.rate == pytest.approx(20 * Pace.CUT, rel=0.06)


def test_discovered_rate_paces() -> None:
    """Once discovered, the rate spaces calls like a configured one."""
    pace = _discovered(20)
    rate = pace.rate
    assert pace.reserve(2.0) == 0.0
    assert pace.reserve(2.0) == pytest.approx(1 / rate)


def test_discovered_rate_probes_slowly() -> None:
    """After discovery and the quick recovery, a second of successes raises the rate by PROBE of itself, quietly."""
    pace = _discovered(20)
    t = 2.0
    while pace.rate < pace._target - 1e-9:
        t += 0.05
        pace.success(t)
    before = pace.rate
    changes = [pace.success(t + (i + 1) / before) for i in range(round(before))]
    assert pace.rate == pytest.approx(before * (1 + Pace.PROBE), rel=1e-3)
    assert not any(changes)


@pytest.mark.parametrize("traffic", [[], [0.1, 0.2]])
def test_quota_429_leaves_rate_unlimited(traffic: list[float]) -> None:
    """A 429 when nothing got through in the last second is a quota: no rate is invented."""
    pace = Pace(None)
    pace.take(0.0)
    _traffic(pace, *traffic)
    assert pace.limited(5.0, sent_at=5.0) is False
    assert pace.rate is None
    assert pace.reserve(5.0) == 0.0


def test_slow_start_grows_by_the_clock_until_a_measured_429() -> None:
    """A first 429 too early to measure starts from what got through (calls still in flight count)
    and grows ~e-fold a second, never past twice what is being sent; a 429 too early to measure
    changes nothing; the next measured one settles at CUT of what was let in."""
    pace = Pace(None)
    for t in (0.0, 0.01, 0.02, 0.03, 0.04, 0.045):
        pace.take(t)
    pace.success(0.05)
    pace.success(0.06)
    assert pace.limited(0.1, sent_at=0.045, pending=3) is True
    assert pace.rate == pytest.approx(5.0)  # 2 answered + 3 in flight
    pace.take(0.12)
    assert pace.limited(0.15, sent_at=0.12) is False  # nothing measurable yet
    for t in (0.2, 0.3, 0.4, 0.5, 0.6):
        pace.take(t)
    pace.success(0.6)
    assert pace.rate == pytest.approx(5.0 * math.exp(0.5))  # 15/s sent: the cap (30/s) is far
    pace.hold(3.0, now=0.6)
    pace.take(3.05)
    pace.success(3.1)  # the hold's 2.4 s of silence grow nothing
    assert pace.rate == pytest.approx(5.0 * math.exp(0.5) * math.exp(0.1))
    _traffic(pace, *(3.1 + i * 0.05 for i in range(1, 13)))
    pace.take(3.66)
    assert pace.limited(3.7, sent_at=3.66) is True
    assert pace.rate == pytest.approx(pace.accepted(3.7) * Pace.CUT)
    assert not pace._slow_start


def test_slow_start_never_runs_far_ahead_of_what_is_sent() -> None:
    """A slow start whose calls are held back elsewhere (few in flight, slow answers) grows to at
    most twice the rate actually sent, so the refusal that ends it measures something."""
    pace = Pace(None)
    pace.take(0.0)
    pace.success(0.01)
    pace.limited(0.02, sent_at=0.0, pending=4)
    for i in range(1, 41):
        pace.take(i * 0.25)  # 4/s sent, whatever the rate allows
        pace.success(i * 0.25)
    assert pace.rate == pytest.approx(2 * pace.accepted(10.0)) and pace.rate <= 10.0


def test_queued_calls_released_late_keep_the_schedule() -> None:
    """A queued call taken a little late (timer jitter) does not push every later slot back."""
    pace = Pace(10)
    pace.take(0.0)
    for k in range(1, 101):
        pace.take(k * 0.1 + 0.002, queued=True)  # each release 2 ms late
    assert pace.delay(10.0) == pytest.approx(0.1)  # slot 101 is still due at 10.1 s
    drifting = Pace(10)
    drifting.take(0.0)
    for k in range(1, 101):
        drifting.take(k * 0.1 + 0.002 * k)  # a call that was not queued starts the spacing afresh
    assert drifting.delay(10.0) == pytest.approx(0.1 + 0.2)


def test_a_stalled_loop_does_not_let_a_burst_of_tokens_catch_up() -> None:
    """Token pacing at 200 tokens/s, calls of 80 tokens (0.4 s each): a call released 0.3 s late
    (the loop stood still) starts its span then, so the next waits its turn instead of going with it;
    a few milliseconds of timer lateness still keep the schedule."""
    pace = Pace(200, burst=100)
    pace.take(0.0, weight=80)
    due = 0.4 - 20 / 200  # the second call's slot: its span less what the burst leaves
    assert pace.delay(0.0, 80) == pytest.approx(due)
    pace.take(due + 0.3, queued=True, weight=80)  # a stall of 0.3 s
    assert pace.delay(due + 0.3, 80) == pytest.approx(0.3)  # a whole span on: not 0.1, catching up
    timely = Pace(200, burst=100)
    timely.take(0.0, weight=80)
    timely.take(due + 0.004, queued=True, weight=80)  # a timer 4 ms late
    assert timely.delay(due + 0.004, 80) == pytest.approx(0.4 - 0.004)  # the third slot stays at 0.7 s


def test_retry_after_ms_is_milliseconds() -> None:
    """Retry-After-Ms (OpenAI's header) is read as milliseconds, in any case."""
    assert _wait(retry_after_ms="1500") == 1.5
    assert retry_after(httpx.Headers({"Retry-After-Ms": "250"}), now=NOW) == 0.25


def test_retry_after_ms_preferred_over_retry_after() -> None:
    """With both headers, the more precise Retry-After-Ms wins; garbage in it falls back to Retry-After."""
    assert _wait(retry_after_ms="1200", retry_after="2") == 1.2
    assert _wait(retry_after_ms="soon", retry_after="2") == 2.0
    assert _wait(retry_after_ms="-5", retry_after="2") == 2.0


# -- window allowances ----------------------------------------------------------------------


def test_a_configured_window_holds_no_more_than_its_calls_in_any_span() -> None:
    """Allowance(3, 1.0): three calls at once, the fourth when the first is a span (1 s and a
    margin) old, whatever the alignment of the provider's windows."""
    allowance = Allowance(3, 1.0)
    for t in (0.0, 0.1, 0.2):
        assert allowance.delay(t) == 0.0
        allowance.take(t, 0.0)
    assert allowance.delay(0.3) == pytest.approx(allowance.span - 0.3)
    assert allowance.span == pytest.approx(1.0 / HEADROOM)
    allowance.take(allowance.span, 0.0)
    assert allowance.delay(allowance.span) == pytest.approx(0.1 + allowance.span - allowance.span)


def test_a_learnt_allowance_is_what_the_window_let_in_before_its_first_refusal() -> None:
    """A long-hinted refusal: the calls of the window sent before the refused one are its
    allowance (the fewest, over the window's refused calls: they arrive in any order); the next
    window (opened by the hold's end) sends nine tenths of it freely, then one at a time."""
    allowance = Allowance()
    for i in range(12):
        allowance.take(i * 0.01, 0.0)
    allowance.refused(sent_at=0.11)  # the 12th call: 11 went before it
    allowance.refused(sent_at=0.10)  # the 11th, answered later: 10 went before it
    assert allowance.limit == 10
    for i in range(9):  # the window opens when the hold (until 5.0) has ended
        allowance.take(5.0 + i * 0.01, 5.0)
    assert allowance.single_file()  # nine sent: the last tenth goes one at a time


def test_a_call_let_in_past_a_learnt_allowance_doubles_it() -> None:
    """An allowance read too low (a window partly used before): the call sent one at a time past
    it is let in, so the allowance doubles and the calls stop going one at a time."""
    allowance = Allowance()
    for i in range(5):
        allowance.take(i * 0.01, 0.0)
    allowance.refused(sent_at=0.04)
    assert allowance.limit == 4
    for i in range(5):
        allowance.take(5.0 + i * 0.01, 5.0)
    assert allowance.single_file()
    allowance.let_in(sent_at=5.03)  # the 4th: within the allowance, says nothing
    assert allowance.limit == 4
    allowance.let_in(sent_at=5.04)  # the 5th, past it
    assert allowance.limit == 10
