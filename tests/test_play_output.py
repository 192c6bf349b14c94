"""``@pb.play(output=Model)``: the model's columns exist in its order and with dtypes from its
annotations whatever happened to the rows; each row's output is validated (a field error fails
that row, naming the field); reruns replay the validated values; the model is part of the
play's fingerprint."""

from __future__ import annotations

import datetime as dt
import gc
import sys
import typing
import warnings
import zoneinfo
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import pydantic
import pytest
import typing_extensions as te
from exact import same
from pydantic import BaseModel, ConfigDict, RootModel

import playbook as pb

STR = pd.Series(["a"]).dtype  # what pandas gives a column of str (pandas 3: "str")
DATETIME = pd.Series([dt.datetime(2000, 1, 1)]).dtype  # and of naive datetimes
UNIT = pd.Series([dt.datetime(2000, 1, 1)]).dt.unit


class Address(BaseModel):
    city: str


class Company(BaseModel):
    employees: int
    name: str
    revenue: float | None = None
    public: bool = False
    founded: dt.datetime | None = None
    seen: dt.date | None = None
    kind: Literal["a", "b"] = "a"
    tags: list[str] = []
    address: Address | None = None


COLUMNS = ["employees", "name", "revenue", "public", "founded", "seen", "kind", "tags", "address"]
DTYPES = ["Int64", STR, "float64", "boolean", DATETIME, object, STR, object, object]


def _dtypes(out: pd.DataFrame) -> list[Any]:
    return [out[c].dtype for c in COLUMNS]


def _map(frame: pd.DataFrame, play: pb.Play, store: Path, **opts: Any) -> pd.DataFrame:
    return frame.play.map(play, progress=False, store=store, **opts)


def test_columns_and_dtypes_exist_when_every_row_fails(tmp_path: Path) -> None:
    """No row succeeds: the model's columns are still there, after the inputs, in its order and dtypes, all missing."""

    @pb.play(output=Company)
    async def broken(row, ctx):
        raise ValueError("down")

    out = _map(pd.DataFrame({"n": [1, 2]}), broken, tmp_path)
    assert list(out.columns) == ["n", *COLUMNS, "play_status", "play_error"]
    assert _dtypes(out) == DTYPES
    assert out["play_status"].tolist() == ["failed", "failed"]
    assert out[COLUMNS].isna().all().all()


def test_columns_and_dtypes_exist_with_zero_rows(tmp_path: Path) -> None:
    """An empty frame gives an empty result with the model's columns and dtypes."""

    @pb.play(output=Company)
    async def enrich(row, ctx):
        return {"employees": 1, "name": "x"}

    out = _map(pd.DataFrame({"n": pd.Series([], dtype="int64")}), enrich, tmp_path)
    assert list(out.columns) == ["n", *COLUMNS, "play_status", "play_error"] and len(out) == 0
    assert _dtypes(out) == DTYPES


def test_the_models_order_is_kept_whatever_order_the_play_returns(tmp_path: Path) -> None:
    """Keys returned in another order (and keys the model does not declare, which are dropped) give the model's columns in its order."""

    @pb.play(output=Company)
    async def enrich(row, ctx):
        return {
            "undeclared": 1,
            "founded": dt.datetime(2001, 2, 3),
            "name": row.name,
            "employees": row.n,
            "tags": ["t"],
        }

    out = _map(pd.DataFrame({"n": [3], "name": ["acme"]}), enrich, tmp_path)
    assert list(out.columns) == [
        "n",
        "name",
        *[c for c in COLUMNS if c != "name"],
        "play_status",
        "play_error",
    ]
    row = out.iloc[0]
    assert (
        row["play_status"] == "ok"
        and row["employees"] == 3
        and row["name"] == "acme"
        and row["tags"] == ["t"]
    )
    assert row["founded"] == pd.Timestamp("2001-02-03") and row["kind"] == "a" and not row["public"]
    assert [out[c].dtype for c in COLUMNS if c != "name"] == [
        d for c, d in zip(COLUMNS, DTYPES) if c != "name"
    ]


def test_a_field_error_fails_only_that_row_naming_the_field(tmp_path: Path) -> None:
    """A value the model rejects fails its row with a message naming the play and the field; the other rows are ok."""

    @pb.play(output=Company)
    async def enrich(row, ctx):
        return {"employees": row.employees, "name": "x"}

    out = _map(pd.DataFrame({"employees": [5, "many", 7]}), enrich, tmp_path)
    assert out["play_status"].tolist() == ["ok", "failed", "ok"]
    assert out["play_error"].iloc[1] == (
        "OutputError: play 'enrich': output field 'employees': Input should be a valid integer, "
        "unable to parse string as an integer (got 'many')"
    )
    assert out["play_error"].iloc[0] is None and out["employees"].tolist() == [
        5,
        "many",
        7,
    ]  # an input column: kept where it failed


