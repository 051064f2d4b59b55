"""Arbitration on the real control plane: availability, per-node limits, rollouts; and a
decision is written only on the job as the round read it."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from berth.api import keys
from berth.kube.client import PODMIGRATIONJOBS, Kube
from berth.kube.events import Recorder
from berth.protocol import is_ready
from controller import jobs
from controller.arbitration import Decision
from controller.executor import Executor
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import (
    deployment,
    job_manifest,
    job_of,
    pending_with,
    phase_is,
    ready_pods,
)

pytestmark = pytest.mark.e2e


@contextmanager
def sampling(sample: Callable[[], Any]) -> Iterator[list[Any]]:
    """Call `sample` in the background, as often as it answers, until the block ends."""
    samples: list[Any] = []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            samples.append(sample())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(timeout=30)


def finished(cluster: Cluster, names: list[str]) -> list[dict[str, Any]] | None:
    jobs = [job_of(cluster, name) for name in names]
    done = [j for j in jobs if j.get("status", {}).get("phase") in ("Succeed", "Failed", "Aborted")]
    return jobs if len(done) == len(jobs) else None


def test_thirty_jobs_never_take_more_than_the_pdb_allows(cluster: Cluster, namespace: str) -> None:
    replicas = 10
    cluster.apply(deployment("web", replicas=replicas, cpu="100m"), namespace)
    cluster.wait(
        lambda: ready_pods(cluster, namespace, "web", replicas), what="10 pods", timeout=90
    )
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "web"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
            }
        ),
        namespace,
    )
    cluster.wait(
        lambda: (
            cluster.get("pdb", "web", "-n", namespace).get("status", {}).get("currentHealthy")
            == replicas
        ),
        what="the PDB to count the pods",
    )

    def unavailable() -> int:
        current = [
            p
            for p in pods(cluster, namespace, "app=web")
            if is_ready(p) and not p["metadata"].get("deletionTimestamp")
        ]
        return replicas - len(current)

    results: list[dict[str, Any]] = []
    with sampling(unavailable) as samples:
        for _ in range(3):  # three waves of ten: every pod, then every replacement
            names = []
            for pod in cluster.wait(
                lambda: ready_pods(cluster, namespace, "web", replicas), what="all replicas ready"
            ):
                name, manifest = job_manifest(pod, ttl="5m")
                cluster.apply(manifest)
                names.append(name)
            results += cluster.wait(
                functools.partial(finished, cluster, names),
                what="a wave of ten jobs to finish",
                timeout=240,
            )
    assert [j["status"]["phase"] for j in results] == ["Succeed"] * 30, [
        j["status"] for j in results if j["status"]["phase"] != "Succeed"
    ]
    assert len(samples) > 50
    assert max(samples) <= 1, f"{max(samples)} pods were unavailable at once"


def test_per_node_limit_holds_and_says_why(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    # No eviction rate limit, so that the per-node limit is what holds the jobs back.
    restart_controller("evictQPS: 0\n")
    node, others = "node-1", ["node-0", "node-2"]
    for name in others:
        cluster.kubectl("cordon", name)
    try:
        for index in range(12):
            cluster.apply(deployment(f"app-{index}", cpu="50m"), namespace)
        cluster.wait(
            lambda: len([p for p in pods(cluster, namespace) if is_ready(p)]) == 12,
            what="12 pods on node-1",
        )
    finally:
        for name in others:
            cluster.kubectl("uncordon", name)
    targets = pods(cluster, namespace)
    assert {p["spec"]["nodeName"] for p in targets} == {node}
    names = []
    for pod in targets:
        name, manifest = job_manifest(pod, ttl="5m")
        cluster.apply(manifest)
        names.append(name)
    reasons: set[str] = set()

    def in_flight() -> int:
        jobs = [job for job in cluster.get("pmj")["items"] if job["metadata"]["name"] in names]
        reasons.update(
            job.get("status", {}).get("reason", "")
            for job in jobs
            if job.get("status", {}).get("phase", "Pending") == "Pending"
        )
        return sum(job.get("status", {}).get("phase") == "Running" for job in jobs)

    with sampling(in_flight) as samples:
        jobs = cluster.wait(
            lambda: finished(cluster, names), what="the 12 jobs to finish", timeout=240
        )
    assert [j["status"]["phase"] for j in jobs] == ["Succeed"] * 12
    assert max(samples) <= 2, f"{max(samples)} migrations ran on one node at once"
    assert "MaxMigratingPerNode" in reasons, reasons


def test_rollout_in_progress_holds_the_job(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("web", replicas=3, cpu="100m"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 3), what="3 pods")[0]
    # A paused rollout stays in progress: the new template is there, no pod runs it yet.
    cluster.kubectl("rollout", "pause", "deployment/web", "-n", namespace)
    cluster.kubectl("set", "env", "deployment/web", "-n", namespace, "ROLLOUT=1")
    name, manifest = job_manifest(pod, ttl="2m")
    cluster.apply(manifest)
    job = cluster.wait(
        lambda: pending_with(cluster, name, "RolloutInProgress"), what="arbitration to hold the job"
    )
    assert job["status"].get("phase", "Pending") == "Pending"
    assert f"Deployment {namespace}/web is rolling out" in job["status"]["message"]
    cluster.kubectl("rollout", "resume", "deployment/web", "-n", namespace)
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s")
    # Once the rollout is done the job is no longer held; its pod was one the rollout
    # replaced, so it fails as MissingPod (or, if the round saw the pod still going, as
    # forbidden because it is terminating) rather than migrating a pod that is gone.
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to be released"
    )
    assert job["status"]["phase"] == "Failed", job["status"]
    outcome = (job["status"]["reason"], job["status"].get("message", ""))
    assert outcome[0] == "MissingPod" or outcome == (
        "ForbiddenMigratePod",
        "pod is terminating",
    ), job["status"]


def test_priority_threshold_reads_the_named_priority_class(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    """priorityThreshold.name is resolved from the PriorityClasses the controller watches:
    a pod at the threshold's priority is refused, a pod below it migrates."""
    threshold = f"{namespace}-threshold"
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": threshold},
                "value": 1000,
            }
        )
    )
    try:
        restart_controller(f"evictQPS: 0\npriorityThreshold:\n  name: {threshold}\n")
        cluster.apply(deployment("low", cpu="50m"), namespace)
        cluster.apply(
            deployment("high", cpu="50m", spec_extra={"priorityClassName": threshold}), namespace
        )
        low = cluster.wait(lambda: ready_pods(cluster, namespace, "low", 1), what="low")[0]
        high = cluster.wait(lambda: ready_pods(cluster, namespace, "high", 1), what="high")[0]
        assert high["spec"]["priority"] == 1000
        names = []
        for pod in (low, high):
            name, manifest = job_manifest(pod)
            cluster.apply(manifest)
            names.append(name)
        low_job = cluster.wait(
            lambda: phase_is(cluster, names[0], "Succeed", "Failed"),
            what="the job of the low-priority pod",
            timeout=120,
        )
        high_job = cluster.wait(
            lambda: phase_is(cluster, names[1], "Succeed", "Failed"),
            what="the job of the pod at the threshold",
        )
    finally:
        cluster.kubectl("delete", "priorityclass", threshold, "--ignore-not-found")
    assert low_job["status"]["phase"] == "Succeed", low_job["status"]
    assert (high_job["status"]["phase"], high_job["status"]["reason"]) == (
        "Failed",
        "ForbiddenMigratePod",
    )
    assert "pod priority 1000 is not below priorityThreshold 1000" in high_job["status"]["message"]


