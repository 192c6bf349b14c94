"""A play's fingerprint covers the values it reads from outside its code (module and notebook
globals, closure cells, class attributes, environment variables, frames, and those read by the
helpers it calls): a rerun after one changes pays for the changed calls and returns the new values;
a value with no stable form is said once per run; a play that reads nothing keeps its fingerprint."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import functools
import importlib
import operator
import pickle
import re
import sys
import textwrap
import types
import uuid
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pandas as pd
import polars as pl
import pydantic
import pytest

import playbook as pb
from playbook.addresses import code_fingerprint, digest
from playbook.ui.tally import Tally
from playbook.ui.text import summary


def _label_tool() -> pb.Tool:
    """A paid tool answering with what it was asked (a new prompt is a new call)."""

    @pb.tool(name=f"label-{uuid.uuid4().hex[:6]}", version="1", cost=0.01)
    def label(prompt: str) -> str:
        return prompt.upper()

    return label


def _run(play: Any, store: pb.ReceiptStore, companies: tuple[str, ...] = ("acme", "zeta")) -> Any:
    return pd.DataFrame({"company": list(companies)}).play.run(play, store=store, progress=False)


def _reran_with(run: Any, answers: list[str]) -> None:
    """The rerun paid for each changed call and returned the new answers."""
    assert run.result["play_status"].tolist() == ["ok"] * len(answers)
    assert run.stats.calls_executed == len(answers) and run.result["answer"].tolist() == answers


def _cells(**names: Any) -> dict[str, Any]:
    """A notebook's namespace, as IPython's ``user_ns``: its functions live in no importable module."""
    return {"__name__": "__main__", "pb": pb, **names}


def test_a_module_constant_edited_and_reloaded_runs_the_rows_again(
    store: pb.ReceiptStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A play in a module file reading the module's TEMPLATE: the file edited and reloaded, a rerun pays for the new prompts."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    module = f"classify_{uuid.uuid4().hex[:8]}"
    source = textwrap.dedent("""
        import playbook as pb
        from {tools} import TOOL

        TEMPLATE = {template!r}

        @pb.play
        async def classify(row, ctx):
            return {{"answer": await ctx.tool(TOOL, prompt=TEMPLATE.format(c=row.company))}}
        """)
    tools = f"tools_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{tools}.py").write_text(
        "import uuid\nimport playbook as pb\n\n@pb.tool(name='label-' + uuid.uuid4().hex[:6], version='1', cost=0.01)\ndef TOOL(prompt: str) -> str:\n    return prompt.upper()\n"
    )
    path = tmp_path / f"{module}.py"
    path.write_text(source.format(tools=tools, template="Classify {c}"))
    mod = importlib.import_module(module)
    assert _run(mod.classify, store).stats.calls_executed == 2
    path.write_text(source.format(tools=tools, template="Sort {c} into an industry"))
    mod = importlib.reload(mod)
    _reran_with(_run(mod.classify, store), ["SORT ACME INTO AN INDUSTRY", "SORT ZETA INTO AN INDUSTRY"])
    assert _run(mod.classify, store).stats.reused == 2


def test_a_notebook_global_rebound_runs_the_rows_again(store: pb.ReceiptStore) -> None:
    """A play of a notebook cell reading a global of the notebook: rebinding it in a later cell runs the rows again, once."""
    cells = _cells(label=_label_tool(), TEMPLATE="Classify {c}")
    exec(
        "@pb.play\nasync def classify(row, ctx):\n    return {'answer': await ctx.tool(label, prompt=TEMPLATE.format(c=row.company))}\n",
        cells,
    )
    assert _run(cells["classify"], store).stats.calls_executed == 2
    assert _run(cells["classify"], store).stats.reused == 2
    cells["TEMPLATE"] = "Industry of {c}"
    _reran_with(_run(cells["classify"], store), ["INDUSTRY OF ACME", "INDUSTRY OF ZETA"])
    assert _run(cells["classify"], store).stats.reused == 2


def test_a_closure_list_changed_runs_the_rows_again(store: pb.ReceiptStore) -> None:
    """A play made by a factory closing over a list: the list changed, a rerun pays for the new prompts."""
    label = _label_tool()
    labels = ["retail", "energy"]

    async def classify(row, ctx):  # type: ignore[no-untyped-def]
        return {"answer": await ctx.tool(label, prompt=f"{row.company} among {', '.join(labels)}")}

    play = pb.play(classify)
    assert _run(play, store).stats.calls_executed == 2
    labels.append("banking")
    _reran_with(
        _run(play, store), ["ACME AMONG RETAIL, ENERGY, BANKING", "ZETA AMONG RETAIL, ENERGY, BANKING"]
    )


def test_an_environment_variable_the_play_reads_changed_runs_the_rows_again(
    store: pb.ReceiptStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A play reading os.environ["PB_TEST_REGION"]: set to another value, a rerun pays for the new calls; the value itself is never kept."""
    monkeypatch.setenv("PB_TEST_REGION", "secret-eu-value")
    cells = _cells(label=_label_tool())
    exec(
        "import os\n@pb.play\nasync def classify(row, ctx):\n    return {'answer': await ctx.tool(label, prompt=row.company + os.environ['PB_TEST_REGION'])}\n",
        cells,
    )
    play = cells["classify"]
    assert _run(play, store).stats.calls_executed == 2
    assert "secret-eu-value" not in play._named and "PB_TEST_REGION" in play._named
    monkeypatch.setenv("PB_TEST_REGION", "-us")
    _reran_with(_run(play, store), ["ACME-US", "ZETA-US"])
    monkeypatch.delenv("PB_TEST_REGION")
    assert "PB_TEST_REGION=<unset>" in pb.play(play.fn).current()._named


