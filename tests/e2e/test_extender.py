"""The extender, as a real process, steers a real kube-scheduler.

A second kube-scheduler (its own schedulerName) is configured with the extender, which
runs as `python -m extender` against the session's cluster. The tests shape the free
capacity of the three 8-CPU kwok nodes with pods pinned by nodeName, and drive
Reservations through the session's Berth controller, which creates their placeholders
and does the handover once the test records an owner in `status.currentOwners` (the
step the webhook's claim leads to). The owner also carries a gate of the test's own, so
that it stays unbound, and the Reservation in handover, for as long as the test needs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from berth.api import keys
from berth.resources import parse_quantity, pod_requests
from devtools.processes import free_port
from tests.e2e.kube import Cluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NODES = ["node-0", "node-1", "node-2"]
PAUSE = "registry.k8s.io/pause:3.10"
TEST_GATE = "berth.sh/test-hold"


@dataclass(frozen=True)
class Scheduling:
    scheduler_name: str
    extender_url: str


@pytest.fixture(scope="module")
def extender_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("extender") / "extender.log"


@pytest.fixture(scope="module")
async def scheduling(cluster: Cluster, extender_log: Path) -> AsyncIterator[Scheduling]:
    """The extender on a free port (plain HTTP, asked for with --insecure), and a
    scheduler that calls it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with extender_log.open("w") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "extender",
            f"--kubeconfig={cluster.local.component_kubeconfig('extender')}",
            "--host=127.0.0.1",
            f"--port={port}",
            "--insecure",
            cwd=REPO,
            stdout=log,
            stderr=log,
        )
    scheduler = None
    try:

        async def ready() -> bool:
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"{url}/readyz") as response,
                ):
                    return response.status == 200
            except aiohttp.ClientError:
                assert process.returncode is None, "the extender exited"
                return False

        await cluster.await_(ready, what="the extender to be ready")
        name = f"berth-extender-test-{uuid.uuid4().hex[:5]}"
        extender = {
            "urlPrefix": url,
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "preemptVerb": "preempt",
            "weight": 1,
            "nodeCacheCapable": True,
            # Not ignorable here, so that an extender failure shows in the test.
            "ignorable": False,
            "httpTimeout": "5s",
        }
        scheduler = await asyncio.to_thread(
            cluster.local.start_scheduler, name=name, scheduler_name=name, extenders=[extender]
        )
        yield Scheduling(scheduler_name=name, extender_url=url)
    finally:
        if scheduler is not None:
            await asyncio.to_thread(cluster.local.stop, scheduler)
        process.terminate()
        await asyncio.wait_for(process.wait(), 10)


@pytest.fixture(autouse=True)
def show_extender_log(extender_log: Path) -> Iterator[None]:
    """On failure, the extender's log is in the captured output."""
    yield
    if extender_log.exists():
        print(extender_log.read_text()[-4000:])


def pod(
    name: str,
    *,
    cpu: str,
    node: str | None = None,
    scheduler: str | None = None,
    gates: tuple[str, ...] = (),
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": PAUSE, "resources": {"requests": {"cpu": cpu}}}],
        "terminationGracePeriodSeconds": 0,
    }
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
        return not any(
            item["metadata"].get("deletionTimestamp")
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
    cluster: Cluster, namespace: str, name: str, *, node: str, cpu: str, scheduler: str
) -> None:
    """A Reservation whose placeholder the controller creates; pinned to `node`."""
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
                    "owners": [{"object": {"name": "owner", "namespace": namespace}}],
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
    controller then deletes the placeholder and removes Berth's gate. The test's own gate
    keeps the owner unbound: the Reservation stays in handover until the test lifts it."""
    await cluster.aapply(
        json.dumps(
            pod("owner", cpu=cpu, scheduler=scheduler, gates=(keys.RESERVATION_GATE, TEST_GATE))
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

    def handed_over() -> bool:
        gates = cluster.get("pod", "owner", "-n", namespace)["spec"].get("schedulingGates")
        placeholders = cluster.get(
            "pods", "-n", namespace, f"-l={keys.RESERVATION_LABEL}={reservation}"
        )["items"]
        return gates == [{"name": TEST_GATE}] and not placeholders

    await cluster.await_(handed_over, what="the controller to hand the Reservation over")
    return owner


async def extender_filter(scheduling: Scheduling, pod: dict[str, Any]) -> dict[str, Any]:
    """Ask the extender directly, as the scheduler would."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{scheduling.extender_url}/filter",
            json={"Pod": pod, "Nodes": None, "NodeNames": NODES},
        ) as response,
    ):
        result: dict[str, Any] = await response.json()
        return result


