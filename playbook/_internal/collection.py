"""Python's collection of its youngest objects, made rarer while rows run.

A run keeps hundreds of rows in flight, each holding a few coroutines, futures and dicts for a
moment: the default threshold (a collection every 700 objects made and not yet freed) collects
every hundred rows or so, a tenth of a first run's time at a million rows.  While any run goes,
the threshold is 10,000, as services that make many short-lived objects set it; when the last
run ends it is put back, unless something else changed it meanwhile, and everything is collected
once if many rows have run since everything was last collected.  Nothing else changes: every
object that is garbage is still collected, a little later.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["fewer_collections"]

YOUNG = 10_000  # objects made, less those freed, between two collections of the youngest

_lock = threading.Lock()
_runs = 0
_before: tuple[int, ...] | None = None  # the thresholds to put back, once the last run ends
# Rows run since everything was last collected, past which runs collect everything when they
# end: the cycles a run leaves (its table, its state) hold a few objects each, but megabytes (a
# command line's chunk of 500,000 rows: 80 MB).  Smaller runs add up first, so that each does not
# pay a full collection of a big kernel (a quarter of a second at 4 million objects).  A full
# collection made by anyone else (``gc.collect()``, or Python's own) starts the count again.
ROWS = 100_000
_rows = 0
_full = -1  # how many full collections Python had made when the count started


def _full_collections() -> int:
    return int(gc.get_stats()[-1]["collections"])


@contextlib.contextmanager
def fewer_collections(rows: int) -> Iterator[None]:
    """Collect the youngest objects every :data:`YOUNG` of them while this run of ``rows`` rows (or
    another) goes."""
    global _runs, _before, _rows, _full
    with _lock:
        _runs += 1
        full = _full_collections()
        if full != _full:  # everything was collected since the count started
            _rows, _full = 0, full
        _rows += rows
        if _runs == 1:
            threshold = gc.get_threshold()
            if 0 < threshold[0] < YOUNG:  # 0: collection switched off by the user; more: set higher already
                _before = threshold
                gc.set_threshold(YOUNG, *threshold[1:])
    try:
        yield
    finally:
        with _lock:
            _runs -= 1
            if _runs == 0 and _before is not None:
                if gc.get_threshold()[0] == YOUNG:  # not changed by anyone since
                    gc.set_threshold(*_before)
                _before = None
                # Cycles left by earlier runs reached the oldest generation, which rarer young
                # collections reach rarely: collected now, a command line running a file a chunk
                # at a time holds one chunk's, not every chunk's (80 MB each at 500,000 rows).
                if _rows >= ROWS:
                    gc.collect()
                    _rows, _full = 0, _full_collections()
