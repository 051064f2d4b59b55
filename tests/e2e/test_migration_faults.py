"""Migrations survive a controller killed at any stage, and say what happened when the
webhook is down; a forged binding annotation buys nothing."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from berth import protocol
from berth.api import keys
from devtools.processes import Component
from tests.e2e.capacity import TEST_GATE
from tests.e2e.kube import Cluster
from tests.e2e.migrate import (
    admit_paused,
    condition,
    deployment,
    job_manifest,
    job_of,
    leftovers,
    phase_is,
    ready_pods,
)

pytestmark = pytest.mark.e2e


def component(cluster: Cluster, name: str) -> Component:
    return next(c for c in cluster.local.components if c.name == name)


@pytest.fixture
def restore_components(cluster: Cluster) -> Iterator[None]:
    """Whatever a test stops, the session's controller and webhook run again after it."""
    yield
    names = {c.name for c in cluster.local.components if cluster.local.owns(c)}
    if "berth-controller" not in names:
        cluster.local.start_controller(name="berth-controller")
    if "berth-webhook" not in names:
        cluster.local.start_webhook(name="berth-webhook")


def kill(cluster: Cluster, name: str) -> None:
    """SIGKILL: no chance to finish anything in flight."""
    target = component(cluster, name)
    os.killpg(target.pid, signal.SIGKILL)
    cluster.local.stop(target)


def reservation_of(cluster: Cluster, job: dict[str, Any]) -> dict[str, Any]:
    items = cluster.get("reservations")["items"]
    return next((r for r in items if r["metadata"]["name"] == job["metadata"]["uid"]), {})


STAGES: dict[str, Callable[[Cluster, str], Any]] = {
    "before the reservation": lambda _cluster, _name: True,
    "after the reservation": lambda cluster, name: condition(
        job_of(cluster, name), "ReservationCreated"
    ),
    "after the eviction": lambda cluster, name: condition(job_of(cluster, name), "Eviction"),
    "during the handover": lambda cluster, name: (
        reservation_of(cluster, job_of(cluster, name)).get("status", {}).get("currentOwners")
    ),
}


@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.usefixtures("restore_components")
def test_controller_killed_mid_migration_is_picked_up_by_the_next_one(
    cluster: Cluster, namespace: str, stage: str
) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    if stage == "before the reservation":
        kill(cluster, "berth-controller")
    name, manifest = job_manifest(pod)
    cluster.apply(manifest)
    if stage != "before the reservation":
        cluster.wait(lambda: STAGES[stage](cluster, name), what=f"the job {stage}", timeout=30)
        kill(cluster, "berth-controller")
    cluster.local.start_controller(name="berth-controller")
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"),
        what="the job to end after the restart",
    )
    assert job["status"]["phase"] == "Succeed", job["status"]
    new = cluster.get("pod", job["status"]["podRef"]["name"], "-n", namespace)
    assert new["spec"]["nodeName"] == job["status"]["nodeName"]
    cluster.wait(
        lambda: not any(leftovers(cluster, namespace).values()),
        what="no placeholder and no gated pod",
    )


