"""What went wrong talking to Redis, in words a user can act on."""

from __future__ import annotations

import errno

from playbook.store.protocol import StoreFailure

__all__ = ["failure"]


def failure(exc: BaseException, where: str) -> StoreFailure:
    """What went wrong talking to Redis at ``where``, in words a user can act on."""
    from redis import exceptions as e

    text = str(exc).strip()
    if isinstance(exc, (e.TimeoutError, TimeoutError)):
        return StoreFailure(f"Redis at {where} did not answer in time ({text or 'timed out'})", "ETIMEDOUT")
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


def _os_error(exc: BaseException) -> OSError | None:
    """The socket error behind a redis-py error ("Error 111 connecting to…" keeps it as its context)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
