"""The local control plane behaves like a real cluster where Berth depends on it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from berth.protocol import is_ready
from devtools import render
from devtools.render import Scope
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import deployment

pytestmark = pytest.mark.e2e

BERTH = [sys.executable, "-m", "cli.berth"]


def ready_pods(cluster: Cluster, namespace: str, selector: str, count: int) -> list[dict[str, Any]]:
    found = [
        pod
        for pod in pods(cluster, namespace, selector)
        if is_ready(pod) and not pod["metadata"].get("deletionTimestamp")
    ]
    return found if len(found) == count else []


def test_up_prints_the_line_to_paste_and_refuses_a_second_up(cluster: Cluster) -> None:
    assert f"export KUBECONFIG={cluster.kubeconfig} PATH=" in cluster.up_output
    again = subprocess.run(
        [sys.executable, "-m", "cli.berth", "dev", "up", f"--state-dir={cluster.local.state_dir}"],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 1
    assert "already runs" in again.stderr


def test_up_configures_scheduler_and_webhook_for_its_scope(cluster: Cluster, scope: Scope) -> None:
    assert f"scope: {scope}" in cluster.up_output
    status = subprocess.run(
        [*BERTH, "dev", "status", f"--state-dir={cluster.local.state_dir}"],
        capture_output=True,
        text=True,
    )
    assert f"scope: {scope}" in status.stdout
    config = yaml.safe_load((cluster.local.state_dir / "kube-scheduler.yaml").read_text())
    extenders = config["extenders"]
    assert extenders == render.berth_extenders(
        url=extenders[0]["urlPrefix"], ca_bundle=extenders[0]["tlsConfig"]["caData"], scope=scope
    )
    ignored = render.ignored_resources(scope)
    assert config["profiles"][0].get("pluginConfig", []) == (
        [{"name": "NodeResourcesFit", "args": {"ignoredResources": ignored}}] if ignored else []
    )
    for hook in cluster.get("mutatingwebhookconfiguration", "berth")["webhooks"]:
        assert hook["namespaceSelector"] == render.namespace_selector(
            skip_namespaces=["kube-system", "berth-system"], scope=scope
        )


def test_fake_nodes_are_ready(cluster: Cluster) -> None:
    nodes = cluster.get("nodes")["items"]
    assert sorted(node["metadata"]["name"] for node in nodes) == ["node-0", "node-1", "node-2"]
    for node in nodes:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready
        assert ready[0]["status"] == "True"
        assert node["status"]["allocatable"]["cpu"] == "8"


def test_deployment_pods_are_scheduled_and_ready(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("web", replicas=3, cpu="100m"), namespace)
    running = cluster.wait(
        lambda: ready_pods(cluster, namespace, "app=web", 3), what="3 ready pods of web"
    )
    node_names = {node["metadata"]["name"] for node in cluster.get("nodes")["items"]}
    for pod in running:
        assert pod["spec"]["nodeName"] in node_names
        assert pod["spec"]["schedulerName"] == "default-scheduler"


def test_koord_scheduler_pods_are_scheduled_by_the_same_kube_scheduler(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(
        deployment("koord", cpu="100m", spec_extra={"schedulerName": "koord-scheduler"}),
        namespace,
    )
    [pod] = cluster.wait(
        lambda: ready_pods(cluster, namespace, "app=koord", 1), what="the koord-scheduler pod"
    )
    selector = f"involvedObject.name={pod['metadata']['name']},reason=Scheduled"
    [event] = cluster.wait(
        lambda: cluster.get("events", "-n", namespace, "--field-selector", selector)["items"],
        what="the Scheduled event",
    )
    # kube-scheduler records events as the profile that scheduled the pod.
    assert event["reportingComponent"] == "koord-scheduler"


def test_deleted_pod_is_replaced_and_disappears(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("web", replicas=3, cpu="100m"), namespace)
    before = cluster.wait(
        lambda: ready_pods(cluster, namespace, "app=web", 3), what="3 ready pods of web"
    )
    victim = before[0]["metadata"]["name"]
    cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")

    def replaced() -> list[dict[str, Any]]:
        current = ready_pods(cluster, namespace, "app=web", 3)
        names = {pod["metadata"]["name"] for pod in current}
        return current if current and victim not in names else []

    after = cluster.wait(replaced, what="a replacement pod for the deleted one")
    gone = cluster.kubectl("get", "pod", victim, "-n", namespace, check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr
    kept = {pod["metadata"]["uid"] for pod in after} & {pod["metadata"]["uid"] for pod in before}
    assert len(kept) == 2


def test_kwok_deletes_a_terminating_pod_and_never_its_same_name_successor(
    cluster: Cluster, namespace: str
) -> None:
    """kwok finishes a terminating pod by deleting it by name; a stale second delete
    (as kwok makes from two queued events) must not remove a new pod of that name, as a
    StatefulSet creates at once. The test ground's policy refuses it."""
    cluster.apply(deployment("solo", replicas=1, cpu="100m"), namespace)
    [running] = cluster.wait(
        lambda: ready_pods(cluster, namespace, "app=solo", 1), what="a ready pod of solo"
    )
    name = running["metadata"]["name"]
    binaries = cluster.local.binaries
    assert binaries is not None
    as_kwok = [str(binaries.kubectl), f"--kubeconfig={cluster.local.kwok_kubeconfig}"]
    stale = subprocess.run(
        [*as_kwok, "delete", "pod", name, "-n", namespace, "--grace-period=0", "--force"],
        capture_output=True,
        text=True,
    )
    assert stale.returncode != 0
    assert "kwok deletes only a terminating pod" in stale.stderr
    assert (
        cluster.get("pod", name, "-n", namespace)["metadata"]["uid"] == running["metadata"]["uid"]
    )

    cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
    cluster.wait(
        lambda: cluster.kubectl("get", "pod", name, "-n", namespace, check=False).returncode,
        what=f"kwok to finish the terminating pod {name}",
    )


