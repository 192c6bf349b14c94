"""A run as static HTML: what a saved or exported notebook shows of it (``Run._repr_html_``).

Counters, the providers (held until when, or down since when and why; rate and the calls in flight
it allows, 429s, rows waiting), parked rows grouped by why, provider and when they are ready, and
failed rows grouped by their error's group (one bug, one line), each capped so a million-row run
renders as small as a ten-row one.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from playbook._internal.words import cut, duration, money, short_count, time_of_day
from playbook.records import RunStats
from playbook.runtime.state.reading import LEG_COLUMNS, ProviderSeries, ProviderView, RunState, WorkerView
from playbook.ui.svg import provider_chart, status_bar, svg_style
from playbook.ui.tally import Tally

__all__ = [
    "CHARTS",
    "LIMIT",
    "budgets_said",
    "counters_table",
    "errors_table",
    "in_words",
    "legs_table",
    "parked_table",
    "parked_why",
    "provider_pictures",
    "provider_rate",
    "provider_state",
    "providers_table",
    "rows_picture",
    "run_html",
    "workers_table",
]

LIMIT = 20  # groups shown of the parked rows and of the errors
CHARTS = 4  # providers drawn
# JupyterLab right-aligns the cells of an output's tables: words read better from the left.
# A narrow output (marimo's, VS Code's) scrolls the tables rather than breaking their headings.
_STYLE = (
    "<style>.playbook-run{overflow-x:auto}"
    ".playbook-run th,.playbook-run td{text-align:left;padding:1px 10px 1px 0}"
    ".playbook-run th{white-space:nowrap}</style>"
)
_WORDS = 160  # characters of an error shown in a provider's line
_MESSAGE = 300  # characters of an error group's example message


def run_html(state: RunState, tally: Tally | None = None) -> str:
    """The run as it stands, in one static block: what a saved notebook keeps, pictures included
    (inline SVG, coloured by the theme where there is one).  ``tally``: the run's rows as a live
    view kept them, which saves a scan of every row; by default, one scan."""
    s = state.stats()
    phase = "running" if state.finished is None else ("stopped" if state.stopped else "finished")
    rate = ((s.done - s.skipped) / s.elapsed) if s.elapsed else 0.0  # a stop's skipped rows did not run
    head = f"<div class='playbook-run'>{_STYLE}{svg_style()}<b>{_e(state.play)}</b> · {phase} · {s.elapsed:.1f}s · {per_second(rate)} rows/s"
    parts = [head, f"<div>{rows_picture(s)}</div>", counters_table(s)]
    parts += [f"<div class='playbook-notice'>⚠ {_e(note)}</div>" for note in state.notices]
    tally = tally if tally is not None else Tally.of(state)
    parts.append(providers_table(state.provider_views(), tally.waiting(), down_since=state.down_since))
    parts.append(provider_pictures(state.history()))
    parts.append(workers_table(state.workers()))
    parts.append(parked_table(tally.parked_summary(LIMIT), len(tally.parked_groups), state.provider_views()))
    parts.append(errors_table(tally.error_groups(LIMIT), tally.kinds))
    parts.append(legs_table(state))
    return "\n".join(parts) + "</div>"


def rows_picture(s: RunStats | RunState) -> str:
    """The rows as one stacked bar: ok, reused, failed, waiting, parked, skipped, then not done yet."""
    counts = {
        "ok": s.ok,
        "reused": s.reused,
        "failed": s.failed,
        "waiting": s.waiting,
        "parked": s.parked,
        "skipped": s.skipped,
    }
    return status_bar(counts, s.total)


def provider_pictures(history: list[ProviderSeries]) -> str:
    """A small chart per provider over the run (calls accepted per second, 429s, failures, its
    rate limit, holds; tokens per minute for LLM calls), ``CHARTS`` at most."""
    if not history:
        return ""
    charts = "".join(
        f"<div class='playbook-chart'><div>{_e(series.provider)}</div>{provider_chart(series)}</div>"
        for series in history[:CHARTS]
    )
    more = len(history) - CHARTS
    rest = f"<div>… and {more:,} more providers</div>" if more > 0 else ""
    return (
        f"<div class='playbook-charts' style='display:flex;flex-wrap:wrap;gap:4px 16px'>{charts}</div>{rest}"
    )


def priced(amount: float, calls: int, unpriced: int) -> str:
    """A sum of costs over ``calls``, ``unpriced`` of which have no price: "unpriced" when none
    has one, never $0.00."""
    if not unpriced:
        return money(amount)
    return "unpriced" if unpriced >= calls and not amount else f"{money(amount)} + unpriced"


def counters_table(s: RunStats | RunState) -> str:
    """The run's counters, from its ``RunStats`` or its live ``RunState``."""
    return _table(
        [
            "rows",
            "ok",
            "reused",
            "failed",
            "waiting",
            "parked",
            "skipped",
            "calls paid",
            "calls failed",
            "calls shared",
            "calls from receipts",
            "calls local",
            "cost spent",
            "of it on failures",
            "cost saved",
        ],
        [
            [
                *(
                    f"{n:,}"
                    for n in (
                        s.total,
                        s.ok,
                        s.reused,
                        s.failed,
                        s.waiting,
                        s.parked,
                        s.skipped,
                        s.calls_executed,
                        s.calls_failed,
                        s.calls_shared,
                        s.calls_reused,
                        s.calls_local,
                    )
                ),
                priced(s.cost_spent, s.calls_executed, s.calls_unpriced),
                money(s.cost_failed),
                priced(s.cost_saved, s.calls_reused + s.calls_shared, s.reused_unpriced),
            ]
        ],
    )


