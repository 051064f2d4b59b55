"""A standby replica queues nothing; the replica that comes to lead adopts everything."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import cast

from prometheus_client import REGISTRY

from berth.api import keys
from berth.kube.client import Kube
from berth.settings import MigrationControllerArgs
from controller.app import Controller
from controller.queue import job_key, reservation_key
from tests.unit.builders import job, pod, reservation, ts


async def test_a_standby_queues_nothing_and_the_leader_adopts_everything() -> None:
    controller = Controller(cast(Kube, None), MigrationControllerArgs(), identity="test")
    jobs_informer = controller.caches.jobs
    await jobs_informer._apply("ADDED", job("job-1", phase="Pending"))
    await controller.caches.reservations._apply("ADDED", reservation("uid-job-1"))
    # Months of standing by: no worker takes these, so none is kept.
    assert len(controller.queue) == 0

    controller.lead()
    adopted = {await controller.queue.get() for _ in range(len(controller.queue))}
    assert {job_key("job-1"), reservation_key("uid-job-1")} <= adopted
    await jobs_informer._apply("ADDED", job("job-2", phase="Pending"))
    assert await controller.queue.get() == job_key("job-2")


async def test_the_leader_and_the_gated_pods_are_exported() -> None:
    controller = Controller(cast(Kube, None), MigrationControllerArgs(), identity="test")
    assert REGISTRY.get_sample_value("berth_leader") == 0
    gated = pod("web-2", node=None, gates=[keys.RESERVATION_GATE])
    gated["metadata"]["creationTimestamp"] = ts(datetime.now(UTC) - timedelta(minutes=5))
    await controller.caches.pods._apply("ADDED", gated)
    await controller.caches.pods._apply("ADDED", pod("web-1"))
    assert REGISTRY.get_sample_value("berth_gated_pods") == 1
    oldest = REGISTRY.get_sample_value("berth_gated_pod_oldest_seconds")
    assert oldest is not None
    assert 300 <= oldest < 360
    controller.lead()
    assert REGISTRY.get_sample_value("berth_leader") == 1
