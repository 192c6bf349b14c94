"""Tagged JSON: the one form of every value playbook stores, and of every key it derives.

JSON has no datetime, Decimal, tuple, set, bytes, NaN or numpy scalar.  Written as plain JSON
they come back as something else (a str, a list, a float64), and a replay would change the data.
So a value JSON lacks is written as a one-key object naming its type::

    datetime(2024, 5, 1, 12, 0)   ->  {"$datetime": "2024-05-01T12:00:00"}
    (1, 2)                        ->  {"$tuple": [1, 2]}
    float("inf")                  ->  {"$float": "inf"}
    numpy.float32(0.5)            ->  {"$np": ["<f4", 0.5]}

and a user's own object that happens to have one key starting with ``$`` is wrapped
(``{"$dict": {...}}``) so that it is never mistaken for a tag.

This *stored form* (:func:`encode` / :func:`decode`) round-trips exactly: type and value.  The
*key form* of a value, which uses the same tags but merges what means one value (``3`` and
``3.0``), is :func:`playbook.addresses.key_text`.

A value with no JSON form at all (an open file, a client object) raises :class:`Unencodable`
naming its type and where it sits, so the caller can name the row and the tool at fault.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import inspect
import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from playbook._internal.jsontext import dumps, loads

__all__ = ["SCALARS", "Unencodable", "as_plain", "decode", "dumps", "encode", "float_name", "loads"]

SCALARS = frozenset({str, int, bool, type(None)})


class Unencodable(TypeError):
    """A value has no JSON form.  ``value`` is the culprit, ``where`` its path (``['a'][0]``)."""

    def __init__(self, value: Any, why: str | None = None) -> None:
        self.value = value
        self.where = ""
        self.why = (
            why or f"a value of type {type(value).__module__}.{type(value).__qualname__} has no JSON form"
        )
        super().__init__(self.why)

    @property
    def awaitable(self) -> bool:
        """True when the culprit is a coroutine or other awaitable: a forgotten ``await``."""
        return inspect.isawaitable(self.value)

    def at(self, segment: str) -> Unencodable:
        self.where = segment + self.where
        self.args = (f"{self.why} (at {self.where})",)
        return self


# -- the stored form -----------------------------------------------------------------------


def encode(value: Any) -> Any:
    """``value`` as JSON data with tags; the same object when it is plain JSON already."""
    kind = type(value)
    if kind in SCALARS:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"$float": float_name(value)}
    if kind is dict:
        return _encode_dict(value)
    if kind is list:
        return _encode_list(value)
    return _encode_other(value)


def _encode_dict(value: dict[Any, Any]) -> Any:
    out: dict[str, Any] | None = None
    k: Any = None
    try:
        for k, v in value.items():
            if type(k) is not str:
                return {
                    "$map": [
                        [_at(encode, k2, "<key>"), _at(encode, v2, f"[{k2!r}]")] for k2, v2 in value.items()
                    ]
                }
            if type(v) in SCALARS:
                e = v
            else:
                e = encode(v)
                if e is not v and out is None:
                    out = {}
                    for k2, v2 in value.items():
                        if k2 is k:
                            break
                        out[k2] = v2
            if out is not None:
                out[k] = e
    except Unencodable as exc:
        raise exc.at(f"[{k!r}]") from None
    except RecursionError:
        raise Unencodable(value, "a value nested too deeply, or holding itself").at(f"[{k!r}]") from None
    result = value if out is None else out
    if len(result) == 1 and next(iter(result))[:1] == "$":
        return {"$dict": result}  # one key starting with "$" would read as a tag
    return result


def _encode_list(value: list[Any]) -> Any:
    out: list[Any] | None = None
    i = 0
    try:
        for i, v in enumerate(value):
            if type(v) in SCALARS:
                e = v
            else:
                e = encode(v)
                if e is not v and out is None:
                    out = value[:i]
            if out is not None:
                out.append(e)
    except Unencodable as exc:
        raise exc.at(f"[{i}]") from None
    except RecursionError:
        raise Unencodable(value, "a value nested too deeply, or holding itself").at(f"[{i}]") from None
    return value if out is None else out


def _at(fn: Callable[[Any], Any], value: Any, segment: str) -> Any:
    try:
        return fn(value)
    except Unencodable as exc:
        raise exc.at(segment) from None
    except RecursionError:
        raise Unencodable(value, "a value nested too deeply, or holding itself").at(segment) from None


def _encode_other(value: Any) -> Any:
    # The rarer types, in rough order of how often plays and tools return them.
    if isinstance(value, tuple):
        return {"$tuple": _encode_list(list(value))}
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        return _encode_numpy(value)
    if module.startswith("pandas"):
        return _encode_pandas(value)
    if isinstance(value, (_dt.datetime, _dt.time)):
        zone = getattr(value.tzinfo, "key", None)  # a ZoneInfo keeps its name, not only the offset
        iso = value.isoformat()
        tag = "$datetime" if isinstance(value, _dt.datetime) else "$time"
        return {tag: [iso, zone, value.fold] if zone or value.fold else iso}
    if isinstance(value, _dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, _dt.timedelta):
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes" if type(value) is bytes else "$bytearray": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (set, frozenset)):
        items = sorted((encode(v) for v in value), key=lambda e: dumps(e, sort_keys=True))
        return {"$set" if isinstance(value, set) else "$frozenset": items}
    if isinstance(value, complex):
        return {"$complex": [encode(value.real), encode(value.imag)]}
    return encode(as_plain(value))


def as_plain(value: Any) -> Any:
    """What stands for ``value`` as plain data: an enum member's value, a str/int/float
    subclass's plain value, any mapping or list as a dict or list, a pydantic model's or a
    dataclass instance's fields as a dict; ``Unencodable`` when nothing does."""
    if isinstance(value, enum.Enum):
        return value.value
    base: type[Any]
    for base in (str, int, float, list):
        if isinstance(value, base):
            return base(value)
    if isinstance(value, Mapping):
        return dict(value)
    dump = getattr(type(value), "model_dump", None)
    if dump is not None and not isinstance(value, type):
        try:
            return dump(value)
        except Exception:  # not a pydantic model after all
            raise Unencodable(value) from None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise Unencodable(value)


