"""An SDK's exceptions, translated where they enter: a Python tool that wraps an SDK (openai,
anthropic, httpx, requests...) raises that SDK's errors, and the provider's governor understands
``ToolError``.  What a tool raises becomes::

    an error that carries an HTTP answer     ToolError(status, retry_after from its headers),
      (an int .status_code on it or on its     retryable for 408, 425, 429 and 5xx;
       .response; headers there)               401, 402, 403: RunFatal (the run stops)
    a dropped connection or a timeout         ToolError(retryable=True), no status
    a type the tool lists in retry_on=        ToolError(retryable=True)
    anything else                             None: the tool's own error, as raised

The message names the tool and keeps the original type and text; the caller chains the
translation ``from`` the original, so its traceback is one ``__cause__`` away.

No SDK is imported here: an error is recognised by the attributes it carries, or by its type
among the modules the process has already imported (a tool that raised one imported it).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from playbook.errors import PlaybookError, RunFatal, ToolError
from playbook.providers.limits import retry_after
from playbook.secrets import mask

__all__ = ["translate"]

_FATAL = {
    401: "the credentials were refused",
    402: "payment required (no credit left)",
    403: "the credentials were refused",
}
# Transient by nature: the same call may well go through on the next try.
_TRANSIENT = (
    ("httpx", "TimeoutException"),
    ("httpx", "NetworkError"),
    ("httpx", "RemoteProtocolError"),
    ("httpx", "ProxyError"),
    ("openai", "APIConnectionError"),
    ("anthropic", "APIConnectionError"),  # their timeouts are subclasses
    ("requests", "ConnectionError"),
    ("requests", "Timeout"),
)
# Subclasses of the above that no retry mends: a certificate the client rejects.
_NOT_TRANSIENT = (("requests", "exceptions.SSLError"),)


def translate(
    exc: Exception, *, tool: str, provider: str | None = None, retry_on: tuple[type[Exception], ...] = ()
) -> PlaybookError | None:
    """The playbook error ``exc`` stands for (see the module docstring), or None to let it be."""
    listed = isinstance(exc, retry_on)
    status, headers = _answer(exc)
    transient = status is None and _is(exc, _TRANSIENT) and not _is(exc, _NOT_TRANSIENT)
    if status is None and not transient and not listed:
        return None
    message = mask(f"tool {tool!r}: {_type_name(exc)}: {exc}".rstrip())
    if status in _FATAL:
        return RunFatal(
            f"{message} (HTTP {status}: {_FATAL[status]})", tool=tool, provider=provider, status=status
        )
    retryable = listed or transient or (status is not None and _retryable(status))
    hint = retry_after(headers, now=time.time()) if retryable and headers else None
    return ToolError(
        message, tool=tool, provider=provider, status=status, retryable=retryable, retry_after=hint
    )


def _retryable(status: int) -> bool:
    return status in (408, 425, 429) or 500 <= status <= 599


def _answer(exc: Exception) -> tuple[int | None, dict[str, str]]:
    """The HTTP status an error carries (4xx/5xx only) and its headers, lower-cased."""
    response = _attr(exc, "response")
    for holder in (exc, response):
        status = _attr(holder, "status_code")
        if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
            headers = _attr(holder, "headers") or _attr(response, "headers")
            return status, _lowered(headers)
    return None, {}


def _lowered(headers: Any) -> dict[str, str]:
    # Case-insensitive mappings (httpx, requests) and plain dicts alike: retry_after() asks in lower case.
    if not callable(getattr(headers, "items", None)):
        return {}
    try:
        return {str(k).lower(): str(v) for k, v in headers.items()}
    except Exception:  # headers we cannot read give no hint, never a new error
        return {}


def _attr(obj: Any, name: str) -> Any:
    # Some SDKs' attributes are properties that raise when unset (httpx's .request): no hint then.
    if obj is None:
        return None
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _is(exc: Exception, names: tuple[tuple[str, str], ...]) -> bool:
    """True if ``exc`` is one of these ``(module, attribute path)`` types, among modules already imported."""
    for module_name, path in names:
        found: Any = sys.modules.get(module_name)
        for part in path.split("."):
            found = getattr(found, part, None)
        if isinstance(found, type) and isinstance(exc, found):
            return True
    return False


def _type_name(exc: Exception) -> str:
    """``openai.RateLimitError``, not ``openai._exceptions.RateLimitError``: the name users import."""
    cls = type(exc)
    module = cls.__module__
    if module in ("builtins", "__main__"):
        return cls.__qualname__
    top = module.partition(".")[0]
    if getattr(sys.modules.get(top), cls.__name__, None) is cls:
        return f"{top}.{cls.__qualname__}"
    return f"{module}.{cls.__qualname__}"
