"""Run the demo provider on loopback: uvicorn in a daemon thread with its own event loop; or,
with ``serve(in_process=True)``, in the caller's process without a socket (see ``in_process``).

`serve()` returns once the server accepts connections. The socket is bound here, before
uvicorn starts, so port 0 works and the real port is known without parsing logs; a port
that is already taken fails in the caller's thread with the usual OSError.

`DemoServer.restart(down)` (or POST /_restart) closes that port for `down` seconds and then
binds it again, on the same thread and event loop, serving the same state.
"""

from __future__ import annotations

import asyncio
import linecache
import os
import re
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any

from playbook._internal.dist import install_hint
from playbook.demo.settings import DemoSettings, down_seconds
from playbook.demo.state import DemoState

__all__ = ["DemoServer", "serve"]

_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0
# The port serve() takes when it is free: an http_tool's receipts answer for the URL it calls, so
# a demo on the same URL in the next session finds the receipts of this one.
DEFAULT_PORT = 8787
_BACKLOG = 1024  # connections waiting to be accepted
# Servers serve() started on its own choice of port, by the place that asked: that place asking
# again (a notebook cell run again) gets the same server, so the same URL and the same receipts.
_started: weakref.WeakValueDictionary[tuple[str, str, str], DemoServer] = weakref.WeakValueDictionary()
_started_lock = threading.Lock()
# A notebook cell's code is compiled under a name made from its text (ipykernel) or its execution
# count (IPython): a cell run again, or edited, is the same place, told apart by its line.
_CELL = re.compile(r"ipykernel_\d+[/\\]\d+\.py$|^<ipython-input-")


def serve(
    port: int | None = None,
    host: str = "127.0.0.1",
    *,
    clock: Callable[[], float] | None = None,
    in_process: bool = False,
    **settings: Any,
) -> DemoServer:
    """Start the demo provider and return its handle once it accepts connections.

    ``port=None`` takes 8787 when it is free (so reruns in a new session call the same URL and
    reuse their receipts), else any free port; ``port=0`` always any free port.  Called again
    from the same place in one process (a notebook cell run again, edited or not), it returns
    the server it started there, still running, with its counters zeroed and ``settings``
    applied: the same URL, so the cell's calls find their receipts and a rerun pays nothing.
    ``settings`` are ``DemoSettings`` fields (rps=..., quota=..., fault_rate=..., ...).
    Use it as a context manager, or call ``.stop()``, to shut it down.

    ``in_process=True`` opens no socket: the provider is served at ``http://demo.local`` (then
    ``demo-2.local``...), a name only the runs of this process reach, through httpx's ASGI
    transport, answering in their own event loop.  Other processes (a Dask worker, a script
    started with ``subprocess``) and clients made elsewhere (``httpx.Client()``, an SDK's) do
    not reach it; ``restart()`` has no port to close.  ``port`` and ``host`` do not apply.

    While ``$PLAYBOOK_FIXTURES`` replays fixtures, no server starts: the stand-in it returns has
    a URL that goes nowhere and counters at zero (every call is answered from the fixtures).
    """
    replaying = os.environ.get("PLAYBOOK_FIXTURES")
    if replaying and os.environ.get("PLAYBOOK_FIXTURES_MODE", "replay") == "replay":
        from playbook.demo.offline import OfflineDemo

        # the same face
        return OfflineDemo(replaying, DemoSettings.from_kwargs(**settings))  # type: ignore[return-value]
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the demo provider needs starlette and uvicorn ({exc.name} is missing): {install_hint('demo')}"
        ) from exc
    chosen = DemoSettings.from_kwargs(**settings)
    if in_process and port is not None:
        raise ValueError(f"serve(in_process=True) opens no port: leave out port={port!r}")
    if port is not None or clock is not None:  # asked for a port, or a clock of its own: a server of its own
        return _started_server(chosen, host, port, clock, in_process)
    site = ("in process" if in_process else host, *_site())
    with _started_lock:
        server = _started.get(site)
        if server is not None and server.running:
            server._state.initial = chosen  # reset() returns to these
            server.reset()
            return server
        server = _started[site] = _started_server(chosen, host, None, None, in_process)
    return server


