"""Nobody gets more from Berth than their own RBAC gives them: a phase written through
the status subresource, a privileged reservation template (or one carrying Berth's own
keys), a job for a pod in a namespace the webhook does not see, and a job whose pod
became forbidden after it was admitted all get nothing.

No test waits a fixed time for nothing to happen: each waits for what the controller
writes when it refuses (a status, an event), then checks that nothing else happened."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import (
    condition,
    deployment,
    events,
    job_manifest,
    job_of,
    phase_is,
    ready_pods,
)

pytestmark = pytest.mark.e2e


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
    # The refusal's event is the last thing the controller does about the forged phase
    # (its status first, then the event): once it is there, the controller has acted on
    # the job as it now stands, and nothing else was done in its place.
    cluster.wait(lambda: "NotAdmitted" in events(cluster, name), what="the controller's refusal")
    job = job_of(cluster, name)
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Pending", "NotAdmitted")
    assert "not written by Berth" in job["status"]["message"]
    assert not job["status"].get("conditions"), "the refused job recorded a step"
    assert events(cluster, name) == ["NotAdmitted"]
    assert still_there(cluster, namespace, "web", pod["metadata"]["uid"])


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


FROZEN = "berth.sh/test-frozen"
"""A label the controller's labelSelector excludes, in the test below."""
TARGET = "berth.sh/test-target"
"""A node label the job's placement asks for: no node has it until the test says so."""


@pytest.fixture
def target_node(cluster: Cluster) -> Iterator[str]:
    yield "node-2"
    cluster.kubectl("label", "node", "node-2", f"{TARGET}-", check=False)


def test_a_pod_that_became_forbidden_before_its_eviction_is_not_evicted(
    cluster: Cluster,
    namespace: str,
    restart_controller: Callable[[str], None],
    target_node: str,
) -> None:
    """Admitted and reserving; then the pod gets a label the configuration's labelSelector
    excludes, and only then may its Reservation be placed: the job fails as arbitration
    would have failed it, and the pod is not evicted."""
    restart_controller(
        f"labelSelector:\n  matchExpressions:\n  - {{key: {FROZEN}, operator: DoesNotExist}}\n"
    )
    cluster.apply(deployment("web", replicas=2, cpu="50m"), namespace)
    pods_ = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 2), what="the pods")
    pod = next(p for p in pods_ if p["spec"]["nodeName"] != target_node)
    placement = {"nodeSelector": {TARGET: namespace}}
    name, manifest = job_manifest(
        pod, reservationOptions={"template": {"spec": {"template": {"spec": placement}}}}
    )
    cluster.apply(manifest)
    cluster.wait(
        lambda: (
            condition(job_of(cluster, name), "ReservationScheduled").get("reason")
            == "Unschedulable"
        ),
        what="the job admitted, its Reservation waiting for a place",
    )
    cluster.kubectl("label", "pod", pod["metadata"]["name"], "-n", namespace, f"{FROZEN}=yes")
    cluster.kubectl("label", "node", target_node, f"{TARGET}={namespace}")
    ended = cluster.wait(
        lambda: phase_is(cluster, name, "Failed", "Succeed"), what="the job to end"
    )
    assert (ended["status"]["phase"], ended["status"]["reason"]) == (
        "Failed",
        "ForbiddenMigratePod",
    ), ended["status"]
    assert ended["status"]["message"] == "pod does not match labelSelector"
    assert still_there(cluster, namespace, "web", pod["metadata"]["uid"])
    assert not any(c["type"] == "Eviction" for c in ended["status"].get("conditions") or [])


def test_berth_keys_in_a_template_do_not_open_the_reservation(
    cluster: Cluster, namespace: str
) -> None:
    """A job's template asks for nothing the pod lacks but carries `berth.sh/consumable`
    (which opens a Reservation to claims before its eviction): the Reservation is made
    without it, and, its placeholder having no node, stays closed with the pod in place."""
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
    opened = {"berth.sh/consumable": "true", "berth.sh/migrating": "true"}
    name, manifest = job_manifest(
        pod,
        reservationOptions={
            "template": {
                "metadata": {"annotations": opened, "labels": opened},
                "spec": {"template": {"spec": {"affinity": affinity}}},
            }
        },
    )
    cluster.apply(manifest)

    def unschedulable() -> dict[str, object] | None:
        job = job_of(cluster, name)
        return job if condition(job, "ReservationScheduled").get("status") == "False" else None

    job = cluster.wait(unschedulable, what="the job's Reservation to wait for a place")
    reservation = cluster.get(
        "reservation", job["spec"]["reservationOptions"]["reservationRef"]["name"]
    )
    metadata = reservation["metadata"]
    assert not {
        **(metadata.get("annotations") or {}),
        **(metadata.get("labels") or {}),
    }.keys() & set(opened)
    assert job["status"]["phase"] == "Running"
    assert still_there(cluster, namespace, "web", pod["metadata"]["uid"])
