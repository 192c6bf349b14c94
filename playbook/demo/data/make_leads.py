"""Regenerate leads.csv, the demo's sample leads: `python -m playbook.demo.data.make_leads`.

Seeded and re-runnable: the same seed always writes the same file. All names are random
combinations of common given names, surnames and invented company words; none of them
describes a real person. The file is deliberately a little messy, like real CRM exports:

- websites come in mixed forms (with/without www, http/https, trailing paths, some capitals);
- 10 rows are colleagues: a new person at a company that already appears (same website);
- 3 rows are exact duplicates of another row (same lead_id too), as if imported twice.
"""

from __future__ import annotations

import csv
import random
import sys
import unicodedata
from pathlib import Path

SEED = 20240501
UNIQUE_COMPANIES = 287
COLLEAGUES = 10
DUPLICATES = 3
FIRST_ID = 1001

FIRST_NAMES = (
    "Aisha",
    "Alex",
    "Amara",
    "Anna",
    "Arjun",
    "Ben",
    "Camille",
    "Carlos",
    "Chen",
    "Chloe",
    "Daniel",
    "Dara",
    "David",
    "Elena",
    "Emma",
    "Farah",
    "Felix",
    "Grace",
    "Hana",
    "Hugo",
    "Ines",
    "Isaac",
    "Jonas",
    "José",
    "Julia",
    "Kai",
    "Karin",
    "Laura",
    "Leo",
    "Lina",
    "Lucas",
    "Maya",
    "Mei",
    "Mia",
    "Nadia",
    "Nina",
    "Noah",
    "Olivia",
    "Omar",
    "Oscar",
    "Priya",
    "Rafael",
    "Rosa",
    "Sam",
    "Sara",
    "Sofia",
    "Søren",
    "Tariq",
    "Theo",
    "Tom",
    "Uma",
    "Victor",
    "Wen",
    "Yara",
    "Yusuf",
    "Zoë",
    "Ethan",
    "Freya",
    "Ivan",
    "Lea",
)
LAST_NAMES = (
    "Abbott",
    "Alvarez",
    "Andersen",
    "Bauer",
    "Becker",
    "Bianchi",
    "Brooks",
    "Carter",
    "Chen",
    "Costa",
    "Dubois",
    "Ellis",
    "Fischer",
    "Garcia",
    "Greene",
    "Hansen",
    "Hart",
    "Ito",
    "Jansen",
    "Kaur",
    "Keller",
    "Khan",
    "Kowalski",
    "Larsen",
    "Lopez",
    "Martin",
    "Meyer",
    "Moreau",
    "Müller",
    "Nakamura",
    "Novak",
    "O'Neil",
    "Okafor",
    "Park",
    "Patel",
    "Petrov",
    "Quinn",
    "Reyes",
    "Rossi",
    "Schmidt",
    "Silva",
    "Singh",
    "Sato",
    "Tanaka",
    "Torres",
    "Vogel",
    "Walsh",
    "Weber",
    "Wright",
    "Zhang",
)
# Invented company words: a first half and a second half glued together ("Ironbridge").
HEADS = (
    "Blue",
    "North",
    "Iron",
    "Copper",
    "Silver",
    "Bright",
    "Stone",
    "Cedar",
    "Amber",
    "Granite",
    "Harbor",
    "Maple",
    "Oak",
    "Pine",
    "River",
    "Summit",
    "Sun",
    "Tide",
    "Wolf",
    "Falcon",
    "Lumen",
    "Nova",
    "Orbit",
    "Pixel",
    "Quill",
    "Vertex",
    "Zephyr",
    "Kestrel",
    "Juniper",
    "Cobalt",
)
TAILS = (
    "field",
    "stone",
    "wave",
    "leaf",
    "line",
    "gate",
    "bridge",
    "peak",
    "brook",
    "light",
    "forge",
    "path",
    "crest",
    "wood",
    "point",
)
# Sector words; the demo's company and chat endpoints map them back to industries.
SECTORS = (
    "Robotics",
    "Analytics",
    "Labs",
    "Software",
    "Systems",
    "Foods",
    "Logistics",
    "Health",
    "Biologics",
    "Energy",
    "Solar",
    "Capital",
    "Partners",
    "Media",
    "Studios",
    "Retail",
    "Outfitters",
    "Motors",
    "Aerospace",
    "Foundry",
    "Textiles",
    "Pharma",
    "Security",
    "Networks",
    "Cloud",
    "Consulting",
    "Legal",
    "Realty",
    "Farms",
    "Brewing",
    "Coffee",
    "Apparel",
    "Travel",
    "Learning",
    "Games",
    "Insurance",
    "Payments",
)
COUNTRIES = (  # ISO 3166 alpha-2, weighted towards the US
    ("US", 40),
    ("GB", 12),
    ("DE", 10),
    ("FR", 7),
    ("NL", 5),
    ("CA", 6),
    ("AU", 5),
    ("SE", 4),
    ("ES", 4),
    ("IT", 3),
    ("IN", 4),
)
TLDS = {"GB": ".co.uk", "DE": ".de", "FR": ".fr", "NL": ".nl", "SE": ".se", "ES": ".es", "IT": ".it"}
PATHS = ("", "", "", "/", "/", "/about", "/en", "/contact", "/about-us", "/en/home", "/index.html")


