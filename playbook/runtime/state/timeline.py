"""Each provider's history over a run, bounded whatever the run's length, for a picture to draw.

The run's state samples the providers' :class:`ProviderView` snapshots (as a provider is held,
lifted, down or up, a few times a second while calls go out, and when a view asks for the
history); :class:`Timeline` turns their cumulative counters into calls per time bucket, keeps the
rate limit and tokens each bucket saw, and the spans a provider was held or down.  At most
``buckets`` buckets: a sample past the last one halves the resolution (adjacent pairs merge, the
bucket width doubles), so a week-long run costs what a minute-long one does.  Time is always given,
never read: tests run in virtual time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from playbook.runtime.state.upstream import ProviderView

__all__ = ["ProviderSeries", "Timeline"]


class ProviderSeries(NamedTuple):
    """One provider over the run, as a picture draws it (times in epoch seconds)."""

    provider: str
    start: float  # epoch seconds where bucket 0 begins
    width: float  # seconds per bucket
    accepted: list[int]  # calls the provider accepted in each bucket (sent - 429s - transient failures)
    refused: list[int]  # 429s in each bucket
    failed: list[int]  # transient failures (5xx, timeouts, connection errors) in each bucket
    rate: list[float | None]  # its rate limit (calls/s) when the bucket last saw it; None: unlimited/unknown
    tokens: list[float]  # tokens answered over the last minute, as last seen in the bucket (LLM tools)
    tpm: float | None  # its tokens-per-minute limit as last seen; None: none
    spans: list[tuple[float, float, str]]  # (start, end, kind) with kind "hold" or "down", merged, bounded
    end: float  # epoch seconds of the last sample
    # The most calls sent within one second as the bucket saw it, counted when they went (as the
    # provider and the pace count), not when answered; all 0: not known (a cluster's merged view).
    busiest: Sequence[int] = ()


class _Track:
    """One provider's buckets and spans; the timeline owns the bucket grid they share."""

    __slots__ = (
        "accepted",
        "busiest",
        "down",
        "downs",
        "failed",
        "held",
        "holds",
        "last",
        "name",
        "rate",
        "refused",
        "tokens",
        "tpm",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        # (sent, accepted, refused, failed) at the previous sample
        self.last: tuple[int, int, int, int] | None = None
        self.accepted: list[int] = []
        self.refused: list[int] = []
        self.failed: list[int] = []
        self.busiest: list[int] = []
        self.rate: list[float | None] = []
        self.tokens: list[float] = []
        self.tpm: float | None = None
        # Spans as [start, end] per kind, in time order; the last one is live while ``held``/``down``.
        self.holds: list[list[float]] = []
        self.downs: list[list[float]] = []
        self.held = False
        self.down = False

    def grow(self, n: int) -> None:
        """Buckets up to ``n``; empty ones carry the last rate and tokens, so a line has no holes."""
        missing = n - len(self.accepted)
        if missing <= 0:
            return
        rate = self.rate[-1] if self.rate else None
        tokens = self.tokens[-1] if self.tokens else 0.0
        self.accepted += [0] * missing
        self.refused += [0] * missing
        self.failed += [0] * missing
        self.busiest += [0] * missing
        self.rate += [rate] * missing
        self.tokens += [tokens] * missing

    def halve(self) -> None:
        """Merge adjacent pairs of buckets: counts add up, the rate and tokens are the later one's."""
        self.accepted = _pairs(self.accepted)
        self.refused = _pairs(self.refused)
        self.failed = _pairs(self.failed)
        self.busiest = [max(self.busiest[i : i + 2]) for i in range(0, len(self.busiest), 2)]
        self.rate = self.rate[1::2] + self.rate[-1:] * (len(self.rate) % 2)
        self.tokens = self.tokens[1::2] + self.tokens[-1:] * (len(self.tokens) % 2)


def _pairs(counts: list[int]) -> list[int]:
    return [sum(counts[i : i + 2]) for i in range(0, len(counts), 2)]


class Timeline:
    """Providers' calls, refusals, failures, limits and hold/down spans over a run, in at most
    ``buckets`` buckets of ``width`` seconds (doubled as often as the run's length needs)."""

    BUCKETS = 120

    __slots__ = ("_buckets", "_end", "_n", "_start", "_tracks", "_width")

    def __init__(self, *, buckets: int = BUCKETS, width: float = 1.0) -> None:
        if buckets < 2:
            raise ValueError(f"buckets must be 2 or more; got {buckets!r}")
        if not (width > 0 and math.isfinite(width)):
            raise ValueError(f"width must be a positive number of seconds; got {width!r}")
        self._buckets = buckets
        self._width = float(width)
        self._start: float | None = None
        self._end = 0.0
        self._n = 0  # buckets in use: up to the latest sample's
        self._tracks: dict[str, _Track] = {}

    def __repr__(self) -> str:
        return f"<Timeline providers={len(self._tracks)} buckets={self._n}/{self._buckets} width={self._width:g}s>"

    def sample(self, wall: float, views: Mapping[str, ProviderView]) -> None:
        """Count what each provider did since its previous sample into the bucket of ``wall``."""
        if not math.isfinite(wall):
            return
        if self._start is None:
            self._start = self._end = wall
        i = self._index(wall)
        self._end = max(self._end, wall)
        self._n = max(self._n, i + 1)
        for name, view in views.items():
            track = self._tracks.get(name)
            if track is None:
                track = self._tracks[name] = _Track(name)
            self._count(track, i, view)
            self._spans(track, wall, view)

    def series(self) -> list[ProviderSeries]:
        """Every provider seen, in the order first seen, over the same buckets."""
        out = []
        for track in self._tracks.values():
            track.grow(self._n)
            spans = [(a, b, "hold") for a, b in track.holds] + [(a, b, "down") for a, b in track.downs]
            spans.sort()
            out.append(
                ProviderSeries(
                    provider=track.name,
                    start=self._start or 0.0,
                    width=self._width,
                    accepted=list(track.accepted),
                    refused=list(track.refused),
                    failed=list(track.failed),
                    rate=list(track.rate),
                    tokens=list(track.tokens),
                    tpm=track.tpm,
                    spans=spans,
                    end=self._end,
                    busiest=list(track.busiest),
                )
            )
        return out

    # -- buckets -------------------------------------------------------------------------------

    def _index(self, wall: float) -> int:
        """The bucket of ``wall``, halving the resolution until it fits."""
        assert self._start is not None
        # a sample from before the start counts in the first
        i = max(int((wall - self._start) / self._width), 0)
        while i >= self._buckets:
            for track in self._tracks.values():
                track.halve()
            self._width *= 2
            self._n = (self._n + 1) // 2
            i = max(int((wall - self._start) / self._width), 0)
        return i

    def _count(self, track: _Track, i: int, view: ProviderView) -> None:
        track.grow(i + 1)
        # Accepted: answered (sent, and no longer in flight), neither refused nor failed.  A call in
        # flight at a sample is not counted yet: its answer may still be a 429.
        accepted = view.sent - view.in_flight - view.refused - view.failed
        now = (view.sent, accepted, view.refused, view.failed)
        last = track.last
        track.last = now
        # The first sample is the baseline (a provider's counters span the process); a count that
        # went back belongs to a provider object replaced since: it is the baseline again.
        if last is not None and view.sent >= last[0]:
            gained, refused, failed = (max(b - a, 0) for a, b in zip(last[1:], now[1:]))
            track.accepted[i] += gained
            track.refused[i] += refused
            track.failed[i] += failed
            if view.sent > last[0]:  # a peak only from calls sent since: an earlier run's has gone by then
                track.busiest[i] = max(track.busiest[i], view.busiest)
            # calls in flight can dip the accepted count for a moment: it is kept at its highest
            track.last = (view.sent, max(accepted, last[1]), view.refused, view.failed)
        track.rate[i] = view.rate
        track.tokens[i] = view.tokens
        track.tpm = view.tpm

    # -- spans ---------------------------------------------------------------------------------

    def _spans(self, track: _Track, wall: float, view: ProviderView) -> None:
        held = view.held and view.hold_until_at > wall
        if held:
            if track.held:
                track.holds[-1][1] = max(view.hold_until_at, track.holds[-1][0])  # the hold as it stands now
            else:
                self._open(track, track.holds, wall, view.hold_until_at)
        elif track.held:
            span = track.holds[-1]
            span[1] = max(min(span[1], wall), span[0])  # lifted early: it ended by this sample
        track.held = held
        if view.down:
            if track.down:
                track.downs[-1][1] = max(track.downs[-1][1], wall)
            else:
                self._open(track, track.downs, wall, wall)
        track.down = view.down

    def _open(self, track: _Track, spans: list[list[float]], start: float, end: float) -> None:
        """A new span, merged into the previous one of its kind when they touch (within a bucket)."""
        if spans and start - spans[-1][1] <= self._width:
            spans[-1][1] = max(spans[-1][1], end)
            return
        spans.append([start, end])
        if len(track.holds) + len(track.downs) > self._buckets:
            # Too many to keep: merge the closest pair of one kind.  The last span of a kind stays
            # last, so a live hold or down is still the one a later sample extends.
            gaps = [
                (s[j + 1][0] - s[j][1], k, j)
                for k, s in enumerate((track.holds, track.downs))
                for j in range(len(s) - 1)
            ]
            _, k, j = min(gaps)
            closest = (track.holds, track.downs)[k]
            closest[j][1] = max(closest[j][1], closest[j + 1][1])
            del closest[j + 1]
