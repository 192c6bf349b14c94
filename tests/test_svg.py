"""Inline SVG pictures: well-formed for any input, proportional, small, escaped, and coloured both
by theme classes and by fallback attributes that survive a stripped stylesheet."""

from __future__ import annotations

import math
import random
import re
import xml.etree.ElementTree as ET

import pytest

from playbook.runtime.state.timeline import ProviderSeries, Timeline
from playbook.runtime.state.upstream import ProviderView
from playbook.ui.svg import STATUSES, provider_chart, status_bar, svg_style

NS = "{http://www.w3.org/2000/svg}"
T0 = 1_700_000_000.0
NAME = '<b>&"x"'


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    assert not re.search(r"nan|inf", svg.replace("info", ""), re.I), svg
    return root


def rules() -> dict[str, tuple[str, str, str]]:
    """class -> (property, variable, fallback), read back from the style block."""
    found = re.findall(
        r"\.playbook-run \.([\w-]+),\.playbook-live \.\1\{(fill|stroke):var\((--jp-[\w-]+),(#[0-9a-f]{6})\)\}",
        svg_style(),
    )
    return {cls: (prop, var, hex_) for cls, prop, var, hex_ in found}


def series(
    n: int = 120,
    *,
    seed: int = 1,
    width: float = 3.0,
    spans: int = 120,
    tokens: bool = True,
    name: str = NAME,
    rate: bool = True,
) -> ProviderSeries:
    """A busy provider: every bucket has calls, 429s and failures, a changing rate and tokens."""
    rng = random.Random(seed)
    shown = [
        (T0 + i * width * n / spans, T0 + i * width * n / spans + width / 3, "hold" if i % 2 else "down")
        for i in range(spans)
    ]
    return ProviderSeries(
        provider=name,
        start=T0,
        width=width,
        accepted=[rng.randint(1, 300) for _ in range(n)],
        refused=[rng.randint(1, 300) for _ in range(n)],
        failed=[rng.randint(1, 300) for _ in range(n)],
        rate=[rng.uniform(1, 100) if rate else None for _ in range(n)],
        tokens=[rng.uniform(1, 1e5) if tokens else 0.0 for _ in range(n)],
        tpm=5e4 if tokens else None,
        spans=shown,
        end=T0 + n * width,
    )


def rects(svg: str) -> dict[str, ET.Element]:
    return {r.get("class", ""): r for r in parse(svg).iter(f"{NS}rect")}


# -- the status bar ----------------------------------------------------------------------------


def test_status_segments_are_proportional_in_order_then_the_rest() -> None:
    """Each status's width is its share of the total; they follow STATUSES, then the rows not yet done."""
    bar = status_bar({"waiting": 50, "ok": 300, "failed": 100, "skipped": 0}, 600, width=480)
    shown = list(parse(bar).iter(f"{NS}rect"))
    assert [r.get("class") for r in shown] == ["pb-ok", "pb-failed", "pb-waiting", "pb-rest"]
    widths = [float(r.get("width", "")) for r in shown]
    assert widths == pytest.approx([240, 80, 40, 120], abs=0.1)
    xs = [float(r.get("x", "")) for r in shown]
    assert xs == pytest.approx([0, 240, 320, 360], abs=0.1)


def test_status_tooltips_give_rows_and_share() -> None:
    """A segment's title says its rows and its share of the run."""
    bar = rects(status_bar({"ok": 85_714, "failed": 14_286}, 100_000))
    assert bar["pb-failed"].findtext(f"{NS}title") == "failed: 14,286 rows (14.3%)"
    assert "pb-rest" not in bar  # everything done: no track left


def test_one_row_in_a_million_is_still_a_pixel() -> None:
    """A status with any rows is at least 1px wide, and the bar still fits its width."""
    bar = status_bar({"ok": 999_998, "failed": 1, "parked": 1}, 1_000_000, width=480)
    shown = rects(bar)
    assert float(shown["pb-failed"].get("width", "")) >= 1 and float(shown["pb-parked"].get("width", "")) >= 1
    assert shown["pb-failed"].findtext(f"{NS}title") == "failed: 1 row (<0.1%)"
    end = max(float(r.get("x", "")) + float(r.get("width", "")) for r in shown.values())
    assert end <= 480.05


