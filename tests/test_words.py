"""Amounts as people write them: money with its sign and cents (never 8.1e-05), tokens at a
glance, the same in the summary, the panel, the command line, the estimate and the reprs."""

from __future__ import annotations

import pandas as pd
import pytest

import playbook as pb
from playbook._internal.words import money, tokens
from playbook.runtime.calls.scope import CostBudget
from playbook.ui.tally import Tally
from playbook.ui.text import summary


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (8.1e-05, "$0.000081"),
        (0.0123, "$0.012"),
        (0.5, "$0.50"),
        (0.0, "$0.00"),
        (24.45, "$24.45"),
        (1204.1, "$1,204.10"),
        (0.999, "$1.00"),
        (9.999e-05, "$0.0001"),
        (1e-12, "<$0.000000001"),
        (-3.2, "-$3.20"),
    ],
)
def test_money_reads_with_its_sign_and_cents_and_never_in_scientific_notation(
    amount: float, text: str
) -> None:
    """A dollar and up in cents with thousands' commas; under it two significant digits, at least the cents."""
    assert money(amount) == text


def test_tokens_read_at_a_glance() -> None:
    """89.4k tokens, 1.2M tokens; a small count whole."""
    assert [tokens(n) for n in (1, 950, 1204, 89_400, 1_200_000)] == [
        "1 token",
        "950 tokens",
        "1,204 tokens",
        "89.4k tokens",
        "1.2M tokens",
    ]


def test_a_run_that_cost_fractions_of_a_cent_says_so_in_its_summary_panel_and_budget(
    store: pb.ReceiptStore,
) -> None:
    """Three calls at $0.000027 read $0.000081 in the text summary, the panel's counters and an
    error group's cost; a budget's repr and the reason a call parks say money the same way."""

    @pb.tool(cost=0.000027)
    async def lookup(n: int) -> int:
        return n

    @pb.play
    async def cheap(row, ctx):
        got = await ctx.tool(lookup, n=row.n)
        if row.n == 2:
            raise ValueError("too cheap")
        return {"got": got}

    run = pd.DataFrame({"n": range(3)}).play.run(cheap, store=store, progress=False)
    text = summary(run.state, Tally.of(run.state))
    assert (
        "cost $0.000081 spent ($0.000027 on failures), $0.00 saved" in text and "(paid $0.000027)" in text
    ), text
    html = run._repr_html_()
    assert "<td>$0.000081</td>" in html and "<td>$0.000027</td>" in html and "e-05" not in html
    budget = CostBudget(1204.1)
    assert budget.take(0.000081)
    assert repr(budget) == "<CostBudget $0.000081 of $1,204.10 (0 in flight)>"
    parked = pd.DataFrame({"n": range(3)}).play.map(
        cheap, store=store, progress=False, max_cost=0.00001, refresh=True
    )
    assert (
        "budget: calling 'lookup' (cost $0.000027) would pass max_cost=$0.00001"
        in parked["play_error"].iloc[0]
    )
