"""How Berth's commands end on a configuration they cannot use: a kubeconfig that is
missing or unreadable, or a configuration file with a problem. One line on stderr naming
the file and the problem, and exit code 2, for every command (`berth`, its `controller`,
`webhook`, `extender` and `migrate`, `python -m webhook`, `python -m extender`,
`kubectl-migrate`); never a traceback."""

from __future__ import annotations

import sys

from berth.kube.client import KubeconfigError
from berth.settings import ConfigError

BAD_CONFIG = 2
"""The exit code for a configuration the command cannot use."""

CONFIG_ERRORS = (ConfigError, KubeconfigError)

TIMED_OUT = 3
"""The exit code of a wait (`kubectl migrate ... --wait --timeout`) that reached its
deadline first: what it waited for goes on."""


def bad_config(command: str, error: Exception) -> int:
    """Say what is wrong on one line (a file's several problems joined by `; `)."""
    problems = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
    print(f"{command}: {problems}", file=sys.stderr)
    return BAD_CONFIG
