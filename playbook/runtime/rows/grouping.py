"""Failed rows grouped as error trackers group them: one bug in one line is one group, however
many rows it failed and whatever values each message names.

A failure's *fingerprint* is the exception's type, where it happened, and its message with the
values that are always data masked (numbers, ids, dates, e-mail and IP addresses).  Where: the
tool and HTTP status of a failed call, else the deepest line of the user's own code that the
error passed through (the play's line, or a helper's: ``helper_email, line 4``), not a line of
playbook or of a library.  Written out, it reads as a message::

    ValueError: no match for <n> (line 12)
    KeyError: 'email' (enrich_row, line 4)
    ToolError: HTTP <n> from GET http://<ip>:<n>/lookup (tool 'lookup', HTTP 500)

A value a message names in words or in quotes cannot be told from the words around it by its
look (``KeyError: 'email'`` names a bug; ``no match for 'Acme'`` a row).  So the fingerprints of
one type and place are a *family*, and a family whose messages differ in more than ``FAMILY``
ways is one group: its messages' common words, ``…`` for the words that vary
(``ValueError: no match for … (line 12)``).  :class:`Families` does that as rows fail, for the
live panel, and :func:`consolidate` at once, for ``run.errors`` and the summaries.
"""

from __future__ import annotations

import os
import re
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from playbook._internal.words import cut
from playbook.errors import ToolError

__all__ = ["FAMILY", "Families", "consolidate", "error_group", "mask", "message_group", "safe_str"]

FAMILY = 3  # messages of one type and place told apart at most; more are one group
_LONGEST = 240  # characters of a group: a message of a page must not make a page of a table
_READ = 600  # characters of a message masked: a message of a megabyte must not cost seconds

