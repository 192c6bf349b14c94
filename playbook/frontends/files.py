"""The files ``python -m playbook run`` reads and writes: CSV, Parquet or JSON Lines by extension,
written whole or not at all, and holding the input's values as the file spells them.

The play sees a CSV's rows as ``pd.read_csv`` reads them: what a notebook reading the same file
gets, so the two share row memos.  pandas' guesses stop there: a column it would write back other
than the file spells it (``007`` read as 7, ``1e3`` as 1000.0, ``NA`` as missing) keeps the file's
text in every cell the play did not replace.  JSON Lines are read with the types JSON states
(``"007"`` stays text) and written with every digit of every float.
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import dataclasses
import datetime as dt
import gzip
import importlib
import json
import lzma
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd
from pandas.api.types import infer_dtype

from playbook._internal.dist import install_hint

__all__ = [
    "NAMES",
    "PARQUET_INSTALL",
    "Fatal",
    "Rows",
    "Usage",
    "as_in_file",
    "checked_output",
    "exact_csv",
    "exact_json_lines",
    "file_format",
    "first_line",
    "json_line_records",
    "json_lines_of",
    "need_pyarrow",
    "open_text",
    "read_csv",
    "read_rows",
    "text_cells",
    "with_index",
    "write_file",
    "write_frame",
    "write_rows",
    "writing",
]

PARQUET_INSTALL = install_hint("parquet")
NAMES = ".csv, .csv.gz, .parquet, .pq, .jsonl or .ndjson"

_FORMATS = {
    ".csv": "CSV",
    ".parquet": "Parquet",
    ".pq": "Parquet",
    ".jsonl": "JSON Lines",
    ".ndjson": "JSON Lines",
}
_OPENERS: dict[str, Callable[..., IO[str]]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_COMPRESSED = tuple(_OPENERS)  # CSV and JSON Lines only: pandas infers these from the name


class Usage(Exception):
    """The command line is wrong (exit 2): nothing was run."""


class Fatal(Exception):
    """The run could not finish or its result could not be written (exit 1)."""


def first_line(text: Any) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _reason(exc: BaseException) -> str:
    """An exception's message; pyarrow's come as a tuple of phrases."""
    return (
        "; ".join(first_line(arg) for arg in exc.args)
        if exc.args and all(isinstance(a, str) for a in exc.args)
        else first_line(exc)
    )


def file_format(path: str, option: str) -> str:
    name = path.lower()
    for suffix, kind in _FORMATS.items():
        if name.endswith(suffix) or (
            kind != "Parquet" and name.endswith(tuple(suffix + c for c in _COMPRESSED))
        ):
            return kind
    raise Usage(f"{option} {path}: unknown format; name the file {NAMES}")


def checked_output(path: str) -> str:
    kind = file_format(path, "--out")
    folder = Path(path).parent
    if not folder.is_dir():
        raise Usage(f"--out {path}: no folder {str(folder)!r}")
    if not os.access(folder, os.W_OK):
        raise Usage(f"--out {path}: the folder {str(folder)!r} is not writable")
    if Path(path).is_dir():
        raise Usage(f"--out {path}: is a folder")
    return kind


def need_pyarrow(option: str) -> None:
    try:
        importlib.import_module("pyarrow")
    except ImportError:
        raise Usage(
            f"{option}: Parquet files need pyarrow, which is not installed: {PARQUET_INSTALL}"
        ) from None


@dataclasses.dataclass(frozen=True, slots=True)
class Rows:
    """A file's rows: ``frame`` as the play sees them, and ``exact``: for each column whose values
    would not be written back as the file holds them, the file's own values, in row order."""

    frame: pd.DataFrame
    exact: dict[Any, np.ndarray[Any, Any]]


def read_rows(path: str, kind: str) -> Rows:
    """The rows of ``path``: a CSV as ``read_csv`` reads it, a Parquet file as ``read_parquet``, JSON
    Lines as ``json.loads`` reads each line (what ``read_json(lines=True, dtype=False)`` gives)."""
    try:
        if kind == "CSV":
            return _csv(path)
        if kind == "Parquet":
            return Rows(pd.read_parquet(path), {})
        return _json_lines(path)
    except (
        OSError,
        ValueError,
        TypeError,
        EOFError,
        lzma.LZMAError,
    ) as exc:  # parse errors are ValueErrors; EOFError: a cut archive
        raise Usage(f"--in {path}: cannot read it as {kind}: {first_line(exc)}") from None


