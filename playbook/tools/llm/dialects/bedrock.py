"""AWS Bedrock's Converse API: ``POST {base_url}/model/{modelId}/converse``, the base URL
``https://bedrock-runtime.{region}.amazonaws.com`` by default, each request signed with AWS
Signature Version 4 by botocore (``pip install playbook-df[bedrock]``) under the credentials its
chain finds (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, a
profile, a role).  ``region=`` or ``AWS_REGION`` names the region (it is in the signature).
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html

The system prompt is ``system: [{"text"}]``; the turns are ``messages`` with ``content:
[{"text"}]``; ``temperature`` and ``max_tokens`` go in ``inferenceConfig`` (``maxTokens``), and
so do ``topP=`` and ``stopSequences=``.  An output model is a forced tool: ``toolConfig: {"tools":
[{"toolSpec": {"name", "description", "inputSchema": {"json"}}}], "toolChoice": {"tool":
{"name"}}}``, and the answer is that ``toolUse`` block's ``input``.  The answer's
``output.message.content`` holds the text; ``stopReason`` becomes ``finish_reason``; ``usage``'s
``inputTokens`` (with ``cacheReadInputTokens`` and ``cacheWriteInputTokens``) and
``outputTokens`` the usage.  A ``ThrottlingException`` (``x-amzn-ErrorType``) is a 429, retried.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from playbook._internal.dist import install_hint
from playbook.errors import PlaybookError, PlayDefinitionError, RunFatal, ToolError
from playbook.tools.llm.dialects.base import Common, Target, normalized, part, shape_error, split, usage_of

if TYPE_CHECKING:
    from playbook.tools.llm.structured import Structured

__all__ = ["Bedrock", "SigV4"]

# ConverseRequest's members (botocore's bedrock-runtime service model), less those the tool sets
# (modelId, messages, system, inferenceConfig); then InferenceConfiguration's, given as keywords
# (maxTokens and temperature are llm_tool's max_tokens= and temperature=).
_TOP = frozenset(
    {
        "additionalModelRequestFields",
        "additionalModelResponseFieldPaths",
        "guardrailConfig",
        "outputConfig",
        "performanceConfig",
        "projectIdentifier",
        "promptVariables",
        "requestMetadata",
        "serviceTier",
        "toolConfig",
        "extra_body",
    }
)
_INFERENCE = frozenset({"topP", "stopSequences"})
_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}
_SERVICE = "bedrock"  # the signing name of bedrock-runtime (its service model's signingName)
# What each status an AWS error type comes with means here, when the answer's status says less.
_THROTTLED = ("ThrottlingException", "ServiceQuotaExceededException")

_REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+)+")


class Bedrock(Common):
    """The Converse API (see the module docstring)."""

    name = "bedrock"
    secret = None
    takes = frozenset({"region"})
    fields = _TOP | _INFERENCE
    reserved = frozenset({"modelId", "messages", "system", "inferenceConfig"})
    renamed: Mapping[str, str] = {"maxTokens": "max_tokens"}

    def target(
        self, tool: str, base_url: str | None, model: str, api_version: str | None, region: str | None
    ) -> Target:
        try:
            import botocore  # noqa: F401
        except ImportError:
            raise PlayDefinitionError(
                f"llm_tool {tool!r}: api='bedrock' signs its requests with botocore, which is not installed: "
                + install_hint("bedrock")
            ) from None
        if not isinstance(region, str) or not region:
            raise PlayDefinitionError(
                f"llm_tool {tool!r}: api='bedrock' needs region= (e.g. 'us-east-1') or AWS_REGION in the environment"
            )
        if not _REGION.fullmatch(region):  # it goes in the host name and the signature
            raise PlayDefinitionError(
                f"llm_tool {tool!r}: region must be an AWS region name (lowercase letters, digits and dashes, "
                f"e.g. 'us-east-1'), not {region!r}"
            )
        return Target(base_url or f"https://bedrock-runtime.{region}.amazonaws.com", model, None, region)

    def url(self, target: Target) -> tuple[str, dict[str, str]]:
        return f"{target.base_url}/model/{quote(target.model, safe='')}/converse", {}

    def headers(self, keyed: bool) -> dict[str, str]:
        return {}

    def body(
        self,
        tool: str,
        model: str,
        messages: list[dict[str, Any]],
        request: Mapping[str, Any],
        structured: Structured | None,
    ) -> dict[str, Any]:
        system, turns = split(tool, messages, api=self.name)
        body: dict[str, Any] = {
            "messages": [{"role": t["role"], "content": [{"text": t["content"]}]} for t in turns]
        }
        if system is not None:
            body["system"] = [{"text": system}]
        config: dict[str, Any] = {}
        for k, v in request.items():
            if k == "max_tokens":
                config["maxTokens"] = v
            elif k == "temperature" or k in _INFERENCE:
                config[k] = v
            elif k != "extra_body":
                body[k] = v
        if config:
            body["inferenceConfig"] = config
        if structured is not None:
            spec = {
                "name": structured.name,
                "description": f"Give the answer as {structured.name}.",
                "inputSchema": {"json": structured.schema},
            }
            body["toolConfig"] = {
                "tools": [{"toolSpec": spec}],
                "toolChoice": {"tool": {"name": structured.name}},
            }
        body.update(request.get("extra_body") or {})
        return body

    def reply(self, tool: str, data: Any, model: str) -> dict[str, Any]:
        message = (data.get("output") or {}).get("message") if isinstance(data, Mapping) else None
        blocks = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(blocks, list):
            raise shape_error(tool, self.name, "output.message.content", data)
        texts, used = [], None
        for block in blocks:
            if isinstance(block, Mapping) and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif isinstance(block, Mapping) and isinstance(block.get("toolUse"), Mapping) and used is None:
                used = json.dumps(block["toolUse"].get("input"), ensure_ascii=False)
        stop = data.get("stopReason")
        text = "".join(texts) if texts else None
        usage = part(data, "usage")
        read, wrote = usage.get("cacheReadInputTokens"), usage.get("cacheWriteInputTokens")
        prompt = usage.get("inputTokens")
        if isinstance(prompt, int):
            prompt += (read if isinstance(read, int) else 0) + (wrote if isinstance(wrote, int) else 0)
        filtered = _STOP.get(stop) == "content_filter"
        return normalized(
            self.name,
            content=used if used is not None else None if filtered else text,
            refusal=(text or f"stopped: {stop}") if filtered else None,
            finish_reason=_STOP.get(stop, stop) if isinstance(stop, str) else None,
            model=model,  # Converse does not say: the model asked for
            usage=usage_of(prompt, usage.get("outputTokens"), read, cache_creation_tokens=wrote),
        )

    def refused(self, error: ToolError, content: bytes, headers: httpx.Headers, now: float) -> PlaybookError:
        kind = headers.get("x-amzn-errortype", "").partition(":")[0]
        if kind in _THROTTLED and error.status != 429:
            error.status, error.retryable = 429, True
        return super().refused(error, content, headers, now)

    def signer(self, target: Target) -> httpx.Auth | None:
        assert target.region is not None
        return SigV4(target.region)


class SigV4(httpx.Auth):
    """Signs each request with AWS Signature Version 4 (botocore's ``SigV4Auth``) under the
    credentials botocore's chain finds, found once and refreshed by botocore as they expire.
    The signature covers the host, the date, the content type and the body; the secret key
    itself goes nowhere."""

    requires_request_body = True

    def __init__(self, region: str) -> None:
        self.region = region
        self._credentials: Any = None

    def __repr__(self) -> str:
        return f"<SigV4 {_SERVICE} {self.region}>"

    def __getstate__(self) -> dict[str, Any]:
        return {"region": self.region}  # credentials stay here: a worker finds its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["region"])  # type: ignore[misc]

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        if self._credentials is None:
            # The chain may ask the instance metadata service: off the event loop.
            self._credentials = await asyncio.to_thread(_chain)
        self.sign(request)
        yield request

    def sign(self, request: httpx.Request) -> None:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.exceptions import BotoCoreError

        try:
            frozen = self._credentials.get_frozen_credentials()  # refreshed here when they expire
        except BotoCoreError as exc:  # an expired SSO session, a role that can no longer be assumed
            raise RunFatal(
                f"api='bedrock': the AWS credentials could not be refreshed ({type(exc).__name__}: {exc})"
            ) from None
        aws = AWSRequest(
            method=request.method,
            url=str(request.url),
            data=request.content,
            headers={"Content-Type": request.headers.get("content-type", "application/json")},
        )
        SigV4Auth(frozen, _SERVICE, self.region).add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            if name in aws.headers:
                request.headers[name] = aws.headers[name]


def _chain() -> Any:
    """The credentials botocore's default chain finds, or RunFatal saying where it looked."""
    import botocore.session

    found = botocore.session.get_session().get_credentials()
    if found is None:
        raise RunFatal(
            "api='bedrock': no AWS credentials were found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE, or run where a role gives them)"
        )
    return found
