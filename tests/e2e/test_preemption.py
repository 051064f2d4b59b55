"""Preemption for a placeholder, on the real scheduler: never by default; with a job's
`preemptionOptions`, the pods kube-scheduler preempts are recorded in the job's status;
never past a PodDisruptionBudget.

Each test fills the cluster the same way: a 3-CPU pod of priority 1000 (a Deployment's) to
migrate, and on each other node a priority-0 pod leaving 1 CPU free, so that its
placeholder fits nowhere unless the scheduler preempts one of them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from berth.api import keys
from berth.protocol import is_ready
from tests.e2e.capacity import NODES, shape_free_cpu
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import (
    condition,
    deployment,
    events,
    job_manifest,
    job_of,
    leftovers,
    phase_is,
    ready_pods,
)

pytestmark = pytest.mark.e2e


@dataclass
class Full:
    """The filled cluster: the pod to migrate and the priority-0 fillers, by node."""

    pod: dict[str, Any]
    fillers: dict[str, dict[str, Any]]


@pytest.fixture
def full(cluster: Cluster, namespace: str) -> Iterator[Full]:
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
        others = [n for n in NODES if n != pod["spec"]["nodeName"]]
        # Pods of earlier tests still terminating are waited for, then each other node
        # gets a filler that leaves 1 CPU free.
        asyncio.run(shape_free_cpu(cluster, namespace, dict.fromkeys(others, "1")))
        for node in others:
            cluster.kubectl("label", "pod", f"fill-{node}", "-n", namespace, "role=filler")

        def ready_fillers() -> dict[str, dict[str, Any]] | None:
            found = {
                p["spec"]["nodeName"]: p
                for p in pods(cluster, namespace, "role=filler")
                if is_ready(p)
            }
            return found if len(found) == 2 else None

        yield Full(pod=pod, fillers=cluster.wait(ready_fillers, what="the fillers"))
    finally:
        for job in cluster.get("pmj")["items"]:
            if job["spec"]["podRef"].get("namespace") == namespace:
                cluster.kubectl("delete", "pmj", job["metadata"]["name"], "--ignore-not-found")
        cluster.kubectl("delete", "priorityclass", high, "--ignore-not-found")


def untouched(cluster: Cluster, namespace: str, *kept: dict[str, Any]) -> bool:
    """Each of `kept` still exists, same UID, not terminating."""
    now = {p["metadata"]["uid"]: p for p in pods(cluster, namespace)}
    return all(
        p["metadata"]["uid"] in now
        and not now[p["metadata"]["uid"]]["metadata"].get("deletionTimestamp")
        for p in kept
    )


def times_out_having_preempted_nothing(
    cluster: Cluster, namespace: str, full: Full, name: str
) -> dict[str, Any]:
    """The job waits, Unschedulable, then ends in Timeout; every pod is where it was."""
    job: dict[str, Any] = cluster.wait(
        lambda: phase_is(cluster, name, "Failed", "Succeed"), what="the TTL", timeout=120
    )
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Failed", "Timeout")
    assert "nothing was evicted" in job["status"]["message"]
    scheduled = condition(job, "ReservationScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert condition(job, "Preemption") == {}
    assert not job["status"].get("preemptedPodsRef")
    assert untouched(cluster, namespace, full.pod, *full.fillers.values())
    cluster.wait(
        lambda: not leftovers(cluster, namespace)["placeholders"], what="the placeholder to go"
    )
    return job


def test_by_default_a_placeholder_preempts_nothing(
    cluster: Cluster, namespace: str, full: Full
) -> None:
    """kube-scheduler could make room by preempting a filler, but the placeholder runs
    under the non-preempting twin of the pod's class: the job waits, then times out."""
    name, manifest = job_manifest(full.pod, ttl="30s")
    cluster.apply(manifest)

    def refused_preemption() -> dict[str, Any] | None:
        scheduled = condition(job_of(cluster, name), "ReservationScheduled")
        return scheduled if "preemptionPolicy=Never" in scheduled.get("message", "") else None

    cluster.wait(refused_preemption, what="the scheduler to refuse preemption")
    [placeholder_name] = leftovers(cluster, namespace)["placeholders"]
    placeholder = cluster.get("pod", placeholder_name, "-n", namespace)["spec"]
    assert placeholder["preemptionPolicy"] == "Never"
    assert placeholder["priority"] == 1000
    assert placeholder["priorityClassName"] == "berth-non-preempting-1000"
    times_out_having_preempted_nothing(cluster, namespace, full, name)


