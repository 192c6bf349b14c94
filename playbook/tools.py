"""Tools: the paid or slow things a play calls.  ``@pb.tool`` wraps a Python function,
``pb.http_tool`` describes an HTTP endpoint; both are cached by receipts.

A tool's *input* is always a mapping of its parameter names to values.  Python tools take their
function's parameters; HTTP tools take the ``{field}`` placeholders in their URL, params, JSON
body and headers (``{secret}`` is filled from the secret at call time and is never part of the
input, so it never reaches a receipt key, a receipt or a message).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import os
import re
import string
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, quote_plus

import httpx

from .errors import PlayDefinitionError, RunFatal, ToolError
from .limits import retry_after
from .providers import Provider


__all__ = ["NO_INPUT", "CallEnv", "HttpTool", "Secret", "Tool", "http_tool", "secret", "tool"]

_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
_FATAL = frozenset({401, 402, 403})
_NAME = re.compile(r"^[A-Za-z_][\w.\-]*$")


class Secret:
    """A credential read from an environment variable at call time; never stored or shown."""

    __slots__ = ("env_var", "_default")

    def __init__(self, env_var: str, default: str | None = None) -> None:
        if not isinstance(env_var, str) or not env_var:
            raise PlayDefinitionError("secret(): env_var must be the name of an environment variable")
        self.env_var = env_var
        self._default = default

    def reveal(self) -> str:
        value = os.environ.get(self.env_var) or self._default
        if not value:
            raise RunFatal(f"the secret {self.env_var} is not set: export {self.env_var}=... and run again")
        if value not in _redactor.values:
            _redactor.values.update(_forms(value))
        return value

    def __repr__(self) -> str:
        return f"secret({self.env_var!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a playbook secret cannot be pickled")


@functools.lru_cache(maxsize=64)
def _forms(value: str) -> tuple[str, ...]:
    """Every spelling of a secret that text about a request can carry, longest first.

    A URL carries it percent-encoded (httpx logs and error messages show ``%2F`` for ``/``), a
    repr or JSON escapes it, and a stray newline or CR from a ``.env`` file shows as ``\\r``:
    masking only the raw value would miss all of these.
    """
    forms = set()
    for v in {value, value.strip()}:
        if v:
            forms.update((v, quote(v, safe=""), quote(v), quote_plus(v), repr(v)[1:-1], json.dumps(v)[1:-1]))
    return tuple(sorted(forms, key=len, reverse=True))


def _mask(text: str, forms: Sequence[str]) -> str:
    for form in forms:
        if form in text:
            text = text.replace(form, "***")
    return text


def _scrub(data: Any, forms: Sequence[str]) -> Any:
    """``data`` with the secret masked in every string: what a provider echoes back is stored."""
    if isinstance(data, str):
        return _mask(data, forms)
    if isinstance(data, dict):
        return {_scrub(k, forms): _scrub(v, forms) for k, v in data.items()}
    if isinstance(data, list):
        return [_scrub(v, forms) for v in data]
    return data


class _Redactor(logging.Filter):
    """Masks revealed secrets in HTTP libraries' log records (httpx logs every request URL)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: set[str] = set()  # every form of every secret revealed in this process

    def filter(self, record: logging.LogRecord) -> bool:
        if self.values:
            text = record.getMessage()
            masked = _mask(text, sorted(self.values, key=len, reverse=True))
            if masked != text:
                record.msg, record.args = masked, ()
        return True


_redactor = _Redactor()
# A logger's filter sees only records logged on that very logger, not its children's: name each.
for _name in (
    "httpx", "httpcore", "httpcore.connection", "httpcore.http11", "httpcore.http2", "httpcore.proxy",
    "httpcore.socks", "aiohttp.client", "aiohttp.internal", "playbook",
):  # fmt: skip
    logging.getLogger(_name).addFilter(_redactor)


def secret(env_var: str, default: str | None = None) -> Secret:
    """A secret read from ``env_var`` (or ``default``) each time a call needs it."""
    return Secret(env_var, default)


