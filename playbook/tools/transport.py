"""The HTTP client a run uses unless a tool brings its own, and how many connections it may open.

- **Speed.** At 64 calls in flight httpx's own pool does a tenth of the throughput of the
  ``httpx-aiohttp`` transport, so the client sends through aiohttp when it is installed.
- **The environment, as plain httpx reads it.** An httpx client given a transport ignores
  ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY`` and ``NO_PROXY``.  So when the environment names
  a proxy, httpx itself reads these variables and builds the client (``HttpxAiohttpClient``
  keeps aiohttp underneath, so a proxied run keeps its speed); with a socks proxy, which aiohttp
  cannot reach, the client is plain httpx.  Certificates come from ``SSL_CERT_FILE`` /
  ``SSL_CERT_DIR`` on every path.
- **Bounded connections.** At most ``PER_HOST`` connections to one host, and no more in all than
  half the process's open-file limit: calls beyond that wait for a free connection in the pool.
  ``concurrency=10_000`` then means 10,000 rows under way, not 10,000 sockets (with
  ``ulimit -n 256``, most of those would fail with "Too many open files").
- **Apps served in this process.** :func:`mount` sends a run's calls to one origin through a
  transport of its own instead of the network: the demo provider's ``serve(in_process=True)``
  mounts its ASGI app there, so a run reaches it without a socket (as httpx's ``mounts=``).
"""

from __future__ import annotations

import inspect
import os
import threading
import urllib.request
import warnings
from urllib.parse import urlsplit

import httpx

__all__ = [
    "PER_HOST",
    "connection_budget",
    "default_client",
    "mount",
    "open_file_limit",
    "proxy_for",
    "unmount",
    "warn_past_file_limit",
]

PER_HOST = 100  # connections to one host: more rarely goes faster, and servers count them too
_KEEPALIVE = 5.0  # seconds an idle connection is kept (httpx's default)
# Origins ("http://demo.local") whose calls go through a transport of their own, not the network.
_mounted: dict[str, httpx.AsyncBaseTransport] = {}
_mounted_lock = threading.Lock()


def mount(origin: str, transport: httpx.AsyncBaseTransport) -> None:
    """Send the calls of every run this process starts from now on to ``origin`` (a scheme and
    a host, e.g. ``http://demo.local``) through ``transport``, until :func:`unmount`.  A tool
    given a ``client=`` of its own sends through that client instead."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query:
        raise ValueError(f"mount() takes an origin such as 'http://demo.local', not {origin!r}")
    with _mounted_lock:
        if origin in _mounted:
            raise ValueError(f"{origin} is mounted already: unmount() it first")
        _mounted[origin] = transport


def unmount(origin: str) -> None:
    """Calls to ``origin`` go to the network again (nothing happens if it was not mounted)."""
    with _mounted_lock:
        _mounted.pop(origin, None)


def _mounts() -> dict[str, httpx.AsyncBaseTransport | None]:
    with _mounted_lock:
        return dict(_mounted)


def open_file_limit() -> int | None:
    """This process's open-file limit (the soft ``RLIMIT_NOFILE``); None where there is none to read."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else soft


