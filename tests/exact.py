"""``same(a, b)``: the same value *and* the same type, all the way down.

Written without playbook's encoder, so a test that uses it cannot be fooled by a bug in it:
``==`` alone would call ``1 == 1.0 == True``, ``(1, 2)`` and ``[1, 2]`` different but
``Decimal("1.10") == Decimal("1.1")`` the same, and never find a NaN equal to itself.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any

import numpy as np
import pandas as pd


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if a is pd.NA or a is pd.NaT:
        return a is b
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind in "fcmM":
            return bool(np.array_equal(a, b, equal_nan=True))
        return all(same(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
    if isinstance(a, np.generic):
        if a.dtype != b.dtype:
            return False
        if a.dtype.kind in "fc" and np.isnan(a):
            return bool(np.isnan(b))
        if a.dtype.kind in "mM" and np.isnat(a):
            return bool(np.isnat(b))
        return bool(a == b)
    if isinstance(a, pd.Timestamp):
        return a == b and str(a.tz) == str(b.tz) and a.unit == b.unit
    if isinstance(a, (dt.datetime, dt.time)):
        return a == b and a.utcoffset() == b.utcoffset() and a.tzname() == b.tzname() and a.fold == b.fold
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)  # 1.10 is not 1.1
    return bool(a == b)
