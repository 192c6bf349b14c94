"""Tools: http_tool templating, pick, miss_status and secrets against the real demo provider;
@pb.tool binding and definitions."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pandas as pd
import pytest

import playbook as pb
from playbook.events import ProviderDown, ProviderHoldSet
from playbook.providers.limits import Backoff
from playbook.providers.provider import governor
from playbook.store import engine
from playbook.tools import engine_of


def _email_tool(demo, **over) -> pb.Tool:
    options = dict(
        method="GET",
        url=demo.url + "/v1/email",
        params={"domain": "{domain}", "first": "{first}"},
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret("DEMO_API_KEY", default="demo-key"),
        pick="email",
        miss_status=(404,),
        cost=1.0,
    )
    options.update(over)
    return pb.http_tool("acme.email", **options)


LEADS = pd.DataFrame(
    {"domain": [f"company{i}.com" for i in range(12)], "first": [f"Person{i}" for i in range(12)]},
    index=[f"lead-{i}" for i in range(12)],
)


def test_placeholders_are_the_parameters(demo) -> None:
    """{field} placeholders (not {secret}) become the tool's parameters."""
    assert _email_tool(demo).inputs == ("domain", "first")


def test_http_tool_mapped_directly_and_rerun_for_free(demo, store) -> None:
    """A mapped http tool binds columns, picks the email, records 404s as misses; a rerun sends 0 requests."""
    tool = _email_tool(demo)
    out = LEADS.play.map(tool, store=store, progress=False)
    first = demo.stats()
    assert first["requests"] == 12
    found = out["acme.email"].dropna()
    misses = out["acme.email"].isna().sum()
    assert first["by_status"].get("404", 0) == misses and len(found) + misses == 12
    assert all("@company" in e for e in found)
    assert (out["play_status"] == "ok").all()
    assert pb.last_run().stats.cost_spent == 12.0

    again = LEADS.play.map(tool, store=store, progress=False, refresh="rows")
    assert demo.stats()["requests"] == 12  # nothing dispatched
    assert again["acme.email"].equals(out["acme.email"])
    assert pb.last_run().stats.cost_saved == 12.0


def test_idempotency_key_is_stable_per_receipt(demo, store) -> None:
    """Every request carries an Idempotency-Key; the same call sends the same key."""
    tool = _email_tool(demo)
    LEADS.head(3).play.map(tool, store=store, progress=False)
    LEADS.head(3).play.map(tool, store=store, progress=False, refresh=True)
    keys = demo.stats()["idempotency_keys"]
    assert len(keys) == 3 + 3  # forced calls carry a fresh nonce
    fresh = pb.ReceiptStore(Path(store.location).parent / "other")
    LEADS.head(3).play.map(tool, store=fresh, progress=False)
    assert sorted(demo.stats()["idempotency_keys"].values()).count(2) == 3


def test_json_body_keeps_types_and_post(demo, store) -> None:
    """A lone placeholder in a JSON body keeps its value's type; the response is picked by path."""
    chat = pb.http_tool(
        "llm.chat",
        method="POST",
        url=demo.url + "/v1/chat/completions",
        json={
            "model": "demo-1",
            "temperature": "{temperature}",
            "messages": [{"role": "user", "content": "Summarise {company}"}],
        },
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret("DEMO_API_KEY", default="demo-key"),
        pick="choices.0.message.content",
    )

    @pb.play
    async def summarise(row, ctx):
        return {"summary": await ctx.tool(chat, company=row.company, temperature=0)}

    out = pd.DataFrame({"company": ["Acme Robotics", "Blue Harbor"]}).play.map(
        summarise, store=store, progress=False
    )
    assert out["play_status"].tolist() == ["ok", "ok"]
    assert all(isinstance(s, str) and s for s in out["summary"])
    receipt = store.receipts("llm.chat").iloc[0]
    assert receipt["input"]["temperature"] == 0


