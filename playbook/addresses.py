"""Every address playbook derives (where a receipt, a step or a row memo is kept), and its prefix,
in one place.  ("Key" is kept for API keys; a row's identity is its row id.)

An address is a one-letter prefix and a 128-bit digest of canonical text (:func:`key_text`):

- ``r…`` a tool call's receipt: the tool's name and identity, the call's input, the account;
- ``s…`` a step or a sleep of one row (``ctx.step``, ``ctx.sleep``), or the job marker of a call
  sent in a batch job (which file and batch hold it);
- ``m…`` a row memo: the play's fingerprint and the row's identity.

The prefix lets the store tell a receipt from a step record without reading it.  The text that
is digested has the same shape as in the first store format, so receipts of tools pinned with
``version=`` that were written before survive an upgrade.

:func:`key_text` is the *key form* of a value: the tags of :mod:`playbook.tagged`, sorted keys, no
spaces.  It tells apart what JSON would merge (``inf`` and ``"inf"``, a ``Decimal`` and its text,
a tuple and a list, a datetime and its ISO string) but treats as one what means one value: ``3``
and ``3.0`` (pandas turns an int column into floats when one NaN appears), a numpy scalar and the
Python number, a ``Timestamp`` and its ``datetime``, and every missing marker (None, NaN, NA, NaT).

:func:`code_fingerprint` is what identifies a tool or a play by its code.
"""

from __future__ import annotations

import ast
import base64
import datetime as _dt
import decimal
import functools
import hashlib
import inspect
import math
import textwrap
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from playbook._internal.renamed import renamed
from playbook.tagged import SCALARS, Unencodable, as_plain, dumps, encode, float_name

__all__ = [
    "MEMO",
    "RECEIPT",
    "STEP",
    "ReceiptAddresses",
    "code_fingerprint",
    "digest",
    "int_row_digests",
    "job_address",
    "key_text",
    "labelled_row_digest",
    "memo_address",
    "memo_digests",
    "receipt_address",
    "refreshed_address",
    "row_digest",
    "row_id",
    "step_address",
    "step_name",
]

RECEIPT = "r"
STEP = "s"
MEMO = "m"


def digest(text: str) -> str:
    """A 128-bit hex digest: short enough for keys, wide enough never to collide by chance.

    ``surrogatepass``: a lone surrogate from a badly decoded file is still a distinct string.
    """
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def receipt_address(tool: str, identity: str, payload: str, account: str) -> str:
    """Key of a tool call's receipt; ``payload`` is the canonical text of what the call sends.

    The digest of ``"r"``, the tool, its identity, the account and the payload, joined by
    ``"\\x1f"``; what comes before the payload is hashed once per tool and copied for each call
    (a call's key in two thirds of the time)."""
    h = _receipt_prefix(tool, identity, account).copy()
    h.update(payload.encode("utf-8", "surrogatepass"))
    return RECEIPT + h.hexdigest()


class ReceiptAddresses:
    """:func:`receipt_address` for one tool's calls, called with the payload alone: the digest of
    what comes before the payload is found once, not looked up on every call.  Pickled as its
    tool, identity and account (a digest in progress has no pickled form)."""

    __slots__ = ("_start", "_of")

    def __init__(self, tool: str, identity: str, account: str) -> None:
        self._of = (tool, identity, account)
        self._start = _receipt_prefix(tool, identity, account)

    def __call__(self, payload: str) -> str:
        h = self._start.copy()
        h.update(payload.encode("utf-8", "surrogatepass"))
        return RECEIPT + h.hexdigest()

    def __reduce__(self) -> tuple[type[ReceiptAddresses], tuple[str, str, str]]:
        return ReceiptAddresses, self._of


@functools.lru_cache(maxsize=256)
def _receipt_prefix(tool: str, identity: str, account: str) -> hashlib.blake2b:
    """The digest of a receipt address's text up to its payload."""
    return hashlib.blake2b(
        f"r\x1f{tool}\x1f{identity}\x1f{account}\x1f".encode("utf-8", "surrogatepass"), digest_size=16
    )


