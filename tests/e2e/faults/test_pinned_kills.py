"""The controller leader killed (SIGKILL) at each step of a migration, deterministically.

The recorder's watch shows the moment a job reaches a step (its phase, a condition, its
Reservation's owner); the leader is killed then, and started again at once. The standby
replica, or the restarted one, takes the Lease once it expires and must finish the job
from what the API server holds: the expected ending, nothing gated, no placeholder left,
one eviction, never without an Available Reservation, the PDB kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from berth.kube.client import Kube
from tests.e2e.faults.inject import Injector
from tests.e2e.faults.invariants import UserFaults, judge, phase
from tests.e2e.faults.recorder import Recorder
from tests.e2e.faults.world import (
    STEPS,
    apply_all,
    job,
    job_state,
    pdb,
    ready,
    released,
    until,
    workload,
)
from tests.e2e.kube import Cluster, WaitTimeout

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Case:
    step: str
    """The step (world.STEPS) at which the leader is killed."""
    ending: str
    ttl: str = "3m"
    block_at: str | None = None
    """Tighten the PDB (no disruption allowed) once the job reaches this step."""
    abort_at: str | None = None
    """Abort the job (status.phase Aborted, as a user does) at this step."""


CASES = [
    Case("admitted", "Succeed"),
    Case("reservation created", "Succeed"),
    Case("reservation available", "Succeed"),
    Case("evicting", "Succeed"),
    Case("blocked by PDB", "Succeed", block_at="admitted"),
    Case("handover", "Succeed"),
    Case("ended", "Failed/Timeout", ttl="30s", block_at="admitted"),
    Case("ended", "Aborted", abort_at="reservation created"),
]


def case_id(case: Case) -> str:
    return {"Failed/Timeout": "TTL clean-up", "Aborted": "abort clean-up"}.get(
        case.ending, case.step
    )


async def when(recorder: Recorder, name: str, step: str, timeout: float = 120) -> None:
    await until(lambda: STEPS[step](recorder, name), what=f"job {name}: {step}", timeout=timeout)


@pytest.mark.parametrize("case", CASES, ids=case_id)
async def test_leader_killed_at_a_step_loses_nothing(
    cluster: Cluster, namespace: str, kube: Kube, case: Case
) -> None:
    injector = Injector(cluster)
    async with Recorder(kube) as recorder:
        await cluster.aapply(json.dumps(workload("Deployment", "web", replicas=2)), namespace)
        await cluster.aapply(json.dumps(pdb("web", 1)), namespace)
        await until(lambda: len(ready(recorder, namespace, "web")) == 2, what="2 pods", timeout=120)
        await cluster.await_(
            lambda: (
                cluster.get("pdb", "web", "-n", namespace)
                .get("status", {})
                .get("disruptionsAllowed")
                == 1
            ),
            what="the PDB to allow one disruption",
        )
        await until(injector.leader, what="a running leader", timeout=60, interval=1)
        pod = sorted(ready(recorder, namespace, "web"), key=lambda p: p["metadata"]["name"])[0]
        if case.block_at:
            # No new pod in the namespace, the job's placeholder included, until `block`
            # has tightened the PDB: the eviction cannot come first.
            await cluster.aapply(json.dumps(HOLD), namespace)
        name, body = job(pod, ttl=case.ttl)
        await asyncio.to_thread(apply_all, cluster, [body])

        side_effects: list[tuple[str, Callable[[], Awaitable[object]]]] = []
        if case.block_at:
            side_effects.append((case.block_at, lambda: block(cluster, namespace)))
        if case.abort_at:
            side_effects.append((case.abort_at, lambda: abort(cluster, name)))
        for step, effect in side_effects:
            await when(recorder, name, step)
            await effect()
        await when(recorder, name, case.step)
        killed = await injector.kill_leader()
        assert killed, "no running leader to kill"
        await injector.restart_all()
        if case.block_at and case.ending == "Succeed":
            await set_floor(cluster, namespace, 1)
        await when(recorder, name, "ended", timeout=180)
        # The job is over; what it held is released in the passes after (a verdict
        # still finds whatever is not released by then).
        with contextlib.suppress(WaitTimeout):
            await until(
                lambda: released(recorder, namespace, [name]), what="all released", timeout=60
            )
        final = job_state(recorder, name) or {}
    status = final.get("status") or {}
    ending = "Succeed" if phase(final) in ("Succeed", "Succeeded") else phase(final)
    if ending == "Failed":
        ending = f"Failed/{status.get('reason')}"
    assert ending == case.ending, status
    verdict = judge(
        recorder.ordered(),
        jobs=[name],
        namespaces={namespace},
        min_available={f"{namespace}/web": 1},
        faults=UserFaults(),
    )
    assert not verdict.failures(), verdict.failures()
    if case.ending != "Aborted":  # an abort may land before or after the eviction
        assert verdict.evictions == (1 if case.ending == "Succeed" else 0)


HOLD_NAME = "hold-placeholders"
HOLD = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": HOLD_NAME},
    "spec": {"hard": {"pods": "2"}},
}
"""The namespace's two pods and no more: the placeholder's creation is refused (the
controller retries it) while this quota stands."""


async def block(cluster: Cluster, namespace: str) -> None:
    """Make the PDB refuse the job's eviction. The job is admitted but its placeholder
    held off (`HOLD`) until the disruption controller has counted the tighter PDB: only
    then can the Reservation become Available and the eviction be tried."""
    await set_floor(cluster, namespace, 2)
    await cluster.await_(
        lambda: (
            (pdb := cluster.get("pdb", "web", "-n", namespace))
            .get("status", {})
            .get("observedGeneration")
            == pdb["metadata"]["generation"]
            and pdb["status"].get("disruptionsAllowed") == 0
        ),
        what="the PDB to allow no disruption",
    )
    await cluster.akubectl("delete", "resourcequota", HOLD_NAME, "-n", namespace)


async def set_floor(cluster: Cluster, namespace: str, floor: int) -> None:
    await cluster.akubectl(
        "patch",
        "pdb",
        "web",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"minAvailable": floor}}),
    )


async def abort(cluster: Cluster, name: str) -> None:
    await cluster.akubectl(
        "patch",
        "pmj",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Aborted"}}),
    )
