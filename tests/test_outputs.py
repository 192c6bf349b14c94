"""What a play returns: the same values and types on the first run, a memo replay and a receipt
replay, in the play's column order; a coroutine returned instead of awaited fails its row, naming
the line, and is closed (no "never awaited" warning later)."""

from __future__ import annotations

import datetime as dt
import decimal
import gc
import linecache
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from exact import same

import playbook as pb

ODD = {
    "when": pd.Timestamp("2024-03-31 01:30", tz="Europe/Paris"),
    "naive": dt.datetime(2024, 5, 1, 12, 30, 15, 123456),
    "price": decimal.Decimal("1.10"),
    "took": dt.timedelta(minutes=5, microseconds=1),
    "pair": (1, "b"),
    "nan": math.nan,
    "nat": pd.NaT,
    "f32": np.float32(0.1),
    "inf": math.inf,
    "arr": np.array([[1, 2], [3, 4]], dtype=np.int16),
    "tags": {"b", "a"},
}


@pb.tool(version="1")
def odd(n: int) -> dict:
    return {"n": n, **ODD}


def test_outputs_replay_exactly_with_their_column_order(store: pb.ReceiptStore) -> None:
    """A row's output on its first run, from its memo, and rebuilt from receipts: same values, same types,
    the columns in the order the play returned them."""

    @pb.play
    async def play(row, ctx):
        got = await ctx.tool(odd, n=row.n)
        return {"z_last_name_first": got["pair"], **{k: got[k] for k in reversed(list(ODD))}}

    frame = pd.DataFrame({"n": [1, 2]})
    runs = [frame.play.run(play, store=store, progress=False)]
    runs.append(frame.play.run(play, store=store, progress=False))  # memos
    runs.append(frame.play.run(play, store=store, progress=False, refresh="rows"))  # receipts
    assert (
        [r.stats.ok for r in runs] == [2, 0, 2]
        and runs[1].stats.reused == 2
        and runs[2].stats.calls_local == 0
    )
    columns = ["n", "z_last_name_first", *reversed(list(ODD)), "play_status", "play_error"]
    for run in runs:
        assert list(run.result.columns) == columns
        row = run.result.iloc[0]
        assert same(row["z_last_name_first"], (1, "b"))
        for name, value in ODD.items():
            if run.result[name].dtype == object:  # pandas keeps the Python values as they are
                assert same(row[name], value), name
            else:  # pandas made a typed column of them (datetime64, float): the same values
                assert (pd.isna(row[name]) and pd.isna(value)) or row[name] == value, name
    for a, b in ((0, 1), (0, 2)):
        assert runs[a].result.drop(columns="play_status").equals(runs[b].result.drop(columns="play_status"))


NUMBERS = {
    "ints": [3, -7, 0, 2**40],
    "ints_to_the_edge": [3, -7, -(2**63), 2**63 - 1],
    "ints_some_missing": [3, None, 2**53 + 1, -(2**63)],
    "floats_and_ints": [1, 2.5, math.inf, -0.0],
    "past_int64": [2**63, 1, 2, 3],
    "past_uint64": [2**64, 1, 2, 3],
    "past_int64_some_missing": [2**63, None, 2, 3],
    "past_uint64_some_missing": [2**64, None, 2, 3],
    "bools_and_ints": [True, 1, 0, False],
}


def test_number_columns_are_what_pandas_makes_of_their_values(store: pb.ReceiptStore) -> None:
    """Each output column of Python numbers (a row that failed: missing) has the dtype and the values
    pandas gives a Series of the same values, on the first run and on a memo replay."""

    @pb.play
    async def numbers(row, ctx):
        if row.n == 1 and row.missing:
            raise ValueError("no value for this row")
        return {name: values[row.n] for name, values in NUMBERS.items() if (None in values) == row.missing}

    for missing in (False, True):
        frame = pd.DataFrame({"n": range(4), "missing": missing})
        for out in (
            frame.play.map(numbers, store=store, progress=False),
            frame.play.map(numbers, store=store, progress=False),
        ):
            for name, values in NUMBERS.items():
                if (None in values) == missing:
                    expected = pd.Series([math.nan if v is None else v for v in values])
                    assert out[name].dtype == expected.dtype and out[name].reset_index(drop=True).equals(
                        expected
                    ), name


