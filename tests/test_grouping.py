"""Failed rows grouped by fingerprint: the exception's type, where it happened (the play's line, or
the tool and HTTP status) and the message with its values masked.  Real runs, real messages."""

from __future__ import annotations

import pandas as pd
import pytest

import playbook as pb
from playbook.runtime.grouping import mask, message_group


def _lookup(n: int) -> int:
    if n % 3 == 0:
        raise KeyError(f"user-{n}")
    return n


@pb.tool
async def flaky(n: int) -> int:
    status = 500 if n % 2 else 404
    raise pb.ToolError(f"HTTP {status} for /people/{n}?token=abc{n}", status=status, tool="flaky")


def test_one_bug_in_one_line_is_one_group_however_many_rows_it_fails(store: pb.ReceiptStore) -> None:
    """Each row's message names its own value; the rows that line failed are one group, with the row's
    own message kept in ``error``; another line raising the same message is another group."""

    @pb.play
    async def matcher(row, ctx):
        if row.n % 7 == 0:
            raise ValueError(f"no match for {row.n}")
        if row.n % 7 == 1:
            raise ValueError(f"no match for {row.n}")  # the same words, another line
        return {"m": row.n}

    first = matcher.fn.__code__.co_firstlineno
    run = pd.DataFrame({"n": range(700)}).play.run(matcher, store=store, progress=False)
    errors = run.errors
    assert list(errors.columns) == ["row", "position", "error", "group"]
    sizes = errors.groupby("group").size().to_dict()
    assert sizes == {
        f"ValueError: no match for <n> (line {first + 3})": 100,
        f"ValueError: no match for <n> (line {first + 5})": 100,
    }
    assert errors.set_index("row").loc[14, "error"].startswith("ValueError: no match for 14 (line ")


def test_a_helper_that_raises_groups_at_the_play_line_that_called_it(store: pb.ReceiptStore) -> None:
    """An error raised deep in the user's helper is grouped at the play's own line that called it, and
    its quoted value is masked."""

    @pb.play
    async def helped(row, ctx):
        return {"v": _lookup(row.n)}

    line = helped.fn.__code__.co_firstlineno + 2
    run = pd.DataFrame({"n": range(30)}).play.run(helped, store=store, progress=False)
    assert run.errors["group"].unique().tolist() == [f"KeyError: '…' (line {line})"]
    assert run.stats.failed == 10


def test_a_failed_tool_call_groups_by_tool_and_status(store: pb.ReceiptStore) -> None:
    """A tool's error groups by the tool and its HTTP status, not the play's line: a 500 and a 404
    from one line are two groups; the path's number and the query's value are masked."""

    @pb.play
    async def calls(row, ctx):
        return {"v": await ctx.tool(flaky, n=row.n)}

    run = pd.DataFrame({"n": range(20)}).play.run(calls, store=store, progress=False)
    assert run.errors.groupby("group").size().to_dict() == {
        "ToolError: HTTP <n> for /people/<n>?token=… (tool 'flaky', HTTP 404)": 10,
        "ToolError: HTTP <n> for /people/<n>?token=… (tool 'flaky', HTTP 500)": 10,
    }


def test_the_text_summary_lists_the_groups(store: pb.ReceiptStore, capsys: pytest.CaptureFixture[str]) -> None:
    """A script's summary has a line per kind of error, largest first, with an example row's own message."""

    @pb.play
    async def two_bugs(row, ctx):
        if row.n % 4 == 0:
            raise ValueError(f"bad value {row.n * 1.5}")
        if row.n % 4 == 1:
            raise ZeroDivisionError("division by zero")
        return {}

    pd.DataFrame({"n": range(41)}).play.map(two_bugs, store=store, progress="text")
    err = capsys.readouterr().err
    line = two_bugs.fn.__code__.co_firstlineno
    assert "21 rows failed, 2 kinds of error:" in err
    assert f"  11 × ValueError: bad value <n> (line {line + 3}); e.g. row 0: ValueError: bad value 0.0 (line {line + 3}: " in err
    assert f"  10 × ZeroDivisionError: division by zero (line {line + 5}); e.g. row 1: ZeroDivisionError: division by zero (line" in err


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("no match for 0", "no match for <n>"),
        ("price -3.5e-2 over 1,234", "price <n> over <n>"),
        ("KeyError: 'email'", "KeyError: '…'"),
        ('missing "acme.com" in "list"', 'missing "…" in "…"'),
        ("can't find the row's value", "can't find the row's value"),  # apostrophes are not quotes
        ("user 5f2b9c0e-1234-4abc-8def-0123456789ab gone", "user <id> gone"),
        ("order abc123 and p7, hash 0xdeadbeef", "order <id> and <id>, hash <id>"),
        ("bob.smith+x@mail.example.com bounced", "<email> bounced"),
        ("GET http://10.0.0.12:8080/v1/find?domain=a.com&page=2", "GET http://<ip>:<n>/<id>/find?domain=…&page=…"),
        ("plain words stay", "plain words stay"),
    ],
)
def test_mask_hides_the_values_a_message_names(text: str, masked: str) -> None:
    assert mask(text) == masked


def test_a_message_group_is_its_first_line_masked_and_bounded() -> None:
    """A failure known only by its message: its first line, masked, at most a line of a table long."""
    assert message_group("RuntimeError: boom 42\nTraceback (most recent call last): ...") == "RuntimeError: boom <n>"
    assert message_group("") == "(no message)"
    long = message_group("ValueError: " + "word " * 200)
    assert len(long) == 240 and long.endswith("…")
