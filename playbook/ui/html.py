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

__all__ = ["run_html"]

LIMIT = 20  # rows shown of the parked table and groups shown of the errors


def run_html(run: Run) -> str:
    s = run.stats
    m = run._maprun
    state = "running" if run.running else ("stopped" if m.state.stopped else "finished")
    rate = (s.done / s.elapsed) if s.elapsed else 0.0
    parts = [
        f"<div class='playbook-run'><b>{_e(m.play.name)}</b> · {state} · {s.elapsed:.1f}s · {rate:,.0f} rows/s",
        _table(
            ["rows", "ok", "reused", "failed", "held", "parked", "skipped", "calls paid", "calls reused", "cost spent", "cost saved"],
            [[s.total, s.ok, s.reused, s.failed, s.held, s.parked, s.skipped, s.calls_executed, s.calls_reused, f"{s.cost_spent:g}", f"{s.cost_saved:g}"]],
        ),
    ]
    holds = {h.provider: h for h in run.holds}
    providers = m.state.providers
    if providers:
        rows = []
        for name, p in providers.items():
            hold = holds.get(name)
            until = hold.until if hold is not None else None
            rows.append([
                name,
                "held until " + time.strftime("%H:%M:%S", time.localtime(until)) if until else "open",
                "unlimited" if p.rate is None else f"{p.rate:.3g}/s",
                p.in_flight,
                p.refused,
                hold.waiting_rows if hold is not None else 0,
            ])  # fmt: skip
        parts.append(_table(["provider", "state", "rate", "in flight", "429s", "rows waiting"], rows))
    parked = [(m._labels[p], m.park_reason[p], m.park_provider[p], m.park_ready[p]) for p, st in enumerate(m.status) if st == "parked"]
    if parked:
        shown = [[r, why, prov or "", time.strftime("%H:%M:%S", time.localtime(ready)) if ready else ""] for r, why, prov, ready in parked[:LIMIT]]
        parts.append("<div>parked rows</div>" + _table(["row", "reason", "provider", "ready at"], shown) + _more(len(parked)))
    errors = Counter(e for e, st in zip(m.errors, m.status) if st == "failed")
    if errors:
        example: dict[str, Any] = {}
        for label, e, st in zip(m._labels, m.errors, m.status):
            if st == "failed" and e not in example:
                example[e] = label
        groups = [[count, message, example[message]] for message, count in errors.most_common(LIMIT)]
        parts.append("<div>errors</div>" + _table(["rows", "error", "e.g. row"], groups) + _more(len(errors)))
    legs = run.waterfalls
    if len(legs):
        parts.append("<div>waterfalls</div>" + _table(list(legs.columns), legs.values.tolist()))
    return "\n".join(parts) + "</div>"


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _more(count: int) -> str:
    return f"<div>… and {count - LIMIT:,} more</div>" if count > LIMIT else ""


def _e(value: Any) -> str:
    return escape(str(value))
