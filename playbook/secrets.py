"""Secrets: credentials read from the environment at call time, never stored, logged or shown.

A request is rendered with a stand-in where the secret goes (:data:`PLACEHOLDER`, which receipt
keys and error messages see); :class:`SecretAuth` puts the real value in at the last moment,
inside the HTTP client's send, and takes it out of the request again once the answer is in.  So
no frame of playbook's, no receipt, no error and no object a finished run keeps (a response, an
exception's request) holds the plain value.

The value goes only into the places the tool's definition names (a header by its name; the URL,
query or body rendered again from their templates), by code that knows those places: nothing
searches a request for the stand-in to swap it.  A row value that spells the stand-in,
``{secret}`` or a key's prefix is sent as it is, wherever the row puts it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
import os
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, quote_plus

import httpx

from playbook.errors import PlayDefinitionError, RunFatal

__all__ = [
    "PLACEHOLDER",
    "Fill",
    "Secret",
    "SecretAuth",
    "bearer",
    "forget_revealed",
    "mask",
    "rebuilt",
    "scrub",
    "secret",
    "sending_to_workers",
]

# What stands where a secret goes while a request is rendered.  Receipt keys are made of it, so it
# never changes (a receipt made under it must stay found); errors show it as {secret}.  Letters
# only, so URL quoting leaves it as it is.  It is never replaced by the value (see above).
PLACEHOLDER = "PBSECRETxq7zkv3w"
MASK = "***"
# A part of a key counts from this many characters on: an answer that echoes that much of a key
# (a model repeating part of its prompt's headers, a provider quoting a key back) is stored and
# shown masked.  Shorter runs match ordinary text too often to say anything about a key.
PART = 8

# ``fill(request, value)``: the request with the secret's value in the places its tool names.
Fill = Callable[[httpx.Request, str], httpx.Request]


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
        time), never its value.  A default is a value: it travels only to a cluster's workers
        (inside :func:`sending_to_workers`), when this process does not set the variable (the
        default is then the key in use) and nothing on the way is plain text over a network;
        otherwise a secret with a default is not pickled."""
        if self._default is None:
            return (Secret, (self.env_var,))
        hops = _sending.get()
        if hops is None:
            raise TypeError(
                f"secret({self.env_var!r}) has a default value, which would travel as plain text: set {self.env_var} "
                "in the environment of every process that runs the play (a cluster's workers too) and drop default="
            )
        if (os.environ.get(self.env_var) or "").strip():
            return (
                Secret,
                (self.env_var,),
            )  # set here: each worker reads its own, and the default stays here
        if hops:
            raise TypeError(
                f"secret({self.env_var!r}) is not set here, so its default value is the key, and it would be sent to the "
                f"workers as plain text ({hops}): set {self.env_var} in the environment of this process and of every "
                "worker (then only its name is sent), or reach the cluster over TLS"
            )
        return (Secret, (self.env_var, self._default))


# While a cluster job's play is pickled: "" when what is pickled reaches the workers only inside
# this machine or encrypted, else why not; None when nothing is being sent to workers.
_sending: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "playbook_sending_to_workers", default=None
)


@contextlib.contextmanager
def sending_to_workers(plain: str | None) -> Iterator[None]:
    """Pickle a play for a cluster's workers: a secret's default may go with it (see
    :meth:`Secret.__reduce__`) unless ``plain`` says how it would cross a network in plain text."""
    token = _sending.set(plain or "")
    try:
        yield
    finally:
        _sending.reset(token)


def secret(env_var: str, default: str | None = None) -> Secret:
    """A secret read from ``env_var`` (or ``default``) each time a call needs it."""
    return Secret(env_var, default)


# -- masking ---------------------------------------------------------------------------------------


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


