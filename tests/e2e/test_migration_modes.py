"""Eviction policies, delete options, StatefulSets and concurrent migrations."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator

import pytest

from berth.api import keys
from berth.kube.client import PODS, Kube
from berth.protocol import is_ready
from tests.e2e.kube import DEFAULT_TIMEOUT, Cluster, pods
from tests.e2e.migrate import (
    condition,
    deployment,
    job_manifest,
    job_of,
    leftovers,
    phase_is,
    ready_pods,
    statefulset,
)

pytestmark = pytest.mark.e2e


def test_delete_policy_deletes_even_where_a_pdb_forbids_eviction(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    # Arbitration would hold the job for the PDB; off, the policy alone decides.
    restart_controller("evictionPolicy: Delete\narbitrationArgs:\n  enabled: false\n")
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "web"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
            }
        ),
        namespace,
    )
    cluster.wait(
        lambda: (
            cluster.get("pdb", "web", "-n", namespace).get("status", {}).get("currentHealthy") == 1
        ),
        what="the PDB to count the pod",
    )
    name, manifest = job_manifest(pod)
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    assert job["status"]["phase"] == "Succeed", job["status"]
    assert condition(job, "Eviction")["reason"] == "EvictComplete"


def test_soft_eviction_only_marks_the_pod_and_waits_for_its_removal(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    restart_controller("evictionPolicy: SoftEviction\n")
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name, manifest = job_manifest(pod)
    cluster.apply(manifest)
    key = "scheduling.koordinator.sh/soft-eviction"
    marked = cluster.wait(
        lambda: (
            (p := cluster.get("pod", pod["metadata"]["name"], "-n", namespace))["metadata"]
            .get("annotations", {})
            .get(key)
            and p
        ),
        what="the soft-eviction mark",
    )
    assert json.loads(marked["metadata"]["annotations"][key])["reason"]
    assert not marked["metadata"].get("deletionTimestamp")
    assert job_of(cluster, name)["status"]["phase"] == "Running"
    # Whoever honours soft evictions now removes the pod; the migration completes.
    cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", namespace, "--wait=false")
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    assert job["status"]["phase"] == "Succeed", job["status"]


async def test_delete_options_grace_period_reaches_the_pod(
    cluster: Cluster, namespace: str
) -> None:
    await cluster.aapply(deployment("web"), namespace)
    pod = (await cluster.await_(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod"))[
        0
    ]
    kube = await Kube.connect(cluster.kubeconfig)
    try:
        listed = await kube.list(PODS, namespace=namespace)
        watch = kube.watch(
            PODS, namespace=namespace, resource_version=listed["metadata"]["resourceVersion"]
        )
        name, manifest = job_manifest(pod, deleteOptions={"gracePeriodSeconds": 60})
        await cluster.aapply(manifest)
        # The first update that marks the pod for deletion carries the grace period asked
        # for (kwok then finishes the deletion at once, as a kubelet would after it).
        marked = None
        async with asyncio.timeout(DEFAULT_TIMEOUT):
            async for event in watch:
                metadata = event["object"]["metadata"]
                if metadata.get("uid") == pod["metadata"]["uid"] and metadata.get(
                    "deletionTimestamp"
                ):
                    marked = metadata
                    break
        assert marked is not None, "the watch ended before the pod was marked for deletion"
        assert marked["deletionGracePeriodSeconds"] == 60
    finally:
        await kube.close()
    job = await cluster.await_(
        lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end"
    )
    assert job["status"]["phase"] == "Succeed", job["status"]


def test_statefulset_pod_keeps_its_name_and_lands_in_its_reservation(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(statefulset("db"), namespace)
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "db", 1), what="db-0")[0]
    assert old["metadata"]["name"] == "db-0"
    name, manifest = job_manifest(old)
    cluster.apply(manifest)
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    assert job["status"]["phase"] == "Succeed", job["status"]
    new = cluster.get("pod", "db-0", "-n", namespace)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert job["status"]["podRef"]["uid"] == new["metadata"]["uid"]
    assert new["spec"]["nodeName"] == job["status"]["nodeName"] != old["spec"]["nodeName"]
    assert not any(leftovers(cluster, namespace).values())


def test_a_workload_deleted_after_the_eviction_releases_the_place_at_once(
    cluster: Cluster, namespace: str
) -> None:
    """A StatefulSet's pod is evicted (a finalizer holds it, terminating, for the test),
    and the StatefulSet is deleted: no replacement will come, so the job, which has no
    TTL, ends `WorkloadScaledDown` once the pod is gone, and its Reservation and the
    namespace's label go with it, rather than being held for a day."""
    cluster.apply(statefulset("gone"), namespace)
    [old] = cluster.wait(lambda: ready_pods(cluster, namespace, "gone", 1), what="gone-0")
    hold = '{"metadata": {"finalizers": ["berth.sh/test-hold"]}}'
    cluster.kubectl("patch", "pod", "gone-0", "-n", namespace, "--type=merge", "-p", hold)
    name, manifest = job_manifest(old, ttl=None)
    cluster.apply(manifest)
    try:
        cluster.wait(
            lambda: bool(
                cluster.get("pod", "gone-0", "-n", namespace)["metadata"].get("deletionTimestamp")
            ),
            what="the pod to be evicted",
        )
        cluster.kubectl("delete", "statefulset", "gone", "-n", namespace, "--wait=false")
    finally:
        cluster.kubectl(
            "patch", "pod", "gone-0", "-n", namespace, "--type=json",
            "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]', check=False,
        )  # fmt: skip
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    status = job["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "WorkloadScaledDown"), status
    assert status["message"].startswith("StatefulSet gone (uid ")
    reservation = job["metadata"]["uid"]

    def released() -> bool:
        found = cluster.kubectl("get", "reservation", reservation, "-o", "json", check=False)
        phase = json.loads(found.stdout).get("status", {}).get("phase") if found.stdout else None
        labels = cluster.get("namespace", namespace)["metadata"].get("labels") or {}
        return phase in (None, "Failed") and keys.MIGRATING_LABEL not in labels

    cluster.wait(released, what="the Reservation and the namespace's label to go")
    assert not any(leftovers(cluster, namespace).values())


@pytest.fixture
def second_webhook(cluster: Cluster) -> Iterator[None]:
    replica = cluster.local.start_webhook(name="berth-webhook-2")
    yield
    cluster.local.stop(replica)
    cluster.local.register_webhooks()


@pytest.mark.usefixtures("second_webhook")
def test_two_migrations_of_one_deployment_get_different_reservations(
    cluster: Cluster, namespace: str
) -> None:
    configuration = cluster.get("mutatingwebhookconfiguration", "berth")
    assert len(configuration["webhooks"]) == 2
    cluster.apply(deployment("web", replicas=2), namespace)
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 2), what="2 pods")
    names = []
    for pod in old:
        name, manifest = job_manifest(pod)
        cluster.apply(manifest)
        names.append(name)
    jobs = [
        cluster.wait(
            functools.partial(phase_is, cluster, n, "Succeed", "Failed"), what=f"job {n} to end"
        )
        for n in names
    ]
    assert [j["status"]["phase"] for j in jobs] == ["Succeed", "Succeed"], [
        j["status"] for j in jobs
    ]
    new_pods = [cluster.get("pod", j["status"]["podRef"]["name"], "-n", namespace) for j in jobs]
    bound = {
        json.loads(p["metadata"]["annotations"]["scheduling.koordinator.sh/reservation-allocated"])[
            "name"
        ]
        for p in new_pods
    }
    assert bound == {j["metadata"]["uid"] for j in jobs}
    assert all(is_ready(p) for p in new_pods)
    assert len(pods(cluster, namespace, "app=web")) == 2
    assert not any(leftovers(cluster, namespace).values())
