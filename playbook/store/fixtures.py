"""Fixtures: every tool answer a run sees, recorded to a reviewed JSON Lines file, and replayed
from it with no network and no pacing (``pb.fixtures(path, mode=...)``, ``map(fixtures=path)``).

A fixture stands in for the *provider*, not for the store: replayed, an answer is counted as
paid the first time it is given and as reused after that, so a replayed notebook or test tells
the same story (calls paid, rows reused on a rerun) as the run it was recorded from.  Unless a
run names a store, a replay keeps its rows and answers in the fixtures' own in-memory store, so
it never leaves anything in the project's store that no provider answered; a run that names a
store gets receipts there as from a provider.

An answer is found by its tool's name and input.  Receipt keys also hold the tool's URL, model or
source, which differ between where fixtures are recorded and where they are replayed (another
port, a test double); so a fixture answers whatever the tool is now, and a replayed call costs
one dictionary lookup, with no address worked out.

One line per call, sorted by tool and input, so a re-recording reads as a diff::

    {"tool": "acme.email", "input": {"domain": "acme.com"}, "output": {...}, "miss": false, "cost": 1.0}

Values JSON lacks are kept tagged (``{"$datetime": ...}``), as receipts keep them; secrets the
run's tools use never reach the file.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from playbook.addresses import key_text
from playbook.errors import PlaybookError, PlayDefinitionError, ToolError
from playbook.secrets import Secret, mask
from playbook.tagged import decode, dumps, encode

if TYPE_CHECKING:
    from playbook.store.engine import StoreEngine
    from playbook.tools.protocol import ToolEngine

__all__ = ["Fixtures", "Recorder", "Replay", "active", "fixtures"]

_ENV = "PLAYBOOK_FIXTURES"  # a fixture file every run replays from unless it names its own
_MODE_ENV = "PLAYBOOK_FIXTURES_MODE"  # "record": runs record into that file instead
_active: contextvars.ContextVar[Fixtures | None] = contextvars.ContextVar("playbook_fixtures", default=None)
_opened: dict[Path, Fixtures] = {}  # a path given as map(fixtures=path): one Fixtures per file


class Answer(NamedTuple):
    """One recorded answer, in its stored (tagged) form, and whether it was a miss."""

    output: Any
    miss: bool


class Fixtures:
    """A fixture file and what to do with it: ``"replay"`` answers calls from it, ``"record"``
    writes every answer a run sees into it.  A context manager: runs inside ``with`` use it."""

    def __init__(self, path: str | os.PathLike[str], mode: Literal["replay", "record"] = "replay") -> None:
        if mode not in ("replay", "record"):
            raise PlayDefinitionError(f"fixtures(mode={mode!r}): mode must be 'replay' or 'record'")
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise PlayDefinitionError(f"fixtures({path!r}): path must name a JSON Lines file")
        self.path = Path(path).expanduser().absolute()
        self.mode = mode
        self._tokens: list[contextvars.Token[Fixtures | None]] = []
        self.stamp = _stamp(self.path)  # the file as it was when this replay read it
        self._replay: Replay | None = None
        self._recorder: Recorder | None = None
        if mode == "replay" and not self.path.is_file():
            raise PlayDefinitionError(
                f"fixtures {self.path}: no such file; record it first with pb.fixtures({os.fspath(path)!r}, mode='record')"
            )

    def __repr__(self) -> str:
        return f"<Fixtures {self.mode} {self.path}>"

    def __enter__(self) -> Fixtures:
        self._tokens.append(_active.set(self))
        return self

    def __exit__(self, *exc: Any) -> None:
        _active.reset(self._tokens.pop())
        if self._recorder is not None:
            self._recorder.flush()

    @property
    def replay(self) -> Replay | None:
        if self.mode != "replay":
            return None
        if self._replay is None:
            self._replay = Replay(self.path)
        return self._replay

    @property
    def recorder(self) -> Recorder | None:
        if self.mode != "record":
            return None
        if self._recorder is None:
            self._recorder = Recorder(self.path)
        return self._recorder

    @property
    def store(self) -> StoreEngine:
        """Where a replay keeps its finished rows when the run names no store: in memory."""
        replay = self.replay
        assert replay is not None
        if replay.store is None:
            from playbook.store.engine import StoreEngine

            replay.store = StoreEngine("memory")
        return replay.store


def fixtures(path: str | os.PathLike[str], mode: Literal["replay", "record"] = "replay") -> Fixtures:
    """Replay tool answers from ``path`` (no network, no pacing), or record every answer a run
    sees into it.  Use it as a context manager (``with pb.fixtures(path): ...``) or pass it as
    ``map(fixtures=...)``; a path alone there replays."""
    return Fixtures(path, mode)


def active(given: Any) -> Fixtures | None:
    """The fixtures a run uses: its ``fixtures=`` option, else the ``with pb.fixtures(...)``
    around it, else ``$PLAYBOOK_FIXTURES`` (recorded into when ``$PLAYBOOK_FIXTURES_MODE`` is
    ``record``); ``None`` for none."""
    if isinstance(given, Fixtures):
        return given
    mode: Literal["replay", "record"] = "replay"
    if given is None:
        found = _active.get()
        if found is not None:
            return found
        given = os.environ.get(_ENV) or None
        if given is None:
            return None
        mode = _env_mode()
    if not isinstance(given, (str, os.PathLike)):
        raise PlayDefinitionError(
            f"fixtures={given!r}: fixtures must be a fixture file's path or pb.fixtures(path, mode=...)"
        )
    path = Path(given).expanduser().absolute()
    opened = _opened.get(path)
    # One Fixtures per file, so runs share what it gave (a rerun is reused) or what it recorded;
    # a file recorded again since it was read is read again.
    if opened is None or opened.mode != mode or (mode == "replay" and opened.stamp != _stamp(path)):
        opened = _opened[path] = Fixtures(path, mode)
    return opened


def _env_mode() -> Literal["replay", "record"]:
    mode = os.environ.get(_MODE_ENV) or "replay"
    if mode not in ("replay", "record"):
        raise PlayDefinitionError(f"${_MODE_ENV}={mode!r}: set it to 'replay' (the default) or 'record'")
    return mode  # type: ignore[return-value]  # checked just above


def _stamp(path: Path) -> tuple[int, int, int]:
    """The file's version: a recording replaces the file (a new inode), and changes its time or size."""
    try:
        st = path.stat()
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Replay:
    """Answers calls from a fixture file."""

    __slots__ = ("path", "store", "_answers", "_answered")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store: StoreEngine | None = None
        self._answers = _parsed(path)  # tool name -> {input in key form: answer}
        self._answered: set[tuple[str, str]] = set()  # given once: later, they count as reused

    def __repr__(self) -> str:
        return f"<Replay {self.path} {sum(map(len, self._answers.values()))} answers>"

    def answer(self, tool: ToolEngine, given: str) -> tuple[Any, bool, bool]:
        """``(answer, miss, reused)`` for the call whose input in key form is ``given``;
        ``ToolError`` if the file lacks it."""
        found = self._answers.get(tool.name, _NONE).get(given)
        if found is None:
            raise ToolError(
                f"tool {tool.name!r}: no answer in the fixtures {self.path} for input {_short(given)}; replaying fixtures "
                f"makes no calls, so record this one: run with pb.fixtures({str(self.path)!r}, mode='record')",
                tool=tool.name,
                retryable=False,
            )
        call = (tool.name, given)
        reused = call in self._answered
        if not reused:
            self._answered.add(call)
        # decode() builds every list and dict afresh: a play that changes what it got changes
        # nothing for the next row.
        return decode(found.output), found.miss, reused


