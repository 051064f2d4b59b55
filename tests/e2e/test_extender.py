"""The extender, as a real process, steers a real kube-scheduler.

A second kube-scheduler (its own schedulerName) is configured with the extender, which
runs as `python -m extender` against the session's cluster. The tests shape the free
capacity of the three 8-CPU kwok nodes with pods pinned by nodeName, and drive
Reservations through the session's Berth controller, which creates their placeholders
and does the handover once the test records an owner in `status.currentOwners` (the
step the webhook's claim leads to). The owner also carries a gate of the test's own, so
that it stays unbound, and the Reservation in handover, for as long as the test needs.

This scheduler calls the extender for every pod, as in the strict scope
(manifests/strict): there, capacity in handover is refused to pods of any priority,
while the replacement's nomination alone keeps it from pods of equal or lower priority
(tests/e2e/test_scope.py covers the default scope).
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from berth.api import keys
from devtools.processes import free_port
from tests.e2e.capacity import (
    NODES,
    bound_node,
    hand_over,
    lift,
    pod,
    priority_class,
    reserve,
    shape_free_cpu,
)
from tests.e2e.kube import Cluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


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
        # No managedResources: the strict scope, the extender is asked about every pod.
        # Berth's pods request its extended resource, which NodeResourcesFit must ignore.
        scheduler = await asyncio.to_thread(
            cluster.local.start_scheduler,
            name=name,
            scheduler_name=name,
            extenders=[extender],
            ignored_resources=[keys.RESERVATION_RESOURCE],
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
        assert owner["status"].get("nominatedNodeName") == "node-0"
        await lift(cluster, namespace, "owner")
        node = await cluster.await_(
            lambda: bound_node(cluster, namespace, "owner"), what="the owner to be bound"
        )
        assert node == "node-0"
    finally:
        await cluster.akubectl("delete", "reservation", reservation, check=False)


@pytest.fixture
def high_priority(cluster: Cluster) -> Iterator[str]:
    with priority_class(cluster, value=1000) as name:
        yield name


async def test_capacity_in_handover_is_refused_to_other_pods(
    cluster: Cluster, namespace: str, scheduling: Scheduling, high_priority: str
) -> None:
    # node-1: 6 CPU free as the scheduler counts once the placeholder is gone, 4 of them
    # held for the owner. node-0 and node-2: 1 CPU free. The competitor's priority is
    # above the owner's, so the scheduler's own accounting of the owner's nomination
    # does not keep it off node-1: the extender's hold does.
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
        competitor = pod(
            "competitor",
            cpu="3",
            scheduler=scheduling.scheduler_name,
            priority_class=high_priority,
        )
        competitor["metadata"]["namespace"] = namespace

        async def held() -> bool:
            return (
                "node-1"
                in (await extender_filter(scheduling, competitor))["FailedAndUnresolvableNodes"]
            )

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
