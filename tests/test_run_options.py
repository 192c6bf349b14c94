"""The run options are declared once (RunOptions) and every surface is derived from it: the frames'
methods, their typed keyword arguments, the %%play flags and the command line's, with one help
text each.  A surface that drifts from the declaration fails here."""

from __future__ import annotations

import inspect
import subprocess
import sys
import typing
from pathlib import Path

import dask.dataframe as dd
import pandas as pd
import polars as pl
import pytest

import playbook
from playbook.frontends import signature
from playbook.frontends.magic import PlayMagics
from playbook.runtime.options import RunOptions, options

KWARGS = Path(signature.__file__).with_name("_kwargs.py")

METHODS = [
    (kind, name, frame)
    for kind, frame in [
        ("pandas", pd.DataFrame({"x": [1]})),
        ("polars", pl.DataFrame({"x": [1]})),
        ("dask", None),
    ]
    for name in ("map", "run", "amap", "arun")
    if not (kind == "dask" and name in ("amap", "arun"))
]


def _help_of(flag: str, text: str) -> str | None:
    """The help argparse prints for ``flag``: its lines up to the next flag, in one line."""
    lines = text.splitlines()
    starts = [
        i for i, line in enumerate(lines) if line.strip().startswith(flag + " ") or line.strip() == flag
    ]
    if not starts:
        return None
    block = [lines[starts[0]]]
    for line in lines[starts[0] + 1 :]:
        if line.strip().startswith("-") or not line.strip():
            break
        block.append(line)
    return " ".join(" ".join(block).split())


def _accessor(kind: str, frame: object) -> object:
    if kind == "dask":
        return dd.from_pandas(pd.DataFrame({"x": [1]}), npartitions=1).play
    return frame.play  # type: ignore[attr-defined]


@pytest.mark.parametrize(("kind", "name", "frame"), METHODS, ids=[f"{k}.{n}" for k, n, _ in METHODS])
def test_every_frame_method_spells_out_the_declared_options(kind: str, name: str, frame: object) -> None:
    """map/run/amap/arun on pandas, Polars and Dask frames take exactly the declared options, as
    keyword-only parameters with the declared defaults and types, and document each one."""
    method = getattr(_accessor(kind, frame), name)
    surface = "map" if name in ("map", "amap") else "run"
    params = inspect.signature(method).parameters
    keywords = {p.name: p for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    declared = options(surface)
    assert list(keywords) == [f.name for f in declared]
    hints = typing.get_type_hints(RunOptions)
    for f in declared:
        assert keywords[f.name].default == f.default, f.name
        assert keywords[f.name].annotation == hints[f.name], f.name
        assert f.metadata["option"].help in (method.__doc__ or ""), f.name
    assert next(iter(params)) == "play"


def test_the_typed_keyword_arguments_are_generated_from_the_declaration() -> None:
    """playbook/frontends/_kwargs.py (what type checkers read) is what the declaration makes of it
    now: `make generate` writes it after an option changes."""
    assert KWARGS.read_text() == signature.kwargs_source(), "stale: run make generate"


def test_the_magic_takes_each_option_as_a_flag_with_the_declared_help(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """%%play's flags are the declared options (all of them) with their help, word for word."""
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help to the terminal's width
    text = PlayMagics.play.parser.format_help()  # type: ignore[attr-defined]
    for f in options("magic"):
        flag = "--" + f.name.replace("_", "-")
        line = _help_of(flag, text)
        assert line is not None and f.metadata["option"].help in line, (flag, line)


def test_the_command_line_takes_each_option_as_a_flag_with_the_declared_help() -> None:
    """`python -m playbook run --help` lists every option offered on the command line with the
    same help as the magic and the docstrings."""
    out = subprocess.run(
        [sys.executable, "-m", "playbook", "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "1000", "PATH": ""},
    ).stdout
    for f in options("cli"):
        flag = "--" + f.name.replace("_", "-")
        line = _help_of(flag, out)
        assert line is not None and f.metadata["option"].help in line, (flag, line)
    assert "--background" not in out  # a command runs to the end


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--refresh"], {"refresh": "rows"}),
        (["--refresh", "all"], {"refresh": True}),
        (["--progress", "none"], {"progress": False}),
        (
            ["--id-columns", "a, b", "--limit", "3", "--max-cost", "2.5"],
            {"id_columns": ["a", "b"], "limit": 3, "max_cost": 2.5},
        ),
        (["--overwrite"], {"overwrite": True}),
    ],
)
def test_a_flag_means_what_the_keyword_means(argv: list[str], expected: dict[str, object]) -> None:
    """A flag's words parse to the options the same keyword arguments give in Python."""
    args = PlayMagics.play.parser.parse_args(["p", *argv])  # type: ignore[attr-defined]
    from_flags = RunOptions.parse(signature.given(args, "magic"))
    assert from_flags == RunOptions.parse(expected)
    assert {name: getattr(from_flags, name) for name in expected} == {
        name: True if value == "all" else value for name, value in expected.items()
    }


def test_an_unknown_keyword_is_named_with_the_nearest_option() -> None:
    """A misspelt option fails before anything runs, naming the option it was probably meant to be."""
    with pytest.raises(playbook.PlayDefinitionError, match="did you mean 'concurrency'"):
        pd.DataFrame({"x": [1]}).play.map(lambda row, ctx: None, concurrncy=4)


def test_an_empty_store_and_an_infinite_max_cost_are_refused_saying_how_to_mean_the_default() -> None:
    """store="" would put receipts in the current directory, unasked, and max_cost=inf is no
    number: each is refused naming the option, and max_cost says None is no limit."""
    with pytest.raises(playbook.PlayDefinitionError, match="store='': store must be .* not empty"):
        RunOptions.parse({"store": ""})
    with pytest.raises(playbook.PlayDefinitionError, match=r"max_cost=inf: .* \(None: no limit\)"):
        RunOptions.parse({"max_cost": float("inf")})