def _slug(text: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "".join(ch for ch in ascii_text.lower() if ch.isalnum() or ch == " ").strip()


def _domain(rng: random.Random, company: str, country: str, taken: set[str]) -> str:
    words = _slug(company).split()
    tld = TLDS.get(country) or rng.choice((".com", ".com", ".com", ".com", ".io", ".co", ".ai", ".net"))
    preferred = "-".join(words) if rng.random() < 0.5 else "".join(words)
    for stem in (preferred, "".join(words), "-".join(words), "".join(words) + "hq"):
        if stem + tld not in taken:
            taken.add(stem + tld)
            return stem + tld
    raise RuntimeError(f"no free domain for {company}")  # pragma: no cover - heads are unique


def _website(rng: random.Random, domain: str) -> str:
    scheme = "https://" if rng.random() < 0.75 else "http://"
    www = "www." if rng.random() < 0.55 else ""
    if rng.random() < 0.03:  # CRMs keep whatever case the person typed
        domain = domain[:1].upper() + domain[1:]
    if rng.random() < 0.01:
        scheme = scheme.upper()
    host = www + domain
    return scheme + host + rng.choice(PATHS)


def make_rows(seed: int = SEED) -> list[dict[str, object]]:
    """The sample leads as a list of dicts, in file order."""
    rng = random.Random(seed)
    countries = [c for c, _ in COUNTRIES]
    weights = [w for _, w in COUNTRIES]
    heads = [h + t for h in HEADS for t in TAILS if h[-1] != t[0]]  # no "Quillleaf"
    rng.shuffle(heads)
    taken: set[str] = set()
    people: set[tuple[str, str]] = set()

    def person() -> tuple[str, str]:
        while True:
            name = (rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES))
            if name not in people:
                people.add(name)
                return name

    companies = []
    for head in ["Acme"] + heads[: UNIQUE_COMPANIES - 1]:
        sector = "Robotics" if head == "Acme" else rng.choice(SECTORS)
        company = f"{head} {sector}"
        country = "US" if head == "Acme" else rng.choices(countries, weights)[0]
        domain = _domain(rng, company, country, taken)
        website = "https://www.acme-robotics.com/about" if head == "Acme" else _website(rng, domain)
        companies.append((company, website, country))

    records = []
    for company, website, country in companies:
        first, last = person()
        records.append([first, last, company, website, country])
    for company, website, country in rng.sample(companies[1:], COLLEAGUES):
        first, last = person()
        records.append([first, last, company, website, country])
    rng.shuffle(records)
    rows: list[dict[str, object]] = [
        dict(zip(("lead_id", "first", "last", "company", "website", "country"), [FIRST_ID + i, *rec]))
        for i, rec in enumerate(records)
    ]
    for original in sorted(rng.sample(range(len(rows)), DUPLICATES), reverse=True):
        at = rng.randint(original + 1, len(rows))
        rows.insert(at, dict(rows[original]))
    return rows


def main(path: Path | None = None) -> Path:
    path = path or Path(__file__).with_name("leads.csv")
    rows = make_rows()
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


if __name__ == "__main__":
    written = main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(f"wrote {written}")
