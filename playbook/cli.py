"""The command line: ``python -m playbook cache stats|list|clear|export``.

Every command reads a store that already exists: a mistyped ``--store`` is an error, not a new
empty store.  Errors are one line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Collection, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import PlaybookError
from .models import Receipt
from .receipts import ReceiptStore, _home, _receipt

__all__ = ["main"]

_PREVIEW = 40  # characters of input and of output shown per line by `cache list`


class _Fail(Exception):
    """A one-line error for the user; main() prints it and exits 1."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        path = Path(args.store) if getattr(args, "store", None) else _home()
        # diskcache creates the directory and its database on open: look before opening.
        if not (path / "cache.db").is_file():
            raise _Fail(f"no receipt store at {path} (set --store or $PLAYBOOK_HOME)")
        store = ReceiptStore(path)
        try:
            return args.run(store, args)
        finally:
            store.close()
    except (_Fail, PlaybookError) as exc:
        print(f"playbook: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `... | head` closed our stdout: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _parser() -> argparse.ArgumentParser:
    # --store is accepted before `cache` and after the subcommand; SUPPRESS keeps a later
    # parser's absent default from overwriting a value given earlier.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", metavar="PATH", default=argparse.SUPPRESS,
                        help="store directory (default: $PLAYBOOK_HOME, else ./.playbook)")
    parser = argparse.ArgumentParser(prog="python -m playbook", parents=[common],
                                     description="Inspect and manage playbook's receipt store.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cache = commands.add_parser("cache", parents=[common], help="receipts and row memos on disk")
    sub = cache.add_subparsers(dest="action", required=True, metavar="ACTION")

    stats = sub.add_parser("stats", parents=[common], help="receipts per tool, row memos, size, path")
    stats.add_argument("--json", action="store_true", help="print the stats as one JSON object")
    stats.set_defaults(run=_stats)

    tool = argparse.ArgumentParser(add_help=False)
    tool.add_argument("--tool", metavar="NAME", help="only this tool's receipts")

    list_ = sub.add_parser("list", parents=[common, tool], help="one line per receipt, oldest first")
    list_.add_argument("--limit", metavar="N", type=_count, default=50, help="show at most N (default: 50; 0: all)")
    list_.set_defaults(run=_list)

    clear = sub.add_parser("clear", parents=[common, tool],
                           help="remove one tool's receipts, or everything (receipts and row memos)")
    clear.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    clear.set_defaults(run=_clear)

    export = sub.add_parser("export", parents=[common, tool], help="receipts as JSON Lines")
    export.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    export.set_defaults(run=_export)
    return parser


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, not {text!r}")
    return int(text)


# -- commands ----------------------------------------------------------------------------


def _stats(store: ReceiptStore, args: argparse.Namespace) -> int:
    stats = store.stats()
    if args.json:
        print(json.dumps(stats, ensure_ascii=False))
        return 0
    width = max([len(name) for name in stats["by_tool"]] + [9])
    print(f"{'store':<{width + 2}} {stats['path']}")
    print(f"{'receipts':<{width + 2}} {stats['receipts']} (total cost {stats['cost_stored']:g})")
    for name, count in stats["by_tool"].items():
        print(f"  {name:<{width}} {count}")
    print(f"{'row memos':<{width + 2}} {stats['row_memos']}")
    print(f"{'size':<{width + 2}} {_size(stats['bytes'])}")
    return 0


def _list(store: ReceiptStore, args: argparse.Namespace) -> int:
    receipts = _receipts(store, args.tool)
    shown = receipts[: args.limit or None]
    tw = max([len(r.tool) for r in shown] + [4])
    vw = max([len(r.version) for r in shown] + [3])
    print(f"{'WHEN':<19}  {'TOOL':<{tw}}  {'VER':<{vw}}  MISS  {'COST':>6}  INPUT → OUTPUT")
    for r in shown:
        when = datetime.fromtimestamp(r.created_at).isoformat(timespec="seconds")
        miss = "miss" if r.miss else "-"
        print(f"{when}  {r.tool:<{tw}}  {r.version:<{vw}}  {miss:<4}  {r.cost:>6g}  "
              f"{_preview(r.input)} → {_preview(r.output)}")
    if len(receipts) > len(shown):
        print(f"… {len(receipts) - len(shown)} more (--limit 0 shows all)")
    return 0


def _clear(store: ReceiptStore, args: argparse.Namespace) -> int:
    stats = store.stats()
    if args.tool is not None:
        _check_tool(args.tool, stats["by_tool"], store)
        what = f"{stats['by_tool'][args.tool]} receipts of {args.tool}"
    else:
        what = f"all {stats['receipts']} receipts and {stats['row_memos']} row memos"
    if not args.yes:
        if not sys.stdin.isatty():
            raise _Fail(f"not clearing {what} without confirmation: stdin is not a terminal; pass --yes")
        try:
            answer = input(f"Remove {what} from {store.path}? [y/N] ")
        except (EOFError, KeyboardInterrupt):
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            raise _Fail("nothing removed")
    removed = store.clear(args.tool)
    if args.tool is not None:
        print(f"removed {removed} receipts of {args.tool} from {store.path}")
    else:
        # clear() also counts step and sleep records; name them apart from receipts.
        other = removed - stats["receipts"] - stats["row_memos"]
        steps = f", {other} step records" if other > 0 else ""
        print(f"removed {stats['receipts']} receipts, {stats['row_memos']} row memos{steps} from {store.path}")
    return 0


def _export(store: ReceiptStore, args: argparse.Namespace) -> int:
    receipts = _receipts(store, args.tool)
    lines = "".join(json.dumps(r.model_dump(), ensure_ascii=False, allow_nan=False) + "\n" for r in receipts)
    if args.out is None:
        sys.stdout.write(lines)
        return 0
    try:
        Path(args.out).write_text(lines, encoding="utf-8")
    except OSError as exc:
        raise _Fail(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"exported {len(receipts)} receipts to {args.out}", file=sys.stderr)
    return 0


# -- helpers -----------------------------------------------------------------------------


def _receipts(store: ReceiptStore, tool: str | None) -> list[Receipt]:
    """Receipts oldest first, read as records rather than through ``store.receipts()``: a
    DataFrame column turns a None output into NaN, and 1 into 1.0, next to other values."""
    everything = [_receipt(key, record) for key, record in store._records()]
    if tool is not None:
        _check_tool(tool, {r.tool for r in everything}, store)
        everything = [r for r in everything if r.tool == tool]
    return sorted(everything, key=lambda r: r.created_at)


def _check_tool(tool: str, known: Collection[str], store: ReceiptStore) -> None:
    if tool not in known:
        held = ", ".join(sorted(known)) or "none"
        raise _Fail(f"no receipts for tool {tool!r} in {store.path}; tools with receipts: {held}")


def _preview(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            break
        n /= 1024
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