# Each pattern is a kind of value a message may name, and what it becomes.  Order matters: the
# larger shapes first (a URL's query holds numbers, a date holds numbers), numbers before ids
# (1e-5 is a number).
_MASKS = [
    (re.compile(r"\b[\w.+-]{1,64}@[\w-]+(?:\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"(?<=[?&])([\w.%-]+)=[^&\s#]*"), r"\1=…"),  # a URL's query values, names kept
    (re.compile(r"\b\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?)?\b"), "<date>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "<ip>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"(?<![\w.-])[-+]?(?:\d[\d_,]*)?\.?\d+(?:[eE][-+]?\d+)?(?![\w])"), "<n>"),
    # a token that mixes letters and digits, or a long run of hex: an id (p7, abc123, 5f2b9c0e11);
    # not an API's version (/v1/), which every URL of the API names alike
    (
        re.compile(
            r"\b(?![vV]\d{1,2}\b)(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9_-]{2,}\b|\b0x[0-9a-fA-F]+\b|\b[0-9a-fA-F]{12,}\b"
        ),
        "<id>",
    ),
]
_MASKABLE = re.compile(r"[\d@?]")  # every value masked above holds one of these
_LINE = re.compile(r" \(line \d+(?:: [^\n]*)?\)$")  # the play's line, quoted as written (rows.error_line)
_KEPT = ("\ue000", "\ue001")  # stand-ins no mask matches, for the parts kept as they are
_PLACEHOLDER = re.compile(r"(\{[^{}]*\})")  # a template's {name}
_TOOL_PREFIX = re.compile(r"^(?:llm |batch )?tool '(?:[^'\\]|\\.)*': ")
# A group written out: "Type: message (where)", "Type (where)" or "Type: message"
_PARTS = re.compile(
    r"^(?P<kind>[\w.]+)(?:: (?P<message>.*?))?(?: \((?P<where>(?:[\w.<>]+, )?line \d+|tool '.*'(?:, HTTP \d+)?)\))?$",
    re.S,
)
_PLAYBOOK = str(Path(__file__).resolve().parents[1]) + os.sep
_LIBRARIES = tuple(
    {
        str(Path(p).resolve()) + os.sep
        for p in (sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    }
)


def mask(text: str, literal: tuple[str, str] | None = None) -> str:
    """``text`` with the values it names masked: what stays is what all its kin have in common.
    Not masked: the play's line quoted at its end (``(line 4: ...)``, the code as written).
    ``literal``: a tool's request as sent, shown as the tool's template instead, masked alike
    but for its placeholders (``GET http://<ip>:<n>/status/{code}``): a host and port read one
    way in every group, whether a message or a template names them."""
    text = text[:_READ]
    if _MASKABLE.search(text) is None:  # no digit, no address, no query: nothing to mask (most words)
        return text
    kept = []
    if literal is not None and literal[0] in text:
        text = text.replace(literal[0], _KEPT[0])
        kept.append(_template(literal[1]))
    line = _LINE.search(text)
    if line is not None:
        text = text[: line.start()] + _KEPT[len(kept)]
        kept.append(line.group(0))
    text = _masked(text)
    for token, part in zip(_KEPT, kept):
        text = text.replace(token, part)
    return text


def _template(template: str) -> str:
    """A tool's template masked as a message is, its ``{placeholders}`` kept as written."""
    parts = _PLACEHOLDER.split(template)  # text, placeholder, text, ...: the placeholders at odd places
    return "".join(part if i % 2 else _masked(part) for i, part in enumerate(parts))


def _masked(text: str) -> str:
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or what can be said of it when its ``__str__`` fails: one row's odd exception
    must not take the run down."""
    try:
        return str(exc)
    except Exception as broken:  # a __str__ that reads a field the error lacks
        return f"<str() of this {type(exc).__name__} failed: {type(broken).__name__}: {safe_str(broken)}>"


def message_group(message: str) -> str:
    """The group of a failure known only by its message (``"ValueError: no match for 7"``)."""
    first = _first_line(message)
    return _shorter(mask(first)) if first else "(no message)"


def error_group(exc: BaseException, fn: Any) -> str:
    """The fingerprint of ``exc``, raised by a row of the play whose function is ``fn``."""
    tool = getattr(exc, "tool", None)
    text = _validation(exc) or _first_line(safe_str(exc))
    if isinstance(tool, str):
        text = _TOOL_PREFIX.sub("", text)  # the tool is named below, where it is not masked
    # not getattr: an odd error's __getattr__ may raise anything
    literal = exc.literal if isinstance(exc, ToolError) else None
    shown = f"{type(exc).__name__}: {mask(text, literal)}" if text else type(exc).__name__
    where = _where(exc, fn, tool)
    return _shorter(shown) + (f" ({where})" if where else "")


def consolidate(groups: Iterable[str]) -> dict[str, str]:
    """Each fingerprint -> its group: itself, or its family's when the family is large."""
    families = Families()
    seen = list(dict.fromkeys(groups))
    for group in seen:
        families.add(group)
    return {group: families.label(group) for group in seen}


class _Family:
    __slots__ = ("kind", "where", "members", "prefix", "suffix", "shortest", "shown")

    def __init__(self, kind: str, where: str | None) -> None:
        self.kind, self.where = kind, where
        self.members = 0  # fingerprints in it
        self.prefix: list[str] | None = None  # words all its messages start with
        self.suffix: list[str] = []  # and end with
        self.shortest = 0  # words of its shortest message: the prefix and suffix must not overlap in it
        self.shown: str | None = None  # its group, once it is one

    def add(self, message: str) -> None:
        words = message.split(" ")
        self.members += 1
        self.shown = None
        if self.prefix is None:
            self.prefix, self.suffix, self.shortest = words, words, len(words)
            return
        self.shortest = min(self.shortest, len(words))
        self.prefix = _common(self.prefix, words)
        self.suffix = _common(self.suffix[::-1], words[::-1])[::-1]

    def label(self) -> str:
        if self.shown is None:
            prefix = self.prefix or []
            room = max(self.shortest - len(prefix), 0)
            suffix = self.suffix[len(self.suffix) - min(len(self.suffix), room) :]
            text = " ".join(w for w in [*prefix, "…", *suffix] if w)
            self.shown = _shorter(f"{self.kind}: {text}") + (f" ({self.where})" if self.where else "")
        return self.shown


class Families:
    """Fingerprints gathered by type and place as rows fail (see the module's docstring)."""

    __slots__ = ("_of", "_families")

    def __init__(self) -> None:
        self._of: dict[str, _Family | None] = {}  # fingerprint -> its family (None: it has no type and place)
        self._families: dict[tuple[str, str | None], _Family] = {}

    def add(self, group: str) -> None:
        if group in self._of:
            return
        parts = _PARTS.match(group)
        if parts is None or parts["message"] is None:  # "(no message)", or a type alone: its own group
            self._of[group] = None
            return
        key = (parts["kind"], parts["where"])
        family = self._families.get(key)
        if family is None:
            family = self._families[key] = _Family(*key)
        family.add(parts["message"])
        self._of[group] = family

    def label(self, group: str) -> str:
        """The group ``group`` (added before) belongs to now."""
        family = self._of.get(group)
        return group if family is None or family.members <= FAMILY else family.label()


def _common(a: list[str], b: list[str]) -> list[str]:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _validation(exc: BaseException) -> str:
    """A pydantic ValidationError by its model and the fields and kinds of its errors: its first
    line only counts them ("2 validation errors for Person")."""
    errors, title = getattr(exc, "errors", None), getattr(exc, "title", None)
    if not callable(errors) or not isinstance(title, str):
        return ""
    try:
        found = errors()
        fields = [f"{'.'.join(str(part) for part in e['loc'])} ({e['type']})" for e in found]
    except Exception:  # not pydantic's, after all
        return ""
    return f"{title}: {', '.join(fields)}" if fields else ""


def _where(exc: BaseException, fn: Any, tool: Any) -> str:
    """The tool (and the HTTP status) whose call failed, else the deepest line of the user's code
    the error passed through: a tool that answers 500 and 404 from one line of the play fails for
    two reasons, and two helpers called from one line are two bugs."""
    if isinstance(tool, str):
        status = getattr(exc, "status", None)
        return f"tool {tool!r}" + (f", HTTP {status}" if isinstance(status, int) else "")
    code = getattr(fn, "__code__", None)
    mine = play = None
    tb = exc.__traceback__
    while tb is not None:
        frame_code = tb.tb_frame.f_code
        if frame_code is code:
            play = mine = (frame_code, tb.tb_lineno)
        elif _in_app(frame_code.co_filename):
            mine = (frame_code, tb.tb_lineno)
        tb = tb.tb_next
    found = mine or play
    if found is None:
        return ""
    frame_code, line = found
    return f"line {line}" if frame_code is code else f"{frame_code.co_name}, line {line}"


_IN_APP: dict[str, bool] = {}


def _in_app(filename: str) -> bool:
    """Is this file the user's code: not playbook's, not the standard library's nor an installed package's?"""
    known = _IN_APP.get(filename)
    if known is None:
        if filename.startswith("<"):
            # a cell, a %%play cell, exec'd text: the user's; <frozen ...>: the library's
            known = not filename.startswith("<frozen")
        else:
            path = str(Path(filename).resolve())
            known = not path.startswith(_PLAYBOOK) and not path.startswith(_LIBRARIES)
        _IN_APP[filename] = known
    return known


def _shorter(text: str) -> str:
    return cut(text, _LONGEST)
