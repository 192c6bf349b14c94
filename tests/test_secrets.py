"""Secrets audit: a real key, sent in the query, a header and the JSON body to the demo provider,
never reaches the store's files, the result, progress output, logs, receipts or error messages."""

from __future__ import annotations

import asyncio
import copy
import logging
import pickle
import traceback
from pathlib import Path
from urllib.parse import quote, quote_plus

import httpx
import pandas as pd
import pytest

import playbook as pb
from playbook import secrets
from playbook.store import engine

# Base64-style, as many real keys are: '/', '+' and '=' are escaped in URLs, so an audit that
# only looked for the raw value would miss the form a URL or an httpx log line carries.
SECRET = "PBtest-7f3Q/x+k~9.Z_w=="
FORMS = tuple(dict.fromkeys((SECRET, quote(SECRET, safe=""), quote(SECRET), quote_plus(SECRET))))
ENV = "PB_TEST_KEY"
COMPANIES = pd.DataFrame({"company": ["Acme Robotics", "Blue Harbor", "Cedar Labs"]}, index=["a", "b", "c"])


def _leaks(text: str | bytes) -> list[str]:
    """The forms of the secret found in ``text``."""
    if isinstance(text, bytes):
        return [f for f in FORMS if f.encode() in text]
    return [f for f in FORMS if f in text]


def _assert_clean(where: str, text: str | bytes) -> None:
    found = _leaks(text)
    assert not found, f"the secret leaks into {where}: {found}"


@pytest.fixture(autouse=True)
def _forget_revealed_secrets() -> None:
    """Log redaction must work from this test's own reveals, not ones left by earlier tests."""
    secrets.forget_revealed()


@pytest.fixture
def keyed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> pb.demo.DemoServer:
    """The demo provider accepting only SECRET, and $PB_TEST_KEY set to it: served in process,
    or on loopback for a test marked ``network``."""
    loopback = request.node.get_closest_marker("network") is not None
    demo: pb.demo.DemoServer = request.getfixturevalue("demo_loopback" if loopback else "demo")
    demo.reset(api_keys=(SECRET,))
    monkeypatch.setenv(ENV, SECRET)
    return demo


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every record the HTTP stacks and playbook emit, down to DEBUG."""
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "aiohttp", "playbook", "asyncio"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured record as a handler would write it, tracebacks included."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    return "\n".join(handler.format(r) for r in caplog.records if not r.name.startswith("uvicorn"))


def _chat(demo: pb.demo.DemoServer, **over: object) -> pb.Tool:
    """A chat tool carrying the secret in the query, the Authorization header and the JSON body."""
    options: dict = dict(
        method="POST",
        url=demo.url + "/v1/chat/completions",
        params={"api_key": "{secret}"},
        json={
            "model": "demo-1",
            "user": "{secret}",
            "messages": [{"role": "user", "content": "Summarise {company}"}],
        },
        headers={"Authorization": "Bearer {secret}", "X-Api-Key": "{secret}"},
        secret=pb.secret(ENV, default="not-the-key"),
        pick="choices.0.message.content",
    )
    options.update(over)
    return pb.http_tool("audit.chat", **options)


def _map(
    frame: pd.DataFrame, tool: pb.Tool, client: httpx.AsyncClient | None, **options: object
) -> pd.DataFrame:
    """map() the tool; a client of the test's own is closed on the loop that used it."""
    if client is None:
        return frame.play.map(tool, **options)

    async def run() -> pd.DataFrame:
        async with client:
            return await frame.play.amap(tool, **options)

    return asyncio.run(run())


def _store_bytes(store: pb.ReceiptStore) -> list[tuple[Path, bytes]]:
    engine(store).flush()
    return [(p, p.read_bytes()) for p in sorted(Path(store.location).rglob("*")) if p.is_file()]


def _assert_run_clean(
    out: pd.DataFrame, store: pb.ReceiptStore, capsys: pytest.CaptureFixture[str], caplog
) -> None:
    """Nothing a run leaves behind holds the secret."""
    _assert_clean("the result's repr", repr(out))
    _assert_clean("the result's CSV", out.to_csv())
    _assert_clean("the result's JSON", out.to_json(default_handler=str))
    _assert_clean("play_error", "\n".join(str(e) for e in out["play_error"]))
    for path, data in _store_bytes(store):
        _assert_clean(f"store file {path.name}", data)
    receipts = store.receipts()
    _assert_clean("receipts()", receipts.to_csv() + repr(receipts))
    _assert_clean("store.stats()", repr(store.stats()))
    run = pb.last_run()
    _assert_clean(
        "the run", repr(run) + repr(run.stats) + repr(run.errors) + repr(run.parked) + repr(run.waiting_on)
    )
    _assert_clean("the run's HTML summary (what the widget leaves)", run._repr_html_())
    captured = capsys.readouterr()
    _assert_clean("stdout/stderr", captured.out + captured.err)
    _assert_clean("log records", _log_text(caplog))


