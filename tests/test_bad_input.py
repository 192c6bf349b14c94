"""Bad input, each with a defined answer.

A problem with the whole call (a bad option, a play that is not async, an ambiguous frame, a
store that cannot be opened) raises before any row runs.  A problem with one row fails that row:
``play_status`` "failed" and a ``play_error`` naming the tool or the play, not a traceback.
Either way nothing already paid for is lost: the receipts stay, and a rerun reuses them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import functools
import inspect
import math
import re
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from exact import same

import playbook as pb
from playbook.store import engine


def _echo(calls: list, name: str = "echo") -> pb.Tool:
    @pb.tool(name=name)
    def echo(value: object) -> object:
        calls.append(value)
        return value

    return echo


def _echo_play(echo: pb.Tool) -> pb.Play:
    @pb.play
    async def echo_v(row, ctx):
        return {"e": await ctx.tool(echo, value=row.v)}

    return echo_v


@pb.play
async def doubled(row, ctx):
    return {"double": row.n * 2}


class Gadget:
    """An object with no JSON form."""


# -- empty frames ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        pd.DataFrame(),
        pd.DataFrame(
            {"n": pd.Series([], dtype="int64"), "when": pd.Series([], dtype="datetime64[ns]")},
            index=pd.Index([], name="id"),
        ),
        pd.DataFrame({"n": [1, 2]}, index=[7, 9]).query("n > 5"),
    ],
    ids=["no columns", "typed columns, named index", "filter that matched nothing"],
)
def test_empty_frame_gives_an_empty_result(frame: pd.DataFrame, store: pb.ReceiptStore) -> None:
    """An empty DataFrame runs nothing and returns its own columns, dtypes and index plus the status columns."""
    ran: list = []

    @pb.play
    async def never(row, ctx):
        ran.append(row)

    run = frame.play.run(never, store=store, progress=False)
    out = run.result
    assert ran == [] and run.stats.total == 0 and len(out) == 0
    assert out.index.equals(frame.index) and out.index.name == frame.index.name
    assert list(out.columns) == [*frame.columns, "play_status", "play_error"]
    assert out.dtypes.iloc[: len(frame.columns)].equals(frame.dtypes)
    assert out["play_status"].dtype == object and out["play_error"].dtype == object


# -- column labels and indexes ------------------------------------------------------------


def test_duplicate_column_labels_are_refused(store: pb.ReceiptStore) -> None:
    """Two columns with one label raise PlayDefinitionError naming it before any row runs: row.a would be ambiguous."""
    ran: list = []

    @pb.play
    async def play(row, ctx):
        ran.append(row)

    frame = pd.DataFrame([[1, 2, 3, 4]], columns=["a", "b", "a", "c"])
    with pytest.raises(pb.PlayDefinitionError, match="more than one column named 'a'"):
        frame.play.map(play, store=store, progress=False)
    assert ran == [] and pb.last_run() is None


def test_non_unique_index_with_duplicate_rows(store: pb.ReceiptStore) -> None:
    """A non-unique index keeps order and labels; equal rows run once; a failed row is named by label and position."""
    calls: list = []
    echo = _echo(calls)

    @pb.play
    async def play(row, ctx):
        if row.v == "bad":
            raise ValueError("bad value")
        return {"e": await ctx.tool(echo, value=row.v)}

    frame = pd.DataFrame({"v": ["x", "y", "x", "bad"]}, index=["a", "a", "b", "a"])
    run = frame.play.run(play, store=store, progress=False)
    assert run.result.index.equals(frame.index)
    assert run.result["e"].tolist()[:3] == ["x", "y", "x"] and sorted(calls) == ["x", "y"]
    assert run.result["play_status"].tolist() == ["ok", "ok", "ok", "failed"]
    assert run.errors[["row", "position"]].values.tolist() == [["a", 3]]


def test_multiindex_columns(store: pb.ReceiptStore) -> None:
    """MultiIndex columns: row[("a", "x")] works, id_columns= may name a tuple label, and the result keeps the MultiIndex."""

    @pb.play
    async def total(row, ctx):
        return {"total": row[("a", "x")] + row[("a", "y")]}

    frame = pd.DataFrame(
        [[1, 2, "p"], [1, 2, "q"], [3, 4, "r"]],
        columns=pd.MultiIndex.from_tuples([("a", "x"), ("a", "y"), ("b", "z")]),
    )
    run = frame.play.run(total, store=store, progress=False, id_columns=[("a", "x"), ("a", "y")])
    out = run.result
    assert run.stats.ok == 3
    assert isinstance(out.columns, pd.MultiIndex)
    assert out.columns.tolist() == [
        ("a", "x"),
        ("a", "y"),
        ("b", "z"),
        ("total", ""),
        ("play_status", ""),
        ("play_error", ""),
    ]
    assert out["total"].tolist() == [3, 3, 7] and out["play_status"].tolist() == ["ok"] * 3
    # A tuple that is a label names one column, not two.
    again = frame.play.map(total, store=store, progress=False, id_columns=("b", "z"), refresh="rows")
    assert again["total"].tolist() == [3, 3, 7]


@pytest.mark.parametrize(
    "labels",
    [
        [0, 1],
        [2.5, "b"],
        [pd.Timestamp("2024-01-01"), pd.Timestamp("2024-02-01")],
        pd.Index([("a", 1), ("b", 2)], tupleize_cols=False),
    ],
    ids=["ints", "float and str", "timestamps", "flat tuples"],
)
def test_non_string_column_labels(labels: list, store: pb.ReceiptStore) -> None:
    """Non-string column labels work: row[label] reads the cell, id_columns= takes the label, the result keeps the labels."""
    first, second = labels[0], labels[1]

    @pb.play
    async def add(row, ctx):
        return {"sum": row[first] + row[second]}

    frame = pd.DataFrame([[1, 10], [2, 20], [1, 30]], columns=labels)
    out = frame.play.map(add, store=store, progress=False, id_columns=first)
    assert out["sum"].tolist() == [11, 22, 11]  # rows 0 and 2 share the key: they are one row
    assert list(out.columns)[:2] == list(labels) and out[first].tolist() == [1, 2, 1]

    @pb.play
    async def missing(row, ctx):
        return {"x": row["nope"]}

    failed = frame.play.map(missing, store=store, progress=False)
    assert "no column 'nope'" in failed["play_error"].iloc[0] and repr(first) in failed["play_error"].iloc[0]


# -- awkward values -----------------------------------------------------------------------

# NaN/None/NA/NaT, int64, float32, Timestamp and date are in tests/test_runtime.py::test_awkward_input_values.
AWKWARD = {
    "np.bool_": np.bool_(True),
    "np.str_": np.str_("text"),
    "np.datetime64 ns": np.datetime64("2024-01-01T12:00:00.000000001"),
    "np.datetime64 NaT": np.datetime64("NaT"),
    "np.timedelta64": np.timedelta64(90, "s"),
    "np.ndarray": np.array([1.5, np.nan]),
    "tz-aware Timestamp": pd.Timestamp("2024-03-31 01:30", tz="Europe/Paris"),
    "Timedelta": pd.Timedelta("1 day 2s"),
    "Period": pd.Period("2024-01", freq="M"),
    "Interval": pd.Interval(0, 5),
    "datetime": dt.datetime(2024, 1, 1, 12, 30, tzinfo=dt.UTC),
    "time": dt.time(8, 15),
    "timedelta": dt.timedelta(minutes=5),
    "Decimal": decimal.Decimal("1.10"),
    "UUID": uuid.UUID(int=7),
    "nested dict": {"b": [1, {"c": np.int64(2), "d": np.nan}], "a": pd.Timestamp("2024-01-01"), "e": None},
    "nested list": [1, [2, [3, None, pd.NA]], (4, 5)],
    "empty containers": {"a": [], "b": {}},
    "inf": math.inf,
}


def test_awkward_tool_inputs_key_receipts_stably(store: pb.ReceiptStore) -> None:
    """numpy and pandas scalars, datetimes, nested dicts and lists run as tool inputs, come back exactly
    as given on the first run, a memo replay and a receipt replay; reruns pay for nothing."""
    calls: list = []
    play = _echo_play(_echo(calls))
    frame = pd.DataFrame({"v": pd.Series(list(AWKWARD.values()), index=list(AWKWARD), dtype=object)})
    first = frame.play.run(play, store=store, progress=False)
    assert first.result["play_status"].tolist() == ["ok"] * len(AWKWARD), first.errors
    ran = first.stats.calls_local  # echo is a plain Python tool: its calls are local, not paid
    assert ran == len(calls) == len(AWKWARD) and first.stats.calls_executed == 0
    for name, value in AWKWARD.items():
        assert same(first.result.loc[name, "e"], value), name

    resumed = frame.play.run(play, store=store, progress=False)  # same row ids: every row memo hits
    assert resumed.result["play_status"].tolist() == ["reused"] * len(AWKWARD)
    replayed = frame.play.run(play, store=store, progress=False, refresh="rows")  # same addresses
    assert (replayed.stats.calls_local, replayed.stats.calls_reused) == (0, ran)
    assert len(calls) == ran
    for name, value in AWKWARD.items():
        assert same(resumed.result.loc[name, "e"], value) and same(replayed.result.loc[name, "e"], value), (
            name
        )


def test_pandas_extension_dtypes_as_row_values(store: pb.ReceiptStore) -> None:
    """Rows of Int64, boolean, string, category, tz datetime, timedelta, period and interval columns run and resume."""
    frame = pd.DataFrame(
        {
            "n": pd.array([1, None, 3], dtype="Int64"),
            "flag": pd.array([True, None, False], dtype="boolean"),
            "s": pd.array(["x", None, "z"], dtype="string"),
            "cat": pd.Categorical(["u", "v", "u"]),
            "when": pd.date_range("2024-01-01", periods=3, tz="UTC"),
            "took": pd.to_timedelta([1, 2, 3], unit="s"),
            "month": pd.period_range("2024-01", periods=3, freq="M"),
            "bucket": pd.interval_range(0, 3),
        }
    )
    calls: list = []
    echo = _echo(calls)

    @pb.play
    async def play(row, ctx):
        return {"e": await ctx.tool(echo, value=row.to_dict())}

    first = frame.play.run(play, store=store, progress=False)
    assert first.result["play_status"].tolist() == ["ok"] * 3, first.errors
    assert first.result["e"].iloc[0]["month"] == pd.Period("2024-01", freq="M")
    assert first.result["e"].iloc[0]["bucket"] == pd.Interval(0, 1)
    again = frame.play.map(play, store=store, progress=False)
    assert again["play_status"].tolist() == ["reused"] * 3
    assert len(calls) == 3
    for i in range(3):
        assert same(again["e"].iloc[i], first.result["e"].iloc[i]) and same(again["e"].iloc[i], calls[i])


def test_equal_values_in_numpy_pandas_and_python_form_share_a_receipt(store: pb.ReceiptStore) -> None:
    """A datetime64, the Timestamp it wraps and the datetime it equals are one call, paid for once; as
    are 3 and 3.0 (what pandas makes of an int column that gains a NaN), and an int64 and an int."""
    calls: list = []
    play = _echo_play(_echo(calls))
    when = [
        np.datetime64("2024-05-01T12:30:00.000000000"),
        pd.Timestamp("2024-05-01 12:30"),
        dt.datetime(2024, 5, 1, 12, 30),
    ]
    frame = pd.DataFrame({"i": [0, 1, 2], "v": pd.Series(when, dtype=object)})  # three rows, one call
    out = frame.play.map(play, store=store, progress=False)
    assert (
        len(calls) == 1 and (out["e"] == pd.Timestamp("2024-05-01 12:30")).all()
    )  # every row gets the one answer
    numbers = pd.DataFrame({"v": pd.Series([3, 3.0, np.int64(3), np.float64(3.0)], dtype=object)})
    numbers.play.map(play, store=store, progress=False)
    assert len(calls) == 2


def test_very_long_strings(store: pb.ReceiptStore) -> None:
    """A 1 MB string is a row value, a tool input and output, and a receipt on disk; errors about it stay short."""
    calls: list = []
    echo = _echo(calls)
    long = "x" * 1_000_000

    @pb.play
    async def play(row, ctx):
        if row.n == 2:
            return {"e": await ctx.tool(echo, value=[long, Gadget()])}  # a Gadget has no JSON form
        return {"e": await ctx.tool(echo, value=row.text)}

    frame = pd.DataFrame({"n": [0, 1, 2], "text": [long, long + "y", long]})
    first = frame.play.run(play, store=store, progress=False)
    assert first.result["play_status"].tolist() == ["ok", "ok", "failed"]
    assert first.result["e"].iloc[1] == long + "y" and len(calls) == 2
    assert len(first.result["play_error"].iloc[2]) < 300  # the input is cut short in the message
    assert store.get(echo, value=long).output == long
    again = frame.play.run(play, store=store, progress=False)
    assert again.result["play_status"].tolist() == ["reused", "reused", "failed"] and len(calls) == 2


# -- non-serialisable objects ---------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [[1, Gadget()], {"k": {1: Gadget()}}, {Gadget(): "yes"}, {Gadget()}, object(), open],
    ids=[
        "object in a list",
        "nested in a dict",
        "object as a key",
        "object in a set",
        "bare object",
        "function",
    ],
)
def test_non_serialisable_tool_input_fails_the_row_before_paying(bad: object, store: pb.ReceiptStore) -> None:
    """A tool input with no JSON form fails its row naming the tool and input, before the call; paid calls stay."""
    calls: list = []
    echo = _echo(calls)
    other = _echo(calls, name="other")

    @pb.play
    async def play(row, ctx):
        await ctx.tool(other, value=row.n)  # paid for before the bad call
        return {"e": await ctx.tool(echo, value=bad if row.n == 1 else row.n)}

    frame = pd.DataFrame({"n": [0, 1, 2]}, index=["r0", "r1", "r2"])
    run = frame.play.run(play, store=store, progress=False)
    assert run.result["play_status"].tolist() == ["ok", "failed", "ok"]
    message = run.result.loc["r1", "play_error"]
    assert (
        message.startswith("ToolError: tool 'echo': input value=")
        and "cannot be part of an address" in message
    )
    assert bad not in calls  # refused before the tool ran
    again = frame.play.run(play, store=store, progress=False, refresh="rows")
    assert again.stats.calls_local == 0  # 'other' for r1 was kept


LOOK_ALIKES = [
    ({"1": "x"}, {1: "x"}),
    ({"true": "x"}, {True: "x"}),
    ([1, 2], (1, 2)),
    (["a", "b"], {"a", "b"}),
    ("inf", math.inf),
    ("1.10", decimal.Decimal("1.10")),
    ("2024-05-01T12:30:00", dt.datetime(2024, 5, 1, 12, 30)),
    ("2024-05-01", dt.date(2024, 5, 1)),
    ("AAE=", b"\x00\x01"),
    ({"$tuple": [1]}, (1,)),
    (1, True),
    (None, "null"),
]


@pytest.mark.parametrize(
    ("plain", "other"), LOOK_ALIKES, ids=[f"{type(a).__name__} vs {type(b).__name__}" for a, b in LOOK_ALIKES]
)
def test_values_json_would_merge_are_different_calls(
    plain: object, other: object, store: pb.ReceiptStore
) -> None:
    """Values that JSON would write alike ({1: x} and {"1": x}, inf and "inf", a Decimal and its text, a
    tuple and a list...) are different calls and different rows: each is paid for and gets its own answer."""
    calls: list = []
    play = _echo_play(_echo(calls))
    frame = pd.DataFrame({"v": pd.Series([plain, other], dtype=object)})
    out = frame.play.run(play, store=store, progress=False)
    assert out.result["play_status"].tolist() == ["ok", "ok"] and len(calls) == 2
    assert same(calls[0], plain) and same(calls[1], other)
    again = frame.play.run(play, store=store, progress=False, refresh="rows")
    assert again.stats.calls_local == 0 and len(calls) == 2
    assert again.result["e"].equals(out.result["e"])


def test_non_serialisable_cell_fails_only_its_row_unless_key_is_given(store: pb.ReceiptStore) -> None:
    """A cell with no JSON form cannot key its row: that row fails, saying to pass id_columns=; with id_columns= it runs."""

    @pb.play
    async def kind(row, ctx):
        return {"kind": type(row.thing).__name__}

    frame = pd.DataFrame({"id": [1, 2, 3], "thing": [Gadget(), "plain", [Gadget()]]})
    out = frame.play.map(kind, store=store, progress=False)
    assert out["play_status"].tolist() == ["failed", "ok", "failed"]
    assert "cannot identify the row" in out["play_error"].iloc[0] and "Gadget" in out["play_error"].iloc[0]
    assert "id_columns=" in out["play_error"].iloc[2]
    keyed = frame.play.map(kind, store=store, progress=False, id_columns="id")
    assert keyed["kind"].tolist() == ["Gadget", "str", "list"]


def test_non_serialisable_tool_output_fails_the_row_and_is_not_paid_again(store: pb.ReceiptStore) -> None:
    """A tool answer with no JSON form fails its row saying it was paid, the type refused and the fix;
    a rerun does not pay for it again; a fixed (edited) tool is a new tool and pays once."""
    calls: list = []

    @pb.tool(name="gadgets")
    def gadgets(n: int) -> object:
        calls.append(n)
        return Gadget() if n == 1 else n

    frame = pd.DataFrame({"n": [0, 1]})
    out = frame.play.map(gadgets, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok", "failed"]
    message = out["play_error"].iloc[1]
    assert message.startswith("ToolError: tool 'gadgets' was paid for, but its answer cannot be stored")
    assert "test_bad_input.Gadget" in message and "model.model_dump()" in message
    again = frame.play.map(gadgets, store=store, progress=False)
    assert again["play_status"].tolist() == ["reused", "failed"] and calls == [0, 1]
    assert "was paid for in an earlier run" in again["play_error"].iloc[1]

    @pb.tool(name="gadgets")
    def gadgets(n: int) -> object:
        calls.append(n)
        return {"gadget": n}

    fixed = frame.play.map(gadgets, store=store, progress=False)
    assert fixed["play_status"].tolist() == ["ok", "ok"] and calls == [0, 1, 0, 1]


# -- what a play returns --------------------------------------------------------------------


async def _coroutine() -> int:
    return 1


@pytest.mark.parametrize(
    ("value", "columns"),
    [
        (None, {}),
        (3, {"answer": 3}),
        ("text", {"answer": "text"}),
        ([1, 2], {"answer": [1, 2]}),
        (pd.Series({"x": 1, "y": "b"}), {"x": 1, "y": "b"}),
    ],
    ids=["None", "int", "str", "list", "Series"],
)
def test_play_returning_a_non_dict(value: object, columns: dict, store: pb.ReceiptStore) -> None:
    """None gives no columns; a Series gives its labels as columns; any other value is one column named after the play."""

    @pb.play
    async def answer(row, ctx):
        return value

    frame = pd.DataFrame({"n": [1]})
    out = frame.play.map(answer, store=store, progress=False)
    assert list(out.columns) == ["n", *columns, "play_status", "play_error"]
    assert {c: out[c].iloc[0] for c in columns} == columns and out["play_status"].iloc[0] == "ok"
    again = frame.play.map(answer, store=store, progress=False)  # the memo gives the same columns
    assert again["play_status"].iloc[0] == "reused" and list(again.columns) == list(out.columns)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (
            {1: "one"},
            "OutputError: play 'bad' returned a dict with a non-string key 1; column names must be strings",
        ),
        ({"a": 1, ("t", 1): 2}, "non-string key ('t', 1)"),
        (pd.Series([1, 2]), "non-string key 0"),
        (
            {"play_status": "mine"},
            "returned a column named 'play_status', which playbook uses for the row's status",
        ),
        (_coroutine, "returned a coroutine that was never awaited: did you forget an await?"),
    ],
    ids=["int key", "tuple key", "Series with a RangeIndex", "status column", "coroutine"],
)
def test_play_returning_unusable_output_fails_the_row(
    value: object, error: str, store: pb.ReceiptStore
) -> None:
    """Output that cannot become columns fails that row naming the play; its paid calls are reused once fixed."""
    calls: list = []
    echo = _echo(calls)

    async def bad(row, ctx):
        e = await ctx.tool(echo, value=row.n)
        if row.n != 1:
            return {"e": e}
        return value() if value is _coroutine else value

    async def fixed(row, ctx):
        return {"e": await ctx.tool(echo, value=row.n)}

    frame = pd.DataFrame({"n": [0, 1, 2]})
    out = frame.play.map(pb.play(bad, name="bad"), store=store, progress=False)
    assert out["play_status"].tolist() == ["ok", "failed", "ok"]
    assert error in out["play_error"].iloc[1]
    frame.play.map(pb.play(fixed, name="bad"), store=store, progress=False)
    assert pb.last_run().stats.calls_local == 0 and len(calls) == 3


def test_output_column_named_like_an_input_column(store: pb.ReceiptStore) -> None:
    """With overwrite=True, returning an input column replaces it in place, as df.assign would, only
    in rows that returned it."""

    @pb.play
    async def clean(row, ctx):
        if row.n == 2:
            raise ValueError("cannot clean")
        return {"email": row.email.strip().lower()} if row.n != 3 else {"other": "x"}

    frame = pd.DataFrame({"email": [" A@X.COM", "b@x.com ", " C@X.COM", "D@X.COM"], "n": [0, 1, 2, 3]})
    out = frame.play.map(clean, store=store, progress=False, overwrite=True)
    assert list(out.columns) == ["email", "n", "other", "play_status", "play_error"]
    # the failed row and the row that did not return it keep their input: nothing is lost
    assert out["email"].tolist() == ["a@x.com", "b@x.com", " C@X.COM", "D@X.COM"]
    assert out["n"].dtype == frame["n"].dtype and out["play_status"].tolist() == ["ok", "ok", "failed", "ok"]
    again = frame.play.map(clean, store=store, progress=False, overwrite=True)
    assert again["email"].tolist() == out["email"].tolist()


def test_rerunning_on_a_result_replaces_its_status_columns(store: pb.ReceiptStore) -> None:
    """A play mapped over an earlier result gives this run's play_status and play_error, in their places."""
    first = pd.DataFrame({"n": [1, 2]}).play.map(doubled, store=store, progress=False)
    second = first.play.map(doubled, store=store, progress=False)
    assert list(second.columns) == list(first.columns)
    assert second["play_status"].tolist() == ["ok", "ok"] and second["double"].tolist() == [2, 4]


