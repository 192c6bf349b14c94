"""Who holds something shared (a lease, a concurrency permit): ``host:pid:token``, and whether
that process still runs.  A holder on this machine that died is known at once, so what it held
comes back at once instead of when it expires; one on another machine is waited out."""

from __future__ import annotations

import os
import socket

__all__ = ["HOST", "dead"]

HOST = socket.gethostname()


def dead(owner: str) -> bool:
    """True when ``owner`` is a process on this machine that no longer runs."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != HOST or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _zombie(pid)


def _zombie(pid: str) -> bool:
    """A process killed but not yet waited for by its parent still has a pid, and runs no more."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[:1] == [b"Z"]
    except OSError:  # no /proc (not Linux), or it is gone meanwhile
        return False