def connection_budget() -> int | None:
    """Connections this process may have open at once: half its open-file limit (the other half
    is for the receipt store, a notebook's sockets, the libraries' own files); None: no bound."""
    limit = open_file_limit()
    return None if limit is None else max(1, limit // 2)


def warn_past_file_limit(concurrency: int) -> None:
    """Warn when ``concurrency`` asks for more calls in flight than the open-file limit leaves
    connections for: they do not fail, they wait for a free connection, so the run is slower
    than the number suggests."""
    limit, budget = open_file_limit(), connection_budget()
    if limit is None or budget is None or concurrency <= budget:
        return
    warnings.warn(
        f"concurrency={concurrency} is more calls in flight than this process's open-file limit ({limit}) "
        f"leaves connections for ({budget}): HTTP calls beyond {budget} wait for a free connection, and at most "
        f"{min(PER_HOST, budget)} go to one host at once. Pass concurrency={budget} or less, or raise the limit before starting "
        f"Python (ulimit -n {max(4096, 2 * concurrency)}) or with resource.setrlimit(resource.RLIMIT_NOFILE, ...)",
        RuntimeWarning,
        stacklevel=_callers_level(),
    )


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside playbook: the warning points at the user's
    ``map(...)`` line, whichever entry point it came through (as pandas' ``find_stack_level``)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = inspect.currentframe(), 0
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def default_client() -> httpx.AsyncClient:
    """A new client for one run (see the module docstring)."""
    budget = connection_budget()
    per_host = PER_HOST if budget is None else min(PER_HOST, budget)
    limits = httpx.Limits(
        max_connections=per_host, max_keepalive_connections=per_host, keepalive_expiry=_KEEPALIVE
    )
    mounts = _mounts()  # taken now: a mount made later reaches the runs started after it
    try:
        import aiohttp
        from httpx_aiohttp import AiohttpTransport, HttpxAiohttpClient
    except ImportError:  # the plain httpx pool works, only slower at high concurrency
        return httpx.AsyncClient(limits=limits, mounts=mounts)
    proxies = _configured_proxies()
    if proxies:
        if not all(_speaks_http(proxy) for proxy in proxies):
            # aiohttp cannot reach a socks proxy; httpx's own transport can
            return httpx.AsyncClient(limits=limits, mounts=mounts)
        # httpx reads the proxy variables and mounts a transport per proxy, as for plain httpx;
        # this client makes those transports aiohttp's.  Each pool holds `per_host` connections.
        return HttpxAiohttpClient(limits=limits, mounts=mounts)
    certificates = httpx.create_ssl_context()  # SSL_CERT_FILE / SSL_CERT_DIR, as httpx reads them

    def session() -> aiohttp.ClientSession:
        # Made by the transport at its first request, inside the run's event loop.  The transport
        # would bound connections in all only; a bound per host keeps one slow provider from
        # taking the connections every other provider needs.
        connector = aiohttp.TCPConnector(
            limit=budget or 0, limit_per_host=per_host, ssl=certificates, keepalive_timeout=_KEEPALIVE
        )
        return aiohttp.ClientSession(connector=connector)

    return httpx.AsyncClient(
        transport=AiohttpTransport(verify=certificates, limits=limits, client=session), mounts=mounts
    )


def _configured_proxies() -> list[str]:
    """The proxy URLs the environment names for httpx to use: none when ``NO_PROXY=*``."""
    found = urllib.request.getproxies()  # what httpx reads too: the *_PROXY variables, the OS settings
    if "*" in (host.strip() for host in found.get("no", "").split(",")):
        return []
    return [found[scheme] for scheme in ("http", "https", "all") if found.get(scheme)]


def proxy_for(url: str) -> tuple[str, str] | None:
    """The proxy a call to ``url`` goes through, as (the variable that names it, the proxy's URL
    without its credentials), or None: how an error says that a dead proxy is not a dead provider."""
    parts = urlsplit(url)
    found = urllib.request.getproxies()
    name = parts.scheme if parts.scheme in found else "all"
    proxy = found.get(name)
    if f"{parts.scheme}://{parts.netloc}" in _mounts():  # served in this process: no proxy between
        return None
    if not proxy or not _configured_proxies() or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    shown = urlsplit(proxy if "://" in proxy else "http://" + proxy)
    # never its password
    where = f"{shown.scheme}://{shown.hostname}" + (f":{shown.port}" if shown.port else "")
    return f"${name.upper()}_PROXY", where


def _speaks_http(proxy: str) -> bool:
    scheme, separator, _ = proxy.partition("://")
    return not separator or scheme.lower() in ("http", "https")  # httpx reads "host:port" as http://
