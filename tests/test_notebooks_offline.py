"""The notebooks that tell their story through the run's own counters run offline, under nbval,
from their committed fixtures: no demo server starts and nothing is sent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("name", ["01_quickstart", "03_resume_and_receipts"])
def test_a_notebook_runs_from_its_fixtures(name: str, tmp_path: Path) -> None:
    """The notebook's checked outputs come out the same from its fixtures, with the demo provider
    offline (its URL resolves nowhere, so a call the fixtures lacked would fail its row)."""
    fixtures = NOTEBOOKS / "fixtures" / f"{name}.jsonl"
    copy = tmp_path / f"{name}.ipynb"
    copy.write_bytes((NOTEBOOKS / f"{name}.ipynb").read_bytes())  # it writes files beside itself
    env = {**os.environ, "PLAYBOOK_FIXTURES": str(fixtures), "PLAYBOOK_HOME": str(tmp_path / "home")}
    env.pop("PLAYBOOK_FIXTURES_MODE", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env", "--rootdir", str(tmp_path), str(copy)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "passed" in done.stdout
