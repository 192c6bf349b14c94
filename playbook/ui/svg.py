"""Small inline SVG pictures of a run: a status bar of its rows and a chart per provider.

They live in HTML that JupyterLab (light or dark), VS Code and saved notebooks on GitHub or
nbviewer show; the last may strip ``<style>`` and ``style=``.  So each coloured element carries
both a presentation attribute (``fill="#388e3c"``: reads on a white page with no stylesheet)
and a class that :func:`svg_style` maps to a JupyterLab theme variable, which wins when present.
Coordinates are whole pixels or one decimal, one ``<path>`` per series: a 120-bucket chart with
every series busy stays under 4,000 characters: a live panel may send it on every refresh.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import NamedTuple, TypeVar

from playbook._internal.words import duration, short_count
from playbook.runtime.state.reading import ProviderSeries

__all__ = ["STATUSES", "provider_chart", "status_bar", "svg_rules", "svg_style"]

STATUSES = ("ok", "reused", "failed", "waiting", "parked", "skipped")

# class -> (the property it colours, the JupyterLab variable, the fallback on a white page)
_PALETTE: dict[str, tuple[str, str, str]] = {
    "pb-ok": ("fill", "--jp-success-color1", "#388e3c"),
    # success-color2, not 3: green-100 is barely visible on white or against the grey track.
    "pb-reused": ("fill", "--jp-success-color2", "#81c784"),
    "pb-failed": ("fill", "--jp-error-color1", "#d32f2f"),
    "pb-waiting": ("fill", "--jp-warn-color2", "#ffb74d"),
    "pb-parked": ("fill", "--jp-warn-color0", "#e65100"),
    "pb-skipped": ("fill", "--jp-layout-color4", "#757575"),
    # layout-color2 for the track: in the dark theme layout-color3 (#616161) is next to skipped's #757575.
    "pb-rest": ("fill", "--jp-layout-color2", "#e0e0e0"),
    "pb-text": ("fill", "--jp-ui-font-color2", "#757575"),
    "pb-429": ("fill", "--jp-error-color1", "#d32f2f"),
    "pb-5xx": ("fill", "--jp-warn-color1", "#f57c00"),
    "pb-limit": ("stroke", "--jp-ui-font-color1", "#616161"),
    "pb-hold": ("stroke", "--jp-warn-color2", "#ffb74d"),  # spans are drawn as wide strokes: one path a kind
    "pb-down": ("stroke", "--jp-error-color1", "#d32f2f"),
    "pb-tokens": ("stroke", "--jp-info-color1", "#0097a7"),
}
# The greys of _PALETTE on a dark page with no theme variables: the track, the text, the limit line.
_DARK = {"pb-rest": "#424242", "pb-text": "#9e9e9e", "pb-limit": "#bdbdbd", "pb-skipped": "#9e9e9e"}
T = TypeVar("T")
_SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-size="10">'
_LABEL = 12  # pixels of the text line under a chart
_STRIP = 10  # pixels of the tokens strip
_SPANS = 24  # shaded spans drawn per kind at most: closer ones merge
_POINTS = 60  # points of the tokens line at most: a minute's window moves slowly


def svg_style() -> str:
    """One ``<style>`` block mapping the pictures' classes to theme variables, scoped to a run's
    block (``.playbook-run``) and the live panel (``.playbook-live``)."""
    return "<style>" + svg_rules() + "</style>"


def svg_rules() -> str:
    """The rules of :func:`svg_style`, without the element (a widget's own style sheet).  Where
    JupyterLab's variables are not defined, a dark page (marimo's ``dark`` class, VS Code's
    ``vscode-dark``; in a shadow root, the host's page) gets dark fallbacks for the greys."""
    light = (
        f".playbook-run .{c},.playbook-live .{c}{{{prop}:var({var},{hex_})}}"
        for c, (prop, var, hex_) in _PALETTE.items()
    )
    # Two rules, not one list: a browser without :host-context drops the whole rule it is in.
    dark = (
        f"{where} .{c}{{{_PALETTE[c][0]}:var({_PALETTE[c][1]},{hex_})}}"
        for c, hex_ in _DARK.items()
        for where in (
            ":is(.dark,.vscode-dark) :is(.playbook-run,.playbook-live)",
            ":host-context(.dark) .playbook-live",
        )
    )
    return "".join(light) + "".join(dark)


def _paint(cls: str, **extra: str) -> str:
    """The class and its fallback colour as attributes, plus ``extra`` ones (``stroke_width="2"``)."""
    prop, _, hex_ = _PALETTE[cls]
    more = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in extra.items())
    return f'class="{cls}" {prop}="{hex_}"' + ("" if prop == "fill" else ' fill="none"') + more