@pytest.mark.usefixtures("restore_components")
def test_webhook_down_never_blocks_pods_and_the_job_says_why(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    kill(cluster, "berth-webhook")
    name, manifest = job_manifest(pod, ttl="60s")
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Failed", "ReservationNotUsed")
    assert "webhook" in job["status"]["message"]
    # The replacement was created anyway (failurePolicy Ignore) and runs ungated.
    replacement = cluster.wait(
        lambda: ready_pods(cluster, namespace, "web", 1), what="the replacement to run"
    )[0]
    assert replacement["metadata"]["uid"] != pod["metadata"]["uid"]
    assert not replacement["spec"].get("schedulingGates")
    cluster.wait(
        lambda: not any(leftovers(cluster, namespace).values()),
        what="no placeholder and no gated pod",
    )


def test_forged_binding_annotation_gets_no_owner_privileges(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    rs = pod["metadata"]["ownerReferences"][0]
    name = f"forge-{namespace}"[:60]
    # An Available Reservation open to the workload's replacement, as during a migration.
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "scheduling.koordinator.sh/v1alpha1",
                "kind": "Reservation",
                "metadata": {"name": name, "annotations": {"berth.sh/consumable": "true"}},
                "spec": {
                    "ttl": "5m",
                    "template": {
                        "metadata": {"namespace": namespace},
                        "spec": {
                            "containers": [
                                {"name": "c", "resources": {"requests": {"cpu": "100m"}}}
                            ]
                        },
                    },
                    "owners": [
                        {
                            "controller": {
                                "apiVersion": "apps/v1",
                                "kind": "ReplicaSet",
                                "name": rs["name"],
                                "uid": rs["uid"],
                                "namespace": namespace,
                            }
                        }
                    ],
                },
            }
        )
    )
    try:
        reservation = cluster.wait(
            lambda: (
                (r := cluster.get("reservation", name)).get("status", {}).get("phase")
                == "Available"
                and r
            ),
            what="the Reservation to be Available",
        )
        forged = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "forger",
                "annotations": {
                    "scheduling.koordinator.sh/reservation-allocated": json.dumps(
                        {"name": name, "uid": reservation["metadata"]["uid"]}
                    ),
                    "berth.sh/claim": "forged-token",
                },
            },
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }
        cluster.apply(json.dumps(forged), namespace)
        forger = cluster.wait(
            lambda: (
                (p := cluster.get("pod", "forger", "-n", namespace))["spec"].get("nodeName") and p
            ),
            what="the forger to be scheduled as any pod",
        )
        assert "schedulingGates" not in forger["spec"]
        assert not (forger["spec"].get("affinity") or {}).get("nodeAffinity")
        reservation = cluster.get("reservation", name)
        assert not reservation["status"].get("currentOwners")
        assert "berth.sh/claim" not in reservation["metadata"]["annotations"]
    finally:
        cluster.kubectl("delete", "reservation", name, "--ignore-not-found")
    cluster.wait(
        lambda: not any(leftovers(cluster, namespace).values()),
        what="no placeholder and no gated pod",
    )


@pytest.fixture
def cordoned(cluster: Cluster) -> Iterator[list[str]]:
    """Nodes the test cordons; uncordoned after it."""
    nodes: list[str] = []
    yield nodes
    for node in nodes:
        cluster.kubectl("uncordon", node)


