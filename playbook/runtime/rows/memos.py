"""Row memos, and what the store still owes at the end of an execution.

A row that finished ``ok`` is memoised (its output, its calls and their cost, the tools it used)
under its memo key; a rerun finds it and settles the row as ``reused`` without running it, unless
a tool it used has been redefined in this process since.
"""

from __future__ import annotations

import itertools
import logging
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from playbook.addresses import MEMO, memo_address, memo_digests
from playbook.events import RunNotice
from playbook.plays.play import current_fingerprint
from playbook.runtime.rows.table import RowTable
from playbook.store.records import memo_flags, memo_tools
from playbook.tagged import dumps

if TYPE_CHECKING:
    from playbook.plays.play import Play
    from playbook.store import StoreEngine
    from playbook.store.records import Memo

__all__ = ["finish_store", "remember", "reuse"]

# A row's calls, their cost, its tools, the receipts it looked up, and how many of its calls were of
# free local tools.
Used = tuple[int, float, dict[str, str], list[str], int, int]
_CHUNK = 8192  # memo keys asked of the store at once (a store reads them in its own order)
_logger = logging.getLogger("playbook")


def reuse(
    store: StoreEngine,
    play: Play,
    table: RowTable,
    runnable: Sequence[int],
    reused: Callable[[list[tuple[int, Memo]]], None],
) -> Sequence[int]:
    """Call ``reused([(position, memo), ...])`` for the rows whose memo exists, a chunk of them at
    a time; return the rest, in their order (in an array: a million positions in 8 MB)."""
    key = table.key
    store.fold()  # memos a run killed before its end left where they were first written
    # runnable rows have keys
    digests = memo_digests(play.fingerprint, (key(p) for p in runnable))  # type: ignore[misc]
    # The memos are asked for in the order of their keys, not of the rows: a store whose keys
    # share pages then reads each page once (SQLite: a million memos in half the time).
    order = np.argsort(np.frombuffer(digests, dtype=">u8")[0::2])
    settled = bytearray(len(runnable))  # by index into runnable
    # Whether a memo's tools are unchanged, by its mapping of them (the rows of a play share one),
    # kept with it: while it is kept, no other mapping has its id.
    unchanged: dict[int, tuple[Mapping[str, str], bool]] = {}
    for start in range(0, len(order), _CHUNK):
        chunk = order[start : start + _CHUNK].tolist()
        mkeys = [MEMO + digests[16 * i : 16 * i + 16].hex() for i in chunk]
        found = store.memos(mkeys)
        settling: list[tuple[int, Memo]] = []
        for i, mk in zip(chunk, mkeys):
            memo = found.get(mk)
            if memo is None:
                continue
            tools = memo.tools
            seen = unchanged.get(id(tools))
            if seen is None:
                seen = unchanged[id(tools)] = (tools, tools_unchanged(tools))
            if seen[1]:
                settling.append((runnable[i], memo))
                settled[i] = 1
        reused(settling)
    rest = array("q", itertools.compress(runnable, np.frombuffer(settled, dtype=np.bool_) == 0))
    store.warm(play.name, lambda: [key(p) for p in rest])  # type: ignore[misc]  # runnable rows have keys
    return runnable if len(rest) == len(runnable) else rest


def remember(
    store: StoreEngine, play: Play, key: str, output: dict[str, Any], stored: Any, used: Used
) -> None:
    """Write the memo of the row whose identity is ``key``: its output (``stored``: its stored
    form), and ``used``: its calls, what they cost, the tools it called (name -> fingerprint), the
    addresses it looked up and its calls of free local tools."""
    write_memo(store, memo_address(play.fingerprint, key), play.name, output, stored, used, key)


def write_memo(
    store: StoreEngine, mk: str, play: str, output: dict[str, Any], stored: Any, used: Used, row: str
) -> None:
    """Write the memo ``mk`` of a finished row (or sub-play) of ``play`` whose identity is ``row``."""
    calls, cost, tools, receipts, local, unpriced = used
    flags = memo_flags(output is not stored, local, unpriced)
    store.add_memo(mk, play, _tools_text(tools), calls, cost, flags, dumps(stored), row=row, used=receipts)


_TOOLS_TEXT: dict[tuple[tuple[str, str], ...], str] = {}  # the tools rows used -> their memo_tools text


def _tools_text(tools: dict[str, str]) -> str:
    """:func:`memo_tools` of ``tools``, made once for every row that used the same tools (one text
    for all of them, in the memos waiting to be written too)."""
    used = tuple(tools.items())
    text = _TOOLS_TEXT.get(used)
    if text is None:
        if len(_TOOLS_TEXT) >= 1024:  # plays made and remade in a long session: kept bounded
            _TOOLS_TEXT.clear()
        text = _TOOLS_TEXT[used] = memo_tools(tools)
    return text


def tools_unchanged(tools: Mapping[str, str]) -> bool:
    """True when no tool a memo used has been redefined (edited) in this process since."""
    for name, fingerprint in tools.items():
        now = current_fingerprint(name)
        if now is not None and now != fingerprint:
            return False
    return True


async def finish_store(store: StoreEngine, emit: Callable[[RunNotice], None], seen: int, wait: float) -> int:
    """Write what the store still owes (memos; receipts queued or that failed to be written),
    waiting up to ``wait`` seconds for a remote store to take them, and say out loud what could
    not be, and what the store noticed since ``seen``; returns its notices now."""
    # How many receipts it holds now (a store emptied later is noticed), counted with the run's
    # last writes: done when the run is (every row's receipt was written before the row went on).
    store.remember()
    if not await store.written(wait):
        note = (
            f"the receipt store at {store.location} did not confirm this run's last writes within {wait:g}s; "
            "they are made when it answers, while this process lives"
        )
        emit(RunNotice(note, 0))
        _logger.warning("%s", note)
    owed = store.unwritten()
    if owed:
        # Counted once the store has answered: a receipt written now is not lost.
        lost = store.write_unwritten()
        if lost and await store.written(wait):
            lost = store.unwritten()
        if lost:
            note = (
                f"{lost} paid calls could not be recorded in the receipt store at {store.path} (their rows failed, "
                "saying why). Their answers are kept in memory and written when the store takes writes again, at "
                "the end of the next run in this process; if the process ends first, a rerun pays for them again"
            )
        else:
            note = f"{owed} receipts of paid calls that could not be written before were written at the end of this run: a rerun reuses them"
        emit(RunNotice(note, lost))
        _logger.warning("%s", note)
    for note in store.notices[seen:]:
        emit(RunNotice(note, 0))
    store.told = len(store.notices)
    return store.told