def _num(v: float) -> str:
    """A coordinate with at most one decimal: 12, 12.5."""
    text = f"{round(v, 1):.1f}"
    return text[:-2] if text.endswith(".0") else text


# -- the status bar ----------------------------------------------------------------------------


def status_bar(counts: Mapping[str, int], total: int, *, width: int = 480, height: int = 12) -> str:
    """A stacked bar of a run's rows: one segment per status in ``STATUSES`` order, in proportion
    to ``total``, then what is not done yet.  A status with any rows is at least a pixel wide, so
    one failed row in a million still shows; each segment's tooltip gives its rows and share."""
    shown = [(s, n) for s in STATUSES if (n := max(int(counts.get(s, 0)), 0))]
    whole = max(total, sum(n for _, n in shown), 0)
    widths = [max(n * width / whole, 1.0) for _, n in shown] if whole else []
    over = sum(widths) - width
    if over > 0:  # the pixels given to tiny segments come out of the widest
        widest = widths.index(max(widths))
        widths[widest] = max(widths[widest] - over, 1.0)
    parts = [_SVG.format(w=width, h=height)]
    x = 0.0
    for (status, n), w in zip(shown, widths):
        parts.append(_bar(f"pb-{status}", x, x + w, height, f"{status}: {_rows(n, whole)}"))
        x += w
    rest = max(total - sum(n for _, n in shown), 0)
    if x < width - 0.05 or not whole:
        parts.append(
            _bar("pb-rest", x, width, height, f"not yet done: {_rows(rest, whole)}" if whole else "no rows")
        )
    return "".join(parts) + "</svg>"


def _bar(cls: str, x0: float, x1: float, height: int, title: str) -> str:
    a, b = round(x0, 1), round(x1, 1)  # rounded ends, so neighbours meet without a seam
    return f'<rect x="{_num(a)}" width="{_num(b - a)}" height="{height}" {_paint(cls)}><title>{escape(title)}</title></rect>'


def _rows(n: int, whole: int) -> str:
    share = 100 * n / whole if whole else 0.0
    pct = "<0.1" if 0 < share < 0.05 else f"{share:.1f}"
    return f"{n:,} row{'' if n == 1 else 's'} ({pct}%)"


# -- a provider's chart ------------------------------------------------------------------------


class _Clean(NamedTuple):
    """A series made safe to draw: lists of one length, no NaN, no negative, a width not zero."""

    secs: float  # seconds per bucket
    accepted: list[int]
    refused: list[int]
    failed: list[int]
    rates: list[float | None]
    tokens: list[float]
    tpm: float | None


def provider_chart(series: ProviderSeries, *, width: int = 360, height: int = 48) -> str:
    """One provider over the run, ``width`` × ``height`` pixels; for LLM calls a tokens strip and
    its text line add 24 more.

    Behind: the spans it was held (orange) or down (red).  Bars of calls per second, stacked:
    accepted (green), then 429s (red), then 5xx and other transient failures (orange); the rate
    limit as a dashed step line where known.  Under them a text line gives the scale: the peak,
    the latest limit, the 429s and failures, and how long the run has gone.  For LLM calls, then,
    tokens per minute (a blue line) against the tokens-per-minute limit (dashed), and their line."""
    name = escape(series.provider)
    n = len(series.accepted)
    if not n:
        head = _SVG.format(w=width, h=14) + f"<title>{name}: no calls yet</title>"
        return head + _text(0, 11, f"{series.provider} · no calls yet") + "</svg>"
    c = _clean(series, n)
    strip = bool(c.tpm or any(c.tokens))
    plot = max(height - _LABEL, 8)
    full = plot + _LABEL + (_STRIP + 2 + _LABEL if strip else 0)
    xs = [round(i * width / n) for i in range(n + 1)]
    peak = _peak(series, c)
    limit = max((r for r in c.rates if r is not None), default=None)
    # the scale holds the stacked bars whole: the refusals and failures of the busiest second too
    sent = max(a + r + f for a, r, f in zip(c.accepted, c.refused, c.failed)) / c.secs
    top = max(sent, limit or 0.0) or 1.0

    def y(v: float, floor: int) -> int:
        """The pixel row of ``v`` calls/s, at least a pixel above ``floor`` when ``v`` adds any."""
        row = round(plot - v / top * plot)
        return max(min(row, floor - 1 if v > 0 else floor), 0)

    tops_a = [y(a / c.secs, plot) for a in c.accepted]
    tops_r = [y((a + r) / c.secs, t) if r else t for a, r, t in zip(c.accepted, c.refused, tops_a)]
    tops_f = [
        y((a + r + f) / c.secs, t) if f else t for a, r, f, t in zip(c.accepted, c.refused, c.failed, tops_r)
    ]

    parts = [_SVG.format(w=width, h=full), f"<title>{name}: {_summary(series, c, peak, limit)}</title>"]
    parts += _spans(series, width, plot, n)
    for cls, counts, tops in (
        ("pb-5xx", c.failed, tops_f),
        ("pb-429", c.refused, tops_r),
        ("pb-ok", c.accepted, tops_a),
    ):
        if any(counts):  # back to front: each stack drawn whole, the one in front hides its lower part
            parts.append(f'<path {_paint(cls)} d="{_area(xs, tops, plot)}"/>')
    line = _line(xs, [None if r is None else max(y(r, plot + 1), 1) for r in c.rates])
    if line:
        parts.append(f'<path {_paint("pb-limit", stroke_dasharray="3 2")} d="{line}"/>')
    parts.append(_text(0, plot + _LABEL - 2, _label(series, c, peak)))
    if strip:
        parts += _tokens(xs, c.tokens, c.tpm, plot + _LABEL + 2)
        of = f" of {short_count(c.tpm)}" if c.tpm else ""
        parts.append(
            _text(
                0, full - 2, f"tokens/min {short_count(c.tokens[-1])}{of} · peak {short_count(max(c.tokens))}"
            )
        )
    return "".join(parts) + "</svg>"