def step_address(play: str, row: str, name: str, occurrence: int) -> str:
    """Key of the ``occurrence``-th step (or sleep) called ``name`` in one row of a play."""
    return STEP + digest(f"{play}\x1f{row}{name}\x1f{occurrence}")


def job_address(receipt: str) -> str:
    """Key of the job marker of a call sent in a batch job: which file and batch hold it."""
    return STEP + digest(f"job\x1f{receipt}")


def step_name(kind: str, key: str) -> str:
    """How a step or sleep is named among a row's calls: never the same as a tool's name."""
    return f"\x1f{kind}:{key}"


def refreshed_address(receipt: str, run: str, logical: str) -> str:
    """The idempotency key of a call paid for again (``refresh``): new per run and per logical call,
    so the provider does not answer it from its own cache of the first one."""
    return digest(f"{receipt}\x1f{run}\x1f{logical}")


def row_id(values: list[Any]) -> str:
    """Identity of a row from its values (those of its ``id_columns``), in column order
    (``TypeError`` if one has no JSON form)."""
    return digest(key_text(values))


def row_key(values: list[Any]) -> str:
    """Deprecated: use :func:`row_id`."""
    renamed("playbook.addresses.row_key()", "playbook.addresses.row_id()")
    return row_id(values)


def row_digest(values: list[Any]) -> bytes:
    """:func:`row_id` as its 16 bytes (``row_digest(v).hex() == row_id(v)``): a million rows
    keep theirs in 16 MB."""
    return hashlib.blake2b(key_text(values).encode("utf-8", "surrogatepass"), digest_size=16).digest()


# Between a row's values and its index label, in the text of the identity of a row whose play reads
# the label: JSON text has no raw control character, so no row without a label has that identity.
_LABEL = "\x1findex\x1f"


def labelled_row_digest(values: list[Any], label: Any) -> bytes:
    """:func:`row_digest` of a row whose index label is part of its identity (its play reads
    ``row.index``): rows of equal values and different labels are different rows."""
    try:
        label_text = key_text(label)
    except Unencodable as exc:
        raise exc.at("the index label, which the play reads") from None
    text = key_text(values) + _LABEL + label_text
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def int_row_digests(
    columns: Sequence[np.ndarray[Any, Any]], labels: np.ndarray[Any, Any] | None = None
) -> bytearray:
    """:func:`row_digest` of each row of ``columns`` (numpy arrays of ints or bools, one per key
    column), one after the other.  Their values' key form is their JSON text, so a row's is made
    in one step: a million rows in half the time.  ``labels`` (ints, one per row): their
    :func:`labelled_row_digest` instead."""
    texts = [
        map(_BOOL_TEXT.__getitem__ if c.dtype.kind == "b" else int.__repr__, c.tolist()) for c in columns
    ]
    rows = (
        ("[" + t + "]" for t in texts[0])
        if len(texts) == 1
        else ("[" + ",".join(ts) + "]" for ts in zip(*texts))
    )
    if labels is not None:
        rows = (row + _LABEL + label for row, label in zip(rows, map(int.__repr__, labels.tolist())))
    blake2b = hashlib.blake2b
    out = bytearray()
    for row in rows:
        out += blake2b(row.encode(), digest_size=16).digest()
    return out


_BOOL_TEXT = {False: "false", True: "true"}


def memo_address(fingerprint: str, row: str) -> str:
    """Key of a row memo: the play's fingerprint and the row's identity (the play's part hashed
    once, as for :func:`receipt_address`)."""
    h = _memo_prefix(fingerprint).copy()
    h.update(row.encode("utf-8", "surrogatepass"))
    return MEMO + h.hexdigest()


@functools.lru_cache(maxsize=256)
def _memo_prefix(fingerprint: str) -> hashlib.blake2b:
    """The digest of a memo address's text up to its row."""
    return hashlib.blake2b(f"m\x1f{fingerprint}\x1f".encode("utf-8", "surrogatepass"), digest_size=16)


