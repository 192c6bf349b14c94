"""Where the default store is: $PLAYBOOK_HOME, else .playbook/ in the project (the nearest folder up
with pyproject.toml or .git), else in the working directory; said once, when it is made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

import playbook as pb
from playbook.store import default_store, home


@pb.tool(name="triple")
def triple(n: int) -> int:
    return 3 * n


def _memos(where: Path) -> int:
    store = pb.ReceiptStore(where)
    try:
        return int(store.stats()["row_memos"])
    finally:
        store.close()


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home directory of our own, and no $PLAYBOOK_HOME: the project rule decides."""
    me = tmp_path / "me"
    me.mkdir()
    monkeypatch.setenv("HOME", str(me))
    monkeypatch.delenv("PLAYBOOK_HOME")
    return me


def _project(root: Path, marker: str = "pyproject.toml", *subfolders: str) -> Path:
    root.mkdir(parents=True)
    (root / marker).write_text("")
    for sub in subfolders:
        (root / sub).mkdir(parents=True)
    return root


def test_a_subfolder_uses_the_projects_store_and_says_so_once(
    user: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run from notebooks/, then from scripts/deep/: one store at the project's top, announced once,
    and the second run reuses the first one's rows."""
    project = _project(user / "work" / "proj", "pyproject.toml", "notebooks", "scripts/deep")
    frame = pd.DataFrame({"n": [1, 2]})
    monkeypatch.chdir(project / "notebooks")
    assert frame.play.map(triple, progress=False)["play_status"].tolist() == ["ok", "ok"]
    said = capsys.readouterr().err
    assert said == (
        f"playbook: keeping receipts in {project / '.playbook'} (the project's store, for {project}); "
        "pass store= or set $PLAYBOOK_HOME to keep them elsewhere\n"
    )
    monkeypatch.chdir(project / "scripts" / "deep")
    assert frame.play.map(triple, progress=False)["play_status"].tolist() == ["reused", "reused"]
    assert capsys.readouterr().err == ""
    assert (
        sorted(p.name for p in project.rglob(".playbook")) == [".playbook"]
        and _memos(project / ".playbook") == 2
    )


def test_a_git_folder_or_file_marks_the_project(user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """.git marks a project whether it is a folder (a clone) or a file (a worktree, a submodule); the
    nearest marker wins."""
    clone = _project(user / "clone", ".git", "src/pkg")
    (clone / ".git").unlink()
    (clone / ".git").mkdir()
    worktree = _project(clone / "vendor" / "wt", ".git", "docs")  # a submodule inside the clone
    monkeypatch.chdir(clone / "src" / "pkg")
    assert home() == clone / ".playbook"
    monkeypatch.chdir(worktree / "docs")
    assert home() == worktree / ".playbook"


def test_without_a_project_the_working_directory_keeps_it(
    user: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no pyproject.toml or .git up to the home directory, the store is in the working directory,
    and the line says why."""
    loose = user / "scratch" / "today"
    loose.mkdir(parents=True)
    monkeypatch.chdir(loose)
    pd.DataFrame({"n": [1]}).play.map(triple, progress=False)
    assert capsys.readouterr().err == (
        f"playbook: keeping receipts in {loose / '.playbook'} (no pyproject.toml or .git in {loose} or above it); "
        "pass store= or set $PLAYBOOK_HOME to keep them elsewhere\n"
    )
    assert _memos(loose / ".playbook") == 1


def test_the_home_directory_is_never_a_project(user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dotfiles repository (~/.git) or a ~/pyproject.toml does not gather every folder's receipts in
    ~/.playbook; run from the home directory itself, the store is there, as in any folder."""
    (user / ".git").mkdir()
    (user / "pyproject.toml").write_text("")
    (user / "scratch").mkdir()
    monkeypatch.chdir(user / "scratch")
    assert home() == user / "scratch" / ".playbook"
    monkeypatch.chdir(user)
    assert home() == user / ".playbook"


def test_playbook_home_wins_and_is_not_announced(
    user: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """$PLAYBOOK_HOME overrides the project rule (a relative one taken from the working directory, ~
    expanded); the user chose it, so nothing is said when it is made."""
    project = _project(user / "proj", "pyproject.toml", "sub")
    monkeypatch.chdir(project / "sub")
    monkeypatch.setenv("PLAYBOOK_HOME", "receipts")
    assert home() == project / "sub" / "receipts"
    monkeypatch.setenv("PLAYBOOK_HOME", "~/kept")
    assert home() == user / "kept"
    pd.DataFrame({"n": [1]}).play.map(triple, progress=False)
    assert capsys.readouterr().err == "" and _memos(user / "kept") == 1


def test_changing_directory_to_another_project_uses_its_store(
    user: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One process, two projects: each run keeps its receipts in its own project's store; coming back
    to the first says nothing again."""
    first, second = _project(user / "a"), _project(user / "b")
    frame = pd.DataFrame({"n": [5]})
    for project in (first, second, first):
        monkeypatch.chdir(project)
        frame.play.map(triple, progress=False)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        f"playbook: keeping receipts in {p / '.playbook'}" for p in (first, second)
    ]
    assert pb.last_run().stats.reused == 1
    assert _memos(first / ".playbook") == _memos(second / ".playbook") == 1


def test_each_thread_opens_the_default_store_once(user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """default_store() is one store per location in each thread (a store's batches belong to the loop
    of the thread that runs it): the same object twice in a thread, another in another thread."""
    monkeypatch.chdir(_project(user / "proj"))
    mine = [default_store(), default_store()]
    theirs: list[pb.ReceiptStore] = []
    worker = threading.Thread(target=lambda: theirs.extend([default_store(), default_store()]))
    worker.start()
    worker.join()
    assert mine[0] is mine[1] and theirs[0] is theirs[1] and mine[0] is not theirs[0]
    assert mine[0].location == theirs[0].location == str(user / "proj" / ".playbook")


def test_the_cli_finds_the_projects_store_from_a_subfolder(
    user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m playbook cache stats`, run from a subfolder, reads the project's store."""
    project = _project(user / "proj", ".git", "notebooks")
    monkeypatch.chdir(project)
    pd.DataFrame({"n": [1, 2, 3]}).play.map(triple, progress=False)
    env = {k: v for k, v in os.environ.items() if k != "PLAYBOOK_HOME"}
    done = subprocess.run(
        [sys.executable, "-m", "playbook", "cache", "stats", "--json"],
        cwd=project / "notebooks",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["location"] == str(project / ".playbook") and stats["receipts"] == 3
