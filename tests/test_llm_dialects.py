"""Each LLM dialect against a server that speaks it as its provider documents it (a request shaped
wrong is answered 400 and fails the test): OpenAI's Chat Completions and Responses API,
Anthropic's Messages, Gemini's generateContent, Azure OpenAI and Bedrock's Converse (SigV4
checked by recomputing it).  Per dialect: text answers, structured output into typed columns,
usage priced, a rerun that sends nothing, the key only in its own header, the fields it documents
(a misspelt one refused with its near spelling), and the error bodies it sends read right."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import quote
from zoneinfo import ZoneInfo

import httpx
import pandas as pd
import pydantic
import pytest
from vtime import run_virtual

import playbook as pb
from playbook.tools import engine_of
from playbook.tools.protocol import NO_INPUT, CallEnv

KEY = "sk-test-7fQ2mZ9xLw4RkP3vT8nB"
ENV = "PLAYBOOK_TEST_DIALECT_KEY"
AWS_ID, AWS_SECRET = "AKIDEXAMPLE7Q2M", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
PRICES = (1.0, 2.0)  # per 1M input, output tokens
MODELS = {
    "openai": "gpt-4o-mini",
    "openai-responses": "gpt-4.1-mini",
    "anthropic": "claude-sonnet-4-5",
    "gemini": "gemini-2.5-flash",
    "azure": "my-gpt4o-deployment",
    "bedrock": "anthropic.claude-3-haiku-20240307-v1:0",
}
BASES = {
    "openai": "https://api.openai.test/v1",
    "openai-responses": "https://api.openai.test/v1",
    "anthropic": "https://api.anthropic.test",
    "gemini": "https://generativelanguage.googleapis.test",
    "azure": "https://acme.openai.azure.test",
    "bedrock": "https://bedrock-runtime.eu-west-1.amazonaws.com",
}
DIALECTS = list(MODELS)


class Profile(pydantic.BaseModel):
    industry: Literal["Software", "Retail", "Robotics"]
    summary: str
    employees: int | None = None


# -- the servers --------------------------------------------------------------------------------


class Wrong(Exception):
    """A request not as the provider's reference defines it."""


def check(ok: bool, why: str) -> None:
    if not ok:
        raise Wrong(why)


def tokens(text: str) -> int:
    return len(text) // 4 + 1


def instance(schema: dict[str, Any], node: dict[str, Any] | None = None) -> Any:
    """A value valid for a JSON schema (what a model would answer)."""
    node = schema if node is None else node
    if "$ref" in node:
        return instance(schema, schema["$defs"][node["$ref"].rsplit("/", 1)[1]])
    if "enum" in node:
        return node["enum"][-1]
    if "anyOf" in node:
        return instance(schema, next(n for n in node["anyOf"] if n.get("type") != "null"))
    kind = node.get("type")
    if kind == "object":
        return {k: instance(schema, v) for k, v in node["properties"].items()}
    return {"string": "Makes robots for warehouses.", "integer": 42, "number": 1.5, "boolean": True}[kind]


class Server:
    """A provider's endpoint: checks each request as its reference defines it, answers as it does.
    ``errors``: answers to give first, one per request."""

    path = ""

    def __init__(self, model: str) -> None:
        self.model = model
        self.requests: list[httpx.Request] = []
        self.problems: list[str] = []
        self.errors: list[httpx.Response] = []
        self.usage: list[tuple[int, int]] = []  # (input, output) tokens each answer was billed
        self.limits: list[Any] = []  # the cap on output tokens each request set, in the API's own field

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        try:
            check(request.method == "POST", f"method {request.method}")
            self.authorized(request)
            check(KEY not in str(request.url), "the key is in the URL")
            check(KEY.encode() not in request.content, "the key is in the body")
            body = json.loads(request.content)
            if self.errors:
                return self.errors.pop(0)
            return httpx.Response(200, json=self.answer(request, body))
        except (Wrong, KeyError, TypeError, ValueError, StopIteration) as exc:
            self.problems.append(f"{type(exc).__name__}: {exc}")
            return httpx.Response(400, json={"error": {"message": f"bad request: {exc}"}})

    def only_header(self, request: httpx.Request, name: str, value: str) -> None:
        check(request.headers.get(name) == value, f"{name} is {request.headers.get(name)!r}")
        others = [k for k, v in request.headers.items() if KEY in v and k.lower() != name.lower()]
        check(not others, f"the key is also in {others}")

    def authorized(self, request: httpx.Request) -> None:
        raise NotImplementedError

    def answer(self, request: httpx.Request, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def billed(self, prompt: str, answer: str) -> tuple[int, int]:
        used = (tokens(prompt), tokens(answer))
        self.usage.append(used)
        return used

    def cost(self) -> float:
        return sum(i * PRICES[0] + o * PRICES[1] for i, o in self.usage) / 1e6


def texts(messages: list[dict[str, Any]]) -> str:
    return " ".join(str(m["content"]) for m in messages)


CHAT_FIELDS = {"model", "messages", "temperature", "max_tokens", "response_format", "seed", "top_p"}


class Chat(Server):
    """https://platform.openai.com/docs/api-reference/chat/create"""

    path = "/v1/chat/completions"

    def authorized(self, request: httpx.Request) -> None:
        check(request.url.path == self.path and not request.url.query, f"URL {request.url}")
        self.only_header(request, "authorization", f"Bearer {KEY}")

    def answer(self, request: httpx.Request, body: dict[str, Any]) -> dict[str, Any]:
        check(set(body) <= CHAT_FIELDS, f"fields {sorted(set(body) - CHAT_FIELDS)}")
        check(body.get("model") == self.model or self.path != Chat.path, "model")
        self.limits.append(body.get("max_tokens"))
        for m in body["messages"]:
            check(
                m["role"] in ("system", "user", "assistant") and isinstance(m["content"], str), f"message {m}"
            )
        text = "Robotics"
        if "response_format" in body:
            form = body["response_format"]
            check(form["type"] == "json_schema" and form["json_schema"]["strict"] is True, f"format {form}")
            text = json.dumps(instance(form["json_schema"]["schema"]))
        i, o = self.billed(texts(body["messages"]), text)
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": self.model + "-2024-07-18",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o},
        }


