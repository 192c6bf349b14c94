"""The demo provider served in the caller's process, without a socket: ``serve(in_process=True)``.

Its Starlette app is mounted (``playbook.tools.transport.mount``) at an origin that names no host
on any network, ``http://demo.local``: the runs this process starts send their calls to it
through httpx's ASGI transport, and the app answers in the caller's own event loop.  A request
is judged the moment it is sent, with nothing queued in a socket between, and a run on a loop
of virtual time meets a provider whose latency and holds pass in that time too.

What a socket would add and an app called in-process lacks is put back here: the read timeout
a call was given ends it with ``httpx.ReadTimeout``, as a server too slow to answer does.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from playbook.tools.transport import mount, unmount

__all__ = ["InProcessTransport", "claim_origin", "release_origin"]

_HOST = "demo.local"
_taken: set[str] = set()
_taken_lock = threading.Lock()


class InProcessTransport(httpx.AsyncBaseTransport):
    """httpx's ``ASGITransport`` over ``app``, with the read timeout a socket would enforce."""

    def __init__(self, app: Any) -> None:
        # An error in the app is a 500, as the server would answer it, not an exception in the run.
        self._asgi = httpx.ASGITransport(app=app, raise_app_exceptions=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        read = request.extensions.get("timeout", {}).get("read")
        try:
            async with asyncio.timeout(read):
                return await self._asgi.handle_async_request(request)
        except TimeoutError:
            raise httpx.ReadTimeout(
                f"no answer from {request.url.host} within {read:g}s", request=request
            ) from None


def claim_origin(app: Any) -> str:
    """Mount ``app`` at the first free origin of ``http://demo.local``, ``http://demo-2.local``...
    and return it: two demos served in one process (a provider and its backup) differ by name."""
    with _taken_lock:
        n = 1
        while (host := _HOST if n == 1 else f"demo-{n}.local") in _taken:
            n += 1
        _taken.add(host)
    origin = f"http://{host}"
    mount(origin, InProcessTransport(app))
    return origin


def release_origin(origin: str) -> None:
    """Unmount ``origin``; a demo served later may take its name."""
    unmount(origin)
    with _taken_lock:
        _taken.discard(origin.removeprefix("http://"))
