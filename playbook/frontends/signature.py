"""Every surface's run options, derived from the one declaration (:class:`RunOptions`).

- Python: :func:`run_signature` gives ``df.play.map`` and its siblings their keyword parameters
  (what ``help()``, ``df.play.map?`` and IDEs show) and the options' part of their docstring.
  Type checkers read the same options from :mod:`playbook.frontends._kwargs`, generated from
  the declaration by :func:`kwargs_source` (``make generate`` writes it; a test fails when it
  is stale).
- Flags: :func:`flags` spells them for argparse, the ``%%play`` magic's and the command line's
  alike, with the same help; :func:`given` reads back the options a command line gave.
"""

from __future__ import annotations

import argparse
import inspect
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from playbook._internal.renamed import renamed
from playbook.runtime.options import RENAMED, Option, RunOptions, options

__all__ = ["flags", "given", "kwargs_source", "options_doc", "run_signature", "write_kwargs"]

F = TypeVar("F", bound=Callable[..., Any])

_KWARGS = Path(__file__).with_name("_kwargs.py")


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(RunOptions)


def _option(f: Any) -> Option:
    option: Option = f.metadata["option"]
    return option


def options_doc(surface: str) -> str:
    """The options' part of a docstring: each option's type, default and help."""
    lines = ["Options (the same on every kind of frame, in ``%%play`` and on the command line):", ""]
    hints = _hints()
    for f in options(surface):
        lines.append(f"``{f.name}`` : {inspect.formatannotation(hints[f.name])} = {f.default!r}")
        lines.append(f"    {_option(f).help}")
    return "\n".join(lines)


def run_signature(surface: str) -> Callable[[F], F]:
    """Spell the run options offered on ``surface`` out as keyword-only parameters of the method
    (``(self, play, **options)``), and add their help to its docstring."""

    def spell(method: F) -> F:
        hints = _hints()
        own = inspect.signature(method)
        head = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        keywords = [
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name]
            )
            for f in options(surface)
        ]
        method.__signature__ = own.replace(parameters=[*head, *keywords])  # type: ignore[attr-defined]
        method.__doc__ = f"{inspect.cleandoc(method.__doc__ or '')}\n\n{options_doc(surface)}"
        return method

    return spell


def flags(surface: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(flag, argparse keyword arguments)`` for each option offered on ``surface``; then the
    old spelling of each renamed one, unlisted (:func:`given` reads it as the new, warning)."""
    spelled_as = dict(_flags(surface))
    yield from spelled_as.items()
    for old, new in RENAMED.items():
        if _flag(new) in spelled_as:
            yield _flag(old), {**spelled_as[_flag(new)], "dest": old, "help": argparse.SUPPRESS}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _flags(surface: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for f in options(surface):
        option = _option(f)
        spelled: dict[str, Any] = {"dest": f.name, "help": option.help, "default": None}
        if option.choices is not None:
            spelled.update(choices=option.choices, metavar="|".join(option.choices))
            if option.bare is not None:
                spelled.update(nargs="?", const=option.bare)
        elif option.metavar is not None:
            spelled["metavar"] = option.metavar
            if option.text is not None:
                spelled["type"] = option.text
        else:
            spelled["action"] = "store_true"
        yield _flag(f.name), spelled


def given(args: argparse.Namespace, surface: str) -> dict[str, Any]:
    """The options a command line gave (those it left out are not in the dict).  A renamed
    option's old flag is read as the new one, with a ``DeprecationWarning`` naming it."""
    found = {
        f.name: getattr(args, f.name) for f in options(surface) if getattr(args, f.name, None) is not None
    }
    for old, new in RENAMED.items():
        if getattr(args, old, None) is None:
            continue
        if new in found:
            raise ValueError(f"{_flag(old)} and {_flag(new)} name one option: pass only {_flag(new)}")
        renamed(_flag(old), _flag(new))
        found[new] = getattr(args, old)
    return found


def kwargs_source() -> str:
    """The text of :mod:`playbook.frontends._kwargs`: the options as ``TypedDict``s, for ``Unpack``."""
    raw = {f.name: str(f.type).replace("'", '"') for f in options()}  # as the formatter writes them

    def body(surface: str, leave_out: set[str]) -> list[str]:
        return [f"    {f.name}: {raw[f.name]}" for f in options(surface) if f.name not in leave_out]

    mapped = {f.name for f in options("map")}
    lines = [
        '"""The run options as ``TypedDict``s, for type checkers (``**options: Unpack[MapKwargs]``).',
        "",
        "Generated from :class:`playbook.runtime.options.RunOptions` by",
        "``make generate``: edit the declaration there, not this file.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import os",
        "from collections.abc import Callable, Sequence",
        "from typing import Any, Literal, TypedDict",
        "",
        "from playbook.store import ReceiptStore",
        "from playbook.store.fixtures import Fixtures",
        "",
        '__all__ = ["MapKwargs", "RunKwargs"]',
        "",
        "",
        "class MapKwargs(TypedDict, total=False):",
        '    """The options of ``map()`` and ``amap()``."""',
        "",
        *body("map", set()),
        "",
        "",
        "class RunKwargs(MapKwargs, total=False):",
        '    """The options of ``run()`` and ``arun()``: ``map()``\'s and ``background``."""',
        "",
        *body("run", mapped),
        "",
    ]
    return "\n".join(lines)


def write_kwargs() -> Path:
    """Write :mod:`playbook.frontends._kwargs` anew (``make generate``)."""
    _KWARGS.write_text(kwargs_source())
    return _KWARGS
