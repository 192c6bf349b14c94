"""Failed rows grouped as error trackers group them: one bug in one line of a play is one group,
however many rows it failed and whatever values each message names.

A failure's *group* is its fingerprint written out: the exception's type, its message with the
values masked (numbers, ids, quoted text, e-mail addresses), and where it happened: the play's
own line that raised it, or the tool and HTTP status of a failed call.  It reads as a message::

    ValueError: no match for <n> (line 12)
    ToolError: HTTP 500 from GET http://…/lookup/<n> (tool 'lookup', HTTP 500)

Two failures share a group exactly when their groups are the same text, so
``run.errors.groupby("group")`` counts them.  A failure known only by its message (a row that
could not be identified, an error from another process) is grouped by its message alone.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["error_group", "mask", "message_group"]

_LONGEST = 240  # characters of a group: a message of a page must not make a page of a table

# Each pattern is a kind of value a message may name, and what it becomes.  Order matters: the
# larger shapes first (a URL's query holds numbers), and numbers before ids (1e-5 is a number).
_MASKS = [
    # 'quoted', as repr() quotes a str or a key; not the apostrophes of "can't" or "row's"
    (re.compile(r"(?<!\w)'(?:[^'\\\n]|\\.){0,200}'(?!\w)"), "'…'"),
    (re.compile(r'(?<!\w)"(?:[^"\\\n]|\\.){0,200}"(?!\w)'), '"…"'),
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"(?<=[?&])([\w.%-]+)=[^&\s#]*"), r"\1=…"),  # a URL's query values, names kept
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "<ip>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"(?<![\w.-])[-+]?(?:\d[\d_,]*)?\.?\d+(?:[eE][-+]?\d+)?(?![\w])"), "<n>"),
    # a token that mixes letters and digits, or a long run of hex: an id (p7, abc123, 5f2b9c0e11)
    (re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9_-]{2,}\b|\b0x[0-9a-fA-F]+\b|\b[0-9a-fA-F]{12,}\b"), "<id>"),
]
_TOOL_PREFIX = re.compile(r"^(?:llm |batch )?tool '(?:[^'\\]|\\.)*': ")


def mask(text: str) -> str:
    """``text`` with the values it names masked: what stays is what all its kin have in common."""
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


def message_group(message: str) -> str:
    """The group of a failure known only by its message (``"ValueError: no match for 7"``)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return _shorter(mask(first)) if first else "(no message)"


def error_group(exc: BaseException, fn: Any) -> str:
    """The group of ``exc``, raised by a row of the play whose function is ``fn``."""
    text = str(exc).strip()
    tool = getattr(exc, "tool", None)
    if isinstance(tool, str) and text.startswith(("tool ", "llm tool ", "batch tool ")):
        text = _TOOL_PREFIX.sub("", text)  # the tool is named below, where it is not masked
    first = text.splitlines()[0] if text else ""
    shown = f"{type(exc).__name__}: {mask(first)}" if first else type(exc).__name__
    where = _where(exc, fn, tool)
    return _shorter(shown) + (f" ({where})" if where else "")


def _where(exc: BaseException, fn: Any, tool: Any) -> str:
    """The tool (and the HTTP status) whose call failed, else the play's line that raised ``exc``:
    a tool that answers 500 and 404 from one line of the play fails for two reasons."""
    if isinstance(tool, str):
        status = getattr(exc, "status", None)
        return f"tool {tool!r}" + (f", HTTP {status}" if isinstance(status, int) else "")
    line = _play_line(exc, fn)
    return "" if line is None else f"line {line}"


def _play_line(exc: BaseException, fn: Any) -> int | None:
    """The line of ``fn``'s own code nearest to where ``exc`` was raised, if it passed through it."""
    code = getattr(fn, "__code__", None)
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _shorter(text: str) -> str:
    return text if len(text) <= _LONGEST else text[: _LONGEST - 1] + "…"
