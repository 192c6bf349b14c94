"""``pb.http_tool``: a tool that is one HTTP request, with ``{field}`` placeholders as its inputs.

A receipt answers for the request as it is sent: the method, the rendered URL, the query, the
JSON body and the headers, but not the credentials (any header or parameter that carries the
secret, and the usual authorization headers), so rotating a key costs nothing while changing a
model name or a prompt in the body pays once.  The receipt holds the whole JSON answer; ``pick``
is applied when it is read, so changing ``pick`` costs nothing and is always right.

A user holds an :class:`HttpTool` (its method and URL show); the request is made, addressed and
read by its :class:`HttpEngine` (see :mod:`~playbook.tools.protocol`).
"""

from __future__ import annotations

import json as _json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from playbook.addresses import digest, key_text, receipt_address
from playbook.errors import PlaybookError, PlayDefinitionError, RunFatal, ToolError
from playbook.providers.limits import retry_after
from playbook.providers.pool import chosen_key
from playbook.providers.provider import Provider
from playbook.secrets import PLACEHOLDER, Fill, Secret, SecretAuth, mask, rebuilt, scrub
from playbook.tools.engine import Engine
from playbook.tools.protocol import CallEnv
from playbook.tools.templates import BadTemplate, BadValue, UrlTemplate, collect, fill
from playbook.tools.tool import Tool
from playbook.tools.transport import proxy_for
from playbook.tools.wire import wire as _wire

__all__ = ["HttpEngine", "HttpTool", "http_tool"]

_RETRYABLE = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_FATAL = frozenset({401, 402, 403})
# What no header value can hold: control characters (CR and LF above all), tab aside.
_UNSENDABLE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Credentials, not part of what is asked: left out of receipt addresses even when written literally.
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"})


class HttpTool(Tool[Any]):
    """A tool that is one HTTP request (see :func:`http_tool`): its method and URL template show."""

    __slots__ = ("_http",)

    def __init__(self, engine: HttpEngine) -> None:
        super().__init__(engine)
        self._http = engine

    @property
    def method(self) -> str:
        return self._http.method

    @property
    def url(self) -> str:
        """The URL template, ``{field}`` placeholders unfilled."""
        return self._http.url


