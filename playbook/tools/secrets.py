"""Secrets: credentials read from the environment at call time, never stored, logged or shown.

A request is rendered with a fixed placeholder where the secret goes; :class:`SecretAuth` puts
the real value in at the last moment, inside the HTTP client's send, and takes it out of the
request again once the answer is in.  So no frame of playbook's, no receipt, no error and no
object a finished run keeps (a response, an exception's request) holds the plain value.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import AsyncGenerator, Sequence
from typing import Any
from urllib.parse import quote, quote_plus

import httpx

from ..errors import PlayDefinitionError, RunFatal

__all__ = ["PLACEHOLDER", "Secret", "SecretAuth", "forget_revealed", "mask", "scrub", "secret"]

# Where a secret goes in a rendered request: letters only, so URL quoting leaves it as it is.
PLACEHOLDER = "PBSECRETxq7zkv3w"
MASK = "***"


class Secret:
    """A credential read from an environment variable at call time; never stored or shown."""

    __slots__ = ("env_var", "_default")

    def __init__(self, env_var: str, default: str | None = None) -> None:
        if not isinstance(env_var, str) or not env_var:
            raise PlayDefinitionError("secret(): env_var must be the name of an environment variable")
        self.env_var = env_var
        self._default = default

    def reveal(self) -> str:
        """The value, now; remembered (in all its spellings) only to mask it wherever it shows up."""
        value = self._read()
        if not value:
            raise RunFatal(f"the secret {self.env_var} is not set: export {self.env_var}=... and run again")
        _redactor.remember(value)
        return value

    def is_set(self) -> bool:
        """Whether it has a value here (its variable, or a default)."""
        return bool(self._read())

    def _read(self) -> str:
        # A value pasted from a .env file or a terminal often ends in a newline (or starts with a
        # space): no key has one, and a header with a newline is refused before it is sent.
        return (os.environ.get(self.env_var) or self._default or "").strip()

    def __repr__(self) -> str:
        return f"secret({self.env_var!r})"

    def __eq__(self, other: object) -> bool:
        """Two secrets read from one variable are one key (equal providers share their limits)."""
        return isinstance(other, Secret) and (self.env_var, self._default) == (other.env_var, other._default)

    def __hash__(self) -> int:
        return hash((Secret, self.env_var))

    __str__ = __repr__

    def __reduce__(self) -> Any:
        """The name of its variable travels (a Dask worker reads its own environment at call
        time), never a value: a secret with a default value cannot be pickled."""
        if self._default is not None:
            raise TypeError(
                f"secret({self.env_var!r}) has a default value, which would travel as plain text: set {self.env_var} "
                "in the environment of every process that runs the play (a cluster's workers too) and drop default="
            )
        return (Secret, (self.env_var,))


def secret(env_var: str, default: str | None = None) -> Secret:
    """A secret read from ``env_var`` (or ``default``) each time a call needs it."""
    return Secret(env_var, default)


@functools.lru_cache(maxsize=64)
def _forms(value: str) -> tuple[str, ...]:
    """Every spelling of a secret that text about a request can carry, longest first.

    A URL carries it percent-encoded (httpx logs and error messages show ``%2F`` for ``/``), a
    repr or JSON escapes it, and a stray newline or CR from a ``.env`` file shows as ``\\r``:
    masking only the raw value would miss all of these.
    """
    forms: set[str] = set()
    for v in {value, value.strip()}:
        if v:
            forms.update((v, quote(v, safe=""), quote(v), quote_plus(v), repr(v)[1:-1], json.dumps(v)[1:-1]))
    return tuple(sorted(forms, key=len, reverse=True))


def _mask_with(text: str, forms: Sequence[str]) -> str:
    for form in forms:
        if form in text:
            text = text.replace(form, MASK)
    return text


def mask(text: str) -> str:
    """``text`` with every secret revealed in this process masked, in every spelling."""
    forms = _redactor.forms
    return _mask_with(text, forms) if forms else text


def scrub(data: Any) -> Any:
    """``data`` (JSON) with secrets masked in every string: what a provider echoes back is stored."""
    if not _redactor.forms:
        return data
    if isinstance(data, str):
        return mask(data)
    if isinstance(data, dict):
        return {mask(k): scrub(v) for k, v in data.items()}
    if isinstance(data, list):
        return [scrub(v) for v in data]
    return data


class _Redactor(logging.Filter):
    """Masks revealed secrets in HTTP libraries' log records (httpx logs every request URL)."""

    def __init__(self) -> None:
        super().__init__()
        self._values: set[str] = set()
        self.forms: tuple[str, ...] = ()  # every spelling of every secret revealed, longest first

    def forget(self) -> None:
        self._values.clear()
        self.forms = ()

    def remember(self, value: str) -> None:
        if value not in self._values:
            self._values.add(value)
            self.forms = tuple(sorted({f for v in self._values for f in _forms(v)}, key=len, reverse=True))

    def filter(self, record: logging.LogRecord) -> bool:
        if self.forms:
            text = record.getMessage()
            masked = _mask_with(text, self.forms)
            if masked != text:
                record.msg, record.args = masked, ()
        return True


_redactor = _Redactor()


def forget_revealed() -> None:
    """Forget every secret revealed so far in this process (tests start from none)."""
    _redactor.forget()


# A logger's filter sees only records logged on that very logger, not its children's: name each.
for _name in (
    "httpx", "httpcore", "httpcore.connection", "httpcore.http11", "httpcore.http2", "httpcore.proxy",
    "httpcore.socks", "aiohttp.client", "aiohttp.internal", "playbook",
):  # fmt: skip
    logging.getLogger(_name).addFilter(_redactor)


class SecretAuth(httpx.Auth):
    """Fills the secret into a request rendered with :data:`PLACEHOLDER`, inside the client's send."""

    def __init__(self, secret: Secret) -> None:
        self._secret = secret

    def __repr__(self) -> str:
        return f"<SecretAuth {self._secret!r}>"

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        await request.aread()  # a multipart upload streams: its body is read here to be filled
        sent = _filled(request, self._secret.reveal())
        try:
            yield sent
        finally:
            # The request lives on in the response and in any error: leave no secret in it.
            sent.url = httpx.URL(str(request.url).replace(PLACEHOLDER, MASK))
            for name, value in request.headers.items():
                if PLACEHOLDER in value:
                    sent.headers[name] = value.replace(PLACEHOLDER, MASK)


def _filled(request: httpx.Request, value: str) -> httpx.Request:
    url = str(request.url)
    if PLACEHOLDER in url:
        url = url.replace(PLACEHOLDER, quote(value, safe=""))
    headers = [(k, v.replace(PLACEHOLDER, value)) for k, v in request.headers.multi_items()]
    content = request.content
    marker = PLACEHOLDER.encode()
    if marker in content:
        content = content.replace(marker, json.dumps(value)[1:-1].encode())
        headers = [(k, str(len(content)) if k.lower() == "content-length" else v) for k, v in headers]
    return httpx.Request(request.method, url, headers=headers, content=content, extensions=request.extensions)