class AzureChat(Chat):
    """https://learn.microsoft.com/azure/ai-foundry/openai/reference: the deployment in the path,
    api-version in the query, the key in api-key."""

    def authorized(self, request: httpx.Request) -> None:
        path = f"/openai/deployments/{self.model}/chat/completions"
        check(request.url.path == path, f"path {request.url.path}")
        check(dict(request.url.params) == {"api-version": "2024-10-21"}, f"query {request.url.query!r}")
        check("authorization" not in request.headers, "an Authorization header")
        self.only_header(request, "api-key", KEY)

    def answer(self, request: httpx.Request, body: dict[str, Any]) -> dict[str, Any]:
        check("model" not in body, "a model in the body (the deployment names it)")
        return super().answer(request, {**body, "model": self.model})


class Responses(Server):
    """https://platform.openai.com/docs/api-reference/responses/create"""

    fields = {"model", "input", "instructions", "temperature", "max_output_tokens", "text", "top_p", "store"}

    def authorized(self, request: httpx.Request) -> None:
        check(request.url.path == "/v1/responses" and not request.url.query, f"URL {request.url}")
        self.only_header(request, "authorization", f"Bearer {KEY}")

    def answer(self, request: httpx.Request, body: dict[str, Any]) -> dict[str, Any]:
        check(set(body) <= self.fields, f"fields {sorted(set(body) - self.fields)}")
        check(body["model"] == self.model, "model")
        check(all(m["role"] in ("user", "assistant") for m in body["input"]), "input roles")
        self.limits.append(body.get("max_output_tokens"))
        text = "Robotics"
        fmt = body.get("text", {}).get("format")
        if fmt is not None:
            check(fmt["type"] == "json_schema" and fmt["strict"] is True and "name" in fmt, f"format {fmt}")
            text = json.dumps(instance(fmt["schema"]))
        i, o = self.billed(body.get("instructions", "") + texts(body["input"]), text)
        part = {"type": "output_text", "text": text, "annotations": []}
        return {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "model": self.model + "-2025-04-14",
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [part],
                },
            ],
            "usage": {
                "input_tokens": i,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": o,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": i + o,
            },
        }


class Messages(Server):
    """https://docs.anthropic.com/en/api/messages"""

    fields = {"model", "max_tokens", "messages", "system", "temperature", "tools", "tool_choice", "top_k"}
    cache_read = 3  # tokens read from the prompt cache, billed beside input_tokens

    def authorized(self, request: httpx.Request) -> None:
        check(request.url.path == "/v1/messages" and not request.url.query, f"URL {request.url}")
        check(request.headers.get("anthropic-version") == "2023-06-01", "anthropic-version")
        check("authorization" not in request.headers, "an Authorization header")
        self.only_header(request, "x-api-key", KEY)

    def answer(self, request: httpx.Request, body: dict[str, Any]) -> dict[str, Any]:
        check(set(body) <= self.fields, f"fields {sorted(set(body) - self.fields)}")
        check(
            isinstance(body["max_tokens"], int) and body["model"] == self.model,
            "max_tokens and model are required",
        )
        self.limits.append(body["max_tokens"])
        roles = [m["role"] for m in body["messages"]]
        check(roles[0] == "user" and all(r in ("user", "assistant") for r in roles), f"roles {roles}")
        check(all(isinstance(m["content"], str) for m in body["messages"]), "content")
        check(isinstance(body.get("system", ""), str), "system")
        content: list[dict[str, Any]] = [{"type": "text", "text": "Robotics"}]
        stop = "end_turn"
        if "tools" in body:
            chosen = body["tool_choice"]
            tool = next(t for t in body["tools"] if t["name"] == chosen["name"])
            check(chosen["type"] == "tool" and tool["input_schema"]["type"] == "object", f"tool {tool}")
            content = [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": tool["name"],
                    "input": instance(tool["input_schema"]),
                }
            ]
            stop = "tool_use"
        i, o = self.billed(body.get("system", "") + texts(body["messages"]), json.dumps(content))
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": self.model + "-20250929",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": i - self.cache_read,
                "cache_read_input_tokens": self.cache_read,
                "cache_creation_input_tokens": 0,
                "output_tokens": o,
            },
        }