class HttpEngine(Engine):
    """The engine of an HTTP tool: one templated request (URL, query, JSON body and headers)."""

    remote = True

    __slots__ = (
        "method",
        "url",
        "query",
        "body",
        "headers",
        "pick",
        "miss_status",
        "secret",
        "timeout",
        "client",
        "_hidden",
        "_timeouts",
        "_address",
        "_keyed",
    )

    def __init__(
        self,
        name: str,
        *,
        method: str,
        url: str,
        query: dict[str, Any],
        body: Any,
        headers: dict[str, str],
        pick: str | None,
        miss_status: frozenset[int],
        secret: Secret | None,
        timeout: float,
        client: httpx.AsyncClient | None,
        version: str,
        provider: Provider | None,
        cost: float,
    ) -> None:
        fields: list[str] = []
        for template, where in ((url, "url"), (query, "params"), (body, "json"), (headers, "headers")):
            try:
                collect(template, fields, where)
            except BadTemplate as bad:
                raise PlayDefinitionError(f"http_tool {name!r}: {bad}") from None
        pooled = provider.name if provider is not None and provider.keys is not None else None
        if pooled is not None and secret is not None:
            raise PlayDefinitionError(
                f"http_tool {name!r}: provider {pooled!r} pools keys (keys=), and each call goes under one of them as "
                "'{secret}': drop secret="
            )
        if pooled is not None and "secret" not in fields:
            raise PlayDefinitionError(
                f"http_tool {name!r}: provider {pooled!r} pools keys (keys=), but no template uses '{{secret}}': put it "
                "where the key goes, e.g. headers={'Authorization': 'Bearer {secret}'}"
            )
        if "secret" in fields and secret is None and pooled is None:
            raise PlayDefinitionError(f"http_tool {name!r}: '{{secret}}' is used but no secret= was given")
        self._address = UrlTemplate(url)
        if self._address.origin and "secret" in fields:
            chosen = ", ".join(sorted(self._address.origin))
            raise PlayDefinitionError(
                f"http_tool {name!r}: the URL's host comes from its input ({chosen}), so a row would choose where the "
                "key goes: fix the host in url= (e.g. url=BASE + '/v1/{id}') or drop '{secret}'"
            )
        self.method, self.url, self.query, self.body, self.headers = method, url, query, body, headers
        self.pick, self.miss_status, self.secret, self.timeout, self.client = (
            pick,
            miss_status,
            secret,
            timeout,
            client,
        )
        # Waiting for a free connection is queueing, not slowness: only the call itself is timed.
        self._timeouts = httpx.Timeout(timeout, pool=None)
        # Where the definition puts the secret: the only places a call's key goes (see secrets.py).
        self._keyed = _Keyed(url, query, body, headers)
        # What a receipt's address leaves out: the parameters and headers that carry credentials.
        self._hidden = (
            self._keyed.params,
            self._keyed.headers | {k for k in headers if k.lower() in _CREDENTIAL_HEADERS},
        )
        super().__init__(
            name,
            inputs=[f for f in fields if f != "secret"],
            version=version,
            provider=provider,
            cost=cost,
            identity=version,
        )

    def _definition(self) -> str:
        shape = [
            self.identity,
            self.method,
            self.url,
            self.query,
            self.body,
            self.headers,
            self.pick,
            sorted(self.miss_status),
        ]
        return digest(key_text(shape))[:16]

    # -- addresses and reading --------------------------------------------------------------

    def address(self, values: Any) -> str:
        url, query, body, headers = self._render(_wire(values))
        hidden_params, hidden_headers = self._hidden
        sent = {
            "method": self.method,
            "url": url,
            "params": {k: v for k, v in query.items() if k not in hidden_params} if hidden_params else query,
            "json": body,
            "headers": {k.lower(): v for k, v in headers.items() if k not in hidden_headers},
        }
        return receipt_address(self.name, self.identity, key_text(sent), self.account)

    def read(self, answer: Any, miss: bool) -> tuple[Any, bool]:
        if self.pick:
            answer = _pick(answer, self.pick)
        return answer, miss or answer is None

    def _render(
        self, values: dict[str, Any], secret: str = PLACEHOLDER
    ) -> tuple[str, dict[str, Any], Any, dict[str, str]]:
        """URL, query, body and headers with the placeholders filled (the secret as ``secret``:
        the stand-in, but where :meth:`_filler` puts the value in).  An input that cannot be
        sent where it goes is the row's error, raised here: before an address, a lease or a request."""
        values = {**values, "secret": secret}
        try:
            url = self._address.fill(values) if "{" in self.url else self.url
        except KeyError as exc:
            raise self._refused(f"input {exc.args[0]!r} is None, but the URL needs a value") from None
        except BadValue as bad:
            raise self._refused(str(bad)) from None
        try:
            # A lone placeholder whose value is None leaves out its header or parameter (null in
            # a body); within text ("Bearer {token}") it cannot be written, and fails the row.
            headers = {
                k: str(h) for k, h in ((k, fill(v, values)) for k, v in self.headers.items()) if h is not None
            }
            query = {k: v for k, v in ((k, fill(v, values)) for k, v in self.query.items()) if v is not None}
            body = fill(self.body, values) if self.body is not None else None
        except KeyError as exc:
            raise self._refused(
                f"input {exc.args[0]!r} is None, but a template writes it within text"
            ) from None
        for k, v in headers.items():
            if not v.isascii() or _UNSENDABLE.search(v):  # a line break would split it in two
                raise self._refused(
                    f"header {k!r} cannot carry {mask(v)[:80]!r} (a line break, a control character or non-ASCII text)"
                )
        return url, query, body, headers

    def _refused(self, why: str) -> ToolError:
        return ToolError(
            f"tool {self.name!r}: {why}",
            tool=self.name,
            provider=self.provider.name if self.provider else None,
        )

    # -- the call ----------------------------------------------------------------------------

    async def invoke(self, inputs: dict[str, Any], call: CallEnv) -> tuple[Any, bool]:
        values = _wire(inputs)
        url, query, body, headers = self._render(values)
        headers["Idempotency-Key"] = call.idempotency_key
        where = f"{self.method} {url.split('?', 1)[0]}".replace(PLACEHOLDER, "{secret}")
        status, reply_headers, content, failure = await self._send(call, values, (url, query, body, headers))
        if isinstance(failure, ToolError):
            raise failure
        if failure is not None:
            # Raised here, outside the except block that caught it: the transport's error (which
            # holds the request) is not chained to ours, so nothing keeps it alive.
            raise self._error(f"{failure} ({where})", None, True, where)
        self.heard(reply_headers, call)
        if status in self.miss_status:
            return None, True
        # A refused key (401/403, or a dialect's own way of saying it) or no credit (402) is the
        # account's refusal, which stops the run (a pool retires the key instead); from a host the
        # row chose (no key goes there), it is that site's answer to this request, like any other 4xx.
        if not self._address.origin and (status in _FATAL or self.denied(status, content)):
            raise self._fatal(status, content, where)
        if status >= 400:
            reason = _reason(content)
            error = self._error(
                f"HTTP {status} ({where}){': ' + reason if reason else ''}",
                status,
                status in _RETRYABLE,
                where,
            )
            if error.retryable:
                error.retry_after = retry_after(reply_headers, now=time.time())
            raise self.refused(error, content, reply_headers)
        if not content.strip():
            return None, True
        try:
            data = _json.loads(content)
        except ValueError:
            # Mask before cutting: a preview cut inside an echoed key would show a prefix of it.
            preview = mask(content.decode("utf-8", "replace"))[:60]
            raise self._error(
                f"returned malformed JSON with HTTP {status} ({where}): {preview!r}", status, False, where
            ) from None
        return scrub(data), False

    def _fatal(self, status: int, content: bytes, where: str) -> RunFatal:
        """The run-stopping error of a refused key or of no credit: it names the key's variable
        (never its value) and quotes the provider's own words, masked and short."""
        who = f"provider {self.provider.name!r}" if self.provider else where
        key = chosen_key() or self.secret
        if status == 402:
            why = "payment required (no credit left)"
        else:
            why = f"the key {key.env_var} was refused" if key is not None else "the credentials were refused"
        said = _reason(content)
        said = said if len(said) <= 120 else said[:117] + "..."
        return RunFatal(
            mask(f"tool {self.name!r}: HTTP {status} from {who}: {why}" + (f" ({said})" if said else "")),
            tool=self.name,
            provider=self.provider.name if self.provider else None,
            status=status,
            denied=status != 402,
        )

    def denied(self, status: int, content: bytes) -> bool:
        """Whether an answer is the credentials refused (a 401 or 403 always is): a subclass that
        knows the provider's error bodies may find it in another status (Gemini's 400
        ``API_KEY_INVALID``)."""
        return False

    def heard(self, headers: httpx.Headers, call: CallEnv) -> None:
        """An answer came with these headers (before its status is judged): a subclass reads
        what the provider announces in them."""

    def refused(self, error: ToolError, content: bytes, headers: httpx.Headers) -> PlaybookError:
        """The error a refusal (HTTP 4xx/5xx, not 401-403) raises, as HTTP alone says it: a subclass
        that knows the provider's error bodies reads more from ``content``."""
        return error

    def signer(self) -> httpx.Auth | None:
        """What signs a request sent under no secret (AWS's SigV4): None, sent as it is."""
        return None

    async def _send(
        self, call: CallEnv, values: dict[str, Any], rendered: tuple[str, dict[str, Any], Any, dict[str, str]]
    ) -> tuple[int, httpx.Headers, bytes, str | ToolError | None]:
        """One request: status, headers and body of the answer, or why there was none (the
        row's own error when it could not be sent as written).  The response object stays in this
        frame, which ends here."""
        client = self.client or call.client()
        key = chosen_key() or self.secret  # a pooled provider's key for this call, else the tool's own
        auth = (
            SecretAuth(key, self._filler(client, values, rendered[3]))
            if key is not None
            else self.signer() or httpx.USE_CLIENT_DEFAULT
        )
        try:
            resp = await client.send(self._request(client, *rendered), auth=auth)
            content = await resp.aread()
        except httpx.TimeoutException as exc:
            # The aiohttp transport reports a refused connection as ConnectTimeout: say what it was.
            cause = exc.__cause__
            if (
                isinstance(exc, httpx.ConnectTimeout)
                and cause is not None
                and not isinstance(cause, TimeoutError)
            ):
                return 0, httpx.Headers(), b"", f"could not connect{self._via(rendered[0])}: {exc}"
            return 0, httpx.Headers(), b"", f"timed out after {self.timeout:g}s"
        except (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL) as exc:
            # The request could not be made as written: this row's error, never the provider's.
            return (
                0,
                httpx.Headers(),
                b"",
                self._refused(f"the request could not be sent ({type(exc).__name__}: {exc})"),
            )
        except httpx.HTTPError as exc:
            return 0, httpx.Headers(), b"", f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            # The aiohttp transport lets some of its own errors through (a response cut short,
            # "Data after Connection: close"): a failed exchange like any other, not a bug in the play.
            if type(exc).__module__.partition(".")[0] != "aiohttp":
                raise
            return 0, httpx.Headers(), b"", f"{type(exc).__name__}: {exc}"
        return resp.status_code, resp.headers, content, None

    def _request(
        self, client: httpx.AsyncClient, url: str, query: dict[str, Any], body: Any, headers: dict[str, str]
    ) -> httpx.Request:
        # httpx replaces a URL's own query with params= (even an empty one): a query written in the
        # URL, or brought by a whole address from the input, is kept and params= join it.
        address = httpx.URL(url).copy_merge_params(query) if query else httpx.URL(url)
        return client.build_request(self.method, address, json=body, headers=headers, timeout=self._timeouts)

    def _filler(self, client: httpx.AsyncClient, values: dict[str, Any], shown: dict[str, str]) -> Fill:
        """How a call's key goes in: its header templates rendered again with the value; when the
        URL, query or body holds it, the whole request made again from its templates."""
        keyed = self._keyed

        def fill_in(request: httpx.Request, value: str) -> httpx.Request:
            if not keyed.elsewhere:
                return rebuilt(
                    request,
                    headers={
                        k: str(fill(self.headers[k], {**values, "secret": value})) for k in keyed.headers
                    },
                )
            url, query, body, headers = self._render(values, value)
            return self._request(
                client, url, query, body, {**shown, **{k: headers[k] for k in keyed.headers}}
            )

        return fill_in

    def _via(self, url: str) -> str:
        """ " through the proxy ... (from $HTTPS_PROXY)" when the run's client went through one the
        environment names: a dead proxy otherwise reads as a dead provider."""
        found = proxy_for(url) if self.client is None else None
        return "" if found is None else f" through the proxy {found[1]} (from {found[0]})"

    def _error(self, what: str, status: int | None, retryable: bool, where: str = "") -> ToolError:
        """``where``: the request as sent (``GET http://host/people/7``); an error group shows the
        tool's template there instead (``GET http://host/people/{id}``), not masked."""
        error = ToolError(
            mask(f"tool {self.name!r}: {what}"),
            tool=self.name,
            provider=self.provider.name if self.provider else None,
            status=status,
            retryable=retryable,
        )
        if where:
            error.literal = (where, f"{self.method} {self.url.split('?', 1)[0]}")
        # A host the row chose failing is that row's failure, not the provider's: retried on its
        # own (a 429 included), it neither holds the provider nor takes it down.
        error.own = bool(self._address.origin)
        return error


