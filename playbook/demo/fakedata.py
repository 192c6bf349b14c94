"""Deterministic fake answers: the same question always gets the same answer.

Everything is derived from a stable hash of the input (blake2b, not `hash()`, which is
salted per process), so answers agree across processes, runs and machines. Domains from
the sample leads answer with the lead's real company name and country, which makes the
demo read naturally; any other domain gets a plausible profile made up from its hash.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from functools import cache, lru_cache
from typing import Any

__all__ = [
    "INDUSTRIES",
    "company_profile",
    "digest",
    "domain_error",
    "email_answer",
    "industry_for",
    "known_companies",
    "normalize_domain",
    "unit",
]

# Sector word (matched as a substring of the lower-cased name or domain) -> industry.
# Longer words are tried first, so "networks" wins over "works".
_SECTOR_WORDS = {
    "Software": ("software", "cloud", "labs", "systems", "networks", "apps", "tech"),
    "Data & Analytics": ("analytics", "data", "insights", "metrics"),
    "Robotics": ("robotics", "automation", "robots"),
    "Biotech": ("biologics", "bio", "genomics", "therapeutics", "pharma"),
    "Healthcare": ("health", "clinic", "medical", "care"),
    "Energy": ("energy", "solar", "power", "wind"),
    "Financial Services": ("capital", "payments", "insurance", "finance", "bank", "ventures"),
    "Media & Entertainment": ("media", "studios", "games", "records", "pictures"),
    "Retail": ("retail", "outfitters", "apparel", "goods", "market"),
    "Logistics": ("logistics", "freight", "shipping", "cargo", "transport"),
    "Manufacturing": ("motors", "foundry", "textiles", "industries", "steel", "works"),
    "Food & Beverage": ("foods", "brewing", "coffee", "farms", "bakery", "kitchen"),
    "Real Estate": ("realty", "properties", "estates", "homes"),
    "Professional Services": ("consulting", "partners", "legal", "advisors"),
    "Education": ("learning", "academy", "education", "school"),
    "Travel & Hospitality": ("travel", "hotels", "tours"),
    "Cybersecurity": ("security", "cyber"),
    "Aerospace": ("aerospace", "aviation", "orbital", "rocket"),
}
INDUSTRIES = tuple(_SECTOR_WORDS)
_KEYWORDS = sorted(
    ((word, label) for label, words in _SECTOR_WORDS.items() for word in words),
    key=lambda pair: -len(pair[0]),
)
_COUNTRIES = ("US", "US", "US", "GB", "DE", "FR", "NL", "CA", "AU", "SE", "ES", "IN")
_COUNTRY_TLDS = {
    "uk": "GB",
    "de": "DE",
    "fr": "FR",
    "nl": "NL",
    "se": "SE",
    "es": "ES",
    "it": "IT",
    "au": "AU",
    "ca": "CA",
    "in": "IN",
}
_SUFFIXES = {"US": " Inc.", "GB": " Ltd", "DE": " GmbH", "FR": " SAS", "NL": " B.V.", "SE": " AB"}
_SECOND_LEVEL = {"co", "com", "org", "net", "ac", "gov"}  # as in acme.co.uk, acme.com.au
# Address patterns; a domain uses one of them for everyone, as real companies do.
_PATTERNS = ("{first}.{last}", "{first}", "{f}{last}", "{first}{l}", "{first}_{last}", "{f}.{last}")
_DOMAIN_RE = re.compile(r"^(?=.{4,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")


def digest(*parts: str) -> int:
    """A stable 64-bit hash of the parts."""
    data = "\x1f".join(parts).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def unit(value: int) -> float:
    """Map a 64-bit hash to a float in [0, 1)."""
    return (value >> 11) / 9007199254740992.0  # 2**53


def normalize_domain(domain: str) -> str:
    """Lower-case, trimmed, without a leading www. and trailing dot."""
    domain = domain.strip().lower().rstrip(".")
    return domain[4:] if domain.startswith("www.") else domain


def domain_error(domain: str) -> str | None:
    """Why `domain` (normalised) is not a bare domain, or None when it is fine."""
    if _DOMAIN_RE.match(domain):
        return None
    if "/" in domain or ":" in domain:
        return "parameter 'domain' must be a bare domain like acme.com, not a URL"
    return "parameter 'domain' must be a domain like acme.com"


def industry_for(text: str) -> str | None:
    """The industry whose sector word appears in `text`, or None."""
    lowered = text.lower()
    for word, label in _KEYWORDS:
        if word in lowered:
            return label
    return None


@cache
def known_companies() -> dict[str, tuple[str, str]]:
    """Domain -> (company, country) for the sample leads."""
    from playbook.demo.data import lead_rows

    table: dict[str, tuple[str, str]] = {}
    for row in lead_rows():
        host = re.sub(r"^[a-z]+://", "", row["website"].strip().lower()).split("/", 1)[0]
        table.setdefault(normalize_domain(host), (row["company"], row["country"]))
    return table


def _stem(domain: str) -> str:
    labels = domain.split(".")
    if len(labels) >= 3 and labels[-2] in _SECOND_LEVEL:
        labels = labels[:-2]
    elif len(labels) >= 2:
        labels = labels[:-1]
    return labels[-1]


def _name_from_stem(stem: str) -> str:
    words = [w for w in re.split(r"[-_]+", stem) if w]
    if len(words) == 1:  # split "bluefinanalytics" into "bluefin analytics" when we can
        for word, _ in _KEYWORDS:
            if stem.endswith(word) and len(stem) > len(word) + 1:
                words = [stem[: -len(word)], word]
                break
    return " ".join(w[:1].upper() + w[1:] for w in words) or stem


@lru_cache(maxsize=8192)
def company_profile(domain: str) -> dict[str, Any]:
    """The company profile for a normalised domain (cached; callers must not mutate it)."""
    h = digest("company", domain)
    known = known_companies().get(domain)
    if known is not None:
        name, country = known
    else:
        country = _COUNTRY_TLDS.get(domain.rsplit(".", 1)[-1]) or _COUNTRIES[h % len(_COUNTRIES)]
        name = _name_from_stem(_stem(domain)) + _SUFFIXES.get(country, "")
    industry = industry_for(name) or industry_for(domain) or INDUSTRIES[(h >> 8) % len(INDUSTRIES)]
    # Log-uniform headcount between ~5 and ~50,000, rounded to two significant digits.
    raw = 10 ** (0.7 + 3.9 * unit(digest("employees", domain)))
    magnitude = 10 ** max(0, len(str(int(raw))) - 2)
    employees = max(2, int(round(raw / magnitude) * magnitude))
    founded = 1950 + (h >> 16) % 74
    return {
        "domain": domain,
        "name": name,
        "industry": industry,
        "employees": employees,
        "country": country,
        "founded": founded,
    }


def _ascii_letters(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed.lower() if "a" <= ch <= "z")


@lru_cache(maxsize=65536)
def _email_parts(domain: str, first: str, last: str) -> tuple[float, dict[str, Any] | None]:
    # The miss draw hashes only domain + first, so adding a last name never flips a miss.
    miss_draw = unit(digest("miss", domain, first.strip().lower()))
    f, l_ = _ascii_letters(first), _ascii_letters(last)
    if not f:
        return miss_draw, None
    pattern = _PATTERNS[digest("pattern", domain) % len(_PATTERNS)]
    if not l_ and ("{last}" in pattern or "{l}" in pattern):
        pattern = "{first}"
    local = pattern.format(first=f, last=l_, f=f[0], l=l_[:1])
    confidence = 0.55 + 0.44 * unit(digest("confidence", domain, f, l_))
    if not l_:
        confidence *= 0.8  # a guess without a last name is weaker
    answer = {"email": f"{local}@{domain}", "confidence": round(confidence, 2), "source": "demo"}
    return miss_draw, answer


def email_answer(domain: str, first: str, last: str, miss_rate: float) -> dict[str, Any] | None:
    """The email found for a person at a normalised domain, or None for a miss."""
    miss_draw, answer = _email_parts(domain, first, last)
    if answer is None or miss_draw < miss_rate:
        return None
    return answer
