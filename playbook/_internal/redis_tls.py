"""Whether a ``rediss://`` URL that timed out names a server that speaks plain Redis, not TLS.

A plain Redis sent a TLS handshake reads it as a command that never ends: the client's handshake
times out, saying nothing of TLS.  Asking the same port ``PING`` in plain text tells the two apart.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

__all__ = ["TLS_HINT", "plain_behind_tls"]

TLS_HINT = "does the server speak TLS? use redis:// for a plain one"


def plain_behind_tls(url: str, exc: BaseException) -> bool:
    """Whether ``url`` is ``rediss://`` and its failure ``exc`` (a timeout, a failed handshake) came
    from a server that answers plain Redis on that port."""
    parts = urlsplit(url)
    said = f"{type(exc).__name__} {exc}"
    if parts.scheme != "rediss" or ("Timeout" not in said and "SSL" not in said):
        return False
    try:
        with socket.create_connection(
            (parts.hostname or "localhost", parts.port or 6379), timeout=1.0
        ) as sock:
            sock.settimeout(1.0)
            sock.sendall(b"PING\r\n")
            answer = sock.recv(16)
    except OSError:
        return False
    return answer.startswith((b"+PONG", b"-NOAUTH", b"-ERR"))