class Generate(Server):
    """https://ai.google.dev/api/generate-content"""

    fields = {"contents", "systemInstruction", "generationConfig", "safetySettings", "tools", "toolConfig"}
    config = {
        "temperature",
        "maxOutputTokens",
        "topP",
        "topK",
        "responseMimeType",
        "responseJsonSchema",
        "seed",
    }

    def authorized(self, request: httpx.Request) -> None:
        path = f"/v1beta/models/{self.model}:generateContent"
        check(request.url.path == path and not request.url.query, f"URL {request.url}")
        check("authorization" not in request.headers, "an Authorization header")
        self.only_header(request, "x-goog-api-key", KEY)

    def answer(self, request: httpx.Request, body: dict[str, Any]) -> dict[str, Any]:
        check(set(body) <= self.fields, f"fields {sorted(set(body) - self.fields)}")
        config = body.get("generationConfig", {})
        check(set(config) <= self.config, f"generationConfig {sorted(set(config) - self.config)}")
        self.limits.append(config.get("maxOutputTokens"))
        turns = body["contents"]
        check(all(c["role"] in ("user", "model") and [*c["parts"][0]] == ["text"] for c in turns), "contents")
        system = body.get("systemInstruction", {"parts": [{"text": ""}]})["parts"][0]["text"]
        text = "Robotics"
        if "responseJsonSchema" in config:
            check(config["responseMimeType"] == "application/json", "responseMimeType")
            text = json.dumps(instance(config["responseJsonSchema"]))
        i, o = self.billed(system + " ".join(c["parts"][0]["text"] for c in turns), text)
        return {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [{"text": "thinking...", "thought": True}, {"text": text}],
                    },
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": i,
                "candidatesTokenCount": o - 1,
                "thoughtsTokenCount": 1,
                "totalTokenCount": i + o,
            },
            "modelVersion": self.model,
        }


class Converse(Server):
    """https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html, with the
    SigV4 signature recomputed as AWS does
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html)."""

    fields = {"messages", "system", "inferenceConfig", "toolConfig", "additionalModelRequestFields"}
    region = "eu-west-1"

    def authorized(self, request: httpx.Request) -> None:
        raw = request.url.raw_path.decode()
        check(raw == f"/model/{quote(self.model, safe='')}/converse", f"path {raw}")
        auth = request.headers.get("authorization", "")
        fields = dict(p.strip().split("=", 1) for p in auth.removeprefix("AWS4-HMAC-SHA256 ").split(","))
        stamp = request.headers["x-amz-date"]
        scope = f"{stamp[:8]}/{self.region}/bedrock/aws4_request"
        check(
            auth.startswith("AWS4-HMAC-SHA256 ") and fields["Credential"] == f"{AWS_ID}/{scope}",
            f"auth {auth}",
        )
        signed = fields["SignedHeaders"].split(";")
        check({"host", "x-amz-date"} <= set(signed) and signed == sorted(signed), f"signed {signed}")
        canonical = "\n".join(
            [
                "POST",
                quote(raw, safe="/~"),  # each segment encoded twice, as every service but S3 asks
                request.url.query.decode(),
                "".join(f"{h}:{request.headers[h].strip()}\n" for h in signed),
                ";".join(signed),
                hashlib.sha256(request.content).hexdigest(),
            ]
        )
        told = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + AWS_SECRET).encode()
        for part in (stamp[:8], self.region, "bedrock", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        check(
            fields["Signature"] == hmac.new(key, told.encode(), hashlib.sha256).hexdigest(), "the signature"
        )
        check(
            AWS_SECRET not in str(request.headers) and AWS_SECRET.encode() not in request.content,
            "the secret key sent",
        )

    def answer(self, request: httpx.Request, body: dict[str, Any]) -> dict[str, Any]:
        check(set(body) <= self.fields, f"fields {sorted(set(body) - self.fields)}")
        check(
            set(body.get("inferenceConfig", {})) <= {"maxTokens", "temperature", "topP", "stopSequences"},
            "inferenceConfig",
        )
        check(
            all(
                m["role"] in ("user", "assistant") and [*m["content"][0]] == ["text"]
                for m in body["messages"]
            ),
            "messages",
        )
        self.limits.append(body.get("inferenceConfig", {}).get("maxTokens"))
        system = body.get("system", [{"text": ""}])[0]["text"]
        content: list[dict[str, Any]] = [{"text": "Robotics"}]
        stop = "end_turn"
        if "toolConfig" in body:
            name = body["toolConfig"]["toolChoice"]["tool"]["name"]
            spec = next(t["toolSpec"] for t in body["toolConfig"]["tools"] if t["toolSpec"]["name"] == name)
            content = [
                {"toolUse": {"toolUseId": "t1", "name": name, "input": instance(spec["inputSchema"]["json"])}}
            ]
            stop = "tool_use"
        i, o = self.billed(
            system + " ".join(m["content"][0]["text"] for m in body["messages"]), json.dumps(content)
        )
        return {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop,
            "usage": {"inputTokens": i, "outputTokens": o, "totalTokens": i + o},
            "metrics": {"latencyMs": 120},
        }


SERVERS: dict[str, Callable[[str], Server]] = {
    "openai": Chat,
    "openai-responses": Responses,
    "anthropic": Messages,
    "gemini": Generate,
    "azure": AzureChat,
    "bedrock": Converse,
}


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")


def tool(api: str, server: Server, **options: Any) -> pb.Tool:
    options.setdefault("prices", {MODELS[api]: PRICES})
    if api == "bedrock":
        options.setdefault("region", Converse.region)
    else:
        options.setdefault("secret", pb.secret(ENV))
    client = httpx.AsyncClient(transport=httpx.MockTransport(server))
    return pb.llm_tool(
        f"llm-{api}", model=MODELS[api], api=api, base_url=BASES[api], client=client, **options
    )


def frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"company": [f"Company {i} Robotics" for i in range(n)]})