@pytest.mark.parametrize("transport", ["default", pytest.param("httpcore", marks=pytest.mark.network)])
def test_successful_run_leaves_no_trace_of_the_secret(keyed, store, capsys, logs, transport) -> None:
    """A run that sends the key in query, header and body (accepted by the provider) stores and
    shows none of it (httpcore's own logs: on loopback, the connection they log is a socket's)."""
    client = httpx.AsyncClient() if transport == "httpcore" else None
    out = _map(COMPANIES, _chat(keyed, client=client), client, store=store, progress="text")
    assert out["play_status"].tolist() == ["ok"] * 3, out["play_error"].tolist()
    assert keyed.stats()["by_status"] == {"200": 3}  # the provider did get the key
    assert any(r.name == "httpx" and "POST" in r.getMessage() for r in logs.records)  # the logs were captured
    _assert_run_clean(out, store, capsys, logs)


def test_provider_echoing_the_key_is_not_stored(keyed, store, capsys, logs) -> None:
    """A response that echoes the key back does not put it in the receipt or the result."""
    keyed.reset(api_keys=(SECRET,), job_seconds=0)
    submit = pb.http_tool(
        "audit.submit",
        method="POST",
        url=keyed.url + "/v1/jobs",
        json={"company": "{company}", "token": "{secret}"},
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret(ENV),
        pick="job_id",
    )
    fetch = pb.http_tool(
        "audit.fetch",
        method="GET",
        url=keyed.url + "/v1/jobs/{job_id}",
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret(ENV),
        pick="result",
    )

    @pb.play
    async def job(row, ctx):
        return {"job": await ctx.tool(fetch, job_id=await ctx.tool(submit, company=row.company))}

    out = COMPANIES.play.map(job, store=store, progress="text")
    assert out["play_status"].tolist() == ["ok"] * 3, out["play_error"].tolist()
    assert out["job"].iloc[0]["input"] == {
        "company": "Acme Robotics",
        "token": "***",
    }  # the echo is kept, the key masked
    _assert_run_clean(out, store, capsys, logs)


def _failing_cases(demo: pb.demo.DemoServer) -> dict[str, tuple[dict, dict]]:
    """name -> (demo settings, tool options): each makes every call fail with the secret in the URL."""
    in_path = demo.url + "/v1/keys/{secret}/chat"  # some APIs put the key in the path (bot tokens)
    chat = demo.url + "/v1/chat/completions"
    return {
        "500": ({"fault_rate": 1.0, "fault_status": 500}, {"url": chat}),
        "404 with the key in the path": ({}, {"url": in_path}),
        "422": (
            {},
            {
                "method": "GET",
                "url": demo.url + "/v1/company",
                "json": None,
                "params": {"key": "{secret}", "name": "{company}"},
            },
        ),
        "timeout": ({"latency": 0.5}, {"url": demo.url + "/v1/chat/completions/{secret}", "timeout": 0.05}),
        "connection refused": ({}, {"url": "http://127.0.0.1:9/v1/{secret}/chat"}),
        "malformed JSON": ({"malformed_rate": 1.0}, {"url": chat}),
    }


@pytest.mark.parametrize(
    "case", ["500", "404 with the key in the path", "422", "timeout", "connection refused", "malformed JSON"]
)
def test_failed_calls_name_no_secret(keyed, store, capsys, logs, case) -> None:
    """A failing call's row error, the raised error and its traceback hold no form of the secret."""
    settings, options = _failing_cases(keyed)[case]
    keyed.reset(api_keys=(SECRET,), **settings)
    chat = _chat(keyed, **options)
    out = COMPANIES.play.map(chat, store=store, progress="text")
    assert set(out["play_status"]) == {"failed"}
    assert all(e.startswith("ToolError: tool 'audit.chat'") for e in out["play_error"]), out[
        "play_error"
    ].tolist()
    if case[0].isdigit():
        assert f"HTTP {case.split()[0]}" in out["play_error"].iloc[0]
    _assert_run_clean(out, store, capsys, logs)
    with pytest.raises(pb.ToolError) as info:
        COMPANIES.head(1).play.map(chat, store=store, progress=False, on_error="raise")
    _assert_clean("the raised error", str(info.value) + "".join(traceback.format_exception(info.value)))


