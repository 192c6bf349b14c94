"""The play a command line names (``FILE.py:NAME``): found, imported as a module of its own, and
every mistake said before anything runs."""

from __future__ import annotations

import difflib
import importlib
import importlib.machinery
import importlib.util
import inspect
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from playbook.frontends.files import Usage
from playbook.plays.play import Play
from playbook.tools import Tool

__all__ = ["load", "target"]


def target(spec: str) -> tuple[Path, str]:
    text, colon, name = spec.rpartition(":")
    if not colon:
        raise Usage(f"{spec!r}: name the play to run after a colon, e.g. {spec}:enrich")
    if not name.isidentifier():
        raise Usage(f"{spec!r}: {name!r} is not a Python name; expected FILE.py:NAME, e.g. plays.py:enrich")
    path = Path(text)
    if not path.is_file():
        raise Usage(f"{spec!r}: no such file {text!r}")
    return path.resolve(), name


def load(path: Path, name: str) -> Any:
    """The play ``name`` of the file at ``path``, imported as a module of its own; its folder goes
    on sys.path, so the modules beside it import as they do when it runs as a script."""
    module_name = "playbook_plays_" + re.sub(r"\W", "_", path.stem)
    loader = importlib.machinery.SourceFileLoader(module_name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(module_name, loader))  # type: ignore[arg-type]
    sys.modules[module_name] = module  # dataclasses and pydantic look their module up there
    sys.path.insert(0, str(path.parent))
    try:
        loader.exec_module(module)
    except SyntaxError as exc:
        # raised while compiling: no frame of the file to show, its line is in the message
        sys.stderr.write("".join(traceback.format_exception_only(exc)))
        raise Usage(f"{path.name}, line {exc.lineno}: {type(exc).__name__}: {exc.msg}") from None
    except (Exception, SystemExit) as exc:
        sys.stderr.write("".join(_user_traceback(exc, path)))
        raise Usage(f"importing {path.name} raised {type(exc).__name__} (the traceback above)") from None
    if not hasattr(module, name):
        raise Usage(f"{path.name} has no {name!r}{_defined(module, name)}")
    found = getattr(module, name)
    if not (isinstance(found, (Play, Tool)) or callable(found)):
        raise Usage(
            f"{path.name}: {name} is a {type(found).__name__}, not a play, an async def or a tool{_defined(module, name)}"
        )
    return found


def _user_traceback(exc: BaseException, path: Path) -> list[str]:
    """The traceback from the user's file down: the frames of the import machinery are not theirs."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != str(path):
        tb = tb.tb_next
    return traceback.format_exception(type(exc), exc, tb if tb is not None else exc.__traceback__)


def _defined(module: ModuleType, name: str) -> str:
    """The plays, async functions and tools a module defines, for the error that names none of them."""
    found = {}
    for attr, value in vars(module).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, (Play, Tool)):
            found[attr] = "tool" if isinstance(value, Tool) else "play"
        elif inspect.iscoroutinefunction(value) and getattr(value, "__module__", None) == module.__name__:
            found[attr] = "async def"
    if not found:
        return "; it defines no play, async def or tool"
    near = difflib.get_close_matches(name, found, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return hint + "; it defines: " + ", ".join(f"{attr} ({kind})" for attr, kind in found.items())
