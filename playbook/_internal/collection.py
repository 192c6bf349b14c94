"""Python's collection of its youngest objects, made rarer while rows run.

A run keeps hundreds of rows in flight, each holding a few coroutines, futures and dicts for a
moment: the default threshold (a collection every 700 objects made and not yet freed) collects
every hundred rows or so, a tenth of a first run's time at a million rows.  While any run goes,
the threshold is 10,000, as services that make many short-lived objects set it; when the last
run ends it is put back, unless something else changed it meanwhile, and everything is collected
once if the runs made many objects.  Nothing else changes: every object that is garbage is still collected, a little later.
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
# Young collections while runs went (each after YOUNG objects that lasted) since runs last
# collected everything, past which they have left enough behind to collect everything when they
# end; fewer (small runs) add up first, so that each does not pay a full collection of a big
# kernel (a quarter of a second at 4 million objects).
_MANY = 10
_young = 0  # young collections while runs went, not yet followed by a full one
_young_at_start = 0


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect the youngest objects every :data:`YOUNG` of them while this (or another) run goes."""
    global _runs, _before, _young, _young_at_start
    with _lock:
        _runs += 1
        if _runs == 1:
            _young_at_start = gc.get_stats()[0]["collections"]
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
                _young += gc.get_stats()[0]["collections"] - _young_at_start
                if _young >= _MANY:
                    gc.collect()
                    _young = 0