async def test_pdb_blocks_eviction_with_429(
    cluster: Cluster, namespace: str, api: client.ApiClient
) -> None:
    await cluster.aapply(deployment("db", replicas=2, cpu="100m"), namespace)
    await cluster.aapply(
        json.dumps(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "db"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}},
            }
        ),
        namespace,
    )
    running = await cluster.await_(
        lambda: ready_pods(cluster, namespace, "app=db", 2), what="2 ready pods of db"
    )

    def budget_exhausted() -> bool:
        status: dict[str, Any] = cluster.get("pdb", "db", "-n", namespace).get("status", {})
        return status.get("currentHealthy") == 2 and status.get("disruptionsAllowed") == 0

    await cluster.await_(budget_exhausted, what="the PDB to report disruptionsAllowed 0")
    name = running[0]["metadata"]["name"]
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
    with pytest.raises(ApiException) as refused:
        await client.CoreV1Api(api).create_namespaced_pod_eviction(name, namespace, eviction)
    assert refused.value.status == 429
    assert "disruption budget" in str(refused.value.body)
    still = await cluster.aget("pod", name, "-n", namespace)
    assert not still["metadata"].get("deletionTimestamp")


def test_scheduling_gate_holds_pod_until_removed(cluster: Cluster, namespace: str) -> None:
    def pod(name: str, gates: list[str]) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "schedulingGates": [{"name": gate} for gate in gates],
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
                },
            }
        )

    cluster.apply(pod("gated", ["berth.sh/test"]), namespace)
    cluster.apply(pod("free", []), namespace)
    # The scheduler has had its chance once the ungated twin, created after it, is bound.
    cluster.wait(
        lambda: cluster.get("pod", "free", "-n", namespace)["spec"].get("nodeName"),
        what="the ungated pod to be scheduled",
    )
    gated = cluster.get("pod", "gated", "-n", namespace)
    assert "nodeName" not in gated["spec"]
    assert gated["status"]["phase"] == "Pending"
    scheduled = [c for c in gated["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled[0]["reason"] == "SchedulingGated"

    cluster.kubectl(
        "patch",
        "pod",
        "gated",
        "-n",
        namespace,
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/spec/schedulingGates"}]',
    )
    cluster.wait(
        lambda: is_ready(cluster.get("pod", "gated", "-n", namespace)),
        what="the ungated pod to run",
    )


def test_crd_installs_and_serves_objects(cluster: Cluster, namespace: str) -> None:
    group = f"t{uuid.uuid4().hex[:6]}.test.berth.sh"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer"}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    cluster.apply(json.dumps(crd))
    try:
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s"
        )
        cluster.apply(
            json.dumps(
                {
                    "apiVersion": f"{group}/v1",
                    "kind": "Widget",
                    "metadata": {"name": "w"},
                    "spec": {"size": 3},
                }
            ),
            namespace,
        )
        assert cluster.get(f"widgets.{group}", "w", "-n", namespace)["spec"] == {"size": 3}
        wrong = cluster.kubectl(
            "apply",
            "-n",
            namespace,
            "-f",
            "-",
            check=False,
            input=json.dumps(
                {
                    "apiVersion": f"{group}/v1",
                    "kind": "Widget",
                    "metadata": {"name": "bad"},
                    "spec": {"size": "three"},
                }
            ),
        )
        assert wrong.returncode != 0
        assert "spec.size" in wrong.stderr
    finally:
        cluster.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)