class Tool:
    """A named, versioned, cached callable.  Create with :func:`tool` or :func:`http_tool`."""

    __slots__ = ("name", "version", "provider", "cost", "batch_size", "params", "fn", "_is_async", "_param_set")

    json_input = False  # Python tools get the values as given; HTTP tools their JSON form

    def __init__(
        self,
        name: str,
        *,
        params: Sequence[str],
        fn: Callable[..., Any] | None = None,
        version: str = "1",
        provider: Provider | None = None,
        cost: float = 0.0,
        batch_size: int | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise PlayDefinitionError(f"tool name {name!r} must start with a letter and use letters, digits, '.', '-' or '_'")
        if not isinstance(cost, (int, float)) or cost < 0:
            raise PlayDefinitionError(f"tool {name!r}: cost must be a number >= 0, not {cost!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise PlayDefinitionError(f"tool {name!r}: batch_size must be a whole number >= 1, not {batch_size!r}")
        if provider is not None and not isinstance(provider, Provider):
            raise PlayDefinitionError(f"tool {name!r}: provider must be a pb.Provider, not {type(provider).__name__}")
        self.name = name
        self.version = str(version)
        self.provider = provider
        self.cost = float(cost)
        self.batch_size = batch_size
        self.params = tuple(params)
        self._param_set = frozenset(self.params)
        self.fn = fn
        self._is_async = fn is not None and inspect.iscoroutinefunction(fn)

    @property
    def account(self) -> str:
        """The provider account this tool's receipts belong to."""
        return self.provider.account if self.provider is not None else "default"

    def __repr__(self) -> str:
        via = f", provider={self.provider.name!r}" if self.provider is not None else ""
        return f"<Tool {self.name!r} v{self.version}({', '.join(self.params)}){via}>"

    def bind(self, input: Any, kwargs: Mapping[str, Any]) -> Any:
        """The call's input as ``{param: value}``, from a positional input and/or keywords.

        A batch tool's input is one item of its list: the positional input, or the keywords.
        """
        if self.batch_size is not None:
            if input is NO_INPUT:
                return dict(kwargs)
            if kwargs:
                raise ToolError(f"batch tool {self.name!r}: pass one input, or keywords, not both", tool=self.name)
            return input
        if input is NO_INPUT and kwargs.keys() == self._param_set:
            return dict(kwargs)  # the common case, checked in one comparison
        one = self.params[0] if len(self.params) == 1 else None
        if input is NO_INPUT:
            values = dict(kwargs)
        elif one is not None and not kwargs and not (isinstance(input, Mapping) and set(input) == {one}):
            values = {one: input}
        elif isinstance(input, Mapping):
            values = {**input, **kwargs}
        else:
            raise ToolError(
                f"tool {self.name!r} takes ({', '.join(self.params)}): pass them by keyword or as one mapping",
                tool=self.name,
            )
        unknown = [k for k in values if k not in self.params]
        missing = [p for p in self.params if p not in values]
        if unknown or missing:
            parts = []
            if missing:
                parts.append("missing " + ", ".join(missing))
            if unknown:
                parts.append("unexpected " + ", ".join(unknown))
            raise ToolError(f"tool {self.name!r} takes ({', '.join(self.params)}): {'; '.join(parts)}", tool=self.name)
        return values

    async def invoke(self, inputs: dict[str, Any], call: CallEnv) -> tuple[Any, bool]:
        """Run the tool once; returns ``(output, miss)``.  Python tools: ``None`` is a miss."""
        fn = self.fn
        assert fn is not None
        if self._is_async:
            out = await fn(**inputs)
        else:
            # Sync tools run in a worker thread so a slow one never blocks the loop.
            out = await asyncio.to_thread(functools.partial(fn, **inputs))
        return out, out is None

    async def invoke_batch(self, items: list[Any]) -> list[Any]:
        """Run a batch tool on a list of inputs; returns one output (or exception) per input."""
        fn = self.fn
        assert fn is not None
        outs = await fn(items) if self._is_async else await asyncio.to_thread(fn, items)
        if not isinstance(outs, (list, tuple)) or len(outs) != len(items):
            got = f"{len(outs)} outputs" if isinstance(outs, (list, tuple)) else f"a {type(outs).__name__}"
            raise ToolError(f"batch tool {self.name!r} returned {got} for {len(items)} inputs; it must return a list, one output per input", tool=self.name)
        return list(outs)


class CallEnv:
    """What a tool needs from the run to make one call."""

    __slots__ = ("client", "idempotency_key")

    def __init__(self, client: Callable[[], httpx.AsyncClient], idempotency_key: str) -> None:
        self.client = client
        self.idempotency_key = idempotency_key


NO_INPUT: Any = object()  # "no positional input": None is a valid input


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    version: str = "1",
    provider: Provider | None = None,
    cost: float = 0.0,
    batch_size: int | None = None,
) -> Any:
    """Make a cached tool of a sync or async function; usable bare or with options."""

    def wrap(f: Callable[..., Any]) -> Tool:
        if not callable(f):
            raise PlayDefinitionError(f"@tool needs a function, not {type(f).__name__}")
        sig = inspect.signature(f)
        if batch_size is not None:
            if len(sig.parameters) != 1:
                raise PlayDefinitionError(f"batch tool {f.__name__!r} must take one parameter: the list of inputs")
            return Tool(name or f.__name__, params=(), fn=f, version=version, provider=provider, cost=cost, batch_size=batch_size)
        params = []
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
                raise PlayDefinitionError(
                    f"tool {f.__name__!r}: parameter {p.name!r} must be a plain named parameter (no *args, **kwargs or /)"
                )
            params.append(p.name)
        t = Tool(name or f.__name__, params=params, fn=f, version=version, provider=provider, cost=cost, batch_size=batch_size)
        return t

    return wrap if fn is None else wrap(fn)


class HttpTool(Tool):
    """A tool that is one HTTP request: templated URL, query, JSON body and headers."""

    __slots__ = ("method", "url", "query", "body", "headers", "pick", "miss_status", "secret", "timeout", "client")

    json_input = True  # NaN and NA arrive as None, numpy numbers as numbers, times as ISO text

    async def invoke(self, inputs: dict[str, Any], call: CallEnv) -> tuple[Any, bool]:
        secret_value = self.secret.reveal() if self.secret is not None else None
        forms = _forms(secret_value) if secret_value else ()
        values = {**inputs, "secret": secret_value}
        try:
            url = _fill_url(self.url, values) if "{" in self.url else self.url
        except KeyError as exc:
            raise ToolError(f"tool {self.name!r}: input {exc.args[0]!r} is None, but the URL needs a value", tool=self.name) from None
        headers = {k: str(_fill(v, values)) for k, v in self.headers.items()}
        headers["Idempotency-Key"] = call.idempotency_key
        query = {k: v for k, v in ((k, _fill(v, values)) for k, v in self.query.items()) if v is not None}
        body = _fill(self.body, values) if self.body is not None else None
        client = self.client or call.client()
        where = f"{self.method} {url.split('?', 1)[0]}"
        try:
            resp = await client.request(self.method, url, params=query, json=body, headers=headers, timeout=self.timeout)
            content = await resp.aread()
        except httpx.TimeoutException as exc:
            # The aiohttp transport reports a refused connection as ConnectTimeout: say what it was.
            cause = exc.__cause__
            if isinstance(exc, httpx.ConnectTimeout) and cause is not None and not isinstance(cause, TimeoutError):
                raise self._error(f"could not connect: {exc} ({where})", None, True, forms) from None
            raise self._error(f"timed out after {self.timeout:g}s ({where})", None, True, forms) from None
        except httpx.HTTPError as exc:
            raise self._error(f"{type(exc).__name__}: {exc} ({where})", None, True, forms) from None
        status = resp.status_code
        if status in self.miss_status:
            return None, True
        if status in _FATAL:
            who = f"provider {self.provider.name!r}" if self.provider else where
            raise RunFatal(
                _mask(
                    f"tool {self.name!r}: HTTP {status} from {who}: "
                    + ("the credentials were refused" if status != 402 else "payment required (no credit left)"),
                    forms,
                ),
                tool=self.name,
                provider=self.provider.name if self.provider else None,
                status=status,
            )
        if status >= 400:
            error = self._error(f"HTTP {status} ({where})", status, status in _RETRYABLE, forms)
            if error.retryable:
                error.retry_after = retry_after(resp.headers, now=time.time())
            raise error
        if not content.strip():
            return None, True
        try:
            data = resp.json()
        except ValueError:
            # Mask before cutting: a preview cut inside an echoed key would show a prefix of it.
            preview = _mask(content.decode("utf-8", "replace"), forms)[:60]
            raise self._error(f"returned malformed JSON with HTTP {status} ({where}): {preview!r}", status, False, forms) from None
        out = _pick(data, self.pick) if self.pick else data
        if forms:
            out = _scrub(out, forms)
        return out, out is None

    def _error(self, what: str, status: int | None, retryable: bool, forms: Sequence[str]) -> ToolError:
        return ToolError(
            _mask(f"tool {self.name!r}: {what}", forms),
            tool=self.name,
            provider=self.provider.name if self.provider else None,
            status=status,
            retryable=retryable,
        )


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
    miss_status: Sequence[int] = (),
    cost: float = 0.0,
    secret: Secret | None = None,
    timeout: float = 30.0,
    client: httpx.AsyncClient | None = None,
) -> HttpTool:
    """A tool that makes one HTTP request; ``{field}`` placeholders are its parameters."""
    if not isinstance(method, str) or method.upper() not in {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"}:
        raise PlayDefinitionError(f"http_tool {name!r}: method must be GET, POST, PUT, PATCH, DELETE or HEAD, not {method!r}")
    if not isinstance(url, str) or not url.startswith(("http://", "https://", "{")):
        raise PlayDefinitionError(f"http_tool {name!r}: url must be an http(s) URL, not {url!r}")
    if secret is not None and not isinstance(secret, Secret):
        raise PlayDefinitionError(f"http_tool {name!r}: secret must come from pb.secret('ENV_VAR'), not a plain value")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise PlayDefinitionError(f"http_tool {name!r}: timeout must be a number of seconds > 0, not {timeout!r}")
    if isinstance(miss_status, int):
        miss_status = (miss_status,)
    fields: list[str] = []
    for template in (url, params or {}, json, headers or {}):
        _collect(template, fields)
    if "secret" in fields and secret is None:
        raise PlayDefinitionError(f"http_tool {name!r}: '{{secret}}' is used but no secret= was given")
    t = HttpTool(name, params=[f for f in fields if f != "secret"], version=version, provider=provider, cost=cost)
    t.method = method.upper()
    t.url = url
    t.query = dict(params or {})
    t.body = json
    t.headers = dict(headers or {})
    t.pick = pick
    t.miss_status = frozenset(int(s) for s in miss_status)
    t.secret = secret
    t.timeout = float(timeout)
    t.client = client
    return t


# -- templating ----------------------------------------------------------------------------

_formatter = string.Formatter()


def _collect(template: Any, out: list[str]) -> None:
    if isinstance(template, str):
        for _, field, _, _ in _formatter.parse(template):
            if field is not None:
                if not field.isidentifier():
                    raise PlayDefinitionError(f"placeholder {{{field}}} must be a plain name")
                if field not in out:
                    out.append(field)
    elif isinstance(template, Mapping):
        for v in template.values():
            _collect(v, out)
    elif isinstance(template, (list, tuple)):
        for v in template:
            _collect(v, out)


def _whole(template: str) -> str | None:
    """The field name if the template is exactly one placeholder, like ``"{domain}"``."""
    parts = list(_formatter.parse(template))
    if len(parts) == 1 and parts[0][0] == "" and parts[0][1] is not None and not parts[0][2]:
        return parts[0][1]
    return None


def _fill(template: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(template, str):
        field = _whole(template)
        # A lone placeholder keeps the value's type (numbers stay numbers in JSON bodies).
        return values[field] if field is not None else template.format_map(values)
    if isinstance(template, Mapping):
        return {k: _fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, values) for v in template]
    return template


def _fill_url(template: str, values: Mapping[str, Any]) -> str:
    """Fill URL placeholders, each value quoted as one path segment."""
    return template.format_map({k: quote(str(v), safe="") for k, v in values.items() if v is not None and "{" + k in template})


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