def memo_digests(fingerprint: str, rows: Iterable[str]) -> bytearray:
    """The 16 bytes of :func:`memo_address` (after its ``MEMO``) for each of ``rows``, one after the
    other: a million rows' in 16 MB, and made in two thirds of the time (one hash of the prefix)."""
    start = _memo_prefix(fingerprint)
    out = bytearray()
    for row in rows:
        h = start.copy()
        h.update(row.encode("utf-8", "surrogatepass"))
        out += h.digest()
    return out


# -- the key form of values -----------------------------------------------------------


def key_text(value: Any) -> str:
    """Canonical text of ``value`` for a digest: sorted keys, no spaces, values normalised."""
    try:
        return dumps(value if _plain(value) else _key_form(value), sort_keys=True)
    except RecursionError:
        raise Unencodable(value, "a value nested too deeply, or holding itself") from None


def _plain(value: Any) -> bool:
    """True when ``value`` is already its own key form: str/int/bool/None, lists and str-keyed dicts
    of them."""
    kind = type(value)
    if kind in SCALARS:
        return True
    if kind is dict:
        k = ""
        for k, v in value.items():
            if type(k) is not str or (type(v) not in SCALARS and not _plain(v)):
                return False
        return len(value) != 1 or k[:1] != "$"  # one "$" key reads as a tag: it needs wrapping
    if kind is list:
        for v in value:  # noqa: SIM110 - a plain loop, as for dicts above: this runs for every key
            if type(v) not in SCALARS and not _plain(v):
                return False
        return True
    return False


def _key_form(value: Any) -> Any:
    kind = type(value)
    if kind in SCALARS:
        return value
    if kind is float:
        return _key_float(value)
    if kind is list:
        return [_key_form(v) for v in value]
    if kind is dict:
        return _key_dict(value)
    return _key_other(value)


def _key_float(value: float) -> Any:
    if math.isnan(value):
        return None  # a missing value, however pandas spelled it
    if math.isinf(value):
        return {"$float": float_name(value)}
    return int(value) if value.is_integer() else value


def _key_dict(value: dict[Any, Any]) -> Any:
    if all(type(k) is str for k in value):
        out = {k: _at(v, f"[{k!r}]") for k, v in value.items()}
        return {"$dict": out} if len(out) == 1 and next(iter(out))[:1] == "$" else out
    pairs = [[_at(k, "<key>"), _at(v, f"[{k!r}]")] for k, v in value.items()]
    return {"$map": sorted(pairs, key=lambda p: dumps(p, sort_keys=True))}


