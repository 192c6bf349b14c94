"""Failed rows grouped by fingerprint: the exception's type, where it happened (the tool and HTTP
status, else the deepest line of the user's code) and the message with its values masked; a family
of many messages from one place is one group.  Real runs, real messages."""

from __future__ import annotations

import json
import socket
import time

import pandas as pd
import pydantic
import pytest

import playbook as pb
from playbook.runtime.rows.grouping import Families, mask, message_group
from playbook.tools import engine_of
from playbook.ui.html import in_words
from playbook.ui.tally import Tally
from playbook.ui.text import summary


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
    assert list(errors.columns) == ["row", "position", "error", "group", "cost"]
    sizes = errors.groupby("group").size().to_dict()
    assert sizes == {
        f"ValueError: no match for <n> (line {first + 3})": 100,
        f"ValueError: no match for <n> (line {first + 5})": 100,
    }
    assert errors.set_index("row").loc[14, "error"].startswith("ValueError: no match for 14 (line ")


def test_each_error_group_says_what_its_rows_paid_for(store: pb.ReceiptStore) -> None:
    """A priced tool, then a failure in some rows: ``run.errors`` says what each failed row paid,
    the summary and the panel what each group did, and ``cost_failed`` adds them up; a row that
    failed before paying costs nothing."""

    @pb.tool(cost=0.25)
    async def score(n: int) -> int:
        return n * 2

    @pb.play
    async def picky(row, ctx):
        if row.n % 10 == 1:
            raise LookupError(f"no score asked for {row.n}")  # before any call: paid nothing
        s = await ctx.tool(score, n=row.n)
        if row.n % 10 == 0:
            raise ValueError(f"score {s} is too low")
        return {"s": s}

    run = pd.DataFrame({"n": range(100)}).play.run(picky, store=store, progress=False)
    errors = run.errors.set_index("row")
    assert errors.loc[10, "cost"] == 0.25 and errors.loc[11, "cost"] == 0.0
    assert run.stats.cost_spent == 0.25 * 90 and run.stats.cost_failed == 0.25 * 10
    paid = errors.groupby(errors["group"].str.split(":").str[0])["cost"].sum().to_dict()
    assert paid == {"ValueError": 2.5, "LookupError": 0.0}
    text = summary(run.state, Tally.of(run.state))
    assert "cost $22.50 spent ($2.50 on failures), $0.00 saved" in text and "(paid $2.50)" in text, text
    html = run._repr_html_()
    assert "<th>paid for</th>" in html and "<td>$2.50</td>" in html and "<td>$22.50</td>" in html


def test_a_helper_that_raises_groups_at_its_own_line(store: pb.ReceiptStore) -> None:
    """An error raised in the user's helper is grouped at the helper's line, the deepest of the
    user's code (not a line of a library it called); its id is masked."""

    @pb.play
    async def helped(row, ctx):
        return {"v": _lookup(row.n), "w": json.loads(row.doc)}

    line = _lookup.__code__.co_firstlineno + 2
    frame = pd.DataFrame({"n": range(30), "doc": ["{}"] * 29 + ["{bad"]})
    run = pd.DataFrame(frame).play.run(helped, store=store, progress=False)
    play = helped.fn.__code__.co_firstlineno + 2
    assert run.errors.groupby("group").size().to_dict() == {
        f"KeyError: '<id>' (_lookup, line {line})": 10,  # user-0, user-3, ...: one group
        f"JSONDecodeError: Expecting property name enclosed in double quotes: line <n> column <n> (char <n>) (line {play})": 1,
    }


def test_two_bugs_behind_one_line_are_two_groups_and_one_bug_naming_each_row_is_one(
    store: pb.ReceiptStore,
) -> None:
    """Two helpers called from one line of the play fail for two reasons: two groups.  A message that
    names each row's value in plain words (no quotes, no digits) is still one group: the messages of
    one type and place that differ in more than FAMILY ways are one, their common words kept."""

    def email_of(d: dict) -> str:
        return d["email"]

    def phone_of(d: dict) -> str:
        return d["phone"]

    @pb.play
    async def contact(row, ctx):
        if row.n % 3 == 0:
            raise LookupError(f"no company named {row.name} in {row.city}")
        return {"c": (email_of if row.n % 3 == 1 else phone_of)({})}

    names = ["Acme", "Initech", "Globex", "Umbrella", "Hooli", "Stark", "Wayne", "Wonka", "Soylent", "Tyrell"]
    frame = pd.DataFrame(
        {"n": range(60), "name": [names[n % 10] for n in range(60)], "city": ["Paris", "Oslo"] * 30}
    )
    run = frame.play.run(contact, store=store, progress=False)
    first = contact.fn.__code__.co_firstlineno
    assert run.errors.groupby("group").size().to_dict() == {
        f"KeyError: 'email' (email_of, line {email_of.__code__.co_firstlineno + 1})": 20,
        f"KeyError: 'phone' (phone_of, line {phone_of.__code__.co_firstlineno + 1})": 20,
        f"LookupError: no company named … (line {first + 3})": 20,
    }
    assert len(set(run.errors["error"])) > 3  # each row's own message is kept


