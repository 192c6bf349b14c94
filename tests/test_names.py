"""One word per idea: each renamed name still works for one release, warning DeprecationWarning
with its new spelling, and no public name of the user's API uses a retired spelling otherwise."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pandas as pd
import pytest

import playbook as pb
from playbook import addresses
from playbook.frontends.signature import flags, given
from playbook.runtime.options import RENAMED, RunOptions, options

# Words that had a second meaning, or a second name for one idea (docs/reference.md, "Names").
RETIRED = {
    "key",
    "row_key",
    "held",
    "holds",
    "ProviderHold",
    "reset",
    "call",
    "force",
    "path",
    "records",
    "RunEvent",
}
# The old spellings kept one release as deprecated aliases: (owner, name).
ALIASES = {
    ("Context", "call"),
    ("Context", "row_key"),
    ("ReceiptStore", "path"),
    ("ReceiptStore", "records"),
    ("ReceiptStore", "reset"),
    ("RunStats", "held"),
    ("Run", "holds"),
    ("ClusterRun", "holds"),
    ("Receipt", "key"),
}
# Named otherwise on purpose: a fixture file's path is a file's path.
NOT_THIS_WORD = {("Fixtures", "path")}


@pb.tool(name="names.double")
def double(n: int) -> int:
    return n * 2


def _said(caught: pytest.WarningsRecorder, new: str) -> None:
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert messages and all("deprecated" in m and new in m for m in messages), messages


def test_the_run_option_key_is_id_columns(store: pb.ReceiptStore) -> None:
    """``key=`` still names the row id's columns, warning and naming ``id_columns=``; both at once is an error."""
    frame = pd.DataFrame({"id": [1, 1, 2], "n": [1, 5, 2]})

    @pb.play
    async def first(row, ctx):  # type: ignore[no-untyped-def]
        return {"d": await ctx.tool(double, n=row.n)}

    with pytest.warns(DeprecationWarning) as caught:
        old = frame.play.map(first, store=store, progress=False, key="id")  # type: ignore[call-arg]
    _said(caught, "id_columns=")
    new = frame.play.map(first, store=store, progress=False, id_columns="id")
    assert old["d"].tolist() == new["d"].tolist() == [2, 2, 4]  # rows agreeing on id are one row
    with pytest.raises(pb.PlayDefinitionError, match="pass only id_columns="):
        RunOptions.parse({"key": "id", "id_columns": "id"})


@pytest.mark.parametrize("surface", ["magic", "cli"])
def test_the_flag_key_is_id_columns(surface: str) -> None:
    """``--key`` is still read as ``--id-columns`` (unlisted), warning and naming ``--id-columns``."""
    parser = argparse.ArgumentParser()
    for flag, spelled in flags(surface):
        parser.add_argument(flag, **spelled)
    assert "--key" not in parser.format_help() and "--id-columns" in parser.format_help()
    with pytest.warns(DeprecationWarning) as caught:
        old = given(parser.parse_args(["--key", "a,b"]), surface)
    _said(caught, "--id-columns")
    assert old == given(parser.parse_args(["--id-columns", "a,b"]), surface) == {"id_columns": ["a", "b"]}


def test_ctx_row_key_call_and_force_are_row_id_leg_and_refresh(store: pb.ReceiptStore) -> None:
    """``ctx.row_key``, ``ctx.call()`` and ``force=`` still work, each warning with its new spelling."""
    seen: list[tuple[str, str]] = []

    @pb.play
    async def old(row, ctx):  # type: ignore[no-untyped-def]
        with pytest.warns(DeprecationWarning) as caught:
            seen.append((ctx.row_key, ctx.row_id))
        _said(caught, "ctx.row_id")
        with pytest.warns(DeprecationWarning) as caught:
            leg = ctx.call(double, n=row.n)
        _said(caught, "ctx.leg()")
        with pytest.warns(DeprecationWarning) as caught:
            fresh = await ctx.tool(double, n=row.n, force=True)
        _said(caught, "refresh=")
        return {"w": await ctx.waterfall("w", [leg]), "f": fresh}

    out = pd.DataFrame({"n": [3]}).play.map(old, store=store, progress=False, on_error="raise")
    assert out[["w", "f"]].values.tolist() == [[6, 6]]
    assert seen[0][0] == seen[0][1] == addresses.row_id([3])


