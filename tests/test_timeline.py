"""A provider's history over a run: cumulative counters become calls per bucket, bounded however
long the run; limits carry through gaps; holds and downs become merged, bounded spans."""

from __future__ import annotations

import asyncio
import math
import random
import re
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb
from playbook.providers.provider import governor
from playbook.providers.sends import Sends
from playbook.runtime.state.timeline import ProviderSeries, Timeline
from playbook.runtime.state.upstream import ProviderView, provider_view
from playbook.ui.svg import provider_chart

T0 = 1_700_000_000.0  # an epoch second: the timeline never reads the clock


def view(
    name: str = "acme",
    *,
    sent: int = 0,
    refused: int = 0,
    failed: int = 0,
    rate: float | None = None,
    held: bool = False,
    hold_until_at: float = 0.0,
    down: bool = False,
    tokens: float = 0.0,
    tpm: float | None = None,
    in_flight: int = 0,
) -> ProviderView:
    return ProviderView(
        name=name,
        down=down,
        down_error="boom" if down else None,
        probe_at=0.0,
        held=held,
        hold_until_at=hold_until_at,
        last_status=None,
        rate=rate,
        in_flight_limit=None,
        in_flight=in_flight,
        refused=refused,
        tokens=tokens,
        tpm=tpm,
        sent=sent,
        failed=failed,
    )


def only(timeline: Timeline, name: str = "acme") -> ProviderSeries:
    (series,) = [s for s in timeline.series() if s.provider == name]
    return series


def test_first_sample_is_the_baseline() -> None:
    """Counters a provider brought from earlier runs count nothing; what it does afterwards counts."""
    tl = Timeline()
    tl.sample(T0, {"acme": view(sent=1000, refused=40, failed=7)})
    assert only(tl).accepted == [0] and only(tl).refused == [0] and only(tl).failed == [0]
    tl.sample(T0 + 0.5, {"acme": view(sent=1005, refused=41, failed=7)})
    s = only(tl)
    assert (s.accepted, s.refused, s.failed) == ([4], [1], [0])
    assert s.start == T0 and s.end == T0 + 0.5 and s.width == 1.0


def test_irregular_samples_count_into_the_bucket_of_their_time() -> None:
    """Each sample's differences land in bucket int((wall - start) / width); unsampled buckets hold 0."""
    tl = Timeline(width=2.0)
    sent = refused = failed = 0
    steps = [(0.0, 0, 0, 0), (0.3, 3, 0, 0), (1.9, 2, 1, 0), (4.1, 6, 0, 2), (4.2, 1, 0, 0), (11.0, 5, 2, 1)]
    for t, ds, dr, df in steps:
        sent, refused, failed = sent + ds, refused + dr, failed + df
        tl.sample(T0 + t, {"acme": view(sent=sent, refused=refused, failed=failed)})
    s = only(tl)
    # buckets of 2 s: [0,2) gets 3 + (2-1); [4,6) gets (6-2) + 1; [10,12) gets 5-2-1
    assert s.accepted == [4, 0, 5, 0, 0, 2]
    assert s.refused == [1, 0, 0, 0, 0, 2]
    assert s.failed == [0, 0, 2, 0, 0, 1]


def test_accepted_is_never_negative() -> None:
    """Failures counted without a send (the limiter itself failed) do not make accepted negative."""
    tl = Timeline()
    tl.sample(T0, {"acme": view(sent=10)})
    tl.sample(T0 + 0.1, {"acme": view(sent=11, failed=3)})
    s = only(tl)
    assert s.accepted == [0] and s.failed == [3]


def test_counters_going_back_count_nothing_then_resume() -> None:
    """A provider object replaced mid-run restarts its counters: the drop counts 0, later rises count."""
    tl = Timeline()
    tl.sample(T0, {"acme": view(sent=100, refused=10)})
    tl.sample(T0 + 1, {"acme": view(sent=40, refused=2)})
    tl.sample(T0 + 2, {"acme": view(sent=45, refused=3)})
    s = only(tl)
    assert s.accepted == [0, 0, 4] and s.refused == [0, 0, 1]


