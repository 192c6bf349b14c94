"""What a cluster job's client and its workers say to each other, through the job's Redis.

Each partition's run reports about four times a second: its counters, the providers as its
worker sees them, the rows whose state changed (failed, parked, held or none of those any more),
and its new notices.  Reports go on a list the client drains; the client asks a stop by setting
a key every partition's run reads when it reports.  Both expire a day after the job's last word,
so a job whose client went away leaves nothing behind for long.  Every key of a job is under
one hash tag (:func:`job_key`), and the job's Redis may be one server or a Redis Cluster.

Rows are named by their position in the whole job (the partition's offset plus the row's
position in it) and their index label, in tagged JSON so that any label comes back as it was.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from playbook import tagged
from playbook._internal.redis_nodes import sync_client

__all__ = ["COUNTERS", "TTL", "Channel", "decode_label", "encode_label", "job_key", "plain_hops"]

TTL = 86_400  # seconds a job's keys outlive its last word
COUNTERS = (
    "total",
    "ok",
    "reused",
    "failed",
    "parked",
    "skipped",
    "in_flight",
    "waiting",
    "sleeping",
    "calls_executed",
    "calls_reused",
    "calls_shared",
    "calls_failed",
    "calls_local",
    "cost_spent",
    "cost_saved",
    "receipts_lost",
    "cost_failed",
    "tokens",
    "calls_unpriced",
    "reused_unpriced",
)
_BATCH = 1000  # reports drained per round trip


def job_key(job: str, name: str) -> str:
    """A key of the job's: ``playbook:job:{<job>}:<name>``.  The job (16 hex digits) is every key's
    hash tag, so a Redis Cluster keeps a job's keys in one slot: the budget's script and a
    pipeline over its reports and stop flag never cross slots."""
    return f"playbook:job:{{{job}}}:{name}"


def plain_hops(addresses: Sequence[str]) -> str | None:
    """How what the client sends to these Dask addresses (the scheduler's, the workers') would
    cross a network as plain text, or ``None``: each is in this process (``inproc://``), on
    this machine (a loopback address) or encrypted (``tls://``)."""
    for address in addresses:
        scheme, _, rest = address.partition("://")
        host = rest.rsplit(":", 1)[0].strip("[]") if ":" in rest else rest
        if scheme in ("inproc", "tls") or host in ("localhost", "::1") or host.startswith("127."):
            continue
        return f"{address} is reached over {scheme or 'tcp'}://, unencrypted"
    return None


def encode_label(label: Any) -> Any:
    """An index label as JSON data (tagged: a Timestamp comes back a Timestamp)."""
    try:
        return tagged.encode(label)
    except (tagged.Unencodable, TypeError, ValueError):  # a label even tagged JSON cannot carry: as it prints
        return repr(label)


def decode_label(data: Any) -> Any:
    return tagged.decode(data)


class Channel:
    """A job's reports and its stop flag, on the Redis at ``url``."""

    def __init__(self, url: str, job: str) -> None:
        # Short timeouts: a report is progress, never worth stalling a run (or a panel) for.
        self._redis = sync_client(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.reports = job_key(job, "reports")
        self.stop_key = job_key(job, "stop")
        # each attempt's paid calls (counted with their receipts) and requests sent
        self.paid = job_key(job, "paid")

    def paid_by(self, attempt: str) -> tuple[int, float, int] | None:
        """The calls (and their cost) partition attempt ``attempt`` paid for and recorded, as its
        store counted them with their receipts, and the requests it sent (each counted before it
        went); None when the job's Redis does not answer."""
        import redis

        try:
            calls, cost, sent = self._redis.hmget(
                self.paid, [f"{attempt}:calls", f"{attempt}:cost", f"{attempt}:sent"]
            )
        except (redis.RedisError, redis.exceptions.RedisClusterException, OSError):
            return None
        return int(calls or 0), float(cost or 0.0), int(sent or 0)

    def report(self, message: dict[str, Any]) -> bool:
        """Send one report; True when the job was asked to stop."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.rpush(self.reports, tagged.dumps(message))
        pipe.expire(self.reports, TTL)
        pipe.exists(self.stop_key)
        return bool(pipe.execute()[-1])

    def drain(self) -> list[dict[str, Any]]:
        """The reports sent since the last drain, in order."""
        out: list[dict[str, Any]] = []
        while True:
            pipe = self._redis.pipeline(transaction=True)
            pipe.lrange(self.reports, 0, _BATCH - 1)
            pipe.ltrim(self.reports, _BATCH, -1)
            batch: Sequence[bytes] = pipe.execute()[0]
            out.extend(json.loads(item) for item in batch)
            if len(batch) < _BATCH:
                return out

    def drained(self) -> list[dict[str, Any]]:
        """:meth:`drain`, or none when Redis does not answer: reports are progress, and a Redis
        that blinks costs a refresh, not the job."""
        try:
            return self.drain()
        except Exception:
            return []

    def stop(self) -> None:
        self._redis.set(self.stop_key, b"1", ex=TTL)

    def reset(self) -> None:
        """A new round of the job (a retry): no stop asked."""
        self._redis.delete(self.stop_key)