@pytest.mark.parametrize("refusal", ["cordon", "placement"])
def test_a_replacement_its_reserved_node_refuses_is_let_go_once_its_job_ends(
    cluster: Cluster, namespace: str, cordoned: list[str], refusal: str
) -> None:
    """The webhook ties a replacement to the reserved node by a required affinity, which
    can only be narrowed. If that node is cordoned after the handover, or the replacement
    asks where it may run for labels the node lacks (a rollout that moved the workload to
    other nodes: here a node selector added to the gated replacement), the job ends once
    the scheduler has refused the replacement there for 30 s (a job may have no TTL; a
    pod of higher priority that took the place, in the default scope, is left to the
    TTL). The replacement would then wait for that node for ever: once no live
    Reservation holds its claim and the scheduler has refused it for the grace period,
    Berth deletes it (it never ran), and the workload makes one that runs elsewhere."""
    held = {"schedulingGates": [{"name": TEST_GATE}]}  # each pod waits for the test
    cluster.apply(deployment("web", spec_extra=held), namespace)
    first = cluster.wait(lambda: gated_only_by_the_test(cluster, namespace), what="the pod")[0]
    lift(cluster, namespace, first["metadata"]["name"])
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name, manifest = job_manifest(old, ttl="10m")
    cluster.apply(manifest)

    def handed_over() -> dict[str, Any] | None:
        # Berth's gate removed, the test's kept, the placeholder gone: in handover.
        for pod in gated_only_by_the_test(cluster, namespace):
            if (
                protocol.pod_claim(pod)
                and protocol.tied_node(pod)
                and not cluster.get("pods", "-n", namespace, f"-l={keys.RESERVATION_LABEL}")[
                    "items"
                ]
            ):
                return pod
        return None

    replacement = cluster.wait(handed_over, what="the handover to the replacement")
    node = protocol.tied_node(replacement)
    assert node is not None
    if refusal == "cordon":
        cordoned.append(node)
        cluster.kubectl("cordon", node)
        why = f"node {node} is cordoned"
    else:
        cluster.kubectl(
            "patch", "pod", replacement["metadata"]["name"], "-n", namespace,
            "--type=merge", "-p", json.dumps({"spec": {"nodeSelector": {"pool": "elsewhere"}}}),
        )  # fmt: skip
        why = f"node {node} does not match the pod's node selector or required node affinity"
    lift(cluster, namespace, replacement["metadata"]["name"])
    cluster.wait(
        lambda: (
            "does not fit on"
            in condition(job_of(cluster, name), "PodBoundReservation").get("message", "")
        ),
        what="the job to report the replacement refused",
    )
    ended = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end", timeout=90
    )
    assert (ended["status"]["phase"], ended["status"]["reason"]) == ("Failed", "ReservationLost")
    assert f"{why} after the pod was evicted" in ended["status"]["message"]

    def let_go() -> list[dict[str, Any]] | None:
        events = cluster.get(
            "events", "-n", namespace,
            f"--field-selector=involvedObject.uid={replacement['metadata']['uid']}",
        )["items"]  # fmt: skip
        return [e for e in events if e["reason"] == "PinnedPodDeleted"] or None

    [event] = cluster.wait(let_go, what="Berth to let the tied replacement go", timeout=90)
    assert node in event["message"]
    new = cluster.wait(lambda: gated_only_by_the_test(cluster, namespace), what="a new pod")[0]
    assert new["metadata"]["uid"] != replacement["metadata"]["uid"]
    assert protocol.tied_node(new) is None
    lift(cluster, namespace, new["metadata"]["name"])
    [running] = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="it to run")
    if refusal == "cordon":  # the workload's own template may run on that node again
        assert running["spec"]["nodeName"] != node
    assert not any(leftovers(cluster, namespace).values())


def test_a_place_on_a_node_cordoned_before_the_eviction_moves_before_anything_is_evicted(
    cluster: Cluster, namespace: str, cordoned: list[str]
) -> None:
    """The reserved node is cordoned before the eviction: a replacement sent there would
    stay Pending. The Reservation places its placeholder again on a node that takes it,
    and the job evicts into that place; the replacement runs there."""
    cluster.apply(deployment("web"), namespace)
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name, manifest = job_manifest(old, ttl="5m")
    admit_paused(cluster, name, manifest)

    def placed(other_than: str | None = None) -> str | None:
        status = reservation_of(cluster, job_of(cluster, name)).get("status") or {}
        node = status.get("nodeName")
        return node if status.get("phase") == "Available" and node != other_than else None

    first = cluster.wait(placed, what="the place reserved")
    cordoned.append(first)
    cluster.kubectl("cordon", first)
    second = cluster.wait(lambda: placed(other_than=first), what="the place to move")
    assert second != old["spec"]["nodeName"]
    assert (
        cluster.get("pods", "-n", namespace, old["metadata"]["name"])["metadata"]["uid"]
        == (old["metadata"]["uid"])
    )
    cluster.kubectl("patch", "pmj", name, "--type=merge", "-p", '{"spec":{"paused":false}}')
    done = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job")
    assert done["status"]["phase"] == "Succeed", done["status"]
    [new] = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the replacement")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["spec"]["nodeName"] == second
    assert not any(leftovers(cluster, namespace).values())


def gated_only_by_the_test(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    """Pods of `web` still waiting for the test, with no other gate."""
    return [
        pod
        for pod in cluster.get("pods", "-n", namespace, "-l=app=web")["items"]
        if pod["spec"].get("schedulingGates") == [{"name": TEST_GATE}]
        and not pod["metadata"].get("deletionTimestamp")
    ]


def lift(cluster: Cluster, namespace: str, pod: str) -> None:
    cluster.kubectl(
        "patch", "pod", pod, "-n", namespace, "--type=json",
        "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]',
    )  # fmt: skip
