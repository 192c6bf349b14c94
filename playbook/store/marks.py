"""A store's high-water mark: how many receipts it held, and when, so that a store that lost them
is noticed when it is opened, before anything is paid again.

A store emptied or replaced looks like a new one: ``receipts.db`` truncated, an empty directory
made at the same path, a Redis server that came back without its data.  A rerun on it would pay
for every call again, and change every value, without a word.  So each store keeps a mark in two
places:

* beside its data: ``receipts.mark`` in the store's directory, or the key ``{prefix}:mark`` on
  Redis (what another process or machine that uses the store reads, and how a clearing made
  there reaches this one); the backend keeps the mark's text, :class:`Mark` reads and writes it;
* in the user's own state directory (``$PLAYBOOK_MARKS``, else ``$XDG_STATE_HOME/playbook/marks``,
  else ``~/.local/state/playbook/marks``), one small file per store: what survives the store's
  directory or server being wiped.

The newer of the two is what the store should still hold.  :class:`Marks`, a part of the store's
engine, checks it when the store is opened and when a run starts, and writes a mark at the end of
each run and after a clearing or an accepted loss.  A store that holds fewer receipts than its mark says
is *lost* until the user says so (``store.accept_loss()``, ``python -m playbook cache accept-loss``): a run
on it raises ``ReceiptError`` first.  Each store also has an identity (a random id kept with its
data), so the message can tell a store replaced from one emptied in place.

A mark never goes down but on purpose.  What the store should hold is the larger of its newest
mark and what it held when this process last looked (opening it, starting a run, marking it)
plus the receipts this process added since, as the backend counts them in each write.  That is a
floor, never a guess: receipts other processes add only raise the count (so they can hide a loss
smaller than what they added), and a clearing or an accepted loss lowers it on purpose, with an
*accepted* mark.  One made elsewhere after this process last looked (another kernel's
``store.clear()``, ``cache accept-loss``) is the new floor: the receipts added here before it are not
counted against it.  A count that fell while a run went on (a Redis server restarted without
its data) is said, and the mark keeps the higher count.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shlex
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from playbook.store.io import StoreIO
from playbook.store.location import is_url
from playbook.store.protocol import Backend, StoreFailure

__all__ = ["Mark", "Marks", "lost", "lost_during", "marks_dir", "newest", "read_registry", "write_registry"]


@dataclass(frozen=True)
class Mark:
    """``receipts`` held at ``at`` (epoch seconds) by the store whose identity is ``identity``;
    ``accepted``: written by a clearing or an accepted loss, the one kind of mark that may be lower than
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
        f"{how}: a receipts.db emptied or replaced, a directory made again, a Redis server that restarted without its data, "
        "a Redis replica that took over without its master's last writes. "
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


