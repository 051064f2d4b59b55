"""A node deleted while it holds a placeholder: the place is gone, and nothing is evicted
to it.

The job is paused once admitted, so it reserves and then holds before its eviction; the
node under its placeholder is deleted; then the job is unpaused. The pod garbage
collector would remove the placeholder only after a while: until then its Reservation
must not count as Available there, or the replacement would be tied to a node that no
longer exists. The node is made again afterwards, the same size: the tests after this
one place pods on every node of the package's cluster. Once more with every controller
replica down while the node goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from berth.kube.client import Kube
from devtools.nodes import is_schedulable
from devtools.render import fake_node
from tests.e2e.faults.inject import Injector, delete_node
from tests.e2e.faults.invariants import UserFaults, judge, phase
from tests.e2e.faults.recorder import Recorder
from tests.e2e.faults.world import (
    apply_all,
    job,
    job_state,
    pdb,
    ready,
    released,
    reservation_of,
    until,
    workload,
)
from tests.e2e.kube import Cluster, WaitTimeout

pytestmark = pytest.mark.e2e


async def test_a_deleted_nodes_place_is_never_evicted_to(
    cluster: Cluster, namespace: str, kube: Kube
) -> None:
    async with Recorder(kube) as recorder:
        name, gone, size = await reserved_and_paused(cluster, namespace, recorder)
        async with node_deleted(cluster, recorder, gone, size) as faults:
            await pause(cluster, name, False)
            final = await ended_and_released(recorder, namespace, name)
    moved_off(recorder, namespace, name, final, gone=gone, faults=faults)


async def test_a_place_lost_while_a_pdb_refuses_the_eviction_is_waited_for(
    cluster: Cluster, namespace: str, kube: Kube
) -> None:
    """Berth opened the Reservation and tried to evict, a PDB refused; the node under the
    placeholder is then deleted. The job evicts nothing meanwhile and does not end (it
    wrote that Eviction condition itself): once a new placeholder holds a place elsewhere
    and the PDB allows it, the pod is evicted to there."""
    async with Recorder(kube) as recorder:
        name, gone, size = await reserved_and_paused(cluster, namespace, recorder)
        await min_available(cluster, namespace, 2)
        await pause(cluster, name, False)
        await until(
            lambda: eviction_reason(job_state(recorder, name) or {}) == "BlockedByPDB",
            what="the eviction refused by the PDB",
            timeout=120,
        )
        async with node_deleted(cluster, recorder, gone, size) as faults:
            await until(
                lambda: (
                    (r := reservation_of(recorder, name))
                    and phase(r) == "Available"
                    and r["status"]["nodeName"] != gone
                ),
                what="a new place for the Reservation",
                timeout=180,
            )
            assert phase(job_state(recorder, name) or {}) == "Running"
            await min_available(cluster, namespace, 1)
            final = await ended_and_released(recorder, namespace, name)
    moved_off(recorder, namespace, name, final, gone=gone, faults=faults)


async def test_a_node_deleted_while_no_controller_runs_is_never_evicted_to(
    cluster: Cluster, namespace: str, kube: Kube
) -> None:
    """Every controller replica is down when the node under the placeholder is deleted:
    started again, the controller finds the placeholder bound to a node its cache never
    held, which may as well be a node added moments ago. It evicts nothing on the strength
    of that place until the node counts as gone (`caches.NODE_GRACE`), then moves the pod
    to a place elsewhere."""
    injector = Injector(cluster)
    async with Recorder(kube) as recorder:
        name, gone, size = await reserved_and_paused(cluster, namespace, recorder)
        replicas = [
            c.name for c in cluster.local.running() if c.name.startswith("berth-controller")
        ]
        try:
            for replica in replicas:
                await injector.kill(replica, why="(every replica)")
            async with node_deleted(cluster, recorder, gone, size) as faults:
                await pause(cluster, name, False)
                await cluster.await_(
                    lambda: (
                        not cluster.kubectl(
                            "get", "node", gone, "--ignore-not-found", "-o", "name"
                        ).stdout
                    ),
                    what=f"node {gone} to be gone",
                    timeout=120,
                )
                await injector.restart_all()
                final = await ended_and_released(recorder, namespace, name)
        finally:
            await injector.restart_all()
    moved_off(recorder, namespace, name, final, gone=gone, faults=faults)


async def reserved_and_paused(
    cluster: Cluster, namespace: str, recorder: Recorder
) -> tuple[str, str, dict[str, str]]:
    """A Deployment of 2 behind a PDB allowing 1, and a job for one of its pods, admitted
    and then paused once its Reservation is created, before it is placed; then the
    Reservation Available: the job, the Reservation's node and that node's allocatable
    (to make it again)."""
    await cluster.aapply(json.dumps(workload("Deployment", "web", replicas=2)), namespace)
    await cluster.aapply(json.dumps(pdb("web", 1)), namespace)
    await until(lambda: len(ready(recorder, namespace, "web")) == 2, what="2 pods", timeout=120)
    pod = sorted(ready(recorder, namespace, "web"), key=lambda p: p["metadata"]["name"])[0]
    name, body = job(pod, ttl="4m")
    # Every node cordoned until the job is paused, so that its placeholder is not placed
    # (and nothing evicted) before; a job paused before its Reservation is created creates
    # none until resumed.
    nodes = [n["metadata"]["name"] for n in (await cluster.aget("nodes"))["items"]]
    await cluster.akubectl("cordon", *nodes)
    try:
        await asyncio.to_thread(apply_all, cluster, [body])
        await until(
            lambda: reservation_of(recorder, name) is not None,
            what="the job admitted and its Reservation created",
            timeout=120,
        )
        await pause(cluster, name, True)
    finally:
        await cluster.akubectl("uncordon", *nodes)
    reservation = await until(
        lambda: (r := reservation_of(recorder, name)) and phase(r) == "Available" and r,
        what="the Reservation Available",
        timeout=120,
    )
    gone = reservation["status"]["nodeName"]
    size = (await asyncio.to_thread(cluster.get, "node", gone))["status"]["allocatable"]
    return name, gone, size


async def ended_and_released(recorder: Recorder, namespace: str, name: str) -> dict[str, Any]:
    """The job's last state once it ended (and, if that comes in time, released all)."""
    await until(
        lambda: phase(job_state(recorder, name) or {}) in ("Succeed", "Failed"),
        what="the job to end",
        timeout=180,
    )
    with contextlib.suppress(WaitTimeout):
        await until(lambda: released(recorder, namespace, [name]), what="all released", timeout=60)
    return job_state(recorder, name) or {}


