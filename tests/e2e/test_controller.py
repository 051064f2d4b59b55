"""The controller on the real control plane: reservations, evictions, TTLs, aborts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from berth.api import keys
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import (
    LONG_TTL,
    admit_paused,
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
        # Until the scheduler has tried, the message is "waiting for the scheduler".
        job = job_of(cluster, name)
        scheduled = condition(job, "ReservationScheduled")
        refused = "node affinity" in scheduled.get("message", "")
        return job if scheduled.get("reason") == "Unschedulable" and refused else None

    job = cluster.wait(unschedulable, what="ReservationScheduled=False, node affinity")
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
    budget(cluster, namespace, "g", {"app": "guarded"}, min_available=2)
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
    # The refusal is written on the job as the Evicting write left it: no write of this
    # job's status lost a race with the controller's own previous write. (Read before the
    # TTL patch below, whose new resourceVersion may rightly make a retry's write conflict.)
    controller = next(c for c in cluster.local.components if c.name == "berth-controller")
    conflicts = [
        line
        for line in Path(controller.log).read_text().splitlines()
        if "conflict on UpdateStatus" in line and name in line
    ]
    assert not conflicts, conflicts
    expire(cluster, name)
    job = cluster.wait(lambda: phase_is(cluster, name, "Failed"), what="the TTL")
    assert job["status"]["reason"] == "Timeout"
    assert "BlockedByPDB" in events(cluster, name)
    still = cluster.get("pod", pods[0]["metadata"]["name"], "-n", namespace)
    assert still["metadata"]["uid"] == pods[0]["metadata"]["uid"]
    cluster.wait(
        lambda: not leftovers(cluster, namespace)["placeholders"], what="the placeholder to go"
    )


def test_a_place_whose_eviction_is_refused_is_closed_to_the_workloads_other_replacements(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    """Two jobs of one Deployment: a PDB covering the first one's pod alone refuses its
    eviction, the second one's pod is evicted. The first one's Reservation, created and
    opened first, is closed while its pod stays, so the second one's replacement takes
    the second one's place, not the place of a pod that never left (which would have
    left the second one's place held for nobody and the first job with no place). Once
    the PDB goes, the first pod moves to its own place."""
    restart_controller("arbitrationArgs:\n  enabled: false\n")
    cluster.apply(deployment("pair", replicas=2, cpu="100m"), namespace)
    held, free = cluster.wait(lambda: ready_pods(cluster, namespace, "pair", 2), what="2 pods")
    cluster.kubectl("label", "pod", held["metadata"]["name"], "hold=yes", "-n", namespace)
    budget(cluster, namespace, "hold", {"hold": "yes"}, min_available=1)
    first, manifest = job_manifest(held, ttl=LONG_TTL)
    cluster.apply(manifest)

    cluster.wait(
        lambda: refused_and_closed(cluster, first),
        what="the first eviction refused, its Reservation closed",
    )
    second, manifest = job_manifest(free, ttl=LONG_TTL)
    cluster.apply(manifest)
    done = cluster.wait(lambda: phase_is(cluster, second, "Succeed", "Failed"), what="the second")
    assert done["status"]["phase"] == "Succeed", done["status"]
    on_own_place(cluster, done)
    # The first pod has not moved; its place is still its own.
    blocked = job_of(cluster, first)
    assert blocked["status"]["phase"] == "Running", blocked["status"]
    still = cluster.get("pod", held["metadata"]["name"], "-n", namespace)
    assert still["metadata"]["uid"] == held["metadata"]["uid"]
    reservation = cluster.get("reservation", blocked["metadata"]["uid"])
    assert reservation["status"]["phase"] == "Available", reservation["status"]
    assert not reservation["status"].get("currentOwners"), reservation["status"]
    cluster.kubectl("delete", "pdb", "hold", "-n", namespace)
    done = cluster.wait(lambda: phase_is(cluster, first, "Succeed", "Failed"), what="the first")
    assert done["status"]["phase"] == "Succeed", done["status"]
    on_own_place(cluster, done)


def test_a_pod_the_workload_made_while_the_place_was_closed_is_not_taken_for_a_bypass(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    """While a PDB refuses the eviction (the Reservation closed), the Deployment is scaled
    up: its new pod is made without a claim, as it should be. The PDB then allows the
    eviction; in the moments before the replacement's claim shows, the controller does
    not take that older pod for a replacement that bypassed the webhook (it could not
    claim a closed place): the job waits for the claim and moves the pod to its place."""
    restart_controller("arbitrationArgs:\n  enabled: false\n")
    cluster.apply(deployment("grow", replicas=2, cpu="100m"), namespace)
    held = cluster.wait(lambda: ready_pods(cluster, namespace, "grow", 2), what="2 pods")[0]
    pdb_allows(cluster, namespace, "grow", min_available=2)
    name, manifest = job_manifest(held, ttl=LONG_TTL)
    cluster.apply(manifest)

    cluster.wait(
        lambda: refused_and_closed(cluster, name),
        what="the eviction refused, the Reservation closed",
    )
    before = {p["metadata"]["uid"] for p in ready_pods(cluster, namespace, "grow", 2)}
    cluster.kubectl("scale", "deployment", "grow", "--replicas=3", "-n", namespace)
    done = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job", timeout=120
    )
    assert done["status"]["phase"] == "Succeed", done["status"]
    on_own_place(cluster, done)
    grown = [
        p
        for p in pods(cluster, namespace, "app=grow")
        if p["metadata"]["uid"] not in before
        and p["metadata"]["name"] != done["status"]["podRef"]["name"]
    ]
    assert len(grown) == 1, grown
    assert keys.CLAIM not in (grown[0]["metadata"].get("annotations") or {})


def refused_and_closed(cluster: Cluster, name: str) -> bool:
    """Whether job `name`'s eviction was refused by a PDB and its Reservation closed."""
    job = job_of(cluster, name)
    if condition(job, "Eviction").get("reason") != "BlockedByPDB":
        return False
    reservation = cluster.get("reservation", job["metadata"]["uid"])
    annotations = reservation["metadata"].get("annotations") or {}
    return annotations.get(keys.CONSUMABLE) == keys.CLOSED


