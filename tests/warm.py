"""Python processes started warm, for tests that start many of them.

``python script.py args`` costs this machine about 1.5 s of CPU before the script's first line:
pandas, playbook and their dependencies being imported.  The tests of several processes sharing a
store start a hundred of them, and that import work competes with the other tests for the cores.
:func:`start` gives the same process, forked from a server (``multiprocessing``'s forkserver)
that imported those modules once: a new pid, its own interpreter state from then on, none of
this test process's loops, threads, stores or providers.

What a fresh interpreter would see, each process sees: this test process's environment and working
directory as they are at :func:`start` (not as they were when the server started), ``sys.argv``,
``sys.path`` without what pytest put there, ``__main__`` as the script, exit handlers run at the
end, ``SystemExit``'s code as the exit status, a signal's number (negative) when one kills it.
Its standard output and error go to files, read as :meth:`Warm.communicate` reads pipes.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Imported once by the server: what the workers of the process tests import.
PRELOAD = [
    "pandas",
    "cloudpickle",
    "httpx",
    "redis",
    "pydantic",
    "playbook",
    "playbook.runtime.run",
    "playbook.store.engine",
    "playbook.store.redis.backend",
    "playbook.tools.http",
    "playbook.demo",
    "playbook.demo.tools",
    "playbook.frontends.pandas",
]

_context: Any = None
_clean_path: list[str] = []


class Warm:
    """A started process, with the part of :class:`subprocess.Popen`'s interface the tests use."""

    def __init__(self, process: Any, out: Path, err: Path) -> None:
        self._process = process
        self._out, self._err = out, err
        self.pid: int = process.pid

    @property
    def returncode(self) -> int | None:
        code: int | None = self._process.exitcode
        return code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
        return int(self._process.exitcode)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for it to end; what it printed on standard output and error."""
        self.wait(timeout)
        return self._out.read_text(errors="replace"), self._err.read_text(errors="replace")

    def readline(self, timeout: float = 60.0) -> str:
        """Its first line of output, once printed (with a flush), or '' if it ended without one."""
        deadline = time.monotonic() + timeout
        while True:
            text = self._out.read_text(errors="replace")
            if "\n" in text:
                return text.split("\n", 1)[0] + "\n"
            if self.returncode is not None or time.monotonic() > deadline:
                return ""
            time.sleep(0.005)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self._process.kill()


def start(
    script: str | os.PathLike[str] | None,
    *args: str,
    code: str | None = None,
    module: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
) -> Warm:
    """``python script *args``, ``python -c code *args`` or ``python -m module *args``, started warm,
    in ``cwd`` with ``env`` (this process's, by default).  ``PYTHONPATH`` acts when an interpreter
    starts, before the server's imports: a process that needs another one is started cold."""
    assert env is None or env.get("PYTHONPATH") == os.environ.get("PYTHONPATH"), (
        "PYTHONPATH changes need a fresh interpreter"
    )
    context = _server()
    first = "-m" if module is not None else "-c" if code is not None else os.fspath(script or "")
    folder = Path(tempfile.mkdtemp(prefix="warm-"))
    out, err = folder / "stdout", folder / "stderr"
    out.touch()
    err.touch()
    how = (first, code, module)
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    process = context.Process(
        target=_child,
        args=(
            how,
            list(args),
            dict(os.environ if env is None else env),
            where,
            _clean_path,
            str(out),
            str(err),
        ),
    )
    process.start()
    return Warm(process, out, err)


def run(
    *args: str,
    module: str,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m module *args`` to its end, as :func:`subprocess.run` with ``capture_output`` gives it."""
    proc = start(None, *args, module=module, cwd=cwd, env=env)
    out, err = proc.communicate(timeout)
    return subprocess.CompletedProcess(["python", "-m", module, *args], proc.wait(), out, err)


def _server() -> Any:
    global _context
    if _context is None:
        fresh = subprocess.run(
            [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
            capture_output=True,
            text=True,
            check=True,
        )
        _clean_path[:] = [p for p in json.loads(fresh.stdout) if p]
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(
    how: tuple[str, str | None, str | None],
    args: list[str],
    env: dict[str, str],
    cwd: str,
    path: list[str],
    out: str,
    err: str,
) -> None:
    first, code, module = how
    for fd, name in ((1, out), (2, err)):
        opened = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [first, *args]
    # sys.path[0] as Python sets it: the script's folder, the working directory for -m, '' for -c.
    sys.path[:] = [
        cwd if module is not None else "" if code is not None else os.path.dirname(os.path.abspath(first)),
        *path,
    ]
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        elif code is not None:
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            runpy.run_path(first, run_name="__main__")
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