def test_several_field_errors_are_named_together(tmp_path: Path) -> None:
    """Every rejected field is named (a missing one too), and a nested field by its path."""

    @pb.play(output=Company)
    async def enrich(row, ctx):
        return {"revenue": "lots", "address": {"town": "x"}}

    error = _map(pd.DataFrame({"n": [1]}), enrich, tmp_path)["play_error"].iloc[0]
    assert error.startswith(
        "OutputError: play 'enrich': output field 'employees': Field required; output field 'name': Field required; "
    )
    assert "output field 'revenue': Input should be a valid number" in error and error.endswith(
        "; and 1 more"
    )


class Person(te.TypedDict):
    age: int
    email: te.NotRequired[str | None]
    born: dt.date


def test_a_typeddict_declares_the_output(tmp_path: Path) -> None:
    """A TypedDict works as a model: its keys in order, typed, validated (a key it marks NotRequired may be absent)."""

    @pb.play(output=Person)
    async def people(row, ctx):
        return {"born": dt.date(1990, 1, row.n), "age": "41" if row.n == 1 else "old"}

    out = _map(pd.DataFrame({"n": [1, 2]}), people, tmp_path)
    assert list(out.columns) == ["n", "age", "email", "born", "play_status", "play_error"]
    assert [out[c].dtype for c in ("age", "email", "born")] == ["Int64", STR, object]
    assert (
        out["play_status"].tolist() == ["ok", "failed"] and "output field 'age'" in out["play_error"].iloc[1]
    )
    assert (
        out["age"].iloc[0] == 41
        and same(out["born"].iloc[0], dt.date(1990, 1, 1))
        and pd.isna(out["email"].iloc[0])
    )


class Listed(Company):
    ticker: str


def test_a_model_instance_returned_is_the_output(tmp_path: Path) -> None:
    """A play may return an instance of its model (or of a subclass: only the model's fields count)."""

    @pb.play(output=Company)
    async def enrich(row, ctx):
        if row.n == 1:
            return Company(employees=10, name="a", address=Address(city="Paris"))
        return Listed(employees=20, name="b", ticker="B")

    out = _map(pd.DataFrame({"n": [1, 2]}), enrich, tmp_path)
    assert out["play_status"].tolist() == ["ok", "ok"] and "ticker" not in out.columns
    assert out["employees"].tolist() == [10, 20] and out["address"].tolist() == [{"city": "Paris"}, None]


PARIS = zoneinfo.ZoneInfo("Europe/Paris")


class Seen(BaseModel):
    when: dt.datetime
    local: dt.datetime
    count: int | None = None
    ratio: float


def test_a_rerun_replays_identical_values(tmp_path: Path) -> None:
    """A rerun settles the rows as reused from their memos with the same values and dtypes: datetimes, a zoned datetime, an Optional int."""

    @pb.play(output=Seen)
    async def seen(row, ctx):
        local = dt.datetime(2024, 3, 31, 1, 30, tzinfo=PARIS) + dt.timedelta(hours=row.n)
        return {
            "when": dt.datetime(2024, 5, row.n, 12, 30, 15, 123456),
            "local": local,
            "count": row.n if row.n > 1 else None,
            "ratio": 1,
        }

    frame = pd.DataFrame({"n": [1, 2]})
    first, second = _map(frame, seen, tmp_path), _map(frame, seen, tmp_path)
    assert first["play_status"].tolist() == ["ok", "ok"] and second["play_status"].tolist() == [
        "reused",
        "reused",
    ]
    assert first.drop(columns="play_status").equals(second.drop(columns="play_status"))
    assert first["local"].dtype == pd.DatetimeTZDtype(UNIT, "Europe/Paris")
    assert (
        first["count"].dtype == "Int64" and pd.isna(second["count"].iloc[0]) and second["count"].iloc[1] == 2
    )
    assert second["when"].iloc[0] == pd.Timestamp("2024-05-01 12:30:15.123456") and second[
        "ratio"
    ].tolist() == [1.0, 1.0]


class Domain(BaseModel):
    domain: str


class DomainAndLength(BaseModel):
    domain: str
    length: int | None = None


def _counted(paid: list[str]) -> tuple[pb.Tool, Any]:
    @pb.tool(name="output_lookup")
    def lookup(q: str) -> str:
        paid.append(q)
        return f"{q}.com"

    def make(model: type) -> pb.Play:
        @pb.play(name="domains", output=model)
        async def domains(row, ctx):
            domain = await ctx.tool(lookup, q=row.q)
            return {"domain": domain, "length": len(domain)}

        return domains

    return lookup, make


