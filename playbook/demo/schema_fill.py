"""A JSON value that validates against a JSON schema, made up from the prompt.

What fills a field depends on its type and its name, read as words ("company_name",
"shortDescription"), the last word first ("industry_description" is a description):

- industry, category, label, sector, ... → `answers.classify`, one of the field's `enum` when
  it has one (the way a prompt offering labels gets one of them);
- summary, description, abstract, ... → `answers.summarise`;
- name, company, organisation, ... → the company the prompt names;
- domain, website, url, email, country → the named company's;
- any other string → a short phrase of the prompt's words; a ``format`` (date, uuid, email,
  ...) gets a value of that format; an ``enum`` or ``const`` one of its values;
- integers and numbers → drawn from a digest of the prompt and the field's path, within
  ``minimum``/``maximum`` (exclusive too) and ``multipleOf``;
- arrays get 1 to 3 items (within ``minItems``/``maxItems``), objects all their properties.

``$ref`` (local), ``anyOf`` (a nullable field gets its value, not null), ``allOf`` and type
lists are followed. Below a few levels of nesting, arrays take their fewest items and
nullable fields null, so recursive schemas (a tree of nodes) stay finite.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from playbook.demo.answers import classify, company, company_domain, phrase, summarise
from playbook.demo.fakedata import digest, known_companies, unit
from playbook.demo.schema_check import Path, SchemaError, resolve

__all__ = ["fill"]

# A field's topic by the words of its name.
_TOPICS = {
    "label": (
        "industry",
        "industries",
        "category",
        "categories",
        "label",
        "labels",
        "sector",
        "sectors",
        "classification",
        "segment",
        "vertical",
    ),
    "summary": ("summary", "description", "abstract", "overview", "synopsis", "tldr"),
    "name": ("name", "company", "organisation", "organization", "business", "firm", "employer", "brand"),
    "domain": ("domain", "website", "url", "homepage", "site"),
    "email": ("email", "mail"),
    "country": ("country",),
    "year": ("year", "founded"),
    "share": ("confidence", "probability", "score", "certainty"),
}
_TOPIC_OF = {word: topic for topic, words in _TOPICS.items() for word in words}
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_SHALLOW = 3  # deeper than this, arrays take their fewest items and nullable fields null
_DEEPEST = 40  # a schema with no finite instance (a required field of its own type) stops here
_EPOCH = datetime(2020, 1, 1, tzinfo=UTC)


def fill(schema: dict[str, Any], prompt: str) -> Any:
    """A value valid against `schema`, the same for the same schema and prompt."""
    return _Filler(schema, prompt).value(schema, "", (), 0)


class _Filler:
    def __init__(self, root: dict[str, Any], prompt: str) -> None:
        self.root = root
        self.prompt = prompt

    @cached_property
    def summary(self) -> str:
        return summarise(self.prompt)

    @cached_property
    def company(self) -> str:
        return company(self.prompt) or phrase(self.prompt, "company")

    @cached_property
    def domain(self) -> str:
        return company_domain(self.prompt)

    def draw(self, path: Path, salt: str = "") -> int:
        return digest("fill", self.prompt, "/".join(path), salt)

    def value(self, node: dict[str, Any], name: str, path: Path, depth: int) -> Any:
        if depth > _DEEPEST:
            raise SchemaError(
                "the schema has no finite instance (a required field nests its own type).", path
            )
        if "$ref" in node:
            merged = {
                **resolve(self.root, node["$ref"], path),
                **{k: v for k, v in node.items() if k != "$ref"},
            }
            return self.value(merged, name, path, depth + 1)
        if "allOf" in node:
            merged = {k: v for k, v in node.items() if k != "allOf"}
            for part in node["allOf"]:
                merged.update(part)
            return self.value(merged, name, path, depth)
        if "const" in node:
            return node["const"]
        branches = node.get("anyOf") or node.get("oneOf")
        kind = node.get("type")
        if branches is None and isinstance(kind, list):
            branches = [{**node, "type": one} for one in kind]
        if branches is not None:
            return self.value(self.branch(branches, path, depth), name, path, depth)
        if "enum" in node:
            return self.choose(node["enum"], name, path)
        if kind is None:
            kind = "object" if "properties" in node else "array" if "items" in node else "string"
        return self.typed(kind, node, name, path, depth)

    def branch(self, branches: list[dict[str, Any]], path: Path, depth: int) -> dict[str, Any]:
        nulls = [b for b in branches if b.get("type") == "null"]
        others = [b for b in branches if b.get("type") != "null"]
        if not others or (nulls and depth > _SHALLOW):
            return nulls[0]
        return others[self.draw(path, "branch") % len(others)]

    def typed(self, kind: str, node: dict[str, Any], name: str, path: Path, depth: int) -> Any:
        if kind == "object":
            properties = node.get("properties", {})
            return {key: self.value(sub, key, (*path, key), depth + 1) for key, sub in properties.items()}
        if kind == "array":
            return self.array(node, name, path, depth)
        if kind == "string":
            return self.string(node, name, path)
        if kind == "integer":
            return _integer(node, _topic(name), self.draw(path))
        if kind == "number":
            return _number(node, _topic(name), self.draw(path))
        if kind == "boolean":
            return bool(self.draw(path) & 1)
        return None

    def array(self, node: dict[str, Any], name: str, path: Path, depth: int) -> list[Any]:
        low = node.get("minItems", 0)
        high = node.get("maxItems", max(low, 3))
        count = low if depth > _SHALLOW else min(max(1 + self.draw(path, "items") % 3, low), high)
        items = node.get("items", {})
        if isinstance(items, dict) and "enum" in items and node.get("uniqueItems"):
            offset = self.draw(path, "offset")
            pool = items["enum"]
            return [pool[(offset + i) % len(pool)] for i in range(min(count, len(pool)))]
        values = [self.value(items, name, (*path, str(i)), depth + 1) for i in range(count)]
        if node.get("uniqueItems"):
            values = [v for i, v in enumerate(values) if v not in values[:i]]
        return values

    def choose(self, options: list[Any], name: str, path: Path) -> Any:
        labels = [o for o in options if isinstance(o, str)]
        if labels and _topic(name) == "label":
            return classify(self.prompt, labels)
        return options[self.draw(path, "enum") % len(options)]

    def string(self, node: dict[str, Any], name: str, path: Path) -> str:
        text = _formatted(node.get("format"), self.draw(path), self)
        if text is None:
            text = self.by_topic(_topic(name), name, path)
        low, high = node.get("minLength", 0), node.get("maxLength")
        if len(text) < low:
            text = (text + " " + "x" * low)[:low] if text else "x" * low
        return text if high is None else text[:high]

    def by_topic(self, topic: str | None, name: str, path: Path) -> str:
        if topic == "label":
            return classify(self.prompt)
        if topic == "summary":
            return self.summary
        if topic == "name":
            return self.company
        if topic == "domain":
            return (
                f"https://{self.domain}/"
                if name.lower().endswith(("url", "website", "homepage"))
                else self.domain
            )
        if topic == "email":
            return f"contact@{self.domain}"
        if topic == "country":
            return known_companies().get(self.domain, ("", "US"))[1]
        return phrase(self.prompt, "/".join(path) or name)


def _topic(name: str) -> str | None:
    """What a field is about, from its name's words, the last word first."""
    for word in reversed(_WORDS.findall(name)):
        topic = _TOPIC_OF.get(word.lower())
        if topic is not None:
            return topic
    return None


