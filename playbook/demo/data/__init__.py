"""Sample data shipped with the demo provider (see make_leads.py for how it is made)."""

from __future__ import annotations

import csv
import io
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported only when a DataFrame is asked for
    import pandas as pd

__all__ = ["LEAD_COLUMNS", "lead_rows", "leads"]

LEAD_COLUMNS = ("lead_id", "first", "last", "company", "website", "country")


@cache
def _leads_text() -> str:
    return resources.files(__name__).joinpath("leads.csv").read_text(encoding="utf-8")


def lead_rows() -> list[dict[str, str]]:
    """The sample leads as plain dicts of strings (no pandas needed)."""
    return list(csv.DictReader(io.StringIO(_leads_text())))


def leads() -> pd.DataFrame:
    """The ~300 sample leads as a fresh DataFrame.

    Columns: lead_id (int), first, last, company, website, country (ISO 3166 alpha-2).
    Deliberately messy: websites in mixed forms, 10 colleagues sharing a company's website,
    and 3 rows that are exact duplicates of another row.
    """
    import pandas as pd

    return pd.read_csv(io.StringIO(_leads_text()), dtype={"lead_id": "int64"}, keep_default_na=False)
