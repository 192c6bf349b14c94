"""Every notebook in ``notebooks/`` runs once, under nbval, in a fresh environment built from
``binder/`` as Binder builds it: ``pip install -r binder/requirements.txt`` from the repository's
root, into an empty virtual environment.

The environment is made once for the file.  Its packages are installed by uv, which resolves the
same requirements as pip does, in seconds where pip takes a minute and a half here; the test runner
(pytest, nbval) is added beside them.  Each notebook is copied into a directory of its own (it
writes files beside itself) and runs in a kernel of that environment, with a store of its own:

* the quickstart and the resume notebook tell their story through the run's own counters, so they
  run offline, from their committed fixtures (``notebooks/fixtures/``): no demo server starts and
  nothing is sent, and a call the fixtures lack fails its row;
* the others run against the live demo provider they start.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
OFFLINE = ["01_quickstart", "03_resume_and_receipts"]
LIVE = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in OFFLINE)
# What Binder's image has beside the requirements (the kernel, the notebook machinery), and the test runner.
BESIDE = ["ipykernel", "nbclient", "pytest", "nbval"]


def test_binder_asks_for_a_python_the_project_supports() -> None:
    """runtime.txt names a Python version that satisfies the project's requires-python."""
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    wanted = re.fullmatch(r"python-(\d+)\.(\d+)", runtime)
    assert wanted, runtime
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = re.fullmatch(r">=(\d+)\.(\d+)", floor)
    assert low and tuple(map(int, wanted.groups())) >= tuple(map(int, low.groups()))


def test_the_offline_notebooks_have_their_fixtures() -> None:
    """The notebooks named to run offline exist and have recorded fixtures; every other notebook in
    notebooks/ runs live (LIVE is what is left), so a new notebook is run here either way."""
    assert all(
        (NOTEBOOKS / f"{name}.ipynb").is_file() and (NOTEBOOKS / "fixtures" / f"{name}.jsonl").is_file()
        for name in OFFLINE
    )
    assert len(LIVE) >= 3


def test_the_demo_script_says_first_what_every_run_of_the_notebook_did(tmp_path: Path) -> None:
    """notebooks/run.py (make demo) on a fresh store: its first line sums every run the notebook
    made (a first run pays 5 calls, an edited play reuses them); the last run alone comes after, said so."""
    cells = [
        "import pandas as pd\nimport playbook as pb\n\n@pb.tool(version='1', cost=1.0)\ndef priced(n: int) -> int:\n    return n * 2",
        "@pb.play\nasync def first(row, ctx):\n    return {'v': await ctx.tool(priced, n=row.n)}\n\n"
        "pd.DataFrame({'n': range(5)}).play.map(first, progress=False)",
        "@pb.play\nasync def second(row, ctx):\n    return {'v': await ctx.tool(priced, n=row.n), 'w': 1}\n\n"
        "pd.DataFrame({'n': range(5)}).play.map(second, progress=False)",
    ]
    notebook = tmp_path / "tiny.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), notebook)
    env = {k: v for k, v in os.environ.items() if k != "PLAYBOOK_HOME"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(NOTEBOOKS / "run.py"), str(notebook), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(
        "tiny.ipynb, every run it made: calls paid 5 (cost 5) | calls reused 5 from receipts and row memos (cost saved 5) | "
    ), lines
    assert (
        "its last run alone: 5 rows | ok 5 | reused 0 | failed 0 | calls paid 0 | calls reused 5"
        in done.stdout
    )


@pytest.fixture(scope="module")
def binder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Python of a fresh environment holding ``binder/requirements.txt`` (and what is beside it)."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is a development dependency (pip install -e '.[dev]')"
    env_dir = tmp_path_factory.mktemp("binder") / "env"
    made = subprocess.run(
        [uv, "venv", "--quiet", "--python", sys.executable, str(env_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    python = env_dir / "bin" / "python"
    install = [
        uv,
        "pip",
        "install",
        "--quiet",
        "--python",
        str(python),
        *_pip_index(),
        "-r",
        "binder/requirements.txt",
        *BESIDE,
    ]
    done = subprocess.run(install, cwd=ROOT, capture_output=True, text=True, timeout=900, env=_clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    yield python


def test_the_binder_environment_runs_its_own_install_and_kernel(binder: Path, tmp_path: Path) -> None:
    """playbook comes from the environment (not this checkout), and a notebook's kernel is the environment's."""
    where = subprocess.run(
        [binder, "-c", "import playbook; print(playbook.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
    )
    assert str(binder.parent.parent) in where.stdout
    probe = tmp_path / "probe.ipynb"
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys; print(sys.prefix)")]), probe
    )
    ran = subprocess.run(
        [binder, NOTEBOOKS / "run.py", probe, "--out", tmp_path / "probe"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    shown = nbformat.read(tmp_path / "probe" / "probe.ipynb", as_version=4).cells[0].outputs[0]["text"]
    assert str(binder.parent.parent) in shown, ran.stderr


@pytest.mark.parametrize("name", OFFLINE)
def test_a_notebook_runs_from_its_fixtures(binder: Path, name: str, tmp_path: Path) -> None:
    """The notebook's checked outputs come out the same from its fixtures, with the demo provider
    offline (its URL resolves nowhere, so a call the fixtures lacked would fail its row)."""
    _nbval(binder, name, tmp_path, PLAYBOOK_FIXTURES=str(NOTEBOOKS / "fixtures" / f"{name}.jsonl"))


@pytest.mark.parametrize("name", LIVE)
def test_a_notebook_runs_against_the_live_demo(binder: Path, name: str, tmp_path: Path) -> None:
    """The notebook's checked outputs come out the same against the demo provider it starts."""
    _nbval(binder, name, tmp_path)


def _nbval(python: Path, name: str, where: Path, **env: str) -> None:
    copy = where / f"{name}.ipynb"
    copy.write_bytes((NOTEBOOKS / f"{name}.ipynb").read_bytes())
    cmd = [
        python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--nbval-lax",
        "--nbval-current-env",
        "--rootdir",
        where,
        copy,
    ]
    done = subprocess.run(
        cmd,
        cwd=where,
        env=_clean_env(PLAYBOOK_HOME=str(where / "home"), **env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "passed" in done.stdout


def _pip_index() -> list[str]:
    """pip's index when one is configured (a mirror): uv reads its own settings, not pip's."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
    ).stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.rsplit(".", 1)[-1] == "index-url":
            return ["--index-url", value.strip().strip("'\"")]
    return []


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points into it (its venv, a key the demo would take) or a fixture mode."""
    gone = (
        "DEMO_API_KEY",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "PLAYBOOK_FIXTURES",
        "PLAYBOOK_FIXTURES_MODE",
        "PYTEST_ADDOPTS",
        "PYTEST_XDIST_WORKER",
    )
    return {k: v for k, v in os.environ.items() if k not in gone} | extra
