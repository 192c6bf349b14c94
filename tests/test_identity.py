"""Tool identity: an edited tool is a new tool (its receipts and the memos of rows that used it no
longer answer); a pinned version keeps receipts across edits; an HTTP tool's receipts answer for the
request as sent, with ``pick`` applied when read."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import warm

import playbook as pb

SITES = pd.DataFrame({"website": ["https://www.acme.com/about", "http://blue.io", "https://www.cedar.org"]})


def test_editing_an_unpinned_tool_pays_for_the_new_answers(store: pb.ReceiptStore) -> None:
    """Fix a bug in a tool without version= and rerun: the rows run again and the tool is called afresh,
    so the old, wrong values never come back."""
    calls: list[str] = []

    @pb.tool
    def clean_domain(url: str) -> str:
        calls.append(url)
        return url.split("//")[-1].split("/")[0]

    @pb.play
    async def enrich(row, ctx):
        return {"domain": await ctx.tool(clean_domain, url=row.website)}

    assert SITES.play.map(enrich, store=store, progress=False)["domain"].tolist() == [
        "www.acme.com",
        "blue.io",
        "www.cedar.org",
    ]

    @pb.tool
    def clean_domain(url: str) -> str:  # noqa: F811 - the user's fix, in the same kernel
        calls.append(url)
        return url.split("//")[-1].split("/")[0].removeprefix("www.")

    out = SITES.play.map(enrich, store=store, progress=False)
    assert (
        out["domain"].tolist() == ["acme.com", "blue.io", "cedar.org"]
        and out["play_status"].tolist() == ["ok"] * 3
    )
    assert len(calls) == 6


def test_a_cosmetic_edit_keeps_the_receipts(store: pb.ReceiptStore) -> None:
    """Reformatting a tool, or editing its comments and docstring, changes nothing it computes: no call is paid again."""
    calls: list[str] = []

    @pb.tool
    def shout(q: str) -> str:
        calls.append(q)
        return q.upper()

    pd.DataFrame({"q": ["a", "b"]}).play.map(shout, store=store, progress=False)

    @pb.tool
    def shout(q: str) -> str:
        """Louder."""
        calls.append(q)  # counted
        return q.upper()

    assert (
        pd.DataFrame({"q": ["a", "b"]}).play.map(shout, store=store, progress=False)["play_status"].tolist()
        == ["reused"] * 2
    )
    assert calls == ["a", "b"]


def test_a_pinned_version_keeps_receipts_across_edits_until_it_changes(store: pb.ReceiptStore) -> None:
    """With version= the user decides: an edit reuses the receipts; a new version pays again."""
    calls: list[str] = []

    def make(version: str, suffix: str) -> pb.Tool:
        @pb.tool(name="label", version=version)
        def label(q: str) -> str:
            calls.append(q)
            return q + suffix

        return label

    frame = pd.DataFrame({"q": ["a", "b"]})
    assert frame.play.map(make("1", "!"), store=store, progress=False)["label"].tolist() == ["a!", "b!"]
    assert frame.play.map(make("1", "?"), store=store, progress=False, refresh="rows")["label"].tolist() == [
        "a!",
        "b!",
    ]
    assert sorted(calls) == ["a", "b"]  # (a tool that is a plain function runs in a thread: in any order)
    assert frame.play.map(make("2", "?"), store=store, progress=False)["label"].tolist() == ["a?", "b?"]
    assert sorted(calls[2:]) == ["a", "b"]


def test_a_tool_closing_over_a_setting_is_a_new_tool_per_setting(store: pb.ReceiptStore) -> None:
    """Two tools made by one factory with different plain settings (a model name) do not share receipts."""

    def classifier(model: str) -> pb.Tool:
        @pb.tool(name="classify")
        def classify(text: str) -> str:
            return f"{model}:{text}"

        return classify

    frame = pd.DataFrame({"text": ["x"]})
    assert frame.play.map(classifier("small"), store=store, progress=False)["classify"].tolist() == [
        "small:x"
    ]
    assert frame.play.map(classifier("large"), store=store, progress=False)["classify"].tolist() == [
        "large:x"
    ]


def _python(*args: str, code: str | None = None, cwd: Path | None = None) -> str:
    """What ``python *args`` (or ``python -c code *args``) printed, in a process of its own started
    warm (tests/warm.py): a new interpreter state, without importing pandas anew."""
    proc = warm.start(None if code is not None else args[0], *args[code is None :], code=code, cwd=cwd)
    out, err = proc.communicate(60)
    assert proc.wait() == 0, err
    return out


def test_an_edit_in_a_file_is_a_new_tool_in_the_next_process(tmp_path: Path) -> None:
    """Edit a tool in a module and run again in a new process: the edited tool pays, the untouched one does not."""
    module = tmp_path / "plays.py"
    script = textwrap.dedent(f"""
        import json, sys
        sys.dont_write_bytecode = True  # a .pyc of the same second and size would hide the edit
        sys.path.insert(0, {str(tmp_path)!r})
        import pandas as pd, playbook as pb
        from plays import enrich
        run = pd.DataFrame({{"q": ["a", "b", "c"]}}).play.run(enrich, store={str(tmp_path / "store")!r}, progress=False)
        print(json.dumps([run.stats.calls_local, run.result["out"].tolist()]))
    """)
    source = textwrap.dedent("""
        import playbook as pb

        @pb.tool
        def first(q: str) -> str:
            return q.upper()

        @pb.tool
        def second(q: str) -> str:
            return q + "!"

        @pb.play
        async def enrich(row, ctx):
            return {"out": await ctx.tool(second, q=await ctx.tool(first, q=row.q))}
    """)

    def run() -> list:
        out = _python(code=script)
        import json

        return json.loads(out.strip().splitlines()[-1])

    module.write_text(source)
    assert run() == [6, ["A!", "B!", "C!"]]
    assert run() == [0, ["A!", "B!", "C!"]]
    module.write_text(source.replace('return q + "!"', 'return q + "?"'))
    assert run() == [3, ["A?", "B?", "C?"]]  # only the edited tool pays


def test_changing_pick_costs_nothing_and_is_right(store: pb.ReceiptStore, demo: pb.demo.DemoServer) -> None:
    """The receipt holds the whole answer: a new pick reads another field of it without a request."""
    frame = pd.DataFrame({"domain": ["acme.com", "blue.io", "cedar.org"], "first": ["Ann", "Bob", "Cy"]})
    emails = frame.play.map(pb.demo.email_tool(demo, name="acme.email"), store=store, progress=False)
    sent = demo.stats()["requests"]
    confidence = frame.play.map(
        pb.demo.email_tool(demo, name="acme.email", pick="confidence"), store=store, progress=False
    )
    assert demo.stats()["requests"] == sent  # nothing sent
    found = emails["acme.email"].notna()
    assert confidence["acme.email"][found].map(lambda v: isinstance(v, float) and 0 <= v <= 1).all()
    assert not confidence["acme.email"][found].astype(str).str.contains("@").any()  # not the emails any more


def test_changing_the_request_pays_once_and_rotating_the_key_pays_nothing(
    store: pb.ReceiptStore, demo: pb.demo.DemoServer, monkeypatch
) -> None:
    """Another model in the body or another URL is another request: paid once.  A new API key is the same request."""
    monkeypatch.setenv("CHAT_KEY", "demo-key")

    def chat(model: str, url: str = "/v1/chat/completions") -> pb.Tool:
        return pb.http_tool(
            "chat",
            method="POST",
            url=demo.url + url,
            json={"model": model, "messages": [{"role": "user", "content": "{q}"}]},
            headers={"Authorization": "Bearer {secret}"},
            secret=pb.secret("CHAT_KEY"),
            pick="choices.0.message.content",
        )

    frame = pd.DataFrame({"q": ["hello", "world"]})
    frame.play.map(chat("demo-1"), store=store, progress=False)
    assert demo.stats()["requests"] == 2
    frame.play.map(chat("demo-2"), store=store, progress=False)
    assert demo.stats()["requests"] == 4
    monkeypatch.setenv("CHAT_KEY", "demo-key-2")
    demo.reset(api_keys=("demo-key-2",))
    rotated = frame.play.map(chat("demo-2"), store=store, progress=False, refresh="rows")
    assert demo.stats()["requests"] == 0 and rotated["play_status"].tolist() == ["ok", "ok"]


def test_a_callable_object_or_a_lambda_is_the_same_tool_in_the_next_process(tmp_path: Path) -> None:
    """A tool made of an object with __call__, or of a lambda, is identified by its code, not by
    where it lives in memory: the next process reuses its receipts; two lambdas on one line differ."""
    (tmp_path / "shapes.py").write_text(
        textwrap.dedent("""
        import playbook as pb

        class Scorer:
            def __call__(self, q: str) -> int:
                return len(q)

        score = pb.tool(Scorer(), name="score")
        up, down = pb.tool(lambda q: q.upper(), name="case"), pb.tool(lambda q: q.lower(), name="case")
    """)
    )
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import pandas as pd, playbook as pb
        from shapes import score, up, down
        store = pb.ReceiptStore({str(tmp_path / "store")!r})
        frame = pd.DataFrame({{"q": ["Ab", "cD"]}})
        runs = [frame.play.run(t, store=store, progress=False) for t in (score, up, down)]
        print(json.dumps([[r.stats.calls_local, r.result.iloc[:, 1].tolist()] for r in runs]))
    """)

    def run() -> list:
        out = _python(code=script)
        import json

        return json.loads(out.strip().splitlines()[-1])

    assert run() == [[2, [2, 2]], [2, ["AB", "CD"]], [2, ["ab", "cd"]]]
    assert run() == [[0, [2, 2]], [0, ["AB", "CD"]], [0, ["ab", "cd"]]]