def test_an_empty_run_is_an_empty_track() -> None:
    """Total 0: one background bar, no division by zero."""
    shown = list(parse(status_bar({}, 0, width=200)).iter(f"{NS}rect"))
    assert [(r.get("class"), r.get("width")) for r in shown] == [("pb-rest", "200")]


def test_status_bar_stays_small_at_its_largest() -> None:
    """Every status present with nine-digit counts: under 1,200 characters."""
    counts = {s: 123_456_789 + i for i, s in enumerate(STATUSES)}
    bar = status_bar(counts, 10 * 123_456_789)
    parse(bar)
    assert len(bar) < 1200, len(bar)


# -- a provider's chart ------------------------------------------------------------------------


def test_chart_stays_small_at_its_largest() -> None:
    """120 buckets with every series busy and changing, 120 spans, tokens: under 4,000 characters."""
    sizes = [len(provider_chart(series(seed=seed))) for seed in range(5)]
    alternating = series()._replace(
        accepted=[300 if i % 2 else 1 for i in range(120)], rate=[100.0 if i % 2 else 1.0 for i in range(120)]
    )
    sizes.append(len(provider_chart(alternating)))
    # the worst a search of 3,000 repeating patterns found: every path changes row at every bucket
    a, r, f = [14, 19, 36], [4, 46, 44], [55, 12, 15]
    dense = series()._replace(
        accepted=[a[i % 3] for i in range(120)],
        refused=[r[i % 3] for i in range(120)],
        failed=[f[i % 3] for i in range(120)],
        rate=[(7.3, 31.0, 18.2)[i % 3] * (1.3 if i % 2 else 1) for i in range(120)],
        tokens=[(10.0, 9e4, 4e4)[i % 3] * (2 if i % 4 == 1 else 1) for i in range(120)],
    )
    sizes.append(len(provider_chart(dense)))
    assert max(sizes) < 4000, sizes


@pytest.mark.parametrize(
    "shape",
    [
        series(),
        series(n=1, spans=1),
        series(n=7, spans=0, tokens=False),
        series(rate=False),
        series(width=0.0),
        series()._replace(
            rate=[math.nan] * 120, tokens=[math.inf] * 120, tpm=math.nan, start=math.nan, end=math.nan
        ),
        series()._replace(accepted=[0] * 120, refused=[0] * 120, failed=[0] * 120, rate=[None] * 120),
        series()._replace(
            spans=[(T0 - 1e6, T0 + 1e9, "hold"), (math.nan, T0, "down"), (T0 + 1e9, T0 + 2e9, "down")]
        ),
        series()._replace(rate=[0.0] * 120, accepted=[10**12] * 120),
        series()._replace(refused=[], failed=[], rate=[], tokens=[]),
        ProviderSeries(NAME, T0, 1.0, [], [], [], [], [], None, [], T0),
    ],
    ids=[
        "busy",
        "one-bucket",
        "seven",
        "no-rate",
        "zero-width",
        "nan",
        "idle",
        "spans-out-of-range",
        "huge",
        "short-lists",
        "empty",
    ],
)
def test_chart_is_well_formed_for_any_series(shape: ProviderSeries) -> None:
    """Parses as XML with no NaN, the name escaped into the title."""
    root = parse(provider_chart(shape))
    assert root.findtext(f"{NS}title", "").startswith(NAME + ":")


def test_an_empty_series_says_no_calls_yet() -> None:
    """No buckets yet: a one-line picture, not an error."""
    root = parse(provider_chart(ProviderSeries("acme", T0, 1.0, [], [], [], [], [], None, [], T0)))
    assert "no calls yet" in "".join(root.itertext()) and int(root.get("height", "")) < 20


