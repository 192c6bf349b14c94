"""The public surface: one curated, sorted, complete __all__."""

from __future__ import annotations

import types

import playbook as pb

CONTRACT = [
    "Context", "Play", "PlayDefinitionError", "PlaybookError", "Provider", "ProviderExhausted",
    "ProviderUnavailable", "ReceiptError", "ReceiptStore", "Run", "RunFatal", "Tool", "ToolError",
    "http_tool", "last_run", "play", "secret", "tool",
]  # fmt: skip


def test_all_is_sorted() -> None:
    """__all__ is sorted (case-sensitive, like httpx's)."""
    assert pb.__all__ == sorted(pb.__all__)


def test_all_is_complete() -> None:
    """Every public attribute is in __all__, and every name in __all__ exists."""
    public = {
        name
        for name, value in vars(pb).items()
        if not name.startswith("_") and not (isinstance(value, types.ModuleType) and name != "demo")
    }
    assert public == set(pb.__all__)


def test_design_names_are_exported() -> None:
    """The names DESIGN.md promises are importable from playbook."""
    missing = [name for name in CONTRACT if name not in pb.__all__]
    assert missing == []


def test_error_tree() -> None:
    """The exception tree is the one drawn in playbook.errors."""
    assert issubclass(pb.ProviderExhausted, pb.ProviderUnavailable)
    assert issubclass(pb.ProviderUnavailable, pb.ToolError)
    for error in (pb.ToolError, pb.RunFatal, pb.PlayDefinitionError, pb.ReceiptError):
        assert issubclass(error, pb.PlaybookError)