def on_own_place(cluster: Cluster, job: dict[str, Any]) -> None:
    """The job's replacement runs on its own Reservation's node, having taken that one."""
    reservation = cluster.get("reservation", job["metadata"]["uid"])
    namespace = job["spec"]["podRef"]["namespace"]
    new = cluster.get("pod", job["status"]["podRef"]["name"], "-n", namespace)
    allocated = json.loads(new["metadata"]["annotations"][keys.RESERVATION_ALLOCATED])
    assert allocated["name"] == reservation["metadata"]["name"], (allocated, job["status"])
    assert new["spec"]["nodeName"] == reservation["status"]["nodeName"]


def pdb_allows(cluster: Cluster, namespace: str, app: str, *, min_available: int) -> None:
    """PodDisruptionBudget `app` over the pods of `app`, with `min_available`."""
    budget(cluster, namespace, app, {"app": app}, min_available=min_available)


def budget(
    cluster: Cluster, namespace: str, name: str, labels: dict[str, str], *, min_available: int
) -> None:
    """PodDisruptionBudget `name` over the pods with `labels`, once its status counts
    `min_available` (the disruption controller writes the whole status at once)."""
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": name},
                "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}},
            }
        ),
        namespace,
    )
    cluster.wait(
        lambda: (
            cluster.get("pdb", name, "-n", namespace).get("status", {}).get("desiredHealthy")
            == min_available
        ),
        what=f"PDB {name} to require {min_available} pods",
    )


def blocked_by_pdb(
    cluster: Cluster, namespace: str, app: str, pods: list[dict[str, Any]]
) -> tuple[str, str]:
    """A job for the first of `pods` (all of Deployment `app`'s) whose place is reserved
    and whose eviction a PDB then refuses; its name and its Reservation's. (Arbitration
    admits no job whose PDB allows no disruption, so the PDB tightens once it is paused.)"""
    pdb_allows(cluster, namespace, app, min_available=len(pods) - 1)
    name, manifest = job_manifest(pods[0], ttl=LONG_TTL)
    admit_paused(cluster, name, manifest)
    job = cluster.wait(
        lambda: (
            (j := job_of(cluster, name))
            and condition(j, "ReservationScheduled").get("status") == "True"
            and j
        ),
        what="the place reserved, the job paused before the eviction",
    )
    options = job["spec"].get("reservationOptions") or {}
    reservation = (options.get("reservationRef") or {}).get("name") or job["metadata"]["uid"]
    pdb_allows(cluster, namespace, app, min_available=len(pods))
    cluster.kubectl("patch", "pmj", name, "--type=merge", "-p", '{"spec":{"paused":false}}')
    cluster.wait(
        lambda: condition(job_of(cluster, name), "Eviction").get("reason") == "BlockedByPDB",
        what="the eviction refused by the PDB",
    )
    return name, reservation