# -- plays that are not async -----------------------------------------------------------------


class _SyncCallable:
    def __call__(self, row, ctx):
        return {}


class _AsyncCallable:
    async def __call__(self, row, ctx):
        return {}


def _sync(row, ctx):
    return {}


async def _yields(row, ctx):
    yield {}


@pytest.mark.parametrize(
    ("play", "match"),
    [
        (_sync, "play '_sync' must be defined with 'async def _sync\\(row, ctx\\)'"),
        (lambda row, ctx: {}, "async def <lambda>"),
        (functools.partial(_sync, ctx=None), "play '_sync' must be defined with 'async def"),
        (_SyncCallable(), "play '_SyncCallable' must be defined with 'async def"),
        (_AsyncCallable(), "play '_AsyncCallable' must be defined with 'async def"),
        (_yields, "play '_yields' yields: a play returns the row's output once"),
        ("enrich", "a play must be an async function \\(row, ctx\\), not str"),
        (None, "not NoneType"),
    ],
    ids=[
        "def",
        "lambda",
        "partial of def",
        "callable object",
        "object with async __call__",
        "async generator",
        "str",
        "None",
    ],
)
def test_play_that_is_not_async_is_refused_before_any_row(
    play: object, match: str, store: pb.ReceiptStore
) -> None:
    """map() with a play that is not an async function raises PlayDefinitionError before any row runs."""
    with pytest.raises(pb.PlayDefinitionError, match=match):
        pd.DataFrame({"n": [1]}).play.map(play, store=store, progress=False)
    assert pb.last_run() is None