def moved_off(
    recorder: Recorder,
    namespace: str,
    name: str,
    final: dict[str, Any],
    *,
    gone: str,
    faults: UserFaults,
) -> None:
    """The job succeeded on a node other than the deleted one, one eviction, no invariant
    broken."""
    status = final.get("status") or {}
    assert (phase(final), status.get("reason") or "") == ("Succeed", ""), status
    assert status["nodeName"] != gone
    verdict = judge(
        recorder.ordered(),
        jobs=[name],
        namespaces={namespace},
        min_available={f"{namespace}/web": 1},
        faults=faults,
    )
    assert not verdict.failures(), verdict.failures()
    assert verdict.evictions == 1


def eviction_reason(job: dict[str, Any]) -> str | None:
    conditions = (job.get("status") or {}).get("conditions") or []
    found: dict[str, Any] = next((c for c in conditions if c.get("type") == "Eviction"), {})
    return found.get("reason")


async def min_available(cluster: Cluster, namespace: str, count: int) -> None:
    await cluster.akubectl(
        "patch", "pdb", "web", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"minAvailable": count}}),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def node_deleted(
    cluster: Cluster, recorder: Recorder, name: str, size: dict[str, str]
) -> AsyncIterator[UserFaults]:
    """Delete node `name`, telling the judge when, and make it again afterwards."""
    faults = UserFaults(deleted_nodes={name: await delete_node(recorder.kube, name)})
    try:
        yield faults
    finally:
        await restore(cluster, name, size)


async def restore(cluster: Cluster, name: str, size: dict[str, str]) -> None:
    """Make the deleted node again, as the cluster made it, and wait until pods may land."""
    await cluster.await_(
        lambda: not cluster.kubectl("get", "node", name, "--ignore-not-found", "-o", "name").stdout,
        what=f"node {name} to be gone",
        timeout=120,
    )
    node = fake_node(name=name, cpu=size["cpu"], memory=size["memory"], pods=int(size["pods"]))
    await cluster.akubectl("create", "-f", "-", input=json.dumps(node))
    await cluster.await_(
        lambda: is_schedulable(cluster.get("node", name)),
        what=f"node {name} Ready again",
        timeout=120,
    )


async def pause(cluster: Cluster, name: str, paused: bool) -> None:
    await cluster.akubectl(
        "patch", "pmj", name, "--type=merge", "-p", json.dumps({"spec": {"paused": paused}})
    )
