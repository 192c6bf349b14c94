"""What an :class:`~playbook.runtime.estimate.projection.Estimate` says beside its figures: the notes on what
its projection could not see, why an interval has no width, and its table per provider and tool.

Each works on the pilot's logs as the projection does: an array of rows × (provider, tool) ×
:data:`~playbook.runtime.estimate.pilot.FIELDS`, and the projection's ``point`` (its totals per
(provider, tool) and each provider's share of the time).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from playbook._internal.words import money
from playbook.runtime.estimate.pilot import FIELDS

if TYPE_CHECKING:
    from playbook.runtime.estimate.distinct import Counted
    from playbook.runtime.estimate.pilot import Pilot

__all__ = ["NO_PROVIDER", "figure", "no_spread", "pilot_notes", "shared_notes", "table"]

# the table's provider of a tool made with none (a paid Python tool, an HTTP tool given none)
NO_PROVIDER = "(no provider)"

_P, _R, _C, _T, _S, _W, _F, _SPAN, _SH, _RF, _ON, _O = range(len(FIELDS))
_NOTHING = {
    "paid_calls": "no pilot row paid a call",
    "cost": "no call the pilot paid cost money",
    "tokens": "no call the pilot paid counted tokens",
}


def figure(value: float) -> float:
    """A projected amount to 6 significant digits: a sum of floats shows no ``37.41000000000001``
    (money keeps its cents up to $9,999.99, and tenths of a cent below $1,000)."""
    return float(f"{value:.6g}") if math.isfinite(value) else value


def pilot_notes(pilot: Pilot, n: int, scale: int, failed_rows: int, cost_failed: float) -> list[str]:
    """What the projection could not see, or what the pilot saw fail."""
    notes = []
    if pilot.cut:
        why = ", ".join(f"{rows} {reason}" for reason, rows in sorted(pilot.cut.items()))
        notes.append(
            f"{sum(pilot.cut.values())} of the pilot's rows did not end ({why}): projected from the {n} that did"
        )
    if pilot.failed and scale:
        paying = f", paying ~{money(cost_failed)}" if cost_failed else ""
        notes.append(
            f"{len(pilot.failed)} of the pilot's {n} rows failed (pb.last_run().errors): ~{failed_rows:,} of the rest may{paying}"
        )
    batched = sorted(name for name, tool in pilot.log.tools.items() if tool.submits())
    if batched and scale:
        notes.append(
            f"{', '.join(map(repr, batched))} sends its calls as batch jobs, answered within 24 hours: the time "
            "projected is not theirs"
        )
    return notes


def shared_notes(
    logs: np.ndarray, keys: list[tuple[str | None, str]], counts: dict[int, Counted], scale: int
) -> list[str]:
    """Calls projected per row that pilot rows shared: the rows left share them in the pilot's share."""
    notes = []
    for i, (_, tool) in enumerate(keys):
        shared = logs[:, i, _SH].sum()
        if scale and i not in counts and shared:
            made = logs[:, i, [_P, _R, _SH]].sum()
            notes.append(
                f"{shared:g} of the pilot's {made:g} calls of {tool!r} were another pilot row's: the rows left are projected to share "
                "as many (their inputs are not read from columns; a frame that repeats them more pays less)"
            )
    return notes


def no_spread(
    logs: np.ndarray,
    keys: list[tuple[str | None, str]],
    point: dict[str, Any],
    counts: dict[int, Counted],
    each: dict[int, np.ndarray],
    interval: dict[str, tuple[float, float]],
) -> dict[str, str]:
    """Why paid calls, cost or tokens have an interval of no width: what every pilot row paid alike."""
    said = {}
    for name, at in (("paid_calls", _P), ("cost", _C), ("tokens", _T)):
        low, high = interval[name]
        if not math.isclose(low, high, rel_tol=1e-9, abs_tol=1e-12):
            continue
        parts = [
            _alike(logs[:, i], tool, at, counts.get(i), each.get(i))
            for i, (_, tool) in enumerate(keys)
            if point["totals"][i, at] > 0
        ]
        said[name] = "; ".join(parts) or _NOTHING[name]
    return said


def _alike(lines: np.ndarray, tool: str, at: int, count: Counted | None, each: np.ndarray | None) -> str:
    """What every pilot row paid alike for ``tool`` (``lines``: rows × fields), in field ``at``."""
    if count is not None and each is not None:
        which = ", ".join(map(str, count.columns))
        said = (
            f"{tool!r} is paid once per distinct {which}: {count.calls:,} left with no receipt"
            if which
            else (f"{tool!r} is the same call for every row: {count.calls:,} left to pay")
        )
        per, unit = each, " each"
    else:
        calls = float(lines[:, _P].mean())
        said = f"every pilot row paid {calls:g} call{'' if calls == 1 else 's'} of {tool!r}"
        per, unit = lines.mean(axis=0), " a row"
    if at == _C:
        said += f", at {per[_C]:.4g}{unit}"
    elif at == _T:
        said += f", {per[_T]:,.0f} tokens{unit}"
    if count is None and not lines[:, _SH].any():
        # Not exact: 20 rows rarely share a call, and rows left that do would pay less.
        said += (
            " (projected per row: the rows left are assumed to share its calls no more than the pilot's rows, which shared "
            "none; an input read from a column is counted per distinct value)"
        )
    return said


def table(
    logs: np.ndarray,
    keys: list[tuple[str | None, str]],
    point: dict[str, Any],
    counts: dict[int, Counted],
    unpriced: Collection[tuple[str | None, str]] = (),
) -> pd.DataFrame:
    """One row per provider and tool: the calls the rows left will make, paid, answered by
    receipts made before and shared with another row, money, tokens, a request's seconds, the
    share of requests that failed (brought back nothing to keep: the run's ``calls_failed``) and
    the paid calls refused (a client error kept as the call's answer: the row fails, no money);
    what the money would be were the calls asked online (a tool in ``mode="batch"`` pays less);
    what the calls are projected per (a row, or the distinct values of columns); and the
    provider's seconds and what bounds it.  An unpriced tool's cost is missing (NaN), not 0."""
    rows = []
    for i, (provider, tool) in enumerate(keys):
        line = point["totals"][i]
        share = point["shares"].get(provider, (math.nan, ""))
        per = f"distinct {', '.join(map(str, counts[i].columns)) or 'call'}" if i in counts else "row"
        sent = logs[:, i, _S].sum()
        rows.append(
            {
                "provider": NO_PROVIDER if provider is None else provider,
                "tool": tool,
                "paid_calls": round(float(line[_P])),
                "reused_calls": round(float(line[_R])),
                "shared_calls": round(float(line[_SH])),
                "per": per,
                "cost": math.nan if (provider, tool) in unpriced else figure(float(line[_C])),
                "online_cost": math.nan if (provider, tool) in unpriced else figure(float(line[_ON])),
                "tokens": figure(float(line[_T])),
                "request_seconds": float(logs[:, i, _W].sum() / sent) if sent else math.nan,
                "requests_failed": float(logs[:, i, _F].sum() / sent) if sent else 0.0,
                "refused_calls": round(float(line[_RF])),
                "provider_seconds": share[0],
                "held_by": share[1],
            }
        )
    columns = [
        "provider",
        "tool",
        "paid_calls",
        "reused_calls",
        "shared_calls",
        "per",
        "cost",
        "tokens",
        "online_cost",
        "request_seconds",
        "requests_failed",
        "refused_calls",
        "provider_seconds",
        "held_by",
    ]
    return pd.DataFrame(rows, columns=columns)