def test_refused_key_in_the_url_is_not_in_the_fatal_error(keyed, store, capsys, logs) -> None:
    """A 401 for a key carried in the URL path stops the run with a message that does not repeat the key."""
    keyed.reset(api_keys=("some-other-key",))
    chat = _chat(keyed, url=keyed.url + "/v1/keys/{secret}/chat")
    with pytest.raises(pb.RunFatal, match="401") as info:
        COMPANIES.play.map(chat, store=store, progress="text")
    _assert_clean("the RunFatal", str(info.value) + "".join(traceback.format_exception(info.value)))
    _assert_run_clean(pb.last_run().result, store, capsys, logs)


@pytest.mark.parametrize("stray", ["\r", "\n", " ", "\r\n"])
def test_a_secret_with_stray_whitespace_is_sent_without_it(
    keyed, store, capsys, monkeypatch, logs, stray
) -> None:
    """A key read with a trailing CR or newline (a .env file saved on Windows, a value pasted from
    a terminal) or a stray space is sent as the key itself: no key has one, and a header holding a
    newline is refused by the HTTP client before it is sent.  Nothing the run leaves holds it."""
    monkeypatch.setenv(ENV, stray + SECRET + stray)
    for client in (None, httpx.AsyncClient()):
        out = _map(COMPANIES.head(1), _chat(keyed, client=client), client, store=store, progress=False)
        assert out["play_status"].tolist() in (["ok"], ["reused"]), out["play_error"].tolist()
    assert keyed.stats()["by_status"] == {"200": 1}
    _assert_run_clean(out, store, capsys, logs)


def test_secret_and_tool_objects_do_not_reveal_the_value(keyed) -> None:
    """repr/str of the secret and the tool hide the value; pickling or copying refuses without naming it."""
    key = pb.secret(ENV, default=SECRET)
    chat = _chat(keyed, secret=key)
    key.reveal()
    for text in (repr(key), str(key), repr(chat), str(chat), f"{key}", f"{key!r}"):
        _assert_clean("a repr", text)
    assert ENV in repr(key)
    for attempt in (lambda: pickle.dumps(key), lambda: pickle.dumps(chat), lambda: copy.deepcopy(chat)):
        with pytest.raises(TypeError) as info:
            attempt()
        _assert_clean("the pickling error", str(info.value))


def test_malformed_body_echoing_the_key_is_masked_before_the_preview_is_cut(store, monkeypatch) -> None:
    """A malformed body that echoes the key near the preview's end shows neither the key nor a prefix of it."""
    monkeypatch.setenv(ENV, SECRET)
    body = b'{"note": "' + b"x" * 31 + b'", "key": "' + SECRET.encode()  # cut short: not JSON
    client = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    )
    tool = pb.http_tool(
        "mock.echo",
        method="GET",
        url="https://api.example/v1/{q}",
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret(ENV),
        client=client,
    )
    out = pd.DataFrame({"q": ["a"]}).play.map(tool, store=store, progress=False)
    error = out["play_error"].iloc[0]
    assert "malformed JSON" in error
    _assert_clean("the malformed-JSON preview", error)
    assert SECRET[:8] not in error