def test_the_scale_is_the_larger_of_peak_calls_and_the_limit() -> None:
    """Accepted 50/s under a 100/s limit reaches half the plot; with no limit, the peak reaches the top."""
    flat = ProviderSeries(
        "acme", T0, 2.0, [100] * 10, [0] * 10, [0] * 10, [100.0] * 10, [0.0] * 10, None, [], T0 + 20
    )
    plot = 48 - 12
    assert _tops(provider_chart(flat), "pb-ok") == {plot // 2}
    assert _tops(provider_chart(flat), "pb-limit") == {1}  # the limit at the top, a pixel in for its stroke
    assert _tops(provider_chart(flat._replace(rate=[None] * 10)), "pb-ok") == {0}
    assert "peak 50/s · limit 100/s" in "".join(parse(provider_chart(flat)).itertext())


def test_refusals_and_failures_stack_over_accepted_calls_a_pixel_at_least() -> None:
    """One 429 and one 5xx among thousands of calls still show, a pixel above the accepted bar."""
    one = ProviderSeries(
        "acme", T0, 1.0, [5000, 5000], [1, 0], [0, 1], [1e4, 1e4], [0.0, 0.0], None, [], T0 + 2
    )
    chart = provider_chart(one)
    assert _tops(chart, "pb-ok") == {18}  # 5,000/s of a 10,000/s scale: half of 36 rows
    assert _tops(chart, "pb-429") == {17, 18} and _tops(chart, "pb-5xx") == {17}
    quiet = provider_chart(one._replace(refused=[0, 0], failed=[0, 0], rate=[None, None]))
    assert "pb-429" not in quiet and "pb-5xx" not in quiet and "pb-limit" not in quiet


def test_spans_shade_the_plot_behind_the_bars() -> None:
    """A hold and a down span are wide translucent strokes drawn before the bars, where their times fall."""
    s = ProviderSeries(
        "acme",
        T0,
        1.0,
        [1] * 120,
        [0] * 120,
        [0] * 120,
        [None] * 120,
        [0.0] * 120,
        None,
        [(T0 + 30, T0 + 60, "hold"), (T0 + 90, T0 + 90, "down")],
        T0 + 120,
    )
    paths = [p for p in parse(provider_chart(s)).iter(f"{NS}path")]
    kinds = [p.get("class") for p in paths]
    assert kinds.index("pb-hold") < kinds.index("pb-ok") and kinds.index("pb-down") < kinds.index("pb-ok")
    hold = paths[kinds.index("pb-hold")]
    assert re.fullmatch(r"M90 18h90", hold.get("d", "")) and float(hold.get("stroke-opacity", "1")) < 0.5
    assert re.fullmatch(
        r"M270 18h1", paths[kinds.index("pb-down")].get("d", "")
    )  # an instant down is still a pixel


def test_tokens_strip_only_for_llm_calls() -> None:
    """Tokens or a token limit add a strip: tokens per minute against the dashed limit."""
    plain = series(tokens=False, spans=0)
    assert "pb-tokens" not in provider_chart(plain)
    chart = parse(provider_chart(plain._replace(tpm=30_000.0)))
    assert [p.get("class") for p in chart.iter(f"{NS}path")][-2:] == ["pb-tokens", "pb-limit"]
    assert int(chart.get("height", "")) > int(parse(provider_chart(plain)).get("height", ""))
    assert "of 30k" in "".join(chart.itertext())


# -- colours -----------------------------------------------------------------------------------


def test_every_coloured_element_has_a_class_and_its_fallback() -> None:
    """Each fill or stroke is the fallback of its class's rule, so it reads with or without the style."""
    palette = rules()
    pictures = [
        provider_chart(series()),
        provider_chart(series(rate=False)),
        status_bar(dict.fromkeys(STATUSES, 3), 30),
    ]
    checked = set()
    for picture in pictures:
        for el in parse(picture).iter():
            painted = [p for p in ("fill", "stroke") if el.get(p, "none") != "none"]
            if not painted:
                continue
            cls = el.get("class", "")
            assert cls in palette, f"{el.tag} {el.attrib} has no themed class"
            prop, _, fallback = palette[cls]
            assert painted == [prop] and el.get(prop) == fallback
            checked.add(cls)
    chart_classes = {"pb-rest", "pb-text", "pb-429", "pb-5xx", "pb-limit", "pb-hold", "pb-down", "pb-tokens"}
    assert {f"pb-{s}" for s in STATUSES} | chart_classes <= checked


def test_the_style_block_maps_each_class_to_a_theme_variable_in_both_views() -> None:
    """One <style>, every rule scoped to .playbook-run and .playbook-live, naming the theme variables."""
    style = svg_style()
    assert style.count("<style>") == 1 and style.endswith("</style>")
    body = style.removeprefix("<style>").removesuffix("</style>")
    dark = dark_rules()
    assert len(re.findall(r"\{", body)) == len(rules()) + sum(len(where) for where in dark.values())
    variables = {var for _, var, _ in rules().values()}
    for var in (
        "--jp-success-color1",
        "--jp-error-color1",
        "--jp-warn-color2",
        "--jp-warn-color0",
        "--jp-layout-color4",
        "--jp-ui-font-color2",
        "--jp-ui-font-color1",
        "--jp-warn-color1",
        "--jp-info-color1",
    ):
        assert var in variables
    used = set(
        re.findall(r'class="([\w-]+)"', provider_chart(series()) + status_bar(dict.fromkeys(STATUSES, 1), 9))
    )
    assert used <= set(rules())


def dark_rules() -> dict[str, dict[str, tuple[str, str, str]]]:
    """class -> {where: (property, variable, fallback)} of the dark page's rules."""
    found = re.findall(
        r"(:is\(\.dark,\.vscode-dark\) :is\(\.playbook-run,\.playbook-live\)|:host-context\(\.dark\) \.playbook-live)"
        r" \.([\w-]+)\{(fill|stroke):var\((--jp-[\w-]+),(#[0-9a-f]{6})\)\}",
        svg_style(),
    )
    out: dict[str, dict[str, tuple[str, str, str]]] = {}
    for where, cls, prop, var, hex_ in found:
        out.setdefault(cls, {})[where] = (prop, var, hex_)
    return out


def test_a_dark_page_without_theme_variables_gets_dark_greys() -> None:
    """marimo's or VS Code's dark page (no JupyterLab variables): the bar's track and the charts'
    text get fallbacks darker (track) or lighter (text, limit line) than the light page's, under the
    same theme variable, in the page (summary) and in a shadow root (marimo's widget)."""
    light, dark = rules(), dark_rules()

    def lightness(hex_: str) -> int:
        return sum(int(hex_[i : i + 2], 16) for i in (1, 3, 5))

    assert {"pb-rest", "pb-text", "pb-limit"} <= set(dark)
    for cls, where in dark.items():
        assert (
            len(where) == 2
        )  # the page's rule and the shadow root's, apart: one unknown selector drops a rule
        for prop, var, hex_ in where.values():
            assert (prop, var) == light[cls][:2]
            darker = cls == "pb-rest"
            assert (lightness(hex_) < lightness(light[cls][2])) == darker


def _tops(svg: str, cls: str) -> set[int]:
    """The rows a class's path climbs to (its V commands, or the y of its first point)."""
    (path,) = [p for p in parse(svg).iter(f"{NS}path") if p.get("class") == cls]
    d = path.get("d", "")
    rows = {int(v) for v in re.findall(r"V(\d+)", d)}
    first = re.match(r"M\d+ (\d+)", d)
    if cls in ("pb-ok", "pb-429", "pb-5xx"):
        rows.discard(int(first.group(1)) if first else -1)  # an area starts and ends on the baseline
    elif first:
        rows.add(int(first.group(1)))
    return rows


def test_samples_from_a_timeline_draw() -> None:
    """What a Timeline gives draws as it is, from its first sample on."""
    tl = Timeline()
    for k in range(50):
        view = ProviderView(
            "acme",
            k > 40,
            None,
            0.0,
            10 < k < 20,
            T0 + 25,
            None,
            10.0,
            None,
            0,
            k // 5,
            0.0,
            None,
            3 * k,
            k // 10,
        )
        tl.sample(T0 + k * 0.5, {"acme": view})
    (s,) = tl.series()
    chart = parse(provider_chart(s))
    assert {p.get("class") for p in chart.iter(f"{NS}path")} >= {
        "pb-ok",
        "pb-429",
        "pb-5xx",
        "pb-limit",
        "pb-hold",
        "pb-down",
    }


def test_the_text_line_says_what_the_marks_and_shaded_spans_mean() -> None:
    """The refusals and failures as counts of a status, and how long the provider held calls or was
    down (what the shaded spans are), clipped to the run so far."""
    spans = [(T0 + 10, T0 + 30, "hold"), (T0 + 50, T0 + 70, "hold"), (T0 + 80, T0 + 200, "down")]
    shown = ProviderSeries(
        "acme",
        T0,
        1.0,
        [3] * 100,
        [2] + [0] * 99,
        [0] * 99 + [3],
        [5.0] * 100,
        [0.0] * 100,
        None,
        spans,
        T0 + 100,
    )
    root = parse(provider_chart(shown))
    text = " ".join(t.text or "" for t in root.iter(f"{NS}text"))
    assert "2 × 429 · 3 × 5xx · held 40s · down 20s · 1m 40s" in text
    title = root.find(f"{NS}title")
    assert title is not None and "held 40s, down 20s" in (title.text or "")
