"""``pl.DataFrame.play``: Polars in, Polars out, the same runtime, statuses and receipts as pandas."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import inspect
import os
import subprocess
import sys
import zoneinfo
from pathlib import Path

import pandas as pd
import polars as pl
import pytest
from exact import same

import playbook as pb
from playbook.frontends.pandas import PlayAccessor
from playbook.frontends.polars import PolarsPlay, PolarsRun

PARIS = zoneinfo.ZoneInfo("Europe/Paris")


@pb.play
async def doubled(row, ctx):
    if row.n is None:
        raise ValueError(f"no n in row {row.index}")
    await asyncio.sleep(0.02 if row.index == 0 else 0)  # the first row finishes last
    return {"double": row.n * 2}


def test_map_returns_polars_with_statuses(store: pb.ReceiptStore) -> None:
    """map() returns a Polars frame: input columns, outputs, play_status, play_error, in input order."""
    frame = pl.DataFrame({"name": ["a", "b", "c", "d"], "n": [3, None, 1, 2]})
    out = frame.play.map(doubled, store=store, progress=False, concurrency=4)
    assert isinstance(out, pl.DataFrame)
    assert out.columns == ["name", "n", "double", "play_status", "play_error"]
    assert out["name"].to_list() == ["a", "b", "c", "d"]
    assert out["play_status"].to_list() == ["ok", "failed", "ok", "ok"]
    errors = out["play_error"].to_list()
    assert errors[0] is errors[2] is errors[3] is None and errors[1].startswith(
        "ValueError: no n in row 1 (line "
    )
    assert out["double"].to_list() == [
        6.0,
        None,
        2.0,
        4.0,
    ]  # a failed row has no output: as in pandas, a float column
    assert out.schema["play_status"] == pl.String and out.schema["play_error"] == pl.String


def test_play_sees_python_values(store: pb.ReceiptStore) -> None:
    """A play sees what df.rows() gives: an int or None, zoned datetimes, dates, Decimals, lists, dicts, strs."""
    frame = pl.DataFrame(
        {
            "n": [1, None],
            "when": [dt.datetime(2024, 3, 1, 9, tzinfo=PARIS), None],
            "day": [dt.date(2024, 3, 1), None],
            "price": [decimal.Decimal("1.50"), None],
            "tags": [["x", "y"], None],
            "info": [{"a": 1, "b": "z"}, None],
            "big": pl.Series([2**64 - 1, 0], dtype=pl.UInt64),
            "cat": pl.Series(["p", "q"], dtype=pl.Categorical),
            "level": pl.Series(["lo", "hi"], dtype=pl.Enum(["lo", "hi"])),
            "empty": [None, None],
            "nanos": pl.Series(["2024-01-01T00:00:00.000000123", None]).str.to_datetime(time_unit="ns"),
        }
    )
    seen: list[dict] = []

    @pb.play
    async def look(row, ctx):
        seen.append(row.to_dict())

    frame.play.map(look, store=store, progress=False, concurrency=1)
    first, second = seen
    assert same(first["n"], 1) and second["n"] is None
    assert first["when"] == dt.datetime(2024, 3, 1, 9, tzinfo=PARIS) and first[
        "when"
    ].utcoffset() == dt.timedelta(hours=1)
    assert same(first["day"], dt.date(2024, 3, 1))
    assert same(first["price"], decimal.Decimal("1.50"))
    assert same(first["tags"], ["x", "y"]) and same(first["info"], {"a": 1, "b": "z"})
    assert same(first["big"], 2**64 - 1)
    assert same(first["cat"], "p") and same(first["level"], "lo")
    assert first["empty"] is None
    assert first["nanos"] == pd.Timestamp("2024-01-01T00:00:00.000000123") and second["nanos"] is None
    assert all(value is None for name, value in second.items() if name not in ("big", "cat", "level"))


def test_input_columns_keep_their_dtypes(store: pb.ReceiptStore) -> None:
    """Input columns come back as the original Polars columns, dtypes (zones, Decimal, Enum...) and all."""
    frame = pl.DataFrame(
        {
            "when": pl.Series([dt.datetime(2024, 3, 1, 9), None]).dt.replace_time_zone("Europe/Paris"),
            "price": pl.Series([decimal.Decimal("1.5"), None], dtype=pl.Decimal(10, 3)),
            "level": pl.Series(["lo", "hi"], dtype=pl.Enum(["lo", "hi"])),
            "info": [{"a": 1}, {"a": None}],
            "n": pl.Series([1, None], dtype=pl.Int8),
            "nanos": pl.Series(["2024-01-01T00:00:00.000000123", None]).str.to_datetime(time_unit="ns"),
        }
    )

    @pb.play
    async def one(row, ctx):
        return 1

    out = frame.play.map(one, store=store, progress=False)
    assert out.select(frame.columns).equals(frame)
    assert dict(out.schema) == {
        **frame.schema,
        "one": pl.Int64,
        "play_status": pl.String,
        "play_error": pl.String,
    }


def test_outputs_are_typed_or_kept_as_objects(store: pb.ReceiptStore) -> None:
    """Outputs Polars can hold get their type; mixed or odd ones become Object columns with the values as returned."""
    rows = [
        {
            "meta": {"k": 1},
            "items": [1, 2],
            "at": dt.datetime(2024, 1, 1, tzinfo=PARIS),
            "cost": decimal.Decimal("0.10"),
            "mixed": 1,
            "odd": {1, 2},
            "loose": {"a": 1},
        },
        {
            "meta": {"k": 2},
            "items": [],
            "at": None,
            "cost": decimal.Decimal("2.25"),
            "mixed": "two",
            "odd": {3: "x"},
            "loose": {"b": "x"},
        },
    ]

    @pb.play
    async def emit(row, ctx):
        return rows[row.i]

    out = pl.DataFrame({"i": [0, 1]}).play.map(emit, store=store, progress=False)
    assert out.schema["meta"] == pl.Struct({"k": pl.Int64})
    assert out.schema["items"] == pl.List(pl.Int64)
    assert out.schema["at"] == pl.Datetime("us", "Europe/Paris")
    assert isinstance(out.schema["cost"], pl.Decimal)
    assert (
        out.schema["mixed"] == out.schema["odd"] == out.schema["loose"] == pl.Object
    )  # a Struct would add keys
    for name in ("meta", "items", "at", "cost", "mixed", "odd", "loose"):
        assert out[name].to_list() == [row[name] for row in rows], name
    assert out["mixed"].to_list()[1] == "two" and out["odd"].to_list()[0] == {1, 2}


def test_output_replacing_an_input_column(store: pb.ReceiptStore) -> None:
    """With overwrite=True an output named like an input replaces it in the rows that returned it;
    failed rows keep their input.  Without it, those rows fail saying so, and nothing is lost."""

    @pb.play
    async def clean(row, ctx):
        if row.site == "bad":
            raise ValueError("bad site")
        return {"site": row.site.upper()}

    frame = pl.DataFrame({"site": ["a", "bad", "c"], "k": [1, 2, 3]})
    kept = frame.play.map(clean, store=store, progress=False)
    assert kept["site"].to_list() == ["a", "bad", "c"] and kept["play_status"].to_list() == ["failed"] * 3
    assert (
        "returned 'site', an input column of the frame, with another value" in kept["play_error"][0]
        and "overwrite=True" in kept["play_error"][0]
    )
    out = frame.play.map(clean, store=store, progress=False, overwrite=True)
    assert out.columns == ["site", "k", "play_status", "play_error"]
    assert out["site"].to_list() == ["A", "bad", "C"]
    assert out["k"].to_list() == [1, 2, 3]


def test_pandas_then_polars_pays_nothing(store: pb.ReceiptStore) -> None:
    """The same rows as a pandas and as a Polars frame are the same rows: the second run reuses memos and receipts."""
    calls: list[object] = []

    @pb.tool(name="lookup", cost=1.0)
    def lookup(name: str, n: object, when: object) -> str:
        calls.append(name)
        return f"{name}:{n}:{when}"

    @pb.play
    async def enrich(row, ctx):
        return {"found": await ctx.tool(lookup, name=row.name, n=row.n, when=row.when)}

    when = [dt.datetime(2024, 3, 1, 9, tzinfo=dt.UTC), None, dt.datetime(2024, 3, 2, tzinfo=dt.UTC)]
    polars_frame = pl.DataFrame(
        {"name": ["a", "b", "c"], "n": [1, None, 3], "x": [0.5, float("nan"), None], "when": when}
    )
    pandas_frame = pd.DataFrame(
        {
            "name": ["a", "b", "c"],
            "n": [1, None, 3],
            "x": [0.5, float("nan"), None],
            "when": pd.to_datetime(when, utc=True),
        }
    )
    assert pandas_frame["n"].dtype == float  # what pandas makes of an int column with a gap
    first = pandas_frame.play.map(enrich, store=store, progress=False)
    assert (pb.last_run().stats.calls_executed, len(calls)) == (3, 3)

    again = polars_frame.play.map(enrich, store=store, progress=False)
    assert pb.last_run().stats.calls_executed == 0 and len(calls) == 3
    assert again["play_status"].to_list() == ["reused"] * 3
    assert again["found"].to_list() == first["found"].tolist()

    polars_frame.play.map(
        enrich, store=store, progress=False, refresh="rows"
    )  # rows run again: their calls hit receipts
    assert (pb.last_run().stats.calls_executed, pb.last_run().stats.calls_reused, len(calls)) == (0, 3, 3)


def test_a_play_reading_row_index_gets_each_equal_rows_own_position(store: pb.ReceiptStore) -> None:
    """row.index is a Polars row's position: a play that reads it gets each equal row's own, and
    the same values at other positions are rows of their own, not answered by another's memo."""

    @pb.play
    async def placed(row, ctx):
        return {"at": row.index}

    out = pl.DataFrame({"a": [1, 1, 1]}).play.map(placed, store=store, progress=False)
    assert out["at"].to_list() == [0, 1, 2] and out["play_status"].to_list() == ["ok"] * 3
    later = pl.DataFrame({"a": [2, 1, 1, 1, 1]}).play.map(placed, store=store, progress=False)
    assert (
        later["at"].to_list() == [0, 1, 2, 3, 4]
        and later["play_status"].to_list() == ["ok"] + ["reused"] * 2 + ["ok"] * 2
    )


