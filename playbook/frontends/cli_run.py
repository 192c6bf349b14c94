"""``python -m playbook run plays.py:enrich --in leads.csv --out enriched.parquet``: a play over a
file, for scripts, cron and CI.

What a scheduler needs from it: the exit status says how the run went (0 every row ok or reused,
3 rows failed or parked, 2 a usage error, 1 a fatal run, 130 interrupted, 143 terminated), stdout
holds nothing but the ``--json`` report, and the output file is either whole or absent.  Everything
a user can get wrong (the play's file, an option, a file name) is checked before anything is paid for.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import lzma
import math
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pandas as pd

from playbook._internal.argtypes import whole
from playbook._internal.renamed import RenamedWarning
from playbook.errors import PlaybookError, PlayDefinitionError, ReceiptError
from playbook.frontends.chunks import CHUNK, Parts, Totals, read_chunks
from playbook.frontends.cli_load import load, target
from playbook.frontends.files import (
    NAMES,
    Fatal,
    Rows,
    Usage,
    as_in_file,
    checked_output,
    file_format,
    first_line,
    need_pyarrow,
    write_file,
    write_frame,
    writing,
)
from playbook.frontends.signature import flags, given
from playbook.records import RunStats
from playbook.runtime.calls.scope import said_once
from playbook.runtime.estimate.projection import PILOT_ROWS, Estimate, after_pilot
from playbook.runtime.options import options
from playbook.runtime.run import Run, last_run

if TYPE_CHECKING:
    from playbook.cluster.job import ClusterRun

__all__ = ["add_parser", "main"]

ERRORS_SHOWN = 5  # failed rows quoted in the summary, and failed and parked rows in the --json report


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """The ``run`` subcommand, on the subparsers of ``python -m playbook``."""
    run = commands.add_parser(
        "run",
        parents=[common],
        help="run a play over a CSV, Parquet or JSON Lines file",
        description="Run a play over the rows of a file and write the result. Exit status: 0 every row ok or reused, "
        "3 rows failed or parked (the output holds them), 2 usage error, 1 fatal run, 130 interrupted, 143 terminated.",
    )
    run.add_argument(
        "play",
        metavar="FILE.py:NAME",
        help="the file that defines the play, and its name (a play, async def or tool)",
    )
    run.add_argument("--in", dest="source", metavar="FILE", required=True, help=f"the rows to run: {NAMES}")
    run.add_argument(
        "--out",
        metavar="FILE",
        required=True,
        help="where the result goes (same formats); written whole or not at all",
    )
    for flag, spelled in flags("cli"):
        if flag != "--store":  # the common --store (cli.py), which the cache commands take too
            run.add_argument(flag, **spelled)
    run.add_argument(
        "--json",
        action="store_true",
        help="print a JSON report on stdout (progress and messages stay on stderr)",
    )
    run.add_argument(
        "--sample",
        type=whole(1),
        default=None,
        metavar="N",
        help=f"--estimate: the rows the pilot runs (default {PILOT_ROWS})",
    )
    run.add_argument(
        "--precision",
        type=_share,
        default=None,
        metavar="P",
        help="--estimate: the pilot goes on, --sample rows at a time, until the money's interval is within ±P (0.15: ±15%%)",
    )
    run.add_argument(
        "--yes",
        action="store_true",
        help="--estimate: run the rows left after the estimate (else only the pilot runs)",
    )
    run.add_argument(
        "--chunk-rows",
        type=whole(1),
        default=CHUNK,
        metavar="N",
        help=f"read and run the file N rows at a time, so memory holds a chunk, not the file (default {CHUNK:,})",
    )
    run.set_defaults(run=None)


# -- the command -------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    """``python -m playbook run``: the play's old spellings (``ctx.call``, ``force=``...) are said on
    stderr, once each (:class:`RenamedWarning`): a play's module is not ``__main__``, where Python
    would hide them, and a scheduled job is where nobody would otherwise learn of them."""
    with warnings.catch_warnings():
        warnings.simplefilter("default", RenamedWarning)
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    """Run the command; returns the exit status.  With ``--json``, whatever the play prints goes
    to stderr, so stdout holds the report alone."""
    report: dict[str, Any] = {
        "exit_code": None,
        "output": None,
        "error": None,
        "stats": None,
        "waiting_on": [],
        "errors": [],
        "parked": {"by_reason": {}, "rows": []},
    }
    stdout, terms = sys.stdout, list[int]()
    try:
        # said_once: a play's notices are said once by the command, not by each chunk's run (nor by
        # the pilot and the run)
        with (
            contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext(),
            _terminate_as_interrupt(terms),
            said_once(),
        ):
            code = _run(args, report)
    except Usage as exc:
        code, report["error"] = 2, str(exc)
        _say(f"error: {exc}")
    except Fatal as exc:
        code, report["error"] = 1, str(exc)
        _say(f"error: {exc}")
    except KeyboardInterrupt:  # before the run started (importing, reading) or while writing
        code, report["error"] = 130, f"interrupted; nothing was written to {args.out}"
        _say(report["error"])
    if code == 130 and terms:
        code = 143  # what a scheduler expects of a job it terminated
    report["exit_code"] = code
    if args.json:
        print(json.dumps(report, default=_plain, ensure_ascii=False), file=stdout, flush=True)
    return code


def _run(args: argparse.Namespace, report: dict[str, Any]) -> int:
    path, name = target(args.play)
    source = file_format(args.source, "--in")
    if not Path(args.source).is_file():
        raise Usage(f"--in {args.source}: no such file")
    out = checked_output(args.out)
    if Path(args.out).exists() and os.path.samefile(args.source, args.out):
        raise Usage(
            f"--out {args.out} is the same file as --in {args.source}: the result would replace the rows; choose another --out"
        )
    if "Parquet" in (source, out):
        need_pyarrow("--in" if source == "Parquet" else "--out")
    play = load(path, name)
    opts: dict[str, Any] = {"progress": "text", **_given(args)}
    if opts.pop("estimate", False):
        found = _estimate(args, play, opts, source, report)
        if found is None:
            return 130
        report["estimate"] = found.to_dict()
        if not args.yes:
            left = (
                f"add --yes to run the {found.rows_left:,} rows left"
                if found.rows_left
                else "every row is done: add --yes to write them"
            )
            _say(f"only the pilot ran and nothing was written to {args.out}: {left}")
            return 0
        opts = after_pilot(opts, found)
        if not found.rows_left:
            # every row is done: the pilot's summary said so; the run only gathers the rows to write
            opts["progress"] = False
    elif args.yes or args.sample is not None or args.precision is not None:
        alone = "--yes" if args.yes else "--sample" if args.sample is not None else "--precision"
        raise Usage(f"{alone} is for --estimate: add --estimate to run a pilot first")
    chunks = _chunks(args.source, source, args.chunk_rows, opts.pop("limit", None))
    rows = next(chunks)
    following = next(chunks, None)
    if following is not None:
        return _run_chunks(args, report, play, opts, itertools.chain([rows, following], chunks), out)
    run = _one(args, report, play, opts, rows)
    if run is None:
        return 130
    _record(report, run)
    result = run.result
    write_frame(as_in_file(result, rows), args.out, out)
    report["output"] = args.out
    s = run.stats
    code = 3 if s.failed or s.parked or s.skipped else 0
    for line in _summary(s, bool(run.parked["reason"].eq("budget").any()), len(result), args.out, code):
        _say(line, prefix="")
    return code


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a share between 0 and 1, such as 0.15 for ±15%")
    return value


def _estimate(
    args: argparse.Namespace, play: Any, opts: dict[str, Any], source: str, report: dict[str, Any]
) -> Estimate | None:
    """The pilot over the whole file (every chunk: the rows a run would run are counted over all
    of them), its estimate on stderr, and whether ``--max-cost`` is short of it; ``None`` if it
    was interrupted (what it paid for is saved, and said)."""
    frame = pd.concat(
        [rows.frame for rows in _chunks(args.source, source, args.chunk_rows, opts.get("limit"))],
        ignore_index=True,
    )
    sample = PILOT_ROWS if args.sample is None else args.sample
    try:
        given = {name: value for name, value in opts.items() if name != "limit"}
        found: Estimate = frame.play.estimate(play, sample, precision=args.precision, **given)
    except PlayDefinitionError as exc:
        raise Usage(_as_option(str(exc))) from None
    except PlaybookError as exc:
        raise Fatal(f"{exc}. Nothing was written to {args.out}; what the pilot paid for is saved") from None
    except KeyboardInterrupt:
        _record(report, last_run())
        report["error"] = (
            f"interrupted: the pilot stopped; what it paid for is saved, and a rerun reuses it; nothing was written to {args.out}"
        )
        _say(report["error"])
        return None
    print(found.text(), file=sys.stderr, flush=True)
    short = found.below(opts.get("max_cost"))
    if short:
        _say(short.replace("max_cost=", "--max-cost "))
    return found


def _chunks(path: str, kind: str, size: int, limit: int | None) -> Iterator[Rows]:
    """The file's rows, a chunk at a time, the first ``limit`` only; an error reading one says
    which file and what (the chunks before it ran: their rows are saved)."""
    read = 0
    try:
        for rows in read_chunks(path, kind, size):
            if limit is not None and read + len(rows.frame) >= limit:
                n = limit - read
                yield Rows(rows.frame.iloc[:n], {c: v[:n] for c, v in rows.exact.items()})
                return
            read += len(rows.frame)
            yield rows
    except (
        OSError,
        ValueError,
        TypeError,
        EOFError,
        lzma.LZMAError,
    ) as exc:  # parse errors are ValueErrors; EOFError: a cut archive
        raise Usage(f"--in {path}: cannot read it as {kind}: {first_line(exc)}") from None


def _run_chunks(
    args: argparse.Namespace,
    report: dict[str, Any],
    play: Any,
    opts: dict[str, Any],
    chunks: Iterator[Rows],
    out: str,
) -> int:
    """A file of more than one chunk: each chunk is a run, its rows written as it ends; ``--out``
    is made of them once the last one is done (see :mod:`.chunks`)."""
    totals = Totals(ERRORS_SHOWN)
    budget = opts.get("max_cost")
    parts = Parts(args.out, out)
    try:
        for rows in chunks:
            first = rows.frame.index[0] if isinstance(rows.frame.index, pd.RangeIndex) else totals.rows
            _say(f"rows {first + 1:,} to {first + len(rows.frame):,} of {args.source}")
            if budget is not None:  # --max-cost is for the whole file
                opts["max_cost"] = max(0.0, budget - totals.stats.get("cost_spent", 0.0))
            run = _one(args, report, play, opts, rows, totals)
            if run is None:
                return 130
            _record(report, run)
            totals.add(run, report)
            with writing(args.out, out):
                parts.add(as_in_file(run.result, rows))
        write_file(args.out, out, parts.join)
    finally:
        parts.discard()
    totals.report(report)
    report["output"] = args.out
    s = RunStats(**totals.stats)
    code = 3 if s.failed or s.parked or s.skipped else 0
    for line in _summary(s, totals.budget_parked, totals.rows, args.out, code):
        _say(line, prefix="")
    return code


def _one(
    args: argparse.Namespace,
    report: dict[str, Any],
    play: Any,
    opts: dict[str, Any],
    rows: Rows,
    totals: Totals | None = None,
) -> Run | None:
    """One run over ``rows``: its failures said as the command's; ``None`` if it was interrupted."""
    try:
        run: Run = rows.frame.play.run(play, **opts)
        return run
    except PlayDefinitionError as exc:
        raise Usage(_as_option(str(exc))) from None
    except ReceiptError as exc:
        # a store that cannot be opened, or that lost receipts: refused before anything is paid
        _record(report, last_run())
        raise Fatal(f"{exc}. Nothing was written to {args.out}") from None
    except PlaybookError as exc:  # bad credentials, no credit
        _record(report, last_run())
        raise Fatal(
            f"{exc}. Nothing was written to {args.out}; what was paid for is saved: once that is fixed, a rerun pays only for the rest"
        ) from None
    except Exception as exc:  # --on-error raise: the first row that failed stops the run
        _record(report, last_run())
        where = "; ".join(getattr(exc, "__notes__", ()))
        raise Fatal(
            f"{type(exc).__name__}: {exc}{f' ({where})' if where else ''}. --on-error raise stopped the run there: nothing was "
            f"written to {args.out}; what was paid for is saved, so a rerun pays only for the rest"
        ) from None
    except KeyboardInterrupt:
        partial = last_run()
        _record(report, partial)
        finished = 0 if totals is None else totals.stats.get("ok", 0) + totals.stats.get("reused", 0)
        done = (
            ""
            if partial is None
            else f"{finished + partial.stats.ok + partial.stats.reused:,} rows finished; "
        )
        report["error"] = (
            f"interrupted: {done}nothing was written to {args.out}; a rerun resumes (finished rows are reused, no call is paid twice)"
        )
        _say(report["error"])
        return None


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The run options the command line gave; an old flag's spelling (``--key``) works and says
    its new one on stderr (a script's DeprecationWarning is shown to nobody)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", DeprecationWarning)
        try:
            found = given(args, "cli")
        except ValueError as exc:
            raise Usage(str(exc)) from None
    for warning in said:
        _say(str(warning.message))
    return found


def _as_option(message: str) -> str:
    """map()'s message names its option (``id_columns=['x']: ...``); say which command-line option that is."""
    name = message.partition("=")[0]
    return f"--{name.replace('_', '-')}: {message}" if name in {f.name for f in options("cli")} else message


def _record(report: dict[str, Any], run: Run | ClusterRun | None) -> None:
    if run is None:
        return
    report["stats"] = run.stats.model_dump()
    report["waiting_on"] = [wait.model_dump() for wait in run.waiting_on]
    errors = run.errors
    report["errors"] = errors.head(ERRORS_SHOWN).to_dict("records")
    report["error_groups"] = _groups(errors)
    report["error_kinds"] = int(errors["group"].nunique())
    report["parked"] = _parked(run)


def _groups(errors: pd.DataFrame) -> list[dict[str, Any]]:
    """The largest groups of failed rows: the group, how many rows, an example row and its message."""
    if errors.empty:
        return []
    by = errors.groupby("group", sort=False)
    sizes = by.size().sort_values(ascending=False, kind="stable").head(ERRORS_SHOWN)
    first = by.first()
    cost = by["cost"].sum().to_dict()
    return [
        {
            "group": group,
            "rows": int(n),
            "example_row": first.at[group, "row"],
            "message": first.at[group, "error"],
            "cost": float(cost[group]),
        }
        for group, n in sizes.items()
    ]


def _parked(run: Run | ClusterRun) -> dict[str, Any]:
    """Why rows parked: how many for each reason, and the first rows, with when each may run again."""
    parked = run.parked
    rows = parked.head(ERRORS_SHOWN).to_dict("records")
    for row in rows:
        at = row["ready_at"]
        row["ready_at"] = None if pd.isna(at) else pd.Timestamp(at).isoformat()
        for field in ("provider", "message"):  # a frame spells a missing text NaN; the report, null
            if isinstance(row[field], float):
                row[field] = None
    return {
        "by_reason": {str(k): int(n) for k, n in parked["reason"].value_counts(sort=False).items()},
        "rows": rows,
    }


def _summary(s: RunStats, budget: bool, rows: int, out: str, code: int) -> list[str]:
    """Where the result is and what to do next, in shell terms, under the run's own summary (the
    text view's, which says already how many rows parked and why); ``budget``: rows parked on
    ``--max-cost``."""
    lines = [f"wrote {_rows(rows)} to {out}"]
    if s.failed:
        lines.append(
            f"{_rows(s.failed)} failed: play_status 'failed', the message in play_error (its kind is above)"
        )
    if code:
        higher = " with a higher --max-cost" if s.parked and budget else ""
        lines.append(
            f"rerun the same command{higher} to run the rows that did not finish; the others are reused, and no call is paid twice"
        )
    return lines


def _rows(n: int) -> str:
    return f"{n:,} row" if n == 1 else f"{n:,} rows"


def _say(text: str, *, prefix: str = "playbook: ") -> None:
    print(prefix + text, file=sys.stderr, flush=True)


def _plain(value: Any) -> Any:
    """What json.dumps cannot write: numpy scalars as numbers, anything else (a Timestamp row label)
    as text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


@contextlib.contextmanager
def _terminate_as_interrupt(terms: list[int]) -> Iterator[None]:
    """SIGTERM (a CI job cancelled, a container stopped, ``timeout``) stops the run as Ctrl-C does,
    so calls in flight land their receipts instead of being paid for and lost; ``terms`` notes it."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        terms.append(signum)
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
