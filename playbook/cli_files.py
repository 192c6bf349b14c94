"""The files ``python -m playbook run`` reads and writes: CSV, Parquet or JSON Lines by extension,
read as pandas reads them and written whole or not at all."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from ._dist import install_hint

__all__ = [
    "NAMES", "PARQUET_INSTALL", "Fatal", "Usage", "checked_output", "file_format", "first_line", "need_pyarrow", "read_frame", "write_frame",
]  # fmt: skip

PARQUET_INSTALL = install_hint("parquet")
NAMES = ".csv, .csv.gz, .parquet, .pq, .jsonl or .ndjson"

_FORMATS = {".csv": "CSV", ".parquet": "Parquet", ".pq": "Parquet", ".jsonl": "JSON Lines", ".ndjson": "JSON Lines"}
_COMPRESSED = (".gz", ".bz2", ".xz")  # CSV and JSON Lines only: pandas infers these from the name


class Usage(Exception):
    """The command line is wrong (exit 2): nothing was run."""


class Fatal(Exception):
    """The run could not finish or its result could not be written (exit 1)."""


def first_line(text: Any) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _reason(exc: BaseException) -> str:
    """An exception's message; pyarrow's come as a tuple of phrases."""
    return "; ".join(first_line(arg) for arg in exc.args) if exc.args and all(isinstance(a, str) for a in exc.args) else first_line(exc)


def file_format(path: str, option: str) -> str:
    name = path.lower()
    for suffix, kind in _FORMATS.items():
        if name.endswith(suffix) or (kind != "Parquet" and name.endswith(tuple(suffix + c for c in _COMPRESSED))):
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
        raise Usage(f"{option}: Parquet files need pyarrow, which is not installed: {PARQUET_INSTALL}") from None


def read_frame(path: str, kind: str) -> pd.DataFrame:
    """The rows, as pandas reads them (``read_csv``, ``read_parquet``, ``read_json(lines=True)``),
    so a run from Python over the same file finds the same row memos."""
    try:
        if kind == "CSV":
            return pd.read_csv(path)
        if kind == "Parquet":
            return pd.read_parquet(path)
        return pd.read_json(path, lines=True)
    except (OSError, ValueError, TypeError) as exc:  # pandas' and pyarrow's parse errors are ValueErrors
        raise Usage(f"--in {path}: cannot read it as {kind}: {first_line(exc)}") from None


def write_frame(frame: pd.DataFrame, path: str, kind: str) -> None:
    """Write ``frame`` whole, or not at all: into a file beside ``path`` that then replaces it, so
    a crash or a full disk never leaves a file that looks complete."""
    target = Path(path)
    # The temporary name ends with the real one, so pandas infers the same compression from it.
    temporary = target.with_name(f".{os.getpid()}-{target.name}")
    try:
        if kind == "Parquet":
            frame.to_parquet(temporary)  # a plain RangeIndex is not written; any other index is, and read back
        elif kind == "CSV":
            _text_cells(_with_index(frame)).to_csv(temporary, index=False)
        else:
            _with_index(frame).to_json(temporary, orient="records", lines=True, force_ascii=False, date_format="iso", default_handler=str)
        os.replace(temporary, target)
    except OSError as exc:
        raise Fatal(f"cannot write {path}: {exc.strerror or exc}; the receipts are saved, so a rerun pays nothing") from None
    except (ValueError, TypeError, NotImplementedError, OverflowError) as exc:  # pyarrow's conversion errors among them
        other = ".jsonl or .csv" if kind == "Parquet" else ".jsonl"
        raise Fatal(
            f"{kind} cannot hold this result: {_reason(exc)}. The receipts are saved, so a rerun pays nothing: "
            f"run it again with --out {other}"
        ) from None
    finally:
        temporary.unlink(missing_ok=True)


def _with_index(frame: pd.DataFrame) -> pd.DataFrame:
    """CSV and JSON Lines have no index: one that is not 0, 1, 2... becomes columns of its own."""
    index = frame.index
    if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1:
        return frame
    return frame.reset_index()


def _text_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Dicts and lists as JSON text, which a CSV reader can parse back (pandas would write their repr)."""

    def nested(v: Any) -> bool:
        return isinstance(v, (dict, list))

    columns = [c for c, dtype in frame.dtypes.items() if pd.api.types.is_object_dtype(dtype) and frame[c].map(nested).any()]
    if columns:
        frame = frame.copy()
        for column in columns:
            frame[column] = frame[column].map(lambda v: json.dumps(v, ensure_ascii=False, default=str) if nested(v) else v)
    return frame
