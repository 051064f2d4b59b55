"""The Helm chart on the real API server, with real Helm.

The session's cluster already runs Berth under its own names (the CRDs, the berth-*
ClusterRoles, the `berth` and `berth-evictions` webhook configurations). Every release
here is named so that its objects are not those (`chart-e2e-berth-*`) and lives in the
test's own namespace; its Deployments run no replicas, so no pod of it ever serves, and
its webhook configurations leave with the release. The mutating one only matches
namespaces labelled for a migration; the eviction one matches every namespace, and
while the release lasts an eviction's call to it fails and is ignored (failurePolicy
Ignore), as in any webhook outage.

The CRDs are the session's, applied from manifests/crds by `kubectl apply
--server-side`, as on a cluster installed with kustomize first. Helm 4 applies a chart's
CRDs server-side too, and the API server refuses a second manager of the same fields
(even with equal values): the install takes them over with `--force-conflicts`, which
changes only who manages them. Helm keeps CRDs on uninstall.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.chart import CHART, MANIFESTS, documents, helm_template
from devtools.helm import helm_binary
from tests.e2e.kube import Cluster

pytestmark = pytest.mark.e2e

RELEASE = "chart-e2e"
FULLNAME = "chart-e2e-berth"
# No pod of a test release runs: nothing here needs the image or a certificate. Nor does
# the uninstall hook's Job, which would never end (test_kubectl_migrate runs its command
# with its rights).
IDLE = [
    "controller.replicas=0",
    "webhook.replicas=0",
    "extender.replicas=0",
    "uninstall.abortMigrations=false",
]
# Kinds whose CRDs the local control plane lacks (cert-manager, Prometheus Operator).
ABSENT_KINDS = {"Certificate", "Issuer", "ServiceMonitor"}
CRDS = ("podmigrationjobs.scheduling.koordinator.sh", "reservations.scheduling.koordinator.sh")


class Helm:
    """Helm on the session's cluster, with its own config, cache and data directories."""

    def __init__(self, cluster: Cluster, home: Path) -> None:
        self.binary = helm_binary()
        self.kubeconfig = cluster.kubeconfig
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(command, capture_output=True, text=True, env=self.env)
        if check and result.returncode != 0:
            raise AssertionError(f"`helm {' '.join(args)}` failed:\n{result.stderr}")
        return result


