"""``make bench``: run every benchmark and print one table of ratios."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .harness import table

# Each case's module is imported when it runs, not before: a case that measures its process's own
# memory (B10) must not carry the SDKs another case imports (B7's anthropic and google-genai).
CASES = {
    "b1": "b1_replay:run",
    "b1r": "b1_redis:run",
    "b1c": "b1_cluster:run",
    "b2": "b2_dispatch:run",
    "b3": "b3_rate_limits:run",
    "b3s": "b3_strict:run",
    "b4": "b4_latency:run",
    "b5": "b5_widget:run",
    "b6": "b6_shared:run",
    "b6r": "b6_same_rows:run",
    "b7": "b7_llm:run",
    "b8": "b8_cli:run",
    "b9": "b9_cluster:run",
    "b10": "b10_scale:run",
    "b11": "b11_estimate:run",
    "b11s": "b11_estimate:run_shared",
    "b12": "b12_pools:run",
    "b13": "b13_level:run",
    "b14": "b14_failing:run",
    "b15": "b15_failover:run",
}


def _case(name: str, quick: bool) -> Callable[..., Any]:
    module, _, function = CASES[name].partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(f"{__package__}.{module}"), function)
    if quick and name == "b10":  # --quick: sizes for the edit loop
        scale = importlib.import_module(f"{__package__}.b10_scale")
        return lambda **kw: found(rows=scale.QUICK, **kw)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "cases", nargs="*", metavar="CASE", help=f"which of {', '.join(CASES)} (default: all)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="repetitions per case (default: the case's own, 3; 1 for b3, b3s, b6, b6r, b7, b9, b10, b11, b11s, b12, b13, b14 and b15; 5 for b8); each repeat runs a case's baseline, then the case (b10: each in a fresh process, the medians compared)",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes where a case has them (b10)")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; cases are {', '.join(CASES)}")
    # Benchmarks make hundreds of throwaway stores: their marks (how many receipts each held) go
    # to a directory of their own, not the user's.
    os.environ.setdefault("PLAYBOOK_MARKS", tempfile.mkdtemp(prefix="playbook-bench-marks-"))
    results = []
    for name in args.cases or CASES:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        case = _case(name, args.quick)
        results.extend(case() if args.repeats is None else case(repeats=args.repeats))
        print(f"{name} took {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