def test_dry_run_decides_and_creates_nothing(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    """With dryRun the job records that arbitration would start it, and nothing happens:
    no Reservation, no placeholder, the pod untouched. Without dryRun the same job runs."""
    restart_controller("dryRun: true\nevictQPS: 0\n")
    cluster.apply(deployment("web", cpu="50m"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="web")[0]
    name, manifest = job_manifest(pod, ttl="5m")
    cluster.apply(manifest)
    job = cluster.wait(
        lambda: pending_with(cluster, name, "DryRun"), what="the dry run's decision on the job"
    )
    assert job["status"].get("phase", "Pending") == "Pending"
    assert "nothing is reserved or evicted" in job["status"]["message"]
    events = cluster.get("events", "-A", "--field-selector", f"involvedObject.name={name}")
    assert "DryRun" in {e["reason"] for e in events["items"]}
    assert [
        r
        for r in cluster.get("reservations")["items"]
        if r["metadata"]["name"] == job["metadata"]["uid"]
    ] == []
    assert [p["metadata"]["uid"] for p in pods(cluster, namespace)] == [pod["metadata"]["uid"]]

    restart_controller("dryRun: false\nevictQPS: 0\n")
    done = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"),
        what="the job, once dryRun is off",
        timeout=120,
    )
    assert (done["status"]["phase"], done["status"]["status"]) == ("Succeed", "Complete")


def test_node_fit_holds_a_job_until_another_node_fits(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    """nodeFit: while no other node is schedulable the job waits (NodeFit); once one is,
    with room for the pod as the watches count it, the job runs."""
    restart_controller("nodeFit: true\nevictQPS: 0\n")
    cluster.apply(deployment("web", cpu="500m"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="web")[0]
    others = [
        n["metadata"]["name"]
        for n in cluster.get("nodes")["items"]
        if n["metadata"]["name"] != pod["spec"]["nodeName"]
    ]
    for node in others:
        cluster.kubectl("cordon", node)
    try:
        name, manifest = job_manifest(pod, ttl="5m")
        cluster.apply(manifest)
        job = cluster.wait(
            lambda: pending_with(cluster, name, "NodeFit"), what="nodeFit to hold the job"
        )
        assert job["status"].get("phase", "Pending") == "Pending"
        assert "cpu 500m" in job["status"]["message"]
    finally:
        for node in others:
            cluster.kubectl("uncordon", node)
    done = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"),
        what="the job, once another node fits",
        timeout=120,
    )
    assert done["status"]["phase"] == "Succeed", done["status"]
    assert done["status"]["nodeName"] in others


async def test_an_admission_of_a_job_changed_since_the_round_read_it_is_refused(
    kube: Kube, namespace: str
) -> None:
    # A paused job, which the session's controller leaves Pending, for a pod that need
    # not exist: only the write of the decision is under test.
    name, manifest = job_manifest(
        {"metadata": {"namespace": namespace, "name": "web-0"}}, paused=True
    )
    read = await kube.create(PODMIGRATIONJOBS, json.loads(manifest))
    # The job changes after the round read it.
    await kube.patch(PODMIGRATIONJOBS, name, {"metadata": {"labels": {"edited": "yes"}}})
    pod = {"metadata": {"namespace": namespace, "name": "web-0", "uid": "uid-web-0"}, "spec": {}}
    plan = jobs.admission(
        Decision(read, "admit", pod=pod), workload_uid=None, dry_run=False, key=b"k" * 32
    )
    executor = Executor(kube, Recorder(kube, component="berth-e2e", instance="e2e"))
    outcome = await executor.run(plan)
    assert (outcome.done, outcome.conflict) == (False, True)
    now = await kube.get(PODMIGRATIONJOBS, name)
    assert keys.ADMISSION not in (now["metadata"].get("annotations") or {})
    assert (now.get("status") or {}).get("phase") != "Running"
