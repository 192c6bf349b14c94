"""A run as static HTML: what a saved or exported notebook shows of it (``Run._repr_html_``).

Counters, the providers (held until when, rate, 429s, rows waiting), parked rows and errors
grouped by message, each capped so a million-row run renders as small as a ten-row one.
"""

from __future__ import annotations

import time
from collections import Counter
from html import escape
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runtime.run import Run

__all__ = ["LIMIT", "counters_table", "providers_table", "errors_table", "legs_table", "parked_table", "run_html"]

LIMIT = 20  # rows shown of the parked table and groups shown of the errors


def run_html(run: Run) -> str:
    s = run.stats
    m = run._maprun
    state = "running" if run.running else ("stopped" if m.state.stopped else "finished")
    rate = (s.done / s.elapsed) if s.elapsed else 0.0
    parts = [f"<div class='playbook-run'><b>{_e(m.play.name)}</b> · {state} · {s.elapsed:.1f}s · {rate:,.0f} rows/s", counters_table(s)]
    holds = {h.provider: h for h in run.holds}
    parts.append(providers_table([(name, p, holds[name].until if name in holds else None, holds[name].waiting_rows if name in holds else 0) for name, p in m.state.providers.items()]))
    parked = [(m._labels[p], m.park_reason[p], m.park_provider[p], m.park_ready[p]) for p, st in enumerate(m.status) if st == "parked"]
    parts.append(parked_table(parked[:LIMIT], len(parked)))
    errors = Counter(e for e, st in zip(m.errors, m.status) if st == "failed")
    example: dict[str, Any] = {}
    if errors:
        for label, e, st in zip(m._labels, m.errors, m.status):
            if st == "failed" and e not in example:
                example[e] = label
    parts.append(errors_table([(count, message, example[message]) for message, count in errors.most_common(LIMIT)], len(errors)))
    parts.append(legs_table(m.state.waterfalls))
    return "\n".join(parts) + "</div>"


def counters_table(s: Any) -> str:
    """The run's counters, from its ``RunStats`` or its live ``RunState``."""
    return _table(
        ["rows", "ok", "reused", "failed", "held", "parked", "skipped", "calls paid", "calls reused", "cost spent", "cost saved"],
        [[s.total, s.ok, s.reused, s.failed, s.held, s.parked, s.skipped, s.calls_executed, s.calls_reused, f"{s.cost_spent:g}", f"{s.cost_saved:g}"]],
    )


def providers_table(rows: list[tuple[str, Any, float | None, int]], *, now: float | None = None) -> str:
    """One line per provider: (name, provider, held until or None, rows waiting).  Given ``now``,
    a hold shows the seconds left, for a live countdown."""
    if not rows:
        return ""
    shown = []
    for name, p, until, waiting in rows:
        if until is None:
            state = "open"
        elif now is None:
            state = "held until " + _clock(until)
        else:
            state = f"held {max(until - now, 0):,.0f}s more, until {_clock(until)}"
        if until is not None and p.last_status:
            state += f" (HTTP {p.last_status})"
        shown.append([name, state, "unlimited" if p.rate is None else f"{p.rate:.3g}/s", p.in_flight, p.refused, waiting])
    return _table(["provider", "state", "rate", "in flight", "429s", "rows waiting"], shown)


def parked_table(rows: list[tuple[Any, str, str | None, float | None]], count: int) -> str:
    """Parked rows (row, reason, provider, ready_at), the first ``LIMIT`` of ``count``."""
    if not rows:
        return ""
    shown = [[r, why, prov or "", _clock(ready) if ready else ""] for r, why, prov, ready in rows]
    return "<div>parked rows</div>" + _table(["row", "reason", "provider", "ready at"], shown) + _more(count)


def errors_table(groups: list[tuple[int, str, Any]], count: int) -> str:
    """Failed rows grouped by message: (rows, message, example row), ``LIMIT`` groups of ``count``."""
    if not groups:
        return ""
    return "<div>errors</div>" + _table(["rows", "error", "e.g. row"], [list(g) for g in groups]) + _more(count)


def legs_table(waterfalls: dict[str, list[list[Any]]]) -> str:
    """Per waterfall leg: hits, misses, unavailable, errors, never reached."""
    rows = [[key, i, *leg] for key, legs in waterfalls.items() for i, leg in enumerate(legs)]
    if not rows:
        return ""
    return "<div>waterfalls</div>" + _table(["waterfall", "leg", "tool", "hits", "misses", "unavailable", "errors", "never_reached"], rows)


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _more(count: int) -> str:
    return f"<div>… and {count - LIMIT:,} more</div>" if count > LIMIT else ""


def _e(value: Any) -> str:
    return escape(str(value))
