"""``estimate=True``: show the pilot's estimate where the user looks, and ask before the run goes on.

A notebook cell that runs ``map()`` keeps its kernel busy, so a button's click would only reach
it after the cell ends; ``input()`` is the question a busy cell can ask (Jupyter shows a box
under the cell), as a terminal does.  A process with no one to ask (a scheduled job, a notebook
run headless) is refused, saying what to do instead: it must not pay on its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from playbook.errors import PlayDefinitionError
from playbook.runtime.estimate.projection import after_pilot

if TYPE_CHECKING:
    from playbook.runtime.estimate.projection import Estimate

__all__ = ["go_on"]


def go_on(estimate: Estimate, options: Mapping[str, Any]) -> dict[str, Any] | None:
    """Show ``estimate`` and ask whether the run of ``options`` goes on: the run's options after
    its pilot (what is left of ``max_cost``), or ``None`` for no.  Nothing left: yes, unasked."""
    show(estimate)
    if estimate.rows_left and not ask(estimate, options.get("max_cost")):
        return None
    return after_pilot(dict(options), estimate)


def show(estimate: Estimate) -> None:
    """The estimate as a table in a notebook (Jupyter's or marimo's), else as text on stderr."""
    from playbook.ui.widget import in_kernel, in_marimo

    if in_kernel():
        from IPython.display import display

        shown: Callable[..., Any] = display  # IPython's display is untyped
        shown(estimate)
    elif in_marimo():
        import marimo

        marimo.output.append(estimate)
    else:
        print(estimate.text(), file=sys.stderr, flush=True)


def ask(estimate: Estimate, max_cost: float | None) -> bool:
    """Ask whether the run should go on for the rows left; True for yes."""
    short = estimate.below(max_cost)
    question = (f"{short}\n" if short else "") + f"run the {estimate.rows_left:,} rows left? [y/N] "
    try:
        answer = _asked(question)
    except (
        EOFError,
        OSError,
        RuntimeError,
        NotImplementedError,
    ):  # no stdin (closed: RuntimeError); IPython's StdinNotImplementedError
        raise PlayDefinitionError(
            "estimate=True asks before the run goes on, and nobody can be asked here (no input); its pilot's calls are saved. "
            "Look at df.play.estimate(play) first, then run without estimate=True (on the command line: --estimate --yes)"
        ) from None
    return answer.strip().lower() in ("y", "yes")


def _asked(question: str) -> str:
    """The answer to ``question``: in a notebook, the box under the cell; in a terminal, the
    question goes to stderr, beside the estimate (stdout may be a file)."""
    from playbook.ui.widget import in_kernel

    if in_kernel():
        return input(question)
    print(question, end="", file=sys.stderr, flush=True)
    return input()
