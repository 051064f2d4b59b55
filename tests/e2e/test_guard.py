"""Nobody gets more from Berth than their own RBAC gives them: a phase written through
the status subresource, a privileged reservation template and a job for a pod in a
namespace the webhook does not see all get nothing."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import deployment, job_manifest, job_of, phase_is, ready_pods

pytestmark = pytest.mark.e2e

QUIET = 8.0
"""How long a job that must get nothing is watched for doing something anyway."""


def still_there(cluster: Cluster, namespace: str, app: str, uid: str) -> bool:
    return any(
        p["metadata"]["uid"] == uid and not p["metadata"].get("deletionTimestamp")
        for p in pods(cluster, namespace, f"app={app}")
    )


def test_a_phase_written_through_the_status_subresource_starts_nothing(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(deployment("web", replicas=2, cpu="50m"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 2), what="the pods")[0]
    name, manifest = job_manifest(
        pod, mode="EvictDirectly", paused=True, deleteOptions={"preconditions": {}}
    )
    cluster.apply(manifest)
    cluster.kubectl(
        "patch", "pmj", name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Running"}}),
    )  # fmt: skip
    job = cluster.wait(
        lambda: (j := job_of(cluster, name)).get("status", {}).get("reason") == "NotAdmitted" and j,
        what="the job to be sent back to Pending",
    )
    assert job["status"]["phase"] == "Pending", job["status"]
    assert "not written by Berth" in job["status"]["message"]
    time.sleep(QUIET)
    assert still_there(cluster, namespace, "web", pod["metadata"]["uid"])
    assert job_of(cluster, name)["status"]["phase"] == "Pending"


@pytest.mark.parametrize(
    ("field", "template_spec"),
    [
        ("priorityClassName", {"priorityClassName": "system-node-critical"}),
        ("tolerations", {"tolerations": [{"operator": "Exists"}]}),
        ("nodeName", {"nodeName": "node-0"}),
        (
            "resources",
            {"containers": [{"name": "x", "resources": {"requests": {"cpu": "64"}}}]},
        ),
    ],
)
def test_a_privileged_reservation_template_gets_nothing(
    cluster: Cluster, namespace: str, field: str, template_spec: dict[str, object]
) -> None:
    cluster.apply(deployment("web", replicas=2, cpu="50m"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 2), what="the pods")[0]
    name, manifest = job_manifest(
        pod,
        reservationOptions={
            "template": {
                "metadata": {"annotations": {"berth.sh/consumable": "true"}},
                "spec": {"template": {"spec": template_spec}},
            }
        },
    )
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Failed", "Succeed"), what="the job to end")
    assert job["status"]["reason"] == "ForbiddenTemplate", job["status"]
    assert field in job["status"]["message"]
    assert still_there(cluster, namespace, "web", pod["metadata"]["uid"])
    uid = job["metadata"]["uid"]
    assert cluster.kubectl("get", "reservation", uid, check=False).returncode != 0
    placeholders = cluster.get("pods", "-A", f"-l=berth.sh/reservation={uid}")["items"]
    assert placeholders == []


@pytest.fixture
def system_namespace_app(cluster: Cluster) -> Iterator[str]:
    app = f"guard-{uuid.uuid4().hex[:6]}"
    cluster.apply(deployment(app, cpu="50m"), "kube-system")
    yield app
    cluster.kubectl("delete", "deployment", app, "-n", "kube-system", "--wait=false")


def test_a_job_in_kube_system_is_refused_before_eviction(
    cluster: Cluster, system_namespace_app: str
) -> None:
    app = system_namespace_app
    pod = cluster.wait(lambda: ready_pods(cluster, "kube-system", app, 1), what="the pod")[0]
    name, manifest = job_manifest(pod)
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Failed", "Succeed"), what="the job to end")
    assert job["status"]["reason"] == "ForbiddenMigratePod", job["status"]
    assert "kube-system" in job["status"]["message"]
    assert still_there(cluster, "kube-system", app, pod["metadata"]["uid"])


def test_an_eviction_written_through_the_status_subresource_evicts_nothing(
    cluster: Cluster, namespace: str
) -> None:
    """An admitted ReservationFirst job whose Reservation cannot be placed: a user who
    writes an Eviction condition into its status gets no eviction."""
    cluster.apply(deployment("web", replicas=2, cpu="50m"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 2), what="the pods")[0]
    nowhere = {"key": "metadata.name", "operator": "In", "values": ["no-such-node"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [nowhere]}]
            }
        }
    }
    name, manifest = job_manifest(
        pod,
        reservationOptions={"template": {"spec": {"template": {"spec": {"affinity": affinity}}}}},
    )
    cluster.apply(manifest)
    job = cluster.wait(
        lambda: (
            (j := job_of(cluster, name)).get("status", {}).get("phase") == "Running"
            and any(c["type"] == "ReservationCreated" for c in j["status"].get("conditions", []))
            and j
        ),
        what="the job admitted, its Reservation waiting for a place",
    )
    forged = {
        "type": "Eviction",
        "status": "False",
        "reason": "Evicting",
        "message": "forged",
        "lastProbeTime": job["status"]["conditions"][0]["lastProbeTime"],
        "lastTransitionTime": job["status"]["conditions"][0]["lastTransitionTime"],
    }
    conditions = [*job["status"]["conditions"], forged]
    cluster.kubectl(
        "patch", "pmj", name, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"conditions": conditions}}),
    )  # fmt: skip
    ended = cluster.wait(
        lambda: phase_is(cluster, name, "Failed", "Succeed"), what="the job to end"
    )
    assert ended["status"]["reason"] == "NotAdmitted", ended["status"]
    assert still_there(cluster, namespace, "web", pod["metadata"]["uid"])