def float_name(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _encode_numpy(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        kind = value.dtype.kind
        if kind in "mM":
            items: Any = value.view("int64").ravel().tolist()
        elif kind in "biu":
            items = value.ravel().tolist()
        else:
            items = [_at(encode, v, f"[{i}]") for i, v in enumerate(value.ravel().tolist())]
        return {"$ndarray": [value.dtype.str, list(value.shape), items]}
    if isinstance(value, np.generic):
        if value.dtype.kind in "mM":
            return {"$np": [value.dtype.str, int(value.view("int64"))]}
        item = value.item()
        if isinstance(item, np.generic):  # long double and friends have no Python equivalent
            raise Unencodable(value)
        return {"$np": [value.dtype.str, encode(item)]}
    raise Unencodable(value)


def _encode_pandas(value: Any) -> Any:
    import pandas as pd

    if value is pd.NA:
        return {"$na": "NA"}
    if value is pd.NaT:
        return {"$na": "NaT"}
    if isinstance(value, pd.Timestamp):
        # The wall time in UTC, without an offset (pandas cannot parse offsets like +00:09:21),
        # and the zone: its name, or a fixed offset in seconds.
        tz = value.tz
        if tz is None:
            return {"$timestamp": [value.isoformat(), None, value.unit]}
        zone = (
            getattr(tz, "key", None) or getattr(tz, "zone", None) or (str(tz) if str(tz) == "UTC" else None)
        )
        utc = value.tz_convert("UTC").tz_localize(None)
        if not zone:
            offset = value.utcoffset()
            assert offset is not None  # value has a zone, so it has an offset
            zone = int(offset.total_seconds())
        return {"$timestamp": [utc.isoformat(), zone, value.unit]}
    if isinstance(value, pd.Timedelta):
        return {"$pdtimedelta": [int(value.value), value.unit]}
    if isinstance(value, pd.Period):
        return {"$period": [str(value), value.freqstr]}
    if isinstance(value, pd.Interval):
        return {"$interval": [encode(value.left), encode(value.right), value.closed]}
    raise Unencodable(
        value, f"a pandas {type(value).__name__} has no JSON form here; return plain values (e.g. .tolist())"
    )


def decode(data: Any) -> Any:
    """The value :func:`encode` was given, from its stored form."""
    kind = type(data)
    if kind is dict:
        if len(data) == 1:
            ((tag, inner),) = data.items()
            if tag[:1] == "$":
                return _untag(tag, inner)
        return {k: decode(v) if type(v) not in SCALARS else v for k, v in data.items()}
    if kind is list:
        return [decode(v) if type(v) not in SCALARS else v for v in data]
    return data


def _untag(tag: str, inner: Any) -> Any:
    make = _DECODERS.get(tag)
    if make is None:
        raise ValueError(f"unknown tag {tag!r} (written by a newer playbook?)")
    return make(inner)


def _clock_time(kind: Any) -> Callable[[Any], Any]:
    """Decoder of a datetime or a time: ISO text, or [ISO text, zone name, fold]."""

    def make(inner: Any) -> Any:
        if type(inner) is str:
            return kind.fromisoformat(inner)
        iso, zone, fold = inner
        value = kind.fromisoformat(iso)
        if zone:
            from zoneinfo import ZoneInfo

            value = value.replace(tzinfo=ZoneInfo(zone))
        return value.replace(fold=fold)

    return make


def _timestamp(inner: Any) -> Any:
    import pandas as pd

    iso, zone, unit = inner
    value = pd.Timestamp(iso).as_unit(unit)
    if zone is None:
        return value
    value = value.tz_localize("UTC")
    return value.tz_convert(zone if isinstance(zone, str) else _dt.timezone(_dt.timedelta(seconds=zone)))


def _np_scalar(inner: Any) -> Any:
    import numpy as np

    dtype, raw = inner
    dt = np.dtype(dtype)
    if dt.kind in "mM":
        return np.array(raw, dtype="int64").view(dt)[()]
    return dt.type(decode(raw))


def _ndarray(inner: Any) -> Any:
    import numpy as np

    dtype, shape, items = inner
    dt = np.dtype(dtype)
    if dt.kind in "mM":
        return np.array(items, dtype="int64").view(dt).reshape(shape)
    if dt.kind in "biu":
        return np.array(items, dtype=dt).reshape(shape)
    values = [decode(v) for v in items]
    if dt.kind == "O":
        flat = np.empty(len(values), dtype=object)
        flat[:] = values
        return flat.reshape(shape)
    return np.array(values, dtype=dt).reshape(shape)


def _pandas(name: str) -> Any:
    import pandas as pd

    return getattr(pd, name)


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "$dict": lambda inner: {k: decode(v) for k, v in inner.items()},
    "$map": lambda inner: {decode(k): decode(v) for k, v in inner},
    "$float": float,
    "$tuple": lambda inner: tuple(decode(v) for v in inner),
    "$set": lambda inner: {decode(v) for v in inner},
    "$frozenset": lambda inner: frozenset(decode(v) for v in inner),
    "$bytes": lambda inner: base64.b64decode(inner),
    "$bytearray": lambda inner: bytearray(base64.b64decode(inner)),
    "$datetime": _clock_time(_dt.datetime),
    "$date": _dt.date.fromisoformat,
    "$time": _clock_time(_dt.time),
    "$timedelta": lambda inner: _dt.timedelta(days=inner[0], seconds=inner[1], microseconds=inner[2]),
    "$decimal": decimal.Decimal,
    "$uuid": uuid.UUID,
    "$complex": lambda inner: complex(decode(inner[0]), decode(inner[1])),
    "$np": _np_scalar,
    "$ndarray": _ndarray,
    "$na": lambda inner: _pandas(inner),
    "$timestamp": _timestamp,
    "$pdtimedelta": lambda inner: _pandas("Timedelta")(inner[0], unit="ns").as_unit(inner[1]),
    "$period": lambda inner: _pandas("Period")(inner[0], freq=inner[1]),
    "$interval": lambda inner: _pandas("Interval")(decode(inner[0]), decode(inner[1]), closed=inner[2]),
}
