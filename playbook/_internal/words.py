"""How times, counts, money and tokens read in messages, reprs and views: "14:05:09", "12.3k",
"4m 05s", "$0.000081", "$1,204.10", "89.4k tokens".  Every view, message and repr that shows an
amount asks here, so one amount reads one way everywhere."""

from __future__ import annotations

import math
import time

__all__ = ["cut", "duration", "money", "short_count", "time_of_day", "tokens"]


def time_of_day(epoch: float) -> str:
    """The local time of day of an epoch timestamp: how a hold's or a parked row's deadline reads;
    with its date when that is not today ("Dec 03 21:13:52": a two-day hold must not read as five minutes)."""
    when = time.localtime(epoch)
    same_day = when[:3] == time.localtime()[:3]
    return time.strftime("%H:%M:%S" if same_day else "%b %d %H:%M:%S", when)


def short_count(n: float) -> str:
    """12 / 9,500 / 28.4k / 1.2M / 3.4G: a count at a glance."""
    if n < 1e4:
        return f"{n:,.0f}"
    unit, size = next((u, size) for u, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)) if n >= size)
    return f"{n / size:.3g}{unit}"


def duration(seconds: float) -> str:
    """45s / 2m 10s / 3h 05m / 2d 4h."""
    s = round(seconds) if math.isfinite(seconds) and seconds > 0 else 0
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def money(amount: float) -> str:
    """$24.45 / $1,204.10 / $0.50 / $0.012 / $0.000081: cents from a dollar up, and under one a
    cent's two decimals or two significant digits, whichever shows more (never 8.1e-05)."""
    if not math.isfinite(amount):
        return f"${amount}"
    sign, amount = ("-", -amount) if amount < 0 else ("", amount)
    if amount == 0 or amount >= 1:
        return f"{sign}${amount:,.2f}"
    if amount < 5e-10:  # amounts are kept to 9 decimals: less reads as none, but not as nothing paid
        return f"{sign}<$0.000000001"
    places = min(max(2, 1 - math.floor(math.log10(amount))), 9)
    text = f"{amount:.{places}f}"
    if places > 2:  # 0.0000999 rounds up to 0.000100: the zeros past the cents say nothing
        text = text.rstrip("0").ljust(4, "0")
    return f"{sign}${text}"


def tokens(n: float) -> str:
    """1 token / 950 tokens / 89.4k tokens / 1.2M tokens."""
    return "1 token" if n == 1 else f"{short_count(n)} tokens"


def cut(text: str, most: int) -> str:
    """``text`` in at most ``most`` characters: whole when it fits, else cut at the end of a word
    with an ellipsis ("no match for the domain of…"), never inside one unless a single word is
    longer than half the room (a URL)."""
    if len(text) <= most:
        return text
    head = text[: most - 1]
    if not text[most - 1].isspace():  # the cut falls inside a word: back to its start
        space = max(head.rfind(" "), head.rfind("\n"))
        if space > most // 2:
            head = head[:space]
    return head.rstrip(" \n,;:") + "…"