def test_receipt_store_reset_path_and_records(tmp_path: Path) -> None:
    """``reset()``, ``path`` and ``records()`` still work, naming ``accept_loss()``, ``location`` and ``receipts()``."""
    with pb.ReceiptStore(tmp_path / "s") as store:
        pd.DataFrame({"n": [1]}).play.map(double, store=store, progress=False)
        with pytest.warns(DeprecationWarning) as caught:
            store.reset()
        _said(caught, "ReceiptStore.accept_loss()")
        with pytest.warns(DeprecationWarning) as caught:
            assert str(store.path) == store.location
        _said(caught, "ReceiptStore.location")
        with pytest.warns(DeprecationWarning) as caught:
            old = [key for key, _ in store.records()]
        _said(caught, "ReceiptStore.receipts()")
        # records() gave pairs and receipts() is a frame: the message says the loop to write.
        assert "for r in store.receipts().itertuples(): r.address, r.output" in str(caught[0].message)
        assert [(r.address, r.output) for r in store.receipts().itertuples()] == [(old[0], 2)]


def test_waterfall_and_step_take_name_for_key(store: pb.ReceiptStore) -> None:
    """``ctx.waterfall(key=...)`` and ``ctx.step(key=...)`` still work, naming ``name=``."""

    @pb.play
    async def old(row, ctx):  # type: ignore[no-untyped-def]
        with pytest.warns(DeprecationWarning) as caught:
            found = await ctx.waterfall(key="w", legs=[ctx.leg(double, n=row.n)])
        _said(caught, "ctx.waterfall(..., name=)")
        with pytest.warns(DeprecationWarning) as caught:
            kept = await ctx.step(key="s", fn=lambda: 7)
        _said(caught, "ctx.step(..., name=)")
        return {"w": found, "s": kept}

    out = pd.DataFrame({"n": [4]}).play.map(old, store=store, progress=False, on_error="raise")
    assert out[["w", "s"]].values.tolist() == [[8, 7]]


@pytest.mark.parametrize("spelled", ["keyword", "position"])
def test_a_renamed_keyword_and_its_new_name_at_once_is_a_type_error(
    store: pb.ReceiptStore, spelled: str
) -> None:
    """``key=`` with ``name`` (by keyword or by position) on ``ctx.waterfall``/``ctx.step``, and
    ``force=`` with ``refresh=`` on ``ctx.tool``/``ctx.leg``, is a TypeError naming both."""
    raised: list[str] = []

    @pb.play
    async def both(row, ctx):  # type: ignore[no-untyped-def]
        legs = [ctx.leg(double, n=row.n)]
        calls = [
            lambda: ctx.waterfall(name="w", legs=legs, key="w"),
            lambda: ctx.step(name="s", fn=lambda: 1, key="s"),
            lambda: ctx.tool(double, n=row.n, force=True, refresh=False),
            lambda: ctx.leg(double, n=row.n, force=False, refresh=True),
        ]
        if spelled == "position":
            calls[:2] = [lambda: ctx.waterfall("w", legs, key="w"), lambda: ctx.step("s", lambda: 1, key="s")]
        for call in calls:
            with pytest.raises(TypeError) as caught:
                call()
            raised.append(str(caught.value))
        return {"ok": 1}

    pd.DataFrame({"n": [1]}).play.map(both, store=store, progress=False, on_error="raise")
    assert len(raised) == 4
    assert all("key=" in m and "name=" in m for m in raised[:2]), raised
    assert all("force=" in m and "refresh=" in m and "pass only refresh=" in m for m in raised[2:]), raised


def test_provider_hold_and_run_holds_are_provider_wait_and_waiting_on(store: pb.ReceiptStore) -> None:
    """``pb.ProviderHold`` and ``run.holds`` still answer, naming ``pb.ProviderWait`` and ``Run.waiting_on``."""
    with pytest.warns(DeprecationWarning) as caught:
        assert pb.ProviderHold is pb.ProviderWait
    _said(caught, "pb.ProviderWait")
    run = pd.DataFrame({"n": [1]}).play.run(double, store=store, progress=False)
    with pytest.warns(DeprecationWarning) as caught:
        assert run.holds == run.waiting_on == []
    _said(caught, "Run.waiting_on")


def test_store_stats_path_is_location(store: pb.ReceiptStore) -> None:
    """``store.stats()["path"]``, ``.get("path")`` and ``"path" in`` still answer as before, naming
    ``location``; the old key is not listed."""
    stats = store.stats()
    assert "path" not in list(stats) and stats["location"] == store.location
    with pytest.warns(DeprecationWarning) as caught:
        assert stats["path"] == stats.get("path") == store.location  # type: ignore[typeddict-item]
    _said(caught, "ReceiptStore.stats()['location']")
    with pytest.warns(DeprecationWarning) as caught:
        assert "path" in stats
    _said(caught, "'location' in ReceiptStore.stats()")
    with pytest.raises(KeyError):
        stats["nothing"]  # type: ignore[typeddict-item]
    assert stats.get("nothing") is None and "nothing" not in stats