def bound_node(cluster: Cluster, namespace: str, name: str) -> str | None:
    node: str | None = cluster.get("pod", name, "-n", namespace)["spec"].get("nodeName")
    return node


async def test_owner_lands_on_its_reservation_node(
    cluster: Cluster, namespace: str, scheduling: Scheduling
) -> None:
    # node-0 is the fullest; left to itself the scheduler would pick node-1 or node-2.
    await shape_free_cpu(cluster, namespace, {"node-0": "3", "node-1": "7", "node-2": "7"})
    reservation = f"{namespace}-owner"
    try:
        await reserve(
            cluster,
            namespace,
            reservation,
            node="node-0",
            cpu="2",
            scheduler=scheduling.scheduler_name,
        )
        owner = await hand_over(
            cluster, namespace, reservation, cpu="2", scheduler=scheduling.scheduler_name
        )

        async def known_as_owner() -> bool:
            return bool((await extender_filter(scheduling, owner))["NodeNames"] == ["node-0"])

        await cluster.await_(known_as_owner, what="the extender to see the recorded owner")
        await cluster.akubectl(
            "patch",
            "pod",
            "owner",
            "-n",
            namespace,
            "--type=json",
            "-p",
            '[{"op": "remove", "path": "/spec/schedulingGates"}]',
        )
        node = await cluster.await_(
            lambda: bound_node(cluster, namespace, "owner"), what="the owner to be bound"
        )
        assert node == "node-0"
    finally:
        await cluster.akubectl("delete", "reservation", reservation, check=False)


async def test_capacity_in_handover_is_refused_to_other_pods(
    cluster: Cluster, namespace: str, scheduling: Scheduling
) -> None:
    # node-1: 6 CPU free as the scheduler counts once the placeholder is gone, 4 of them
    # held for the owner. node-0 and node-2: 1 CPU free.
    await shape_free_cpu(cluster, namespace, {"node-0": "1", "node-1": "6.1", "node-2": "1"})
    await cluster.aapply(json.dumps(pod("nudge", cpu="100m", node="node-1")), namespace)
    reservation = f"{namespace}-held"
    try:
        await reserve(
            cluster,
            namespace,
            reservation,
            node="node-1",
            cpu="4",
            scheduler=scheduling.scheduler_name,
        )
        await hand_over(
            cluster, namespace, reservation, cpu="4", scheduler=scheduling.scheduler_name
        )
        competitor = pod("competitor", cpu="3", scheduler=scheduling.scheduler_name)
        competitor["metadata"]["namespace"] = namespace

        async def held() -> bool:
            return "node-1" in (await extender_filter(scheduling, competitor))["FailedNodes"]

        await cluster.await_(held, what="the extender to see the Reservation in handover")
        await cluster.aapply(json.dumps(competitor), namespace)
        reason = f"Insufficient cpu: held for Reservation {reservation} in handover"

        def refused() -> list[dict[str, Any]]:
            events = cluster.get(
                "events", "-n", namespace, "--field-selector=involvedObject.name=competitor"
            )["items"]
            return [
                e for e in events if e["reason"] == "FailedScheduling" and reason in e["message"]
            ]

        events = await cluster.await_(refused, what="FailedScheduling naming the Reservation")
        assert "2 Insufficient cpu" in events[0]["message"]  # node-0 and node-2: full
        assert await asyncio.to_thread(bound_node, cluster, namespace, "competitor") is None

        # The hold, and only the hold, kept it off node-1: release it, and the next
        # attempt (a pod deleted on node-1 makes the scheduler retry) binds it there.
        await cluster.akubectl("delete", "reservation", reservation)

        async def released() -> bool:
            return not await held()

        await cluster.await_(released, what="the extender to see the Reservation gone")
        await cluster.akubectl("delete", "pod", "nudge", "-n", namespace)
        node = await cluster.await_(
            lambda: bound_node(cluster, namespace, "competitor"),
            what="the competitor to be bound once the hold is gone",
        )
        assert node == "node-1"
    finally:
        await cluster.akubectl("delete", "reservation", reservation, check=False)