def test_partial_of_an_async_function_is_a_play(store: pb.ReceiptStore) -> None:
    """functools.partial of an async play works, and its bound arguments are part of its fingerprint."""

    async def scaled(row, ctx, *, factor):
        return {"scaled": row.n * factor}

    frame = pd.DataFrame({"n": [1, 2]})
    assert frame.play.map(functools.partial(scaled, factor=10), store=store, progress=False)[
        "scaled"
    ].tolist() == [10, 20]
    out = frame.play.map(functools.partial(scaled, factor=100), store=store, progress=False)
    assert out["scaled"].tolist() == [100, 200] and out["play_status"].tolist() == ["ok", "ok"]


# -- concurrency ---------------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [-1, 1.5, True, False, "8", math.nan, math.inf, np.float64(4.0)])
def test_bad_concurrency_names_the_option(concurrency: object, tmp_path: Path) -> None:
    """concurrency must be a whole number >= 1: anything else raises PlayDefinitionError naming it, before the store opens."""
    # 0, -3 and 2.5 are in tests/test_runtime.py::test_bad_options_name_the_option.
    with pytest.raises(
        pb.PlayDefinitionError,
        match=f"^{re.escape(f'concurrency={concurrency!r}')}: concurrency must be a whole number >= 1",
    ):
        pd.DataFrame({"n": [1]}).play.map(doubled, store=tmp_path / "store", concurrency=concurrency)
    assert pb.last_run() is None and not (tmp_path / "store").exists()