def _flow(p: ProviderView) -> list[str]:
    """A provider's (or a key's) rate, calls in flight and 429s, as the table shows them."""
    return [provider_rate(p), f"{p.in_flight:,}", f"{p.refused:,}"]


def providers_table(
    providers: Mapping[str, ProviderView],
    waiting: Mapping[str | None, int],
    *,
    now: float | None = None,
    down_since: Mapping[str, float] | None = None,
) -> str:
    """One line per provider: open, held (until when) or down (since when, why, next probe); its rate
    and the calls in flight it allows, in flight, 429s, and the rows ``waiting`` on it.  Given
    ``now``, a hold or a probe shows the seconds left, for a live countdown."""
    if not providers:
        return ""
    since = down_since or {}
    shown = []
    for name, p in providers.items():
        shown.append([name, provider_state(p, since.get(name), now), *_flow(p), f"{waiting.get(name, 0):,}"])
        for key in p.keys:  # a pool: a line per key, under its provider
            state = f"retired ({key.retired}) for this run" if key.retired else provider_state(key, None, now)
            shown.append([f"└ key {key.name}", state, *_flow(key), ""])
    return _table(["provider", "state", "rate", "in flight", "429s", "rows waiting"], shown)


def provider_state(p: ProviderView, since: float | None = None, now: float | None = None) -> str:
    """ "open", "held until ..." or "down since ...: why; next probe at ..."; given ``now``, with the
    seconds left of the hold or before the probe."""
    if p.down:
        state = "down" + (f" since {time_of_day(since)}" if since else "") + f": {in_words(p.down_error)}"
        if p.probe_at:
            left = "" if now is None else f"in {duration(p.probe_at - now)}, "
            state += f"; next probe {left}at {time_of_day(p.probe_at)}"
        return state
    if not p.held:
        return "open"
    if now is None:
        state = f"held until {time_of_day(p.hold_until_at)}"
    else:
        state = f"held {duration(p.hold_until_at - now)} more, until {time_of_day(p.hold_until_at)}"
    return state + (f" (HTTP {p.last_status})" if p.last_status else "")


def provider_rate(p: ProviderView) -> str:
    """Its current rate, the calls in flight it allows now when they are bounded, and for LLM
    calls each budget by its own name, the last minute's use against its limit ("9.8/s, ≤8 in
    flight, requests 41/50 per min, input tokens 38k/40k per min, output tokens 7,900/8,000 per
    min"), or without a token budget the last minute's tokens ("9.8/s, 950 tokens/min")."""
    rate = "unlimited" if p.rate is None else f"{p.rate:.3g}/s"
    limit = p.in_flight_limit
    shown = rate if limit is None else f"{rate}, ≤{limit} in flight"
    if p.budgets:
        return f"{shown}, {budgets_said(p)}"
    if p.tpm is None and not p.tokens:
        return shown
    of = f" of {short_count(p.tpm)}" if p.tpm is not None else ""
    return f"{shown}, {short_count(p.tokens)}{of} tokens/min"


