"""What a play's compiled code says about what it reads, found in its bytecode: the code inside
it, whether it names the row's index label, the environment variables it names or builds.  The
walk of :mod:`.reads` asks these of each function it follows."""

from __future__ import annotations

import dis
import functools
import inspect
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["ENV_NAME", "NAMES", "SIMPLE", "codes", "env_built", "env_names", "names_index"]

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]+")
_INDEX = frozenset(("index", "Index"))  # how a play reads its row's index label
# a name read whole, not built
NAMES = frozenset(("LOAD_CONST", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"))
SIMPLE = NAMES | {"LOAD_FAST"}
_ENDS = frozenset(("PRECALL", "CALL", "CALL_KW", "KW_NAMES", "BINARY_SUBSCR"))
_SKIP = frozenset(("PUSH_NULL", "NOP", "CACHE", "EXTENDED_ARG"))


@functools.lru_cache(maxsize=1024)
def env_built(code: Any) -> bool:
    """True when ``code`` (or the code inside it) reads an environment variable by a name that is
    not a constant or a global read whole: ``os.getenv(f"KEY_{x}")``, ``os.environ[name]``."""
    for inner in codes(code):
        ops = [ins for ins in dis.get_instructions(inner) if ins.opname not in _SKIP]
        for i, ins in enumerate(ops[:-1]):
            if ins.argval not in ("getenv", "environ", "get") or not ins.opname.startswith("LOAD_"):
                continue
            if ins.argval == "get" and (i == 0 or ops[i - 1].argval != "environ"):
                continue  # a get of something else
            if ins.argval == "environ" and ops[i + 1].opname in ("LOAD_ATTR", "LOAD_METHOD"):
                continue  # environ.get: its get is the read
            if _argument_built(ops, i + 1, subscript=ins.argval == "environ"):
                return True
    return False


def _argument_built(ops: list[Any], at: int, *, subscript: bool) -> bool:
    """Whether the name a read starting at ``ops[at]`` gives is built; ``subscript``: environ[...],
    where environ passed whole (``dict(os.environ)``, ``x in os.environ``) reads no one name."""
    first = ops[at]
    second, third = (ops[at + n].opname if at + n < len(ops) else "" for n in (1, 2))
    if first.opname in NAMES and (second in _ENDS or (second in SIMPLE and third in _ENDS)):
        return False  # a name read whole, and a default after it
    if not subscript:
        return True
    for ins in ops[at : at + 16]:  # the first thing done with environ: a subscript, or anything else
        if ins.opname == "BINARY_SUBSCR":
            return True
        if ins.opname in (
            "PRECALL",
            "CALL",
            "CONTAINS_OP",
            "RETURN_VALUE",
            "POP_TOP",
        ) or ins.opname.startswith("STORE_"):
            return False
    return False


def codes(code: Any) -> Iterator[Any]:
    yield code
    for const in code.co_consts:
        if inspect.iscode(const):
            yield from codes(const)


@functools.lru_cache(maxsize=1024)
def names_index(code: Any) -> bool:
    """True when ``code`` (or the code inside it) names ``index`` or ``Index``: as an attribute
    (``row.Index``, and ``items.index(x)`` too: a play wrongly thought to read the label only
    runs its rows of a reindexed frame again, from receipts), or as a string (``getattr(row, "index")``)."""
    for inner in codes(code):
        if _INDEX.intersection(inner.co_names) or _INDEX.intersection(
            c for c in inner.co_consts if isinstance(c, str)
        ):
            return True
    return False


def env_names(code: Any) -> list[str]:
    """The string constants of ``code`` (and the code inside it) shaped like environment variables' names."""
    return sorted(
        {c for inner in codes(code) for c in inner.co_consts if isinstance(c, str) and ENV_NAME.fullmatch(c)}
    )
