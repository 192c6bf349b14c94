"""A user's type checker sees what a play gets: ``await ctx.tool(tool, ...)`` is the tool's return
type, so a forgotten ``await`` is an error before anything runs (the runtime also catches it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLAYS = """
import playbook as pb


@pb.tool
def shout(text: str) -> str:
    return text.upper()


@pb.tool(version="1")
async def length(text: str) -> int:
    return len(text)


@pb.play
async def awaited(row: object, ctx: pb.Context) -> dict[str, object]:
    loud = await ctx.tool(shout, text="a")
    size = await ctx.tool(length, text=loud)
    return {"loud": loud.lower(), "size": size + 1}


@pb.play
async def forgotten(row: object, ctx: pb.Context) -> dict[str, object]:
    loud = ctx.tool(shout, text="a")
    return {"loud": loud.lower()}
"""


def test_a_forgotten_await_is_a_type_error(tmp_path: Path) -> None:
    """mypy passes the awaited play (str and int answers, used as such) and flags the one line
    that uses a call's coroutine as its value."""
    plays = tmp_path / "plays.py"
    plays.write_text(textwrap.dedent(PLAYS))
    # The package from this checkout (an editable install is an import hook mypy does not follow),
    # checked as `make lint` checks it (whose cache it reuses, so only the plays file is new).
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            str(plays),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    line = PLAYS.splitlines().index('    return {"loud": loud.lower()}') + 1
    assert len(errors) == 1 and f"plays.py:{line}:" in errors[0] and "Coroutine" in errors[0], done.stdout
