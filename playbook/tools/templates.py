"""An ``http_tool``'s templates: ``"{domain}"`` placeholders in its URL, query, body and headers,
found when the tool is made (a bad one named with its place) and filled for each call."""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

__all__ = ["BadTemplate", "collect", "fill", "fill_url"]

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
            raise BadTemplate(f"{where} {template!r}: {exc} ({_position(template)}; a literal brace is written {{{{ or }}}})") from None
        for _, field, _, _ in parsed:
            if field is not None:
                if not field.isidentifier():
                    raise BadTemplate(f"{where} {template!r}: placeholder {{{field}}} must be a plain name (an input of the tool)")
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
    if isinstance(template, str):
        field = _whole(template)
        # A lone placeholder keeps the value's type (numbers stay numbers in JSON bodies).
        return values[field] if field is not None else template.format_map(values)
    if isinstance(template, Mapping):
        return {k: fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, values) for v in template]
    return template


def fill_url(template: str, values: Mapping[str, Any]) -> str:
    """Fill URL placeholders, each value quoted as one path segment."""
    return template.format_map({k: quote(str(v), safe="") for k, v in values.items() if v is not None and "{" + k in template})
