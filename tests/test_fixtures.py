"""Fixtures: every tool answer recorded to a sorted JSON Lines file, replayed with no network and
no pacing; a call the file lacks fails its row naming the tool and its input."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import playbook as pb

LEADS = pd.DataFrame(
    {"domain": ["acme.com", "globex.com", "initech.com", "umbrella.com"], "first": ["Ann", "Bob", "Cy", "Di"]}
)


def _email_tool(demo: Any, provider: pb.Provider | None = None) -> pb.Tool:
    return pb.http_tool(
        "demo.email",
        provider=provider,
        method="GET",
        url=demo.url + "/v1/email",
        params={"domain": "{domain}", "first": "{first}"},
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret("DEMO_API_KEY", default="demo-key"),
        pick="email",
        miss_status=(404,),
        cost=1.0,
    )


def _enrich(tool: pb.Tool) -> pb.Play:
    @pb.play(name="enrich")
    async def enrich(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"email": await ctx.tool(tool, domain=row.domain, first=row.first)}

    return enrich


def test_record_then_replay_without_the_server(tmp_path: Path) -> None:
    """A run recorded against a live provider replays the same result after the provider is gone,
    counting its calls as the recorded run paid them, then as reused on a rerun."""
    path = tmp_path / "fx.jsonl"
    with pb.demo.serve() as demo:
        enrich = _enrich(_email_tool(demo))
        with pb.fixtures(path, mode="record"):
            live = LEADS.play.map(enrich, store=tmp_path / "s", progress=False)
        paid = demo.stats()["requests"]
    assert paid == len(LEADS)
    replayed = LEADS.play.map(enrich, fixtures=path, progress=False)
    pd.testing.assert_frame_equal(replayed, live)
    first = pb.last_run().stats
    assert (first.ok, first.calls_executed, first.cost_spent) == (4, 4, 4.0)
    again = LEADS.play.map(enrich, fixtures=path, progress=False)
    pd.testing.assert_frame_equal(again.drop(columns="play_status"), live.drop(columns="play_status"))
    assert list(again.play_status) == ["reused"] * 4


def test_replay_sends_nothing_and_is_not_paced(demo: Any, tmp_path: Path) -> None:
    """Replayed calls reach neither the server nor the provider's limits: a provider allowing one
    call an hour (and no wait) would park all rows but the first."""
    path = tmp_path / "fx.jsonl"
    enrich = _enrich(_email_tool(demo))
    LEADS.play.map(enrich, fixtures=pb.fixtures(path, mode="record"), store=tmp_path / "s", progress=False)
    before = demo.stats()["requests"]
    slow = pb.Provider("slow", rps=1 / 3600, burst=1, max_wait=0)
    out = LEADS.play.map(_enrich(_email_tool(demo, slow)), fixtures=path, progress=False)
    assert list(out.play_status) == ["ok"] * 4
    assert demo.stats()["requests"] == before
    assert pb.last_run().waiting_on == []


def test_a_call_missing_from_the_file_fails_its_row(demo: Any, tmp_path: Path) -> None:
    """A call the fixtures lack fails only its row, naming the tool, the input and how to record it."""
    path = tmp_path / "fx.jsonl"
    enrich = _enrich(_email_tool(demo))
    LEADS.head(2).play.map(
        enrich, fixtures=pb.fixtures(path, mode="record"), store=tmp_path / "s", progress=False
    )
    out = LEADS.play.map(enrich, fixtures=path, progress=False)
    assert list(out.play_status) == ["ok", "ok", "failed", "failed"]
    error = out.play_error[2]
    assert "'demo.email'" in error and "initech.com" in error and "mode='record'" in error


def test_the_file_is_sorted_reviewable_and_holds_no_secret(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One JSON line per call, sorted by tool and input; the key the tool sent, even one passed
    as an input by mistake, is masked."""
    monkeypatch.setenv("DEMO_API_KEY", "demo-key")
    path = tmp_path / "fx.jsonl"
    leaky = pb.tool(lambda domain, token: {"domain": domain, "echo": token}, name="leaky", version="1")

    @pb.play
    async def enrich(row: Any, ctx: pb.Context) -> dict[str, Any]:
        email = await ctx.tool(_email_tool(demo), domain=row.domain, first=row.first)
        return {"email": email, "leak": await ctx.tool(leaky, domain=row.domain, token="demo-key")}

    LEADS.iloc[::-1].play.map(
        enrich, fixtures=pb.fixtures(path, mode="record"), store=tmp_path / "s", progress=False
    )
    text = path.read_text()
    assert "demo-key" not in text
    entries = [json.loads(line) for line in text.splitlines()]
    assert [(e["tool"], e["input"]["domain"]) for e in entries] == sorted(
        (e["tool"], e["input"]["domain"]) for e in entries
    )
    assert {e["tool"] for e in entries} == {"demo.email", "leaky"} and len(entries) == 8
    assert set(entries[0]) == {"tool", "input", "output", "miss", "cost"}


