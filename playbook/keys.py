"""Canonical JSON and the digests built on it: receipt keys, row keys, memo keys.

Two inputs that mean the same value must give the same key whatever their Python type:
``numpy.int64(3)`` and ``3``, ``NaN``, ``None``, ``pd.NA`` and ``NaT``, a ``Timestamp`` and the
``datetime`` it wraps.  :func:`jsonable` maps such values onto plain JSON values; anything it
cannot map raises ``TypeError`` naming the type, so a caller can name the row and tool at fault.

Two inputs that differ must not share a key either.  The json module quietly writes ``1``,
``True`` and ``None`` as the object keys ``"1"``, ``"true"`` and ``"null"``, so ``{1: x}`` and
``{"1": x}`` would hit each other's receipts: a mapping key that is not a string is refused.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
import json
import math
import uuid
from collections.abc import Mapping
from typing import Any

__all__ = ["canonical", "digest", "jsonable", "memo_key", "receipt_key", "row_key", "to_json"]

_PLAIN = (str, int, bool)
_NESTED = (dict, list, tuple)
_SCALARS = frozenset({str, int, float, bool, type(None)})
_dumps = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
).encode


def jsonable(value: Any) -> Any:
    """Return ``value`` as plain JSON data (dict/list/str/int/float/bool/None)."""
    if value is None or isinstance(value, _PLAIN):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else (str(value) if math.isinf(value) else value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"mapping key {k!r} of type {type(k).__name__} is not a string")
            out[k] = jsonable(v)
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return _jsonable_other(value)


def _jsonable_other(value: Any) -> Any:
    # The rarer types live here so the common path above stays short.
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        import numpy as np
        import pandas as pd

        # tolist() gives nanosecond datetime64 values as bare ints: key them as the Timestamp they are.
        if isinstance(value, np.datetime64):
            return None if np.isnat(value) else pd.Timestamp(value).isoformat()
        if isinstance(value, np.timedelta64):
            return None if np.isnat(value) else pd.Timedelta(value).isoformat()
        if hasattr(value, "tolist"):
            return jsonable(value.tolist())
    if module.startswith("pandas"):
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
        if isinstance(value, pd.Timestamp):
            return value.isoformat()
        if isinstance(value, pd.Timedelta):
            return value.isoformat()
        if isinstance(value, (pd.Period, pd.Interval)):  # what period[M] and pd.cut columns hold
            return str(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"a value of type {type(value).__name__} is not JSON-serialisable")


def canonical(value: Any) -> str:
    """Canonical JSON text of an already-:func:`jsonable` value (sorted keys, no spaces).

    Raises ``TypeError`` for a mapping key that is not a string, which json would turn into text.
    """
    if isinstance(value, _NESTED) and not _string_keys(value):
        raise TypeError("a mapping key is not a string")
    return _dumps(value)


def _string_keys(value: Any) -> bool:
    """True if every mapping inside ``value`` (a dict, list or tuple) has only string keys."""
    # This runs for every row key and tool call: plain loops, and an exact-type test that lets
    # scalars skip the isinstance checks.
    if isinstance(value, dict):
        for k, v in value.items():
            if type(k) is not str and not isinstance(k, str):
                return False
            if type(v) not in _SCALARS and isinstance(v, _NESTED) and not _string_keys(v):
                return False
        return True
    for v in value:
        if type(v) not in _SCALARS and isinstance(v, _NESTED) and not _string_keys(v):
            return False
    return True


def digest(text: str) -> str:
    """A 128-bit hex digest: short enough for keys, wide enough never to collide by chance."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def receipt_key(tool: str, version: str, payload: str, account: str) -> str:
    """Key of a tool call's receipt; ``payload`` is the canonical JSON of its input."""
    return digest(f"r\x1f{tool}\x1f{version}\x1f{account}\x1f{payload}")


def to_json(value: Any) -> str:
    """Canonical JSON of any value :func:`jsonable` accepts (TypeError otherwise)."""
    try:
        # Plain values (the common case) encode as they are; jsonable leaves them unchanged,
        # so both paths give the same text.  NaN, numpy and pandas values take the slow path,
        # and so do non-string keys, for jsonable to refuse them.
        return canonical(value)
    except (TypeError, ValueError):
        return _dumps(jsonable(value))


def row_key(values: list[Any]) -> str:
    """Identity of a row from its (key) values, in column order."""
    return digest(to_json(values))


def memo_key(fingerprint: str, row: str) -> str:
    """Key of a row memo: the play's fingerprint and the row's identity."""
    return digest(f"m\x1f{fingerprint}\x1f{row}")