class _Keyed:
    """The places an ``http_tool``'s definition puts ``{secret}``: headers and query parameters
    by name, and whether its URL or body holds it (``elsewhere``: the request is made again)."""

    __slots__ = ("headers", "params", "elsewhere")

    def __init__(self, url: str, query: Mapping[str, Any], body: Any, headers: Mapping[str, str]) -> None:
        self.headers = frozenset(k for k, v in headers.items() if _uses_secret(v))
        self.params = frozenset(k for k, v in query.items() if _uses_secret(v))
        self.elsewhere = bool(self.params) or _uses_secret(url) or _uses_secret(body)


def _uses_secret(template: Any) -> bool:
    fields: list[str] = []
    collect(template, fields, "")
    return "secret" in fields


def http_tool(
    name: str,
    *,
    method: str,
    url: str,
    params: Mapping[str, Any] | None = None,
    json: Any = None,
    headers: Mapping[str, str] | None = None,
    provider: Provider | None = None,
    version: str = "1",
    pick: str | None = None,
    miss_status: Sequence[int] | int = (),
    cost: float = 0.0,
    secret: Secret | None = None,
    timeout: float = 30.0,
    client: httpx.AsyncClient | None = None,
) -> HttpTool:
    """A tool that makes one HTTP request; ``{field}`` placeholders are its inputs.

    A receipt's address is the request as sent (see the module docstring); ``version`` is an
    optional salt, to pay again for requests already answered.

    A value fills its placeholder and nothing more: quoted as one segment in the URL's path and
    query; a whole ``http(s)://`` address for a placeholder that starts the URL (``url="{url}"``),
    a host name for one inside its host; text a header can carry in a header.  Anything else
    fails its row, naming the input, before it is sent.  ``secret``'s value goes only where the
    templates say ``{secret}``, put in by name when the request is sent; a tool whose host comes
    from its input cannot take one.
    """
    if not isinstance(method, str) or method.upper() not in {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"}:
        raise PlayDefinitionError(
            f"http_tool {name!r}: method must be GET, POST, PUT, PATCH, DELETE or HEAD, not {method!r}"
        )
    if not isinstance(url, str) or not url.startswith(("http://", "https://", "{")):
        raise PlayDefinitionError(f"http_tool {name!r}: url must be an http(s) URL, not {url!r}")
    if secret is not None and not isinstance(secret, Secret):
        raise PlayDefinitionError(
            f"http_tool {name!r}: secret must come from pb.secret('ENV_VAR'), not a plain value"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise PlayDefinitionError(
            f"http_tool {name!r}: timeout must be a number of seconds > 0, not {timeout!r}"
        )
    if pick is not None and (not isinstance(pick, str) or not pick):
        raise PlayDefinitionError(
            f"http_tool {name!r}: pick must be a dotted path like 'data.email', not {pick!r}"
        )
    if isinstance(miss_status, int):
        miss_status = (miss_status,)
    engine = HttpEngine(
        name,
        method=method.upper(),
        url=url,
        query=dict(params or {}),
        body=json,
        headers=dict(headers or {}),
        pick=pick,
        miss_status=frozenset(int(s) for s in miss_status),
        secret=secret,
        timeout=float(timeout),
        client=client,
        version=str(version),
        provider=provider,
        cost=cost,
    )
    return HttpTool(engine)


# -- answers ------------------------------------------------------------------------------------


def _reason(content: bytes) -> str:
    """What an error answer says, in a few words: its JSON ``error``/``message``/``detail``
    (nested ones too, as OpenAI's ``{"error": {"message": ...}}``), else the start of its text."""
    text = content.decode("utf-8", "replace").strip()
    if not text:
        return ""
    try:
        data = _json.loads(text)
    except ValueError:
        data = None
    for _ in range(3):
        if not isinstance(data, dict):
            break
        data = next((data[k] for k in ("error", "message", "detail", "title") if data.get(k)), None)
    said = data if isinstance(data, str) else text
    said = " ".join(mask(said).split())  # masked before it is cut: a cut key would leave its prefix
    return said if len(said) <= 200 else said[:197] + "..."


def _pick(data: Any, path: str) -> Any:
    """Follow a dotted path (``"data.0.email"``) into JSON; ``None`` where it runs out."""
    for part in path.split("."):
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and part.lstrip("-").isdigit() and -len(data) <= int(part) < len(data):
            data = data[int(part)]
        else:
            return None
        if data is None:
            return None
    return data
