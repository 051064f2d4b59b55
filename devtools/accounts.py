"""Berth's components run as their own ServiceAccounts, never as the cluster admin.

`up` applies the RBAC a real install applies (manifests/namespace, then manifests/rbac),
and every Berth process starts with a kubeconfig of its own that holds a token of its
ServiceAccount from the TokenRequest API, as a pod's projected token would. A right the
manifests lack then fails here as it would in a cluster (a 403 in the component's log),
and a right they grant beyond what the code uses fails tests/e2e/test_rbac.py.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable
from pathlib import Path

import yaml

from devtools import render
from devtools.binaries import REPO

NAMESPACE = "berth-system"
# A bound token outlives any test session and a day or two of a demo cluster left up; a
# component started again (a restart, a standby) gets a fresh one.
TOKEN_LIFETIME = "168h"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def account(component: str) -> str:
    """The ServiceAccount of `berth <component>`, as manifests/rbac names it."""
    return f"berth-{component}"


def install_rbac(kubectl: Kubectl) -> None:
    """Berth's namespace first (the ServiceAccounts and the lease Role live in it), then
    the ServiceAccounts, roles and bindings, from the YAML in the repository."""
    for part in ("namespace", "rbac"):
        kubectl("apply", "-k", str(REPO / "manifests" / part))


def write_kubeconfig(kubectl: Kubectl, *, admin: Path, component: str, path: Path) -> Path:
    """A kubeconfig at `path` for the same API server as the `admin` one, authenticated
    with a fresh token of the component's ServiceAccount."""
    return account_kubeconfig(
        kubectl, admin=admin, name=account(component), namespace=NAMESPACE, path=path
    )


def account_kubeconfig(
    kubectl: Kubectl, *, admin: Path, name: str, namespace: str, path: Path
) -> Path:
    """A kubeconfig at `path` for the same API server as the `admin` one, authenticated
    with a fresh token of ServiceAccount `namespace/name`."""
    token = kubectl(
        "create", "token", name, f"--namespace={namespace}", f"--duration={TOKEN_LIFETIME}"
    ).stdout.strip()
    [cluster] = yaml.safe_load(admin.read_text())["clusters"]
    config = render.token_kubeconfig(
        server=cluster["cluster"]["server"],
        ca_pem=base64.b64decode(cluster["cluster"]["certificate-authority-data"]),
        token=token,
        user_name=f"system:serviceaccount:{namespace}:{name}",
    )
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config))
    return path
