"""B7's side-by-side contender: bespokelabs-curator's Anthropic backend, in a virtualenv of its own.

curator pulls litellm and more, which must not change the versions playbook's tests run with, so
it lives in ``benchmarks/.venv-curator`` (made on first use: ``python -m venv`` and ``pip install
bespokelabs-curator`` from the package registry) and runs there in a subprocess
(``b7_curator_side.py``), pointed at the demo's URL.  It runs offline: its tokenizer comes from
the one litellm ships, litellm reads its price map from the package, telemetry is off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-curator"
SIDE = HERE / "b7_curator_side.py"
PACKAGE = "bespokelabs-curator"
TIMEOUT = 900  # seconds for one run, past which the row says curator did not finish


@dataclass
class CuratorRun:
    ok: int
    failed: int
    seconds: float
    heard_input_tpm: int | None  # the input-token limit curator read from the server's headers
    heard_output_tpm: int | None


def python() -> Path:
    """curator's virtualenv's interpreter, the virtualenv made (and curator installed) on first use."""
    exe = VENV / "bin" / "python"
    if exe.exists() and _installed(exe):
        return exe
    print(f"B7: installing {PACKAGE} into {VENV} (first use) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [str(exe), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", PACKAGE],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return exe


def _installed(exe: Path) -> bool:
    probe = subprocess.run([str(exe), "-m", "pip", "show", "--quiet", PACKAGE], capture_output=True)
    return probe.returncode == 0


def version() -> str:
    """The installed curator's version (for the row's notes)."""
    shown = subprocess.run(
        [str(python()), "-m", "pip", "show", PACKAGE], capture_output=True, text=True, check=True
    )
    return next(
        (line.split(":", 1)[1].strip() for line in shown.stdout.splitlines() if line.startswith("Version:")),
        "?",
    )


def run(
    url: str, model: str, prompts: list[str], max_tokens: int, backend_params: dict[str, Any]
) -> CuratorRun:
    """curator's Anthropic backend over ``prompts`` against the server at ``url``, configured with
    ``backend_params`` as its docs give them (its own limits and retries)."""
    job = {
        "url": url,
        "model": model,
        "prompts": prompts,
        "max_tokens": max_tokens,
        "backend_params": {"require_all_responses": False, **backend_params},
    }
    with tempfile.TemporaryDirectory(prefix="pb-b7-curator-home-") as home:
        env = {
            **os.environ,
            "HOME": home,  # its cache and logs land in a directory thrown away after the run
            "ANTHROPIC_API_KEY": "demo-key",  # its first call, reading the limits, takes the key from here
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "TELEMETRY_ENABLED": "false",
            "CURATOR_DISABLE_RICH_DISPLAY": "1",
            "CURATOR_DISABLE_CACHE": "1",
        }
        env.pop("PYTHONPATH", None)
        done = subprocess.run(
            [str(python()), str(SIDE)],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT,
        )
    if done.returncode != 0 or not done.stdout.strip():
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"curator's run failed (exit {done.returncode}):\n{tail}")
    return CuratorRun(**json.loads(done.stdout.strip().splitlines()[-1]))