_NONE: dict[str, Answer] = {}


class Recorder:
    """Collects every answer a run sees (paid, or read from a receipt) and writes the file."""

    __slots__ = ("path", "_lines", "_secrets", "_dirty")

    def __init__(self, path: Path) -> None:
        self.path = path
        # What the file holds already stays, so several runs (or cells) record into one file;
        # an answer recorded again replaces its line.
        self._lines: dict[tuple[str, str], str] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    entry = json.loads(line)
                    self._lines[(entry["tool"], key_text(decode(entry["input"])))] = line
        self._secrets: set[Secret] = set()
        self._dirty = False

    def __repr__(self) -> str:
        return f"<Recorder {self.path} {len(self._lines)} answers>"

    def add(self, tool: ToolEngine, values: Any, stored: Any, miss: bool, cost: float) -> None:
        """Keep one answer, in its stored (tagged) form."""
        given = encode(values)
        secret = getattr(tool, "secret", None)
        if isinstance(secret, Secret):
            self._secrets.add(secret)
        entry = {"tool": tool.name, "input": given, "output": stored, "miss": bool(miss), "cost": cost}
        # Keyed as a replay finds it: 3 and 3.0 are one call, recorded once.
        self._lines[(tool.name, key_text(values))] = dumps(entry)
        self._dirty = True

    def flush(self) -> None:
        """Write the file (sorted, whole, replacing it atomically) if anything was added."""
        if not self._dirty:
            return
        text = "".join(self._lines[k] + "\n" for k in sorted(self._lines))
        # Every spelling of the secrets this process has used, masked: an API that echoes its
        # key, or a key passed as an input by mistake, must not reach a reviewed file.
        for secret in self._secrets:
            with contextlib.suppress(PlaybookError):  # not set here: then no answer can hold it
                secret.reveal()
        text = mask(text)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            # mkstemp makes the file private; a fixture file is meant to be committed and shared.
            os.chmod(tmp, self.path.stat().st_mode & 0o777 if self.path.exists() else 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._dirty = False


# path -> (stamp, answers)
_PARSED: dict[Path, tuple[tuple[int, int, int], dict[str, dict[str, Answer]]]] = {}


def _parsed(path: Path) -> dict[str, dict[str, Answer]]:
    """The file's answers, parsed once per version of it in this process: a test suite replays one
    file in many tests, and the answers are only read (each call decodes a fresh copy)."""
    stamp = _stamp(path)
    found = _PARSED.get(path)
    if found is not None and found[0] == stamp and stamp != (0, 0, 0):
        return found[1]
    answers = _read(path)
    if len(_PARSED) >= 16:
        _PARSED.clear()
    _PARSED[path] = (stamp, answers)
    return answers


def _read(path: Path) -> dict[str, dict[str, Answer]]:
    lines = list(_lines(path))
    try:
        entries = json.loads("[" + ",".join(lines) + "]")  # one parse: most of reading a large file
    except ValueError:
        entries = None
    if type(entries) is not list:  # find the line at fault
        for n, line in enumerate(lines, 1):
            try:
                json.loads(line)
            except ValueError as exc:
                raise PlayDefinitionError(
                    f"fixtures {path}, line {n}: not JSON ({exc}); re-record the file"
                ) from None
    answers: dict[str, dict[str, Answer]] = {}
    for n, entry in enumerate(entries, 1):
        try:
            given = entry["input"]
            # The input in key form, as an address has it: 3 and 3.0 are one input (a NaN
            # elsewhere in a column makes pandas' ints floats), a numpy scalar is its number.
            # Plain JSON is its own key form: the sorted dump key_text would make, without its checks.
            key = dumps(given, sort_keys=True) if _plain(given) else key_text(decode(given))
            answers.setdefault(entry["tool"], {})[key] = Answer(entry["output"], entry["miss"] is True)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise PlayDefinitionError(
                f"fixtures {path}, line {n}: not a recorded answer ({exc!r}); re-record the file"
            ) from None
    return answers


def _plain(value: Any) -> bool:
    """JSON with no tag in it and no float: already the value it stands for, in key form."""
    kind = type(value)
    if kind is dict:
        return not (len(value) == 1 and next(iter(value))[:1] == "$") and all(map(_plain, value.values()))
    if kind is list:
        return all(map(_plain, value))
    return kind is not float


def _lines(path: Path) -> Iterator[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlayDefinitionError(
            f"fixtures {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})"
        ) from None
    return (line for line in text.splitlines() if line.strip())


def _short(text: str) -> str:
    return text if len(text) <= 120 else text[:117] + "..."
