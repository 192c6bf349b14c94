"""``await ctx.run_play(play, **inputs)``: another play as a step of this row.

The sub-play runs with a context of its own over a row made of ``inputs``, sharing the outer
row's run (store, providers, budget) and position (its holds spend the outer row's wait budget).
Its row memo is keyed by its fingerprint and its inputs as a row of those columns would be, so
``df.play.map(sub)`` over a frame of those columns and ``ctx.run_play(sub, ...)`` from any other
play share memos and receipts: what one paid for, the other reuses.

A hold, a sleep or a park met inside it steps the outer row aside (the outer row replays, and
the sub-play's finished calls hit their receipts); its error is the outer row's, unless the
outer play catches it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playbook.addresses import memo_address, row_id
from playbook.errors import PlayDefinitionError
from playbook.events import CallFinished, RunNotice
from playbook.plays.play import Play, as_play, play_name
from playbook.runtime.calls.ledger import RowLedger
from playbook.runtime.rows.frames import Row, play_row
from playbook.runtime.rows.memos import tools_unchanged, write_memo
from playbook.tagged import Unencodable
from playbook.tools import Tool

__all__ = ["run_play"]


async def run_play(
    ctx: RowLedger, play: Any, inputs: dict[str, Any], child: Callable[[str], tuple[Any, RowLedger]]
) -> dict[str, Any]:
    """The sub-play's output for ``inputs``: from its memo, or run now and memoised.  ``ctx``: the
    row running it; ``child(row_id)``: a context for the sub-play's row, and its ledger."""
    sub = _as_sub_play(ctx, play)
    try:
        key = row_id(list(inputs.values()))
    except TypeError as exc:
        hint = ctx.forgotten_await(exc.value) if isinstance(exc, Unencodable) and exc.awaitable else str(exc)
        raise PlayDefinitionError(
            f"ctx.run_play({sub.name!r}): its inputs cannot identify a row ({hint})"
        ) from None
    store = ctx.scope.store
    mk = memo_address(sub.fingerprint, key)
    if not ctx.scope.rerun_rows:
        memo = store.memos([mk]).get(mk)
        if memo is not None and tools_unchanged(memo.tools):
            ctx.absorb(
                memo.calls,
                memo.cost,
                {**memo.tools, play_name(sub.name): sub.fingerprint},
                (),
                local=memo.local,
                unpriced=memo.unpriced,
            )
            _reused_calls(ctx, sub.name, memo.calls, memo.cost, memo.local, memo.unpriced)
            return dict(memo.output)
    # The outer row's memo counts the sub-play as it counts a tool: defined anew, it answers no more.
    ctx.absorb(0, 0.0, {play_name(sub.name): sub.fingerprint}, ())
    given, inner = child(key)
    try:
        output, stored = await play_row(
            sub, Row({name: i for i, name in enumerate(inputs)}, tuple(inputs.values()), None), given, inner
        )
    except Exception as exc:
        exc.add_note(f"in ctx.run_play({sub.name!r}, ...)")
        raise
    finally:
        inner.close()
        ctx.absorb(
            inner.calls,
            inner.cost,
            inner.tools,
            inner.receipts,
            (inner.paid, inner.refused),
            inner.local,
            inner.unpriced,
        )
    if stored is not None:
        write_memo(
            store,
            mk,
            sub.name,
            output,
            stored,
            (inner.calls, inner.cost, inner.tools, inner.receipts, inner.local, inner.unpriced),
            key,
        )
    return output


def _reused_calls(ctx: RowLedger, play: str, calls: int, cost: float, local: int, unpriced: int) -> None:
    """The run counts the calls a reused sub-play made as it does a reused row's: reused, but for
    its ``local`` calls of free local tools, which neither ran nor were answered by receipts
    (``unpriced`` of them had no price)."""
    for n in range(calls - local):
        ctx.scope.emit(
            CallFinished(
                f"play {play}",
                None,
                True,
                cost if n == 0 else 0.0,
                unpriced=n < unpriced,
                position=ctx.position,
            )
        )


def _as_sub_play(ctx: RowLedger, play: Any) -> Play:
    """``play`` as this run runs it: made current once per run (by its first row), its notes said once."""
    scope = ctx.scope
    known = scope.plays.get(id(play))
    if known is not None:
        return known[1]  # type: ignore[no-any-return]
    sub = _checked(play)
    scope.plays[id(play)] = (play, sub)
    for value, note in sub.notes.items():
        if value not in scope.said:
            scope.said.add(value)
            scope.emit(RunNotice(note, 0))
    return sub


def _checked(play: Any) -> Play:
    if isinstance(play, Tool):
        raise PlayDefinitionError(
            f"ctx.run_play() runs a play; {play.name!r} is a tool: await ctx.tool({play.name}, ...)"
        )
    try:
        return as_play(play)
    except PlayDefinitionError as exc:
        raise PlayDefinitionError(f"ctx.run_play(): {exc}") from None
