"""An ``Estimate``: a pilot's rows projected over the rows the run has left to run.

Paid calls, money and tokens are each sampled row's own, averaged and multiplied by the rows
left (a waterfall's later legs are paid only by the rows whose first legs missed: the average
carries the miss rates), except for calls rows share: a tool every pilot row called once with
inputs read from columns is paid once per distinct combination of those columns among the rows
left with no receipt yet (see :mod:`playbook.runtime.estimate.distinct`), each what a paid call of it cost
in the pilot.  Calls a pilot row shared with another (a receipt it made, or a call in flight) are
free, in the pilot's share.  Duration is the longest of:

- per provider, the requests it will be sent (failed ones included: they count against its
  limits) over what it lets through: its rate now (configured, announced, or lowered after
  429s), its calls in flight over a request's time, its tokens per second over a call's tokens;
- the rows over what the run's ``concurrency`` lets through: rows in flight over a row's time on
  the wire.

The provider whose share is longest is the bottleneck.  Intervals are a bootstrap over the sampled
rows (the same projection over rows drawn again with replacement): 5% and 95% of 400 draws.  One
with no width says why (``Estimate.no_spread``): every pilot row paid the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from playbook._internal.words import duration, money, short_count, tokens
from playbook.providers.status import ProviderStatus
from playbook.runtime.estimate.distinct import Counted
from playbook.runtime.estimate.pilot import FIELDS, Flight, Pilot
from playbook.runtime.estimate.words import figure, no_spread, pilot_notes, shared_notes, table
from playbook.runtime.run import scheduler

if TYPE_CHECKING:
    from playbook.runtime.run import Run

__all__ = ["PILOT_ROWS", "Estimate", "after_pilot", "declined", "pilot_estimate", "project"]

PILOT_ROWS = 20  # the pilot of estimate=True (df.play.estimate's sample by default)
GROWTH = 10  # with precision=, a pilot runs at most this many times its sample

_DRAWS = 400
# the table's columns of money and tokens, as every view shows them (typed Any: the stubs want a
# Mapping[Never, ...])
_AMOUNTS: Any = {
    "cost": lambda v: v if isinstance(v, str) else money(v),
    "online_cost": lambda v: v if isinstance(v, str) else money(v),
    "tokens": short_count,
}
# paid, reused, cost, tokens, sent, seconds (on the wire), failed, span, shared, refused
_P, _R, _C, _T, _S, _W, _F, _SPAN, _SH, _RF, _ON, _O = range(len(FIELDS))


@dataclass(frozen=True)
class Estimate:
    """What the run will pay and take for the rows it has left, projected from a pilot.

    ``paid_calls``, ``cost``, ``tokens`` and ``seconds`` are point projections for the rows left;
    ``interval`` their low and high (a 90% bootstrap interval over the sampled rows), and
    ``no_spread`` why one of paid calls, cost and tokens has no width ("every pilot row paid 1 call
    of 'lookup'");
    ``failed_rows`` and ``cost_failed`` what the pilot's failures project; ``reused_rows`` the rows
    a run will not run (answered by memos, or finished by the pilot), ``rows_left`` the others;
    ``bottleneck`` the provider that holds the run back (``None``: none is timed), and ``limit``
    what holds it ("40 rps", "8 calls in flight of 0.5s"...); ``notes`` what the projection
    could not see; ``table`` one row per provider and tool.  ``pilot`` is what the pilot itself
    ran and paid (``RunStats``).  ``online_cost`` is what ``cost`` would be were every call asked
    online: more than ``cost`` when a tool sends its calls as batch jobs (``mode="batch"``), at
    their discount.
    """

    play: str
    rows: int
    reused_rows: int
    rows_left: int
    sample: int
    paid_calls: int
    cost: float
    tokens: float
    seconds: float
    failed_rows: int
    cost_failed: float
    interval: dict[str, tuple[float, float]]
    bottleneck: str | None
    limit: str
    notes: list[str] = field(repr=False)
    table: pd.DataFrame = field(repr=False)
    pilot: Any = field(repr=False)
    no_spread: dict[str, str] = field(default_factory=dict, repr=False)
    online_cost: float | None = None
    # tools whose calls have no price (their model is not in the price table): not in ``cost``
    unpriced: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<Estimate {self}>"

    def __str__(self) -> str:
        low, high = self.interval["cost"]
        spread = f" ({money(low)}–{money(high)})" if high > low else ""
        held = f", held back by {self.bottleneck!r} at {self.limit}" if self.bottleneck else ""
        left = f"{self.rows:,} rows: {self.reused_rows:,} already done"
        if not self.rows_left:
            return f"{left}; nothing left to pay for"
        words = f" (~{tokens(self.tokens)})" if self.tokens >= 1 else ""
        wide = "; a larger sample narrows it" if high - low > 0.3 * self.cost else ""
        wide += f"; no spread: {self.no_spread['cost']}" if "cost" in self.no_spread and self.cost else ""
        cost = f"{money(self.cost)}{spread}"
        if self.online_cost is not None and self.online_cost > self.cost:
            cost += f" in batch jobs ({money(self.online_cost)} asked online)"
        if self.unpriced:
            tools = ", ".join(map(repr, self.unpriced))
            cost = f"{cost} + {tools} unpriced" if self.cost else f"cost unpriced ({tools})"
        line = (
            f"{left}; ~{short_count(self.paid_calls)} paid calls{words}, {cost}, ~{duration(self.seconds)}{held}"
            f" (a pilot of {self.sample} rows{wide})"
        )
        return "; ".join([line, *self.notes])

    def text(self) -> str:
        """The line above, then the table: what the command line prints."""
        if self.table.empty:
            return str(self)
        return (
            str(self)
            + "\n"
            + _shown(self.table).to_string(
                index=False, float_format=lambda v: f"{v:,.4g}", formatters=_AMOUNTS
            )
        )

    def to_dict(self) -> dict[str, Any]:
        """The estimate as JSON data (``--json``)."""
        return {
            "play": self.play,
            "rows": self.rows,
            "reused_rows": self.reused_rows,
            "rows_left": self.rows_left,
            "sample": self.sample,
            "paid_calls": self.paid_calls,
            "cost": _round(self.cost),
            "online_cost": _round(self.online_cost),
            "tokens": _round(self.tokens),
            "seconds": _round(self.seconds),
            "failed_rows": self.failed_rows,
            "cost_failed": _round(self.cost_failed),
            "interval": {name: [_round(v) for v in bounds] for name, bounds in self.interval.items()},
            "bottleneck": self.bottleneck,
            "limit": self.limit,
            "notes": self.notes,
            "no_spread": self.no_spread,
            "unpriced": list(self.unpriced),
            "table": [{k: _round(v) for k, v in row.items()} for row in self.table.to_dict("records")],
            "pilot": self.pilot.model_dump(),
        }

    def _repr_html_(self) -> str:
        table = (
            _shown(self.table).to_html(
                index=False, float_format=lambda v: f"{v:,.4g}", formatters=_AMOUNTS, border=0, na_rep=""
            )
            if not self.table.empty
            else ""
        )
        return f"<div><b>{escape(self.play)}</b>: {escape(str(self))}</div>{table}"

    def below(self, max_cost: float | None) -> str | None:
        """Why ``max_cost`` (for the pilot and the run together) cannot pay for the rows left, when
        what the pilot left of it is below the estimate's low end."""
        low, spent = self.interval["cost"][0], self.pilot.cost_spent
        if max_cost is None or not self.rows_left or max_cost - spent >= low:
            return None
        after = (
            f" leaves {money(max(0.0, max_cost - spent))} after the pilot's {money(spent)}, which"
            if spent
            else ""
        )
        return (
            f"max_cost={max_cost:g}{after} is below what the {self.rows_left:,} rows left will cost (at least "
            f"{money(low)}, ~{money(self.cost)}): rows past it would park with reason 'budget'"
        )


def project(pilot: Pilot, play: str, concurrency: int, providers: dict[str, ProviderStatus]) -> Estimate:
    """Project ``pilot`` over the rows left; ``providers``: each called provider's status now.
    Only the sampled rows that ended (ok or failed) are projected from; the rest of the rows a
    run would run are what it is projected over."""
    keys = sorted(
        {where for p in pilot.measured for where in pilot.log.rows.get(p, {})},
        key=lambda w: (w[0] or "", w[1]),
    )
    n = len(pilot.measured)
    logs = np.zeros((n, len(keys), len(FIELDS)))
    for i, position in enumerate(pilot.measured):
        for where, line in pilot.log.rows.get(position, {}).items():
            logs[i, keys.index(where)] = line
    failed = np.array([p in pilot.failed for p in pilot.measured], dtype=bool)
    scale = max(0, pilot.runnable - n)
    # Calls counted from columns, of a tool the pilot paid for at least once: what one paid call of it costs.
    counts = {
        i: pilot.counted[where]
        for i, where in enumerate(keys)
        if where in pilot.counted and logs[:, i, _P].any()
    }
    each = {i: _per_call(logs[:, i]) for i in counts}
    point = _projection(logs, scale, keys, concurrency, providers, counts, each)
    draws = np.random.default_rng(0).integers(0, n, size=(_DRAWS, n)) if n else np.zeros((0, 0), dtype=int)
    spread = (
        [_projection(logs[d], scale, keys, concurrency, providers, counts, each) for d in draws] if n else []
    )
    interval = {
        name: (
            figure(float(np.percentile([s[name] for s in spread], 5))),
            figure(float(np.percentile([s[name] for s in spread], 95))),
        )
        if spread
        else (figure(point[name]), figure(point[name]))
        for name in ("paid_calls", "cost", "tokens", "seconds")
    }
    failed_rows = round(failed.sum() / n * scale) if n else 0
    cost_failed = figure(float(logs[failed][:, :, _C].sum() / n * scale)) if n else 0.0
    return Estimate(
        play=play,
        rows=pilot.rows,
        reused_rows=pilot.done_rows,
        rows_left=max(0, pilot.rows - pilot.done_rows),
        sample=len(pilot.sample),
        paid_calls=round(point["paid_calls"]),
        cost=figure(point["cost"]),
        tokens=figure(point["tokens"]),
        seconds=figure(point["seconds"]),
        failed_rows=failed_rows,
        cost_failed=cost_failed,
        interval=interval,
        bottleneck=point["bottleneck"],
        limit=point["limit"],
        notes=pilot_notes(pilot, n, scale, failed_rows, cost_failed)
        + shared_notes(logs, keys, counts, scale),
        table=table(logs, keys, point, counts, pilot.log.unpriced),
        pilot=pilot.stats,
        no_spread=no_spread(logs, keys, point, counts, each, interval) if n and scale else {},
        online_cost=figure(point["online_cost"]),
        unpriced=tuple(sorted({tool for _, tool in pilot.log.unpriced})),
    )


def _per_call(lines: np.ndarray, otherwise: np.ndarray | None = None) -> np.ndarray:
    """A tool's line per paid call, from the rows (of ``lines``: rows × fields) that paid one;
    ``otherwise`` when none did.  Its money and tokens are an answered call's: a call the pilot
    saw refused left a receipt that the rows left with its inputs reuse, so the calls still to pay
    are of inputs it did not see, and refused ones would not pull what each costs down."""
    paid = lines[:, _P] > 0
    if not paid.any():
        assert otherwise is not None
        return otherwise
    line = np.asarray(lines[paid].sum(axis=0) / paid.sum())
    answered = paid & (lines[:, _RF] == 0)
    if answered.any():
        line[[_C, _T, _ON, _O]] = lines[answered][:, [_C, _T, _ON, _O]].sum(axis=0) / answered.sum()
    line[_RF] = 0.0
    return line


def _projection(
    logs: np.ndarray,
    left: int,
    keys: list[tuple[str | None, str]],
    concurrency: int,
    providers: dict[str, ProviderStatus],
    counts: dict[int, Counted],
    each: dict[int, np.ndarray],
) -> dict[str, Any]:
    """Paid calls, cost, tokens and seconds for ``left`` rows like those of ``logs`` (rows × keys ×
    fields); a tool of ``counts`` is paid for its calls counted, each like a paid call of ``logs``
    (``each``: when none of them paid one)."""
    n = len(logs)
    totals = logs.sum(axis=0) / max(1, n) * left  # keys × fields
    if not n or not left:
        return {
            "paid_calls": 0.0,
            "cost": 0.0,
            "online_cost": 0.0,
            "tokens": 0.0,
            "seconds": 0.0,
            "bottleneck": None,
            "limit": "",
            "shares": {},
            "totals": totals,
        }
    for i, count in counts.items():
        totals[i] = _per_call(logs[:, i], each[i]) * count.calls
        totals[i, _R], totals[i, _SH] = count.reused, count.shared
    shares: dict[str, tuple[float, str]] = {}
    for name in sorted({p for p, _ in keys if p is not None}):
        mine = [i for i, (p, _) in enumerate(keys) if p == name]
        shares[name] = _provider_seconds(totals[mine].sum(axis=0), concurrency, providers.get(name))
    # A row's time: its calls one after the other, each from its first request to its answer.
    row_seconds = float(logs[:, :, _SPAN].sum(axis=1).mean())
    rows_seconds = left * row_seconds / max(1, concurrency)
    # none: no request timed (fixtures)
    slowest = max((p for p in shares if shares[p][0] > 0), key=lambda p: shares[p][0], default=None)
    seconds = max([rows_seconds, *(s for s, _ in shares.values())])
    if (
        slowest is not None
        and rows_seconds > shares[slowest][0]
        and not math.isclose(rows_seconds, shares[slowest][0])
    ):
        # The run's own concurrency holds it: the provider with the largest share of a row's time is named.
        wire = {
            name: float(sum(totals[i, _W] for i, (p, _) in enumerate(keys) if p == name)) for name in shares
        }
        slowest = max(wire, key=lambda p: wire[p])
        limit = f"the run's concurrency ({concurrency} rows in flight)"
    else:
        limit = shares[slowest][1] if slowest is not None else ""
    return {
        "paid_calls": float(totals[:, _P].sum()),
        "cost": float(totals[:, _C].sum()),
        "online_cost": float(totals[:, _ON].sum()),
        "tokens": float(totals[:, _T].sum()),
        "seconds": seconds,
        "bottleneck": slowest,
        "limit": limit,
        "shares": shares,
        "totals": totals,
    }


def _provider_seconds(
    totals: np.ndarray, concurrency: int, status: ProviderStatus | None
) -> tuple[float, str]:
    """How long a provider takes to answer ``totals`` (fields summed over its tools), and what bounds it."""
    sent = float(totals[_S])
    if sent <= 0 or status is None:
        return 0.0, ""
    bounds: list[tuple[float, str]] = []
    pace = _pace(status)
    if pace is not None and pace > 0:
        bounds.append((pace, f"{pace:.3g} rps"))
    latency = float(totals[_W]) / sent
    if latency > 0:
        flight = min(status.in_flight_limit or concurrency, concurrency)
        bounds.append((flight / latency, f"{flight} calls in flight of {latency:.2g}s"))
    tokens, output = float(totals[_T]) / sent, float(totals[_O]) / sent
    if status.tpm and tokens > 0:
        bounds.append((status.tpm / 60.0 / tokens, f"{short_count(status.tpm)} tokens a minute"))
    apart = {b.name: b.limit for b in status.budgets if b.limit}
    for name, per_call in (("input tokens", tokens - output), ("output tokens", output)):
        limit = apart.get(name)
        if limit and per_call > 0:
            bounds.append((limit / 60.0 / per_call, f"{short_count(limit)} {name} a minute"))
    if not bounds:
        return 0.0, ""
    rate, why = min(bounds)
    return sent / rate, why


def _pace(status: ProviderStatus) -> float | None:
    """Calls per second a provider lets through over a long run: its rate, or what its configured
    window allows when that is less; a pool's, its keys' in use summed (None: no bound known)."""
    if status.keys:
        active = [key for key in status.keys if key.retired is None]
        paces = [_pace(key) for key in [key for key in active if not key.held] or active]
        return None if not paces or None in paces else sum(p for p in paces if p is not None)
    window = status.window[0] / status.window[1] if status.window else None
    return min((p for p in (status.rate, window) if p is not None), default=None)


def _shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the views show it: a tool with no price costs "unpriced" (its cost is NaN),
    online too."""
    if not table["cost"].isna().any():
        return table
    return table.assign(
        **{
            name: [("unpriced" if math.isnan(v) else v) for v in table[name]]
            for name in ("cost", "online_cost")
        }
    )


def _round(value: Any) -> Any:
    """A float as JSON carries it: 9 decimals (no 1.8000000000000003), NaN as null."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 9)
    return value


async def pilot_estimate(
    run: Run,
    concurrency: int,
    sample: int,
    *,
    seed: int | None = 0,
    first: bool = False,
    precision: float | None = None,
) -> Estimate:
    """Fly ``run``'s pilot on ``sample`` rows and project it over the rows left.  With
    ``precision``, the pilot goes on, ``sample`` rows at a time (up to ``GROWTH`` times as many in
    all), while the money's interval (the paid calls', when nothing costs money) is wider than
    ``precision`` of the projection either side."""
    flight = Flight(run, seed=seed, first=first)
    found = await _flown(flight, sample, concurrency)
    while (
        precision is not None
        and _wide(found, precision)
        and flight.more
        and len(flight.chosen) < GROWTH * sample
    ):
        found = await _flown(flight, sample, concurrency)
    return found


async def _flown(flight: Flight, rows: int, concurrency: int) -> Estimate:
    pilot = await flight.fly(rows)
    providers = {name: provider.status() for name, provider in flight.run.state.providers.items()}
    return project(pilot, scheduler(flight.run).play.name, concurrency, providers)


def _wide(estimate: Estimate, precision: float) -> bool:
    """Is the projection's interval wider than ``precision`` of it, either side?"""
    name = "cost" if estimate.cost > 0 else "paid_calls"
    low, high = estimate.interval[name]
    point = estimate.cost if name == "cost" else estimate.paid_calls
    return bool(estimate.rows_left) and (high - low) / 2 > precision * point


def declined(run: Run) -> None:
    """The estimate was not accepted: the rows the pilot did not run are skipped, saying so."""
    scheduler(run).skip_rest("not run: the estimate was not accepted")


def after_pilot(options: dict[str, Any], estimate: Estimate) -> dict[str, Any]:
    """The run's options once its pilot ran: ``max_cost`` is for both, so the run has what the pilot
    left of it."""
    budget = options.get("max_cost")
    if budget is None:
        return options
    return {**options, "max_cost": max(0.0, budget - estimate.pilot.cost_spent)}
