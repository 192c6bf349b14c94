"""Canonical JSON and digests: equal values give equal keys whatever their Python type."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd
import pytest

from playbook.keys import canonical, digest, jsonable, receipt_key, row_key


def test_numpy_and_python_scalars_share_keys() -> None:
    """numpy ints, floats and bools key like their Python equals."""
    assert row_key([np.int64(3), np.float64(1.5), np.bool_(True)]) == row_key([3, 1.5, True])


def test_all_missing_markers_are_null() -> None:
    """NaN, None, pd.NA and NaT all become JSON null."""
    assert [jsonable(v) for v in (math.nan, None, pd.NA, pd.NaT, np.nan)] == [None] * 5


def test_datetimes_become_iso_text() -> None:
    """datetime, date and Timestamp become ISO strings; equal instants key alike."""
    stamp = pd.Timestamp("2024-05-01 12:30")
    assert jsonable(stamp) == "2024-05-01T12:30:00"
    assert row_key([stamp]) == row_key([dt.datetime(2024, 5, 1, 12, 30)])
    assert jsonable(dt.date(2024, 5, 1)) == "2024-05-01"


def test_canonical_sorts_keys_and_nests() -> None:
    """Key order does not change the canonical text; tuples are lists."""
    a = canonical(jsonable({"b": (1, 2), "a": {"y": 1, "x": np.int32(2)}}))
    b = canonical(jsonable({"a": {"x": 2, "y": 1}, "b": [1, 2]}))
    assert a == b == '{"a":{"x":2,"y":1},"b":[1,2]}'


def test_unserialisable_value_names_its_type() -> None:
    """An object with no JSON form raises TypeError naming the type."""

    class Widget:
        pass

    with pytest.raises(TypeError, match="Widget"):
        jsonable({"w": Widget()})


def test_receipt_key_depends_on_every_part() -> None:
    """Tool, version, account and input each change the receipt key."""
    base = receipt_key("t", "1", '{"a":1}', "acme:default")
    others = [
        receipt_key("u", "1", '{"a":1}', "acme:default"),
        receipt_key("t", "2", '{"a":1}', "acme:default"),
        receipt_key("t", "1", '{"a":2}', "acme:default"),
        receipt_key("t", "1", '{"a":1}', "acme:other"),
    ]
    assert base not in others and len(set(others)) == 4
    assert len(digest("x")) == 32
