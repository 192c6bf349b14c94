"""What ``WAIT 1`` after each write costs a store on a Redis Cluster (``python -m benchmarks.redis_wait``).

A local cluster of 3 masters with a replica each; batches of receipts (``BATCH`` a batch, as a
run writes them) written through the store's backend, with the WAIT it sends after each
master's part and without it (the same code, told that no master has a replica), alternated,
the median of ``REPEATS`` rounds each.
"""

from __future__ import annotations

import statistics
import sys
import time

from playbook.demo.redis_server import RedisClusterServer
from playbook.store.records import Record
from playbook.store.redis.backend import RedisBackend
from playbook.store.redis.slots import Slots

BATCH = 64
BATCHES = 100
REPEATS = 5


def _rate(backend: RedisBackend, start: int) -> float:
    """Receipts written per second, ``BATCHES`` batches of ``BATCH``."""
    began = time.perf_counter()
    for batch in range(BATCHES):
        first = start + batch * BATCH
        backend.write(
            [
                Record(f"r{n:032x}", "t", "1", "", 1.5, 0.0, False, 0, None, '{"n": 1}', None)
                for n in range(first, first + BATCH)
            ]
        )
    return BATCH * BATCHES / (time.perf_counter() - began)


def main() -> None:
    with RedisClusterServer() as cluster:
        backend = RedisBackend(cluster.url)
        waited, not_waited = [], []
        replicated = Slots._replicated
        for round_ in range(REPEATS):
            Slots._replicated = replicated  # type: ignore[method-assign]
            waited.append(_rate(backend, 2 * round_ * BATCH * BATCHES))
            Slots._replicated = lambda self, node: False  # type: ignore[method-assign]
            not_waited.append(_rate(backend, (2 * round_ + 1) * BATCH * BATCHES))
        Slots._replicated = replicated  # type: ignore[method-assign]
        backend.close()
    with_wait, without = statistics.median(waited), statistics.median(not_waited)
    print(f"receipts written a second on a 3-master cluster, batches of {BATCH}:")
    print(f"  with WAIT 1 after each master's part: {with_wait:,.0f}/s")
    print(f"  without:                              {without:,.0f}/s")
    print(f"  WAIT costs {1 - with_wait / without:.0%} of the write rate ({sys.argv[0]})")


if __name__ == "__main__":
    main()
