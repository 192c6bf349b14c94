"""The wire form of a tool's inputs: a value as an HTTP request carries it in JSON or text.

pandas hands a play numpy numbers, ``NaN`` for missing values and its own timestamps; a request
carries JSON.  Each is turned into the JSON value it stands for, or refused with
:class:`~playbook.tagged.Unencodable` naming its type, before the call is addressed or sent.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
import uuid
from collections.abc import Mapping
from typing import Any

from playbook.tagged import Unencodable

__all__ = ["wire"]


def wire(value: Any) -> Any:
    """An input as a request carries it: NaN and NA as None, numpy numbers as numbers (a whole
    float as an int: pandas makes 3 into 3.0 when a column gains a NaN), times as ISO text."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            raise Unencodable(value, "inf has no JSON form in a request")
        return int(value) if value.is_integer() else float(value)
    if isinstance(value, Mapping):
        return {str(k) if isinstance(k, str) else _refuse_key(k): wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [wire(v) for v in value]
    return _wire_other(value)


def _refuse_key(key: Any) -> str:
    raise Unencodable(key, f"mapping key {key!r} of type {type(key).__name__} is not a string")


def _wire_other(value: Any) -> Any:
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        import numpy as np
        import pandas as pd

        if isinstance(value, np.datetime64):
            return None if np.isnat(value) else pd.Timestamp(value).isoformat()
        if isinstance(value, np.timedelta64):
            return None if np.isnat(value) else pd.Timedelta(value).isoformat()
        if hasattr(value, "tolist"):
            return wire(value.tolist())
    if module.startswith("pandas"):
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
        if isinstance(value, (pd.Timestamp, pd.Timedelta)):
            return value.isoformat()
        if isinstance(value, (pd.Period, pd.Interval)):
            return str(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    raise Unencodable(value, f"a value of type {type(value).__name__} cannot be sent in a request")
