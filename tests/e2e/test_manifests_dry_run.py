"""The API server accepts the deployable manifests as they are.

`kubectl apply --dry-run=server` runs every object through the real API
server's validation and admission (CRD schemas, RBAC, Pod Security) without
persisting anything. Both install paths of the README: the full overlay (the
session's cluster runs cert-manager, so its Issuer and Certificate kinds are served)
and without-cert-manager. tools/certcheck also checks the cert-manager objects offline.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.e2e.kube import Cluster

pytestmark = pytest.mark.e2e

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
NAMESPACE = "berth-system"


@pytest.fixture
def berth_namespace(cluster: Cluster) -> None:
    """berth-system, applied for real from the manifest.

    A dry run of the Namespace creates nothing, so the namespaced objects of the
    same dry run would find no namespace. Applying the manifest also puts its Pod
    Security label in force, so the dry run checks the Deployments' pod templates
    against the restricted profile. The namespace is left in place, as an install
    would leave it: Berth's own components may use it during the session.
    """
    cluster.kubectl("apply", "-f", str(MANIFESTS / "namespace" / "namespace.yaml"))


def rendered(cluster: Cluster, overlay: Path) -> list[dict[str, Any]]:
    built = cluster.kubectl("kustomize", str(overlay)).stdout
    return [doc for doc in yaml.safe_load_all(built) if doc]


def name_of(obj: dict[str, Any]) -> str:
    """The name kubectl prints for an object with `-o name`: kind.group/name."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"].lower() + (f".{group}" if group else "")
    return f"{kind}/{obj['metadata']['name']}"


@pytest.mark.usefixtures("berth_namespace")
def test_server_accepts_every_object_without_cert_manager(cluster: Cluster) -> None:
    overlay = MANIFESTS / "without-cert-manager"
    expected = {name_of(obj) for obj in rendered(cluster, overlay)}

    result = cluster.kubectl("apply", "--dry-run=server", "-k", str(overlay), "-o", "name")

    assert set(result.stdout.split()) == expected
    # Pod Security admission only warns about a Deployment's template; a warning
    # here means the pods would be rejected once created.
    assert "PodSecurity" not in result.stderr, result.stderr
    kinds = {name.split("/")[0].split(".")[0] for name in expected}
    assert {
        "namespace",
        "customresourcedefinition",
        "serviceaccount",
        "clusterrole",
        "clusterrolebinding",
        "role",
        "rolebinding",
        "configmap",
        "deployment",
        "service",
        "poddisruptionbudget",
        "mutatingwebhookconfiguration",
    } <= kinds


@pytest.mark.usefixtures("berth_namespace")
def test_server_accepts_every_object_with_cert_manager(cluster: Cluster) -> None:
    expected = {name_of(obj) for obj in rendered(cluster, MANIFESTS)}

    result = cluster.kubectl("apply", "--dry-run=server", "-k", str(MANIFESTS), "-o", "name")

    assert set(result.stdout.split()) == expected
    assert "PodSecurity" not in result.stderr, result.stderr
    assert {"issuer.cert-manager.io/berth-ca", "certificate.cert-manager.io/berth-tls"} <= expected


def test_the_readme_path_without_cert_manager(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """`berth certs`, the Secret made from its files and the webhook's caBundle set to its
    CA, as the README's install section says (the Secret in a test namespace: the
    session's berth-system holds cert-manager's)."""
    names = ["berth-webhook.berth-system.svc", "berth-extender.berth-system.svc"]
    certs = tmp_path / "certs"
    made = subprocess.run(
        [sys.executable, "-m", "cli.berth", "certs", f"--out={certs}"]
        + [f"--dns={name}" for name in names],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    secret = json.loads(
        cluster.kubectl(
            "create",
            "secret",
            "generic",
            "berth-tls",
            f"--namespace={namespace}",
            *(f"--from-file={certs / name}" for name in ("tls.crt", "tls.key", "ca.crt")),
            "--dry-run=server",
            "-o",
            "json",
        ).stdout
    )
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}  # what the pods mount
    served = x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes())
    san = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == names

    [webhooks] = [
        obj
        for obj in rendered(cluster, MANIFESTS / "without-cert-manager")
        if obj["kind"] == "MutatingWebhookConfiguration"
    ]
    assert "cert-manager.io/inject-ca-from" not in (webhooks["metadata"].get("annotations") or {})
    for hook in webhooks["webhooks"]:
        hook["clientConfig"]["caBundle"] = base64.b64encode(
            (certs / "ca.crt").read_bytes()
        ).decode()
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(webhooks))


def test_full_overlay_adds_only_the_cert_manager_objects(cluster: Cluster) -> None:
    full = {name_of(obj) for obj in rendered(cluster, MANIFESTS)}
    without = {name_of(obj) for obj in rendered(cluster, MANIFESTS / "without-cert-manager")}

    assert without < full
    assert {name.split("/")[0] for name in full - without} == {
        "issuer.cert-manager.io",
        "certificate.cert-manager.io",
    }


@pytest.mark.usefixtures("berth_namespace")
def test_the_strict_component_composes_with_an_install(cluster: Cluster, tmp_path: Path) -> None:
    """manifests/strict added to an install, as its comment says: the same objects, the
    webhook called in every namespace but the control plane's and Berth's."""
    install = MANIFESTS / "without-cert-manager"
    overlay = tmp_path / "strict-install"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes relative paths only.
                "resources": [os.path.relpath(install, overlay)],
                "components": [os.path.relpath(MANIFESTS / "strict", overlay)],
            }
        )
    )
    strict, default = rendered(cluster, overlay), rendered(cluster, install)
    assert {name_of(obj) for obj in strict} == {name_of(obj) for obj in default}
    [hook] = next(o for o in strict if o["kind"] == "MutatingWebhookConfiguration")["webhooks"]
    [default_hook] = next(o for o in default if o["kind"] == "MutatingWebhookConfiguration")[
        "webhooks"
    ]
    assert {**hook, "namespaceSelector": None} == {**default_hook, "namespaceSelector": None}
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", NAMESPACE],
            }
        ]
    }
    result = cluster.kubectl("apply", "--dry-run=server", "-k", str(overlay), "-o", "name")
    assert set(result.stdout.split()) == {name_of(obj) for obj in strict}