def test_run_gives_polars_frames(store: pb.ReceiptStore) -> None:
    """run() returns a PolarsRun: Polars result and errors, the Run's stats and repr; retry() reruns failed rows, as a run of its own."""
    broken = {"on": True}

    @pb.play
    async def flaky(row, ctx):
        if broken["on"] and row.n == 2:
            raise RuntimeError("down")
        return {"m": row.n + 1}

    run = pl.DataFrame({"n": [1, 2, 3]}).play.run(flaky, store=store, progress=False)
    assert isinstance(run, PolarsRun)
    assert run.result["play_status"].to_list() == ["ok", "failed", "ok"]
    assert run.result is run.result  # converted once for a finished run
    assert run.errors.columns == ["row", "position", "error", "group", "cost"]
    assert run.errors.rows()[0][:2] == (1, 1) and run.errors["error"][0].startswith("RuntimeError: down")
    assert (
        run.parked.columns == ["row", "position", "reason", "provider", "ready_at", "message"]
        and run.parked.height == 0
    )
    assert (run.stats.ok, run.stats.failed) == (2, 1)
    assert repr(run).startswith("<PolarsRun 'flaky' finished: 3 rows, ok=2 reused=0 failed=1")
    assert pb.last_run() is run.pandas and not run.running

    broken["on"] = False
    again = run.retry()
    assert isinstance(again, PolarsRun) and again.previous.pandas is run.pandas and run.previous is None
    assert again.wait()["play_status"].to_list() == ["ok", "ok", "ok"]
    assert again.result["m"].to_list() == [2, 3, 4] and run.result["m"].to_list() == [2, 3, 4]
    assert (again.stats.total, again.stats.ok, run.stats.ok) == (1, 1, 2)  # the retry counts its own row


