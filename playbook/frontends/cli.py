"""The command line: ``python -m playbook run`` (a play over a file, see :mod:`playbook.frontends.cli_run`)
and ``python -m playbook cache stats|list|spend|clear|export|accept-loss``.

Every ``cache`` command reads a store that already exists: a mistyped ``--store`` is an error, not a new
empty store.  Errors are one line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from playbook._internal.argtypes import whole
from playbook._internal.words import money
from playbook.errors import PlaybookError
from playbook.frontends import cli_run
from playbook.frontends.signature import flags
from playbook.frontends.usage import near_choice, unrecognized
from playbook.store import FILE, StoreEngine, home, is_url
from playbook.store.marks import read_registry
from playbook.store.records import Record
from playbook.tagged import dumps, loads

__all__ = ["main"]

_PREVIEW = 40  # characters of input and of output shown per line by `cache list`


class _Fail(Exception):
    """A one-line error for the user; main() prints it and exits 1."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser that says what an unknown option or subcommand was likely meant to be:
    ``unrecognized arguments: --concurency 8 (did you mean --concurrency?)``, exit status 2 as
    for any usage error.  Its subparsers are of its class too (argparse makes them so), and each
    judges the options it was given: those of the subcommand it parses.  Abbreviations that
    name one option (``--conc``) are argparse's and still work."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        found, extras = super().parse_known_args(args, namespace)
        said = unrecognized(extras, self.format_usage())
        if said is not None:
            self.error(said)
        return found, extras

    def error(self, message: str) -> NoReturn:
        super().error(near_choice(message))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return cli_run.main(args)
    try:
        where = args.store if getattr(args, "store", None) else home()
        # Looking needs no writes (a store on a full disk or a read-only mount can still be read),
        # and makes none: a store an older playbook wrote on Redis is not rewritten by a look.
        readonly = args.run not in (_clear, _accept_loss, _reset)
        if not is_url(where):
            path = Path(where)
            # Opening a store creates it: look before opening.  (cache.db: a store of playbook 0.1.)
            if not ((path / FILE).is_file() or (path / "cache.db").is_file()):
                _absent(path, args)
            readonly = readonly and (path / FILE).is_file()
        store = StoreEngine(where, readonly=readonly)
        run: Callable[[StoreEngine, argparse.Namespace], int] = args.run
        if store.lost is not None and run not in (_clear, _accept_loss, _reset):
            # Looking works, and shows what it holds now: say why a run on it stops, and the way out.
            print(f"playbook: runs on this store are refused: {store.lost}", file=sys.stderr)
        try:
            return run(store, args)
        finally:
            store.close()
    except (_Fail, PlaybookError) as exc:
        print(f"playbook: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `... | head` closed our stdout: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _absent(path: Path, args: argparse.Namespace) -> None:
    """No store at ``path``: one that held receipts (its mark says so) was deleted whole, and
    ``cache accept-loss`` makes it again, empty; any other command, or a path that never held one, fails."""
    mark = read_registry(str(path.resolve()))
    if mark is not None and mark.receipts:
        if args.run in (_accept_loss, _reset):
            return
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(mark.at))
        raise _Fail(
            f"the receipt store at {path} held {mark.receipts:,} receipts at {when} and is gone (its directory deleted or moved): "
            f"put it back, or start it again, empty, with python -m playbook cache accept-loss --store {shlex.quote(str(path))}"
        )
    where = "" if getattr(args, "store", None) else " (set --store or $PLAYBOOK_HOME)"
    raise _Fail(f"no receipt store at {path}{where}")