def _formatted(fmt: Any, draw: int, filler: _Filler) -> str | None:
    moment = _EPOCH + timedelta(seconds=draw % (5 * 365 * 86400))
    if fmt == "date-time":
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    if fmt == "date":
        return moment.strftime("%Y-%m-%d")
    if fmt == "time":
        return moment.strftime("%H:%M:%SZ")
    if fmt == "duration":
        return f"P{1 + draw % 30}D"
    if fmt == "email":
        return f"contact@{filler.domain}"
    if fmt in ("uri", "url", "iri"):
        return f"https://{filler.domain}/"
    if fmt == "hostname":
        return filler.domain
    if fmt == "uuid":
        return str(uuid.UUID(int=(draw << 64) | digest("uuid", str(draw)), version=4))
    if fmt == "ipv4":
        return f"10.{draw % 256}.{(draw >> 8) % 256}.{(draw >> 16) % 254 + 1}"
    if fmt == "ipv6":
        return f"fd00::{draw % 65536:x}"
    return None


def _bounds(node: dict[str, Any], topic: str | None, integer: bool) -> tuple[float, float]:
    step = 1 if integer else 1e-6
    low = _bound(node, "minimum", "exclusiveMinimum", step)
    high = _bound(node, "maximum", "exclusiveMaximum", -step)
    if low is None and high is None:
        return (
            (1950, 2024) if topic == "year" else (0.0, 1.0) if topic == "share" and not integer else (0, 100)
        )
    if low is None:
        assert high is not None
        return high - 100, high
    return (low, low + 100) if high is None else (low, high)


def _bound(node: dict[str, Any], inclusive: str, exclusive: str, step: float) -> float | None:
    """The tightest bound of the two keywords, an exclusive one moved `step` inwards."""
    value: float | None = node.get(inclusive)
    other = node.get(exclusive)
    if isinstance(other, bool):  # draft 4: a flag on the inclusive bound
        return None if value is None else value + step if other else value
    if other is None:
        return value
    moved = float(other) + step
    if value is None:
        return moved
    return max(value, moved) if step > 0 else min(value, moved)


def _integer(node: dict[str, Any], topic: str | None, draw: int) -> int:
    low, high = _bounds(node, topic, integer=True)
    first, last = int(-(-low // 1)), int(high // 1)
    step = node.get("multipleOf", 1)
    if isinstance(step, int) and step > 1:
        first, last = -(-first // step), last // step
        return (first + draw % max(1, last - first + 1)) * step
    return first + draw % max(1, last - first + 1)


def _number(node: dict[str, Any], topic: str | None, draw: int) -> float:
    low, high = _bounds(node, topic, integer=False)
    step = node.get("multipleOf")
    if step:
        first, last = -(-low // step), high // step
        return float((first + draw % max(1, int(last - first) + 1)) * step)
    value = round(low + (high - low) * unit(draw), 2)
    return value if low <= value <= high else (low + high) / 2
