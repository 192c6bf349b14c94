"""What a misspelt flag or choice was likely meant to be, said the same by the command line and by
``%%play``: ``unrecognized arguments: --concurency 8 (did you mean --concurrency?)``."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

__all__ = ["near_choice", "unrecognized"]

# argparse's "argument COMMAND: invalid choice: 'rn' (choose from 'run', 'cache')"
_INVALID = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>[^)]*)\)")
_OPTION = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


def unrecognized(extras: Sequence[str], usage: str) -> str | None:
    """argparse's ``unrecognized arguments`` message with the options of ``usage`` (a parser's
    usage line) that the unknown ones are closest to, or ``None`` when none is near."""
    options = sorted(set(_OPTION.findall(usage)))
    unknown = [arg.split("=", 1)[0] for arg in extras if arg.startswith("--") and len(arg) > 2]
    hints = [
        (given, " or ".join(near))
        for given in unknown
        if (near := difflib.get_close_matches(given, options, n=2, cutoff=0.75))
    ]
    if not hints:
        return None
    said = hints[0][1] if len(unknown) == 1 else ", ".join(f"{near} for {given}" for given, near in hints)
    return f"unrecognized arguments: {' '.join(extras)} (did you mean {said}?)"


def near_choice(message: str) -> str:
    """argparse's error ``message``, with the choice nearest an invalid one when it says one."""
    choice = _INVALID.search(message)
    if choice is None:
        return message
    choices = [c.strip(" '") for c in choice["choices"].split(",")]
    near = difflib.get_close_matches(choice["given"], choices, n=3)
    return message + (f" (did you mean {' or '.join(near)}?)" if near else "")