def test_amap_arun_and_background(store: pb.ReceiptStore) -> None:
    """amap() awaits a Polars frame; arun(background=True) returns at once and wait() gives the Polars result."""

    async def main() -> tuple:
        out = await pl.DataFrame({"n": [1]}).play.amap(doubled, store=store, progress=False)
        done = await pl.DataFrame({"n": [4]}).play.arun(doubled, store=store, progress=False)
        run = await pl.DataFrame({"n": [5, 6]}).play.arun(
            doubled, store=store, progress=False, background=True
        )
        was_running = run.running
        return (
            out["double"].to_list(),
            done.result["double"].to_list(),
            was_running,
            run.wait()["double"].to_list(),
        )

    assert asyncio.run(main()) == ([2], [8], True, [10, 12])


def test_limit_key_and_tools(store: pb.ReceiptStore) -> None:
    """limit= keeps the first N rows, id_columns= names the row id, and a tool maps straight from columns."""

    @pb.tool(name="greet")
    def greet(first: str) -> str:
        return "hi " + first

    frame = pl.DataFrame({"first": ["ann", "bob", "ann", "cy"], "id": [1, 2, 1, 4]})
    out = frame.play.map(greet, store=store, progress=False, limit=3, id_columns="id")
    assert out.rows() == [
        ("ann", 1, "hi ann", "ok", None),
        ("bob", 2, "hi bob", "ok", None),
        ("ann", 1, "hi ann", "ok", None),
    ]
    assert pb.last_run().stats.calls_local == 2  # the third row shares the first one's key