def test_http_error_fails_the_row_with_a_clear_message(demo, store) -> None:
    """A 422 fails only that row; the message names the tool and status, not the query string."""
    company = pb.http_tool(
        "acme.company",
        method="GET",
        url=demo.url + "/v1/company",
        params={"domain": "{domain}"},
        headers={"Authorization": "Bearer demo-key"},
    )

    @pb.play
    async def look(row, ctx):
        if row.domain == "bad":
            return {
                "c": await ctx.tool(
                    pb.http_tool(
                        "acme.nodomain",
                        method="GET",
                        url=demo.url + "/v1/company",
                        headers={"Authorization": "Bearer demo-key"},
                    ),
                    {},
                )
            }
        return {"c": await ctx.tool(company, domain=row.domain)}

    out = pd.DataFrame({"domain": ["acme.com", "bad"]}).play.map(look, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok", "failed"]
    assert "tool 'acme.nodomain': HTTP 422" in out["play_error"].iloc[1]
    assert out["c"].iloc[0]["domain"] == "acme.com"


def test_bad_credentials_stop_the_run(demo, store) -> None:
    """A 401 raises RunFatal naming the tool, the key's variable (not its value) and the provider's
    own words; remaining rows are skipped and receipts kept."""
    tool = _email_tool(demo, secret=pb.secret("DEMO_API_KEY", default="wrong-key"))
    with pytest.raises(pb.RunFatal, match="acme.email.*401") as stopped:
        LEADS.play.map(tool, store=store, progress=False, concurrency=2)
    said = str(stopped.value)
    assert "the key DEMO_API_KEY was refused (invalid api key)" in said and "wrong-key" not in said
    statuses = pb.last_run().result["play_status"]
    assert set(statuses) <= {"failed", "skipped"} and (statuses == "skipped").sum() >= 8
    assert demo.stats()["requests"] <= 2


def test_secret_never_lands_anywhere(demo, store, monkeypatch, caplog, capsys) -> None:
    """The secret value is not in the store's files, the result, logs, or error messages."""
    value = "sk-very-secret-123"
    demo.reset(api_keys=(value,))
    monkeypatch.setenv("DEMO_API_KEY", value)
    caplog.set_level(logging.DEBUG)
    tool = pb.http_tool(
        "acme.email",
        method="GET",
        url=demo.url + "/v1/email",
        params={"domain": "{domain}", "first": "{first}", "key": "{secret}"},
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret("DEMO_API_KEY"),
        pick="email",
        miss_status=(404,),
    )
    broken = pb.http_tool(
        "acme.broken",
        method="GET",
        url="http://127.0.0.1:9/v1/email",
        params={"key": "{secret}", "domain": "{domain}"},
        secret=pb.secret("DEMO_API_KEY"),
        timeout=2,
    )

    @pb.play
    async def both(row, ctx):
        email = await ctx.tool(tool, domain=row.domain, first=row.first)
        return {"email": email, "b": await ctx.tool(broken, domain=row.domain)}

    out = LEADS.head(4).play.map(both, store=store, progress="text")
    assert (out["play_status"] == "failed").all()
    assert value not in out.to_string() and value not in json.dumps(out["play_error"].tolist())
    engine(store).flush()
    for path in Path(store.location).rglob("*"):
        if path.is_file():
            assert value.encode() not in path.read_bytes(), path
    captured = capsys.readouterr()
    assert value not in captured.out + captured.err + caplog.text
    assert value not in repr(engine_of(tool).secret) and "DEMO_API_KEY" in repr(engine_of(tool).secret)


def test_missing_secret_is_fatal_and_named(demo, store) -> None:
    """A secret with no value and no default stops the run naming the variable."""
    tool = _email_tool(demo, secret=pb.secret("PLAYBOOK_TEST_UNSET_KEY"))
    with pytest.raises(pb.RunFatal, match="PLAYBOOK_TEST_UNSET_KEY"):
        LEADS.head(2).play.map(tool, store=store, progress=False)


def test_malformed_json_is_a_row_error(demo, store) -> None:
    """A 200 with a body that is not JSON fails the row with a clear message."""
    demo.reset(malformed_rate=1.0)
    out = LEADS.head(2).play.map(_email_tool(demo), store=store, progress=False)
    assert out["play_status"].tolist() == ["failed", "failed"]
    assert "malformed JSON" in out["play_error"].iloc[0]


def test_custom_client_is_used(store) -> None:
    """An http_tool can take its own httpx.AsyncClient (here with a MockTransport)."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"data": {"items": [{"v": request.url.params["q"]}]}})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    tool = pb.http_tool(
        "mock.q",
        method="GET",
        url="https://api.example/{kind}",
        params={"q": "{q}"},
        pick="data.items.0.v",
        client=client,
    )
    out = pd.DataFrame({"kind": ["a b"], "q": ["x&y"]}).play.map(tool, store=store, progress=False)
    assert out["mock.q"].tolist() == ["x&y"]
    assert seen == ["https://api.example/a%20b?q=x%26y"]


def test_tool_binding_errors(store) -> None:
    """Calling a tool with missing or unknown inputs fails the row naming the parameters."""

    @pb.tool
    def two(a: int, b: int) -> int:
        return a + b

    @pb.play
    async def wrong(row, ctx):
        return {"v": await ctx.tool(two, a=1, c=2)}

    out = pd.DataFrame({"n": [1]}).play.map(wrong, store=store, progress=False)
    assert "missing b; unexpected c" in out["play_error"].iloc[0]


def test_a_parameter_with_a_default_may_be_left_out(store) -> None:
    """A Python tool's defaults apply as in Python; the call is the same call whether the default is
    passed or not (one receipt), and a required parameter left out still fails the row naming it."""
    seen = []

    @pb.tool
    def greet(name: str, greeting: str = "hello", times: int = 1) -> str:
        seen.append((name, greeting, times))
        return f"{greeting} {name}" * times

    @pb.play
    async def implicit(row, ctx):
        return {"v": await ctx.tool(greet, name=row.name)}

    @pb.play
    async def explicit(row, ctx):
        return {"v": await ctx.tool(greet, {"name": row.name, "greeting": "hello"}, times=1)}

    @pb.play
    async def other(row, ctx):
        return {"v": await ctx.tool(greet, name=row.name, greeting="hi")}

    @pb.play
    async def without(row, ctx):
        return {"v": await ctx.tool(greet, greeting="hi")}

    frame = pd.DataFrame({"name": ["ada"]})
    first = frame.play.run(implicit, store=store, progress=False)
    assert first.result["v"].tolist() == ["hello ada"] and seen == [("ada", "hello", 1)]
    again = frame.play.run(explicit, store=store, progress=False)
    assert again.result["v"].tolist() == ["hello ada"]
    assert (again.stats.calls_reused, again.stats.calls_executed) == (1, 0) and len(seen) == 1
    assert frame.play.map(other, store=store, progress=False)["v"].tolist() == ["hi ada"] and len(seen) == 2
    failed = frame.play.map(without, store=store, progress=False)
    assert failed["play_error"].iloc[0].endswith("takes (name, greeting, times): missing name")


def test_a_tool_mapped_directly_takes_its_defaults_for_columns_the_frame_lacks(store) -> None:
    """Mapped over a frame, a parameter with a default needs no column; a column of its name wins."""

    @pb.tool
    def price(qty: int, unit: float = 2.5) -> float:
        return qty * unit

    assert pd.DataFrame({"qty": [2]}).play.map(price, store=store, progress=False)["price"].tolist() == [5.0]
    both = pd.DataFrame({"qty": [2], "unit": [1.0]})
    assert both.play.map(price, store=store, progress=False)["price"].tolist() == [2.0]
    with pytest.raises(pb.PlayDefinitionError, match="no column 'qty'"):
        pd.DataFrame({"unit": [1.0]}).play.map(price, store=store, progress=False)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "FETCH", "url": "http://x"}, "method"),
        ({"method": "GET", "url": "ftp://x"}, "url"),
        ({"method": "GET", "url": "http://x", "headers": {"A": "{secret}"}}, "no secret="),
        ({"method": "GET", "url": "http://x", "secret": "plain-text-key"}, "pb.secret"),
        ({"method": "GET", "url": "http://x", "timeout": 0}, "timeout"),
        ({"method": "GET", "url": "http://x", "cost": -1}, "cost"),
    ],
)
def test_http_tool_definition_errors(kwargs: dict, match: str) -> None:
    """A wrong http_tool definition is refused at once, naming the option."""
    with pytest.raises(pb.PlayDefinitionError, match=match):
        pb.http_tool("t", **kwargs)


def test_none_in_a_url_placeholder_is_a_row_error(store) -> None:
    """A None value for a URL path placeholder fails the row, naming the input."""
    tool = pb.http_tool(
        "path.tool",
        method="GET",
        url="https://api.example/{kind}/x",
        client=httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200, json={}))),
    )
    out = pd.DataFrame({"kind": [None, "a"]}).play.map(tool, store=store, progress=False)
    assert out["play_status"].tolist() == ["failed", "ok"]
    assert "input 'kind' is None" in out["play_error"].iloc[0]


def test_a_refused_connection_is_not_called_a_timeout(store) -> None:
    """A connection refused at once fails the row saying it could not connect, not that it timed out."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    tool = pb.http_tool(
        "nowhere", method="GET", url=f"http://127.0.0.1:{port}/v1", params={"q": "{q}"}, timeout=5
    )
    out = pd.DataFrame({"q": ["a"]}).play.map(tool, store=store, progress=False)
    error = out.loc[0, "play_error"]
    assert "could not connect" in error and "timed out" not in error


