"""Where receipts, row memos, steps and leases live: a directory with one SQLite file (the
default), a Redis server shared by many kernels and machines (redis/), or memory.  The backends
are peers behind one protocol (protocol.py); the engine that runs on any of them (engine.py) is
what runs use, and the :class:`ReceiptStore` in front of it (receipts.py) what users hold."""

from playbook.store.db import FILE, FORMAT
from playbook.store.default import default_store
from playbook.store.engine import StoreEngine
from playbook.store.location import home, is_url
from playbook.store.protocol import Backend
from playbook.store.receipts import ReceiptStore, engine
from playbook.store.records import MISSING

__all__ = [
    "FILE",
    "FORMAT",
    "MISSING",
    "Backend",
    "ReceiptStore",
    "StoreEngine",
    "default_store",
    "engine",
    "home",
    "is_url",
]
