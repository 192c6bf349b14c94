"""The Binder set-up: a fresh virtual environment built from ``binder/`` the way repo2docker
builds it (pip from the repository's root) executes every notebook in ``notebooks/``."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
import venv
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_binder_asks_for_a_python_the_project_supports() -> None:
    """runtime.txt names a Python version that satisfies the project's requires-python."""
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    wanted = re.fullmatch(r"python-(\d+)\.(\d+)", runtime)
    assert wanted, runtime
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = re.fullmatch(r">=(\d+)\.(\d+)", floor)
    assert low and tuple(map(int, wanted.groups())) >= tuple(map(int, low.groups()))


def test_a_fresh_binder_environment_executes_every_notebook(tmp_path: Path) -> None:
    """pip -r binder/requirements.txt into an empty venv, then run each notebook in a kernel of that venv."""
    assert len(NOTEBOOKS) >= 4
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # Binder's image brings the kernel and the notebook machinery; playbook brings the rest.
    install = [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "-r",
        "binder/requirements.txt",
        "ipykernel",
        "nbclient",
    ]
    done = subprocess.run(install, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    where = subprocess.run(
        [python, "-c", "import playbook; print(playbook.__file__)"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert str(env_dir) in where.stdout  # the installed package, not this checkout
    env = {k: v for k, v in os.environ.items() if k not in ("DEMO_API_KEY", "PYTHONPATH", "VIRTUAL_ENV")}
    probe = tmp_path / "probe.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys; print(sys.prefix)")]), probe)
    ran = subprocess.run(
        [python, ROOT / "notebooks" / "run.py", probe, "--out", tmp_path / "probe"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert str(env_dir) in nbformat.read(tmp_path / "probe" / "probe.ipynb", as_version=4).cells[0].outputs[0]["text"], (
        ran.stderr
    )  # the kernel is the venv's
    for notebook in NOTEBOOKS:
        out = tmp_path / "out" / notebook.stem
        env["PLAYBOOK_HOME"] = str(out / ".playbook")
        ran = subprocess.run(
            [python, ROOT / "notebooks" / "run.py", notebook, "--out", out],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ran.returncode == 0, f"{notebook.name}:\n{ran.stdout[-2000:]}\n{ran.stderr[-4000:]}"
        assert f"executed {notebook}" in ran.stdout