def test_numpy_integers_are_whole_numbers(store: pb.ReceiptStore) -> None:
    """concurrency and limit accept numpy integers, e.g. limit=df.n.max()."""
    frame = pd.DataFrame({"n": [1, 2, 3]})
    out = frame.play.map(
        doubled, store=store, progress=False, concurrency=np.int64(2), limit=frame["n"].max() - 1
    )
    assert out["play_status"].tolist() == ["ok", "ok"]


# -- the store directory -----------------------------------------------------------------------


def _chmod_blocks(directory: Path) -> bool:
    """Whether permission bits stop this process (not so for root, which tests often run as)."""
    probe = directory / "probe"
    probe.mkdir()
    probe.chmod(0o500)
    try:
        (probe / "file").touch()
    except PermissionError:
        return True
    finally:
        probe.chmod(0o700)
    return False


def _sqlite_refuses(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Make SQLite answer as it does for a read-only or unreadable directory, where chmod cannot (root)."""
    import playbook.store.db

    connect = sqlite3.connect

    def read_only(database, *args, **kwargs):
        return connect(f"file:{database}?mode=ro", *args, uri=True, **kwargs)

    def unreadable(database, *args, **kwargs):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(playbook.store.db.sqlite3, "connect", read_only if how == "read-only" else unreadable)


def _make_unusable(path: Path, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Damage nothing, but make the store at ``path`` impossible to open; returns the path to pass as store=."""
    if how == "path is a file":
        target = tmp_path / "a-file"
        target.write_text("not a store")
        return target
    if how == "parent is a file":
        (tmp_path / "plain-file").write_text("x")
        return tmp_path / "plain-file" / "store"
    if _chmod_blocks(tmp_path):
        for item in reversed([path, *path.rglob("*")]):  # the directory last, or its files are out of reach
            item.chmod((0o500 if item.is_dir() else 0o400) if how == "read-only" else 0)
    else:
        _sqlite_refuses(monkeypatch, how)
    return path


def _restore(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    path.chmod(0o700)  # the directory first, to reach its files
    for item in path.rglob("*"):
        item.chmod(0o700 if item.is_dir() else 0o600)


@pytest.mark.parametrize("how", ["read-only", "unreadable", "parent is a file", "path is a file"])
def test_unusable_store_directory_is_a_clear_error(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that cannot be opened raises ReceiptError naming the path, before any row runs; its receipts survive."""
    calls: list = []
    play = _echo_play(_echo(calls))
    frame = pd.DataFrame({"v": ["a", "b"]})
    path = tmp_path / "store"
    store = pb.ReceiptStore(path)
    frame.play.map(play, store=store, progress=False)  # paid for: two receipts
    store.close()
    paid_run = pb.last_run()
    target = _make_unusable(path, how, tmp_path, monkeypatch)
    try:
        with pytest.raises(pb.ReceiptError) as info:
            frame.play.map(play, store=str(target), progress=False, refresh="rows")
    finally:
        _restore(path, monkeypatch)
    message = str(info.value)
    assert message.startswith(f"cannot open the receipt store at {target}: ")
    assert "delete" not in message and "another/directory" in message  # never advice that loses receipts
    assert len(calls) == 2 and pb.last_run() is paid_run  # no run started
    store = pb.ReceiptStore(path)
    assert store.stats()["receipts"] == 2
    store.close()


def test_store_turning_read_only_mid_run_fails_rows_instead_of_hanging(store: pb.ReceiptStore) -> None:
    """A store that stops taking writes mid-run fails the rows that need it with ReceiptError naming the path; nothing hangs or is paid."""
    calls: list = []
    play = _echo_play(_echo(calls))
    pd.DataFrame({"v": ["a", "b"]}).play.map(play, store=store, progress=False)
    engine(store).backend.connection().execute(
        "PRAGMA query_only = ON"
    )  # SQLite now refuses writes, as on a read-only remount

    async def run() -> pd.DataFrame:
        return await asyncio.wait_for(
            pd.DataFrame({"v": ["a", "b", "c"]}).play.amap(play, store=store, progress=False), 10
        )

    out = asyncio.run(run())
    assert out["play_status"].tolist() == ["reused", "reused", "failed"]
    assert (
        f"ReceiptError: cannot use the leases of the receipt store at {store.location}"
        in out["play_error"].iloc[2]
    )
    assert calls == ["a", "b"]


def test_row_name_points_at_row_index() -> None:
    """A pandas habit, row.name for the index label, fails the row saying to use row.index."""

    async def labelled(row: object, ctx: pb.Context) -> object:
        return {"label": row.name}  # type: ignore[attr-defined]

    out = pd.DataFrame({"company": ["Acme"]}, index=["a"]).play.map(labelled, progress=False)
    assert "the row has no column 'name'" in out.play_error["a"] and "row.index" in out.play_error["a"]


def test_row_index_and_row_Index_are_the_label_unless_a_column_has_that_name() -> None:
    """row.index and row.Index (the itertuples habit) give the row's index label; a column named
    index or Index (what reset_index() makes) is read instead, as any column is."""

    async def labels(row: Any, ctx: pb.Context) -> object:
        return {"lower": row.index, "upper": row.Index}

    out = pd.DataFrame({"company": ["Acme", "Beta"]}, index=["a", "b"]).play.map(labels, progress=False)
    assert out["lower"].tolist() == ["a", "b"] and out["upper"].tolist() == ["a", "b"]
    assert out["play_status"].tolist() == ["ok", "ok"]
    both = pd.DataFrame({"index": [7, 8], "Index": [9, 10]}, index=["a", "b"]).play.map(
        labels, progress=False
    )
    assert both["lower"].tolist() == [7, 8] and both["upper"].tolist() == [9, 10]


# -- columns playbook writes ---------------------------------------------------------------------


def _frames(frame: pd.DataFrame) -> dict[str, Any]:
    import dask.dataframe as dd
    import polars as pl

    return {"pandas": frame, "polars": pl.from_pandas(frame), "dask": dd.from_pandas(frame, npartitions=1)}


_RESERVED = [
    (
        {"play_status": ["mine", "yours"]},
        "column 'play_status', which playbook writes .* without 'play_error'",
    ),
    ({"play_error": ["none", "none"]}, "column 'play_error', which playbook writes .* without 'play_status'"),
    (
        {"play_status": ["ok", "mine"], "play_error": [None, None]},
        "its value 'mine' in row 1 is not a status playbook gives",
    ),
]


# A Dask frame's values are not read before its job: both columns make it an earlier result there.
@pytest.mark.parametrize(
    ("kind", "columns", "said"),
    [(kind, *case) for kind in ("pandas", "polars") for case in _RESERVED]
    + [("dask", *case) for case in _RESERVED[:2]],
)
def test_an_input_column_playbook_would_write_is_refused_naming_it_and_the_way_out(
    kind: str, columns: dict[str, list[Any]], said: str, store: pb.ReceiptStore
) -> None:
    """A frame with play_status or play_error of its own (not an earlier run's result) is refused
    before any row runs, on pandas, Polars and Dask frames, naming the column and how to rename
    it; nothing is replaced."""
    frame = _frames(pd.DataFrame({"x": [1, 2], **columns}))[kind]
    with pytest.raises(pb.PlayDefinitionError, match=said) as refused:
        frame.play.map(doubled, store=store, progress=False)
    assert "rename it, e.g. df.rename(columns=" in str(refused.value) and "an earlier run's result" in str(
        refused.value
    )
    assert pb.last_run() is None


def test_a_file_with_a_column_playbook_would_write_is_a_usage_error_on_the_command_line(
    tmp_path: Path,
) -> None:
    """``python -m playbook run`` on a CSV with its own play_status column exits 2, naming the column."""
    from playbook.frontends.cli import main

    (tmp_path / "plays.py").write_text(
        "import playbook as pb\n\n@pb.play\nasync def p(row, ctx):\n    return {'y': row.x}\n"
    )
    pd.DataFrame({"x": [1], "play_status": ["mine"]}).to_csv(tmp_path / "in.csv", index=False)
    argv = [
        "run",
        f"{tmp_path / 'plays.py'}:p",
        "--in",
        str(tmp_path / "in.csv"),
        "--out",
        str(tmp_path / "out.csv"),
    ]
    assert main([*argv, "--store", str(tmp_path / "st")]) == 2
    assert not (tmp_path / "out.csv").exists()


def test_a_misspelt_option_of_ctx_tool_is_told_its_spelling(store: pb.ReceiptStore) -> None:
    """``ctx.tool(t, url=..., refesh=True)`` fails the row saying ``did you mean refresh=``; a
    misspelt input of the tool still names the input."""
    from playbook.tools.engine import CALL_OPTIONS

    @pb.tool(name="bad_input.clean_domain")
    def clean_domain(url: str) -> str:
        return url.lower()

    @pb.play
    async def play(row, ctx):  # type: ignore[no-untyped-def]
        if row.n == 0:
            return {"d": await ctx.tool(clean_domain, url="A.com", refesh=True)}
        return {"d": await ctx.tool(clean_domain, urll="A.com")}

    run = pd.DataFrame({"n": [0, 1]}).play.run(play, store=store, progress=False)
    errors = run.result["play_error"].tolist()
    assert "unexpected refesh; did you mean refresh= (an option of ctx.tool) for 'refesh'?" in errors[0]
    assert "did you mean 'url' for 'urll'?" in errors[1]
    keywords = [
        p.name for p in inspect.signature(pb.Context.tool).parameters.values() if p.kind is p.KEYWORD_ONLY
    ]
    assert tuple(keywords) == CALL_OPTIONS  # the options told are the ones ctx.tool takes