def ends_scaled_down(cluster: Cluster, namespace: str, name: str, reservation: str) -> str:
    """Wait for job `name` to end `WorkloadScaledDown`, saying so in an event, with its
    Reservation released and its placeholder gone; its message."""
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    status = job["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "WorkloadScaledDown"), status
    assert "WorkloadScaledDown" in events(cluster, name)
    cluster.wait(
        lambda: cluster.get("reservation", reservation).get("status", {}).get("phase") == "Failed",
        what="the Reservation released (Failed: its placeholder goes)",
    )
    cluster.wait(
        lambda: not any(leftovers(cluster, namespace).values()), what="the placeholder to go"
    )
    return str(status["message"])


def test_a_workload_scaled_to_zero_after_the_eviction_releases_the_place_at_once(
    cluster: Cluster, namespace: str
) -> None:
    """The Reservation is open and the eviction refused by a PDB when the Deployment is
    scaled to zero: its pod goes, and no replacement will ever take the place. The job
    ends `WorkloadScaledDown` then, rather than holding the place for nobody until its
    TTL, and the Reservation is released."""
    cluster.apply(deployment("shrink", replicas=2), namespace)
    pods = cluster.wait(lambda: ready_pods(cluster, namespace, "shrink", 2), what="2 pods")
    name, reservation = blocked_by_pdb(cluster, namespace, "shrink", pods)
    cluster.kubectl("scale", "deployment", "shrink", "--replicas=0", "-n", namespace)
    message = ends_scaled_down(cluster, namespace, name, reservation)
    assert "Deployment shrink is scaled to zero" in message


def test_a_replicaset_scaled_down_after_the_eviction_releases_the_place_at_once(
    cluster: Cluster, namespace: str
) -> None:
    """The eviction is refused by a PDB when the Deployment is scaled from 3 to 2: its
    ReplicaSet deletes the pod being migrated (the lowest deletion cost) and runs its two
    others, so no replacement will take the place. The job ends `WorkloadScaledDown` then,
    rather than holding the place for nobody until its TTL, and the Reservation is
    released."""
    cluster.apply(deployment("trim", replicas=3), namespace)
    pods = cluster.wait(lambda: ready_pods(cluster, namespace, "trim", 3), what="3 pods")
    name, reservation = blocked_by_pdb(cluster, namespace, "trim", pods)
    victim = pods[0]["metadata"]["name"]
    cost = "controller.kubernetes.io/pod-deletion-cost=-1000"
    cluster.kubectl("annotate", "pod", victim, "-n", namespace, cost)
    cluster.kubectl("scale", "deployment", "trim", "--replicas=2", "-n", namespace)
    message = ends_scaled_down(cluster, namespace, name, reservation)
    assert "is scaled to 2 replicas and runs 2 pods created before Reservation" in message
    kept = {pod["metadata"]["name"] for pod in ready_pods(cluster, namespace, "trim", 2)}
    assert kept == {pod["metadata"]["name"] for pod in pods[1:]}


def test_a_replicaset_a_finished_rollout_left_behind_releases_the_place_at_once(
    cluster: Cluster, namespace: str
) -> None:
    """The eviction is refused by a PDB (the place reserved, not open) when the Deployment
    rolls out a new template, all new pods at once: they are scheduled as any pod, and
    the old ReplicaSet, scaled to zero, deletes the pod being migrated. No pod of the
    Deployment comes after that, so once the rollout is over the job ends
    `WorkloadScaledDown`, rather than holding the place for nobody until its TTL."""
    cluster.apply(deployment("roll", replicas=2), namespace)
    surge = {"rollingUpdate": {"maxSurge": "100%", "maxUnavailable": 0}}
    patch = json.dumps({"spec": {"strategy": surge}})
    cluster.kubectl("patch", "deployment", "roll", "-n", namespace, "--type=merge", "-p", patch)
    pods = cluster.wait(lambda: ready_pods(cluster, namespace, "roll", 2), what="2 pods")
    name, reservation = blocked_by_pdb(cluster, namespace, "roll", pods)
    template = {"template": {"metadata": {"annotations": {"berth.test/rollout": "2"}}}}
    patch = json.dumps({"spec": template})
    cluster.kubectl("patch", "deployment", "roll", "-n", namespace, "--type=merge", "-p", patch)
    message = ends_scaled_down(cluster, namespace, name, reservation)
    assert message.startswith("Deployment roll has rolled out revision 2 on all its replicas")
    new = ready_pods(cluster, namespace, "roll", 2)
    assert not {pod["metadata"]["name"] for pod in new} & {pod["metadata"]["name"] for pod in pods}


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
