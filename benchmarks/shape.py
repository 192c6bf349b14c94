"""The shape of the code, in figures: ``python -m benchmarks.shape [TREE]``.

What a reader of the package meets first, measured on a checkout (this one by default; any other
tree of the project, e.g. one made by ``git worktree add /tmp/old <commit>``, to compare):

- how many places declare the run options (parameters, dataclass fields or flags named after
  them; generated files counted apart);
- the public names of ``pb.Context``, ``pb.Provider`` and ``pb.ReceiptStore``;
- the modules at the top of ``playbook/``, and those ``import playbook`` loads (of them, the demo's);
- import cycles among playbook's modules (imports under ``TYPE_CHECKING`` included);
- the README's lines.

The public names and the modules loaded are read by a fresh interpreter importing the tree.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
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
print(json.dumps({
    "file": pb.__file__, "context": public(pb.Context), "provider": public(pb.Provider), "store": public(pb.ReceiptStore),
    "loaded": len(loaded), "demo": len([m for m in loaded if m.startswith("playbook.demo")]),
}))
"""


def main() -> None:
    tree = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    package = tree / "playbook"
    declared, generated = _option_declarations(package)
    probe = subprocess.run([sys.executable, "-c", _PROBE], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": ""},
                           capture_output=True, text=True, check=True)  # fmt: skip
    names = json.loads(probe.stdout)
    assert Path(names["file"]).is_relative_to(tree), f"imported {names['file']}, not the tree's"
    rows = [
        ("declarations of the run options", f"{declared}" + (f" (+ {generated} generated)" if generated else "")),
        ("public names: Context / Provider / ReceiptStore", f"{names['context']} / {names['provider']} / {names['store']}"),
        ("top-level modules in playbook/", str(len(list(package.glob("*.py"))))),
        ("modules loaded by import playbook", f"{names['loaded']} ({names['demo']} demo)"),
        ("import cycles", str(len(_cycles(package)))),
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
                found += {getattr(s.target, "id", None) for s in node.body if isinstance(s, ast.AnnAssign)} >= _RUN
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                found += any(isinstance(a, ast.Constant) and a.value == "--refresh" for a in node.args)
        if _GENERATED in text[:400]:
            generated += found
        else:
            declared += found
    return declared, generated


def _cycles(package: Path) -> list[list[str]]:
    """Strongly connected groups of more than one module in the graph of playbook's own imports made
    at import time."""
    graph: dict[str, set[str]] = {}
    modules = {_name(package, p): p for p in package.rglob("*.py")}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(name, set())
        for node in _top_level(ast.parse(path.read_text()).body):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, node.module, node.level, is_package)
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [base, *subs]  # `from . import module` needs no package
            edges.update(t for t in targets if t in modules and t != name)
    return [group for group in _components(graph) if len(group) > 1]


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements run when the module is imported (those under ``if``/``try`` too, ``if
    TYPE_CHECKING:`` included), not those in functions: an import inside a function is made later."""
    found: list[ast.stmt] = []
    for node in body:
        found.append(node)
        if isinstance(node, ast.If):
            found += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            found += _top_level(node.body) + _top_level(node.orelse) + _top_level(node.finalbody)
            for handler in node.handlers:
                found += _top_level(handler.body)
    return found


def _name(package: Path, path: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, target: str | None, level: int, is_package: bool) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, without recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                found.append(group)
    return found


if __name__ == "__main__":
    main()