def _clean(series: ProviderSeries, n: int) -> _Clean:
    rates = [max(r, 0.0) if r is not None and math.isfinite(r) else None for r in _fit(series.rate, n, None)]
    tpm = series.tpm if series.tpm is not None and math.isfinite(series.tpm) and series.tpm > 0 else None
    return _Clean(
        secs=series.width if series.width > 0 and math.isfinite(series.width) else 1.0,
        accepted=[_count(v) for v in series.accepted],
        refused=[_count(v) for v in _fit(series.refused, n, 0)],
        failed=[_count(v) for v in _fit(series.failed, n, 0)],
        rates=rates,
        tokens=[v if math.isfinite(v) and v > 0 else 0.0 for v in _fit(series.tokens, n, 0.0)],
        tpm=tpm,
    )


def _label(series: ProviderSeries, c: _Clean, peak: float) -> str:
    """ "peak 48/s · limit 50/s · 12 × 429 · 3 × 5xx · held 40s · 2m 10s": the scale and the totals,
    tersely."""
    last = next((r for r in reversed(c.rates) if r is not None), None)
    words = [f"peak {_per(peak)}/s"] + ([f"limit {_allowed(last)}/s"] if last is not None else [])
    words += [f"{short_count(sum(c.refused))} × 429"] if any(c.refused) else []
    words += [f"{short_count(sum(c.failed))} × 5xx"] if any(c.failed) else []
    words += _stopped(series)
    return " · ".join([*words, duration(series.end - series.start)])


def _stopped(series: ProviderSeries) -> list[str]:
    """How long the provider held calls and was down: ["held 40s", "down 1m 05s"] (what the shaded
    spans mean)."""
    spent = {"hold": 0.0, "down": 0.0}
    for start, end, kind in series.spans:
        if kind in spent and math.isfinite(end - start):
            spent[kind] += max(min(end, series.end) - start, 0.0)
    return [f"{'held' if kind == 'hold' else 'down'} {duration(s)}" for kind, s in spent.items() if s >= 0.5]


def _fit(values: Sequence[T], n: int, pad: T) -> list[T]:
    """``values`` cut or padded to the ``n`` buckets of the accepted calls."""
    return list(values[:n]) + [pad] * (n - len(values))


def _count(v: float) -> int:
    return int(v) if math.isfinite(v) and v > 0 else 0


def _area(xs: list[int], tops: list[int], base: int) -> str:
    """A step area from the baseline up to ``tops``, one bucket a step: "M0 35V20h3V18h6...V35Z"."""
    d = [f"M0 {base}"]
    level, run = base, 0
    for i, t in enumerate(tops):
        if t != level:
            if run:
                d.append(f"h{run}")
            d.append(f"V{t}")
            level, run = t, 0
        run += xs[i + 1] - xs[i]
    if run:
        d.append(f"h{run}")
    return "".join(d) + f"V{base}Z"


