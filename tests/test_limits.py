"""The governor's exact primitives: reading wait headers, backoff, GCRA pacing and AIMD."""

from __future__ import annotations

import random
from email.utils import formatdate

import httpx
import pytest

from playbook.limits import Backoff, Pace, retry_after

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


def _cut_once(ceiling: float = 10) -> Pace:
    """A configured pace cut once before a second of traffic: trimmed to 0.9 of the ceiling."""
    pace = Pace(ceiling)
    pace.take(0.0)
    assert pace.limited(0.1, sent_at=0.0) is True
    return pace


def test_limited_cuts_once_per_round() -> None:
    """A 429 cuts the rate; a 429 for a call sent before that cut does not cut again."""
    pace = Pace(10)
    pace.take(0.0)
    assert pace.limited(0.5, sent_at=0.4) is True
    assert pace.rate == pytest.approx(9.0)  # unmeasured: a configured rate is trimmed by CUT
    assert pace.limited(0.6, sent_at=0.45) is False
    assert pace.rate == pytest.approx(9.0)
    assert pace.limited(0.7, sent_at=0.55) is True  # sent after the cut: a new round
    assert pace.rate == pytest.approx(8.1)


def test_limited_uses_accepted_rate_once_measured() -> None:
    """After a second of traffic, a cut sends at 0.9 of what the provider accepted in the last second."""
    pace = Pace(10)
    pace.take(0.0)
    for i in range(1, 7):
        pace.success(1.0 + i * 0.15)  # 6 successes within the last second
    assert pace.limited(2.0, sent_at=1.95) is True
    assert pace.rate == pytest.approx(6 * 0.9)


def test_success_recovers_additively_to_the_ceiling() -> None:
    """Each success adds RECOVER of the ceiling per second's worth of calls; never past the ceiling."""
    pace = _cut_once()
    pace.success(0.2)
    assert pace.rate == pytest.approx(9.0 + 0.05 * 10 / 9.0)
    for i in range(1000):
        pace.success(0.3 + i * 0.01)
        assert pace.rate <= 10
    assert pace.rate == 10


def test_success_reports_noticeable_changes_only() -> None:
    """success() is True when the rate moved >= 5% from the last rate shown, or reached the ceiling."""
    pace = _cut_once()
    shown, changes = 9.0, 0
    while pace.rate < 10:
        changed = pace.success(0.2)
        assert changed == (pace.rate == 10 or abs(pace.rate - shown) >= 0.05 * shown)
        if changed:
            shown, changes = pace.rate, changes + 1
    assert changes >= 2  # some noticeable step below the ceiling, then the ceiling itself
    assert pace.success(0.3) is False  # at the ceiling and unchanged


def test_never_cut_below_floor() -> None:
    """However many rounds of 429s, a configured rate stays at or above a tenth of itself."""
    pace = Pace(10)
    pace.take(0.0)
    for i in range(40):
        assert pace.limited(0.01 * i, sent_at=0.01 * i) is True
        assert pace.rate >= 1.0
    assert pace.rate == 1.0


# -- Pace: a discovered rate ---------------------------------------------------------------


def _discovered(per_second: int = 20) -> Pace:
    """An unlimited pace refused after two seconds of ``per_second`` successes."""
    pace = Pace(None)
    pace.take(0.0)
    for i in range(2 * per_second):
        pace.success(i / per_second)
    assert pace.rate is None
    assert pace.limited(2.0, sent_at=2.0) is True
    return pace


def test_discovered_rate_below_accepted() -> None:
    """With no rps, the first 429 after a second of traffic sends at 0.9 of the last second's successes."""
    pace = _discovered(20)
    assert pace.rate == pytest.approx(20 * 0.9)


def test_discovered_rate_paces() -> None:
    """Once discovered, the rate spaces calls like a configured one."""
    pace = _discovered(20)
    rate = pace.rate
    assert pace.reserve(2.0) == 0.0
    assert pace.reserve(2.0) == pytest.approx(1 / rate)


def test_discovered_rate_probes_slowly() -> None:
    """After discovery, a second of successes raises the rate by PROBE (0.2%) of itself, quietly."""
    pace = _discovered(20)
    before = pace.rate
    changes = [pace.success(2.0 + i / before) for i in range(round(before))]
    assert pace.rate == pytest.approx(before * (1 + Pace.PROBE))
    assert not any(changes)


def test_discovered_rate_halved_when_unmeasured() -> None:
    """A 429 on a discovered rate with no successes in the last second halves it (down to the floor)."""
    pace = _discovered(20)
    rate = pace.rate
    assert pace.limited(10.0, sent_at=10.0) is True
    assert pace.rate == pytest.approx(rate / 2)
    for t in range(11, 30):
        pace.limited(float(t), sent_at=float(t))
    assert pace.rate == pace.floor == 0.5


@pytest.mark.parametrize("traffic", [[], [0.1, 0.2]])
def test_quota_429_leaves_rate_unlimited(traffic: list[float]) -> None:
    """A 429 when nothing got through in the last second is a quota: no rate is invented."""
    pace = Pace(None)
    pace.take(0.0)
    for t in traffic:
        pace.success(t)
    assert pace.limited(5.0, sent_at=5.0) is False
    assert pace.rate is None
    assert pace.reserve(5.0) == 0.0


def test_slow_start_grows_fast_until_next_429() -> None:
    """A first 429 inside the first second starts a slow start (+1 per success, ~e-fold a second);
    the next 429 settles at 0.9 of what was accepted, and then the rate only probes."""
    pace = Pace(None)
    pace.take(0.0)
    for t in (0.1, 0.2, 0.3, 0.4):
        pace.success(t)
    assert pace.limited(0.5, sent_at=0.5) is True
    assert pace.rate == pytest.approx(4.0)  # what got through so far
    for i in range(10):
        pace.success(0.6 + 0.05 * i)
    assert pace.rate == pytest.approx(4.0 + 10)
    assert pace.limited(1.2, sent_at=1.2) is True  # 13 successes in (0.2, 1.2]
    assert pace.rate == pytest.approx(13 * 0.9)
    pace.success(1.3)
    assert pace.rate == pytest.approx(13 * 0.9 + Pace.PROBE)


def test_a_429_inside_the_first_second_keeps_the_slow_start() -> None:
    """Within the first second nothing is measured yet: a second 429 halves the rate and the slow start goes on."""
    pace = Pace(None)
    pace.take(0.0)
    for t in (0.1, 0.2, 0.3, 0.4):
        pace.success(t)
    pace.limited(0.5, sent_at=0.5)  # slow start from 4/s
    pace.success(0.6)
    assert pace.limited(0.8, sent_at=0.8) is True
    assert pace.rate == pytest.approx(5 / 2)
    pace.success(0.9)
    assert pace.rate == pytest.approx(5 / 2 + 1)  # still +1 per success


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
