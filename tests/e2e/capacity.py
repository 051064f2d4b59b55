"""Shaping the free capacity of the session's three 8-CPU kwok nodes, and Reservations
taken through the controller's handover by hand: the owner is recorded the way the
controller records a claimer, and held unbound by a gate of the test's own."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from berth.api import keys
from berth.resources import parse_quantity, pod_requests
from tests.e2e.kube import Cluster

NODES = ["node-0", "node-1", "node-2"]
PAUSE = "registry.k8s.io/pause:3.10"
TEST_GATE = "berth.sh/test-hold"


def pod(
    name: str,
    *,
    cpu: str,
    node: str | None = None,
    scheduler: str | None = None,
    gates: tuple[str, ...] = (),
    marker: bool = False,
    priority_class: str | None = None,
) -> dict[str, Any]:
    """A bare pause pod; `marker`: it requests Berth's extended resource, as a replacement
    the webhook bound does."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu}}
    if marker:
        resources["requests"][keys.RESERVATION_RESOURCE] = "1"
        resources["limits"] = {keys.RESERVATION_RESOURCE: "1"}
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": PAUSE, "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    if gates:
        spec["schedulingGates"] = [{"name": gate} for gate in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def cpu_in_use(cluster: Cluster) -> dict[str, Decimal]:
    """CPU requested on each node by pods bound there, other tests' leftovers included."""
    used = {node: Decimal(0) for node in NODES}
    for item in cluster.get("pods", "--all-namespaces")["items"]:
        node = item["spec"].get("nodeName")
        if node in used and item["status"].get("phase") not in ("Succeeded", "Failed"):
            used[node] += pod_requests(item["spec"]).get("cpu", Decimal(0))
    return used


async def shape_free_cpu(cluster: Cluster, namespace: str, free: dict[str, str]) -> None:
    """Fill each node with one pinned pod so that exactly `free` CPU is left on it."""

    def settled() -> bool:  # pods of earlier tests still terminating would free CPU later
        leaving = {
            item["metadata"]["name"]
            for item in cluster.get("namespaces")["items"]
            if item["metadata"].get("deletionTimestamp")
        }
        return not any(
            item["metadata"].get("deletionTimestamp") or item["metadata"]["namespace"] in leaving
            for item in cluster.get("pods", "--all-namespaces")["items"]
        )

    await cluster.await_(settled, what="terminating pods to be gone")
    used = await asyncio.to_thread(cpu_in_use, cluster)
    for node, left in free.items():
        fill = Decimal(8) - used[node] - parse_quantity(left)
        assert fill >= 0, f"{node} has only {8 - used[node]} CPU free"
        if fill:
            await cluster.aapply(
                json.dumps(pod(f"fill-{node}", cpu=f"{int(fill * 1000)}m", node=node)), namespace
            )


async def reserve(
    cluster: Cluster,
    namespace: str,
    name: str,
    *,
    node: str,
    cpu: str,
    scheduler: str,
    owners: tuple[dict[str, Any], ...] = (),
) -> None:
    """A Reservation whose placeholder the controller creates; pinned to `node`. Its
    owners: the pod named `owner` (made by `hand_over`), and `owners` (the pod a job
    naming it migrates: a job uses only a Reservation whose owners take its pod)."""
    await cluster.aapply(
        json.dumps(
            {
                "apiVersion": "scheduling.koordinator.sh/v1alpha1",
                "kind": "Reservation",
                "metadata": {"name": name},
                "spec": {
                    "template": {
                        "metadata": {"namespace": namespace},
                        "spec": {
                            "schedulerName": scheduler,
                            "nodeSelector": {"kubernetes.io/hostname": node},
                            "containers": [
                                {
                                    "name": "app",
                                    "image": PAUSE,
                                    "resources": {"requests": {"cpu": cpu}},
                                }
                            ],
                        },
                    },
                    "owners": [{"object": {"name": "owner", "namespace": namespace}}, *owners],
                    "ttl": "10m",
                },
            }
        )
    )

    def available() -> bool:
        status = cluster.get("reservation", name).get("status", {})
        return bool(status.get("phase") == "Available" and status.get("nodeName") == node)

    await cluster.await_(available, what=f"Reservation {name} to be Available on {node}")


async def hand_over(
    cluster: Cluster, namespace: str, reservation: str, *, cpu: str, scheduler: str
) -> dict[str, Any]:
    """Create the owner, gated, and record it as the controller does after a claim; the
    controller then nominates it to the Reservation's node, deletes the placeholder and
    removes Berth's gate. The test's own gate keeps the owner unbound: the Reservation
    stays in handover until the test lifts it (`lift`)."""
    await cluster.aapply(
        json.dumps(
            pod(
                "owner",
                cpu=cpu,
                scheduler=scheduler,
                gates=(keys.RESERVATION_GATE, TEST_GATE),
                marker=True,
            )
        ),
        namespace,
    )
    owner = await cluster.aget("pod", "owner", "-n", namespace)
    reference = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "owner",
        "namespace": namespace,
        "uid": owner["metadata"]["uid"],
    }
    await cluster.akubectl(
        "patch",
        "reservation",
        reservation,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"currentOwners": [reference]}}),
    )

    def handed_over() -> dict[str, Any] | None:
        current = cluster.get("pod", "owner", "-n", namespace)
        placeholders = cluster.get(
            "pods", "-n", namespace, f"-l={keys.RESERVATION_LABEL}={reservation}"
        )["items"]
        gates = current["spec"].get("schedulingGates")
        return current if gates == [{"name": TEST_GATE}] and not placeholders else None

    handed: dict[str, Any] = await cluster.await_(
        handed_over, what="the controller to hand the Reservation over"
    )
    return handed


async def lift(cluster: Cluster, namespace: str, name: str) -> None:
    """Remove the test's gate (the last one) from pod `name`."""
    await cluster.akubectl(
        "patch",
        "pod",
        name,
        "-n",
        namespace,
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/spec/schedulingGates"}]',
    )


def bound_node(cluster: Cluster, namespace: str, name: str) -> str | None:
    node: str | None = cluster.get("pod", name, "-n", namespace)["spec"].get("nodeName")
    return node


@contextmanager
def priority_class(cluster: Cluster, *, value: int) -> Iterator[str]:
    """A PriorityClass of `value` (cluster-scoped), deleted when the block ends. Its pods
    preempt no one (preemptionPolicy Never): a test pod takes only free capacity."""
    name = f"berth-test-{uuid.uuid4().hex[:6]}"
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "preemptionPolicy": "Never",
            }
        )
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "priorityclass", name, "--ignore-not-found")