# -- answers, usage, reruns ----------------------------------------------------------------------


@pytest.mark.parametrize("api", DIALECTS)
def test_text_answers_cost_their_usage_and_a_rerun_sends_nothing(api: str) -> None:
    """Three rows asked in the dialect (max_tokens sent in its own field): each gets the text; the run costs the usage the server
    billed (cache reads included) at the given prices; a rerun sends no request and costs nothing."""
    server = SERVERS[api](MODELS[api])
    llm = tool(api, server, system="Answer with one word.", max_tokens=200)

    async def industry(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"What industry is {row.company} in?")

    out = frame(3).play.map(industry, progress=False)
    assert server.problems == [] and (out.play_status == "ok").all(), (
        server.problems,
        out.play_error.tolist(),
    )
    assert list(out.industry) == ["Robotics"] * 3 and server.limits == [200] * 3
    stats = pb.last_run().stats  # type: ignore[union-attr]
    assert stats.calls_executed == 3 and stats.cost_spent == pytest.approx(server.cost(), rel=1e-9)
    assert server.cost() > 0
    frame(3).play.map(industry, progress=False)
    again = pb.last_run().stats  # type: ignore[union-attr]
    assert len(server.requests) == 3 and again.calls_executed == 0 and again.cost_spent == 0


@pytest.mark.parametrize("api", DIALECTS)
def test_structured_output_becomes_typed_columns(api: str) -> None:
    """output=Model is sent in the dialect's own form (response_format, text.format, a forced
    tool, responseJsonSchema, toolConfig) and its answer becomes one typed column per field."""
    server = SERVERS[api](MODELS[api])
    llm = tool(api, server, output=Profile)

    @pb.play(output=Profile)
    async def profile(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Profile {row.company}.")

    out = frame(2).play.map(profile, progress=False)
    assert server.problems == [] and (out.play_status == "ok").all(), (
        server.problems,
        out.play_error.tolist(),
    )
    assert list(out.industry) == ["Robotics", "Robotics"] and list(out.employees) == [42, 42]
    assert str(out.employees.dtype) == "Int64" and out.summary[0] == "Makes robots for warehouses."


def test_a_local_server_gets_no_key() -> None:
    """api='openai' with secret=None (vLLM, Ollama, LM Studio, llama.cpp): no Authorization header."""
    seen: list[httpx.Request] = []

    def local(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        return httpx.Response(200, json={"model": "llama3", "choices": [choice]})

    client = httpx.AsyncClient(transport=httpx.MockTransport(local))
    llm = pb.llm_tool(model="llama3", base_url="http://localhost:11434/v1", secret=None, client=client)

    async def ask(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt="hello")

    assert pd.DataFrame({"n": [1]}).play.map(ask, progress=False).ask[0] == "hi"
    assert str(seen[0].url) == "http://localhost:11434/v1/chat/completions"
    assert "authorization" not in seen[0].headers


def test_anthropic_sends_a_max_tokens_when_none_is_given() -> None:
    """The Messages API requires max_tokens: 4096 unless the tool sets one; the forced tool's
    answer comes back as the tool_use block's input."""
    server = Messages(MODELS["anthropic"])
    values = {"messages": [{"role": "user", "content": "hi"}]}
    assert engine_of(tool("anthropic", server)).body(values["messages"])["max_tokens"] == 4096  # type: ignore[attr-defined]
    assert engine_of(tool("anthropic", server, max_tokens=300)).body(values["messages"])["max_tokens"] == 300  # type: ignore[attr-defined]


# -- definitions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "field", "near"),
    [
        ("openai", "top_pp", "top_p"),
        ("openai-responses", "reasoning_effort", "reasoning"),
        ("anthropic", "stop_sequence", "stop_sequences"),
        ("gemini", "top_p", "topP"),
        ("azure", "frequency_penality", "frequency_penalty"),
        ("bedrock", "stop_sequences", "stopSequences"),
    ],
)
def test_an_unknown_field_is_refused_with_its_near_spelling(api: str, field: str, near: str) -> None:
    """A keyword that is not a documented request field of the dialect fails the definition,
    naming the field and the one meant; nothing is sent."""
    server = SERVERS[api](MODELS[api])
    with pytest.raises(
        pb.PlayDefinitionError,
        match=f"{field}= is not a request field of api={api!r} \\(did you mean {near}=\\?\\)",
    ):
        tool(api, server, **{field: 1})
    tool(api, server, **{near: 0.5})  # the documented spelling is taken
    assert server.requests == []


def test_a_dialect_field_goes_where_the_dialect_puts_it() -> None:
    """Gemini's topK goes in generationConfig with temperature and maxOutputTokens; Bedrock's topP in inferenceConfig."""
    gemini = engine_of(tool("gemini", Generate(MODELS["gemini"]), topK=5, max_tokens=50))
    body = gemini.body([{"role": "user", "content": "hi"}])  # type: ignore[attr-defined]
    assert body["generationConfig"] == {"temperature": 0.0, "maxOutputTokens": 50, "topK": 5}
    bedrock = engine_of(tool("bedrock", Converse(MODELS["bedrock"]), topP=0.9))
    body = bedrock.body([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])  # type: ignore[attr-defined]
    assert body["inferenceConfig"] == {"temperature": 0.0, "topP": 0.9} and body["system"] == [
        {"text": "Be brief."}
    ]


def test_options_a_dialect_does_not_take_are_refused() -> None:
    """An unknown api lists the dialects; api_version= and region= only where they apply; max_output_tokens= is max_tokens=."""
    with pytest.raises(
        pb.PlayDefinitionError,
        match="api='antropic' is not a dialect.*did you mean 'anthropic'.*'openai-responses'",
    ):
        pb.llm_tool(model="m", api="antropic")
    with pytest.raises(pb.PlayDefinitionError, match="api_version= is not an option of api='anthropic'"):
        pb.llm_tool(model="m", api="anthropic", api_version="2024-10-21")
    with pytest.raises(pb.PlayDefinitionError, match="region= is not an option of api='openai'"):
        pb.llm_tool(model="m", region="us-east-1")
    with pytest.raises(pb.PlayDefinitionError, match="max_output_tokens= is llm_tool's max_tokens="):
        pb.llm_tool(model="m", api="openai-responses", max_output_tokens=10)
    with pytest.raises(pb.PlayDefinitionError, match="api='azure' needs base_url="):
        pb.llm_tool(model="dep", api="azure")
    with pytest.raises(pb.PlayDefinitionError, match="needs region="):
        pb.llm_tool(model="m", api="bedrock")
    with pytest.raises(pb.PlayDefinitionError, match="signs each request with the AWS credentials"):
        pb.llm_tool(model="m", api="bedrock", region="us-east-1", secret=pb.secret("X"))
    with pytest.raises(
        pb.PlayDefinitionError, match="max_token= is not a request field.*did you mean max_tokens="
    ):
        pb.llm_tool(model="m", max_token=10)
    with pytest.raises(pb.PlayDefinitionError, match="messages= is set by the tool itself"):
        pb.llm_tool(model="m", api="anthropic", messages=[])


@pytest.mark.parametrize(
    ("base_url", "said"),
    [
        ("https://{resource}.openai.azure.com", "replace {resource} with your Azure resource's name"),
        ("https://x.example.com/{secret}", "remove {secret}: the key goes in its header"),
        ("https://x.example.com/v1/{prompt}", "replace {prompt} with its value"),
        ("https://x.example.com/v1}", "replace the braces"),
    ],
)
def test_a_base_url_with_a_placeholder_is_refused(base_url: str, said: str) -> None:
    """base_url is sent as written: a { or } in it fails the definition naming base_url (no key in a path, no row failed later)."""
    with pytest.raises(pb.PlayDefinitionError, match="base_url is sent as written") as refused:
        pb.llm_tool(model="dep", api="azure", base_url=base_url)
    assert said in str(refused.value) and "url=" not in str(refused.value).replace("base_url", "")


@pytest.mark.parametrize(
    ("api", "field"),
    [
        ("openai", "stream"),
        ("openai", "messages"),
        ("openai", "model"),
        ("openai-responses", "input"),
        ("anthropic", "system"),
        ("gemini", "contents"),
        ("gemini", "generationConfig"),
        ("azure", "response_format"),
        ("bedrock", "inferenceConfig"),
        ("bedrock", "maxTokens"),
    ],
)
def test_extra_body_cannot_set_what_the_tool_sets(api: str, field: str) -> None:
    """extra_body is refused a field the dialect sets itself (or an llm_tool option), as **fields is."""
    server = SERVERS[api](MODELS[api])
    with pytest.raises(
        pb.PlayDefinitionError,
        match=f"extra_body's {field!r} is (set by the tool itself|llm_tool's max_tokens=)",
    ):
        tool(api, server, extra_body={field: True})
    tool(api, server, extra_body={"something_of_its_own": 1})  # a server's own field is merged as given


def test_small_definition_mistakes_get_near_spellings_and_shapes() -> None:
    """api='OpenAI' is told 'openai' (case aside); region= must look like an AWS region name."""
    with pytest.raises(pb.PlayDefinitionError, match="api='OpenAI' is not a dialect.*did you mean 'openai'"):
        pb.llm_tool(model="m", api="OpenAI")
    with pytest.raises(pb.PlayDefinitionError, match="region must be an AWS region name.*'us east 1'"):
        pb.llm_tool(model="m", api="bedrock", region="us east 1")
    assert "us-gov-west-1" in repr(pb.llm_tool(model="m", api="bedrock", region="us-gov-west-1"))


@pytest.mark.parametrize("api", sorted(MODELS))
def test_a_conversation_the_dialect_cannot_carry_fails_its_row_unsent(api: str) -> None:
    """An empty prompt (every dialect), no user turn (those that need one) or a misspelt role fails the row naming the tool; nothing is sent."""
    server = SERVERS[api](MODELS[api])
    llm = tool(api, server)
    asks: list[Any] = [
        {"prompt": ""},
        {"prompt": "  "},
        {"messages": [{"role": "usr", "content": "hi"}]},
    ]
    if api in ("anthropic", "gemini", "bedrock"):
        asks.append({"messages": [{"role": "assistant", "content": "first"}]})

    async def ask(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, **asks[row.n])

    out = run_virtual(pd.DataFrame({"n": range(len(asks))}).play.amap(ask, progress=False))
    errors = out["play_error"].tolist()
    assert out["play_status"].eq("failed").all() and server.requests == []
    assert all(f"llm tool 'llm-{api}'" in e for e in errors)
    assert "prompt is empty" in errors[0] and "prompt is empty" in errors[1]
    assert "role 'usr' (did you mean 'user'?)" in errors[2]
    if len(asks) > 3:
        assert f"no user turn to answer, which api={api!r} needs" in errors[3]


def test_each_dialect_has_its_default_base_url_and_key() -> None:
    """Without base_url= and secret=, each dialect goes to its provider with its own key variable."""
    expect = {
        "openai": ("https://api.openai.com/v1/chat/completions", "OPENAI_API_KEY"),
        "openai-responses": ("https://api.openai.com/v1/responses", "OPENAI_API_KEY"),
        "anthropic": ("https://api.anthropic.com/v1/messages", "ANTHROPIC_API_KEY"),
        "gemini": (
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent",
            "GEMINI_API_KEY",
        ),
        "bedrock": ("https://bedrock-runtime.us-east-2.amazonaws.com/model/m%3A0/converse", None),
    }
    models = {"gemini": "gemini-2.5-flash", "bedrock": "m:0"}
    for api, (url, env) in expect.items():
        extra = {"region": "us-east-2"} if api == "bedrock" else {}
        endpoint = engine_of(pb.llm_tool(model=models.get(api, "m"), api=api, **extra)).endpoint  # type: ignore[attr-defined]
        assert (endpoint.url, getattr(endpoint.secret, "env_var", None)) == (url, env)
    azure = engine_of(pb.llm_tool(model="dep", api="azure", base_url="https://r.openai.azure.com")).endpoint  # type: ignore[attr-defined]
    assert azure.secret.env_var == "AZURE_OPENAI_API_KEY" and azure.query == {"api-version": "2024-10-21"}


# -- errors --------------------------------------------------------------------------------------


def _refusal(llm: pb.Tool) -> Exception:
    """What one call raises when the server refuses it."""
    engine = engine_of(llm)
    values = engine.bind(NO_INPUT, {"prompt": "hi"})

    async def go() -> Exception:
        try:
            await engine.invoke(values, CallEnv(lambda: httpx.AsyncClient(), "idem-1"))
        except Exception as exc:
            return exc
        raise AssertionError("the call was not refused")

    return run_virtual(go())


GOOGLE = "type.googleapis.com/google.rpc."


def test_gemini_reads_its_wait_from_the_body() -> None:
    """A 429 RESOURCE_EXHAUSTED with no Retry-After: the wait is RetryInfo.retryDelay in the body; the message is Google's."""
    server = Generate(MODELS["gemini"])
    details = [
        {
            "@type": GOOGLE + "QuotaFailure",
            "violations": [{"quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}],
        },
        {"@type": GOOGLE + "RetryInfo", "retryDelay": "45.8s"},
    ]
    error = {
        "code": 429,
        "message": "You exceeded your current quota.",
        "status": "RESOURCE_EXHAUSTED",
        "details": details,
    }
    server.errors.append(httpx.Response(429, json={"error": error}))
    refused = _refusal(tool("gemini", server))
    assert isinstance(refused, pb.ToolError) and refused.status == 429 and refused.retryable
    assert refused.retry_after == 45.8 and refused.quota is None
    assert "llm-gemini" in str(refused) and "You exceeded your current quota." in str(refused)


def test_a_spent_gemini_daily_quota_waits_for_midnight_pacific() -> None:
    """A QuotaFailure naming a per-day quota: ToolError.quota names it and the wait runs to the next midnight in US Pacific time."""
    server = Generate(MODELS["gemini"])
    quota = "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
    details = [
        {
            "@type": GOOGLE + "QuotaFailure",
            "violations": [
                {
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                    "quotaId": quota,
                }
            ],
        },
        {"@type": GOOGLE + "RetryInfo", "retryDelay": "20s"},
    ]
    server.errors.append(
        httpx.Response(
            429,
            json={
                "error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota", "details": details}
            },
        )
    )
    refused = _refusal(tool("gemini", server))
    assert isinstance(refused, pb.ToolError) and refused.quota == quota and refused.retry_after is not None
    reset = dt.datetime.fromtimestamp(time.time() + refused.retry_after, ZoneInfo("America/Los_Angeles"))
    assert refused.retry_after > 20 and (reset.hour, reset.minute) in ((0, 0), (23, 59))


def test_a_gemini_key_refused_stops_the_run() -> None:
    """Gemini answers a bad key with 400 API_KEY_INVALID (not 401): the run stops, as for any
    refused key, naming the key's variable and Google's words."""
    server = Generate(MODELS["gemini"])
    info = {"@type": GOOGLE + "ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com"}
    body = {
        "error": {
            "code": 400,
            "message": "API key not valid. Please pass a valid API key.",
            "status": "INVALID_ARGUMENT",
            "details": [info],
        }
    }
    server.errors.append(httpx.Response(400, json=body))
    stopped = _refusal(tool("gemini", server))
    assert isinstance(stopped, pb.RunFatal) and stopped.denied and stopped.status == 400
    assert f"the key {ENV} was refused (API key not valid. Please pass a valid API key.)" in str(stopped)


@pytest.mark.parametrize("api", ["anthropic", "openai-responses", "azure"])
def test_a_refused_key_names_its_variable_and_the_providers_words(api: str) -> None:
    """A 401 says which key was refused (its variable, never its value) and quotes the provider's message."""
    server = SERVERS[api](MODELS[api])
    said = {"error": {"type": "authentication_error", "message": f"invalid x-api-key {KEY}"}}
    server.errors.append(httpx.Response(401, json=said))
    stopped = _refusal(tool(api, server))
    assert isinstance(stopped, pb.RunFatal) and stopped.denied
    assert f"the key {ENV} was refused (invalid x-api-key ***)" in str(stopped) and KEY not in str(stopped)


def test_an_anthropic_overload_is_retried_and_the_row_answered() -> None:
    """529 overloaded_error (no retry-after) is a retryable overload: the row is answered on the next try."""
    server = Messages(MODELS["anthropic"])
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.errors.append(httpx.Response(529, json=overloaded))
    refused = _refusal(tool("anthropic", server))
    assert isinstance(refused, pb.ToolError) and (refused.status, refused.retryable, refused.retry_after) == (
        529,
        True,
        None,
    )
    assert "Overloaded" in str(refused)
    server = Messages(MODELS["anthropic"])
    server.errors += [httpx.Response(529, json=overloaded)] * 2
    llm = tool("anthropic", server, provider=pb.Provider("anthropic-529"))

    async def ask(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt="hi")

    out = run_virtual(pd.DataFrame({"n": [1]}).play.amap(ask, progress=False))
    assert out.ask[0] == "Robotics" and len(server.requests) == 3


def test_a_bedrock_throttle_is_a_429() -> None:
    """ThrottlingException (x-amzn-ErrorType) is a retryable 429, whatever status came with it."""
    server = Converse(MODELS["bedrock"])
    headers = {"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    server.errors.append(
        httpx.Response(
            400, json={"message": "Too many requests, please wait before trying again."}, headers=headers
        )
    )
    refused = _refusal(tool("bedrock", server))
    assert isinstance(refused, pb.ToolError) and (refused.status, refused.retryable) == (429, True)
    assert "Too many requests" in str(refused) and server.problems == []


def test_bedrock_credentials_come_from_the_aws_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no AWS credentials anywhere, the call stops the run saying where they are looked for."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    refused = _refusal(tool("bedrock", Converse(MODELS["bedrock"])))
    assert isinstance(refused, pb.RunFatal) and "AWS_ACCESS_KEY_ID" in str(refused)


def test_a_conversation_a_dialect_cannot_carry_fails_its_row() -> None:
    """A tool message sent to Anthropic has no place in the Messages API: that row fails naming
    the message, before anything is sent; the other rows are answered."""
    server = Messages(MODELS["anthropic"])
    llm = tool("anthropic", server)

    async def ask(row: Any, ctx: pb.Context) -> Any:
        role = "tool" if row.n == 1 else "user"
        return await ctx.tool(
            llm, messages=[{"role": "user", "content": "hi"}, {"role": role, "content": "x"}]
        )

    out = pd.DataFrame({"n": [0, 1]}).play.map(ask, progress=False)
    assert list(out.play_status) == ["ok", "failed"] and len(server.requests) == 1
    assert "messages[1] has role 'tool' which api='anthropic' does not take" in out.play_error[1]


def test_extra_body_carries_a_servers_own_fields() -> None:
    """extra_body={...} merges a local server's own fields into the body, where a plain keyword is refused."""
    llm = engine_of(
        pb.llm_tool(model="m", base_url="http://localhost:8000/v1", secret=None, extra_body={"top_k": 5})
    )
    assert llm.body([{"role": "user", "content": "hi"}]) == {  # type: ignore[attr-defined]
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.0,
        "top_k": 5,
    }
    with pytest.raises(pb.PlayDefinitionError, match="extra_body must be a dict"):
        pb.llm_tool(model="m", extra_body=[1])


@pytest.mark.parametrize(
    ("api", "answer"),
    [
        (
            "openai-responses",
            {
                "status": "completed",
                "model": "m",
                "output": [{"type": "message", "content": [{"type": "refusal", "refusal": "I can't help."}]}],
            },
        ),
        ("gemini", {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 4}}),
        (
            "anthropic",
            {
                "content": [{"type": "text", "text": "No."}],
                "stop_reason": "refusal",
                "model": "m",
                "usage": {},
            },
        ),
    ],
)
def test_a_refusal_is_a_miss(api: str, answer: dict[str, Any]) -> None:
    """A model's refusal, in each dialect's own form, gives the play None (and is kept as the refusal)."""
    seen: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=answer)

    client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    llm = pb.llm_tool(model=MODELS[api], api=api, base_url=BASES[api], secret=pb.secret(ENV), client=client)

    async def ask(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt="Say something you should not.")

    out = pd.DataFrame({"n": [1]}).play.map(ask, progress=False)
    assert out.play_status[0] == "ok" and "ask" not in out and len(seen) == 1  # no value: no column
    reply = engine_of(llm).dialect.reply("t", answer, "m")  # type: ignore[attr-defined]
    assert reply["refusal"] and reply["content"] is None and reply["api"] == api


