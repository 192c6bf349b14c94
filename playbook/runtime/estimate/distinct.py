"""The calls a frame's rows share, counted from its columns (what a pilot's estimate projects).

Two rows whose calls have the same inputs make one call: the first pays for it, the other is
answered by its receipt (or waits for it in flight).  A pilot's rows are too few to show how
often that happens over a whole frame.  When every pilot row called a tool once, and each of the
call's inputs was the row's value in one column (or the same for every pilot row), the calls the
rows left will make of it are the distinct combinations of those columns among them: those with
no receipt yet are paid once each (a receipt made before, by an earlier run or by the pilot, is
free).  :func:`counted` counts them, asking the store for each combination's receipt (for a
sample of them when there are more than ``CHECKED``).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from playbook.runtime.calls.observed import Called
from playbook.store import MISSING
from playbook.tools.protocol import NO_INPUT

if TYPE_CHECKING:
    from playbook.runtime.rows.table import RowTable
    from playbook.store import StoreEngine
    from playbook.tools.protocol import ToolEngine

__all__ = ["CHECKED", "Counted", "counted"]

CHECKED = 10_000  # distinct calls whose receipts are looked up; of more, a random sample of this many

Path = tuple[str, ...]  # where an input sits in a call: ("kw", name), ("in",) or ("in", name)


@dataclass(frozen=True)
class Counted:
    """A tool every row calls once, once per distinct combination of ``columns``: over the rows
    left, ``rows`` make the call, ``distinct`` combinations among them, ``calls`` of those with no
    receipt yet (each paid once), ``reused`` rows whose call has a receipt already; the rest share
    a call another row left pays for.  ``checked``: the combinations looked up (all, or a sample)."""

    columns: tuple[str, ...]
    rows: int
    distinct: int
    calls: int
    reused: int
    checked: int

    @property
    def shared(self) -> int:
        return max(0, self.rows - self.reused - self.calls)


async def counted(
    calls: dict[int, dict[str, dict[tuple[str, int], Called]]],
    tools: dict[str, ToolEngine],
    measured: Sequence[int],
    left: Sequence[int],
    table: RowTable,
    store: StoreEngine,
    seed: int = 0,
) -> dict[str, Counted]:
    """Per tool name: the calls the rows ``left`` will make of it, when the ``measured`` pilot
    rows' ``calls`` show its inputs are read from columns (see the module's doc)."""
    found: dict[str, Counted] = {}
    rows = [table.row(p) for p in measured]
    for name, tool in tools.items():
        made = [calls.get(p, {}).get(name) for p in measured]
        if not made or any(m is None or len(m) != 1 for m in made):
            continue  # some pilot row did not call it, or called it more than once (itself, or in a sub-play)
        read = _read([next(iter(m.values())) for m in made if m is not None], rows, list(table.columns))
        if read is not None:
            count = await _count(tool, *read, left, table, store, seed)
            if count is not None:
                found[name] = count
    return found


def _inputs(call: Called) -> dict[Path, Any]:
    inputs: dict[Path, Any] = {("kw", k): v for k, v in call.kwargs.items()}
    if isinstance(call.input, Mapping):
        inputs.update({("in", str(k)): v for k, v in call.input.items()})
    elif call.input is not NO_INPUT:
        inputs[("in",)] = call.input
    return inputs


def _read(made: list[Called], rows: list[Any], columns: list[Any]) -> tuple[Called, dict[Path, Any]] | None:
    """The first call, and for each of its inputs the column it is read from (absent: the same in
    every call), when every call's inputs are so read; else ``None``."""
    first = made[0]
    if any(c.refreshed or c.ttl != first.ttl or _shape(c) != _shape(first) for c in made):
        return None  # a refreshed call is paid by every row; calls of different shapes are not one call
    inputs = [_inputs(c) for c in made]
    read: dict[Path, Any] = {}
    for path in inputs[0]:
        values = [i[path] for i in inputs]
        matching = [col for col in columns if all(_same(v, row[col]) for v, row in zip(values, rows))]
        if matching:
            read[path] = path[-1] if path[-1] in matching else matching[0]
        elif len(values) < 2 or not all(_same(v, values[0]) for v in values):
            return None  # an input made from the row, not read from it
    return first, read


def _shape(call: Called) -> tuple[Any, ...]:
    kind = "none" if call.input is NO_INPUT else "map" if isinstance(call.input, Mapping) else "one"
    return kind, tuple(_inputs(call))


def _same(a: Any, b: Any) -> bool:
    try:
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return a is b or bool(a == b)
    except Exception:  # an array's ==, a value that cannot compare
        return False


async def _count(
    tool: ToolEngine,
    first: Called,
    read: dict[Path, Any],
    left: Sequence[int],
    table: RowTable,
    store: StoreEngine,
    seed: int,
) -> Counted | None:
    """The rows ``left``'s calls of ``tool``: their combinations of the columns read, and which
    of those have a receipt (``None``: a column's values cannot be told apart, as a list's)."""
    columns = tuple(dict.fromkeys(read.values()))
    at = [table.columns[c] for c in columns]
    try:
        combos = Counter(tuple(values[i] for i in at) for values in map(table.values, left))
    except TypeError:
        return None
    distinct = list(combos)
    checked = distinct if len(distinct) <= CHECKED else random.Random(seed).sample(distinct, CHECKED)
    keys = [_key(tool, first, read, dict(zip(columns, combo))) for combo in checked]
    answers = iter(await asyncio.gather(*(store.alookup(k, first.ttl) for k in keys if k is not None)))
    rows = reused = calls = 0
    for combo, key in zip(checked, keys):
        if key is None:
            continue  # a call that cannot be made (a missing value): its row fails before paying
        rows += combos[combo]
        if next(answers) is not MISSING:
            reused += combos[combo]
        else:
            calls += 1
    picked = sum(combos[c] for c in checked) or 1
    scale = len(left) / picked  # 1 unless a sample of the combinations was looked up
    return Counted(
        columns,
        round(rows * scale),
        len(distinct),
        round(calls * len(distinct) / max(1, len(checked))),
        round(reused * scale),
        len(checked),
    )


def _key(tool: ToolEngine, first: Called, read: dict[Path, Any], values: dict[Any, Any]) -> str | None:
    """The address of ``first`` made again with the columns' ``values`` for the inputs read from them."""
    given = {path: values[col] for path, col in read.items()}
    kwargs = {k: given.get(("kw", k), v) for k, v in first.kwargs.items()}
    if isinstance(first.input, Mapping):
        input: Any = {k: given.get(("in", str(k)), v) for k, v in first.input.items()}
    else:
        input = given.get(("in",), first.input)
    try:
        return tool.address(tool.bind(input, kwargs))
    except Exception:  # what fails the row in the run (a missing value, an input with no JSON form)
        return None
