"""Admission: arbitration's decision written on a Pending job (controller.jobs.admission),
and the loop that runs the rounds, where each part runs on its own so that one that
raises never stops the others; a round decides on the caches as they were when it
started, whatever the watches bring meanwhile."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from berth.api import keys
from berth.eviction import soft_eviction
from berth.kube.client import Kube
from berth.kube.events import Recorder
from berth.settings import MigrationControllerArgs
from controller import jobs
from controller.actions import Delete, Patch, Plan, UpdateStatus
from controller.admission import Admission, decide
from controller.arbitration import Decision, LimiterState
from controller.caches import NODE_GRACE, Caches
from controller.executor import Executor, Outcome
from controller.jobs import marker
from tests.unit.builders import ADMISSION_KEY, T0, job, node, pod
from tests.unit.controller_cases import kinds, status_of

# ----- the decision written on the job ----------------------------------------------------


def pending_job() -> dict[str, Any]:
    return job("job-1", phase="Pending", pod_uid=None)


@pytest.mark.parametrize("dry_run", [False, True])
def test_admission_of_an_admitted_job(dry_run: bool) -> None:
    target = pod("web-1", node="node-0")
    decision = Decision(pending_job(), "admit", pod=target)
    plan = jobs.admission(decision, workload_uid="uid-web", dry_run=dry_run, key=ADMISSION_KEY)
    if not dry_run:
        assert kinds(plan) == ["Patch:podmigrationjobs", "UpdateStatus:podmigrationjobs"]
        patch = next(a for a in plan.actions if isinstance(a, Patch))
        assert patch.patch["metadata"]["annotations"] == {
            keys.POD_UID: target["metadata"]["uid"],
            keys.SOURCE_NODE: "node-0",
            keys.WORKLOAD: "uid-web",
            keys.ADMISSION: marker.sign(
                ADMISSION_KEY,
                job_uid="uid-job-1",
                pod_uid=target["metadata"]["uid"],
                mode="ReservationFirst",
                source_node="node-0",
                workload="uid-web",
            ),
        }
        # Conditional on the job as arbitration read it: a job changed since is not
        # admitted by this write.
        assert patch.patch["metadata"]["resourceVersion"] == "10"
        assert status_of(plan)["phase"] == "Running"
        return
    # A dry run starts nothing: the job stays Pending and says what would have happened.
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:DryRun"]
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Pending", "DryRun")
    assert "nothing is reserved or evicted" in status["message"]
    # Written once: the next round's same decision changes nothing.
    again = Decision({**decision.job, "status": status}, "admit", pod=target)
    assert (
        jobs.admission(again, workload_uid="uid-web", dry_run=True, key=ADMISSION_KEY).actions == []
    )


@pytest.mark.parametrize("dry_run", [False, True])
def test_admission_of_a_failed_job_ends_it_in_either_mode(dry_run: bool) -> None:
    decision = Decision(pending_job(), "fail", "ForbiddenMigratePod", "pod is a DaemonSet pod")
    plan = jobs.admission(decision, workload_uid=None, dry_run=dry_run, key=ADMISSION_KEY)
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:ForbiddenMigratePod"]
    assert (status_of(plan)["phase"], status_of(plan)["message"]) == (
        "Failed",
        "pod is a DaemonSet pod",
    )


def test_admission_writes_a_wait_reason_only_when_it_changes() -> None:
    decision = Decision(pending_job(), "wait", "MaxMigratingPerNode", "2 migrations already")
    plan = jobs.admission(decision, workload_uid=None, dry_run=False, key=ADMISSION_KEY)
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs"]
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Pending", "MaxMigratingPerNode")
    unchanged = Decision(
        {**decision.job, "status": status}, "wait", "MaxMigratingPerNode", "2 migrations already"
    )
    assert (
        jobs.admission(unchanged, workload_uid=None, dry_run=False, key=ADMISSION_KEY).actions == []
    )


# ----- the loop ---------------------------------------------------------------------------


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


async def watch(caches: Caches, plural: str, obj: dict[str, Any], kind: str = "ADDED") -> None:
    informer = next(i for i in caches.informers if i.resource.plural == plural)
    await informer._apply(kind, obj)


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


async def test_the_soft_eviction_of_a_job_that_no_longer_exists_is_taken_off() -> None:
    """A job deleted while its pod carried its soft eviction: whatever acts on the
    annotation would evict the pod with no place held. The annotation goes (UID-guarded);
    one of a job that exists, or one someone else wrote, stays."""
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    executor = Recording()
    admission = Admission(caches, executor, args, admitted=lambda _key: None)
    await watch(caches, "podmigrationjobs", job("job-1"))
    for name, value in [
        ("web-1", soft_eviction("job-1", {}, datetime.now(UTC))),
        ("web-2", soft_eviction("job-gone", {}, datetime.now(UTC))),
        ("web-3", '{"reason": "another tool"}'),
    ]:
        await watch(caches, "pods", pod(name, annotations={keys.SOFT_EVICTION: value}))
    await admission.withdraw_orphan_soft_evictions()
    [patch] = [a for p in executor.plans for a in p.actions if isinstance(a, Patch)]
    assert (patch.name, patch.patch) == (
        "web-2",
        {"metadata": {"uid": "uid-web-2", "annotations": {keys.SOFT_EVICTION: None}}},
    )


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
    await admission.release_strays()
    ungated = [a for p in executor.plans for a in p.actions if isinstance(a, Patch)]
    assert [a.name for a in ungated] == ["web-9"]


async def test_a_claimer_tied_to_a_deleted_node_with_no_reservation_left_is_deleted() -> None:
    """Its Reservation was deleted before its own pass saw the node go: the stray pass
    deletes the pod (it could never be scheduled) rather than let its gate go."""
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    executor = Recording()
    admission = Admission(caches, executor, args, admitted=lambda _key: None)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-9"]}]}
    tied = pod("web-9", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "x"})
    tied["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    tied["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    await watch(caches, "nodes", node("node-9"))
    await watch(caches, "pods", tied)
    await watch(caches, "nodes", node("node-9"), kind="DELETED")
    await admission.release_strays()
    assert [kinds(p) for p in executor.plans] == [["Delete:pods", "Event:StrandedPodDeleted"]]


async def test_a_claimer_its_node_keeps_refusing_is_deleted_once_no_reservation_holds_it() -> None:
    """The node is there, but the scheduler keeps refusing the pod it (a pod of higher
    priority took the place, its job timed out): the stray pass deletes it, since its
    affinity to that node can only be narrowed."""
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    executor = Recording()
    admission = Admission(caches, executor, args, admitted=lambda _key: None)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-9"]}]}
    tied = pod("web-9", node=None, annotations={keys.CLAIM: "x"})
    tied["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    tied["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    tied["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "lastTransitionTime": "2020-01-01T00:00:01Z",
        }
    ]
    await watch(caches, "nodes", node("node-9"))
    await watch(caches, "pods", tied)
    await admission.release_strays()
    assert [kinds(p) for p in executor.plans] == [["Delete:pods", "Event:PinnedPodDeleted"]]


class BindingMeanwhile(Recording):
    """While the first plan runs, the scheduler binds the other pod (the cache sees it)."""

    def __init__(self, caches: Caches, bound: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.caches, self.bound = caches, bound

    async def run(self, plan: Plan) -> Outcome:
        if not self.plans:
            [first] = [a.name for a in plan.actions if isinstance(a, Delete)]
            [other] = [name for name in self.bound if name != first]
            await watch(self.caches, "pods", self.bound[other], kind="MODIFIED")
        return await super().run(plan)


async def test_a_pinned_claimer_bound_meanwhile_is_not_deleted() -> None:
    """Each pod is judged as the cache holds it when its turn comes, and deleted only
    as it was read (resourceVersion precondition): one the scheduler bound meanwhile
    runs, and stays."""
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-9"]}]}
    refused = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "lastTransitionTime": "2020-01-01T00:00:01Z",
    }
    bound = {}
    for name in ("web-8", "web-9"):
        tied = pod(name, node=None, annotations={keys.CLAIM: "x"})
        tied["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
        tied["metadata"]["resourceVersion"] = "5"
        tied["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
        tied["status"]["conditions"] = [refused]
        await watch(caches, "pods", tied)
        bound[name] = pod(name, node="node-9", annotations={keys.CLAIM: "x"})
        bound[name]["metadata"]["resourceVersion"] = "6"
        bound[name]["spec"]["affinity"] = tied["spec"]["affinity"]
    executor = BindingMeanwhile(caches, bound)
    admission = Admission(caches, executor, args, admitted=lambda _key: None)
    await watch(caches, "nodes", node("node-9"))
    await admission.release_strays()
    [delete] = [a for p in executor.plans for a in p.actions if isinstance(a, Delete)]
    assert delete.options == {"preconditions": {"resourceVersion": "5"}}


async def test_a_claimer_tied_to_a_node_not_seen_yet_waits_out_the_grace() -> None:
    """The node watch may lag the pods': a node never seen counts as gone only once it has
    been missing `NODE_GRACE`, and not at all if it shows up meanwhile."""
    args = MigrationControllerArgs()
    now = [100.0]
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None, clock=lambda: now[0])
    executor = Recording()
    admission = Admission(caches, executor, args, admitted=lambda _key: None)
    for name, node_name in (("web-8", "node-8"), ("web-9", "node-9")):
        tied = pod(name, node=None, annotations={keys.CLAIM: "x"})
        tied["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        tied["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
        await watch(caches, "pods", tied)
    await admission.release_strays()
    now[0] += NODE_GRACE - 1
    await watch(caches, "nodes", node("node-8"))
    await admission.release_strays()
    assert executor.plans == []
    now[0] += 1
    await admission.release_strays()
    assert [kinds(p) for p in executor.plans] == [["Delete:pods", "Event:StrandedPodDeleted"]]
    deleted = [a.name for p in executor.plans for a in p.actions if isinstance(a, Delete)]
    assert deleted == ["web-9"]


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


def verdicts(caches: Caches, args: MigrationControllerArgs) -> dict[str, tuple[str, str]]:
    decided = decide(caches.frozen(), args=args, limiter=LimiterState(), memo=None, now=T0)
    assert decided is not None
    return {d.job["metadata"]["name"]: (d.verdict, d.reason) for d, _ in decided.writes}


async def test_a_round_decides_on_the_caches_as_they_were_frozen() -> None:
    args = MigrationControllerArgs.model_validate({"evictQPS": 0})
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    await watch(caches, "pods", pod("web-1", node="node-0"))
    await watch(caches, "podmigrationjobs", job("job-1", phase="Pending", pod_name="web-1"))
    frozen = caches.frozen()
    # Meanwhile the pod goes, and another job comes.
    await caches.pods._apply("DELETED", pod("web-1", node="node-0"))
    await watch(caches, "podmigrationjobs", job("job-2", phase="Pending", pod_name="web-2"))
    decided = decide(frozen, args=args, limiter=LimiterState(), memo=None, now=T0)
    assert decided is not None
    assert [(d.job["metadata"]["name"], d.verdict) for d, _ in decided.writes] == [
        ("job-1", "admit")
    ]
    # The next round sees both.
    assert verdicts(caches, args) == {
        "job-1": ("fail", "MissingPod"),
        "job-2": ("fail", "MissingPod"),
    }


@pytest.mark.parametrize(("marked", "verdict"), [(True, "wait"), (False, "admit")])
async def test_only_a_job_berth_admitted_counts_in_flight(marked: bool, verdict: str) -> None:
    """A job's status is written by whoever may abort it: one set Running by hand, with
    no admission mark, takes up no room of the limits (here: one job per node)."""
    args = MigrationControllerArgs.model_validate({"evictQPS": 0, "maxMigratingPerNode": 1})
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    caches.admission_key = ADMISSION_KEY
    for name in ("web-1", "web-2"):
        await watch(caches, "pods", pod(name, node="node-0"))
    running = job("job-1", phase="Running", pod_name="web-1", pod_uid="uid-web-1")
    running["metadata"]["annotations"][keys.SOURCE_NODE] = "node-0"
    running["metadata"]["annotations"][keys.ADMISSION] = marker.sign(
        ADMISSION_KEY if marked else b"not the controller's",
        job_uid="uid-job-1",
        pod_uid="uid-web-1",
        mode="ReservationFirst",
        source_node="node-0",
    )
    await watch(caches, "podmigrationjobs", running)
    await watch(caches, "podmigrationjobs", job("job-2", phase="Pending", pod_name="web-2"))
    assert verdicts(caches, args)["job-2"][0] == verdict


async def test_no_pending_job_no_round() -> None:
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    await watch(caches, "podmigrationjobs", job("job-1", phase="Running"))
    assert decide(caches.frozen(), args=args, limiter=LimiterState(), memo=None, now=T0) is None


class Refusing(Recording):
    """Raises on the plan for one job, as a write the API server cannot take."""

    async def run(self, plan: Plan) -> Outcome:
        if any(
            isinstance(a, UpdateStatus) and a.obj["metadata"]["name"] == "job-1"
            for a in plan.actions
        ):
            raise RuntimeError("connection reset")
        return await super().run(plan)


async def test_a_write_that_raises_keeps_no_other_decision_from_being_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    executor = Refusing()
    admission = Admission(caches, executor, args, admitted=lambda _key: None)
    for index in range(1, 41):
        await watch(
            caches,
            "podmigrationjobs",
            job(f"job-{index}", phase="Pending", pod_name=f"gone-{index}"),
        )
    await admission.admit_once()
    written = {
        a.obj["metadata"]["name"]
        for p in executor.plans
        for a in p.actions
        if isinstance(a, UpdateStatus)
    }
    assert written == {f"job-{index}" for index in range(2, 41)}
    assert "writing arbitration's decision on job job-1 failed" in caplog.text


async def test_a_round_runs_beside_the_event_loop() -> None:
    args = MigrationControllerArgs()
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    admission = Admission(caches, Recording(), args, admitted=lambda _key: None)
    loop = asyncio.get_running_loop()
    started, loop_went_on = asyncio.Event(), threading.Event()

    def work() -> tuple[int, bool]:
        loop.call_soon_threadsafe(started.set)
        # Only the event loop can set it: were the work on the loop, this would wait out
        # its timeout and answer False.
        return threading.get_ident(), loop_went_on.wait(timeout=30)

    async def meanwhile() -> None:
        await started.wait()
        loop_went_on.set()

    (thread, went_on), _ = await asyncio.gather(admission.off_loop(work), meanwhile())
    assert went_on
    assert thread != threading.get_ident()
    admission.worker.shutdown()
