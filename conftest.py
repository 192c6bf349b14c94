"""Session set-up of the tests, and the test tiers.

Every test is marked by what it needs, from its fixtures, its file (``_BY_FILE``: a file whose
every test needs it) or its own ``@pytest.mark``, so that ``make check`` can leave out what is
slow to start (``-m "not (slow or cluster or kernel or browser or notebook or network)"``) while
``make test`` runs everything:

- ``redis``: a real redis-server (the ``redis_server``/``redis_url`` fixtures, or one the test
  starts itself); it starts in milliseconds, so ``make check`` runs these too;
- ``cluster``: a dask.distributed cluster;
- ``kernel``: a live IPython kernel (magics, widgets);
- ``browser``: JupyterLab, Notebook 7 or marimo in a real Chromium;
- ``notebook``: the notebooks, executed under nbval in a fresh Binder environment;
- ``network``: the demo provider over HTTP on loopback (or in a process of its own); the one
  served in process (the ``demo`` fixture) needs no mark;
- ``slow``: a test that takes seconds of its own (subprocesses, real waits, large runs).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

MARKERS = {
    "redis": "needs a real redis-server",
    "cluster": "runs a dask.distributed cluster",
    "kernel": "drives a live IPython kernel",
    "browser": "drives JupyterLab, Notebook 7 or marimo in Chromium",
    "notebook": "executes notebooks",
    "network": "talks to the demo provider over loopback HTTP",
    "slow": "takes seconds of its own",
}
# The demo provider is served in process (``demo``: no socket, no mark); on loopback, or in a
# process of its own, it is a server (``demo_loopback``, ``demo_server``, ``demo_elsewhere``).
_BY_FIXTURE = {
    "redis_server": "redis",
    "redis_url": "redis",
    "kernel": "kernel",
    "demo_loopback": "network",
    "demo_server": "network",
    "demo_elsewhere": "network",
}
_BY_FILE = {
    "test_browser.py": ("browser", "slow"),
    "test_marimo.py": ("browser", "slow", "network"),
    "test_notebooks.py": ("notebook", "slow"),
    "test_cluster.py": ("cluster", "slow"),
    "test_cluster_failover.py": ("redis", "slow"),
    "test_widget.py": ("kernel",),
    "test_interrupt.py": ("slow",),
    "test_processes.py": ("slow",),
    "test_shared_processes.py": ("redis", "slow"),
    "test_filesystem_error.py": ("slow",),
    "test_wheel.py": ("slow",),
    "test_cli_run.py": ("slow",),
    "test_types.py": ("slow",),
    "test_redis_store.py": ("redis",),
    "test_shared_limiter.py": ("redis",),
}
# Engines of the promise suite (tests/engines.py): several processes share a Redis store, and the
# demo provider in a process of its own; a cluster.
_BY_ENGINE = {
    "processes": ("redis", "slow", "network"),
    "cluster": ("cluster", "redis", "slow", "network"),
    "redis cluster": ("redis", "slow", "network"),
}


def pytest_configure(config: Any) -> None:
    # Notebook kernels inherit this: their receipts go to a fresh directory, not the user's.
    os.environ["PLAYBOOK_HOME"] = tempfile.mkdtemp(prefix="playbook-test-home-")
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    for item in items:
        marks = set(_BY_FILE.get(item.path.name, ()))
        marks.update(_BY_FIXTURE[f] for f in getattr(item, "fixturenames", ()) if f in _BY_FIXTURE)
        callspec = getattr(item, "callspec", None)
        marks.update(_BY_ENGINE.get(callspec.params.get("engine", "") if callspec else "", ()))
        for mark in sorted(marks):
            item.add_marker(getattr(pytest.mark, mark))
    config.stash[_COLLECTED] = len(items)  # before -m deselects: every test of the files asked for


# -- the tier's share, said at the end: what a marker expression (make check's) left in ---------------

# The check tier's expression, as the Makefile spells it.
CHECK = "not (slow or cluster or kernel or browser or notebook or network)"
_COLLECTED = pytest.StashKey[int]()
_SHARE = pytest.StashKey[tuple[int, int]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    collected = session.config.stash.get(_COLLECTED, None)
    if collected is not None:
        session.config.stash[_SHARE] = (len(session.items), collected)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)  # a pytest-xdist worker: tell the controller
    if workeroutput is not None and _SHARE in session.config.stash:
        workeroutput["tier_share"] = session.config.stash[_SHARE]


def pytest_testnodedown(node: Any, error: Any) -> None:
    """(pytest-xdist, in the controller) a worker's collection: every worker collects the same."""
    share = getattr(node, "workeroutput", {}).get("tier_share")
    if share is not None:
        node.config.stash[_SHARE] = tuple(share)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    expression = config.option.markexpr
    share = config.stash.get(_SHARE, None)
    if not expression or share is None:
        return
    selected, collected = share
    name = "check tier" if expression == CHECK else f"tier -m {expression!r}"
    percent = 100 * selected / collected if collected else 0.0
    terminalreporter.write_line(f"{name}: {selected:,} of {collected:,} tests ({percent:.0f}%)")
