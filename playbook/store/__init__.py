"""Where receipts, row memos, steps and leases live: a directory with one SQLite file (the
default), a Redis server shared by many kernels and machines, or memory; see protocol.py."""

from .db import FILE, FORMAT
from .default import default_store
from .engine import StoreEngine
from .location import home, is_url
from .protocol import Backend
from .receipts import ReceiptStore, engine
from .records import MISSING

__all__ = ["FILE", "FORMAT", "MISSING", "Backend", "ReceiptStore", "StoreEngine", "default_store", "engine", "home", "is_url"]
