"""The shape of the code, in figures: ``python -m benchmarks.shape [TREE]``.

What a reader of the package meets first, measured on a checkout (this one by default; any other
tree of the project, e.g. one made by ``git worktree add /tmp/old <commit>``, to compare):

- how many places declare the run options (parameters, dataclass fields or flags named after
  them; generated files counted apart);
- the public names of ``pb.Context``, ``pb.Provider`` and ``pb.ReceiptStore``;
- the public names on each kind of tool a user holds (``pb.tool``, ``pb.http_tool``, ``pb.llm_tool``);
- the modules at the top of ``playbook/``, and those ``import playbook`` loads (of them, the demo's);
- import cycles between packages (top-level packages, and their subpackages), lazy and
  type-checking imports included;
- ``# fmt: skip`` in the package, uses of ``Any``, and the longest module;
- the README's lines.

The public names and the modules loaded are read by a fresh interpreter importing the tree.  Import
cycles are ``tests/test_layout.py``'s to count (``pytest tests/test_layout.py -k cycles`` in a tree).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

_GENERATED = "Generated from"  # said at the top of a generated module (playbook/frontends/_kwargs.py)

_RUN = {"concurrency", "refresh"}  # two run options: a provider's own `concurrency` is not one

_PROBE = r"""
import json, sys
before = set(sys.modules)
import playbook as pb
loaded = [m for m in sys.modules if m not in before and (m == "playbook" or m.startswith("playbook."))]
def public(cls):
    return len([n for n in dir(cls) if not n.startswith("_")])
import warnings
warnings.simplefilter("ignore")
def f(x: str) -> str:
    return x
tools = [pb.tool(f), pb.http_tool("t", method="GET", url="http://h/{x}"), pb.llm_tool(model="m", secret=None)]
print(json.dumps({
    "tools": " / ".join(str(public(t)) for t in tools),
    "file": pb.__file__, "context": public(pb.Context), "provider": public(pb.Provider), "store": public(pb.ReceiptStore),
    "loaded": len(loaded), "demo": len([m for m in loaded if m.startswith("playbook.demo")]),
}))
"""


def main() -> None:
    tree = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    package = tree / "playbook"
    declared, generated = _option_declarations(package)
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    names = json.loads(probe.stdout)
    assert Path(names["file"]).is_relative_to(tree), f"imported {names['file']}, not the tree's"
    rows = [
        (
            "declarations of the run options",
            f"{declared}" + (f" (+ {generated} generated)" if generated else ""),
        ),
        (
            "public names: Context / Provider / ReceiptStore",
            f"{names['context']} / {names['provider']} / {names['store']}",
        ),
        ("public names: tool / http_tool / llm_tool", names["tools"]),
        ("top-level modules in playbook/", str(len(list(package.glob("*.py"))))),
        (
            "packages in import cycles (top / sub)",
            " / ".join(_cycles_said(package, d) for d in (1, 2)),
        ),
        (
            "`# fmt: skip` in playbook/",
            str(_count(package, lambda line: line.rstrip().endswith("# fmt: skip"))),
        ),
        (
            "uses of Any in playbook/",
            str(_count(package, lambda line: len(re.findall(r"\bAny\b", line)))),
        ),
        ("longest module (lines)", "{1} ({0})".format(*_longest(package))),
        ("modules loaded by import playbook", f"{names['loaded']} ({names['demo']} demo)"),
        ("README lines", str(len((tree / "README.md").read_text().splitlines()))),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{tree}")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


def _option_declarations(package: Path) -> tuple[int, int]:
    """Places that spell the run options out: a function with ``concurrency`` and ``refresh``
    parameters, a class with both fields, an ``add_argument("--refresh", ...)``."""
    declared = generated = 0
    for path in package.rglob("*.py"):
        text = path.read_text()
        found = 0
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += {a.arg for a in (*node.args.args, *node.args.kwonlyargs)} >= _RUN
            elif isinstance(node, ast.ClassDef):
                found += {
                    getattr(s.target, "id", None) for s in node.body if isinstance(s, ast.AnnAssign)
                } >= _RUN
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                found += any(isinstance(a, ast.Constant) and a.value == "--refresh" for a in node.args)
        if _GENERATED in text[:400]:
            generated += found
        else:
            declared += found
    return declared, generated


def _cycles_said(package: Path, depth: int) -> str:
    cycles = _package_cycles(package, depth)
    names = sorted(name.removeprefix("playbook.") for cycle in cycles for name in cycle)
    return f"{len(names)}" + (f" ({', '.join(names)})" if names else "")


def _cycles_said(package: Path, depth: int) -> str:
    cycles = _package_cycles(package, depth)
    names = sorted(name.removeprefix("playbook.") for cycle in cycles for name in cycle)
    return f"{len(names)}" + (f" ({', '.join(names)})" if names else "")


def _count(package: Path, hit: Callable[[str], int]) -> int:
    return sum(hit(line) for path in package.rglob("*.py") for line in path.read_text().splitlines())


def _longest(package: Path) -> tuple[str, int]:
    return max(
        (
            (str(p.relative_to(package.parent)), len(p.read_text().splitlines()))
            for p in package.rglob("*.py")
        ),
        key=lambda item: item[1],
    )


def _package_cycles(package: Path, depth: int) -> list[set[str]]:
    """Cycles between packages: each module counts as its package at ``depth`` below ``playbook``
    (a module at the top of a package shallower than that is its own unit)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        if is_init:
            parts.pop()
        modules[".".join(parts)] = (path, is_init)
    packages = {name for name, (_, is_init) in modules.items() if is_init}

    def unit(name: str) -> str:
        parts = name.split(".")
        for d in range(min(depth, len(parts) - 1), 0, -1):
            if ".".join(parts[: d + 1]) in packages:
                return ".".join(parts[: d + 1])
        return name

    graph: dict[str, set[str]] = {}
    for name, (path, is_init) in modules.items():
        here = name if is_init else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if (
                    target in modules
                    and unit(target) != unit(name)
                    and not name.startswith(unit(target) + ".")
                ):
                    graph.setdefault(unit(name), set()).add(unit(target))
    return _strongly_connected(graph)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Components of more than one node: each node's reach, intersected with what reaches it."""

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reaches = {node: reach(node) for node in graph}
    found: list[set[str]] = []
    for node in graph:
        component = {node} | {other for other in reaches[node] if node in reaches.get(other, set())}
        if len(component) > 1 and component not in found:
            found.append(component)
    return found


if __name__ == "__main__":
    main()
