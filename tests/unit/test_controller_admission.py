"""The admission loop: each part of a round runs on its own, so one that raises never
stops the others."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from berth.api import keys
from berth.kube.client import Kube
from berth.kube.events import Recorder
from berth.settings import MigrationControllerArgs
from controller.actions import Patch, Plan, UpdateStatus
from controller.admission import Admission
from controller.caches import Caches
from controller.executor import Executor, Outcome
from tests.unit.builders import job, pod


class Recording(Executor):
    """Keeps the plans instead of running them against an API server."""

    def __init__(self) -> None:
        super().__init__(cast(Kube, None), cast(Recorder, None))
        self.plans: list[Plan] = []
        self.ran = asyncio.Event()

    async def run(self, plan: Plan) -> Outcome:
        self.plans.append(plan)
        self.ran.set()
        return Outcome()


async def watch(caches: Caches, plural: str, obj: dict[str, Any]) -> None:
    informer = next(i for i in caches.informers if i.resource.plural == plural)
    await informer._apply("ADDED", obj)


async def test_a_round_that_raises_still_releases_stray_gates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    executor = Recording()
    admission = Admission(caches, executor, args, admitted=lambda _key: None)
    await watch(caches, "podmigrationjobs", job("job-1", phase="Pending"))
    # A bad object makes the arbitration round raise: a PriorityClass value not a number.
    await watch(
        caches, "priorityclasses", {"metadata": {"name": "odd", "uid": "u"}, "value": "high"}
    )
    stray = pod("web-9", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "x"})
    stray["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    await watch(caches, "pods", stray)
    loop = asyncio.create_task(admission.loop())
    try:
        await asyncio.wait_for(executor.ran.wait(), 2)
    finally:
        loop.cancel()
    assert "arbitration round failed" in caplog.text
    ungated = [a for p in executor.plans for a in p.actions if isinstance(a, Patch)]
    assert [a.name for a in ungated] == ["web-9"]


async def test_a_gated_pod_that_cannot_be_handled_keeps_no_other_gated() -> None:
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    executor = Recording()
    admission = Admission(caches, executor, args, admitted=lambda _key: None)
    for name in ("web-8", "web-9"):
        stray = pod(name, node=None, gates=[keys.RESERVATION_GATE])
        stray["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
        if name == "web-8":
            del stray["metadata"]["creationTimestamp"]  # a bad object
        await watch(caches, "pods", stray)
    await admission.release_stray_gates()
    ungated = [a for p in executor.plans for a in p.actions if isinstance(a, Patch)]
    assert [a.name for a in ungated] == ["web-9"]


async def test_arbitration_waits_for_a_jobs_mode_to_be_recorded() -> None:
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    executor = Recording()
    admission = Admission(caches, executor, args, admitted=lambda _key: None)
    modeless = job("job-1", phase="Pending", pod_name="gone-1")
    del modeless["spec"]["mode"]
    await watch(caches, "podmigrationjobs", modeless)
    await watch(caches, "podmigrationjobs", job("job-2", phase="Pending", pod_name="gone-2"))
    await admission.admit_once()
    # Both pods are missing: only the job with a mode is judged (and failed) this round.
    written = [a.obj for p in executor.plans for a in p.actions if isinstance(a, UpdateStatus)]
    assert [(o["metadata"]["name"], o["status"]["reason"]) for o in written] == [
        ("job-2", "MissingPod")
    ]