def test_recording_a_warm_store_records_reused_calls(demo: Any, tmp_path: Path) -> None:
    """Recording over rows already finished in the store runs them from their receipts: every
    answer reaches the file and nothing is paid again."""
    enrich = _enrich(_email_tool(demo))
    LEADS.play.map(enrich, store=tmp_path / "s", progress=False)
    paid = demo.stats()["requests"]
    path = tmp_path / "fx.jsonl"
    with pb.fixtures(path, mode="record"):
        LEADS.play.map(enrich, store=tmp_path / "s", progress=False)
    assert demo.stats()["requests"] == paid
    assert len(path.read_text().splitlines()) == len(LEADS)


def test_recordings_merge_into_one_file(demo: Any, tmp_path: Path) -> None:
    """Recording another part of a frame adds its answers to the file; what it held stays."""
    path = tmp_path / "fx.jsonl"
    enrich = _enrich(_email_tool(demo))
    LEADS.head(2).play.map(
        enrich, fixtures=pb.fixtures(path, mode="record"), store=tmp_path / "s", progress=False
    )
    LEADS.tail(2).play.map(
        enrich, fixtures=pb.fixtures(path, mode="record"), store=tmp_path / "s", progress=False
    )
    assert len(path.read_text().splitlines()) == 4
    assert list(LEADS.play.map(enrich, fixtures=path, progress=False).play_status) == ["ok"] * 4


def test_odd_values_replay_exactly(tmp_path: Path) -> None:
    """Datetimes, Decimals, tuples, NaN and None come back from fixtures with their types; an
    input recorded as 3 answers 3.0 (pandas makes int columns float when a NaN appears)."""

    @pb.tool(version="1")
    def odd(n: int) -> Any:
        if n == 2:
            return None
        return {
            "at": dt.datetime(2024, 5, n + 1, 9, 30, tzinfo=dt.UTC),
            "d": decimal.Decimal("1.50"),
            "t": (n, "x"),
            "nan": float("nan"),
        }

    @pb.play
    async def p(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"v": await ctx.tool(odd, n=row.n)}

    path = tmp_path / "fx.jsonl"
    live = pd.DataFrame({"n": [0, 1, 2]}).play.map(
        p, fixtures=pb.fixtures(path, mode="record"), store=tmp_path / "s", progress=False
    )
    again = pd.DataFrame({"n": [0.0, 1.0, 2.0]}).play.map(p, fixtures=path, progress=False)
    for a, b in zip(live.v, again.v):
        if a is None:
            assert b is None
            continue
        assert {k: type(v) for k, v in a.items()} == {k: type(v) for k, v in b.items()}
        assert (a["at"], a["d"], a["t"]) == (b["at"], b["d"], b["t"]) and b["nan"] != b["nan"]


def test_where_fixtures_come_from(demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run replays its own fixtures=, else the ``with pb.fixtures()`` around it, else
    $PLAYBOOK_FIXTURES; a replay keeps nothing in the project's store."""
    path = tmp_path / "fx.jsonl"
    enrich = _enrich(_email_tool(demo))
    LEADS.play.map(enrich, fixtures=pb.fixtures(path, mode="record"), store=tmp_path / "s", progress=False)
    before = demo.stats()["requests"]
    with pb.fixtures(path):
        LEADS.play.map(enrich, progress=False)
    monkeypatch.setenv("PLAYBOOK_FIXTURES", str(path))
    LEADS.play.map(enrich, progress=False)
    assert pb.last_run().stats.ok + pb.last_run().stats.reused == 4
    assert demo.stats()["requests"] == before
    assert pb.ReceiptStore().stats()["row_memos"] == 0


def test_bad_fixtures_are_named(tmp_path: Path) -> None:
    """A missing file, an unknown mode, a value that is no path, and a damaged line each say what is wrong."""
    with pytest.raises(pb.PlayDefinitionError, match="no such file.*mode='record'"):
        pb.fixtures(tmp_path / "nope.jsonl")
    with pytest.raises(pb.PlayDefinitionError, match="mode must be 'replay' or 'record'"):
        pb.fixtures(tmp_path / "x.jsonl", mode="write")  # type: ignore[arg-type]
    frame = pd.DataFrame({"n": [1]})

    @pb.play
    async def play(row: Any, ctx: pb.Context) -> None:
        return None

    with pytest.raises(pb.PlayDefinitionError, match="fixtures must be a fixture file's path"):
        frame.play.map(play, fixtures=42, progress=False)  # type: ignore[arg-type]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tool": "t", "input": {"n": 1}, "output": 1, "miss": false, "cost": 0}\n{"tool": "t"\n')
    with pytest.raises(pb.PlayDefinitionError, match="line 2"):
        frame.play.map(play, fixtures=bad, progress=False)


def test_a_replay_into_a_named_store_leaves_receipts(demo: Any, tmp_path: Path) -> None:
    """Replayed into a store the run names, answers become receipts there, as a provider's would,
    and a rerun on that store reuses its rows."""
    path = tmp_path / "fx.jsonl"
    enrich = _enrich(_email_tool(demo))
    LEADS.play.map(enrich, fixtures=pb.fixtures(path, mode="record"), store=tmp_path / "live", progress=False)
    named = pb.ReceiptStore(tmp_path / "named")
    LEADS.play.map(enrich, fixtures=path, store=named, progress=False)
    assert pb.last_run().stats.calls_executed == 4
    assert named.stats()["by_tool"] == {"demo.email": 4}
    LEADS.play.map(enrich, fixtures=path, store=named, progress=False)
    assert pb.last_run().stats.reused == 4