class _Parts:
    """Finds the runs of :data:`PART` or more characters of some secret in a text, in any case
    (a model may echo a key lower-cased).

    A key's public prefix (``sk-proj-``, ``sk-ant-api03-``: its start up to the last ``-`` or
    ``_`` among its first 16 characters) is the same in every key of its kind, and ordinary text
    names it: a run must hold :data:`PART` characters of what follows it.  Any such run holds one
    of the key's chunks of ``PART // 2`` characters that start at a multiple of ``PART // 2``:
    those few are looked for first (``in``, at C speed), so a text that holds none (nearly every
    answer) costs no scan.
    """

    __slots__ = ("grams", "chunks")

    def __init__(self, values: Sequence[str]) -> None:
        half = PART // 2
        bodies = [body for body in (_private(v).lower() for v in values) if len(body) >= PART]
        self.grams = frozenset(b[i : i + PART] for b in bodies for i in range(len(b) - PART + 1))
        self.chunks = tuple({b[i : i + half] for b in bodies for i in range(0, len(b) - half + 1, half)})

    def mask(self, text: str) -> str:
        low = text.lower()
        if len(low) != len(text):  # a few letters change length when lowered: match as written
            low = text
        if not any(chunk in low for chunk in self.chunks):
            return text
        grams, pieces, i, done = self.grams, [], 0, 0
        while i + PART <= len(low):
            if low[i : i + PART] not in grams:
                i += 1
                continue
            end = i + PART  # the run goes on while each next window is a part of a key too
            while end < len(low) and low[end - PART + 1 : end + 1] in grams:
                end += 1
            pieces += [text[done:i], MASK]
            i = done = end
        return "".join(pieces) + text[done:] if pieces else text


def _private(value: str) -> str:
    """A key without its public prefix (see :class:`_Parts`)."""
    cut = max(value.rfind("-", 0, 16), value.rfind("_", 0, 16))
    return value[cut + 1 :]


def _mask_with(text: str, forms: Sequence[str], parts: _Parts | None) -> str:
    for form in forms:
        if form in text:
            text = text.replace(form, MASK)
    return parts.mask(text) if parts is not None else text


def mask(text: str) -> str:
    """``text`` with every secret revealed in this process masked: each in every spelling, and
    any run of :data:`PART` or more of its characters (a part of a key that an answer echoes)."""
    forms = _redactor.forms
    return _mask_with(text, forms, _redactor.parts) if forms else text


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
        self.parts: _Parts | None = None

    def forget(self) -> None:
        self._values.clear()
        self.forms, self.parts = (), None

    def remember(self, value: str) -> None:
        if value not in self._values:
            self._values.add(value)
            self.forms = tuple(sorted({f for v in self._values for f in _forms(v)}, key=len, reverse=True))
            self.parts = _Parts(sorted(self._values))

    def filter(self, record: logging.LogRecord) -> bool:
        if self.forms:
            text = record.getMessage()
            masked = _mask_with(text, self.forms, self.parts)
            if masked != text:
                record.msg, record.args = masked, ()
        return True


_redactor = _Redactor()


def forget_revealed() -> None:
    """Forget every secret revealed so far in this process (tests start from none)."""
    _redactor.forget()


# A logger's filter sees only records logged on that very logger, not its children's: name each.
for _name in (
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
    "aiohttp.client",
    "aiohttp.internal",
    "playbook",
):
    logging.getLogger(_name).addFilter(_redactor)


# -- putting the value in ---------------------------------------------------------------------------


class SecretAuth(httpx.Auth):
    """Sends a request rendered with :data:`PLACEHOLDER` as ``fill`` makes it with the secret's
    value, inside the client's send; the request is shown with its stand-ins again afterwards."""

    def __init__(self, secret: Secret, fill: Fill) -> None:
        self._secret = secret
        self._fill = fill

    def __repr__(self) -> str:
        return f"<SecretAuth {self._secret!r}>"

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        await request.aread()  # a multipart upload streams: its body is read here to be sent again
        sent = self._fill(request, self._secret.reveal())
        try:
            yield sent
        finally:
            # The request lives on in the response and in any error: leave no secret in it.
            sent.url, sent.headers = request.url, request.headers.copy()


def rebuilt(request: httpx.Request, *, headers: Mapping[str, str]) -> httpx.Request:
    """``request`` with these headers set: its URL and body as they were."""
    merged = request.headers.copy()
    merged.update(headers)
    return httpx.Request(
        request.method, request.url, headers=merged, content=request.content, extensions=request.extensions
    )


def bearer(request: httpx.Request, value: str) -> httpx.Request:
    """A :data:`Fill` for a key sent as ``Authorization: Bearer <key>`` and nowhere else."""
    return rebuilt(request, headers={"Authorization": f"Bearer {value}"})