def test_changing_the_model_reruns_rows_without_paying_again(tmp_path: Path) -> None:
    """The model is part of the play's fingerprint: a new model runs the rows again (no memo applies), their tool calls hit receipts."""
    paid: list[str] = []
    _, make = _counted(paid)
    frame = pd.DataFrame({"q": ["a", "b"]})
    first = frame.play.run(make(Domain), progress=False, store=tmp_path)
    again = frame.play.run(make(Domain), progress=False, store=tmp_path)
    changed = frame.play.run(make(DomainAndLength), progress=False, store=tmp_path)
    assert make(Domain).fingerprint != make(DomainAndLength).fingerprint
    assert first.stats.ok == 2 and again.stats.reused == 2 and changed.stats.ok == 2
    assert paid == ["a", "b"] and changed.stats.calls_reused == 2 and changed.stats.calls_executed == 0
    assert list(first.result.columns) == ["q", "domain", "play_status", "play_error"]
    assert changed.result["length"].tolist() == [5, 5]


def test_a_play_without_a_model_keeps_its_fingerprint() -> None:
    """output=None changes nothing: the same fingerprint as before the option existed, no model on the play."""

    async def plain(row, ctx):
        return None

    assert pb.play(plain).fingerprint == pb.play(plain, output=None).fingerprint
    assert (
        pb.play(plain).output is None
        and pb.play(plain, output=Domain).fingerprint != pb.play(plain).fingerprint
    )


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    domain: str


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    domain: str


def test_undeclared_keys_follow_the_models_extra_setting(tmp_path: Path) -> None:
    """By default an undeclared key is dropped; extra="forbid" fails the row naming it; extra="allow" keeps it as a column after the model's."""

    def make(model: type) -> pb.Play:
        @pb.play(name="extras", output=model)
        async def extras(row, ctx):
            return {"more": row.n, "domain": "x"}

        return extras

    frame = pd.DataFrame({"n": [1]})
    assert list(_map(frame, make(Domain), tmp_path).columns) == ["n", "domain", "play_status", "play_error"]
    error = _map(frame, make(Strict), tmp_path)["play_error"].iloc[0]
    assert error == "OutputError: play 'extras': output field 'more': Extra inputs are not permitted (got 1)"
    out = _map(frame, make(Open), tmp_path)
    assert list(out.columns) == ["n", "domain", "more", "play_status", "play_error"] and out[
        "more"
    ].tolist() == [1]


@pytest.fixture
def no_unawaited_warnings() -> Iterator[None]:
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


def test_a_forgotten_await_in_a_typed_field_says_so(tmp_path: Path, no_unawaited_warnings: None) -> None:
    """A coroutine where the model wants a str fails the row with "did you forget an await?", not a type error."""

    @pb.tool
    async def shout(q: str) -> str:
        return q.upper()

    @pb.play(output=Domain)
    async def forgetful(row, ctx):
        return {"domain": ctx.tool(shout, q=row.q)}

    error = _map(pd.DataFrame({"q": ["a"]}), forgetful, tmp_path)["play_error"].iloc[0]
    assert "output['domain']" in error and "did you forget an await?" in error


class Legacy(typing.TypedDict):
    a: int


class Reserved(BaseModel):
    play_status: str


@pytest.mark.parametrize(
    ("output", "match"),
    [
        (int, "output= takes a pydantic model class or a TypedDict class, not <class 'int'>"),
        ({"a": int}, "not {'a': <class 'int'>}"),
        (Domain(domain="x"), r"an instance of Domain \(pass the class itself\)"),
        (RootModel[list[int]], "not "),
        (Reserved, "a field 'play_status', a column playbook uses"),
        pytest.param(
            Legacy,
            "output=Legacy cannot validate outputs: Please use `typing_extensions.TypedDict`",
            marks=pytest.mark.skipif(
                sys.version_info >= (3, 12), reason="pydantic takes typing.TypedDict from Python 3.12"
            ),
        ),
    ],
    ids=["a type", "a dict", "an instance", "a RootModel", "a reserved name", "typing.TypedDict"],
)
def test_a_bad_output_option_is_a_play_definition_error(output: Any, match: str) -> None:
    """output= must be a pydantic model or TypedDict class pydantic can validate; else PlayDefinitionError naming the play."""
    with pytest.raises(pb.PlayDefinitionError, match=match) as caught:

        @pb.play(output=output)
        async def enrich(row, ctx):
            return None

    assert str(caught.value).startswith("play 'enrich': ")


class _When(pydantic.BaseModel):
    at: pydantic.AwareDatetime


def test_a_model_with_datetimes_keeps_its_column_types_after_a_pickle_round_trip(store) -> None:
    """A play sent to another process (a Dask worker pickles it) types its output columns as here."""
    import pickle

    import cloudpickle

    async def stamp(row, ctx):  # type: ignore[no-untyped-def]
        return {"at": dt.datetime(2026, 1, row.n + 1, tzinfo=dt.UTC)}

    here = pb.play(stamp, name="stamp", output=_When)
    there = pickle.loads(cloudpickle.dumps(here))
    frame = pd.DataFrame({"n": [0, 1]})
    assert str(frame.play.map(there, store=store, progress=False)["at"].dtype) == str(
        frame.play.map(here, store=store, progress=False)["at"].dtype
    )
    assert str(frame.play.map(there, store=store, progress=False)["at"].dtype).startswith("datetime64")
