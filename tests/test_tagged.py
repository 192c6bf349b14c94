"""Tagged JSON: every value playbook stores comes back exactly (type and value); keys tell apart what
JSON would merge, and treat as one what means one value.  Property-based (hypothesis)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import math
import uuid
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd
import pytest
from exact import same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from tier import examples

from playbook.addresses import key_text
from playbook.tagged import Unencodable, decode, dumps, encode, loads

# Text with everything a badly decoded file can hold: lone surrogates, NUL, "$" prefixes.
TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=12) | st.sampled_from(
    ["$tuple", "$", "$x", "inf", "nan"]
)
ZONES = st.sampled_from(
    [None, dt.UTC, dt.timezone(dt.timedelta(hours=-5)), ZoneInfo("Europe/Paris"), ZoneInfo("Asia/Kolkata")]
)
DATETIMES = st.builds(
    lambda d, z: d.replace(tzinfo=z),
    st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1)),
    ZONES,
)
TIMESTAMPS = st.builds(
    lambda d, z, unit: pd.Timestamp(d).tz_localize(z).as_unit(unit) if z else pd.Timestamp(d).as_unit(unit),
    st.datetimes(min_value=dt.datetime(1700, 1, 1), max_value=dt.datetime(2200, 1, 1)),
    st.sampled_from([None, "UTC", "Europe/Paris"]),
    st.sampled_from(["s", "ms", "us", "ns"]),
)
NUMPY = st.one_of(
    st.floats(width=32).map(np.float32),
    st.floats().map(np.float64),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 255).map(np.uint8),
    st.booleans().map(np.bool_),
    st.integers(-(2**40), 2**40).map(lambda n: np.datetime64(n, "ms")),
    st.integers(-(2**40), 2**40).map(lambda n: np.timedelta64(n, "us")),
    st.just(np.datetime64("NaT")),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    TEXT,
    st.binary(max_size=8),
    DATETIMES,
    st.dates(),
    st.times(timezones=ZONES),
    st.timedeltas(),
    st.decimals(allow_nan=False, places=3),
    st.uuids(),
    st.complex_numbers(allow_nan=False),
    TIMESTAMPS,
    st.sampled_from(
        [pd.NA, pd.NaT, pd.Timedelta("1 day 3ns"), pd.Period("2024-01", freq="M"), pd.Interval(0, 2)]
    ),
    NUMPY,
)
HASHABLE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    TEXT,
    st.dates(),
    st.uuids(),
    st.decimals(allow_nan=False, places=2),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(TEXT, inner, max_size=4),
        st.dictionaries(HASHABLE, inner, max_size=3),
        st.sets(HASHABLE, max_size=3),
        st.frozensets(HASHABLE, max_size=3),
        st.lists(st.floats(width=32), max_size=4).map(lambda xs: np.array(xs, dtype=np.float32)),
        st.lists(st.integers(-100, 100), max_size=6).map(
            lambda xs: np.array(xs).reshape(-1, 1) if xs else np.array([], dtype=np.int64)
        ),
    ),
    max_leaves=12,
)


def _round_trip(value: Any) -> Any:
    text = dumps(encode(value))
    text.encode("utf-8")  # storable as UTF-8, whatever strings it holds
    return decode(loads(text))


@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
@given(VALUES)
def test_every_value_comes_back_exactly(value: Any) -> None:
    """encode -> JSON text -> decode gives the same value of the same type, nested at any depth."""
    assert same(_round_trip(value), value)


@settings(max_examples=examples(300))
@given(st.dictionaries(TEXT, VALUES, max_size=5))
def test_column_order_is_kept(output: dict[str, Any]) -> None:
    """A row's output keeps its columns in the play's order, not sorted."""
    assert list(_round_trip(output)) == list(output)


def test_models_and_dataclasses_are_stored_as_their_fields() -> None:
    """A pydantic model or a dataclass is stored (and comes back) as the dict of its fields, types kept."""

    class Answer(BaseModel):
        label: str
        at: dt.datetime
        scores: tuple[float, float]

    @dataclasses.dataclass
    class Point:
        x: decimal.Decimal
        tags: frozenset[str]

    model = Answer(label="b2b", at=dt.datetime(2024, 1, 1, 9), scores=(0.5, math.inf))
    assert same(
        _round_trip(model), {"label": "b2b", "at": dt.datetime(2024, 1, 1, 9), "scores": (0.5, math.inf)}
    )
    assert same(
        _round_trip(Point(decimal.Decimal("1.10"), frozenset({"a"}))),
        {"x": decimal.Decimal("1.10"), "tags": frozenset({"a"})},
    )


def test_plain_json_is_left_alone() -> None:
    """A value that is plain JSON is stored as it is (the same object: nothing to copy or decode)."""
    value = {"a": [1, "x", None, True, 2.5], "b": {"c": []}}
    assert encode(value) is value and dumps(encode(value)) == json.dumps(value, separators=(",", ":"))


def test_a_users_dollar_key_is_never_read_as_a_tag() -> None:
    """{"$tuple": [1]} from a user (a JSON schema's {"$ref": ...}) comes back as that dict, not a tuple."""
    for value in ({"$tuple": [1]}, {"$ref": "#/x"}, {"$dict": {"a": 1}}, [{"$float": "nan"}]):
        assert same(_round_trip(value), value)


@pytest.mark.parametrize(
    "bad", [object(), open, iter([1]), [1, {"x": object()}]], ids=["object", "function", "iterator", "nested"]
)
def test_a_value_with_no_json_form_is_refused_naming_type_and_place(bad: Any) -> None:
    """Unencodable names the type and where it sits; nothing is half-written."""
    with pytest.raises(Unencodable) as info:
        encode(bad)
    assert "has no JSON form" in str(info.value)
    if isinstance(bad, list):
        assert info.value.where == "[1]['x']"


def test_a_coroutine_is_named_as_an_awaitable() -> None:
    """A coroutine in a value is reported as one (the caller says "did you forget an await?")."""

    async def later() -> int:
        return 1

    coro = later()
    with pytest.raises(Unencodable) as info:
        encode({"email": coro})
    coro.close()
    assert info.value.awaitable and info.value.where == "['email']"


# -- keys ------------------------------------------------------------------------------------


def _kind(value: Any) -> Any:
    """What a key must tell apart, written independently of the encoder: the kind and value,
    with the merges the key makes on purpose (3 == 3.0 == int64(3); every missing marker one;
    a Timestamp, a datetime64 and a datetime of one instant one)."""
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return ("missing",)
    if isinstance(value, np.datetime64):
        return ("missing",) if np.isnat(value) else ("datetime", pd.Timestamp(value).isoformat())
    if isinstance(value, np.timedelta64):
        return ("missing",) if np.isnat(value) else ("timedelta", int(pd.Timedelta(value).value))
    if isinstance(value, np.generic):
        return _kind(value.item())
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("number", value)
    if isinstance(value, float):
        if math.isinf(value):
            return ("inf", value > 0)
        return ("number", int(value)) if value.is_integer() else ("number", value)
    if isinstance(value, (dt.datetime, pd.Timestamp)):
        return ("datetime", value.isoformat())
    if isinstance(value, dict):
        return (
            "dict",
            frozenset(
                (_freeze(_kind(k)) if not isinstance(k, str) else ("str", k), _freeze(_kind(v)))
                for k, v in value.items()
            ),
        )
    if isinstance(value, list):
        return ("list", tuple(_freeze(_kind(v)) for v in value))
    if isinstance(value, tuple):
        return ("tuple", tuple(_freeze(_kind(v)) for v in value))
    return (type(value).__name__, _freeze(value))


def _freeze(value: Any) -> Any:
    return value if not isinstance(value, (list, dict, set)) else repr(value)


LOOK_ALIKES = st.one_of(
    st.integers().flatmap(
        lambda n: st.sampled_from(
            [(n, float(n)), (n, str(n)), (n, bool(n % 2)), (n, np.int64(n) if abs(n) < 2**62 else n)]
        )
    ),
    st.floats(allow_nan=False).map(lambda x: (x, str(x))),
    st.decimals(allow_nan=False, places=2).map(lambda d: (d, str(d))),
    DATETIMES.map(lambda d: (d, d.isoformat())),
    st.dates().map(lambda d: (d, dt.datetime(d.year, d.month, d.day))),
    st.lists(st.integers(), max_size=3).map(lambda xs: (xs, tuple(xs))),
    st.lists(TEXT, max_size=3, unique=True).map(lambda xs: (xs, set(xs))),
    st.dictionaries(st.integers(), st.integers(), max_size=3).map(
        lambda d: (d, {str(k): v for k, v in d.items()})
    ),
    st.binary(max_size=6).map(lambda b: (b, b.decode("latin-1"))),
    st.uuids().map(lambda u: (u, str(u))),
    st.sampled_from(
        [
            (None, math.nan),
            (None, pd.NA),
            (math.inf, "inf"),
            (math.inf, -math.inf),
            (pd.Timestamp("2024-01-01"), dt.datetime(2024, 1, 1)),
        ]
    ),
)


@settings(max_examples=examples(500))
@given(LOOK_ALIKES)
def test_keys_differ_exactly_where_the_values_differ(pair: tuple[Any, Any]) -> None:
    """Two values share a key if and only if they are the same value by the key's rules: JSON's
    merges (1 and "1", inf and "inf", a tuple and a list, {1: x} and {"1": x}) stay apart."""
    a, b = pair
    assert (key_text(a) == key_text(b)) == (_kind(a) == _kind(b)), (a, b)


@settings(max_examples=examples(300))
@given(VALUES)
def test_key_text_is_canonical(value: Any) -> None:
    """A key is the same whatever the order of a dict's items or a set's members."""
    text = key_text(value)
    assert key_text(value) == text
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        assert key_text(dict(reversed(list(value.items())))) == text


def test_key_merges_what_pandas_changes_under_you() -> None:
    """An int column that gains a NaN becomes floats: 3 and 3.0 key alike, so the other rows are not paid again."""
    ints = pd.Series([1, 2, 3])
    floats = pd.Series([1, 2, 3, None]).iloc[:3]
    assert [key_text(v) for v in ints] == [key_text(v) for v in floats]
    assert key_text({"a": 1, "b": 2}) == key_text({"b": 2.0, "a": np.int32(1)})
    assert key_text(uuid.UUID(int=1)) != key_text(str(uuid.UUID(int=1)))
