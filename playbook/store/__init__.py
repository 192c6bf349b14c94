"""Where receipts, row memos, steps and leases live: a directory with one SQLite file."""

from .db import FILE, FORMAT
from .receipts import MISSING, ReceiptStore, default_store, home

__all__ = ["FILE", "FORMAT", "MISSING", "ReceiptStore", "default_store", "home"]
