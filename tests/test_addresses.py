"""Keys: every part of a call changes its address; row ids follow the key form of their values."""

from __future__ import annotations

import datetime as dt
import math
import pickle

import numpy as np
import pandas as pd

from playbook.addresses import (
    ReceiptAddresses,
    digest,
    int_row_digests,
    memo_address,
    memo_digests,
    receipt_address,
    row_digest,
    row_id,
    step_address,
)


def test_a_tools_receipt_addresses_are_receipt_address_and_pickle() -> None:
    """One tool's addresses are receipt_address's, before and after pickling (a tool used here ships to workers)."""
    addresses = ReceiptAddresses("t", "1", "acme:default")
    addresses('{"a":1}')
    again = pickle.loads(pickle.dumps(addresses))
    for payload in ('{"a":1}', '{"a":2}', '"caf\udce9"'):
        expected = receipt_address("t", "1", payload, "acme:default")
        assert addresses(payload) == again(payload) == expected


def test_receipt_key_depends_on_every_part() -> None:
    """Tool, identity, account and input each change the address; every address starts with "r"."""
    base = receipt_address("t", "1", '{"a":1}', "acme:default")
    others = [
        receipt_address("u", "1", '{"a":1}', "acme:default"),
        receipt_address("t", "2", '{"a":1}', "acme:default"),
        receipt_address("t", "1", '{"a":2}', "acme:default"),
        receipt_address("t", "1", '{"a":1}', "acme:other"),
    ]
    assert base not in others and len(set(others)) == 4
    assert all(k.startswith("r") and len(k) == 33 for k in [base, *others])
    assert memo_address("fp", "row").startswith("m") and step_address(
        "play", "row", "\x1fstep:x", 0
    ).startswith("s")


def test_receipt_keys_of_the_first_store_format_are_kept() -> None:
    """A pinned tool's key is computed as in store format 1, so its receipts survive an upgrade."""
    assert receipt_address("pinned", "2", '{"q":"alpha"}', "default") == "r51cb19d1736de534bdffba087a4ed894"


def test_receipt_and_memo_keys_are_the_digest_of_the_whole_text_whatever_it_holds() -> None:
    """A receipt's key is the digest of its whole text, for any tool name, account and input
    (non-ASCII, a lone surrogate), however many tools' keys are made in between; a memo's too."""
    parts = [
        ("t", "1", "ä", '{"q":"\ud800 é"}'),
        ("näme", "src:ab", "acme:x", "[]"),
        ("t", "1", "ä", '"\x1f"'),
    ]
    for n in range(300):  # more tools than are kept ready to hash
        receipt_address(f"tool{n}", "1", "{}", "default")
    for tool, identity, account, payload in parts * 2:
        assert receipt_address(tool, identity, payload, account) == "r" + digest(
            f"r\x1f{tool}\x1f{identity}\x1f{account}\x1f{payload}"
        )
        assert memo_address(identity + tool, payload) == "m" + digest(f"m\x1f{identity + tool}\x1f{payload}")


def test_row_ids_merge_what_pandas_changes_and_nothing_else() -> None:
    """numpy and Python scalars, 3 and 3.0, every missing marker, a Timestamp and its datetime: one row id.
    A datetime and its ISO text, inf and "inf": two."""
    assert (
        row_id([np.int64(3), np.float64(1.5), np.bool_(True)])
        == row_id([3, 1.5, True])
        == row_id([3.0, 1.5, True])
    )
    assert len({row_id([v]) for v in (math.nan, None, pd.NA, pd.NaT, np.nan, np.datetime64("NaT"))}) == 1
    stamp = pd.Timestamp("2024-05-01 12:30")
    assert row_id([stamp]) == row_id([dt.datetime(2024, 5, 1, 12, 30)]) != row_id([stamp.isoformat()])
    assert row_id([math.inf]) != row_id(["inf"]) and row_id([True]) != row_id([1])


def test_digest_of_a_lone_surrogate_is_distinct() -> None:
    """Text holding a lone surrogate (a badly decoded file) has a digest of its own, not an error."""
    assert digest("caf\udce9") != digest("caf\udce8") and len(digest("caf\udce9")) == 32


def test_row_digests_of_int_columns_are_their_rows_ids() -> None:
    """Rows of numpy int and bool columns, digested a column at a time, have the keys their values
    have one row at a time (the extremes of each width included); so do memo keys made in bulk."""
    columns = [
        np.array([0, -1, np.iinfo(np.int64).min, np.iinfo(np.int64).max, 42]),
        np.array([0, 1, 2**63, 2**64 - 1, 7], dtype=np.uint64),
        np.array([True, False, True, False, True]),
        np.array([-128, 127, 0, 1, -1], dtype=np.int8),
    ]
    rows = list(zip(*[c.tolist() for c in columns]))
    both = int_row_digests(columns)
    assert [bytes(both[16 * i : 16 * i + 16]) for i in range(5)] == [row_digest(list(r)) for r in rows]
    one = int_row_digests(columns[2:3])
    assert [bytes(one[16 * i : 16 * i + 16]) for i in range(5)] == [row_digest([r[2]]) for r in rows]
    keys = [row_id(list(r)) for r in rows]
    memos = memo_digests("fp", keys)
    assert ["m" + memos[16 * i : 16 * i + 16].hex() for i in range(5)] == [
        memo_address("fp", k) for k in keys
    ]