def test_a_sub_play_and_a_tool_mapped_directly_group_at_the_users_line(store: pb.ReceiptStore) -> None:
    """A play inside a play fails at its own line, not the outer play's; a tool mapped directly at the
    tool's line, not playbook's wrapper."""

    @pb.play
    async def inner(row, ctx):
        raise ValueError("inner broke")

    @pb.play
    async def outer(row, ctx):
        return await ctx.run_play(inner, n=row.n)

    @pb.tool
    def parse(n: int) -> int:
        raise ValueError("cannot parse")

    frame = pd.DataFrame({"n": range(4)})
    nested = frame.play.run(outer, store=store, progress=False)
    assert set(nested.errors["group"]) == {
        f"ValueError: inner broke (inner, line {inner.fn.__code__.co_firstlineno + 2})"
    }
    direct = frame.play.run(parse, store=store, progress=False)
    assert set(direct.errors["group"]) == {
        f"ValueError: cannot parse (parse, line {engine_of(parse).fn.__code__.co_firstlineno + 2})"
    }


def test_odd_exceptions_fail_their_row_not_the_run(store: pb.ReceiptStore) -> None:
    """An exception whose str() raises fails its row (the others finish); a pydantic error groups by
    its model's fields; a message of a megabyte is grouped in no time.  In real time: a pattern that
    backtracks over the megabyte ("1.1.1...") runs for far longer than 5 s; the run takes a
    fraction of a second, on a loaded machine too."""

    class ApiError(Exception):
        def __str__(self) -> str:
            raise KeyError("code")

    class Person(pydantic.BaseModel):
        age: int
        email: str

    @pb.play
    async def odd(row, ctx):
        if row.n == 0:
            raise ApiError()
        if row.n in (1, 2):
            Person.model_validate({"age": "x" * row.n, "email": "a"} if row.n == 1 else {"age": "old"})
        if row.n == 3:
            raise ValueError("1." * 500_000)
        return {}

    started = time.perf_counter()
    run = pd.DataFrame({"n": range(6)}).play.run(odd, store=store, progress=False)
    assert time.perf_counter() - started < 5
    assert run.stats.failed == 4 and run.stats.ok == 2
    errors = run.errors.set_index("row")
    assert errors.loc[0, "error"].startswith("ApiError: <str() of this ApiError failed: KeyError: 'code'>")
    assert errors.loc[1, "group"].startswith("ValidationError: Person: age (int_parsing) (line ")
    assert errors.loc[2, "group"].startswith(
        "ValidationError: Person: age (int_parsing), email (missing) (line "
    )
    assert len(errors.loc[3, "group"]) <= 240 + len(" (line 100)")


def test_a_failed_tool_call_groups_by_tool_and_status(store: pb.ReceiptStore) -> None:
    """A tool's error groups by the tool and its HTTP status, not the play's line: a 500 and a 404
    from one line are two groups; the path's number and the query's value are masked."""

    @pb.play
    async def calls(row, ctx):
        return {"v": await ctx.tool(flaky, n=row.n)}

    run = pd.DataFrame({"n": range(20)}).play.run(calls, store=store, progress=False)
    assert run.errors.groupby("group").size().to_dict() == {
        "ToolError: HTTP <n> for /people/<n>?token=… (kept as this call's answer: ctx.tool(..., refresh=True) or the run option "
        "refresh='all' asks again) (tool 'flaky', HTTP 404)": 10,
        "ToolError: HTTP <n> for /people/<n>?token=… (tool 'flaky', HTTP 500)": 10,
    }