def test_options_are_the_pandas_ones() -> None:
    """Each method spells out exactly the pandas accessor's keyword options, and map's help lists them."""
    for method in ("map", "run", "amap", "arun"):
        ours = inspect.signature(getattr(PolarsPlay, method)).parameters
        theirs = inspect.signature(getattr(PlayAccessor, method)).parameters
        assert [(p.name, p.kind, p.default, p.annotation) for p in ours.values()] == [
            (p.name, p.kind, p.default, p.annotation) for p in theirs.values()
        ], method
    doc = PolarsPlay.map.__doc__ or ""
    assert "Polars DataFrame" in doc
    assert all(
        f"``{name}``" in doc
        for name in inspect.signature(PlayAccessor.map).parameters
        if name not in ("self", "unknown")
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"id_columns": "missing"},
            "id_columns='missing': no column 'missing' in the DataFrame; columns: \\['n'\\]",
        ),
        ({"concurency": 2}, "unknown run option 'concurency'; did you mean 'concurrency'"),
        ({"limit": -1}, "limit=-1: limit must be a whole number"),
        ({"background": True}, "map\\(\\) returns the finished DataFrame"),
    ],
)
def test_bad_options_are_named(options: dict, message: str, store: pb.ReceiptStore) -> None:
    """A bad option on a Polars frame raises the pandas accessor's PlayDefinitionError, naming it."""
    with pytest.raises(pb.PlayDefinitionError, match=message):
        pl.DataFrame({"n": [1]}).play.map(doubled, store=store, progress=False, **options)


def test_lazy_frame_says_collect_first() -> None:
    """lazy_frame.play.map() says to .collect() first; other attributes are simply missing."""
    lazy = pl.DataFrame({"n": [1]}).lazy()
    with pytest.raises(
        pb.PlayDefinitionError, match=r"call \.collect\(\) first, e\.g\. lf\.collect\(\)\.play\.map"
    ):
        lazy.play.map(doubled)
    assert not hasattr(lazy.play, "_repr_html_")


_INC = "@playbook.tool\ndef inc(n):\n    return n + 1\n"
_SCRIPTS = {
    "playbook-first": (
        "import importlib.util, sys, playbook\n"
        "assert 'polars' not in sys.modules, 'import playbook imported polars'\n"
        "assert importlib.util.find_spec('polars') is not None\n"  # a probe loads nothing and keeps the hook
        "import polars as pl\n"
        + _INC
        + "print(pl.DataFrame({'n': [2]}).play.map(inc, progress=False).rows())\n"
    ),
    "polars-first": (
        "import polars as pl, playbook\n"
        + _INC
        + "print(pl.DataFrame({'n': [2]}).play.map(inc, progress=False).rows())\n"
    ),
    "no-polars": (
        "import sys\nsys.modules['polars'] = None\nimport pandas as pd, playbook\n"
        + _INC
        + "print(pd.DataFrame({'n': [2]}).play.map(inc, progress=False).values.tolist())\n"
    ),
}


@pytest.mark.slow
def test_import_order(tmp_path: Path) -> None:
    """pl.DataFrame.play exists whichever of playbook and polars is imported first; without polars, playbook works."""
    # Side by side (each is a fresh interpreter importing pandas: that is most of the time), each with its own store.
    started = {
        name: subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PLAYBOOK_HOME": str(tmp_path / name)},
        )
        for name, script in _SCRIPTS.items()
    }
    for name, process in started.items():
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, f"{name}: {err}"
        assert out.strip() in ("[(2, 3, 'ok', None)]", "[[2, 3, 'ok', None]]"), name