# -- where a request goes, from its input ------------------------------------------------------------


def test_a_whole_url_from_the_input_is_called_as_it_is_with_its_own_query(demo, store) -> None:
    """``url="{u}"`` calls the address each row gives, its own query kept (and params= joined to
    it); a value that is not an http(s) address, or None, fails its row, naming the input, before
    anything is sent, and no other row waits for it."""
    tool = pb.http_tool(
        "fetch",
        method="GET",
        url="{u}",
        params={"first": "{first}"},
        headers={"Authorization": "Bearer demo-key"},
        pick="email",
        miss_status=(404,),
        provider=pb.Provider("sites", retries=0),
    )
    frame = pd.DataFrame(
        {
            "u": [
                demo.url + "/v1/email?domain=company1.com",
                "ftp://example.com/x",
                "example.com/v1",
                None,
                "http://me:pa55word@host/x",
            ],
            "first": ["Person1"] * 5,
        }
    )
    out = frame.play.map(tool, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok", "failed", "failed", "failed", "failed"]
    assert out.loc[0, "fetch"] is None or "@company1.com" in out.loc[0, "fetch"]
    assert (
        demo.stats()["requests"] == 1 and demo.stats()["by_status"].get("422", 0) == 0
    )  # domain and first both arrived
    assert (
        "input 'u' must be an http:// or https:// address" in out.loc[1, "play_error"]
        and "'ftp://example.com/x'" in out.loc[1, "play_error"]
    )
    assert "input 'u' is None" in out.loc[3, "play_error"]
    assert (
        "no user:password@" in out.loc[4, "play_error"] and "pa55word" not in out.loc[4, "play_error"]
    )  # not repeated
    assert pb.last_run().stats.calls_failed == 0 and pb.last_run().parked.empty  # no provider was blamed


def test_a_host_from_the_input_must_be_a_host_name(demo_loopback, store) -> None:
    """A placeholder inside the URL's host takes host names only: a value that would carry the
    request elsewhere (a path, a query, a user) fails its row, naming the input (on loopback:
    an address and a name that both resolve to the server)."""
    demo = demo_loopback
    tool = pb.http_tool(
        "by.host",
        method="GET",
        url=f"http://{{host}}:{demo.port}/v1/company",
        params={"domain": "{d}"},
        headers={"Authorization": "Bearer demo-key"},
    )
    frame = pd.DataFrame(
        {"host": ["127.0.0.1", "evil.example/x?", "a@127.0.0.1", "localhost"], "d": ["acme.com"] * 4}
    )
    out = frame.play.map(tool, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok", "failed", "failed", "ok"]
    assert "input 'host' stands in the URL's host, so it must be a host name" in out.loc[1, "play_error"]


@pytest.mark.parametrize("url", ["{u}", "{base}/v1/email", "https://{region}.example.com/v1/email"])
def test_a_tool_that_sends_a_key_cannot_take_its_host_from_its_input(url: str) -> None:
    """A host chosen by a row would choose where the key goes: refused when the tool is made, saying how."""
    with pytest.raises(
        pb.PlayDefinitionError, match="the URL's host comes from its input .* fix the host in url="
    ):
        pb.http_tool(
            "t",
            method="GET",
            url=url,
            headers={"Authorization": "Bearer {secret}"},
            secret=pb.secret("T_KEY"),
        )
    with pytest.raises(pb.PlayDefinitionError, match="the URL's host comes from its input"):
        pb.http_tool(
            "t",
            method="GET",
            url=url,
            provider=pb.Provider("p", keys=[pb.secret("T_KEY")]),
            headers={"Authorization": "Bearer {secret}"},
        )


@pytest.mark.parametrize("bad", ["acme.com\r\nX-Evil: 1", "acme\nx", "a\x01b.com", "a\x00", "café.com"])
def test_a_value_no_header_can_carry_fails_its_row_before_anything_is_sent(bad: str, demo, store) -> None:
    """A row value with CR/LF (a header split in two), another control character or non-ASCII
    text in a header template fails its row naming the header, before anything is sent; the
    provider is not blamed and the other rows go on."""
    tool = pb.http_tool(
        "noted",
        method="GET",
        url=demo.url + "/v1/company",
        params={"domain": "{d}"},
        headers={"Authorization": "Bearer demo-key", "X-Note": "{d}"},
        provider=pb.Provider("noted"),
    )
    out = pd.DataFrame({"d": [bad, "acme.com"]}).play.map(tool, store=store, progress=False)
    assert out["play_status"].tolist() == ["failed", "ok"]
    assert "header 'X-Note' cannot carry" in out.loc[0, "play_error"]
    assert demo.stats()["requests"] == 1 and pb.last_run().stats.calls_failed == 0


def test_the_answers_and_failures_of_a_host_a_row_chose_are_that_rows_alone(store) -> None:
    """``url="{u}"`` over many sites: one that answers 403 or 500, or cannot be reached, fails its
    own row (a 403 there is the site's answer, not refused credentials: no key goes to it), and
    the rows whose sites answer go on; the provider is neither down nor the run stopped."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens there once closed

    def site(request: httpx.Request) -> httpx.Response:
        code = {"forbidden": 403, "broken": 500}.get(request.url.host.split(".")[0], 200)
        return httpx.Response(code, json={"host": request.url.host})

    tool = pb.http_tool(
        "sites",
        method="GET",
        url="{u}",
        provider=pb.Provider("sites", retries=1, max_wait=5),
        client=httpx.AsyncClient(transport=httpx.MockTransport(site)),
    )
    urls = [
        "http://forbidden.example/",
        "http://broken.example/",
        *(f"http://ok{i}.example/" for i in range(20)),
    ]
    out = pd.DataFrame({"u": urls}).play.map(tool, store=store, progress=False)
    assert out["play_status"].tolist() == ["failed", "failed"] + ["ok"] * 20
    assert "HTTP 403" in out.loc[0, "play_error"] and "HTTP 500" in out.loc[1, "play_error"]
    # Three rows of three tries: nine refused connections, past the five in a row that take a
    # provider down were they the provider's (more tries only add real seconds of backoff).
    unreachable = pb.http_tool(
        "far", method="GET", url="{u}", provider=pb.Provider("far", retries=2, max_wait=5), timeout=5
    )
    frame = pd.DataFrame({"u": [f"http://127.0.0.1:{closed}/x"] * 3})
    out = frame.play.map(unreachable, store=store, progress=False)
    assert (
        out["play_status"].tolist() == ["failed"] * 3
        and out["play_error"].str.contains("could not connect").all()
    )
    assert pb.last_run().parked.empty


def test_a_host_a_row_chose_that_answers_503_at_random_is_retried_like_the_providers(demo, store) -> None:
    """``url="{u}"`` against a flaky site (one request in ten answered 503): each failed request
    is retried, on its own, up to the provider's retries, and every row is done; the provider is
    never held nor down."""
    demo.reset(fault_rate=0.1, fault_status=503, miss_rate=0.0, seed=3)
    provider = pb.Provider("sites", retries=4)
    governor(provider).backoff = Backoff(base=0.05)  # short tries: the test is about their number
    events: list = []
    governor(provider).subscribe(events.append)
    tool = pb.http_tool(
        "fetch",
        method="GET",
        url="{u}",
        headers={"Authorization": "Bearer demo-key"},
        pick="email",
        provider=provider,
    )
    urls = [f"{demo.url}/v1/email?domain=company{i}.com&first=Person{i}" for i in range(100)]
    out = pd.DataFrame({"u": urls}).play.map(tool, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok"] * 100
    assert demo.stats()["by_status"].get("503", 0) >= 5 and demo.stats()["by_status"]["200"] == 100
    assert (
        not [e for e in events if isinstance(e, (ProviderHoldSet, ProviderDown))]
        and not provider.status().down
    )


def test_a_host_a_row_chose_that_always_fails_costs_its_row_its_retries_alone(demo, store) -> None:
    """One site always answers 503, another refuses connections: their rows fail after the
    provider's retries, saying the host the row chose failed and how many tries it took, while
    the other rows are done; the provider is never held nor down."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens there once closed
    provider = pb.Provider("sites", retries=2)
    governor(provider).backoff = Backoff(base=0.05)
    events: list = []
    governor(provider).subscribe(events.append)
    tool = pb.http_tool(
        "fetch",
        method="GET",
        url="{u}",
        headers={"Authorization": "Bearer demo-key"},
        provider=provider,
        timeout=5,
    )
    urls = [
        f"{demo.url}/v1/status/503",
        f"http://127.0.0.1:{closed}/x",
        *(f"{demo.url}/v1/status/200?i={i}" for i in range(30)),
    ]
    out = pd.DataFrame({"u": urls}).play.map(tool, store=store, progress=False)
    assert out["play_status"].tolist() == ["failed", "failed"] + ["ok"] * 30, out["play_error"].tolist()[:4]
    for error, what in zip(out["play_error"][:2], ["HTTP 503", "could not connect"]):
        assert (
            error.startswith("ProviderUnavailable: tool 'fetch': the host this row chose failed: ")
            and what in error
        )
        assert error.endswith("(gave up after 3 tries)"), error
    assert demo.stats()["by_status"]["503"] == 3
    assert (
        not [e for e in events if isinstance(e, (ProviderHoldSet, ProviderDown))]
        and not provider.status().down
    )


def test_a_none_leaves_out_its_lone_placeholder_and_fails_a_row_that_writes_it_within_text(store) -> None:
    """None where a placeholder stands alone leaves out that header or query parameter (as it
    does a parameter); None within text ("pre-{v}") fails the row naming the input, instead of
    sending the word "None"."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    tool = pb.http_tool(
        "noned",
        method="GET",
        url="https://api.example/x",
        params={"q": "{v}", "w": "w-{w}"},
        headers={"X-V": "{v}", "X-W": "pre-{w}"},
        client=httpx.AsyncClient(transport=httpx.MockTransport(answer)),
    )
    out = pd.DataFrame({"v": [None, "a"], "w": ["b", None]}).play.map(tool, store=store, progress=False)
    assert out["play_status"].tolist() == ["ok", "failed"]
    assert "input 'w' is None, but a template writes it within text" in out.loc[1, "play_error"]
    assert len(seen) == 1 and "x-v" not in seen[0].headers and "q" not in seen[0].url.params
    assert seen[0].headers["x-w"] == "pre-b" and seen[0].url.params["w"] == "w-b"


def test_receipt_addresses_and_fingerprints_are_those_earlier_releases_wrote() -> None:
    """A Python, an HTTP and an LLM tool's receipt address and fingerprint are the ones computed
    before a tool's engine was split from what its user holds: existing stores still answer."""
    from typing_extensions import TypedDict

    from playbook.tools.protocol import NO_INPUT

    class Firm(TypedDict):
        industry: str
        employees: int

    @pb.tool(version="3")
    def clean(domain: str, n: int = 2) -> str:
        return domain

    email = pb.http_tool(
        "acme.email",
        provider=pb.Provider("acme-pin", rps=5),
        method="POST",
        url="https://api.example.com/v1/email/{domain}",
        params={"first": "{first}", "key": "{secret}"},
        headers={"Authorization": "Bearer {secret}", "X-Team": "t"},
        secret=pb.secret("PIN_KEY", default="k"),
        pick="data.email",
        miss_status=(404,),
        json={"q": "{first}"},
    )
    classify = pb.llm_tool(
        "classify",
        model="gpt-4o-mini",
        base_url="https://llm.example.com/v1?api-version=2",
        system="Be brief.",
        max_tokens=20,
        seed=7,
        secret=None,
    )
    firm = pb.llm_tool("firm", model="m", secret=None, output=Firm)

    def pinned(tool: pb.Tool, **inputs: object) -> tuple[str, str]:
        engine = engine_of(tool)
        return engine.address(engine.bind(NO_INPUT, inputs)), tool.fingerprint

    assert pinned(clean, domain="a.com") == ("ra70b8707df705a454869ddd7cbb7618b", "c3585b60b755fb13")
    assert pinned(email, domain="a.com", first="Ann") == (
        "ra91078eb87434377237c9f055bf043f0",
        "d4f82d7e940c00bb",
    )
    assert pinned(classify, prompt="Hello") == ("r68903cc11f58de8217e6c2d3702a1721", "31bfc25b7c5f9349")
    assert pinned(firm, prompt="Acme") == ("ra84143b6b85e9ebf74642c71e754f2a8", "c7990b9573d3bb1b")


def test_a_new_kind_of_tool_is_an_engine_behind_a_tool(tmp_path) -> None:
    """A kind of tool of one's own implements the engine protocol (here by subclassing Engine): the
    pipeline binds, prices, sends and records it through its engine alone, and a rerun answers
    from its receipts."""
    from playbook.tools.engine import Engine
    from playbook.tools.protocol import CallEnv, Spent

    sent: list[str] = []

    class Reverser(Engine):
        """Answers its text reversed, as a remote service would, at a cent a character."""

        remote = True

        def spent(self, answer: object) -> Spent:
            return Spent(0.01 * len(str(answer)), None, 1)

        async def invoke(self, values: dict[str, str], call: CallEnv) -> tuple[object, bool]:
            sent.append(values["text"])
            return values["text"][::-1], False

    reverse = pb.Tool(Reverser("reverse", inputs=("text",)))
    assert reverse.inputs == ("text",) and reverse.name == "reverse"
    frame = pd.DataFrame({"text": ["abc", "de"]})
    out = frame.play.map(reverse, store=tmp_path / "s", progress=False)
    assert list(out.reverse) == ["cba", "ed"] and sent == ["abc", "de"]
    stats = pb.last_run().stats
    assert stats.calls_executed == 2 and stats.cost_spent == pytest.approx(0.05)
    again = frame.play.map(reverse, store=tmp_path / "s", progress=False)
    assert list(again.reverse) == ["cba", "ed"] and sent == ["abc", "de"]
