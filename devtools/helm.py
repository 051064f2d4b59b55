"""Helm, built from its official Go module in tools/helm, for the chart's tests.

tools/helm holds no Go code of its own: its go.mod names Helm's command as a `tool`,
which pins Helm and every dependency it builds with, and the upstream `cmd/helm`
package is built as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

from devtools.binaries import TOOLS, BuildError, tool_binary

HELM_PACKAGE = "helm.sh/helm/v4/cmd/helm"


def helm_version() -> str:
    """The Helm release tools/helm builds, read from its go.mod."""
    match = re.search(
        r"^\s*helm\.sh/helm/v4 (v\S+)", (TOOLS / "helm" / "go.mod").read_text(), flags=re.M
    )
    if match is None:
        raise BuildError("tools/helm/go.mod does not require helm.sh/helm/v4")
    return match.group(1)


def helm_binary() -> Path:
    """Build (once) and return Helm, stamped with its release as Helm's own build does."""
    return tool_binary(
        "helm",
        package=HELM_PACKAGE,
        ldflags=f"-X helm.sh/helm/v4/internal/version.version={helm_version()}",
    )