def test_a_cosmetic_edit_of_a_play_reuses_its_rows(store: pb.ReceiptStore) -> None:
    """A play is identified by its code as a tool is: reformatting or commenting it reuses its rows."""

    @pb.play
    async def tidy(row, ctx):
        return {"double": row.n * 2}

    frame = pd.DataFrame({"n": [1, 2]})
    frame.play.map(tidy, store=store, progress=False)

    @pb.play
    async def tidy(row, ctx):
        """Doubles."""
        return {"double": (row.n * 2)}  # twice

    assert frame.play.map(tidy, store=store, progress=False)["play_status"].tolist() == ["reused"] * 2


def test_plays_made_by_one_factory_around_different_tools_are_different_plays(tmp_path: Path) -> None:
    """A tool a play closes over counts by its fingerprint: the play made around another tool reuses no row memo of the first."""

    @pb.tool(version="1")
    def upper(text: str) -> str:
        return text.upper()

    @pb.tool(version="1")
    def lower(text: str) -> str:
        return text.lower()

    def play_for(tool: pb.Tool) -> pb.Play:
        async def shout(row: Any, ctx: pb.Context) -> Any:
            return await ctx.tool(tool, text=row["text"])

        return pb.play(shout)

    frame = pd.DataFrame({"text": ["Hello", "World"]})
    first = frame.play.map(play_for(upper), store=str(tmp_path), progress=False)
    second = frame.play.map(play_for(lower), store=str(tmp_path), progress=False)
    assert list(first.shout) == ["HELLO", "WORLD"] and list(second.shout) == ["hello", "world"]
    assert list(second.play_status) == ["ok", "ok"]


