"""Where receipts, row memos, steps and leases live: a directory with one SQLite file (the
default), a Redis server shared by many kernels and machines, or memory; see protocol.py."""

from .db import FILE, FORMAT
from .default import default_store
from .protocol import Backend
from .receipts import MISSING, ReceiptStore, home, is_url

__all__ = ["FILE", "FORMAT", "MISSING", "Backend", "ReceiptStore", "default_store", "home", "is_url"]
