"""A Redis URL, found to be one server or a Redis Cluster, and the client that speaks to it.

A user names a store or shared limits with a plain ``redis://`` or ``rediss://`` URL of any node.
Whether that node is one server or a member of a cluster is asked of it (``INFO cluster``), once
per URL and process, not configured: the same URL keeps working if the server is later made
part of a cluster.  A cluster has one database, 0; a URL naming another is refused, naming it.

Clients made here ride out a failover: a cluster client retries a command that met a node gone,
a cluster reconfiguring or a slot on the move (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``)
for up to about :data:`FAILOVER_SECONDS`, asking the cluster where the slot is now between tries,
which is longer than a replica takes to be promoted with the usual ``cluster-node-timeout``.
A client opened after the node a URL names has died starts from the cluster's other nodes, as
the last client of that URL in this process found them (:func:`remember`).
"""

from __future__ import annotations

import functools
import threading
from typing import Any
from urllib.parse import parse_qsl, urlsplit

__all__ = ["FAILOVER_SECONDS", "async_client", "is_cluster", "remember", "sync_client"]

FAILOVER_SECONDS = 20.0  # about how long a cluster client keeps retrying through a failover
_found: dict[str, bool] = {}
_nodes: dict[str, list[tuple[str, int]]] = {}  # each cluster URL's nodes, as a client last found them
_lock = threading.Lock()


def is_cluster(url: str, **options: Any) -> bool:
    """Whether the server at ``url`` is a member of a Redis Cluster (asked once per process).
    ``redis`` errors (cannot connect, wrong password) pass to the caller, who names them."""
    with _lock:
        known = _found.get(url)
    if known is not None:
        return known
    import redis

    with redis.Redis.from_url(url, **options) as probe:
        try:
            found = bool(probe.info("cluster").get("cluster_enabled"))
        except redis.ResponseError as exc:
            # a node of a cluster asked with a URL naming a database (its SELECT refused): a
            # cluster, said so by whoever opens it (_database); a server or proxy that does not
            # know the section: not a cluster
            found = "cluster mode" in str(exc)
    with _lock:
        _found[url] = found
    return found


def remember(url: str, client: Any) -> None:
    """Keep the nodes a cluster ``client`` of ``url`` found, for the next client of ``url`` in this
    process to start from (the node the URL names may since have died, its replica promoted).
    A client of one server: nothing to keep.  Call it before closing a client."""
    nodes = getattr(client, "get_nodes", None)
    if nodes is None:
        return
    found = [(node.host, node.port) for node in nodes()]
    if found:
        with _lock:
            _nodes[url] = found


def _startup(url: str, node: Any) -> dict[str, Any]:
    with _lock:
        known = _nodes.get(url, [])
    return {"startup_nodes": [node(host, port) for host, port in known]} if known else {}


@functools.cache
def _options_known() -> frozenset[str]:
    """The options a URL's query may give redis-py: its connections' settings."""
    import inspect

    from redis import connection

    names = set(connection.URL_QUERY_ARGUMENT_PARSERS)
    for kind in (
        connection.AbstractConnection,
        connection.Connection,
        connection.SSLConnection,
        connection.UnixDomainSocketConnection,
    ):
        names.update(inspect.signature(kind.__init__).parameters)
    return frozenset(names - {"self", "kwargs"})


def _query(url: str) -> None:
    """A ``ValueError`` naming an option in ``url``'s query that no connection takes (redis-py
    would say ``__init__() got an unexpected keyword argument`` when it first connects)."""
    unknown = [name for name, _ in parse_qsl(urlsplit(url).query) if name not in _options_known()]
    if unknown:
        said = (
            f"the URL's query names {', '.join(map(repr, unknown))}, not an option of a Redis connection "
            "(redis-py's, such as socket_timeout or ssl_cert_reqs; a store's also durability)"
        )
        raise ValueError(
            said + (": the store's keys are always under 'playbook:'" if "prefix" in unknown else "")
        )


def _database(url: str) -> None:
    path = urlsplit(url).path.strip("/")
    if path not in ("", "0"):
        raise ValueError(
            f"a Redis Cluster has one database, 0: {urlsplit(url).hostname}'s URL names database {path!r}"
        )


def _retry(asynchronous: bool) -> Any:
    from redis.backoff import ExponentialWithJitterBackoff

    if asynchronous:
        from redis.asyncio.retry import Retry
    else:
        from redis.retry import Retry  # type: ignore[assignment]
    # base 0.1 s doubling to 1 s: 24 tries is about FAILOVER_SECONDS
    return Retry(ExponentialWithJitterBackoff(base=0.1, cap=1.0), int(FAILOVER_SECONDS))


def sync_client(url: str, **options: Any) -> Any:
    """``redis.Redis`` for one server, ``redis.RedisCluster`` for a cluster (``options`` go to either;
    a cluster's retries are its own, see the module's doc)."""
    import redis

    _query(url)
    probe = {k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")}
    if not is_cluster(url, **probe):
        return redis.Redis.from_url(url, **options)
    _database(url)
    options = {k: v for k, v in options.items() if k not in ("retry", "health_check_interval")}
    from redis.cluster import ClusterNode

    return redis.RedisCluster.from_url(url, retry=_retry(False), **_startup(url, ClusterNode), **options)


def async_client(url: str, **options: Any) -> Any:
    """As :func:`sync_client`, for asyncio (``redis.asyncio``).  Whether ``url`` is a cluster is
    asked synchronously, once per process: a few milliseconds, the first time."""
    import redis.asyncio

    _query(url)
    probe = {k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")}
    if not is_cluster(url, **probe):
        return redis.asyncio.Redis.from_url(url, **options)
    _database(url)
    options = {k: v for k, v in options.items() if k not in ("retry", "health_check_interval")}
    from redis.asyncio.cluster import ClusterNode

    return redis.asyncio.RedisCluster.from_url(
        url, retry=_retry(True), **_startup(url, ClusterNode), **options
    )
