"""``python -m playbook``: the command line (see :mod:`playbook.frontends.cli`)."""

from playbook.frontends.cli import main

if __name__ == "__main__":  # importing this module (a documentation tool does) runs nothing
    raise SystemExit(main())