def _csv(path: str) -> Rows:
    frame = read_csv(path)
    if not _typed(frame):  # most files need no second read
        return Rows(frame, {})
    # The same parse (header, names), but every cell as written.
    return Rows(frame, exact_csv(frame, read_csv(path, dtype=object, na_filter=False)))


def read_csv(path: str, **options: Any) -> Any:
    """``pd.read_csv(path, **options)`` (a frame, or a reader of chunks), refusing a file whose
    rows have more fields than its header with a ``ValueError`` naming the line.

    Given such a file, pandas takes the first column for the index and shifts every other
    column one place left: the play would run on the wrong values under the right names.  Only
    the first row can do that (pandas refuses a longer row further on, naming its line), so
    only it is read here; ``index_col=False`` keeps pandas from guessing if this check and its
    parser ever disagree.
    """
    with open_text(path, "rt") as text:
        records = csv.reader(text)
        header = next((record for record in records if record), None)
        first = next((record for record in records if record), None)
        if header is not None and first is not None and len(first) > len(header):
            raise ValueError(
                f"line {records.line_num} has {len(first)} fields but the header has {len(header)} "
                f"({', '.join(header)}): add the missing column names, or remove the extra fields"
            )
    return pd.read_csv(path, index_col=False, **options)


def _typed(frame: pd.DataFrame) -> list[Any]:
    """Text that pandas left as text is the file's already; only a column it typed, or one with a
    gap (an empty cell, or "NA" read as missing), can differ."""
    return [c for c in frame.columns if frame[c].hasnans or infer_dtype(frame[c], skipna=False) != "string"]


def exact_csv(frame: pd.DataFrame, text: pd.DataFrame) -> dict[Any, np.ndarray[Any, Any]]:
    """The cells of ``frame`` (a CSV as ``read_csv`` typed it) that would not be written back as
    ``text`` (the same rows, every cell as written) holds them: ``Rows.exact``."""
    exact = {}
    for column in _typed(frame):
        spelled = text[column].tolist()
        # What to_csv would write for the value pandas read ("7.0" for 007, "" for NA): str() is its format.
        written = [str(v) if v == v else "" for v in frame[column].tolist()]
        if written != spelled:
            exact[column] = _objects(spelled)
    return exact


def _json_lines(path: str) -> Rows:
    with open_text(path, "rt") as lines:
        records = list(json_line_records(lines))
    frame = pd.DataFrame(records)
    return Rows(frame, exact_json_lines(frame, records))


def json_line_records(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Each line's object (blank lines skipped); ``ValueError`` naming the line that is not one."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {number}, column {exc.colno}: {exc.msg}") from None
        if not isinstance(record, dict):
            raise ValueError(
                f"line {number}: expected an object {{...}}, found {type(record).__name__} {line.strip()[:40]!r}"
            )
        yield record


def exact_json_lines(frame: pd.DataFrame, records: list[dict[str, Any]]) -> dict[Any, np.ndarray[Any, Any]]:
    """pandas makes a column of ints with a null (or a float) floats: 1 becomes 1.0, and an id past
    2**53 another number.  Such a column keeps the numbers the file holds: ``Rows.exact``."""
    exact = {}
    for column in frame.columns:
        if frame[column].dtype.kind == "f":
            values = [record.get(column) for record in records]
            if any(type(v) is int for v in values):
                exact[column] = _objects(values)
    return exact


def open_text(path: str | Path, mode: str) -> IO[str]:
    """``path`` as text, through the compression its name says; a byte-order mark is skipped."""
    opener: Callable[..., IO[str]] = _OPENERS.get(Path(path).suffix.lower(), open)
    return opener(path, mode, encoding="utf-8-sig" if mode == "rt" else "utf-8")


def _objects(values: list[Any]) -> np.ndarray[Any, Any]:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def as_in_file(result: pd.DataFrame, rows: Rows) -> pd.DataFrame:
    """``result`` with the file's values back in each column of ``rows.exact``, in every cell the play
    did not replace (an output named like an input column replaces it, as ``df.assign`` would, in
    the rows that returned it: a cell holding other than the value the play was given)."""
    if not rows.exact:
        return result
    result = result.copy(deep=False)
    n = len(result)  # --limit: the first n rows
    for column, spelled in rows.exact.items():
        now, given = result[column], rows.frame[column].iloc[:n]
        if now.equals(given):  # no row returned this column
            values = spelled[:n]
        else:
            values = _objects([s if _unchanged(a, b) else a for s, a, b in zip(spelled, now, given)])
        result[column] = pd.Series(values, index=result.index, dtype=object)
    return result


def _unchanged(value: Any, given: Any) -> bool:
    if value is given:
        return True
    if _missing(value) or _missing(given):
        return _missing(value) and _missing(given)
    if type(value) is not type(given):  # 7 returned for the 7.0 read from "007": the play's own value
        return False
    try:
        return bool(value == given)
    except (TypeError, ValueError):  # arrays, or values without a truth
        return False


def _missing(value: Any) -> bool:
    return (
        value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value))
    )


