"""The public surface: one curated, sorted, complete __all__."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

import playbook as pb
from playbook.tools.tool import engine_of

CONTRACT = [
    "Context",
    "Play",
    "PlayDefinitionError",
    "PlaybookError",
    "Provider",
    "ProviderExhausted",
    "ProviderUnavailable",
    "ReceiptError",
    "ReceiptStore",
    "Run",
    "RunFatal",
    "Tool",
    "ToolError",
    "http_tool",
    "last_run",
    "play",
    "secret",
    "tool",
]


def test_all_is_sorted() -> None:
    """__all__ is sorted (case-sensitive, like httpx's)."""
    assert pb.__all__ == sorted(pb.__all__)


def test_all_is_complete() -> None:
    """Every public attribute is in __all__, and every name in __all__ exists (the demo and the
    cluster's run are loaded when first used, and dir() lists them before)."""
    public = {
        name
        for name in dir(pb)
        if not name.startswith("_")
        and not (isinstance(getattr(pb, name), types.ModuleType) and name != "demo")
    }
    assert public == set(pb.__all__)
    assert all(getattr(pb, name) is not None for name in pb.__all__)


def test_a_plays_context_shows_what_a_play_uses() -> None:
    """``ctx`` shows the calls a play makes and who the row is; the runtime's bookkeeping is not on it."""
    public = {name for name in dir(pb.Context) if not name.startswith("_")}
    assert public == {
        "tool",
        "leg",
        "waterfall",
        "step",
        "sleep",
        "run_play",
        "log",
        "row_id",
        "run_id",
        "attempt",
    }


def test_a_receipt_store_shows_what_a_user_opens_reads_and_clears(tmp_path: Path) -> None:
    """``pb.ReceiptStore`` has where it is and the looking, clearing and closing; its hot path (lookups,
    commits, leases, memos) is on the engine behind it, which a user never holds."""
    public = {name for name in dir(pb.ReceiptStore) if not name.startswith("_")}
    assert public == {
        "location",
        "lost",
        "get",
        "receipts",
        "stats",
        "spend",
        "clear",
        "accept_loss",
        "close",
    }
    with pb.ReceiptStore(tmp_path / "store") as store:
        assert (
            store.stats()["receipts"] == 0
            and Path(store.location) == tmp_path / "store"
            and store.lost is None
        )
    assert repr(store) == f"ReceiptStore({str(tmp_path / 'store')!r})"


def _tools() -> dict[str, pb.Tool[object]]:
    """One tool of each kind a user makes."""

    @pb.tool
    def plain(domain: str) -> str:
        return domain

    @pb.tool(batch_size=8)
    def batch(items: list[str]) -> list[str]:
        return items

    http = pb.http_tool("http", method="GET", url="http://127.0.0.1:9/v1/{domain}")
    llm = pb.llm_tool("llm", model="m", base_url="http://127.0.0.1:9/v1", secret=None)
    return {"plain": plain, "batch": batch, "http": http, "llm": llm}


def test_a_tool_shows_what_its_user_calls() -> None:
    """Every kind of tool shows at most ten public names: its name, version, inputs, provider, cost,
    fingerprint and its kind's own few; what the pipeline asks of it (bind, address, price, invoke...)
    is on its engine, which a user never holds."""
    shown = {kind: {n for n in dir(t) if not n.startswith("_")} for kind, t in _tools().items()}
    common = {"name", "version", "inputs", "provider", "cost", "fingerprint"}
    assert shown == {
        "plain": common,
        "batch": common,
        "http": common | {"method", "url"},
        "llm": common | {"model"},
    }
    assert max(len(names) for names in shown.values()) <= 10


def test_tool_params_is_a_deprecated_spelling_of_inputs() -> None:
    """``tool.params`` still answers, with a DeprecationWarning naming ``tool.inputs``, and dir() does not list it."""
    for tool in _tools().values():
        with pytest.warns(DeprecationWarning, match=r"use tool\.inputs"):
            assert tool.params == tool.inputs  # type: ignore[attr-defined]
        assert "params" not in dir(tool)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _tools()["plain"].nothing  # type: ignore[attr-defined]  # noqa: B018


def test_what_a_tool_showed_before_still_answers_for_a_release() -> None:
    """A name a tool showed before its engine was its own (``tool.fn``, ``tool.bind``) still
    answers users, warning that it goes and what a tool shows; playbook's own probing does not see it."""
    plain = _tools()["plain"]
    with pytest.warns(DeprecationWarning, match=r"tool\.fn is no longer part of what a tool shows"):
        assert plain.fn is engine_of(plain).fn  # type: ignore[attr-defined]
    assert "fn" not in dir(plain)


def test_a_tool_is_made_from_an_engine() -> None:
    """``pb.Tool(...)`` given anything but a tool's engine says how tools are made."""
    with pytest.raises(pb.PlayDefinitionError, match=r"make a tool with @pb\.tool"):
        pb.Tool("direct")  # type: ignore[arg-type]


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