def test_full_buckets_halve_and_the_width_doubles() -> None:
    """A sample past the last bucket merges adjacent pairs (counts add, the later rate wins)."""
    tl = Timeline(buckets=4, width=1.0)
    for i in range(5):  # t = 0..4: bucket i gets i calls, rate i
        tl.sample(T0 + i, {"acme": view(sent=sum(range(i + 1)), rate=float(i))})
    s = only(tl)
    assert s.width == 2.0
    assert s.accepted == [0 + 1, 2 + 3, 4]
    assert s.rate == [1.0, 3.0, 4.0]
    for i in range(5, 17):  # t = 16 falls past 4 buckets of 2 s: width 8
        tl.sample(T0 + i, {"acme": view(sent=sum(range(i + 1)), rate=float(i))})
    s = only(tl)
    assert s.width == 8.0
    assert s.accepted == [sum(range(8)), sum(range(8, 16)), 16]
    assert s.rate == [7.0, 15.0, 16.0]


def test_a_long_run_stays_bounded_and_conserves_every_call() -> None:
    """100,000 s sampled every 2.5 s: at most 120 buckets, and the buckets add up to the counters' rise
    (40,000 samples rebucket it as often as a panel's every 0.5 s would: the widths double alike)."""
    rng = random.Random(7)
    tl = Timeline()
    sent, refused, failed = 5000, 300, 20  # a provider object with history
    tl.sample(T0, {"acme": view(sent=sent, refused=refused, failed=failed)})
    first = (sent, refused, failed)
    for k in range(1, 40_001):
        r, f = rng.randrange(3) == 0, rng.randrange(50) == 0
        sent += rng.randrange(6) + r + f
        refused += r
        failed += f
        tl.sample(T0 + k * 2.5, {"acme": view(sent=sent, refused=refused, failed=failed, rate=float(k % 7))})
    s = only(tl)
    assert len(s.accepted) <= Timeline.BUCKETS and len(s.rate) == len(s.tokens) == len(s.accepted)
    assert s.width == 1024.0  # 100,000 s / 120 buckets is 833 s: the first power of two past it
    assert len(s.accepted) == math.floor(100_000 / 1024) + 1
    assert sum(s.refused) == refused - first[1] and sum(s.failed) == failed - first[2]
    assert sum(s.accepted) == (sent - first[0]) - (refused - first[1]) - (failed - first[2])
    assert s.rate[-1] == float(40_000 % 7) and s.end == T0 + 100_000


def test_rate_and_tokens_carry_forward_through_gaps() -> None:
    """Buckets no sample saw keep the last known rate and tokens, so the line has no holes."""
    tl = Timeline()
    tl.sample(T0, {"acme": view(rate=5.0, tokens=1200.0, tpm=30_000.0)})
    tl.sample(T0 + 6.2, {"acme": view(rate=8.0, tokens=900.0, tpm=40_000.0)})
    s = only(tl)
    assert s.rate == [5.0] * 6 + [8.0]
    assert s.tokens == [1200.0] * 6 + [900.0]
    assert s.tpm == 40_000.0


def test_a_provider_first_seen_late_shares_the_buckets() -> None:
    """A provider first seen later is a baseline there: zeros and no rate before, the same bucket grid."""
    tl = Timeline()
    tl.sample(T0, {"a": view("a", rate=2.0)})
    tl.sample(T0 + 3, {"a": view("a", sent=6, rate=2.0), "b": view("b", sent=500, rate=9.0)})
    tl.sample(T0 + 4, {"a": view("a", sent=8, rate=2.0), "b": view("b", sent=503, rate=9.0)})
    tl.sample(T0 + 7, {"a": view("a", sent=9, rate=2.0)})
    a, b = tl.series()
    assert (a.provider, b.provider) == ("a", "b")
    assert a.accepted == [0, 0, 0, 6, 2, 0, 0, 1]
    assert b.accepted == [0, 0, 0, 0, 3, 0, 0, 0]
    assert b.rate == [None, None, None, 9.0, 9.0, 9.0, 9.0, 9.0]
    assert a.start == b.start == T0 and a.end == b.end == T0 + 7


def test_a_hold_is_a_span_to_its_end_and_an_early_lift_shortens_it() -> None:
    """A held view is a span [wall, hold_until_at]; the sample that sees it lifted early ends it there."""
    tl = Timeline()
    tl.sample(T0 + 10, {"acme": view(held=True, hold_until_at=T0 + 70)})
    assert only(tl).spans == [(T0 + 10, T0 + 70, "hold")]
    for t in range(11, 20):
        tl.sample(T0 + t, {"acme": view(held=True, hold_until_at=T0 + 70)})
    tl.sample(T0 + 20, {"acme": view()})
    assert only(tl).spans == [(T0 + 10, T0 + 20, "hold")]
    tl.sample(T0 + 40, {"acme": view(held=True, hold_until_at=T0 + 45)})
    tl.sample(T0 + 50, {"acme": view()})  # it ran out by itself: the span keeps its end
    assert only(tl).spans == [(T0 + 10, T0 + 20, "hold"), (T0 + 40, T0 + 45, "hold")]


