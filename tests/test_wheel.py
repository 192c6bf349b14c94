"""Packaging: the wheel built from this tree, installed into a fresh virtual environment, is the
whole package (data and ``py.typed`` included, tests not), and every install hint names the
distribution and an extra it declares.

The wheel is built offline with the development environment's setuptools, from a copy of the
tree: an in-tree build reuses ``build/lib``, where a module deleted since an earlier build
would still be found and shipped.  The fresh environment gets the wheel alone (``--no-deps``);
its dependencies are read from the development environment's site-packages through a ``.pth``
file, which adds that directory but runs none of its own ``.pth`` files, so the editable
install of this checkout stays out of it.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import playbook as pb
from playbook._internal.dist import DISTRIBUTION, install_hint

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "playbook"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Top-level entries of a working tree that a clone does not have.
_NOT_IN_A_CLONE = {
    ".git",
    ".venv",
    "build",
    "dist",
    "out",
    ".playbook",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
}


def _copy_of_the_tree(dst: Path) -> Path:
    def ignore(folder: str, names: list[str]) -> list[str]:
        top = Path(folder) == ROOT
        return [
            n
            for n in names
            if n == "__pycache__" or n.endswith(".egg-info") or (top and n in _NOT_IN_A_CLONE)
        ]

    shutil.copytree(ROOT, dst, ignore=ignore)
    return dst


def _run(cmd: list[str | Path], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the working tree, as a clone of it would be."""
    return _copy_of_the_tree(tmp_path_factory.mktemp("tree") / "playbook")


@pytest.fixture(scope="module")
def wheel(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "-w",
            out,
            tree,
        ],
        cwd=tree,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("*.whl")
    return found


@pytest.fixture(scope="module")
def python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh venv holding the wheel, with this environment's packages behind it."""
    env_dir = tmp_path_factory.mktemp("fresh") / "env"
    venv.create(env_dir, with_pip=False)
    exe = env_dir / "bin" / "python"
    # The wheel goes in before the .pth: pip would otherwise see this checkout's editable
    # install through it and call the wheel "already installed".
    installed = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            exe,
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            wheel,
        ],
        cwd=env_dir,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    site = _run(
        [exe, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=env_dir
    ).stdout.strip()
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(site) / "_dependencies.pth").write_text("".join(p + "\n" for p in sorted(ours)))
    return exe


def test_the_wheel_holds_every_module_and_the_data_and_no_tests(tree: Path, wheel: Path) -> None:
    """The wheel is named after the distribution and holds every module, py.typed and the demo data, and nothing else."""
    assert wheel.name == f"{DISTRIBUTION.replace('-', '_')}-{pb.__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    files = {
        p.relative_to(tree).as_posix()
        for p in (tree / "playbook").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert files <= names, sorted(files - names)
    assert {"playbook/py.typed", "playbook/demo/data/leads.csv"} <= names
    info = f"{DISTRIBUTION.replace('-', '_')}-{pb.__version__}.dist-info/"
    assert {n for n in names if not n.startswith(("playbook/", info))} == set()


