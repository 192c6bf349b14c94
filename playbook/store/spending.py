"""What runs spent, kept beside the receipts: calls and money paid, calls reused and what reuse
saved, per UTC day, provider and tool (``store.spend()``, ``python -m playbook cache spend``).

A receipt answers for one call; it does not say how often it was reused, and a call paid for again
(``refresh``) replaces it.  So each run adds its own figures to a small ledger as it ends (a run stopped,
interrupted or stopped by a fatal error too): the same store, the same transaction rules.  Rows
reused whole from their memos are counted under the play (``"play <name>"``, no provider): a
memo says what its calls cost, not which tools made them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

import pandas as pd

from playbook.store.io import StoreIO
from playbook.store.protocol import Backend, SpendRow, StoreFailure, cannot_read

__all__ = ["BY", "FIGURES", "SpendLines", "Spending"]

BY = ("day", "provider", "tool")  # what spend() can be grouped by
# calls_unpriced, reused_unpriced: of calls_paid and calls_reused, those whose model has no price
# (their cost is not known: it is in neither cost_paid nor cost_saved)
FIGURES = ("calls_paid", "cost_paid", "calls_reused", "cost_saved", "calls_unpriced", "reused_unpriced")
_COUNTS = {name: "int64" for name in FIGURES if not name.startswith("cost")}


class SpendLines(dict[tuple[str | None, str], list[float]]):
    """A run's own figures: (provider or None, tool) -> [calls paid, cost paid, calls reused, cost
    saved, calls paid unpriced, calls reused unpriced]."""

    def __missing__(self, key: tuple[str | None, str]) -> list[float]:
        line = self[key] = [0, 0.0, 0, 0.0, 0, 0]
        return line


class Spending:
    """A store's spend ledger (module docstring): a part of :class:`~playbook.store.engine.StoreEngine`,
    which adds each run's figures and reads them back; ``notice`` hears a ledger that refused them."""

    def __init__(
        self, backend: Backend, io: StoreIO, *, location: str, notice: Callable[[str], None]
    ) -> None:
        self._backend = backend
        self._io = io
        self._location = location
        self._notice = notice

    def __repr__(self) -> str:
        return f"<Spending of {self._location}>"

    def add(self, lines: SpendLines, when: float) -> None:
        """Add a run's figures under the UTC day of ``when`` (epoch seconds).  A store that
        refuses them says so; the receipts, what was paid for, are not touched."""
        day = dt.datetime.fromtimestamp(when, dt.UTC).date().isoformat()
        rows: list[SpendRow] = [
            (day, provider or "", tool, int(paid), cost, int(reused), saved, int(unpriced), int(reunpriced))
            for (provider, tool), (paid, cost, reused, saved, unpriced, reunpriced) in lines.items()
        ]
        if not rows or self._backend.readonly:
            return
        if self._io.remote:
            self._io.submit(lambda: self._write_spend(rows), lambda *_: None)
        else:
            self._write_spend(rows)

    def _write_spend(self, rows: Sequence[SpendRow]) -> None:
        try:
            self._backend.write_spend(rows)
        except StoreFailure as exc:
            self._notice(
                f"what this run spent could not be added to store.spend() at {self._location}: {exc.reason} (its receipts are kept)"
            )

    def read(self, by: str | Sequence[str] = ("provider", "tool", "day")) -> pd.DataFrame:
        """Calls and money per ``by`` (any of ``"day"``, ``"provider"``, ``"tool"``): paid, reused,
        and saved by reuse, from what every run on this store added as it ended; the calls of
        those whose cost is not known (unpriced), and NaN money where no call of a line had a price."""
        keys = [by] if isinstance(by, str) else list(by) if isinstance(by, (list, tuple)) else [by]
        wrong = [k for k in keys if k not in BY]
        if wrong or len(set(keys)) != len(keys):
            raise ValueError(f"spend(by={by!r}): by names some of {', '.join(map(repr, BY))}, each once")
        try:
            rows = self._backend.spend_rows()
        except StoreFailure as exc:
            raise cannot_read(self._location, exc) from None
        # a ledger line of an older playbook has no unpriced calls
        frame = pd.DataFrame(
            [(*row, 0, 0)[: len(BY) + len(FIGURES)] for row in rows], columns=[*BY, *FIGURES]
        )
        frame["provider"] = frame["provider"].replace("", None)
        if not keys:
            return _unknown(frame[list(FIGURES)].sum().to_frame().T.astype(_COUNTS).round(9))
        grouped = frame.groupby(keys, sort=True, dropna=False)[list(FIGURES)].sum().reset_index()
        # Money to 9 decimals, as run.stats says it: sums of many prices carry float noise
        # (8.999999999999996).
        return _unknown(grouped.astype(_COUNTS).round({"cost_paid": 9, "cost_saved": 9}))


def _unknown(frame: pd.DataFrame) -> pd.DataFrame:
    """A line whose calls all had no price cost what nobody knows: NaN, not 0 (a line with some
    priced calls keeps their sum, and its unpriced calls say what it leaves out)."""
    for cost, calls, unpriced in (
        ("cost_paid", "calls_paid", "calls_unpriced"),
        ("cost_saved", "calls_reused", "reused_unpriced"),
    ):
        blind = (frame[unpriced] > 0) & (frame[unpriced] >= frame[calls]) & (frame[cost] == 0)
        frame[cost] = frame[cost].mask(blind)
    return frame
