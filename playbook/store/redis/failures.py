"""What went wrong talking to Redis, in words a user can act on."""

from __future__ import annotations

import errno

from playbook.store.protocol import StoreFailure

__all__ = ["failure"]


def failure(exc: BaseException, where: str, *, cluster: bool = False) -> StoreFailure:
    """What went wrong talking to Redis at ``where`` (``cluster``: a Redis Cluster's node), in
    words a user can act on."""
    from redis import exceptions as e

    text = str(exc).strip()
    if cluster:
        said = _cluster_failure(exc, where, text)
        if said is not None:
            return said
    if isinstance(exc, (e.TimeoutError, TimeoutError)):
        return StoreFailure(
            f"Redis at {where} did not answer in time ({text or 'timed out'}){_tls_hint(exc, where)}",
            "ETIMEDOUT",
        )
    if isinstance(exc, e.AuthenticationError) and "***" not in where:
        return StoreFailure(
            f"Redis at {where} asks for a password: put it in the URL (redis://:PASSWORD@host:port/db)",
            "NOAUTH",
        )
    if isinstance(exc, e.AuthenticationError):
        return StoreFailure(f"Redis at {where} refused the user or password in the URL ({text})", "WRONGPASS")
    if isinstance(exc, (e.ConnectionError, OSError)):
        os_error = _os_error(exc)
        if os_error is None:
            return StoreFailure(f"cannot reach Redis at {where} ({text})", "ECONNECTION")
        return StoreFailure(
            f"cannot reach Redis at {where} ({os_error.strerror or text})",
            errno.errorcode.get(os_error.errno or 0),
        )
    if isinstance(exc, e.InvalidResponse):
        return StoreFailure(f"what answers at {where} is not Redis ({text})", "EPROTO")
    if isinstance(exc, e.ReadOnlyError):
        return StoreFailure(
            f"Redis at {where} is a read-only replica: name its primary in the URL", "READONLY"
        )
    if isinstance(exc, e.OutOfMemoryError) or "OOM command not allowed" in text:
        return StoreFailure(
            f"Redis at {where} is out of memory (maxmemory reached): raise its maxmemory, or clear receipts "
            "no longer needed",
            "OOM",
        )
    if isinstance(exc, e.NoPermissionError):
        return StoreFailure(f"the Redis user in {where} may not do this ({text})", "NOPERM")
    word = text.split(" ", 1)[0]
    return StoreFailure(f"Redis at {where} failed: {text}", word if word.isupper() else "REDIS")


def _cluster_failure(exc: BaseException, where: str, text: str) -> StoreFailure | None:
    """What went wrong on a Redis Cluster, when it is the cluster's own trouble (a master lost,
    slots without one); None for the rest (said as on one server)."""
    from redis import exceptions as e

    from playbook._internal.redis_nodes import FAILOVER_SECONDS

    within = f"within about {FAILOVER_SECONDS:.0f} s"
    fix = "start the node again, or see CLUSTER NODES on a live node"
    if isinstance(exc, e.SlotNotCoveredError):
        return StoreFailure(
            f"Redis Cluster at {where} has slots no master serves ({text}): {fix}", "CLUSTERDOWN"
        )
    if isinstance(exc, (e.ClusterDownError, e.MasterDownError)) or text.startswith("CLUSTERDOWN"):
        return StoreFailure(
            f"Redis Cluster at {where} is down ({text}): it lost a master and no replica took over {within}, or it "
            f"lost most of its masters; {fix}",
            "CLUSTERDOWN",
        )
    if isinstance(
        exc, (e.ClusterError, e.RedisClusterUnreachableError, e.ConnectionError, e.TimeoutError, OSError)
    ):
        return StoreFailure(
            f"Redis Cluster at {where} lost a master and no replica took over {within} ({text or type(exc).__name__}): "
            f"{fix}",
            "CLUSTERDOWN",
        )
    return None


def _tls_hint(exc: BaseException, where: str) -> str:
    """``: does the server speak TLS?…`` when ``where`` is ``rediss://`` at a plain Redis; else nothing."""
    from playbook._internal.redis_tls import TLS_HINT, plain_behind_tls

    return f": {TLS_HINT}" if plain_behind_tls(where, exc) else ""


def _os_error(exc: BaseException) -> OSError | None:
    """The socket error behind a redis-py error ("Error 111 connecting to…" keeps it as its context)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
