"""The default store: the one a run uses when it names none (``$PLAYBOOK_HOME``, else the project's
``.playbook/``), opened once per location in each thread."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from playbook.store.engine import StoreEngine
from playbook.store.location import announcement, home

__all__ = ["default_store"]


class _Default(threading.local):
    """This thread's default store, and the location it was opened for."""

    where: Path | str | None = None
    store: StoreEngine | None = None


_default = _Default()
_opening = threading.Lock()


def default_store() -> StoreEngine:
    """The store at :func:`home` (``$PLAYBOOK_HOME``, else the project's ``.playbook/``), opened once
    per location in each thread; the run that makes it says where it is, on stderr."""
    where = home()
    # One per thread: a store batches its reads and writes on the loop that runs it, and each
    # thread that blocks on map() runs a loop of its own.
    store = _default.store
    if store is None or _default.where != where:
        with _opening:  # two threads starting at once: one makes the store, and says so once
            said = announcement(where)
            store = StoreEngine(where)
        _default.store, _default.where = store, where
        if said:
            print(said, file=sys.stderr, flush=True)
    return store