def test_a_play_pointed_at_a_renamed_tool_runs_its_rows_again(store: pb.ReceiptStore) -> None:
    """Notebook cells share one namespace: renaming and changing the tool in its cell, without running
    the play's cell again, gives the new tool's values, not the old tool's rows; running the tool's
    cell again unchanged reuses every row."""
    cells: dict[str, Any] = {"pb": pb}
    tool_cell = """
@pb.tool(name={name!r}, version="1")
async def enrich(x: int) -> int:
    return x * {factor}
"""
    exec(tool_cell.format(name="enrich", factor=2), cells)
    exec("@pb.play\nasync def doubled(row, ctx):\n    return {'y': await ctx.tool(enrich, x=row.x)}\n", cells)
    frame = pd.DataFrame({"x": [1, 2, 3]})

    def run() -> pd.DataFrame:
        return frame.play.map(cells["doubled"], store=store, progress=False)

    assert run()["y"].tolist() == [2, 4, 6]
    exec(tool_cell.format(name="enrich", factor=2), cells)
    assert run()["play_status"].tolist() == ["reused"] * 3
    exec(tool_cell.format(name="enrich_v2", factor=100), cells)
    out = run()
    assert out["y"].tolist() == [100, 200, 300] and out["play_status"].tolist() == ["ok"] * 3
    assert run()["play_status"].tolist() == ["reused"] * 3


