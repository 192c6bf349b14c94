"""OpenAI's rules for a strict ``json_schema`` response format, checked before answering.

Strict mode accepts a subset of JSON Schema: the root is an object; every object says
``additionalProperties: false`` and lists all of its properties in ``required`` (optional
fields are spelled as ``anyOf`` with ``{"type": "null"}``); composition other than ``anyOf``
is refused; nesting stops at 10 levels. A violation names where it is the way OpenAI's
message does, as a tuple of keys from the root: ``In context=('properties', 'address'), ...``.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["SchemaError", "check_format_name", "check_strict", "resolve"]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
_REFUSED = ("allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas")
_MAX_DEPTH = 10
_MAX_PROPERTIES = 5000

Path = tuple[str, ...]


class SchemaError(ValueError):
    """A response format the demo cannot answer; `path` leads from the schema's root to it."""

    def __init__(self, message: str, path: Path = ()) -> None:
        super().__init__(message)
        self.path = path

    def describe(self, name: str) -> str:
        return f"Invalid schema for response_format {name!r}: In context={self.path!r}, {self}"


def check_format_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"Invalid 'response_format.json_schema.name': {name!r}. Expected a string of 1 to 64 letters, digits, '_' or '-'."
        )
    return name


def resolve(root: dict[str, Any], ref: Any, path: Path) -> dict[str, Any]:
    """The subschema a local ``$ref`` ("#", "#/$defs/Name", ...) points at."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaError(f"only local references like '#/$defs/Name' are supported; got {ref!r}.", path)
    node: Any = root
    for part in ref[1:].lstrip("/").split("/") if ref != "#" else ():
        key = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or key not in node:
            raise SchemaError(f"reference {ref!r} can not be resolved.", path)
        node = node[key]
    if not isinstance(node, dict):
        raise SchemaError(f"reference {ref!r} does not point at a schema.", path)
    return node


def check_strict(schema: Any) -> None:
    """Raise `SchemaError` where `schema` breaks strict mode's rules."""
    if not isinstance(schema, dict):
        raise SchemaError("schema must be a JSON Schema object.")
    if schema.get("type") != "object" or "anyOf" in schema:
        got = schema.get("type", "anyOf" if "anyOf" in schema else None)
        raise SchemaError(f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{got}\"'.")
    counted = [0]
    _check(schema, schema, (), 0, counted)


def _check(root: dict[str, Any], node: Any, path: Path, depth: int, counted: list[int]) -> None:
    if not isinstance(node, dict):
        raise SchemaError(f"schema must be an object; got {type(node).__name__}.", path)
    if depth > _MAX_DEPTH:
        raise SchemaError(f"the schema nests deeper than {_MAX_DEPTH} levels.", path)
    for keyword in _REFUSED:
        if keyword in node:
            raise SchemaError(f"'{keyword}' is not permitted.", path)
    if "$ref" in node:
        resolve(root, node["$ref"], path)
    _check_type(node, path)
    for group in ("$defs", "definitions"):
        for name, sub in _mapping(node, group, path).items():
            _check(root, sub, (*path, group, name), depth, counted)
    if node.get("type") == "object" or "properties" in node:
        _check_object(root, node, path, depth, counted)
    items = node.get("items")
    if items is not None:
        _check(root, items, (*path, "items"), depth + 1, counted)
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if branches is None:
            continue
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"'{key}' must be a non-empty array of schemas.", path)
        for i, branch in enumerate(branches):
            _check(root, branch, (*path, key, str(i)), depth, counted)


def _check_type(node: dict[str, Any], path: Path) -> None:
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for one in kinds:
        if one not in _TYPES:
            raise SchemaError(f"type {one!r} is not supported; use one of {', '.join(sorted(_TYPES))}.", path)
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise SchemaError("'enum' must be a non-empty array.", path)


def _check_object(
    root: dict[str, Any], node: dict[str, Any], path: Path, depth: int, counted: list[int]
) -> None:
    if node.get("additionalProperties", True) is not False:
        raise SchemaError("'additionalProperties' is required to be supplied and to be false.", path)
    properties = _mapping(node, "properties", path)
    required = node.get("required", [])
    if not isinstance(required, list) or any(key not in required for key in properties):
        missing = [key for key in properties if not isinstance(required, list) or key not in required]
        raise SchemaError(
            f"'required' is required to be supplied and to be an array including every key in properties. Missing {missing[0]!r}.",
            path,
        )
    extra = [key for key in required if key not in properties]
    if extra:
        raise SchemaError(f"'required' names {extra[0]!r}, which is not in properties.", path)
    counted[0] += len(properties)
    if counted[0] > _MAX_PROPERTIES:
        raise SchemaError(f"the schema has more than {_MAX_PROPERTIES} properties.", path)
    for key, sub in properties.items():
        _check(root, sub, (*path, "properties", key), depth + 1, counted)


def _mapping(node: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = node.get(key, {})
    if not isinstance(value, dict):
        raise SchemaError(f"'{key}' must be an object.", path)
    return value
