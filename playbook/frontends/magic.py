"""``%%play``: a cell is the body of a play; with ``--on DF`` it runs it too.

::

    %%play enrich --on leads --out enriched --concurrency 16
    domain = await ctx.tool(clean_domain, url=row.website)
    email = await ctx.tool(find_email, domain=domain, first=row.first)

The body becomes ``async def enrich(row, ctx)``.  With a ``return`` of its own, that value is the
row's output; without one, the names the body assigns (not starting with ``_``) become the output
columns.  The magic parses, builds the play, delegates to ``df.play`` and stores the result.
"""

from __future__ import annotations

import argparse
import ast
import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

import pandas as pd
from IPython.core import magic, magic_arguments
from IPython.core.error import UsageError
from IPython.utils.process import arg_split  # type: ignore[attr-defined]  # the split %%magics use

from playbook.frontends.signature import flags, given
from playbook.frontends.usage import near_choice, unrecognized
from playbook.plays.play import Play
from playbook.store import ReceiptStore

__all__ = ["PlayMagics", "build_play"]

_T = TypeVar("_T")


class _Decorator(Protocol):
    def __call__(self, fn: _T, /) -> _T: ...


# IPython's magic decorators are untyped; each returns what it is given, so say so once here.
magics_class = cast(_Decorator, magic.magics_class)
cell_magic = cast(_Decorator, magic.cell_magic)
magic_args = cast(Callable[[], _Decorator], magic_arguments.magic_arguments)
argument = cast(Callable[..., _Decorator], magic_arguments.argument)


_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ClassDef,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def _run_flags(method: _T) -> _T:
    """The run options' flags, spelled as on the command line (:func:`~.signature.flags`)."""
    for flag, spelled in reversed(list(flags("magic"))):
        method = argument(flag, **spelled)(method)
    return method


@magics_class
class PlayMagics(magic.Magics):
    @magic_args()
    @argument("name", help="the play's name; the cell defines it in the namespace")
    @argument("--on", metavar="DF", help="run the play over this DataFrame (a name in the namespace)")
    @argument("--out", metavar="VAR", help="store the result (or, with --background, the run) in VAR")
    @_run_flags
    @cell_magic
    def play(self, line: str, cell: str) -> Any:
        """Define a play from the cell's body, and run it with ``--on DF``."""
        args = _parse(self.play.parser, line)  # type: ignore[attr-defined]
        if not args.name.isidentifier():
            raise UsageError(f"%%play: the play's name must be a Python name, not {args.name!r}")
        if self.shell is None:  # pragma: no cover - a magic runs in a shell
            raise UsageError("%%play needs an IPython shell")
        ns = self.shell.user_ns
        the_play = build_play(args.name, line, cell, ns, self.shell)
        ns[args.name] = the_play
        if args.on is None:
            return None
        frame = ns.get(args.on)
        # A Polars or Dask frame's .play takes the same options (see polars_frames, cluster) and
        # returns its own kind of frame.
        other = type(frame).__module__.startswith(("polars", "dask")) and type(frame).__name__ == "DataFrame"
        if not (isinstance(frame, pd.DataFrame) or other):
            found = "no such name" if args.on not in ns else f"a {type(frame).__name__}"
            raise UsageError(
                f"%%play --on {args.on}: expected a pandas, Polars or Dask DataFrame in the namespace, found {found}"
            )
        options = _run_options(args, ns)
        if args.background:
            run = frame.play.run(the_play, background=True, **options)
            if args.out:
                ns[args.out] = run
            return run
        result = frame.play.map(the_play, **options)
        if args.out:
            ns[args.out] = result
            return None
        return result


def _parse(parser: Any, line: str) -> argparse.Namespace:
    """The magic's flags, parsed as IPython does, saying what a misspelt one was likely meant to
    be (as the command line does: :mod:`~playbook.frontends.usage`)."""
    try:
        args, extras = parser.parse_known_args(arg_split(line))
    except UsageError as exc:
        raise UsageError(near_choice(str(exc))) from None
    if extras:
        raise UsageError(
            unrecognized(extras, parser.format_usage()) or f"unrecognized arguments: {' '.join(extras)}"
        )
    return cast(argparse.Namespace, args)


def _run_options(args: argparse.Namespace, ns: dict[str, Any]) -> dict[str, Any]:
    """The options of ``df.play.map`` that the magic's line gives, leaving out those it does not."""
    try:
        options = given(args, "magic")
    except ValueError as exc:
        raise UsageError(f"%%play {exc}") from None
    options.pop("background", None)  # the magic calls run(background=True) itself
    if args.fixtures is not None and not os.path.isfile(args.fixtures):
        raise UsageError(
            f"%%play --fixtures {args.fixtures}: no such file (record one with pb.fixtures(path, mode='record'))"
        )
    if args.store is not None and args.store in ns:
        # A name in the namespace: the store (or the path or URL) that variable holds.  Any other
        # word is what the flag says on the command line too: a directory or a URL.
        store = ns.get(args.store)
        if not isinstance(store, (ReceiptStore, str, os.PathLike)):
            raise UsageError(
                f"%%play --store {args.store}: expected a variable holding a pb.ReceiptStore, a directory or a "
                f"redis:// URL, not {type(store).__name__ if args.store in ns else 'an undefined name'}"
            )
        options["store"] = store
    return options


def build_play(name: str, line: str, body: str, ns: dict[str, Any], shell: Any = None) -> Play:
    """The play ``name`` whose body is ``body`` (a ``%%play`` cell), compiled in ``ns``.

    Line numbers are the cell's own, so a traceback or a row error points at the user's line.
    """
    cell = f"%%play {line}\n{body}"
    filename = shell.compile.cache(cell) if shell is not None else f"<%%play {name}>"
    tree = ast.parse("\n" + body, filename=filename)  # the blank line stands for the magic's line
    returns = _returns(tree.body)
    statements = list(tree.body) or [ast.Pass()]
    if not returns:
        # locals() is the comprehension's outermost iterable, so it is evaluated in the play's
        # own scope; a name assigned on no path the row took is simply not a column of that row.
        names = tuple(_assigned(tree.body))
        statements += ast.parse(f"return {{k: v for k, v in locals().items() if k in {names!r}}}").body
    fields: dict[str, Any] = {"type_params": []} if "type_params" in ast.AsyncFunctionDef._fields else {}
    fn = ast.AsyncFunctionDef(
        name=name,
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg("row"), ast.arg("ctx")], kwonlyargs=[], kw_defaults=[], defaults=[]
        ),
        body=statements,
        decorator_list=[],
        returns=None,
        **fields,
    )
    module = ast.Module(body=[fn], type_ignores=[])
    ast.fix_missing_locations(module)
    scope: dict[str, Any] = {}
    exec(compile(module, filename, "exec"), ns, scope)  # the user's own cell
    return Play(scope[name], name=name, source=body.strip())


def _walk_own(nodes: list[ast.stmt]) -> Any:
    """Every node of the body that is not inside a nested function, class or comprehension."""
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _SCOPES):
                stack.append(child)


def _returns(nodes: list[ast.stmt]) -> bool:
    return any(isinstance(node, ast.Return) for node in _walk_own(nodes))


def _assigned(nodes: list[ast.stmt]) -> list[str]:
    """The names the body assigns, in order, leaving out ``_private`` ones and ``row``/``ctx``."""
    found: dict[str, None] = {}
    for node in sorted(
        _walk_own(nodes), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))
    ):
        if (
            isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Store)
            and not node.id.startswith("_")
            and node.id not in ("row", "ctx")
        ):
            found[node.id] = None
    return list(found)