def test_the_fresh_venv_imports_the_wheel_with_its_metadata(python: Path, tmp_path: Path) -> None:
    """Outside the checkout, playbook is the wheel's copy; its metadata has our version and extras; data and py.typed are there."""
    script = (
        "import importlib.metadata as md, json, pathlib, sys\n"
        "import playbook as pb\n"
        f"dist = md.distribution({DISTRIBUTION!r})\n"
        "print(json.dumps({'file': pb.__file__, 'version': pb.__version__, 'dist_version': dist.version,\n"
        "    'dist_file': str(dist.locate_file('playbook/__init__.py')), 'extras': dist.metadata.get_all('Provides-Extra'),\n"
        "    'typed': (pathlib.Path(pb.__file__).parent / 'py.typed').is_file(), 'leads': len(pb.demo.leads()), 'prefix': sys.prefix}))\n"
    )
    done = _run([python, "-c", script], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    prefix = Path(seen["prefix"])
    assert prefix == python.parent.parent and Path(seen["file"]).is_relative_to(prefix)
    assert Path(seen["dist_file"]) == Path(
        seen["file"]
    )  # the metadata found is the wheel's, not the checkout's
    assert seen["dist_version"] == seen["version"] == pb.__version__
    assert set(seen["extras"]) >= {"demo", "parquet", "polars", "redis", "all"}
    assert seen["typed"] and seen["leads"] == len(pb.demo.leads()) > 0


def test_the_installed_wheel_runs_a_tool_against_the_demo_provider(python: Path, tmp_path: Path) -> None:
    """From the wheel, pb.demo.serve() answers an http_tool mapped over a small frame: every row ok, one request each."""
    script = (
        "import json, sys, pandas as pd, playbook as pb\n"
        "with pb.demo.serve(port=0) as demo:\n"
        "    email = pb.http_tool('acme.email', method='GET', url=demo.url + '/v1/email',\n"
        "        params={'domain': '{domain}', 'first': '{first}'}, headers={'Authorization': 'Bearer {secret}'},\n"
        "        secret=pb.secret('DEMO_API_KEY', default='demo-key'), pick='email', miss_status=(404,))\n"
        "    frame = pd.DataFrame({'domain': ['acme.com', 'globex.com', 'initech.com'], 'first': ['ann', 'bob', 'cy']})\n"
        "    out = frame.play.map(email, store=sys.argv[1], progress=False)\n"
        "    print(json.dumps({'status': out['play_status'].tolist(), 'requests': demo.stats()['requests']}))\n"
    )
    done = _run([python, "-c", script, tmp_path / "store"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"status": ["ok", "ok", "ok"], "requests": 3}


@pytest.mark.parametrize("module", ["playbook", "playbook.demo"])
def test_the_command_lines_run_from_the_wheel(python: Path, tmp_path: Path, module: str) -> None:
    """python -m playbook --help and python -m playbook.demo --help exit 0 from the installed wheel."""
    done = _run([python, "-m", module, "--help"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"usage: python -m {module} ")


def test_pyproject_names_the_distribution_the_hints_name() -> None:
    """pyproject's name is DISTRIBUTION; no requirement names PyPI's other 'playbook'; self-references name declared extras."""
    project = PYPROJECT["project"]
    assert project["name"] == DISTRIBUTION != "playbook"
    assert install_hint("demo") == 'pip install "playbook-df[demo]"'
    extras = project["optional-dependencies"]
    for spec in [*project["dependencies"], *(r for reqs in extras.values() for r in reqs)]:
        req = Requirement(spec)
        assert canonicalize_name(req.name) != "playbook", spec
        if canonicalize_name(req.name) == canonicalize_name(DISTRIBUTION):
            assert req.extras <= set(extras), spec


def _hints(tree: ast.Module) -> tuple[list[int], set[str]]:
    """Lines of string literals (docstrings aside) that spell out a ``pip install``, and the extras ``install_hint`` is asked for."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    spelled, asked = [], set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "pip install" in node.value
            and id(node) not in docs
        ):
            spelled.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "install_hint":
            (extra,) = node.args
            assert isinstance(extra, ast.Constant), ast.unparse(node)
            asked.add(extra.value)
    return spelled, asked


def test_every_install_hint_in_the_package_names_a_declared_extra() -> None:
    """Messages build install lines with install_hint(extra), for extras pyproject declares; none spells out its own 'pip install'."""
    spelled, asked = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if "pip install" not in text and "install_hint" not in text:
            continue
        lines, extras = _hints(ast.parse(text, str(path)))
        asked |= extras
        if path.relative_to(PACKAGE).as_posix() != "_internal/dist.py":
            spelled += [f"{path.relative_to(ROOT)}:{n}" for n in lines]
    assert spelled == []
    assert {"demo", "redis"} <= asked <= set(PYPROJECT["project"]["optional-dependencies"])


def test_a_redis_store_without_redis_names_the_redis_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without redis-py, a redis:// store fails with ReceiptError giving the line that installs the redis extra."""
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(pb.ReceiptError, match=r'pip install "playbook-df\[redis\]"'):
        pb.ReceiptStore("redis://127.0.0.1:1/0")