def test_a_hold_set_again_moves_its_end() -> None:
    """While held, the span ends where the hold now ends (a new 429 extends it)."""
    tl = Timeline()
    tl.sample(T0, {"acme": view(held=True, hold_until_at=T0 + 30)})
    tl.sample(T0 + 5, {"acme": view(held=True, hold_until_at=T0 + 90)})
    assert only(tl).spans == [(T0, T0 + 90, "hold")]


def test_a_hold_whose_end_has_passed_is_no_span() -> None:
    """A view still flagged held with hold_until_at behind the sample is not held."""
    tl = Timeline()
    tl.sample(T0 + 10, {"acme": view(held=True, hold_until_at=T0 + 5)})
    assert only(tl).spans == []


def test_down_spans_grow_while_down_and_touching_spans_merge() -> None:
    """Down is [first, last] sample seen down; a span starting within a bucket of the last merges into it."""
    tl = Timeline(width=1.0)
    for t in (5.0, 6.0, 7.0):
        tl.sample(T0 + t, {"acme": view(down=True)})
    tl.sample(T0 + 7.5, {"acme": view()})
    tl.sample(T0 + 7.8, {"acme": view(down=True)})  # 0.8 s after the last: the same outage
    tl.sample(T0 + 8.4, {"acme": view()})
    tl.sample(T0 + 30, {"acme": view(down=True)})
    tl.sample(T0 + 31, {"acme": view(held=True, hold_until_at=T0 + 40)})
    tl.sample(T0 + 40.5, {"acme": view(held=True, hold_until_at=T0 + 50)})  # within a bucket of the last hold
    assert only(tl).spans == [
        (T0 + 5, T0 + 7.8, "down"),
        (T0 + 30, T0 + 30, "down"),
        (T0 + 31, T0 + 50, "hold"),
    ]


def test_spans_stay_bounded_and_still_cover_every_hold_and_down() -> None:
    """Past ``buckets`` spans the closest of a kind merge: never more than ``buckets``, each still inside one."""
    tl = Timeline(buckets=10, width=1.0)
    holds, downs = [], []
    for k in range(8):  # within the first 10 s, so the width stays 1 s; same-kind spans 1.1 s apart
        t = T0 + 1.2 * k
        holds.append((t, t + 0.1))
        tl.sample(t, {"acme": view(held=True, hold_until_at=t + 0.1)})
        tl.sample(t + 0.1, {"acme": view()})
        downs.append((t + 0.6, t + 0.6))
        tl.sample(t + 0.6, {"acme": view(down=True)})
        tl.sample(t + 0.7, {"acme": view()})
    s = only(tl)
    assert s.width == 1.0 and len(s.spans) == 10  # 16 spans seen
    for kind, seen in (("hold", holds), ("down", downs)):
        assert all(any(a <= h0 and h1 <= b for a, b, k in s.spans if k == kind) for h0, h1 in seen)
    assert s.spans == sorted(s.spans)


def test_non_finite_times_are_ignored_and_bad_arguments_refused() -> None:
    """A NaN or infinite wall adds nothing (an infinite one would otherwise halve forever)."""
    tl = Timeline()
    tl.sample(T0, {"acme": view(sent=1)})
    tl.sample(math.inf, {"acme": view(sent=5)})
    tl.sample(math.nan, {"acme": view(sent=5)})
    assert only(tl).accepted == [0] and only(tl).end == T0
    with pytest.raises(ValueError, match="width"):
        Timeline(width=0)
    with pytest.raises(ValueError, match="buckets"):
        Timeline(buckets=1)
    assert Timeline().series() == []


def test_provider_view_counts_what_a_real_provider_sent_and_what_failed(demo, store) -> None:
    """After real calls to the demo provider, the view's sent and failed match the server's counts,
    and a timeline fed those views accounts for every call."""
    demo.reset(fault_every=3, fault_status=500, miss_rate=0.0)
    provider = pb.Provider("acme", retries=6)
    tool = pb.demo.email_tool(demo, provider=provider, name="acme.email")
    tl = Timeline()
    tl.sample(T0, {"acme": provider_view(provider)})
    frame = pd.DataFrame(
        {"domain": [f"company{i}.com" for i in range(8)], "first": [f"P{i}" for i in range(8)]}
    )
    out = frame.play.map(tool, store=store, progress=False, concurrency=2)

    assert out["play_status"].tolist() == ["ok"] * 8
    seen = provider_view(provider)
    stats = demo.stats()
    assert stats["by_status"]["500"] >= 1
    assert seen.sent == stats["requests"] == provider.status().sent
    assert seen.failed == stats["by_status"]["500"] == provider.status().failed
    assert seen.refused == stats["by_status"].get("429", 0)
    tl.sample(T0 + 3, {"acme": seen})
    s = only(tl)
    assert sum(s.accepted) == stats["by_status"]["200"] == 8 and sum(s.failed) == seen.failed


