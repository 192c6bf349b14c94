"""Session set-up shared by the tests and the notebooks that nbval executes."""

from __future__ import annotations

import os
import tempfile


def pytest_configure(config: object) -> None:
    # Notebook kernels inherit this: their receipts go to a fresh directory, not the user's.
    os.environ["PLAYBOOK_HOME"] = tempfile.mkdtemp(prefix="playbook-test-home-")