def test_the_text_summary_lists_the_groups(
    store: pb.ReceiptStore, capsys: pytest.CaptureFixture[str]
) -> None:
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
    assert (
        f"  11 × ValueError: bad value <n> (line {line + 3}); e.g. row 0: ValueError: bad value 0.0 (line {line + 3}: "
        in err
    )
    assert (
        f"  10 × ZeroDivisionError: division by zero (line {line + 5}); e.g. row 1: ZeroDivisionError: division by zero (line"
        in err
    )


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("no match for 0", "no match for <n>"),
        ("price -3.5e-2 over 1,234", "price <n> over <n>"),
        ("KeyError: 'email'", "KeyError: 'email'"),  # a key, or a row's value: its family tells (see above)
        ("on 2024-01-05 at 2024-01-05T10:00:00+01:00", "on <date> at <date>"),
        ("user 5f2b9c0e-1234-4abc-8def-0123456789ab gone", "user <id> gone"),
        ("order abc123 and p7, hash 0xdeadbeef", "order <id> and <id>, hash <id>"),
        ("bob.smith+x@mail.example.com bounced", "<email> bounced"),
        (
            "GET http://10.0.0.12:8080/v1/find?domain=a.com&page=2",
            "GET http://<ip>:<n>/v1/find?domain=…&page=…",
        ),
        ("plain words stay", "plain words stay"),
    ],
)
def test_mask_hides_the_values_a_message_names(text: str, masked: str) -> None:
    assert mask(text) == masked


def test_a_message_group_is_its_first_line_masked_and_bounded() -> None:
    """A failure known only by its message: its first line, masked, at most a line of a table long."""
    assert (
        message_group("RuntimeError: boom 42\nTraceback (most recent call last): ...")
        == "RuntimeError: boom <n>"
    )
    assert message_group("") == "(no message)"
    long = message_group("ValueError: " + "word " * 200)
    assert len(long) <= 240 and long.endswith(" word…")


def test_a_tools_address_is_masked_alike_in_every_group(demo_loopback, store: pb.ReceiptStore) -> None:
    """A tool's template in a group is masked as a message is (host and port, numbers), its
    placeholders kept: a 404 and a refused connection to one host read it one way (on loopback:
    an address and a port, which a refused connection needs)."""
    demo = demo_loopback
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    missing = pb.http_tool("missing", method="GET", url=demo.url + "/status/{code}")
    refused = pb.http_tool("refused", method="GET", url=f"http://127.0.0.1:{dead}/status/{{code}}")

    @pb.play
    async def both(row, ctx):
        return {"v": await ctx.tool(missing if row.n % 2 else refused, code=row.n)}

    run = pd.DataFrame({"n": range(4)}).play.run(both, store=store, progress=False)
    groups = sorted(run.errors["group"].unique())
    assert len(groups) == 2, groups
    for group in groups:
        assert "127.0.0.1" not in group and "GET http://<ip>:<n>/status/{code}" in group, group


def test_a_template_is_masked_but_for_its_placeholders() -> None:
    """mask() shows a request as its tool's template, its host, port and numbers masked, {names} kept."""
    sent = "GET http://127.0.0.1:8800/v2/status/500"
    assert (
        mask(f"HTTP 500 ({sent})", (sent, "GET http://127.0.0.1:8800/v2/status/{code}"))
        == "HTTP <n> (GET http://<ip>:<n>/v2/status/{code})"
    )
    assert mask(f"HTTP 500 ({sent})") == "HTTP <n> (GET http://<ip>:<n>/v2/status/<n>)"


def test_long_groups_and_messages_are_cut_at_a_word_end() -> None:
    """A group, a family's group and a panel's message longer than their room end at a whole word
    and an ellipsis, not in the middle of one."""
    words = "ValueError: " + " ".join(["unexpected", "token", "in", "the", "answer"] * 20)
    group = message_group(words)
    assert len(group) <= 240 and group.endswith("…") and group[:-1] == words[: len(group) - 1], group
    assert words[len(group) - 1] == " ", group  # the word before the ellipsis is whole
    long = message_group("ValueError: " + "x" * 400)  # one word longer than the room: cut inside it
    assert len(long) == 240 and long.endswith("x…")
    families = Families()
    for n in range(5):
        families.add(f"KeyError: {'a' * 30} {n} " + "word " * 60 + "(line 3)")
    label = families.label(f"KeyError: {'a' * 30} 0 " + "word " * 60 + "(line 3)")
    assert label.startswith("KeyError: " + "a" * 30 + " … word") and label.endswith(" word… (line 3)"), label
    assert in_words("ConnectError: " + "refused again " * 20).endswith("again…")
