"""A store's high-water mark: how many receipts it held, and when, so that a store that lost them
is noticed when it is opened, before anything is paid again.

A store emptied or replaced looks like a new one: ``receipts.db`` truncated, an empty directory
made at the same path, a Redis server that came back without its data.  A rerun on it would pay
for every call again, and change every value, without a word.  So each store keeps a mark in two
places:

* beside its data: ``receipts.mark`` in the store's directory, or the key ``{prefix}:mark`` on
  Redis (what another process or machine that uses the store reads, and how a clearing made
  there reaches this one);
* in the user's own state directory (``$PLAYBOOK_MARKS``, else ``$XDG_STATE_HOME/playbook/marks``,
  else ``~/.local/state/playbook/marks``), one small file per store: what survives the store's
  directory or server being wiped.

The newer of the two is what the store should still hold.  A mark is written at the end of each
run, and after a clearing or a reset; a store that holds fewer receipts than its mark says is
*lost* until the user says so (``store.accept_loss()``, ``python -m playbook cache accept-loss``): a run on
it raises ``ReceiptError`` first.  Each store also has an identity (a random id kept with its
data), so the message can tell a store replaced from one emptied in place.

A mark never goes down but on purpose.  Before one is written, the store is counted against the
newest mark and against what it held when this process last looked plus the receipts this
process added since (marking.py): a count that fell lost receipts while the run went on (a Redis
server restarted without its data), and the mark keeps the higher count.  Only a clearing or a
reset writes a lower one (an *accepted* mark).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Mark", "lost", "lost_during", "marks_dir", "newest", "read_registry", "write_registry"]


@dataclass(frozen=True)
class Mark:
    """``receipts`` held at ``at`` (epoch seconds) by the store whose identity is ``identity``;
    ``accepted``: written by a clearing or a reset, the one kind of mark that may be lower than
    the one before.  ``cleared_at``: when the store was last cleared or reset, as the writer
    knew; every mark carries it on, so a mark written after a reset does not hide the reset
    from a process that had the store open before it."""

    receipts: int
    at: float
    identity: str
    accepted: bool = False
    cleared_at: float = 0.0

    def cleared(self) -> float:
        """When the store was last cleared or reset, as far as this mark tells (0: never)."""
        return max(self.cleared_at, self.at if self.accepted else 0.0)

    def text(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, text: str | bytes | None) -> Mark | None:
        """A mark from its JSON text; None when absent or unreadable (a damaged mark says nothing)."""
        if not text:
            return None
        try:
            found = json.loads(text)
            cleared_at = float(found.get("cleared_at", 0.0))
            return cls(
                int(found["receipts"]),
                float(found["at"]),
                str(found["identity"]),
                bool(found.get("accepted", False)),
                cleared_at,
            )
        except (ValueError, TypeError, KeyError):
            return None


def marks_dir() -> Path:
    given = os.environ.get("PLAYBOOK_MARKS")
    if given:
        return Path(given)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "playbook" / "marks"


def _registry_file(address: str) -> Path:
    return marks_dir() / (hashlib.sha256(address.encode("utf-8")).hexdigest()[:32] + ".json")


def read_registry(address: str) -> Mark | None:
    try:
        return Mark.parse(_registry_file(address).read_text())
    except OSError:
        return None


def write_registry(address: str, mark: Mark) -> None:
    """Replace the user's mark of the store at ``address`` (atomically; a home that cannot be
    written to only loses the check)."""
    target = _registry_file(address)
    with contextlib.suppress(OSError):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".mark-")
        with os.fdopen(fd, "w") as out:
            out.write(mark.text())
        os.replace(temporary, target)


def newest(*marks: Mark | None) -> Mark | None:
    found = [mark for mark in marks if mark is not None]
    return max(found, key=lambda mark: mark.at) if found else None


def lost(location: str, expected: Mark | None, receipts: int, identity: str) -> str | None:
    """What to tell the user when the store holds fewer receipts than ``expected`` says, or None."""
    if expected is None or receipts >= expected.receipts:
        return None
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(expected.at))
    how = (
        "it is not the store that held them (made again from nothing, or swapped for another)"
        if expected.identity != identity
        else "receipts were removed from it, not by playbook"
    )
    return (
        f"the receipt store at {location} held {expected.receipts:,} receipts at {when} and now holds {receipts:,}: "
        f"{how}: a receipts.db emptied or replaced, a directory made again, a Redis server that restarted without its data. "
        "Nothing has been paid: a run now would pay again for every call whose receipt is gone, with new values. "
        f"Put the store back, or {_accept(location)}"
    )


def lost_during(location: str, expected: int, receipts: int) -> str:
    """What a run says when the store it ran on holds fewer receipts at its end than it should."""
    return (
        f"the receipt store at {location} lost receipts while this run went on: it should hold at least {expected:,} "
        f"(what it held, and the receipts added here since) and holds {receipts:,}: a Redis server that restarted "
        "without its data (no append-only file), a receipts.db emptied or replaced, receipts removed by another program. "
        "Rows of this run may have been reported ok with receipts that are gone. Its mark keeps the higher count: "
        "the next run on this store is refused before it pays for them again, with new values. "
        f"Put the store back, or {_accept(location)}"
    )


def _accept(location: str) -> str:
    return (
        f"accept what it holds with pb.ReceiptStore({location!r}).accept_loss(), "
        f"or python -m playbook cache accept-loss --store {shlex.quote(location)}"
    )