@pytest.fixture
def no_unawaited_warnings():
    """Fails the test if a coroutine is left to warn "never awaited" when collected."""
    # What was alive before the test set aside (gc.freeze): the collection after it looks only at
    # what the test made, where a coroutine it left would be, not at the whole session's heap.
    gc.freeze()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            yield
            gc.collect()
    finally:
        gc.unfreeze()
    assert not [w for w in seen if "never awaited" in str(w.message)]


@pb.tool
async def lookup(q: str) -> str:
    return q.upper()


def _define(body: str) -> object:
    """The play ``forgetful`` with ``body`` as its third line, its source known to linecache."""
    source = f"async def forgetful(row, ctx):\n    value = 1\n    {body}\n"
    filename = f"<forgetful {abs(hash(body))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"pb": pb, "lookup": lookup}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["forgetful"]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("return {'domain': ctx.tool(lookup, q=row.q)}", "output['domain']"),
        ("return {'found': [1, {'deep': ctx.tool(lookup, q=row.q)}]}", "output['found'][1]['deep']"),
        ("return ctx.waterfall('w', [ctx.leg(lookup, q=row.q)])", "returned a coroutine"),
        ("return {'s': ctx.step('once', lambda: 1)}", "output['s']"),
    ],
    ids=["a column", "deep in a column", "the whole output", "a step"],
)
def test_a_forgotten_await_fails_the_row_naming_the_line(
    body: str, where: str, store: pb.ReceiptStore, no_unawaited_warnings
) -> None:
    """ctx.tool(...) (or waterfall, step) without await, anywhere in the output: the row fails with
    "did you forget an await?" and the play's line, nothing lands in the result, nothing warns later."""
    out = pd.DataFrame({"q": ["a", "b"]}).play.map(_define(body), store=store, progress=False)
    assert out["play_status"].tolist() == ["failed", "failed"]
    error = out["play_error"].iloc[0]
    assert where in error and "did you forget an await? (line 3: " in error and "ctx." in error, error
    assert not any(isinstance(v, str) and "coroutine object" in v for v in out.astype(str).values.ravel())


def test_a_forgotten_await_in_a_tool_input_fails_before_paying(
    store: pb.ReceiptStore, no_unawaited_warnings
) -> None:
    """An un-awaited call passed as another tool's input is caught at the address, before anything is paid."""
    paid: list[str] = []

    @pb.tool
    def record(text: str) -> str:
        paid.append(text)
        return text

    @pb.play
    async def nested(row, ctx):
        return {"r": await ctx.tool(record, text=ctx.tool(lookup, q=row.q))}

    out = pd.DataFrame({"q": ["a"]}).play.map(nested, store=store, progress=False)
    error = out["play_error"].iloc[0]
    assert out["play_status"].iloc[0] == "failed" and paid == []
    assert (
        "input text=<coroutine" in error
        and "did you forget an await? (line" in error
        and "ctx.tool(lookup" in error
    )


@pytest.mark.parametrize(
    "body",
    ["ctx.tool(lookup, q=row.q)\n    return {'q': row.q}", "return {'text': f'{ctx.tool(lookup, q=row.q)}'}"],
    ids=["a bare call", "formatted into text"],
)
def test_a_call_never_awaited_fails_the_row_even_when_nothing_returned_holds_it(
    body: str, store: pb.ReceiptStore, no_unawaited_warnings
) -> None:
    """A ctx.tool(...) that is made but never awaited never runs: the row fails saying so, with its line,
    rather than being ok with the call silently skipped (or "<coroutine object ...>" written as text)."""
    out = pd.DataFrame({"q": ["a"]}).play.map(_define(body), store=store, progress=False)
    error = out["play_error"].iloc[0]
    assert out["play_status"].iloc[0] == "failed" and "never awaited, so it never ran" in error
    assert "did you forget an await? (line 3" in error and "ctx.tool(lookup" in error


def test_a_coroutine_made_and_dropped_does_not_warn(store: pb.ReceiptStore, no_unawaited_warnings) -> None:
    """A ctx.tool(...) made but neither awaited nor returned (then the row fails) is closed quietly."""

    @pb.play
    async def careless(row, ctx):
        ctx.tool(lookup, q=row.q)
        raise ValueError("something else went wrong")

    out = pd.DataFrame({"q": ["a"]}).play.map(careless, store=store, progress=False)
    assert out["play_error"].iloc[0].startswith("ValueError: something else went wrong")