def _started_server(
    settings: DemoSettings,
    host: str,
    port: int | None,
    clock: Callable[[], float] | None,
    in_process: bool,
) -> DemoServer:
    server = DemoServer(settings, host=host, port=port, clock=clock, in_process=in_process)
    server._start()
    return server


def _site() -> tuple[str, str]:
    """Where serve() was called: the file (any notebook cell is one place) and the line's text."""
    frame = sys._getframe(2)
    name, number = frame.f_code.co_filename, frame.f_lineno
    line = linecache.getline(name, number).strip() or str(number)
    return ("<cell>" if _CELL.search(name) else name), line


class DemoServer:
    """Handle on a running demo provider: its URL, counters and knobs."""

    def __init__(
        self,
        settings: DemoSettings,
        *,
        host: str = "127.0.0.1",
        port: int | None = 0,
        clock: Callable[[], float] | None = None,
        in_process: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.in_process = in_process
        self._origin: str | None = None  # an in-process demo's URL, mounted until stop()
        self._app: Any = None
        # An injected clock (monotonic seconds) drives rate buckets, quotas and jobs: tests
        # use a frozen one so limits do not depend on how fast a loaded machine runs.
        self._state = DemoState(settings, clock=clock or time.monotonic)
        self._config: Any = None  # uvicorn.Config and uvicorn.Server, typed loosely to keep
        self._server: Any = None  # uvicorn a lazy import; a restart makes a new Server
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._back_at: float | None = None  # monotonic time a restart listens again
        self._error: BaseException | None = None
        self._stopped = False

    @property
    def url(self) -> str:
        """Base URL without a trailing slash, e.g. http://127.0.0.1:54321 (http://demo.local in process)."""
        if self.in_process:
            return self._origin or "http://demo.local"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def app(self) -> Any:
        """The Starlette app this provider serves (an ASGI app: for ``starlette.testclient.TestClient``
        or ``httpx.ASGITransport``, to send it requests in this process without the network)."""
        if self._app is None:
            from playbook.demo.app import build_app

            self._app = build_app(state=self._state, restart=None if self.in_process else self._go_down)
        return self._app

    @property
    def settings(self) -> DemoSettings:
        """The settings in force now."""
        return self._state.settings

    @property
    def running(self) -> bool:
        if self.in_process:
            return self._origin is not None and not self._stopped
        return self._thread is not None and self._thread.is_alive() and not self._stopped

    def stats(self) -> dict[str, Any]:
        """A snapshot of the request counters (a plain JSON-able dict)."""
        return self._state.stats()

    def reset(self, **settings: Any) -> DemoSettings:
        """Zero counters, limits, quotas and jobs; settings return to those given to
        `serve()`, with `settings` applied on top."""
        return self._state.reset(**settings)

    def configure(self, **settings: Any) -> DemoSettings:
        """Change settings now, keeping counters, rate buckets, quotas and jobs."""
        return self._state.configure(**settings)

    def restart(self, down: float) -> None:
        """Stop listening for ``down`` seconds, then serve again on the same port.

        Returns once the port is closed: a connection attempt is refused, as from a provider
        being redeployed. Requests already being answered finish (up to 2 s). When it listens
        again the counters, quotas, jobs and settings are those it had; token buckets and fixed
        windows start afresh, as a restarted process's memory does.
        """
        down = down_seconds(down)
        if self.in_process:
            raise RuntimeError(
                f"the demo provider on {self.url} is served in this process, with no port to close: "
                "serve it on loopback (in_process=False) to restart it"
            )
        loop = self._loop
        if loop is None or not self.running:
            raise RuntimeError(f"the demo provider on {self.url} is not running")
        if threading.current_thread() is self._thread:
            raise RuntimeError("restart() waits for the server's own thread; from a request, POST /_restart")
        asyncio.run_coroutine_threadsafe(self._go_down(down), loop).result(_STOP_TIMEOUT)

    async def _go_down(self, down: float) -> None:
        self._back_at = time.monotonic() + down
        server = self._server
        # Close the listening sockets now rather than at uvicorn's next tick (0.1 s away), so
        # the port refuses connections from the moment restart() returns.
        for listener in getattr(server, "servers", ()):
            listener.close()
        server.should_exit = True

    def _listen(self, port: int | None) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            return self._socket(family, DEFAULT_PORT if port is None else port)
        except OSError:
            if port is not None:
                raise
            return self._socket(family, 0)  # the usual port is taken (another demo): any free one

    def _socket(self, family: socket.AddressFamily, port: int) -> socket.socket:
        """A socket listening on ``port``.  It listens before it is handed on: with SO_REUSEADDR
        two processes starting at once may both bind a port no one listens on yet, and only
        the first to listen has it (the other's listen fails, and it takes another port, rather
        than sending its calls to the first's server)."""
        # proto must say TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets
        # whose proto is IPPROTO_TCP, and without it Nagle meets delayed ACKs and every
        # response stalls ~40 ms (1,400 req/s instead of >10,000 at 64 in flight).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, port))
            sock.listen(_BACKLOG)
        except BaseException:
            sock.close()
            raise
        return sock

    def _uvicorn(self) -> Any:
        import uvicorn

        if self._config is None:
            self._config = uvicorn.Config(
                self.app,
                log_level="warning",
                log_config=None,  # never reconfigure the host process's logging (notebooks)
                access_log=False,
                lifespan="off",
                ws="none",
                timeout_graceful_shutdown=2,
                backlog=_BACKLOG,
            )
        return uvicorn.Server(self._config)

    def _start(self) -> None:
        if self.in_process:
            from playbook.demo.in_process import claim_origin

            self.port = None
            self._origin = claim_origin(self.app)
            return
        sock = self._listen(self.port)
        self.port = sock.getsockname()[1]
        self._server = self._uvicorn()
        self._thread = threading.Thread(
            target=self._run, args=(sock,), name=f"playbook-demo-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the demo provider did not start on {self.url}") from self._error
            time.sleep(0.002)

    def _run(self, sock: socket.socket) -> None:
        # uvicorn's own run() would end with the first shutdown; one loop that serves again
        # after a restart keeps the thread, and with it `running`, for the server's whole life.
        # The loop is the one uvicorn would pick (uvloop when installed).
        factory = self._config.get_loop_factory() if hasattr(self._config, "get_loop_factory") else None
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(self._serve(sock))
        except BaseException as exc:  # reported by _start(); a thread cannot raise
            self._error = exc

    async def _serve(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        while True:
            try:
                await self._server.serve(sockets=[sock])
            finally:
                sock.close()
            if self._stopped or self._back_at is None:
                return
            # stop() comes from another thread
            while not self._stopped and (left := self._back_at - time.monotonic()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(min(left, 0.05))  # short steps, so stop() ends a long down at once
            if self._stopped:
                return
            self._back_at = None
            sock = self._listen(self.port)
            self._state.restarted()
            self._server = server = self._uvicorn()
            if self._stopped:  # stop() read the previous server between our check and here
                server.should_exit = True

    def stop(self) -> None:
        """Stop serving and join the thread. Safe to call more than once."""
        if self.in_process:
            if self._origin is not None and not self._stopped:
                from playbook.demo.in_process import release_origin

                release_origin(self._origin)  # its name may go to a demo served later
            self._stopped = True
            return
        self._stopped = True
        thread, server = self._thread, self._server
        if thread is None or server is None:
            return
        server.should_exit = True
        thread.join(_STOP_TIMEOUT)
        if thread.is_alive():  # requests still sleeping past the graceful timeout
            self._server.force_exit = True
            thread.join(_STOP_TIMEOUT)

    def __enter__(self) -> DemoServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<DemoServer {self.url} requests={self._state.stats()['requests']} {state}>"
