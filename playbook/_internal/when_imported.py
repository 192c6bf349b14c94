"""Run a function once a module has been imported, without importing it ourselves.

Polars and Dask have no plugin entry point for accessors, and importing them to register ours
would cost every playbook user their import time.  :func:`when_imported` runs ``then`` now if the
module is loaded, else right after its first import: a finder at the front of ``sys.meta_path``
answers only for that name, asks the finders behind it for the real spec, and wraps the loader so
that once the module's own code has run, ``then`` runs, the original loader is put back and the
finder removed.  It stays until then: a bare ``importlib.util.find_spec(name)`` (libraries probe
for optional packages that way) loads nothing, and a ``pip install`` in a running kernel is seen.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]


def when_imported(name: str, then: Callable[[], None]) -> None:
    """Call ``then()`` now if ``name`` is imported, else once it is (once either way)."""
    if sys.modules.get(name) is not None:  # None: an import of it is blocked on purpose
        then()
    elif not any(isinstance(finder, _WhenLoaded) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenLoaded(name, then))


class _WhenLoaded(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenRun(spec.loader, self)
                return spec
        return None


class _ThenRun(importlib.abc.Loader):
    """The module's own loader, which calls ``then`` after the module has loaded."""

    def __init__(self, loader: importlib.abc.Loader, finder: _WhenLoaded) -> None:
        self.loader = loader
        self.finder = finder

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)  # resource readers and the like are the real loader's

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self.finder]
        self.finder.then()
