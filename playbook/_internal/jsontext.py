"""JSON text as playbook writes and reads it: compact, safe to write as UTF-8, and fast for the
small records a run writes and reads by the million (:mod:`playbook.tagged` gives them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["dumps", "loads"]


def _encoder(*, ascii: bool, sort_keys: bool) -> Callable[[Any], str]:
    """A compact JSON encoder.  json's C encoder, made once: ``JSONEncoder.encode`` makes a new
    one on every call, which costs more than encoding a small record (three per replayed row)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator in this Python
        return json.JSONEncoder(
            ensure_ascii=ascii, sort_keys=sort_keys, separators=(",", ":"), allow_nan=False
        ).encode
    quote = json.encoder.encode_basestring_ascii if ascii else json.encoder.encode_basestring
    encoder = make(None, None, quote, None, ":", ",", sort_keys, False, False)

    def encode(value: Any) -> str:
        if type(value) is str:
            return quote(value)
        return "".join(encoder(value, 0))

    return encode


_wide = _encoder(ascii=False, sort_keys=False)
_ascii = _encoder(ascii=True, sort_keys=False)
_sorted_wide = _encoder(ascii=False, sort_keys=True)
_sorted_ascii = _encoder(ascii=True, sort_keys=True)


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """JSON text of an encoded value, safe to write as UTF-8.

    A string holding a lone surrogate (``"caf\\udce9"``, from bytes decoded with
    ``surrogateescape``) cannot be written as UTF-8; such a document is written with ``\\u``
    escapes instead, which JSON reads back as the very same string.
    """
    text = (_sorted_wide if sort_keys else _wide)(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = (_sorted_ascii if sort_keys else _ascii)(value)
    return text


def loads(data: str | bytes) -> Any:
    """Parse JSON text (or UTF-8 bytes); ``ValueError`` for anything that is not valid JSON.  Text
    as playbook writes it goes straight to json's C scanner (a quarter of ``json.loads``'s cost);
    anything else (white space around it, damage) is parsed, or refused, by ``json.loads``."""
    if type(data) is str:
        try:
            value, end = _scan(data, 0)
        except StopIteration:  # no value where it starts: json.loads says what is wrong
            return json.loads(data)
        if end == len(data):
            return value
    return json.loads(data)


_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set by its constructor, not declared