def test_a_receipts_key_is_its_address(store: pb.ReceiptStore) -> None:
    """``Receipt.key`` still reads, naming ``Receipt.address``; the receipts frame's column is ``address``."""
    pd.DataFrame({"n": [2]}).play.map(double, store=store, progress=False)
    receipt = store.get(double, n=2)
    assert receipt is not None and list(store.receipts()["address"]) == [receipt.address]
    with pytest.warns(DeprecationWarning) as caught:
        assert receipt.key == receipt.address
    _said(caught, "Receipt.address")


def test_run_stats_held_is_waiting() -> None:
    """``RunStats.held`` still reads the rows waiting, naming ``RunStats.waiting``."""
    stats = pb.RunStats(waiting=3)
    with pytest.warns(DeprecationWarning) as caught:
        assert stats.held == 3
    _said(caught, "RunStats.waiting")


def test_row_key_and_run_event_are_row_id_and_event() -> None:
    """``playbook.addresses.row_key`` and ``reading.RunEvent`` still answer, naming their new names."""
    from playbook.events import Event
    from playbook.runtime.state import reading

    with pytest.warns(DeprecationWarning) as caught:
        assert addresses.row_key([1, "a"]) == addresses.row_id([1, "a"])
    _said(caught, "row_id()")
    with pytest.warns(DeprecationWarning) as caught:
        assert reading.RunEvent is Event
    _said(caught, "playbook.events.Event")


def test_a_deprecation_points_at_the_users_line(store: pb.ReceiptStore) -> None:
    """The warning is attributed to the line that used the old name, not to playbook's insides,
    so Python and IPython show it (they show DeprecationWarnings of ``__main__`` only)."""
    with pytest.warns(DeprecationWarning) as caught:
        pd.DataFrame({"n": [1]}).play.map(double, store=store, progress=False, key="n")  # type: ignore[call-arg]
    assert {Path(w.filename).name for w in caught} == {Path(__file__).name}


def _public(thing: object) -> set[str]:
    return {name for name in dir(thing) if not name.startswith("_")}


def test_no_public_name_uses_a_retired_spelling() -> None:
    """pb.__all__'s objects, Context, Run, RunStats, ReceiptStore and the run options name nothing
    with a retired word: the deprecated aliases are not in their ``dir()`` (nor tab completion)."""
    owners: dict[str, object] = {name: getattr(pb, name) for name in pb.__all__}
    assert "ProviderHold" not in dir(pb)  # the alias answers, but is not listed
    found = set()
    for owner, thing in owners.items():
        if owner in RETIRED:
            found.add(("pb", owner))
        if inspect.isclass(thing) and not issubclass(thing, BaseException):
            fields = set(getattr(thing, "model_fields", {}))
            found |= {(owner, name) for name in (_public(thing) | fields) & RETIRED}
            for name in ("__init__", "__call__"):
                found |= {
                    (owner, p) for p in inspect.signature(getattr(thing, name)).parameters if p in RETIRED
                }
    found |= {("RunOptions", f.name) for f in options() if f.name in RETIRED}
    for method in ("tool", "leg", "waterfall", "step", "sleep", "run_play"):
        parameters = inspect.signature(getattr(pb.Context, method)).parameters
        found |= {(f"Context.{method}", p) for p in parameters if p in RETIRED}
    found |= {("map", p) for p in inspect.signature(pd.DataFrame({}).play.map).parameters if p in RETIRED}
    assert found == NOT_THIS_WORD
    assert set(RENAMED) <= RETIRED


def test_a_deprecated_alias_answers_but_is_not_listed(store: pb.ReceiptStore) -> None:
    """Each deprecated alias of an object's attribute still answers, warning, while ``dir()`` of
    the object (what tab completion offers) leaves it out; a misspelt name is still an AttributeError."""
    seen: dict[str, object] = {}

    @pb.play
    async def play(row, ctx):  # type: ignore[no-untyped-def]
        seen["Context"] = ctx
        return {"d": await ctx.tool(double, n=row.n)}

    run = pd.DataFrame({"n": [1]}).play.run(play, store=store, progress=False)
    seen |= {"Run": run, "RunStats": run.stats, "ReceiptStore": store, "Receipt": store.get(double, n=1)}
    cluster = {("ClusterRun", "holds")}  # a cluster's run: its class's dir() in the sweep above
    assert {owner for owner, _ in ALIASES - cluster} == set(seen)
    for owner, name in ALIASES - cluster:
        assert name not in dir(seen[owner]), (owner, name)
        with pytest.warns(DeprecationWarning):
            assert getattr(seen[owner], name) is not None, (owner, name)
    with pytest.raises(AttributeError, match="row_kye"):
        getattr(seen["Context"], "row_kye")  # noqa: B009 (the name is the point)