def budgets_said(p: ProviderView) -> str:
    """Each budget of a provider by its own name, the last minute's use against its limit:
    "input tokens 38k/40k per min, output tokens 7,900/8,000 per min" ("" without budgets)."""
    return ", ".join(
        f"{b.name} {short_count(b.used)}/{short_count(b.limit)} per min"
        if b.limit is not None
        else f"{b.name} {short_count(b.used)} per min"
        for b in p.budgets
    )


def per_second(rate: float) -> str:
    """A rate at a glance, slow ones too: 0.43 / 4.3 / 4,321."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.2g}" if rate < 10 else f"{rate:.0f}"


def in_words(error: str | None) -> str:
    """A provider's failure on one short line: a down provider's line must not become a traceback."""
    text = next((line.strip() for line in (error or "").splitlines() if line.strip()), "unreachable")
    return cut(text, _WORDS)


def parked_table(
    groups: list[tuple[int, str, str | None, float | None]],
    count: int,
    providers: Mapping[str, ProviderView] | None = None,
) -> str:
    """Parked rows, a line per (reason, provider, ready-at minute): how many, why in words, the
    provider, when they are ready (its last HTTP status, from ``providers``); the largest
    ``LIMIT`` of ``count`` groups."""
    if not groups:
        return ""
    shown = [
        [f"{n:,}", parked_why(reason), provider or "", _ready(reason, provider, ready, providers)]
        for n, reason, provider, ready in groups
    ]
    return (
        "<div>parked rows</div>"
        + _table(["rows", "why", "provider", "ready at"], shown)
        + _more(count, "groups")
    )


def parked_why(reason: str) -> str:
    """A parked row's reason in words (a quota's, by its name)."""
    if reason.startswith(QUOTA):
        return f"quota {reason[len(QUOTA) :]} spent"
    return _WHY.get(reason, reason)


QUOTA = "quota: "  # the start of a spent quota's reason (ProviderExhausted: "quota: <its name>")


_WHY = {
    "hold": "held past the wait budget",
    "down": "provider down",
    "budget": "max_cost reached",
    "store": "receipt store refusing writes",
}


def _ready(
    reason: str, provider: str | None, ready: float | None, providers: Mapping[str, ProviderView] | None
) -> str:
    if ready is None:
        return ""
    view = (providers or {}).get(provider or "")
    status = view.last_status if view is not None and reason == "hold" else None
    return (
        ("next probe " if reason == "down" else "")
        + time_of_day(ready)
        + (f" (HTTP {status})" if status else "")
    )


def errors_table(groups: list[tuple[int, str, Any, str, float]], count: int) -> str:
    """Failed rows by their error's group: (rows, group, example row, its message, what its rows
    paid for), the largest ``LIMIT`` groups of ``count``; the cost column when any group paid."""
    if not groups:
        return ""
    head = ["rows", "error", "e.g. row", "its message"]
    shown = [[f"{n:,}", group, example, cut(message, _MESSAGE)] for n, group, example, message, _ in groups]
    if any(cost for *_, cost in groups):
        head.append("paid for")
        for row, (*_, cost) in zip(shown, groups):
            row.append(money(cost))
    return "<div>errors</div>" + _table(head, shown) + _more(count, "groups")


def legs_table(state: RunState) -> str:
    """Per waterfall leg: hits, misses, unavailable, errors, never reached."""
    rows = state.leg_rows()
    return "<div>waterfalls</div>" + _table(LEG_COLUMNS, rows) if rows else ""


def workers_table(workers: list[WorkerView]) -> str:
    """A cluster run's workers: partitions running and finished, rows done of theirs, calls paid,
    rows in flight."""
    if not workers:
        return ""
    rows = [
        [w.worker, w.running, w.finished, f"{w.done:,}/{w.rows:,}", w.calls_executed, w.in_flight]
        for w in workers[:LIMIT]
    ]
    table = _table(
        ["worker", "partitions running", "finished", "rows done", "calls paid", "rows in flight"], rows
    )
    return table + _more(len(workers), "workers")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _more(count: int, what: str = "more") -> str:
    return f"<div>… and {count - LIMIT:,} more {what}</div>" if count > LIMIT else ""


def _e(value: Any) -> str:
    return escape(str(value))