def test_a_play_calling_a_tool_through_a_helper_runs_its_rows_again_when_the_helper_or_its_tool_changes(
    store: pb.ReceiptStore,
) -> None:
    """A helper of the notebook's own that makes the call is part of the play: editing it, or renaming
    the tool it calls, runs the rows again; running its cell again unchanged reuses them."""
    cells: dict[str, Any] = {"pb": pb}
    tool_cell = (
        '@pb.tool(name={name!r}, version="1")\nasync def enrich(x: int) -> int:\n    return x * {factor}\n'
    )
    helper_cell = "async def fetch(ctx, x):\n    return {{'y': await ctx.tool(enrich, x=x){extra}}}\n"
    exec(tool_cell.format(name="enrich", factor=2), cells)
    exec(helper_cell.format(extra=""), cells)
    exec("@pb.play\nasync def via_helper(row, ctx):\n    return await fetch(ctx, row.x)\n", cells)
    frame = pd.DataFrame({"x": [1, 2, 3]})

    def run() -> pd.DataFrame:
        return frame.play.map(cells["via_helper"], store=store, progress=False)

    assert run()["y"].tolist() == [2, 4, 6]
    exec(helper_cell.format(extra=""), cells)
    assert run()["play_status"].tolist() == ["reused"] * 3
    exec(helper_cell.format(extra=" + 1"), cells)
    out = run()
    assert out["y"].tolist() == [3, 5, 7] and out["play_status"].tolist() == ["ok"] * 3
    exec(tool_cell.format(name="enrich_v2", factor=100), cells)
    out = run()
    assert out["y"].tolist() == [101, 201, 301] and out["play_status"].tolist() == ["ok"] * 3
    assert run()["play_status"].tolist() == ["reused"] * 3


def test_a_play_that_runs_itself_keeps_one_fingerprint(store: pb.ReceiptStore) -> None:
    """A play naming itself (it runs itself as a sub-play) is not a tool it reaches: its rows are reused."""
    cells: dict[str, Any] = {"pb": pb}
    play_cell = (
        "@pb.play\nasync def countdown(row, ctx):\n"
        "    return {'n': 0 if row.n <= 0 else (await ctx.run_play(countdown, n=row.n - 1))['n'] + 1}\n"
    )
    exec(play_cell, cells)
    exec(play_cell, cells)  # the cell run twice: the name held the first play when the second was made
    frame = pd.DataFrame({"n": [2, 3]})
    assert frame.play.map(cells["countdown"], store=store, progress=False)["n"].tolist() == [2, 3]
    assert (
        frame.play.map(cells["countdown"], store=store, progress=False)["play_status"].tolist()
        == ["reused"] * 2
    )


def test_a_play_sent_to_another_process_keeps_its_fingerprint_with_its_helpers(tmp_path: Path) -> None:
    """A play and the helper it calls, pickled as Dask sends them to a worker (which has no source for
    them), have the fingerprint they had where they were made: a rerun on another engine reuses the rows."""
    (tmp_path / "plays.py").write_text(
        textwrap.dedent("""
        import sys
        import cloudpickle
        import playbook as pb

        @pb.tool(name="enrich", version="1")
        async def enrich(x: int) -> int:
            return x * 2

        async def fetch(ctx, x):
            return {"y": await ctx.tool(enrich, x=x)}  # a helper of the script's own

        @pb.play
        async def via_helper(row, ctx):
            return await fetch(ctx, row.x)

        open(sys.argv[1], "wb").write(cloudpickle.dumps(via_helper))
        print(via_helper.fingerprint)
        """)
    )
    load = "import pickle, sys; from playbook.plays.play import as_play; print(as_play(pickle.load(open(sys.argv[1], 'rb'))).fingerprint)"
    sent = str(tmp_path / "play.pkl")

    made = _python(str(tmp_path / "plays.py"), sent, cwd=tmp_path).strip()
    (tmp_path / "plays.py").unlink()  # as on a worker: no source to read
    assert _python(sent, code=load, cwd=tmp_path).strip() == made
