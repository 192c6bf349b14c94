"""The shape of the code, in figures: ``python -m benchmarks.shape [TREE]``.

What a reader of the package meets first, measured on a checkout (this one by default; any other
tree of the project, e.g. one made by ``git worktree add /tmp/old <commit>``, to compare):

- how many places declare the run options (parameters, dataclass fields or flags named after
  them; generated files counted apart);
- the public names of ``pb.Context``, ``pb.Provider`` and ``pb.ReceiptStore``;
- the modules at the top of ``playbook/``, and those ``import playbook`` loads (of them, the demo's);
- the README's lines.

The public names and the modules loaded are read by a fresh interpreter importing the tree.  Import
cycles are ``tests/test_layout.py``'s to count (``pytest tests/test_layout.py -k cycles`` in a tree).
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
        ("top-level modules in playbook/", str(len(list(package.glob("*.py"))))),
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


if __name__ == "__main__":
    main()
