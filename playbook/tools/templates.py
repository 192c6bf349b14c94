"""An ``http_tool``'s templates: ``"{domain}"`` placeholders in its URL, query, body and headers,
found when the tool is made (a bad one named with its place) and filled for each call.

A URL's placeholders are filled by where they stand.  In its path and query, each value is
quoted as one segment (``"a/b"`` stays one name, never two).  In its *origin* (scheme, host and
port), a value chooses where the request goes: a template that starts with a placeholder
(``"{url}"``, ``"{base}/v1/x"``) takes a whole ``http(s)://`` address from it, one inside the host
(``"https://{region}.api.example.com/x"``) takes a host name; anything else is the row's error,
named with the input, before anything is sent.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

__all__ = ["BadTemplate", "BadValue", "UrlTemplate", "collect", "fill"]

_formatter = string.Formatter()


class BadTemplate(ValueError):
    """A template that cannot be filled: where it is and what is wrong."""


def collect(template: Any, out: list[str], where: str) -> None:
    """The placeholders of ``template`` (a string, or one nested in dicts and lists) into ``out``;
    ``BadTemplate`` naming ``where`` (``params['q']``) and the position of what is wrong."""
    if isinstance(template, str):
        try:
            parsed = list(_formatter.parse(template))
        except ValueError as exc:
            raise BadTemplate(
                f"{where} {template!r}: {exc} ({_position(template)}; a literal brace is written {{{{ or }}}})"
            ) from None
        for _, field, _, _ in parsed:
            if field is not None:
                if not field.isidentifier():
                    raise BadTemplate(
                        f"{where} {template!r}: placeholder {{{field}}} must be a plain name (an input of the tool)"
                    )
                if field not in out:
                    out.append(field)
    elif isinstance(template, Mapping):
        for k, v in template.items():
            collect(v, out, f"{where}[{k!r}]")
    elif isinstance(template, (list, tuple)):
        for i, v in enumerate(template):
            collect(v, out, f"{where}[{i}]")


def _position(template: str) -> str:
    """Where a template's braces go wrong: the ``{`` never closed, or the ``}`` never opened."""
    i, opened = 0, None
    while i < len(template):
        pair = template[i : i + 2]
        if opened is None and pair in ("{{", "}}"):
            i += 2
            continue
        if template[i] == "{" and opened is None:
            opened = i
        elif template[i] == "}":
            if opened is None:
                return f"the '}}' at position {i} closes nothing"
            opened = None
        i += 1
    return f"the '{{' at position {opened} is never closed" if opened is not None else "check its braces"


@functools.lru_cache(maxsize=4096)
def _whole(template: str) -> str | None:
    """The field name if the template is exactly one placeholder, like ``"{domain}"``."""
    parts = list(_formatter.parse(template))
    if len(parts) == 1 and parts[0][0] == "" and parts[0][1] is not None and not parts[0][2]:
        return parts[0][1]
    return None


def fill(template: Any, values: Mapping[str, Any]) -> Any:
    """``template`` with its placeholders filled; ``KeyError`` naming a field whose value is None
    where it stands within text (it has no text to be: "None" would be sent)."""
    if isinstance(template, str):
        field = _whole(template)
        # A lone placeholder keeps the value's type (numbers stay numbers in JSON bodies).
        return values[field] if field is not None else template.format_map(_Written(values))
    if isinstance(template, Mapping):
        return {k: fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, values) for v in template]
    return template


class _Written(dict[str, Any]):
    """Values as text takes them: a None is missing (``KeyError``), not the word "None"."""

    def __getitem__(self, field: str) -> Any:
        value = super().__getitem__(field)
        if value is None:
            raise KeyError(field)
        return value


class BadValue(ValueError):
    """A value that cannot stand where its placeholder is: ``field`` is the input at fault."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(why)
        self.field = field


_ADDRESS = re.compile(r"https?://[^/?#\s@]+([/?#][^\s]*)?", re.IGNORECASE)
_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/?#@]*@", re.IGNORECASE)
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")


class UrlTemplate:
    """A URL template, split where its origin ends: ``origin`` holds the placeholders that choose
    where the request goes (none for a fixed host), ``lead`` the one a template starts with, which
    takes a whole address."""

    __slots__ = ("text", "origin", "lead")

    def __init__(self, text: str) -> None:
        self.text = text
        if text.startswith("{") and not text.startswith("{{"):
            origin = text[: text.index("}") + 1]
        else:
            rest = text.partition("://")[2]
            origin = rest[: min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))]
        fields: list[str] = []
        collect(origin, fields, "url")
        self.origin = frozenset(fields)
        self.lead = _whole(origin) if text.startswith("{") else None

    def fill(self, values: Mapping[str, Any]) -> str:
        """The URL for these values (``KeyError`` for a placeholder whose value is None;
        :class:`BadValue` for a value that cannot stand in the origin)."""
        filled: dict[str, str] = {}
        for k, v in values.items():
            if v is not None and "{" + k in self.text:
                filled[k] = self._origin(k, v) if k in self.origin else quote(str(v), safe="")
        return self.text.format_map(filled)

    def _origin(self, field: str, value: Any) -> str:
        text = value if isinstance(value, str) else ""
        shown = _USERINFO.sub(r"\1***@", str(value))[:80]  # a password in a scraped address is not repeated
        if field == self.lead:
            if not _ADDRESS.fullmatch(text):
                raise BadValue(
                    field,
                    f"input {field!r} must be an http:// or https:// address with a host, no spaces and no user:password@, "
                    f"not {shown!r}",
                )
        elif not _HOST.fullmatch(text):
            raise BadValue(
                field, f"input {field!r} stands in the URL's host, so it must be a host name, not {shown!r}"
            )
        return text