def test_with_preemption_allowed_the_preempted_pods_are_in_the_jobs_status(
    cluster: Cluster, namespace: str, full: Full
) -> None:
    name, manifest = job_manifest(full.pod, ttl="3m", reservationOptions={"preemptionOptions": {}})
    cluster.apply(manifest)
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the migration", timeout=150
    )
    assert (job["status"]["phase"], job["status"]["status"]) == ("Succeed", "Complete"), job[
        "status"
    ]
    node = job["status"]["nodeName"]
    victim, spared = full.fillers[node], next(p for n, p in full.fillers.items() if n != node)
    # The scheduler deleted the filler on the reserved node, and only that one.
    assert not untouched(cluster, namespace, victim)
    assert untouched(cluster, namespace, spared)
    assert job["status"]["preemptedPodsRef"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": namespace,
            "name": victim["metadata"]["name"],
            "uid": victim["metadata"]["uid"],
        }
    ]
    preemption = condition(job, "Preemption")
    assert (preemption["status"], preemption["reason"]) == ("True", "PreemptComplete")
    assert victim["metadata"]["name"] in preemption["message"]
    assert not job["status"].get("preemptedPodsReservation")
    reasons = events(cluster, name)
    assert "PreemptComplete" in reasons
    assert reasons.index("PreemptComplete") < reasons.index("Evicting")
    # The scheduler's own word (an event, not what the controller read): the victim was
    # preempted for the placeholder the Reservation recorded.
    reservation = cluster.get("reservation", job["metadata"]["uid"])
    recorded = json.loads(reservation["metadata"]["annotations"][keys.PLACEHOLDER])
    preempted = cluster.get(
        "events",
        "-n",
        namespace,
        f"--field-selector=involvedObject.name={victim['metadata']['name']},reason=Preempted",
    )["items"]
    assert any(recorded["uid"] in e.get("message", "") for e in preempted), preempted
    # The replacement runs on the reserved node; nothing of Berth's is left.
    replacement = cluster.get("pod", job["status"]["podRef"]["name"], "-n", namespace)
    assert replacement["spec"]["nodeName"] == node == reservation["status"]["nodeName"]
    assert replacement["metadata"]["uid"] != full.pod["metadata"]["uid"]
    cluster.wait(
        lambda: not any(leftovers(cluster, namespace).values()), what="no placeholder or gated pod"
    )


def test_a_placeholder_allowed_to_preempt_spares_pods_a_pdb_protects(
    cluster: Cluster, namespace: str, full: Full
) -> None:
    """Both fillers under a PDB that allows no disruption: Berth's extender drops every
    preemption candidate for the placeholder, as an eviction would be refused."""
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "fillers"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"role": "filler"}}},
            }
        ),
        namespace,
    )

    def protected() -> bool:
        pdb = cluster.get("pdb", "fillers", "-n", namespace)
        status = pdb.get("status") or {}
        return status.get("currentHealthy") == 2 and status.get("disruptionsAllowed") == 0

    cluster.wait(protected, what="the PDB to count both fillers")
    name, manifest = job_manifest(full.pod, ttl="30s", reservationOptions={"preemptionOptions": {}})
    cluster.apply(manifest)

    def placeholder() -> dict[str, Any] | None:
        names = leftovers(cluster, namespace)["placeholders"]
        return cluster.get("pod", names[0], "-n", namespace) if names else None

    spec = cluster.wait(placeholder, what="the placeholder")["spec"]
    # It may preempt: the pod's own class and policy.
    assert (spec["priorityClassName"], spec["priority"]) == (f"{namespace}-high", 1000)
    assert spec["preemptionPolicy"] == "PreemptLowerPriority"
    times_out_having_preempted_nothing(cluster, namespace, full, name)
