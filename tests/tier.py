"""What the tier running the tests asks of them: ``make check`` sets ``PLAYBOOK_TIER=check``.

A property test there tries a fifth of its examples (at least 20): enough to catch a value that
breaks the property in the edit loop, while ``make test`` tries them all.
"""

from __future__ import annotations

import os

CHECK = os.environ.get("PLAYBOOK_TIER") == "check"


def examples(full: int) -> int:
    """How many examples a property test tries: ``full`` in ``make test``, a fifth in ``make check``."""
    return max(20, full // 5) if CHECK else full
