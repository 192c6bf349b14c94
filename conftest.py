"""Session set-up of the tests, and the test tiers.

Every test is marked by what it needs, from its fixtures, its file (``_BY_FILE``: a file whose
every test needs it) or its own ``@pytest.mark``, so that ``make check`` can leave out what is
slow to start (``-m "not (slow or cluster or kernel or browser or notebook or network)"``) while
``make test`` runs everything:

- ``redis``: a real redis-server (the ``redis_server``/``redis_url`` fixtures, or one the test
  starts itself); it starts in milliseconds, so ``make check`` runs these too;
- ``cluster``: a dask.distributed cluster;
- ``kernel``: a live IPython kernel (magics, widgets);
- ``browser``: JupyterLab in a real Chromium;
- ``notebook``: the notebooks, executed under nbval in a fresh Binder environment;
- ``network``: the demo provider over HTTP on loopback;
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
    "browser": "drives JupyterLab in Chromium",
    "notebook": "executes notebooks",
    "network": "talks to the demo provider over loopback HTTP",
    "slow": "takes seconds of its own",
}
_BY_FIXTURE = {"redis_server": "redis", "redis_url": "redis", "kernel": "kernel", "demo": "network", "demo_server": "network"}
_BY_FILE = {
    "test_browser.py": ("browser", "slow"),
    "test_notebooks.py": ("notebook", "slow"),
    "test_cluster.py": ("cluster", "slow"),
    "test_widget.py": ("kernel",),
    "test_interrupt.py": ("slow",),
    "test_processes.py": ("slow",),
    "test_shared_processes.py": ("redis", "slow"),
    "test_filesystem_error.py": ("slow",),
    "test_wheel.py": ("slow",),
    "test_cli_run.py": ("slow",),
    "test_cli.py": ("slow",),
    "test_types.py": ("slow",),
    "test_redis_store.py": ("redis",),
    "test_governor_demo.py": ("network",),
    "test_demo_server.py": ("network",),
    "test_demo_llm.py": ("network",),
    "test_shared_limiter.py": ("redis",),
}
# Engines of the promise suite (tests/engines.py): several processes share a Redis store; a cluster.
_BY_ENGINE = {"[processes": ("redis", "slow"), "[cluster": ("cluster", "redis", "slow")}


def pytest_configure(config: Any) -> None:
    # Notebook kernels inherit this: their receipts go to a fresh directory, not the user's.
    os.environ["PLAYBOOK_HOME"] = tempfile.mkdtemp(prefix="playbook-test-home-")
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    for item in items:
        marks = set(_BY_FILE.get(item.path.name, ()))
        marks.update(_BY_FIXTURE[f] for f in getattr(item, "fixturenames", ()) if f in _BY_FIXTURE)
        for engine, extra in _BY_ENGINE.items():
            if engine in item.nodeid:
                marks.update(extra)
        for mark in sorted(marks):
            item.add_marker(getattr(pytest.mark, mark))
