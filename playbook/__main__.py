"""``python -m playbook``: the command line (see :mod:`playbook.cli`)."""

from playbook.cli import main

raise SystemExit(main())
