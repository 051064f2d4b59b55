"""What a pass makes of how its plan ran (controller.reconcile.Reconciler)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from berth.kube.client import KubeError
from controller import reservations
from controller.actions import Event, Plan, UpdateStatus
from controller.caches import Caches
from controller.executor import Executor, Outcome
from controller.queue import job_key, reservation_key
from controller.reconcile import RETRY_AFTER_ERROR, ApiFailure, Reconciler
from tests.unit.builders import T0, job, pod, reservation
from tests.unit.controller_cases import view


class _Caches:
    """The one job or Reservation a pass looks at."""

    def __init__(self, *, job_obj: Any = None, rsv: Any = None) -> None:
        self.jobs = {job_obj["metadata"]["name"]: job_obj} if job_obj else {}
        self.reservations = {rsv["metadata"]["name"]: rsv} if rsv else {}
        self.rsv = rsv

    def job_view(self, job_obj: Any) -> Any:
        return view(job_obj=job_obj, pod_obj=pod(), rsv=self.rsv)

    def reservation_view(self, rsv: Any) -> reservations.ReservationView:
        return reservations.ReservationView(
            reservation=rsv,
            placeholder=None,
            claimers=(),
            accepted=(),
            owner=None,
            now=T0,
            image="pause",
            priority_class={"metadata": {"name": "berth-non-preempting-7"}},
            priority_class_found=None,
        )


class _Executor:
    """Runs nothing: answers each plan with the next outcome given, then with done."""

    def __init__(self, *outcomes: Outcome) -> None:
        self.outcomes = list(outcomes)
        self.plans: list[Plan] = []

    async def run(self, plan: Plan) -> Outcome:
        self.plans.append(plan)
        return self.outcomes.pop(0) if self.outcomes else Outcome()


def reconciler(caches: _Caches, executor: _Executor) -> Reconciler:
    return Reconciler(cast(Caches, caches), cast(Executor, executor))


async def test_an_eviction_held_back_at_the_last_moment_is_looked_at_again_soon() -> None:
    """Not an API failure (which backs off, counted as a reconcile error): the caches are
    about to show why the place no longer takes the replacement."""
    rsv = reservation(phase="Available", node="node-1")
    held = _Executor(Outcome(done=False, held_back=True))
    again = await reconciler(_Caches(job_obj=job(), rsv=rsv), held).reconcile(job_key("job-1"))
    assert again == RETRY_AFTER_ERROR
    failed = _Executor(Outcome(done=False, error=KubeError(429, {"message": "throttled"})))
    with pytest.raises(ApiFailure):
        await reconciler(_Caches(job_obj=job(), rsv=rsv), failed).reconcile(job_key("job-1"))


async def test_a_refused_priority_class_is_said_on_the_reservation() -> None:
    """The pass's create of the placeholder's PriorityClass is refused: the Reservation
    says so, naming the class, and the key backs off as after any API failure."""
    rsv = reservation(phase="Pending", node=None)
    refused = KubeError(403, {"message": "forbidden by policy", "reason": "Forbidden"})
    executor = _Executor(
        Outcome(done=False, create_refused=refused, refused_resource="priorityclasses")
    )
    with pytest.raises(ApiFailure):
        await reconciler(_Caches(rsv=rsv), executor).reconcile(
            reservation_key(rsv["metadata"]["name"])
        )
    said = executor.plans[1]
    [status] = [a for a in said.actions if isinstance(a, UpdateStatus)]
    [scheduled] = [c for c in status.obj["status"]["conditions"] if c["type"] == "Scheduled"]
    assert scheduled["message"].startswith(
        "the placeholder's PriorityClass 'berth-non-preempting-7' cannot be created: "
        "the API server answered 403: forbidden by policy"
    )


@pytest.mark.parametrize(("status", "said"), [(403, True), (422, True), (429, False), (500, False)])
async def test_a_write_refused_for_good_is_said_on_the_job(status: int, said: bool) -> None:
    """A write a retry alone will not change (a policy, RBAC, validation) backs off as any
    API failure, and a Warning event on the job names it and the API server's answer;
    throttling and server errors, which pass by themselves, only back off."""
    rsv = reservation(phase="Available", node="node-1")
    refused = KubeError(status, {"message": "denied by policy"})
    executor = _Executor(Outcome(done=False, error=refused, failed="Patch podmigrationjobs/job-1"))
    with pytest.raises(ApiFailure):
        await reconciler(_Caches(job_obj=job(), rsv=rsv), executor).reconcile(job_key("job-1"))
    events = [a for plan in executor.plans[1:] for a in plan.actions if isinstance(a, Event)]
    if not said:
        assert events == []
        return
    [event] = events
    assert (event.reason, event.type) == ("WriteRefused", "Warning")
    assert event.message == (
        f"Patch podmigrationjobs/job-1 was refused (HTTP {status}: denied by policy); "
        "it is tried again with back-off"
    )
