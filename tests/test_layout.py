"""The shape of the code: no import cycles between playbook's modules or its packages, functions of a
readable size (a module is as long as its one concept needs), views that read the runtime through
RunState's read API only, and no module reaching into another's private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "playbook"
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _imports(name: str, tree: ast.Module) -> Iterator[str]:
    """The playbook modules ``name`` imports: at module level, lazily in a function, or for type
    checkers only (a module that needs another's types depends on it too)."""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target in MODULES and target != name:
                yield target


def _graph() -> dict[str, set[str]]:
    return {name: set(_imports(name, tree)) for name, tree in TREES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _without_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without edges into a package's ``__init__`` from inside that package: a package
    re-exporting its modules is not a cycle of theirs."""
    return {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}


def test_no_import_cycles_between_modules() -> None:
    """No two playbook modules import each other, directly or through others, not even for type
    checkers only (a module that needs another's types for its signatures depends on it)."""
    assert _cycles(_without_packages(_graph())) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a made-up graph with a loop is reported."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _room(name: str, depth: int) -> str:
    """The unit ``name`` belongs to at ``depth``: the package ``depth`` levels below playbook that
    holds it (``playbook.runtime`` at 1, ``playbook.runtime.rows`` at 2), or else the module itself
    (``playbook.errors`` at 1, ``playbook.runtime.options`` at 2: each a unit of its own)."""
    candidate = ".".join(name.split(".")[: depth + 1])
    if candidate in MODULES and MODULES[candidate].name == "__init__.py":
        return candidate
    return name


def _packages(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The module graph folded into units (see :func:`_room`): an arrow between two units for each
    import between their modules, but none from a module into a package that holds it (its
    ``__init__`` re-exporting it)."""
    folded: dict[str, set[str]] = {}
    for name, targets in graph.items():
        room = _room(name, depth)
        arrows = folded.setdefault(room, set())
        for target in targets:
            other = _room(target, depth)
            if other != room and not name.startswith(target + "."):
                arrows.add(other)
                folded.setdefault(other, set())
    return folded


def test_no_import_cycles_between_packages() -> None:
    """No two packages import each other, directly or through others, lazily or for type checkers
    only: neither the top-level ones (``playbook.tools``, ``playbook.plays``, each top-level
    module a unit of its own) nor the subpackages below them (``playbook.runtime.rows``,
    ``playbook.store.redis``)."""
    graph = _graph()
    assert [_cycles(_packages(graph, depth)) for depth in (1, 2)] == [[], []]


def test_the_package_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: modules that import each other's packages (and not each other)
    make a cycle of those packages at each depth."""
    layout = {
        "playbook.a": "playbook/a/__init__.py",
        "playbook.a.one": "playbook/a/one.py",
        "playbook.b": "playbook/b/__init__.py",
        "playbook.b.two": "playbook/b/two.py",
        "playbook.b.deep": "playbook/b/deep/__init__.py",
        "playbook.b.deep.three": "playbook/b/deep/three.py",
        "playbook.b.deep.four": "playbook/b/deep/four.py",
    }
    graph = {
        "playbook.a": set(),
        "playbook.a.one": {"playbook.b.two"},
        "playbook.b": {"playbook.b.two"},
        "playbook.b.two": {"playbook.b.deep.four"},
        "playbook.b.deep": {"playbook.b.deep.three"},
        "playbook.b.deep.three": {"playbook.a.one"},
        "playbook.b.deep.four": set(),
    }
    assert _cycles(_without_packages(graph)) == []
    saved = dict(MODULES)
    MODULES.clear()
    MODULES.update({name: Path(path) for name, path in layout.items()})
    try:
        found = [_cycles(_packages(graph, depth)) for depth in (1, 2)]
    finally:
        MODULES.clear()
        MODULES.update(saved)
    assert found == [
        [["playbook.a", "playbook.b"]],
        [["playbook.a.one", "playbook.b.deep", "playbook.b.two"]],
    ]


def _function_lengths(tree: ast.Module) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            docstring = (
                isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            )
            first = body[1] if docstring and len(body) > 1 else body[0]
            yield f"{node.name} (line {node.lineno})", (node.end_lineno or node.lineno) - first.lineno + 1


def test_functions_stay_under_60_lines() -> None:
    """No function's body (its docstring aside) is longer than 60 lines."""
    long = [
        (name, fn, n)
        for name, tree in TREES.items()
        for fn, n in _function_lengths(tree)
        if n > MAX_FUNCTION_LINES
    ]
    assert long == []


def test_views_read_the_runtime_through_the_read_api_only() -> None:
    """Nothing under playbook.ui imports the runtime but RunState's read API, playbook.runtime.state.reading
    (type checkers' imports too)."""
    reached = {
        (name, target)
        for name, tree in TREES.items()
        if name.startswith("playbook.ui")
        for target in _imports(name, tree)
        if target.startswith("playbook.runtime") and target != "playbook.runtime.state.reading"
    }
    assert reached == set()


def test_plays_do_not_import_tools() -> None:
    """Tools sit above plays: nothing under playbook.plays imports playbook.tools, not lazily nor for
    type checkers (a play knows a tool by the Playable protocol; a tool makes its own play)."""
    reached = {
        (name, target)
        for name, tree in TREES.items()
        if name.startswith("playbook.plays")
        for target in _imports(name, tree)
        if target.startswith("playbook.tools")
    }
    assert reached == set()


def test_the_runtime_does_not_import_the_views() -> None:
    """The runtime knows nothing of views: no module under playbook.runtime imports playbook.ui."""
    reached = {
        (name, target)
        for name, tree in TREES.items()
        if name.startswith("playbook.runtime")
        for target in _imports(name, tree)
        if target.startswith("playbook.ui")
    }
    assert reached == set()


RUNTIME_LAYERS = ("estimate", "run", "schedule", "options", "calls", "state", "rows")


def _runtime_layer(name: str) -> int | None:
    """The place of ``name`` in :data:`RUNTIME_LAYERS` (its room, or the module at the runtime's top)."""
    parts = name.split(".")
    if parts[:2] != ["playbook", "runtime"] or len(parts) < 3:
        return None  # outside the runtime, or the runtime's __init__ (it re-exports)
    return RUNTIME_LAYERS.index(parts[2])


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Imports from a runtime room into one above it (:data:`RUNTIME_LAYERS` goes from top to bottom)."""
    found = set()
    for name, targets in graph.items():
        here = _runtime_layer(name)
        for target in targets:
            there = _runtime_layer(target)
            if here is not None and there is not None and there < here:
                found.add((name, target))
    return found


def test_the_runtime_rooms_depend_one_way() -> None:
    """The runtime's rooms import downward only: estimate, run, schedule, options, calls, state, rows."""
    assert _upward(_graph()) == set()


def test_the_room_check_finds_an_import_upward() -> None:
    """The check above can fail: the call pipeline importing the estimate is reported."""
    graph = {"playbook.runtime.calls.pipeline": {"playbook.runtime.estimate.distinct"}}
    assert _upward(graph) == {("playbook.runtime.calls.pipeline", "playbook.runtime.estimate.distinct")}


def _private_names(tree: ast.Module) -> set[str]:
    """The ``_private`` names a module defines: functions, classes, attributes, slots, globals."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)  # __slots__ entries
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_") and not n.endswith("__")}


def _reaching(trees: dict[str, ast.Module]) -> set[tuple[str, str, int]]:
    """``(module, name, line)`` for every ``obj._name`` read where ``_name`` is another module's."""
    own = {name: _private_names(tree) for name, tree in trees.items()}
    everywhere = set().union(*own.values())
    reached = set()
    for name, tree in trees.items():
        for node in ast.walk(tree):
            private = (
                isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__")
            )
            if private and node.attr in everywhere and node.attr not in own[name]:
                reached.add((name, node.attr, node.lineno))
    return reached


def test_no_module_reaches_into_another_modules_private_names() -> None:
    """``obj._name`` is read only in the module that defines ``_name``: no ``run._maprun`` from a view."""
    assert _reaching(TREES) == set()


def test_the_private_name_check_finds_a_reach() -> None:
    """The check above can fail: a view reading a run's private attribute is reported."""
    run = ast.parse("class Run:\n    def __init__(self, m):\n        self._maprun = m\n")
    view = ast.parse("def render(run):\n    return run._maprun.state\n")
    assert _reaching({"run": run, "view": view}) == {("view", "_maprun", 2)}


def test_the_top_of_the_package_holds_few_modules() -> None:
    """The package's top shows its design: at most eight modules beside the packages."""
    top = sorted(path.name for path in ROOT.glob("*.py"))
    assert len(top) <= 8, top


def test_import_playbook_loads_no_demo_polars_or_dask() -> None:
    """``import playbook`` loads the demo provider, Polars and Dask only when they are used."""
    code = "import sys, playbook; print(sorted(m for m in sys.modules if m.split('.')[0] in ('polars', 'dask') or m.startswith('playbook.demo')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
