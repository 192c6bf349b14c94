"""argparse types shared by the command line and the ``%%play`` magic: argparse names the option
in the error, so a bad value reads "argument --concurrency: expected a whole number >= 1, not '0'"."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["amount", "cap", "columns", "place", "whole"]


def whole(least: int) -> Callable[[str], int]:
    """A whole number >= ``least``."""

    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, not {text!r}")
        return int(text)

    return parse


def amount(text: str) -> float:
    """A finite number >= 0 (a cost, seconds)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, not {text!r}")
    return value


def cap(text: str) -> float:
    """A finite number >= 0 that caps something (a total cost); the option left out caps nothing."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isinf(value) and value > 0:
        raise argparse.ArgumentTypeError(
            f"expected a number >= 0, not {text!r} (for no limit, leave the option out)"
        )
    return amount(text)


def place(text: str) -> str:
    """A directory or a redis:// URL: an empty one would be the current directory, unasked."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a directory or a redis:// URL, not {text!r}")
    return text


def columns(text: str) -> list[str]:
    """Column names separated by commas."""
    names = [c.strip() for c in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected column names separated by commas, not {text!r}")
    return names