def _parser() -> argparse.ArgumentParser:
    # --store is accepted before `cache` and after the subcommand; SUPPRESS keeps a later
    # parser's absent default from overwriting a value given earlier.
    common = _Parser(add_help=False)
    common.add_argument("--store", **{**dict(flags("cli"))["--store"], "default": argparse.SUPPRESS})
    parser = _Parser(
        prog="python -m playbook",
        parents=[common],
        description="Run plays over files; inspect and manage playbook's receipt store.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli_run.add_parser(commands, common)
    cache = commands.add_parser("cache", parents=[common], help="receipts and row memos on disk")
    sub = cache.add_subparsers(dest="action", required=True, metavar="ACTION")

    stats = sub.add_parser("stats", parents=[common], help="receipts per tool, row memos, size, location")
    stats.add_argument("--json", action="store_true", help="print the stats as one JSON object")
    stats.set_defaults(run=_stats)

    tool = _Parser(add_help=False)
    tool.add_argument("--tool", metavar="NAME", help="only this tool's receipts")

    list_ = sub.add_parser("list", parents=[common, tool], help="one line per receipt, oldest first")
    list_.add_argument(
        "--limit", metavar="N", type=whole(0), default=50, help="show at most N (default: 50; 0: all)"
    )
    list_.set_defaults(run=_list)

    spend = sub.add_parser(
        "spend", parents=[common], help="calls and money paid and reused, per provider, tool and UTC day"
    )
    spend.add_argument(
        "--by",
        metavar="KEYS",
        type=_spend_keys,
        default=("provider", "tool", "day"),
        help="what to add up by: some of provider,tool,day, comma-separated (default: provider,tool,day)",
    )
    spend.add_argument("--json", action="store_true", help="print one JSON object per line")
    spend.set_defaults(run=_spend)

    clear = sub.add_parser(
        "clear",
        parents=[common, tool],
        help="remove one tool's receipts, or everything (receipts and row memos)",
    )
    clear.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    clear.set_defaults(run=_clear)

    _add_accept_loss(sub, common)

    export = sub.add_parser("export", parents=[common, tool], help="receipts as JSON Lines")
    export.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    export.set_defaults(run=_export)
    sub.choices = _Unlisted(sub.choices, {"reset"})  # once all are added: it is a copy
    return parser


def _add_accept_loss(sub: Any, common: argparse.ArgumentParser) -> None:
    accept = sub.add_parser(
        "accept-loss",
        parents=[common],
        help="accept what a store that lost receipts holds now: runs on it go on (it removes nothing)",
    )
    accept.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    accept.set_defaults(run=_accept_loss)
    # The old spelling, for one release: not listed (nor among the choices an invalid one is told),
    # says its new name in its help and when used.
    reset = sub.add_parser(
        "reset", parents=[common], description="deprecated: use cache accept-loss (it does the same)"
    )
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(run=_reset)


class _Unlisted(dict[str, Any]):
    """A subcommand's choices that still take the ``unlisted`` ones (``in``) but do not list them:
    argparse lists choices by iterating them (an invalid choice's message, the usage)."""

    def __init__(self, choices: dict[str, Any], unlisted: set[str]) -> None:
        super().__init__(choices)
        self._unlisted = unlisted

    def __iter__(self) -> Iterator[str]:
        return (name for name in super().__iter__() if name not in self._unlisted)


# -- commands ----------------------------------------------------------------------------


def _stats(store: StoreEngine, args: argparse.Namespace) -> int:
    stats = store.stats()
    if args.json:
        print(json.dumps(stats, ensure_ascii=False))
        return 0
    width = max([len(name) for name in stats["by_tool"]] + [9])
    print(f"{'store':<{width + 2}} {stats['location']}")
    print(f"{'receipts':<{width + 2}} {stats['receipts']} (total cost {money(stats['cost_stored'])})")
    for name, count in stats["by_tool"].items():
        print(f"  {name:<{width}} {count}")
    print(f"{'row memos':<{width + 2}} {stats['row_memos']}")
    print(f"{'size':<{width + 2}} {_size(stats['bytes'])}")
    for note in stats.get("notes", ()):
        print(f"note: {note}")
    return 0


def _spend_keys(text: str) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    if any(k not in ("provider", "tool", "day") for k in keys) or len(set(keys)) != len(keys):
        raise argparse.ArgumentTypeError(
            f"{text!r}: name some of provider, tool, day, each once (e.g. provider,day)"
        )
    return keys


def _spend(store: StoreEngine, args: argparse.Namespace) -> int:
    frame = store.spend(args.by)
    if args.json:
        for row in frame.to_dict("records"):
            # no provider (NaN): null
            print(json.dumps({k: None if v != v else v for k, v in row.items()}, ensure_ascii=False))
        return 0
    if frame.empty:
        print(f"nothing spent yet in {store.location}: runs add what they paid and reused as they end")
        return 0
    shown = frame.assign(provider=frame["provider"].fillna("-")) if "provider" in frame else frame
    # the calls with no price, shown where there are some
    shown = shown.drop(columns=[c for c in ("calls_unpriced", "reused_unpriced") if not shown[c].any()])
    shown = shown.rename(
        columns={
            "calls_paid": "calls paid",
            "cost_paid": "cost",
            "calls_reused": "calls reused",
            "cost_saved": "saved",
            "calls_unpriced": "paid unpriced",
            "reused_unpriced": "reused unpriced",
        }
    )
    print(
        shown.to_string(
            index=False,
            float_format=lambda v: f"{v:,.6g}",
            formatters={"cost": money, "saved": money},
            na_rep="unpriced",  # money no call of the line had a price for
        )
    )
    totals = frame[
        ["calls_paid", "cost_paid", "calls_reused", "cost_saved", "calls_unpriced", "reused_unpriced"]
    ].sum()
    print(
        f"in all: {int(totals['calls_paid']):,} calls paid, {_money(totals['cost_paid'], totals['calls_unpriced'])} spent; "
        f"{int(totals['calls_reused']):,} reused, {_money(totals['cost_saved'], totals['reused_unpriced'])} saved"
    )
    return 0


def _money(amount: float, unpriced: float) -> str:
    """A sum of costs, and the calls it leaves out because they have no price (never counted as 0)."""
    return f"{money(amount)} (+ {int(unpriced):,} calls unpriced)" if unpriced else money(amount)


def _list(store: StoreEngine, args: argparse.Namespace) -> int:
    receipts, damaged = _receipts(store, args.tool)
    shown = receipts[: args.limit or None]
    tw = max([len(r.tool) for _, r in shown] + [4])
    vw = max([len(r.version) for _, r in shown] + [3])
    print(f"{'WHEN':<19}  {'TOOL':<{tw}}  {'VER':<{vw}}  MISS  {'COST':>9}  INPUT → OUTPUT")
    for _, r in shown:
        when = datetime.fromtimestamp(r.at).isoformat(timespec="seconds")
        miss = "miss" if r.miss else "-"
        output = f"(not storable: {r.error})" if r.error is not None else _preview(loads(r.output))
        given = _preview(None if r.input is None else loads(r.input))
        print(f"{when}  {r.tool:<{tw}}  {r.version:<{vw}}  {miss:<4}  {money(r.cost):>9}  {given} → {output}")
    if len(receipts) > len(shown):
        print(f"… {len(receipts) - len(shown)} more (--limit 0 shows all)")
    _say_damaged(damaged, store)
    return 0


def _clear(store: StoreEngine, args: argparse.Namespace) -> int:
    stats = store.stats()
    if args.tool is not None:
        _check_tool(args.tool, stats["by_tool"], store)
        memos = store.memo_count(args.tool)
        what = f"{stats['by_tool'][args.tool]} receipts of {args.tool} and {memos} row memos of rows that used it"
    else:
        what = f"all {stats['receipts']} receipts and {stats['row_memos']} row memos"
    if not args.yes:
        _confirm(
            f"Remove {what} from {store.path}? [y/N] ",
            unasked=f"not clearing {what} without confirmation: stdin is not a terminal; pass --yes",
            declined="nothing removed",
        )
    removed = store.clear(args.tool)
    if args.tool is not None:
        print(
            f"removed {removed} receipts of {args.tool} and {memos} row memos of rows that used it from {store.path}"
        )
    else:
        # clear() also counts step and sleep records; name them apart from receipts.
        other = removed - stats["receipts"] - stats["row_memos"]
        steps = f", {other} step records" if other > 0 else ""
        print(
            f"removed {stats['receipts']} receipts, {stats['row_memos']} row memos{steps} from {store.path}"
        )
    return 0


def _confirm(question: str, *, unasked: str, declined: str) -> None:
    """The user's yes to ``question``, asked on the terminal; else :class:`_Fail` saying
    ``unasked`` (stdin is not a terminal: a script passes --yes) or ``declined``."""
    if not sys.stdin.isatty():
        raise _Fail(unasked)
    try:
        answer = input(question)
    except (EOFError, KeyboardInterrupt):
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise _Fail(declined)


def _reset(store: StoreEngine, args: argparse.Namespace) -> int:
    """``cache reset``: the old name of ``cache accept-loss``."""
    print(
        "playbook: `cache reset` is deprecated and goes in the next release; use `cache accept-loss`",
        file=sys.stderr,
    )
    return _accept_loss(store, args)


def _accept_loss(store: StoreEngine, args: argparse.Namespace) -> int:
    """What ``ReceiptStore.accept_loss()`` does: the store's mark starts again from what it holds."""
    lost = store.lost
    if lost is not None and not args.yes:
        _confirm(
            f"{lost}.\nAccept what it holds? Runs on it will pay again for the calls whose receipts are gone [y/N] ",
            unasked=f"{lost}. Nothing accepted without confirmation: stdin is not a terminal; pass --yes",
            declined="nothing accepted: runs on the store are still refused",
        )
    store.accept_loss()
    held = f"holds {store.stats()['receipts']:,} receipts"
    if lost is None:
        print(f"the receipt store at {store.location} has lost nothing: it {held}")
    else:
        print(f"accepted: the receipt store at {store.location} {held}; runs on it go on from there")
    return 0


def _export(store: StoreEngine, args: argparse.Namespace) -> int:
    receipts, damaged = _receipts(store, args.tool)
    lines = "".join(_export_line(key, r) + "\n" for key, r in receipts)
    if args.out is None:
        sys.stdout.write(lines)
    else:
        try:
            Path(args.out).write_text(lines, encoding="utf-8")
        except OSError as exc:
            raise _Fail(f"cannot write {args.out}: {exc.strerror}") from None
        print(f"exported {len(receipts)} receipts to {args.out}", file=sys.stderr)
    _say_damaged(damaged, store)
    return 0


def _export_line(address: str, record: Record) -> str:
    """One receipt as JSON: values in their stored, tagged form (a datetime as {"$datetime": ...})."""
    line = {
        "address": address,
        "tool": record.tool,
        "version": record.version,
        "account": record.account,
        "input": None if record.input is None else loads(record.input),
        "output": loads(record.output),
        "miss": bool(record.miss),
        "cost": record.cost,
        "created_at": record.at,
    }
    if record.error is not None:
        line["error"] = record.error
    return dumps(line)


# -- helpers -----------------------------------------------------------------------------


def _receipts(store: StoreEngine, tool: str | None) -> tuple[list[tuple[str, Record]], int]:
    """Readable receipts oldest first, in stored form, and how many could not be read."""
    if tool is not None:
        _check_tool(tool, store.stats()["by_tool"], store)
    found, damaged = [], 0
    for key, record in store.records(tool):
        if record is None:
            damaged += 1
        else:
            found.append((key, record))
    return found, damaged


def _say_damaged(damaged: int, store: StoreEngine) -> None:
    if damaged:
        print(
            f"playbook: {damaged} damaged receipts in {store.path} were skipped; a run that needs one makes its call again",
            file=sys.stderr,
        )


def _check_tool(tool: str, known: Collection[str], store: StoreEngine) -> None:
    if tool not in known:
        held = ", ".join(sorted(known)) or "none"
        raise _Fail(f"no receipts for tool {tool!r} in {store.path}; tools with receipts: {held}")


def _preview(value: Any) -> str:
    text = dumps(value)
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            break
        n /= 1024
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