def _key_other(value: Any) -> Any:
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        return _key_numpy(value)
    if module.startswith("pandas"):
        return _key_pandas(value)
    if isinstance(value, _dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, _dt.timedelta):
        return {"$timedelta": (value.days * 86_400 + value.seconds) * 10**9 + value.microseconds * 1000}
    if isinstance(value, (_dt.date, _dt.time, decimal.Decimal, uuid.UUID, complex)):
        return encode(value)  # these tags hold only text and numbers: the same in both forms
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, tuple):
        return {"$tuple": [_at(v, f"[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, (set, frozenset)):
        return {"$set": sorted((_key_form(v) for v in value), key=lambda e: dumps(e, sort_keys=True))}
    return _key_form(as_plain(value))


def _key_pandas(value: Any) -> Any:
    import pandas as pd

    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        return {"$datetime": value.isoformat()}
    if isinstance(value, pd.Timedelta):
        return {"$timedelta": int(value.value)}
    if isinstance(value, (pd.Period, pd.Interval)):  # what period[M] and pd.cut columns hold
        return {"$" + type(value).__name__.lower(): str(value)}
    raise Unencodable(
        value, f"a pandas {type(value).__name__} has no JSON form here; return plain values (e.g. .tolist())"
    )


def _key_numpy(value: Any) -> Any:
    import numpy as np
    import pandas as pd

    if isinstance(value, np.datetime64):
        return None if np.isnat(value) else {"$datetime": pd.Timestamp(value).isoformat()}
    if isinstance(value, np.timedelta64):
        return None if np.isnat(value) else {"$timedelta": int(pd.Timedelta(value).value)}
    if isinstance(value, np.ndarray):
        return {"$ndarray": _key_form(list(value)) if value.ndim else _key_form(value[()])}
    if isinstance(value, np.generic):
        item = value.item()
        if isinstance(item, np.generic):  # long double and friends have no Python equivalent
            raise Unencodable(value)
        return _key_form(item)
    raise Unencodable(value)


def _at(value: Any, segment: str) -> Any:
    try:
        return _key_form(value)
    except Unencodable as exc:
        raise exc.at(segment) from None


# -- fingerprints of code ---------------------------------------------------------------


def code_fingerprint(fn: Any, *, source: bool = True) -> str:
    """A digest of what a function (a tool's, a play's) does: its code without decorators,
    docstring, comments or layout; the arguments a ``functools.partial`` binds; and the immutable
    values it closes over (a model name, a threshold; a client or a list counts by its type: a
    list a test appends to must not change what the tool is).

    Reformatting or commenting keeps the digest; changing what it computes does not.

    ``source=False``: from the compiled code only (and the code of the functions inside it), the
    same in every process that runs it, even one that has no source for it (a function sent to a
    Dask worker); a docstring then counts, and so does the Python version.
    """
    if isinstance(fn, functools.partial):
        bound = key_text(
            [_by_value(a) for a in fn.args] + [[k, _by_value(v)] for k, v in sorted(fn.keywords.items())]
        )
        return digest(code_fingerprint(fn.func, source=source) + "\x1f" + bound)
    if not inspect.isroutine(fn) and callable(fn):  # an object with __call__: its class's code
        fn = type(fn).__call__
    code = getattr(fn, "__code__", None)
    parts = [_code_text(fn) if source or code is None else _compiled(code)]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            parts.append(key_text(_by_value(cell.cell_contents, mutable=False)))
        except ValueError:  # an empty cell: a name assigned after the function was made
            parts.append("<unset>")
    return digest("\x1f".join(parts))


def _by_value(value: Any, *, mutable: bool = True) -> Any:
    """``value`` as it counts for a fingerprint: itself when it has a key form (and, unless
    ``mutable``, cannot change: it hashes), a tool's or a play's own fingerprint (a play made by a
    factory around another tool is another play), else its type."""
    fingerprint = getattr(value, "fingerprint", None)
    if isinstance(fingerprint, str) and not isinstance(value, type):
        return f"<{type(value).__qualname__} {getattr(value, 'name', '')} {fingerprint}>"
    try:
        if not mutable:
            hash(value)
        key_text(value)
    except (TypeError, Unencodable):
        return f"<{type(value).__module__}.{type(value).__qualname__}>"
    return value


def _compiled(code: Any) -> str:
    """The compiled form of ``code``: its instructions, constants and names, and those of the code
    inside it.  (``_code_text``'s own compiled form leaves the inner code out, and stays so: tools
    without source are keyed by it, and their receipts with them.)"""
    consts = [_compiled(c) if inspect.iscode(c) else c for c in code.co_consts]
    return repr((code.co_code, consts, code.co_names))


def _code_text(fn: Any) -> str:
    code = getattr(fn, "__code__", None)
    compiled = (
        repr(fn)
        if code is None
        else repr((code.co_code, [c for c in code.co_consts if not inspect.iscode(c)], code.co_names))
    )
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        # no source (exec'd code, a builtin): the compiled code, which changes with every edit
        return compiled
    node = tree.body[0] if tree.body else tree
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        # A lambda: its source is the whole line, which may hold others; the code tells them apart.
        return ast.dump(node, annotate_fields=False) + compiled
    node.decorator_list = []
    body = node.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        node.body = body[1:] or [ast.Pass()]
    return ast.dump(node, annotate_fields=False)