def test_a_call_in_flight_at_a_sample_counts_when_its_answer_is_known() -> None:
    """A call sent before a sample and refused after it is a 429, not an accepted call; a provider
    that failed every call it was sent accepted none."""
    tl = Timeline()
    tl.sample(T0, {"acme": view(), "dead": view()})
    tl.sample(T0 + 1, {"acme": view(sent=3, in_flight=3), "dead": view(sent=5, in_flight=2, failed=3)})
    tl.sample(
        T0 + 2, {"acme": view(sent=4, in_flight=1, refused=2, failed=0), "dead": view(sent=5, failed=5)}
    )
    tl.sample(T0 + 3, {"acme": view(sent=4, refused=2), "dead": view(sent=5, failed=5)})
    acme, dead = only(tl), only(tl, "dead")
    assert (acme.accepted, acme.refused) == ([0, 0, 1, 1], [0, 0, 2, 0])
    assert (dead.accepted, dead.failed) == ([0, 0, 0, 0], [0, 3, 2, 0])


# -- the peak, counted as the limit is ----------------------------------------------------------


def _label(series: ProviderSeries) -> tuple[float, float]:
    """(peak, limit) in calls per second, as the chart's text line says them."""
    found = re.search(
        r"peak ([\d.,]+)/s · limit ([\d.,]+)/s", "".join(ET.fromstring(provider_chart(series)).itertext())
    )
    assert found, provider_chart(series)
    return float(found[1].replace(",", "")), float(found[2].replace(",", ""))


def test_a_paced_run_never_shows_a_peak_above_its_limit() -> None:
    """Calls paced at rps=40 whose answers come back bunched (slow ones, then fast ones) never
    read as a peak over the limit: the peak counts sends per second, as the provider does."""
    provider = pb.Provider("paced", rps=40)
    gov = governor(provider)
    tl = Timeline()
    rng = random.Random(7)

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def call(i: int) -> None:
            async def send() -> int:
                await asyncio.sleep(0.45 if (i // 20) % 2 == 0 else rng.uniform(0.01, 0.05))  # answers bunch
                return i

            await gov.dispatch(send)

        calls = asyncio.gather(*(call(i) for i in range(400)))
        while not calls.done():
            tl.sample(T0 + loop.time(), {"paced": provider_view(provider)})
            await asyncio.sleep(0.25 + rng.uniform(0, 0.2))  # a sampler that is sometimes late
        tl.sample(T0 + loop.time(), {"paced": provider_view(provider)})
        await calls

    run_virtual(main())
    s = only(tl, "paced")
    assert sum(s.accepted) == 400
    peak, limit = _label(s)
    assert peak <= limit == 40, (peak, limit)


def test_a_real_breach_still_shows_as_a_peak_above_the_limit() -> None:
    """45 calls sent within a second under a 39.2/s pace read as a peak of 45 over a limit of 40;
    the same 45 spread over two seconds read as 23."""
    for times, most in (([i * 0.02 for i in range(45)], 45), ([i * 2 / 45 for i in range(45)], 23)):
        sends = Sends()
        for t in times:
            sends.note(100.0 + t)
        tl = Timeline()
        tl.sample(T0, {"acme": view(rate=39.2)})
        tl.sample(T0 + 2, {"acme": view(sent=45, rate=39.2)._replace(busiest=sends.busiest)})
        assert _label(only(tl)) == (most, 40)


def test_sends_count_a_sliding_second_and_forget_old_peaks() -> None:
    """Calls exactly 1/39.2 s apart hold 40 in a second; a window is (now - 1, now]; a busy second
    more than RECENT seconds before the latest call no longer counts."""
    sends = Sends()
    for i in range(200):
        sends.note(i / 39.2)
    assert sends.busiest == 40 and sends.count == 200
    for t in (0.0, 0.5, 1.0):  # at 1.0 the call at 0.0 has left the window
        late = Sends()
        for _ in range(3):
            late.note(10.0)
        late.note(10.0 + t)
        assert late.busiest == (4 if t < 1.0 else 3)
    late.note(10.0 + 1.0 + Sends.RECENT + 0.1)
    assert late.busiest == 1