def test_anthropic_refusing_temperature_says_how_to_leave_it_out() -> None:
    """A model that refuses the temperature llm_tool sends by default: the error says temperature=None."""
    server = Messages(MODELS["anthropic"])
    said = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "`temperature` is deprecated for this model."},
    }
    server.errors.append(httpx.Response(400, json=said))
    refused = _refusal(tool("anthropic", server))
    assert "temperature is deprecated" in str(refused).replace("`", "") and "temperature=None" in str(refused)


def test_a_body_wait_is_read_only_from_google_retry_info() -> None:
    """body_retry_delay reads RetryInfo.retryDelay ("45.8s", "2s") and nothing else: other details, garbage and non-JSON give None."""
    from playbook.providers.limits import body_retry_delay

    def body(*details: Any) -> bytes:
        return json.dumps({"error": {"code": 429, "details": list(details)}}).encode()

    assert body_retry_delay(body({"@type": GOOGLE + "RetryInfo", "retryDelay": "2s"})) == 2.0
    assert (
        body_retry_delay(
            body({"@type": GOOGLE + "Help"}, {"@type": GOOGLE + "RetryInfo", "retryDelay": "0.5s"})
        )
        == 0.5
    )
    assert body_retry_delay(body({"@type": GOOGLE + "RetryInfo", "retryDelay": "soon"})) is None
    assert body_retry_delay(body({"@type": GOOGLE + "QuotaFailure", "retryDelay": "3s"})) is None
    assert body_retry_delay(b"<html>busy</html>") is None and body_retry_delay(b'{"error": "x"}') is None
