"""Structured outputs: a pydantic model (or TypedDict) as the JSON schema an LLM must answer in,
and the answer read back as that model's fields.

The schema is sent in strict mode (OpenAI's ``response_format`` ``json_schema``): every object
closed (``additionalProperties: false``) and every property required, a field with a default
included (strict mode has no optional properties; a model's ``Optional`` field is nullable).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic

from playbook.plays.outputs import adapter, explain

__all__ = ["Structured", "strict_schema"]

_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")


class Structured:
    """An output model: its strict JSON schema, and answers validated into plain fields."""

    __slots__ = ("model", "name", "schema", "_adapter")

    def __init__(self, model: Any, owner: str) -> None:
        self._adapter = adapter(model, owner)
        self.model = model
        self.name = _SCHEMA_NAME.sub("_", model.__name__)[:64]
        self.schema = strict_schema(self._adapter.json_schema())

    def __repr__(self) -> str:
        return f"<Structured {self.model.__name__}>"

    def response_format(self) -> dict[str, Any]:
        return {
            "type": "json_schema",
            "json_schema": {"name": self.name, "schema": self.schema, "strict": True},
        }

    def parse(self, content: Any) -> tuple[dict[str, Any] | None, str | None]:
        """``(fields, None)`` for an answer that holds a valid object, else ``(None, why)``."""
        if not isinstance(content, str) or not content.strip():
            return None, "the answer is empty"
        try:
            data = json.loads(content)
        except ValueError as exc:
            return None, f"the answer is not valid JSON ({exc})"
        try:
            value = self._adapter.validate_python(data)
        except pydantic.ValidationError as exc:
            return None, "the answer does not match the schema: " + explain(exc, "the")
        if isinstance(value, pydantic.BaseModel):
            return value.model_dump(), None
        return dict(value), None


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` in strict mode: every object closed, every property required, no defaults."""
    return _strict(schema)  # type: ignore[no-any-return]


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "default":
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _strict(sub) for name, sub in value.items()}  # names, not keywords
        else:
            out[key] = _strict(value)
    if out.get("type") == "object" or "properties" in out:
        props = out.get("properties", {})
        out["required"] = list(props)
        out["additionalProperties"] = False
    if "$ref" in out and len(out) > 1:
        # A $ref beside other keywords (pydantic puts a description there) is not allowed in
        # strict mode: the reference alone says it all.
        out = {"$ref": out["$ref"]}
    return out
