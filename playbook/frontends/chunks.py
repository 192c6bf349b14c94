"""A file too big to hold at once, read and written a chunk of rows at a time.

``python -m playbook run`` reads ``--in`` in chunks (Parquet record batches, CSV chunks, JSON
Lines batches), runs each as it comes and writes its rows to a part file beside ``--out``.  When
the last chunk is done the parts become ``--out`` in one step, in row order, with one header (CSV)
or one schema (Parquet): a column whose type differs between chunks (ints in one, floats in
another) takes the wider type, as ``pd.concat`` would.  So memory holds a chunk, not the file, and
``--out`` is whole or absent: a run killed at row 9,000,000 leaves no half file, and the same
command again reuses every row finished before (their memos) and pays only for the rest.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from playbook.frontends.files import (
    Rows,
    exact_csv,
    exact_json_lines,
    json_line_records,
    open_text,
    read_csv,
    write_rows,
)

__all__ = ["CHUNK", "Parts", "read_chunks"]

CHUNK = 500_000  # rows per chunk, by default


def read_chunks(path: str, kind: str, size: int) -> Iterator[Rows]:
    """The rows of ``path``, ``size`` at a time, each chunk read as :func:`~.files.read_rows`
    reads a whole file, and indexed by its rows' places in the file."""
    if kind == "CSV":
        yield from _csv_chunks(path, size)
    elif kind == "Parquet":
        yield from _parquet_chunks(path, size)
    else:
        yield from _json_chunks(path, size)


def _csv_chunks(path: str, size: int) -> Iterator[Rows]:
    # Every line is parsed once before the first chunk runs: a row with more fields than the
    # header further on (pandas refuses it, naming its line) would otherwise stop the run after
    # the chunks before it were paid for.  One pass of the C parser, without typing a cell.
    with read_csv(path, dtype=object, na_filter=False, chunksize=size) as lines:
        for _ in lines:
            pass
    # The same parse twice, in step: as pandas types it, and every cell as written (see files._csv).
    with (
        read_csv(path, chunksize=size) as typed,
        read_csv(path, dtype=object, na_filter=False, chunksize=size) as text,
    ):
        for frame, spelled in zip(typed, text):
            yield Rows(frame, exact_csv(frame, spelled))


def _parquet_chunks(path: str, size: int) -> Iterator[Rows]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    start = 0
    for batch in file.iter_batches(batch_size=size):
        frame = pa.Table.from_batches([batch], schema=file.schema_arrow).to_pandas()
        if isinstance(frame.index, pd.RangeIndex):  # a plain index is not stored: the rows' places
            frame.index = pd.RangeIndex(start, start + len(frame))
        start += len(frame)
        yield Rows(frame, {})
    if not start:  # a file of no rows has no batch: its columns, empty
        yield Rows(file.schema_arrow.empty_table().to_pandas(), {})


def _json_chunks(path: str, size: int) -> Iterator[Rows]:
    start = 0
    with open_text(path, "rt") as lines:
        records: list[dict[str, Any]] = []
        for record in json_line_records(lines):
            records.append(record)
            if len(records) == size:
                yield _json_rows(records, start)
                start += len(records)
                records = []
        if records or not start:
            yield _json_rows(records, start)


def _json_rows(records: list[dict[str, Any]], start: int) -> Rows:
    frame = pd.DataFrame(records, index=pd.RangeIndex(start, start + len(records)))
    return Rows(frame, exact_json_lines(frame, records))


class Parts:
    """The chunks of one ``--out``, each written as it finishes, made one file at the end."""

    def __init__(self, path: str, kind: str) -> None:
        target = Path(path)
        self.kind = kind
        self.target = target
        self.folder = target.with_name(f".{os.getpid()}-{target.name}.parts")
        _sweep(target)
        self.folder.mkdir()
        self.files: list[Path] = []

    def add(self, frame: pd.DataFrame) -> None:
        """Write one chunk's result (its index: the rows' places in the file, or the file's own)."""
        index = frame.index
        if isinstance(index, pd.RangeIndex) and index.step == 1:
            frame = frame.reset_index(drop=True)  # places in the file: not a column of the output
        # no suffix: written plain, whatever --out's compression
        part = self.folder / f"{len(self.files):06d}"
        write_rows(frame, part, self.kind)
        self.files.append(part)

    def join(self, into: Path) -> None:
        """Write every part, in order, into the file ``into``."""
        if self.kind == "Parquet":
            _join_parquet(self.files, into)
        elif self.kind == "CSV":
            _join_csv(self.files, into)
        else:
            with open_text(into, "wt") as out:
                for part in self.files:
                    with open(part, encoding="utf-8") as file:
                        shutil.copyfileobj(file, out)

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _sweep(target: Path) -> None:
    """Remove the parts of ``target`` that a killed run left behind (its process is gone)."""
    for folder in target.parent.glob(f".*-{glob.escape(target.name)}.parts"):
        pid = folder.name[1:].partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _join_csv(parts: list[Path], into: Path) -> None:
    headers = [_header(part) for part in parts]
    names = list(dict.fromkeys(name for header in headers for name in header))
    with open_text(into, "wt") as out:
        csv.writer(out, lineterminator="\n").writerow(names)
        for part, header in zip(parts, headers):
            if header == names:  # the usual case: the text as written, after its header
                with open(part, encoding="utf-8", newline="") as file:
                    next(csv.reader(file))
                    shutil.copyfileobj(file, out)
                continue
            # A chunk without a column another one has (no row of it returned that output): empty cells.
            for frame in pd.read_csv(
                part, dtype=object, keep_default_na=False, na_filter=False, chunksize=100_000
            ):
                frame.reindex(columns=names, fill_value="").to_csv(out, index=False, header=False)