def test_a_global_read_by_a_helper_runs_the_rows_again(store: pb.ReceiptStore) -> None:
    """The play calls a helper of the notebook that reads TEMPLATE: rebinding TEMPLATE runs the rows again."""
    cells = _cells(label=_label_tool(), TEMPLATE="Classify {c}")
    exec("def prompt(c):\n    return TEMPLATE.format(c=c)\n", cells)
    exec(
        "@pb.play\nasync def classify(row, ctx):\n    return {'answer': await ctx.tool(label, prompt=prompt(row.company))}\n",
        cells,
    )
    assert _run(cells["classify"], store).stats.calls_executed == 2
    cells["TEMPLATE"] = "Which industry is {c}"
    _reran_with(_run(cells["classify"], store), ["WHICH INDUSTRY IS ACME", "WHICH INDUSTRY IS ZETA"])


def test_a_class_attribute_changed_runs_the_rows_again(store: pb.ReceiptStore) -> None:
    """The play reads Config.TEMPLATE of a class of the notebook: the attribute changed, a rerun pays for the new prompts."""
    cells = _cells(label=_label_tool())
    exec(
        "class Config:\n    TEMPLATE = 'Classify {c}'\n\n    def render(self, c):\n        return self.TEMPLATE.format(c=c)\n",
        cells,
    )
    exec(
        "@pb.play\nasync def classify(row, ctx):\n    return {'answer': await ctx.tool(label, prompt=Config.TEMPLATE.format(c=row.company))}\n",
        cells,
    )
    assert _run(cells["classify"], store).stats.calls_executed == 2
    cells["Config"].TEMPLATE = "Label {c}"
    _reran_with(_run(cells["classify"], store), ["LABEL ACME", "LABEL ZETA"])


