"""The controller on the real control plane: reservations, evictions, TTLs, aborts."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from berth.protocol import is_ready
from berth.resources import parse_quantity, pod_requests
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import (
    LONG_TTL,
    PAUSE,
    condition,
    deployment,
    events,
    expire,
    job_manifest,
    job_of,
    leftovers,
    pending_with,
    phase_is,
    ready_pods,
)

pytestmark = pytest.mark.e2e


def test_no_room_anywhere_waits_then_times_out_without_evicting(
    cluster: Cluster, namespace: str
) -> None:
    # The pod may only run on its own node; the Reservation excludes that node.
    cluster.apply(
        deployment("pinned", spec_extra={"nodeSelector": {"kubernetes.io/hostname": "node-0"}}),
        namespace,
    )
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "pinned", 1), what="the pinned pod")[
        0
    ]
    name, manifest = job_manifest(pod, ttl=LONG_TTL)
    cluster.apply(manifest)

    def unschedulable() -> dict[str, Any] | None:
        job = job_of(cluster, name)
        scheduled = condition(job, "ReservationScheduled")
        return job if scheduled.get("reason") == "Unschedulable" else None

    job = cluster.wait(unschedulable, what="ReservationScheduled=False")
    assert job["status"]["phase"] == "Running"
    assert "node affinity" in condition(job, "ReservationScheduled")["message"]
    expire(cluster, name)
    job = cluster.wait(lambda: phase_is(cluster, name, "Failed"), what="the TTL")
    assert job["status"]["reason"] == "Timeout"
    assert "nothing was evicted" in job["status"]["message"]
    survivor = cluster.get("pod", pod["metadata"]["name"], "-n", namespace)
    assert survivor["metadata"]["uid"] == pod["metadata"]["uid"]
    assert not survivor["metadata"].get("deletionTimestamp")
    cluster.wait(
        lambda: not leftovers(cluster, namespace)["placeholders"], what="the placeholder to go"
    )
    cluster.wait(
        lambda: (
            not cluster.get("reservations")["items"]
            or all(
                r["metadata"]["name"] != job["metadata"]["uid"]
                for r in cluster.get("reservations")["items"]
            )
        ),
        what="the Reservation to go",
    )


def test_evict_directly_evicts_and_succeeds(cluster: Cluster, namespace: str) -> None:
    # EvictDirectly keeps the expected-replicas rule: a 1-replica workload would wait.
    cluster.apply(deployment("direct", replicas=2), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "direct", 2), what="the pods")[0]
    name, manifest = job_manifest(pod, mode="EvictDirectly")
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    assert (job["status"]["phase"], job["status"]["status"]) == ("Succeed", "Complete")
    assert condition(job, "Eviction")["reason"] == "EvictComplete"
    assert not cluster.get("reservations")["items"] or all(
        r["metadata"]["name"] != job["metadata"]["uid"]
        for r in cluster.get("reservations")["items"]
    )
    assert events(cluster, name) == ["Evicting", "EvictComplete", "Complete"]


def test_a_job_without_a_mode_runs_in_the_configured_default_mode(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    restart_controller("defaultJobMode: EvictDirectly\n")
    cluster.apply(deployment("direct", replicas=2), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "direct", 2), what="the pods")[0]
    name, manifest = job_manifest(pod, mode=None)
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    assert job["spec"]["mode"] == "EvictDirectly"  # recorded on the job
    assert (job["status"]["phase"], job["status"]["status"]) == ("Succeed", "Complete")
    assert not condition(job, "ReservationCreated")
    assert events(cluster, name) == ["Evicting", "EvictComplete", "Complete"]


def test_a_job_without_a_mode_reserves_first_by_default(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name, manifest = job_manifest(pod, mode=None)
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    assert job["spec"]["mode"] == "ReservationFirst"
    assert job["status"]["phase"] == "Succeed", job["status"]
    assert condition(job, "PodBoundReservation")["status"] == "True"


def guarded_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    """Two pods under a PodDisruptionBudget that allows no disruption."""
    cluster.apply(deployment("guarded", replicas=2), namespace)
    pods = cluster.wait(lambda: ready_pods(cluster, namespace, "guarded", 2), what="2 pods")
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "g"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}},
            }
        ),
        namespace,
    )
    cluster.wait(
        lambda: (
            cluster.get("pdb", "g", "-n", namespace).get("status", {}).get("currentHealthy") == 2
        ),
        what="the PDB to count its pods",
    )
    return list(pods)


def test_pdb_holds_the_job_until_its_ttl_without_touching_anything(
    cluster: Cluster, namespace: str
) -> None:
    pods = guarded_pods(cluster, namespace)
    name, manifest = job_manifest(pods[0], ttl=LONG_TTL)
    cluster.apply(manifest)
    job = cluster.wait(
        lambda: pending_with(cluster, name, "BlockedByPDB"),
        what="arbitration to hold the job for the PDB",
    )
    assert job["status"].get("phase", "Pending") == "Pending"
    assert (
        f"PodDisruptionBudget {namespace}/g allows no more disruptions"
        in (job["status"]["message"])
    )
    expire(cluster, name)
    job = cluster.wait(lambda: phase_is(cluster, name, "Failed"), what="the TTL")
    assert job["status"]["reason"] == "Timeout"
    assert "BlockedByPDB" in job["status"]["message"]
    still = cluster.get("pod", pods[0]["metadata"]["name"], "-n", namespace)
    assert still["metadata"]["uid"] == pods[0]["metadata"]["uid"]
    assert not any(leftovers(cluster, namespace).values())


def test_pdb_refusing_the_eviction_is_retried_and_reported(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    # With arbitration off, the Eviction API itself refuses: the job says BlockedByPDB.
    restart_controller("arbitrationArgs:\n  enabled: false\n")
    pods = guarded_pods(cluster, namespace)
    name, manifest = job_manifest(pods[0], ttl=LONG_TTL)
    cluster.apply(manifest)

    def blocked() -> dict[str, Any] | None:
        job = job_of(cluster, name)
        return job if condition(job, "Eviction").get("reason") == "BlockedByPDB" else None

    job = cluster.wait(blocked, what="BlockedByPDB")
    assert "disruption budget" in condition(job, "Eviction")["message"]
    expire(cluster, name)
    job = cluster.wait(lambda: phase_is(cluster, name, "Failed"), what="the TTL")
    assert job["status"]["reason"] == "Timeout"
    assert "BlockedByPDB" in events(cluster, name)
    # The refusal is written on the job as the Evicting write left it: no write of this
    # job's status lost a race with the controller's own previous write.
    controller = next(c for c in cluster.local.components if c.name == "berth-controller")
    conflicts = [
        line
        for line in Path(controller.log).read_text().splitlines()
        if "conflict on UpdateStatus" in line and name in line
    ]
    assert not conflicts, conflicts
    still = cluster.get("pod", pods[0]["metadata"]["name"], "-n", namespace)
    assert still["metadata"]["uid"] == pods[0]["metadata"]["uid"]
    cluster.wait(
        lambda: not leftovers(cluster, namespace)["placeholders"], what="the placeholder to go"
    )


def test_paused_job_does_nothing_until_unpaused_and_abort_cleans_up(
    cluster: Cluster, namespace: str
) -> None:
    # Pinned to its node, so its Reservation stays Pending: the abort comes before eviction.
    cluster.apply(
        deployment("held", spec_extra={"nodeSelector": {"kubernetes.io/hostname": "node-2"}}),
        namespace,
    )
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "held", 1), what="the pod")[0]
    name, manifest = job_manifest(pod, paused=True)
    cluster.apply(manifest)
    # A later unpaused job on another pod shows the controller has looked at this one.
    cluster.apply(deployment("other", replicas=2), namespace)
    other = cluster.wait(lambda: ready_pods(cluster, namespace, "other", 2), what="other")[0]
    other_name, other_manifest = job_manifest(other, mode="EvictDirectly")
    cluster.apply(other_manifest)
    cluster.wait(lambda: phase_is(cluster, other_name, "Succeed"), what="the other job")
    assert job_of(cluster, name).get("status", {}).get("phase", "Pending") == "Pending"

    cluster.kubectl("patch", "pmj", name, "--type=merge", "-p", '{"spec":{"paused":false}}')
    cluster.wait(lambda: phase_is(cluster, name, "Running"), what="the job to start")
    cluster.wait(
        lambda: condition(job_of(cluster, name), "ReservationScheduled"),
        what="its reservation to be tried",
    )
    assert leftovers(cluster, namespace)["placeholders"]
    cluster.kubectl(
        "patch",
        "pmj",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"phase":"Aborted"}}',
    )
    job = job_of(cluster, name)
    cluster.wait(
        lambda: all(
            r["metadata"]["name"] != job["metadata"]["uid"]
            for r in cluster.get("reservations")["items"]
        ),
        what="the aborted job's Reservation to go",
    )
    cluster.wait(
        lambda: not any(leftovers(cluster, namespace).values()), what="no placeholder or gated pod"
    )
    assert job_of(cluster, name)["status"]["phase"] == "Aborted"
    assert (
        cluster.get("pod", pod["metadata"]["name"], "-n", namespace)["metadata"]["uid"]
        == pod["metadata"]["uid"]
    )


def cpu_free(cluster: Cluster, node: str) -> Decimal:
    """CPU of `node` not requested by a bound, unfinished pod, in millicores."""
    allocatable = parse_quantity(cluster.get("node", node)["status"]["allocatable"]["cpu"])
    used = sum(
        (
            pod_requests(item["spec"]).get("cpu", Decimal(0))
            for item in cluster.get("pods", "--all-namespaces")["items"]
            if item["spec"].get("nodeName") == node
            and item["status"].get("phase") not in ("Succeeded", "Failed")
        ),
        Decimal(0),
    )
    return (allocatable - used) * 1000


def test_a_placeholder_never_preempts(cluster: Cluster, namespace: str) -> None:
    """A high-priority pod's placeholder on a full cluster: kube-scheduler could make room
    by preempting the lower-priority pods, but the placeholder runs under a non-preempting
    class, so the job waits, Unschedulable, and no pod is touched."""
    high = f"{namespace}-high"
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": high},
                "value": 1000,
            }
        )
    )
    try:
        cluster.apply(deployment("vip", cpu="3", spec_extra={"priorityClassName": high}), namespace)
        pod = cluster.wait(lambda: ready_pods(cluster, namespace, "vip", 1), what="the pod")[0]
        others = [n for n in ("node-0", "node-1", "node-2") if n != pod["spec"]["nodeName"]]
        for node in others:  # leave 1 CPU free, to priority-0 pods preemption could remove
            filler = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"filler-{node}", "labels": {"role": "filler"}},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {
                            "name": "c",
                            "image": PAUSE,
                            "resources": {
                                "requests": {"cpu": f"{int(cpu_free(cluster, node)) - 1000}m"}
                            },
                        }
                    ],
                },
            }
            cluster.apply(json.dumps(filler), namespace)

        def ready_fillers() -> list[dict[str, Any]] | None:
            found = [p for p in pods(cluster, namespace, "role=filler") if is_ready(p)]
            return found if len(found) == 2 else None

        fillers = cluster.wait(ready_fillers, what="the fillers")
        name, manifest = job_manifest(pod, ttl="2m")
        cluster.apply(manifest)

        def refused_preemption() -> dict[str, Any] | None:
            scheduled = condition(job_of(cluster, name), "ReservationScheduled")
            return scheduled if "preemptionPolicy=Never" in scheduled.get("message", "") else None

        scheduled = cluster.wait(refused_preemption, what="the scheduler to refuse preemption")
        assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
        [placeholder_name] = leftovers(cluster, namespace)["placeholders"]
        placeholder = cluster.get("pod", placeholder_name, "-n", namespace)["spec"]
        assert placeholder["preemptionPolicy"] == "Never"
        assert placeholder["priority"] == 1000
        assert placeholder["priorityClassName"] == "berth-non-preempting-1000"
        assert job_of(cluster, name)["status"]["phase"] == "Running"
        after = {p["metadata"]["uid"]: p for p in pods(cluster, namespace)}
        for kept in [*fillers, pod]:
            assert not after[kept["metadata"]["uid"]]["metadata"].get("deletionTimestamp")
        cluster.kubectl("delete", "pmj", name)
    finally:
        cluster.kubectl("delete", "priorityclass", high, "--ignore-not-found")


def test_preemption_options_refuse_the_job(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("asks"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "asks", 1), what="the pod")[0]
    name, manifest = job_manifest(pod, reservationOptions={"preemptionOptions": {}})
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Failed", "Succeed"), what="the job")
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Failed", "ForbiddenPreemption")
    assert "preemptionOptions" in job["status"]["message"]
    assert condition(job, "ReservationCreated") == {}
    assert all(
        r["metadata"]["name"] != job["metadata"]["uid"]
        for r in cluster.get("reservations")["items"]
    )
    survivor = cluster.get("pod", pod["metadata"]["name"], "-n", namespace)
    assert survivor["metadata"]["uid"] == pod["metadata"]["uid"]