def _header(part: Path) -> list[str]:
    with open(part, encoding="utf-8", newline="") as file:
        return next(csv.reader(file), [])


def _join_parquet(parts: list[Path], into: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schemas = [pq.read_schema(part) for part in parts]
    schema = schemas[0]
    if any(not s.equals(schema) for s in schemas[1:]):
        try:
            schema = pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"a column holds different types in different chunks ({exc})") from None
        if schema.metadata and b"pandas" in schema.metadata:  # the first chunk's pandas dtypes no longer hold
            meta = json.loads(schema.metadata[b"pandas"])
            if all(isinstance(i, dict) for i in meta.get("index_columns", [])):  # no index stored as columns
                schema = schema.remove_metadata()
    with pq.ParquetWriter(into, schema) as writer:
        for part in parts:
            for batch in pq.ParquetFile(part).iter_batches():
                table = pa.Table.from_batches([batch])
                if not table.schema.equals(schema):
                    columns = [
                        table[f.name].cast(f.type)
                        if f.name in table.column_names
                        else pa.nulls(len(table), f.type)
                        for f in schema
                    ]
                    table = pa.Table.from_arrays(columns, schema=schema)
                writer.write_table(table)


class Totals:
    """What the runs of a file's chunks add up to, as one run's would be reported."""

    def __init__(self, shown: int) -> None:
        self.shown = shown  # failed and parked rows quoted
        self.stats: dict[str, Any] = {}
        self.rows = 0
        self.errors: list[dict[str, Any]] = []
        self.groups: dict[str, dict[str, Any]] = {}  # group -> rows, an example row and its message
        self.by_reason: dict[str, int] = {}
        self.parked_rows: list[dict[str, Any]] = []
        self.waiting_on: list[dict[str, Any]] = []
        self.budget_parked = False

    def add(self, run: Any, report: dict[str, Any]) -> None:
        """A chunk's ``run``, whose own report is ``report`` (``cli_run._record``)."""
        for name, value in report["stats"].items():
            self.stats[name] = self.stats.get(name, 0) + value
        offset, self.rows = (
            self.rows,
            self.rows + run.stats.total,
        )  # a row's position in the file, not in its chunk
        self.waiting_on = report["waiting_on"]
        self.errors += [
            {**e, "position": e["position"] + offset}
            for e in report["errors"][: self.shown - len(self.errors)]
        ]
        errors = run.errors
        if not errors.empty:
            for group, rows in errors.groupby("group", sort=False):
                seen = self.groups.setdefault(
                    group,
                    {
                        "group": group,
                        "rows": 0,
                        "example_row": rows["row"].iat[0],
                        "message": rows["error"].iat[0],
                        "cost": 0.0,
                    },
                )
                seen["rows"] += len(rows)
                seen["cost"] += float(rows["cost"].sum())
        parked = report["parked"]
        for reason, n in parked["by_reason"].items():
            self.by_reason[reason] = self.by_reason.get(reason, 0) + n
        self.parked_rows += [
            {**r, "position": r["position"] + offset}
            for r in parked["rows"][: self.shown - len(self.parked_rows)]
        ]
        self.budget_parked = self.budget_parked or parked["by_reason"].get("budget", 0) > 0

    def report(self, report: dict[str, Any]) -> None:
        """Fill ``report`` as one run over every chunk would."""
        report["stats"] = {
            **self.stats,
            **{k: round(v, 9) for k, v in self.stats.items() if isinstance(v, float)},
        }
        report["waiting_on"] = self.waiting_on
        report["errors"] = self.errors
        # stable: the first seen first among equals
        by_size = sorted(self.groups.values(), key=lambda g: -g["rows"])
        report["error_groups"] = by_size[: self.shown]
        report["error_kinds"] = len(self.groups)
        report["parked"] = {"by_reason": self.by_reason, "rows": self.parked_rows}