def write_frame(frame: pd.DataFrame, path: str, kind: str) -> None:
    """Write ``frame`` whole, or not at all (see :func:`write_file`)."""
    write_file(path, kind, lambda temporary: write_rows(frame, temporary, kind))


def write_rows(frame: pd.DataFrame, path: Path, kind: str) -> None:
    """Write ``frame`` to ``path`` as a ``kind`` file (compressed as its name says)."""
    if kind == "Parquet":
        frame.to_parquet(path)  # a plain RangeIndex is not written; any other index is, and read back
    elif kind == "CSV":
        text_cells(with_index(frame)).to_csv(path, index=False)
    else:
        with open_text(path, "wt") as file:
            file.writelines(json_lines_of(with_index(frame)))


def write_file(path: str, kind: str, fill: Callable[[Path], None]) -> None:
    """Write ``path`` whole, or not at all: ``fill(temporary)`` writes a file beside it that then
    replaces it, so a crash or a full disk never leaves a file that looks complete."""
    target = Path(path)
    # The temporary name ends with the real one, so pandas infers the same compression from it.
    temporary = target.with_name(f".{os.getpid()}-{target.name}")
    try:
        with writing(path, kind):
            fill(temporary)
            os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def writing(path: str, kind: str) -> Iterator[None]:
    """What goes wrong writing ``path`` as a ``kind`` file, said as :class:`Fatal` (with what to do)."""
    try:
        yield
    except OSError as exc:
        raise Fatal(
            f"cannot write {path}: {exc.strerror or exc}; the receipts are saved, so a rerun pays nothing"
        ) from None
    except (
        ValueError,
        TypeError,
        NotImplementedError,
        OverflowError,
    ) as exc:  # pyarrow's conversion errors among them
        other = {"Parquet": ".jsonl or .csv", "CSV": ".jsonl"}.get(kind, ".csv")
        raise Fatal(
            f"{kind} cannot hold this result: {_reason(exc)}. The receipts are saved, so a rerun pays nothing: "
            f"run it again with --out {other}"
        ) from None


def with_index(frame: pd.DataFrame) -> pd.DataFrame:
    """CSV and JSON Lines have no index: one that is not 0, 1, 2... becomes columns of its own."""
    index = frame.index
    if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1:
        return frame
    return frame.reset_index()


def json_lines_of(frame: pd.DataFrame) -> Iterator[str]:
    """One JSON object per row.  Written with ``json`` rather than ``to_json``, which keeps ten
    digits of a float: 0.30000000000000004 would come back as 0.3."""
    names = [str(c) for c in frame.columns]
    if len(set(names)) < len(names):
        raise ValueError(f"the columns are not unique: {names}")
    columns = [_json_column(frame.iloc[:, i]) for i in range(frame.shape[1])]
    encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
    for cells in zip(*columns):
        yield encode(dict(zip(names, cells))) + "\n"


def _json_column(column: pd.Series[Any]) -> list[Any]:
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "iub":
        # no gaps: Python's ints and bools as they are
        return column.tolist()
    return [_json_value(v) for v in column.tolist()]


def _json_value(value: Any) -> Any:
    """What JSON can hold: a gap or a non-finite float as null (as pandas writes them), dates in ISO
    form, numpy values as Python's, anything else as its text."""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_json_value(v) for v in value]
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (dt.date, dt.time, pd.Timedelta)):
        return value.isoformat()
    if isinstance(value, np.generic):
        return _json_value(value.item())
    return str(value)


def text_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Dicts and lists as JSON text, which a CSV reader can parse back (pandas would write their repr)."""

    def nested(v: Any) -> bool:
        return isinstance(v, (dict, list))

    columns = [
        c
        for c, dtype in frame.dtypes.items()
        if pd.api.types.is_object_dtype(dtype) and frame[c].map(nested).any()
    ]
    if columns:
        frame = frame.copy()
        for column in columns:
            frame[column] = frame[column].map(
                lambda v: json.dumps(v, ensure_ascii=False, default=str) if nested(v) else v
            )
    return frame