def test_a_helper_in_another_user_module_is_followed(
    store: pb.ReceiptStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper imported from the user's other module, reading that module's TEMPLATE: changed there, a rerun pays for the new prompts."""
    monkeypatch.syspath_prepend(str(tmp_path))
    module = f"prompts_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "TEMPLATE = 'Classify {c}'\n\n\ndef prompt(c):\n    return TEMPLATE.format(c=c)\n"
    )
    prompts = importlib.import_module(module)
    cells = _cells(label=_label_tool(), prompt=prompts.prompt)
    exec(
        "@pb.play\nasync def classify(row, ctx):\n    return {'answer': await ctx.tool(label, prompt=prompt(row.company))}\n",
        cells,
    )
    assert _run(cells["classify"], store).stats.calls_executed == 2
    prompts.TEMPLATE = "Sector of {c}"
    _reran_with(_run(cells["classify"], store), ["SECTOR OF ACME", "SECTOR OF ZETA"])


def test_a_dataframe_global_edited_runs_the_rows_again(store: pb.ReceiptStore) -> None:
    """A lookup DataFrame the play reads, edited in place: a rerun pays for the calls its new cells make."""
    lookup = pd.DataFrame({"company": ["acme", "zeta"], "hint": ["shops", "mines"]}).set_index("company")
    cells = _cells(label=_label_tool(), LOOKUP=lookup)
    exec(
        "@pb.play\nasync def classify(row, ctx):\n    return {'answer': await ctx.tool(label, prompt=LOOKUP.at[row.company, 'hint'])}\n",
        cells,
    )
    assert _run(cells["classify"], store).result["answer"].tolist() == ["SHOPS", "MINES"]
    lookup.at["zeta", "hint"] = "banks"
    run = _run(cells["classify"], store)
    assert (
        run.result["answer"].tolist() == ["SHOPS", "BANKS"]
        and run.stats.calls_executed == 1
        and run.stats.calls_reused == 1
    )


class _Tier(enum.Enum):
    SMALL = 1
    LARGE = 2


@dataclasses.dataclass(frozen=True)
class _Settings:
    model: str
    temperature: float


class _Prompt(pydantic.BaseModel):
    text: str


class _Plain:
    """A plain class of the user's: its objects count by their attributes."""

    def __init__(self, model: str) -> None:
        self.model, self.options = model, types.SimpleNamespace(temperature=0.0)

    def render(self, c: str) -> str:
        return f"{self.model}: {c}"


def _render(c: str, style: str) -> str:
    return f"{style} {c}"


def _values() -> list[tuple[Any, Any]]:
    """Pairs of values of each kind with a stable form: each made anew on every call."""
    return [
        ("Classify {c}", "Sort {c}"),
        (3, 4),
        ((1, "a"), (1, "b")),
        ({"model": "small", "labels": ["a"]}, {"model": "small", "labels": ["b"]}),
        ({"a", "b"}, {"a", "c"}),
        (_Settings("small", 0.0), _Settings("small", 0.5)),
        (_Prompt(text="a"), _Prompt(text="b")),
        (_Tier.SMALL, _Tier.LARGE),
        (dt.datetime(2026, 1, 1), dt.datetime(2026, 1, 2)),
        (decimal.Decimal("1.10"), decimal.Decimal("1.20")),
        (Path("/data/a.csv"), Path("/data/b.csv")),
        (re.compile("a+", re.I), re.compile("a+")),
        (np.arange(4), np.arange(4) * 2),
        (pd.Series([1, 2], name="x"), pd.Series([1, 3], name="x")),
        (pl.DataFrame({"a": [1, 2]}), pl.DataFrame({"a": [1, 5]})),
        (types.SimpleNamespace(model="a"), types.SimpleNamespace(model="b")),
        (_Plain("a"), _Plain("b")),
        (functools.partial(_render, style="short"), functools.partial(_render, style="long")),
        (operator.itemgetter("a"), operator.itemgetter("b")),
    ]


@pytest.mark.parametrize("index", range(len(_values())), ids=[type(a).__name__ for a, _ in _values()])
def test_each_kind_of_value_counts_by_its_stable_form(index: int) -> None:
    """A global of each kind with a stable form: the same value made anew keeps the fingerprint, another changes it."""
    before, after = _values()[index]
    cells = _cells(CONST=before)
    exec("@pb.play\nasync def reads(row, ctx):\n    return {'v': str(CONST)}\n", cells)
    play = cells["reads"]
    first = play.fingerprint
    cells["CONST"] = _values()[index][0]
    assert play.current().fingerprint == first and not play.notes
    cells["CONST"] = after
    assert play.current().fingerprint != first


class _Client:
    """A client object: it holds a connection, which has no stable form."""

    def __init__(self) -> None:
        self.connection = object()

    def complete(self, prompt: str) -> str:
        return prompt


def test_a_value_with_no_stable_form_is_said_once_and_memos_still_answer(store: pb.ReceiptStore) -> None:
    """A play reading a client object (twice, and through a sub-play too): the run says so once, naming
    the play, the global and its type, and what to do; the rerun still reuses its rows."""
    cells = _cells(label=_label_tool(), CLIENT=_Client())
    exec("@pb.play\nasync def inner(row, ctx):\n    return {'answer': CLIENT.complete(row.company)}\n", cells)
    exec(
        "@pb.play\nasync def outer(row, ctx):\n    CLIENT.complete('x')\n    return await ctx.run_play(inner, company=CLIENT.complete(row.company))\n",
        cells,
    )
    first = _run(cells["outer"], store)
    said = [n for n in first.notices if "CLIENT" in n]
    assert (
        len(said) == 1 and "'outer'" in said[0] and f"{__name__}._Client" in said[0] and "version=" in said[0]
    ), first.notices
    again = _run(cells["outer"], store)
    assert again.stats.reused == 2 and [n for n in again.notices if "CLIENT" in n] == said
    assert ("warning: " + said[0]) in summary(
        again.state, Tally.of(again.state)
    ).splitlines()  # a script's text summary


def test_a_play_that_reads_nothing_keeps_the_fingerprint_it_had(store: pb.ReceiptStore) -> None:
    """A play naming only a tool, modules, builtins and library functions (and writing to a list of
    calls) has the fingerprint it had before values counted: its row memos stay valid."""
    label = _label_tool()
    seen: list[str] = []
    cells = _cells(label=label, pd=pd, json=__import__("json"), SEEN=seen)
    exec(
        "@pb.play\nasync def plain(row, ctx):\n    SEEN.append(row.company)\n    return {'answer': json.dumps(await ctx.tool(label, prompt=str(len(row.company))))}\n",
        cells,
    )
    play = cells["plain"]
    own = digest("\x1f".join(["plain", "", code_fingerprint(play.fn)]))
    assert play.fingerprint == digest(own + "\x1f" + f"label={label.name}:{label.fingerprint}")

    async def alone(row, ctx):  # type: ignore[no-untyped-def]
        return {"answer": row.company}

    assert pb.play(alone).fingerprint == digest("\x1f".join(["alone", "", code_fingerprint(alone)]))
    _run(play, store)
    assert (
        _run(play, store).stats.reused == 2 and not play.notes
    )  # the list it writes to grew: it does not count


def test_a_play_sent_pickled_keeps_the_fingerprint_of_where_it_was_sent_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A play sent to a worker (pickled, as Dask sends it) keeps the fingerprint it had where it was sent from,
    even where the environment variable it reads differs."""
    monkeypatch.setenv("PB_TEST_MODEL", "small")
    cells = _cells()
    exec(
        "import os\n@pb.play\nasync def model(row, ctx):\n    return {'model': os.getenv('PB_TEST_MODEL')}\n",
        cells,
    )
    sent = cloudpickle.dumps(cells["model"])
    monkeypatch.setenv("PB_TEST_MODEL", "large")
    arrived = pickle.loads(sent)
    assert arrived.current().fingerprint == arrived.fingerprint != cells["model"].current().fingerprint


def test_an_object_holding_itself_has_no_stable_form() -> None:
    """A plain object of the user's that holds itself: said as having no stable form, not counted forever."""
    looped = _Plain("a")
    looped.options.back = looped
    cells = _cells(CONST=looped)
    exec("@pb.play\nasync def reads(row, ctx):\n    return {'v': CONST.model}\n", cells)
    assert list(cells["reads"].notes) == [f"CONST ({__name__}._Plain)"]


def test_a_class_inside_a_class_counts(store: pb.ReceiptStore) -> None:
    """The play reads Settings.LLM.MODEL: MODEL changed, a rerun pays for the new prompts (a class holding itself is counted once)."""
    cells = _cells(label=_label_tool())
    exec("class Settings:\n    class LLM:\n        MODEL = 'mA'\n", cells)
    cells["Settings"].LLM.OWNER = cells["Settings"]
    exec(
        "@pb.play\nasync def classify(row, ctx):\n    return {'answer': await ctx.tool(label, prompt=row.company + Settings.LLM.MODEL)}\n",
        cells,
    )
    assert _run(cells["classify"], store).stats.calls_executed == 2
    cells["Settings"].LLM.MODEL = "mB"
    _reran_with(_run(cells["classify"], store), ["ACMEMB", "ZETAMB"])


@pytest.mark.parametrize(
    ("code", "called"),
    [
        ("globals()['PFX']", "globals()"),
        ("vars(sys.modules[__name__]).get('PFX')", "vars()"),
        ("eval('PFX')", "eval()"),
        ("pick()", "exec()"),
    ],
)
def test_a_name_read_through_globals_or_eval_is_said(code: str, called: str) -> None:
    """The play (or a helper it calls) reads through globals(), vars(), eval() or exec(): what it reads cannot be known, and the run says so."""
    cells = _cells(PFX="a", sys=sys)
    exec("def pick():\n    found = {}\n    exec('v = PFX', globals(), found)\n    return found['v']\n", cells)
    exec(f"@pb.play\nasync def dynamic(row, ctx):\n    return {{'v': {code}}}\n", cells)
    said = [note for note in cells["dynamic"].notes.values() if called in note]
    assert len(said) == 1 and said[0].startswith("play 'dynamic' calls ") and "version=" in said[0], cells[
        "dynamic"
    ].notes


def test_an_environment_variable_named_by_a_global_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.getenv(ENV_NAME), ENV_NAME a global string: the variable changed, the fingerprint changes; nothing is said."""
    monkeypatch.setenv("PB_TEST_IND", "retail")
    cells = _cells(ENV_NAME="PB_TEST_IND")
    exec(
        "import os\n@pb.play\nasync def env(row, ctx):\n    return {'v': os.getenv(ENV_NAME, 'none') + f'{row.company}'}\n",
        cells,
    )
    play = cells["env"]
    first = play.fingerprint
    monkeypatch.setenv("PB_TEST_IND", "energy")
    assert play.current().fingerprint != first and not play.notes


@pytest.mark.parametrize(
    "code",
    ["os.environ.get(f'PB_TEST_{row.company}')", "os.environ['PB_' + row.company]", "named(row.company)"],
)
def test_an_environment_variable_named_by_a_built_string_is_said(code: str) -> None:
    """An environment variable whose name the play builds (or a helper is given): which one cannot be known, and the run says so."""
    cells = _cells()
    exec("import os\ndef named(name):\n    return os.getenv(name)\n", cells)
    exec(f"@pb.play\nasync def env(row, ctx):\n    return {{'v': {code}}}\n", cells)
    said = [note for note in cells["env"].notes.values() if "environment variable" in note]
    assert len(said) == 1 and said[0].startswith(
        "play 'env' reads an environment variable by a name it builds"
    ), cells["env"].notes


def test_a_global_the_play_rebinds_does_not_count(store: pb.ReceiptStore) -> None:
    """A counter the play bumps (global N; N += 1, in the play and in a helper; STATS.n += 1; SEEN[k] = v) is its own
    record: a rerun reuses every row, saying nothing."""
    cells = _cells(label=_label_tool(), N=0, CALLS=0, STATS=types.SimpleNamespace(n=0), SEEN={})
    exec("def bump():\n    global CALLS\n    CALLS += 1\n", cells)
    exec(
        "@pb.play\nasync def counting(row, ctx):\n    global N\n    N += 1\n    bump()\n    STATS.n += 1\n    SEEN[row.company] = N\n"
        "    return {'answer': await ctx.tool(label, prompt=row.company), 'calls': CALLS > 0}\n",
        cells,
    )
    assert _run(cells["counting"], store).stats.calls_executed == 2
    again = _run(cells["counting"], store)
    assert again.stats.reused == 2 and not again.notices and cells["N"] == 2


def test_a_dict_the_play_reads_and_fills_is_said(store: pb.ReceiptStore) -> None:
    """A cache the play both reads and fills does not count: the run says so once, naming it, and its memos still answer."""
    cells = _cells(label=_label_tool(), CACHE={"acme": "A1"})
    exec(
        "@pb.play\nasync def cached(row, ctx):\n    v = CACHE.get(row.company) or CACHE.setdefault(row.company, 'Z')\n"
        "    return {'answer': await ctx.tool(label, prompt=v)}\n",
        cells,
    )
    first = _run(cells["cached"], store)
    said = [n for n in first.notices if "CACHE" in n]
    assert len(said) == 1 and said[0].startswith(
        "play 'cached' writes to CACHE and reads it: it is not counted"
    ), first.notices
    cells["CACHE"]["acme"] = "A2"
    again = _run(cells["cached"], store)
    assert again.stats.reused == 2 and [n for n in again.notices if "CACHE" in n] == said


def test_a_global_of_another_module_its_helper_rebinds_does_not_count(
    store: pb.ReceiptStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The play reads counter.N of the user's module, whose bump() it calls rebinds N: a rerun reuses every row."""
    monkeypatch.syspath_prepend(str(tmp_path))
    module = f"counter_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("N = 0\n\n\ndef bump():\n    global N\n    N += 1\n")
    cells = _cells(label=_label_tool(), counter=importlib.import_module(module))
    exec(
        "@pb.play\nasync def counting(row, ctx):\n    counter.bump()\n"
        "    return {'answer': await ctx.tool(label, prompt=row.company), 'seen': counter.N > 0}\n",
        cells,
    )
    assert _run(cells["counting"], store).stats.calls_executed == 2
    assert _run(cells["counting"], store).stats.reused == 2


@pytest.mark.parametrize(
    "cell",
    [
        "async def at(row, ctx):\n    return {'at': str(label_of(row))}\n",  # a helper of another module
        "async def at(row, ctx):\n    return {'at': str((lambda r: r.Index)(row))}\n",  # in a lambda
        "async def at(row, ctx):\n    return {'at': str(getattr(row, 'index'))}\n",
    ],
    ids=["helper module", "lambda", "getattr"],
)
def test_the_index_read_anywhere_the_play_reaches_makes_equal_rows_rows_of_their_own(
    cell: str, store: pb.ReceiptStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """row.index read in a helper of the user's other module, in a lambda, or through getattr gives
    each equal row its own label, in this process and in one the play is sent to pickled."""
    monkeypatch.syspath_prepend(str(tmp_path))
    module = f"labels_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("def label_of(row):\n    return row.index\n")
    cells = _cells(label_of=importlib.import_module(module).label_of)
    exec(cell, cells)
    play = pb.play(cells["at"], name=f"at-{uuid.uuid4().hex[:6]}")
    frame = pd.DataFrame({"v": [1, 1]}, index=["p", "q"])
    assert frame.play.map(play, store=store, progress=False)["at"].tolist() == ["p", "q"]
    sent = pickle.loads(cloudpickle.dumps(play))
    assert frame.set_axis(["r", "s"]).play.map(sent, store=store, progress=False)["at"].tolist() == ["r", "s"]