def _line(xs: list[int], rows: list[int | None]) -> str:
    """A step line through ``rows``, broken where a row is None (nothing known there)."""
    d: list[str] = []
    level: int | None = None
    run = 0
    for i, r in enumerate(rows):
        if r != level or r is None:
            if run:
                d.append(f"h{run}")
            run = 0
            if r is not None:
                d.append(f"V{r}" if level is not None else f"M{xs[i]} {r}")
            level = r
        if r is not None:
            run += xs[i + 1] - xs[i]
    if run:
        d.append(f"h{run}")
    return "".join(d)


def _spans(series: ProviderSeries, width: int, plot: int, n: int) -> list[str]:
    """The held and down spans as wide strokes behind the bars, one path per kind."""
    seconds = n * series.width
    if not (seconds > 0 and math.isfinite(seconds) and math.isfinite(series.start)):
        return []
    out = []
    for kind, opacity in (("hold", ".3"), ("down", ".2")):
        cols: list[list[int]] = []
        for a, b, k in series.spans:
            if k != kind or not (math.isfinite(a) and math.isfinite(b)):
                continue
            x0 = max(math.floor((a - series.start) / seconds * width), 0)
            x1 = min(max(math.ceil((b - series.start) / seconds * width), x0 + 1), width)
            if x0 >= width or x1 <= 0:
                continue
            if cols and x0 <= cols[-1][1] + 1:  # touching at this scale: one shade
                cols[-1][1] = max(cols[-1][1], x1)
            else:
                cols.append([x0, x1])
        _merge_closest(cols, _SPANS)
        if cols:
            d = [f"M{cols[0][0]} {_num(plot / 2)}h{cols[0][1] - cols[0][0]}"]
            d += [f"m{c[0] - p[1]} 0h{c[1] - c[0]}" for p, c in zip(cols, cols[1:])]
            out.append(
                f'<path {_paint("pb-" + kind, stroke_width=str(plot), stroke_opacity=opacity)} d="{"".join(d)}"/>'
            )
    return out


def _merge_closest(cols: list[list[int]], most: int) -> None:
    while len(cols) > most:
        j = min(range(len(cols) - 1), key=lambda i: cols[i + 1][0] - cols[i][1])
        cols[j][1] = cols[j + 1][1]
        del cols[j + 1]


def _tokens(xs: list[int], tokens: list[float], tpm: float | None, top: int) -> list[str]:
    """The tokens strip: tokens per minute against the limit, scaled to the larger, at most
    ``_POINTS`` steps (pairs merge, the later wins, as in the timeline)."""
    most = max(max(tokens), tpm or 0.0) or 1.0
    while len(tokens) > _POINTS:
        tokens = tokens[1::2] + tokens[-1:] * (len(tokens) % 2)
        xs = xs[::2] + xs[-1:] * (len(xs) % 2 == 0)
    rows: list[int | None] = [_STRIP - round(v / most * _STRIP) for v in tokens]
    out = [f'<g transform="translate(0 {top})"><path {_paint("pb-tokens")} d="{_line(xs, rows)}"/>']
    if tpm:
        out.append(
            f'<path {_paint("pb-limit", stroke_dasharray="3 2")} d="M0 {_STRIP - round(tpm / most * _STRIP)}H{xs[-1]}"/>'
        )
    return [*out, "</g>"]


def _text(x: int, y: int, words: str) -> str:
    return f'<text x="{x}" y="{y}" {_paint("pb-text")}>{escape(words)}</text>'


def _summary(series: ProviderSeries, c: _Clean, peak: float, limit: float | None) -> str:
    words = f"{sum(c.accepted):,} accepted, {sum(c.refused):,} refused (429), {sum(c.failed):,} failed (5xx, timeouts); peak {_per(peak)}/s"
    words += f", limit ≤{_allowed(limit)}/s" if limit is not None else ""
    stopped = _stopped(series)
    return words + (f"; {', '.join(stopped)}" if stopped else "") + f"; {duration(series.end - series.start)}"


def _peak(series: ProviderSeries, c: _Clean) -> float:
    """The most calls sent within one second, counted as the provider counts them and the pace
    lets them go (when sent, over a sliding second); without that count (a cluster's merged
    view), the busiest bucket's answers per second."""
    busiest = max((_count(v) for v in series.busiest), default=0)
    return float(busiest) if busiest else max(c.accepted) / c.secs


def _allowed(rate: float) -> str:
    """The most calls a pace of ``rate``/s lets go within one second, in the peak's terms: 39.2/s
    lets 40 go (at 0, 1/39.2, ... 39/39.2 s), so a peak of 40 is no breach.  Under 1/s a second
    holds one call or none: the rate itself says more."""
    return _per(math.ceil(rate - 1e-9)) if rate >= 1 else _per(rate)


def _per(v: float) -> str:
    return f"{v:.3g}" if v < 1e4 else short_count(v)