def sets(values: list[str]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


@pytest.fixture
def helm(cluster: Cluster, tmp_path: Path) -> Helm:
    return Helm(cluster, tmp_path / "helm")


@pytest.fixture
def restricted(cluster: Cluster, namespace: str) -> str:
    """The test's namespace, enforcing the restricted Pod Security Standard as the chart's
    README has the installer label berth-system."""
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    return namespace


@pytest.fixture
def release(helm: Helm, cluster: Cluster, restricted: str) -> Iterator[str]:
    """The namespace of a release the test installs; uninstalled if the test did not."""
    yield restricted
    helm("uninstall", RELEASE, "--namespace", restricted, "--wait", check=False)
    for kind, name in [
        ("mutatingwebhookconfiguration", FULLNAME),
        ("validatingwebhookconfiguration", f"{FULLNAME}-evictions"),
    ]:
        assert not cluster.kubectl("get", kind, name, "--ignore-not-found", "-o", "name").stdout, (
            f"the release's {kind} outlived it"
        )


def name_of(obj: dict[str, Any]) -> str:
    """The name kubectl prints for an object with `-o name`: kind.group/name."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"].lower() + (f".{group}" if group else "")
    return f"{kind}/{obj['metadata']['name']}"


# --- helm template, accepted by the API server ------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="default"),
        pytest.param(
            [
                "scope=strict",
                "certManager.enabled=false",
                "tls.caBundle=Q0E=",
                "controller.replicas=2",
                "controller.podDisruptionBudget.enabled=true",
                "controller.config.maxMigratingPerNode=5",
                "controller.config.nodeFit=true",
                "controller.config.evictionInterception.allNamespaces=true",
                "controller.config.evictionInterception.requesters.groups[0]=system:nodes",
                "webhook.resources.limits.memory=512Mi",
                "image.tag=0.2.0",
                "image.pullPolicy=Always",
                "serviceMonitor.enabled=true",
                "webhook.clientCA.secretName=apiserver-ca",
                "extender.clientCA.secretName=scheduler-ca",
                "priorityClassName=system-cluster-critical",
                "nodeSelector.pool=infra",
                "tolerations[0].key=infra",
                "tolerations[0].operator=Exists",
                "networkPolicy.from.webhook[0].ipBlock.cidr=10.0.0.0/24",
                "networkPolicy.from.extender[0].namespaceSelector.matchLabels.team=sched",
                "uninstall.timeoutSeconds=600",
            ],
            id="non-default",
        ),
    ],
)
def test_the_server_accepts_the_rendered_chart(
    cluster: Cluster, helm: Helm, restricted: str, values: list[str]
) -> None:
    """`helm template`, then `kubectl apply --dry-run=server`: schemas, RBAC and Pod
    Security of every object, without persisting any."""
    objects = [
        obj
        for obj in helm_template(helm.binary, release=RELEASE, namespace=restricted, values=values)
        if obj["kind"] not in ABSENT_KINDS
    ]
    manifest = yaml.safe_dump_all(objects)

    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", "-o", "name", input=manifest)

    assert set(result.stdout.split()) == {name_of(obj) for obj in objects}
    # Pod Security admission only warns about a Deployment's template; a warning here
    # means the pods would be rejected once created.
    assert "PodSecurity" not in result.stderr, result.stderr


# --- install, upgrade, uninstall ---------------------------------------------------


def released(helm: Helm, namespace: str) -> list[dict[str, Any]]:
    """The objects of the release as Helm recorded them."""
    return documents(helm("get", "manifest", RELEASE, "--namespace", namespace).stdout)


def existing(cluster: Cluster, objects: list[dict[str, Any]], namespace: str) -> set[str]:
    names = [name_of(obj) for obj in objects]
    result = cluster.kubectl(
        "get", *names, "--namespace", namespace, "--ignore-not-found", "-o", "name"
    )
    return set(result.stdout.split())


def crd_uids(cluster: Cluster) -> dict[str, str]:
    return {name: cluster.get("crd", name)["metadata"]["uid"] for name in CRDS}


def scheduler_config(notes: str) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the notes print between two `---` lines."""
    _, block, _ = notes.split("\n---\n", 2)
    config: dict[str, Any] = yaml.safe_load(block)
    return config


def assert_notes_print(helm: Helm, release: str, reference: Path) -> None:
    """The notes print kube-scheduler's part of the configuration: that of the reference
    file in manifests/ but for the URL of the release's Service."""
    printed = scheduler_config(helm("get", "notes", RELEASE, "--namespace", release).stdout)
    expected = yaml.safe_load(reference.read_text())
    for entry in expected["extenders"]:
        entry["urlPrefix"] = f"https://{FULLNAME}-extender.{release}.svc:443"
    assert printed["profiles"] == expected["profiles"]
    assert printed["extenders"] == expected["extenders"]


def test_install_upgrade_and_uninstall(cluster: Cluster, helm: Helm, release: str) -> None:
    crds_before = crd_uids(cluster)
    values = [*IDLE, "certManager.enabled=false"]

    helm(
        "install", RELEASE, str(CHART), "--namespace", release, *sets(values),
        "--force-conflicts", "--wait",
    )  # fmt: skip

    objects = released(helm, release)
    assert existing(cluster, objects, release) == {name_of(obj) for obj in objects}
    hook = cluster.get("mutatingwebhookconfiguration", FULLNAME)
    assert hook["webhooks"][0]["clientConfig"]["service"] == {
        "name": f"{FULLNAME}-webhook",
        "namespace": release,
        "path": "/mutate-pod",
        "port": 443,
    }
    evictions = cluster.get("validatingwebhookconfiguration", f"{FULLNAME}-evictions")
    assert [entry["clientConfig"]["service"] for entry in evictions["webhooks"]] == [
        {"name": f"{FULLNAME}-webhook", "namespace": release, "path": path, "port": 443}
        for path in ("/validate-eviction", "/validate-eviction/unlabelled")
    ]
    # The notes print kube-scheduler's part: the same as manifests/scheduler but for the
    # release's Service.
    assert_notes_print(helm, release, MANIFESTS / "scheduler" / "kube-scheduler-config.yaml")

    # Changed values land: a new controller configuration, in a ConfigMap of a new name
    # the Deployment mounts, a PodDisruptionBudget the defaults leave out, and the strict
    # scope's webhook and scheduler configuration.
    helm(
        "upgrade", RELEASE, str(CHART), "--namespace", release, *sets(values),
        "--set", "controller.config.maxMigratingPerNode=7",
        "--set", "controller.podDisruptionBudget.enabled=true",
        "--set", "scope=strict",
        "--wait",
    )  # fmt: skip

    upgraded = released(helm, release)
    [config_map] = [o for o in upgraded if o["kind"] == "ConfigMap"]
    live = cluster.get("configmap", config_map["metadata"]["name"], "-n", release)
    assert yaml.safe_load(live["data"]["config.yaml"])["maxMigratingPerNode"] == 7
    controller = cluster.get("deployment", f"{FULLNAME}-controller", "-n", release)
    mounted = [
        v["configMap"]["name"]
        for v in controller["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    ]
    assert mounted == [config_map["metadata"]["name"]]
    assert (
        cluster.get("pdb", f"{FULLNAME}-controller", "-n", release)["spec"]["maxUnavailable"] == 1
    )
    selector = cluster.get("mutatingwebhookconfiguration", FULLNAME)["webhooks"][0][
        "namespaceSelector"
    ]
    assert selector == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", release],
            }
        ]
    }
    assert_notes_print(helm, release, MANIFESTS / "strict" / "kube-scheduler-config.yaml")
    # The ConfigMap of the first configuration went with the upgrade.
    assert existing(cluster, objects + upgraded, release) == {name_of(o) for o in upgraded}

    helm("uninstall", RELEASE, "--namespace", release, "--wait")

    assert existing(cluster, upgraded, release) == set()
    assert crd_uids(cluster) == crds_before, "the CRDs must outlive the release"
