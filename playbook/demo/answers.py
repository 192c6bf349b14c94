"""What the demo's chat endpoint says, derived from the prompt alone: no model is involved.

- `classify` answers an industry label for a company named in the prompt (a sample company,
  a quoted name, or the text after the last colon); when the prompt or the caller offers
  labels, the answer is one of them;
- `summarise` answers a one-line summary built from the prompt's own words;
- `company` and `phrase` give the short strings a structured answer needs (a name field, any
  other text field).

Every answer is a function of its arguments, so the same prompt always gets the same reply.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import cache

from playbook.demo.fakedata import INDUSTRIES, digest, industry_for, known_companies

__all__ = ["classify", "company", "company_domain", "phrase", "summarise"]

_QUOTED = re.compile(r"[\"“]([^\"“”\n]{2,80})[\"”]")
_WORD = re.compile(r"[^\W_][\w'’-]*")
# a word list reads better as text
_STOPWORDS = frozenset(
    "about above after again against also among been before being below between both could does doing "  # noqa: SIM905
    "during each from further have having here into itself just more most other over please same should "
    "some such than that their them then there these they this those through under until very what when "
    "where which while with would your yours summarise summarize summary sentence following text page".split()
)
_PHRASE_SKIP = _STOPWORDS | {
    "classify",
    "industry",
    "return",
    "answer",
    "company",
    "json",
    "describe",
    "extract",
}
_SUMMARY_WORDS = 14
_NAME_WORDS = 6  # text after a colon longer than this is a passage, not a name


@cache
def _company_names() -> tuple[str, ...]:
    # Longest first, so "Acme Robotics Europe" would win over "Acme Robotics".
    names = {name for name, _ in known_companies().values()}
    return tuple(sorted(names, key=lambda n: (-len(n), n)))


@cache
def _domains() -> dict[str, str]:
    return {name: domain for domain, (name, _) in sorted(known_companies().items(), reverse=True)}


def _known_in(prompt: str) -> str | None:
    lowered = prompt.lower()
    return next((n for n in _company_names() if n.lower() in lowered), None)


def classify(prompt: str, offered: Sequence[str] | None = None) -> str:
    """An industry label for the prompt's subject; one of `offered` when given, else one of
    the labels the prompt itself offers, else any industry."""
    lowered = prompt.lower()
    subject = _known_in(prompt)
    if subject is None:
        quoted = _QUOTED.search(prompt)
        subject = quoted.group(1) if quoted else prompt.rsplit(":", 1)[-1] if ":" in prompt else None
    # Labels offered by the instruction, not ones that merely occur in the company's name.
    rest = lowered.replace(subject.lower(), " ") if subject else lowered
    if offered is None:
        offered = [label for label in INDUSTRIES if label.lower() in rest]
    label = industry_for(subject) if subject else None
    if label is None:
        # Look at the whole prompt, minus the offered labels themselves.
        stripped = rest
        for name in offered:
            stripped = stripped.replace(name.lower(), " ")
        label = industry_for(stripped)
    if offered and label is not None:
        # An offered label matches whatever its case ("robotics" for "Robotics").
        label = next((o for o in offered if o.lower() == label.lower()), None)
    if label is None:
        pool = offered or INDUSTRIES
        label = pool[digest("classify", subject or prompt) % len(pool)]
    return label


def summarise(prompt: str) -> str:
    """A one-line summary made of the prompt's words, with its key topics when it is long."""
    # An instruction like "Summarise this page: <text>" is about the text after the colon.
    head, _, tail = prompt.rpartition(":")
    body = tail if head and len(tail.split()) >= 3 else prompt
    words = _WORD.findall(body)
    if not words:
        return "Summary: nothing to summarise."
    sentence = " ".join(words[:_SUMMARY_WORDS])
    summary = f"Summary: {sentence[:1].upper()}{sentence[1:]}" + ("…" if len(words) > _SUMMARY_WORDS else ".")
    if len(words) <= _SUMMARY_WORDS // 2:
        return summary
    counts = Counter(w.lower() for w in words if len(w) >= 5 and w.lower() not in _STOPWORDS)
    topics = [w for w, _ in counts.most_common(3)]
    return summary + (f" Key topics: {', '.join(topics)}." if topics else "")


def company(prompt: str) -> str | None:
    """The company the prompt names: a sample company, a quoted name, or a short text after
    the last colon; None when it names none."""
    known = _known_in(prompt)
    if known is not None:
        return known
    quoted = _QUOTED.search(prompt)
    if quoted:
        return quoted.group(1).strip()
    _, colon, tail = prompt.rpartition(":")
    name = tail.strip().rstrip(".!?").strip()
    if colon and name and len(name.split()) <= _NAME_WORDS:
        return name
    return None


def company_domain(prompt: str) -> str:
    """The named company's domain: the sample lead's own, else one made from its name."""
    name = company(prompt)
    if name is None:
        return "example.com"
    known = _domains().get(name)
    if known is not None:
        return known
    stem = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"{stem or 'example'}.com"


def phrase(prompt: str, seed: str) -> str:
    """A short phrase of two to four of the prompt's words, picked by `seed`."""
    words = [w for w in _WORD.findall(prompt) if len(w) >= 4 and w.lower() not in _PHRASE_SKIP]
    if not words:
        words = _WORD.findall(seed.replace("_", " ")) or ["demo"]
    start = digest("phrase", seed, prompt)
    n = 2 + start % 3
    picked = [words[(start // 3 + i) % len(words)] for i in range(min(n, len(words)))]
    text = " ".join(picked)
    return text[:1].upper() + text[1:]