def _reachable_strings(root: object, limit: int = 200_000) -> list[str]:
    """Every str reachable from ``root`` through references (exception tracebacks and their frames'
    locals included), leaving out modules' namespaces and classes: what the run itself keeps alive."""
    import gc
    import sys
    import types

    module_dicts = {
        id(vars(m)) for m in list(sys.modules.values()) if m is not None and hasattr(m, "__dict__")
    }
    seen: set[int] = set()
    stack, found = [root], []
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in module_dicts or isinstance(obj, (types.ModuleType, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            found.append(obj)
            continue
        if isinstance(obj, types.FrameType):
            # A traceback's frame: its locals, not its globals or callers, nor this test's own (it
            # holds the demo provider, which knows the key: it is the other end).
            if obj.f_code.co_filename != __file__:
                stack.extend(obj.f_locals.values())
            continue
        if isinstance(obj, types.FunctionType):
            stack.extend(c.cell_contents for c in obj.__closure__ or () if _filled(c))
            continue
        stack.extend(gc.get_referents(obj))
    return found


def _filled(cell: object) -> bool:
    try:
        _ = cell.cell_contents  # type: ignore[attr-defined]
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("where", ["header", "url"])
def test_no_frame_or_object_a_refused_run_keeps_holds_the_key(keyed, store, where: str) -> None:
    """After a 401 (a refused key), nothing reachable from pb.last_run() or from the RunFatal it raised,
    frames of its traceback included, holds the key: it was unwrapped only inside the HTTP send."""
    keyed.reset(api_keys=("some-other-key",))
    chat = _chat(keyed, url=keyed.url + "/v1/keys/{secret}/chat") if where == "url" else _chat(keyed)
    with pytest.raises(pb.RunFatal) as info:
        COMPANIES.play.map(chat, store=store, progress=False)
    for root in (pb.last_run(), info.value):
        leaked = [text for text in _reachable_strings(root) if _leaks(text)]
        assert not leaked, f"the key is reachable from {type(root).__name__}: {leaked[:3]}"


def test_a_secret_pickles_as_the_name_of_its_variable_and_is_read_where_it_lands(monkeypatch) -> None:
    """A secret sent to another process (a Dask worker) carries its variable's name, never the
    value; it reads that process's environment when a call needs it."""
    monkeypatch.setenv(ENV, SECRET)
    key = pb.secret(ENV)
    assert key.reveal() == SECRET
    data = pickle.dumps(key)
    assert SECRET.encode() not in data and ENV.encode() in data
    monkeypatch.setenv(ENV, "the-other-process-key")
    assert pickle.loads(data).reveal() == "the-other-process-key"


def test_an_error_shows_where_the_secret_goes_in_the_url_as_its_placeholder(store, monkeypatch) -> None:
    """A key in the URL's path: the error names the request with ``{secret}`` where the key goes,
    not the key, nor the marker it is rendered with before it is filled in."""
    monkeypatch.setenv(ENV, SECRET)
    tool = pb.http_tool(
        "keyed.path",
        method="GET",
        url="http://127.0.0.1:9/v1/{secret}/email",
        params={"q": "{q}"},
        secret=pb.secret(ENV),
        provider=pb.Provider("closed-port", retries=0, max_wait=0),
    )
    out = pd.DataFrame({"q": ["a"]}).play.map(tool, store=store, progress=False)
    error = out["play_error"].iloc[0]
    assert "(GET http://127.0.0.1:9/v1/{secret}/email)" in error and secrets.PLACEHOLDER not in error
    _assert_clean("play_error", error)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("the key is PBtest-7f3Q/x+k~9.Z_w== indeed", "the key is *** indeed"),
        (
            "it began PBtest-7f3Q/x+k and went on",
            "it began PBtest-*** and went on",
        ),  # 8 characters past its prefix
        ("ends in k~9.Z_w==.", "ends in ***."),
        ("two: 7f3Q/x+k and +k~9.Z_w", "two: *** and ***"),
        ("lower-cased: pbtest-7f3q/x+k~9", "lower-cased: pbtest-***"),  # a model may echo it in any case
        ("PBtest-7f3Q (7 past the prefix)", "PBtest-7f3Q (7 past the prefix)"),  # too short to be a key's
        (
            "keys of this kind start with PBtest-",
            "keys of this kind start with PBtest-",
        ),  # its public prefix alone
        ("nothing of it here", "nothing of it here"),
    ],
)
def test_a_part_of_a_key_echoed_in_text_is_masked(
    text: str, shown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any run of 8 or more of a revealed key's characters past its public prefix is masked, in
    any case (an answer that repeats part of its request); shorter ones, and the prefix every key
    of its kind shares (``sk-proj-``), which ordinary text names, are not."""
    monkeypatch.setenv(ENV, SECRET)
    pb.secret(ENV).reveal()
    assert secrets.mask(text) == shown
    assert secrets.scrub({"a": [text], text: 1}) == {"a": [shown], shown: 1}


def test_a_row_value_spelling_the_stand_in_is_sent_as_it_is(keyed, store) -> None:
    """A row whose value is the stand-in a tool renders in the key's place, or ``{secret}``, is
    sent as that text: the provider answers for it, and the key went only in the header."""
    tool = pb.http_tool(
        "echo",
        method="GET",
        url=keyed.url + "/v1/email",
        params={"domain": "acme.com", "first": "{first}"},
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret(ENV),
        miss_status=(404,),
    )
    out = pd.DataFrame({"first": [secrets.PLACEHOLDER, "{secret}"]}).play.map(
        tool, store=store, progress=False
    )
    assert out["play_status"].tolist() == ["ok", "ok"]
    assert keyed.stats()["key_places"] == {"header authorization": 2}