class Marks:
    """A store's side of its mark (module docstring): checked when the store is opened and when a
    run starts, written when a run ends, after a clearing and after an accepted loss.

    ``lost`` says why the store is taken for one that lost its receipts (a run on it refuses to
    start), or is ``None``.  ``counted`` runs each write of receipts, to count what it added.
    """

    def __init__(
        self,
        where: str | os.PathLike[str],
        backend: Backend,
        io: StoreIO,
        *,
        location: str,
        notice: Callable[[str], None],
    ) -> None:
        self._where = where  # as the store was opened (a directory, a URL or "memory")
        self._backend = backend
        self._io = io
        self._location = location
        self._notice = notice
        self._counting = threading.Lock()  # a count and the receipts added since it: read and reset together
        self._held: Mark | None = None  # what the store held when this process last looked
        self._added = 0  # receipts this process added since
        self._added_at = 0.0
        self.lost: str | None = self.check()

    def __repr__(self) -> str:
        held = "none" if self._held is None else f"{self._held.receipts}"
        return f"<Marks held={held} added={self._added} lost={self.lost is not None}>"

    def _key(self) -> str | None:
        """What names this store in the user's marks: a directory's real path, a server's
        address and database (no password, no options); None for a store in memory."""
        where = os.fspath(self._where)
        if where == "memory" or self._backend.location == "memory":
            return None
        if not is_url(where):
            return str(Path(where).resolve())
        parts = urlsplit(where)
        return f"{parts.scheme}://{parts.hostname}:{parts.port}{parts.path}"

    def counted(self, write: Callable[[], int]) -> None:
        """Run ``write`` (a backend's write, which returns the receipts it added) and count what it added."""
        with self._counting:
            added = write()
            if added:
                self._added += added
                self._added_at = time.time()

    def check(self) -> str | None:
        """Why the store is lost (it holds fewer receipts than it should), or None; when it is
        not, what it holds now is what the next check expects, with what is added here since."""
        key, backend = self._key(), self._backend
        if key is None:
            return None
        try:
            with self._counting:
                count = backend.receipt_count()
                expected, _ = self._expected(key)
                identity = backend.identity
                if expected is not None and count < expected.receipts:
                    return lost(self._location, expected, count, identity)
                self._held, self._added = Mark(count, time.time(), identity), 0
        except StoreFailure:
            return None  # a store that cannot answer says so when it is used
        return None

    def _expected(self, key: str) -> tuple[Mark | None, float]:
        """The fewest receipts the store may hold now (module docstring), as a mark; and when it
        was last cleared or reset, as its newest mark says (carried on in the next)."""
        backend, held = self._backend, self._held
        found = newest(Mark.parse(backend.read_mark()), read_registry(key))
        cleared = found.cleared() if found is not None else 0.0
        if held is None or (found is not None and cleared > held.at):
            return found, cleared
        here = Mark(held.receipts + self._added, max(held.at, self._added_at), held.identity)
        return (here if found is None or here.receipts > found.receipts else found), cleared

    def remember(self, *, wait: bool = False, accepted: bool = False) -> None:
        """Mark how many receipts the store holds now, beside its data and in the user's marks
        (at the end of each run; ``accepted``: after a clearing or an accepted loss, fewer on purpose).
        A store that holds fewer than it should is not marked lower: it is lost (its run says
        so, the next is refused).  On a loop, a remote store counts on its own thread, after
        what is queued there; ``wait``, or outside a loop, at once."""
        key, backend = self._key(), self._backend
        if key is None or self.lost is not None or backend.readonly:
            return

        def mark() -> None:
            with self._counting:
                count = backend.receipt_count()
                expected, cleared = self._expected(key)
                if not accepted and expected is not None and count < expected.receipts:
                    self._lost_meanwhile(key, expected, count, cleared)
                    return
                now = Mark(count, time.time(), backend.identity, accepted, cleared)
                backend.write_mark(now.text())
                write_registry(key, now)
                self._held, self._added = now, 0

        if not wait:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                wait = True
        if not wait:
            self._io.submit(mark, lambda _, __: None)
            return
        self._io.drain()
        with contextlib.suppress(StoreFailure):  # a store that cannot answer says so when it is used
            mark()

    def _lost_meanwhile(self, key: str, expected: Mark, count: int, cleared: float) -> None:
        """The store holds fewer receipts than it should: keep the higher count as its mark
        (newer than any, so that every process that opens it finds it), and say so."""
        backend = self._backend
        self.lost = lost(self._location, expected, count, backend.identity)
        self._notice(lost_during(self._location, expected.receipts, count))
        kept = Mark(expected.receipts, time.time(), expected.identity, cleared_at=cleared)
        write_registry(key, kept)
        backend.write_mark(kept.text())

    def accept(self) -> None:
        """Accept what a lost store holds now (see :attr:`lost`): its mark starts again from here,
        and runs on it go on (paying again for the calls whose receipts are gone)."""
        self.lost = None
        self.remember(wait=True, accepted=True)
