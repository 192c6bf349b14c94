"""Keys: every part of a call changes its receipt key; row keys follow the key form of their values."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd

from playbook.keys import digest, memo_key, receipt_key, row_key, step_key


def test_receipt_key_depends_on_every_part() -> None:
    """Tool, identity, account and input each change the receipt key; every receipt key starts with "r"."""
    base = receipt_key("t", "1", '{"a":1}', "acme:default")
    others = [
        receipt_key("u", "1", '{"a":1}', "acme:default"),
        receipt_key("t", "2", '{"a":1}', "acme:default"),
        receipt_key("t", "1", '{"a":2}', "acme:default"),
        receipt_key("t", "1", '{"a":1}', "acme:other"),
    ]
    assert base not in others and len(set(others)) == 4
    assert all(k.startswith("r") and len(k) == 33 for k in [base, *others])
    assert memo_key("fp", "row").startswith("m") and step_key("play", "row", "\x1fstep:x", 0).startswith("s")


def test_receipt_keys_of_the_first_store_format_are_kept() -> None:
    """A pinned tool's key is computed as in store format 1, so its receipts survive an upgrade."""
    assert receipt_key("pinned", "2", '{"q":"alpha"}', "default") == "r51cb19d1736de534bdffba087a4ed894"


def test_row_keys_merge_what_pandas_changes_and_nothing_else() -> None:
    """numpy and Python scalars, 3 and 3.0, every missing marker, a Timestamp and its datetime: one row key.
    A datetime and its ISO text, inf and "inf": two."""
    assert row_key([np.int64(3), np.float64(1.5), np.bool_(True)]) == row_key([3, 1.5, True]) == row_key([3.0, 1.5, True])
    assert len({row_key([v]) for v in (math.nan, None, pd.NA, pd.NaT, np.nan, np.datetime64("NaT"))}) == 1
    stamp = pd.Timestamp("2024-05-01 12:30")
    assert row_key([stamp]) == row_key([dt.datetime(2024, 5, 1, 12, 30)]) != row_key([stamp.isoformat()])
    assert row_key([math.inf]) != row_key(["inf"]) and row_key([True]) != row_key([1])


def test_digest_of_a_lone_surrogate_is_distinct() -> None:
    """Text holding a lone surrogate (a badly decoded file) has a digest of its own, not an error."""
    assert digest("caf\udce9") != digest("caf\udce8") and len(digest("caf\udce9")) == 32
