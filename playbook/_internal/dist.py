"""The name playbook is installed by, and the line an error message gives to install an extra.

The import name is ``playbook``, but the distribution is ``playbook-df``: ``playbook`` on the
Python Package Index is another project, so ``pip install "playbook[demo]"`` would install that
one.  ``pyproject.toml`` names the same distribution and declares the extras the hints name.
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "install_hint"]

DISTRIBUTION = "playbook-df"


def install_hint(extra: str) -> str:
    """The command that adds ``extra`` to this installation: ``pip install "playbook-df[redis]"``.

    Quoted, because zsh reads the brackets as a pattern.  pip keeps an installed playbook-df (a
    clone installed with ``pip install .``, or a wheel) and adds only what the extra needs.
    """
    return f'pip install "{DISTRIBUTION}[{extra}]"'
