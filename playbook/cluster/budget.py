"""``max_cost`` for a cluster job: one budget in the job's Redis that every partition spends from.

A paid call reserves its estimate there before it is sent (an atomic check-and-add: two workers
cannot both take the last of it) and settles its real cost once answered, as a local run's
:class:`~playbook.runtime.calls.scope.CostBudget` does in memory.  A call that does not fit waits
for this partition's own calls in flight to settle (they may cost less than reserved); with
none, its row parks.  What a worker that died had reserved stays spent: the budget errs on the
side of paying less.
"""

from __future__ import annotations

from typing import Any

from playbook._internal.redis_nodes import sync_client
from playbook._internal.words import money
from playbook.cluster.wire import TTL, job_key
from playbook.runtime.calls.scope import CostBudget

__all__ = ["SharedCostBudget"]

# KEYS[1] the job's spending; ARGV: cost, limit.  1 and the cost is added, or 0 and nothing is.
_TAKE = """
local spent = tonumber(redis.call('GET', KEYS[1]) or '0')
if spent + tonumber(ARGV[1]) > tonumber(ARGV[2]) + 1e-9 then return 0 end
redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


class SharedCostBudget(CostBudget):
    """``max_cost`` over a whole cluster job, kept at ``playbook:job:{<job>}:spent`` in its Redis."""

    __slots__ = ("_key", "_redis", "_take")

    def __init__(self, limit: float, url: str, job: str) -> None:
        super().__init__(limit)
        self._redis: Any = sync_client(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._key = job_key(job, "spent")
        self._take = self._redis.register_script(_TAKE)

    def __repr__(self) -> str:
        return f"<SharedCostBudget {money(self.limit or 0.0)} at {self._key} ({self.pending} in flight here)>"

    def take(self, cost: float) -> bool:
        """Add ``cost`` to the job's spending if it fits under the limit, atomically across the cluster."""
        if not self._take(keys=[self._key], args=[repr(float(cost)), repr(float(self.limit)), TTL]):  # type: ignore[arg-type]
            return False
        self.committed += cost  # this partition's part, for its repr
        return True

    def add(self, amount: float) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.incrbyfloat(self._key, amount)
        pipe.expire(self._key, TTL)
        pipe.execute()
        self.committed += amount
