"""Preemption allowed by a job: which class the placeholder runs under, which pods the
scheduler preempted for it, and how the job records them."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

import pytest

from berth.api import keys
from controller import build, jobs
from controller.actions import Create
from controller.jobs.preempt import victims
from tests.unit.builders import ADMISSION_KEY, T0, job, later, placeholder, pod, reservation, ts
from tests.unit.controller_cases import ARGS, cond, kinds, status_of

Object = dict[str, Any]


def allowed(**template: Any) -> Object:
    """A Reservation made for a job that allows preemption, for a pod of `template`."""
    rsv = reservation(annotations={keys.PREEMPTION: keys.PREEMPTION_ALLOWED})
    rsv["spec"]["template"]["spec"].update(template)
    return rsv


@pytest.mark.parametrize(
    ("rsv", "classes", "default", "expected"),
    [
        pytest.param(allowed(priorityClassName="high", priority=1000), {"high": 1000}, 0, True),
        pytest.param(
            reservation(), {"high": 1000}, 0, False, id="the job did not allow preemption"
        ),
        pytest.param(
            allowed(priorityClassName="high", priority=1000),
            {"high": 2000},
            0,
            False,
            id="the class was made again with a higher value",
        ),
        pytest.param(
            allowed(priorityClassName="high", priority=1000), {}, 0, False, id="class gone"
        ),
        pytest.param(
            allowed(priorityClassName="high", priority=1000, preemptionPolicy="Never"),
            {"high": 1000},
            0,
            False,
            id="the pod itself may not preempt",
        ),
        pytest.param(allowed(priority=0), {}, 0, True, id="no class: the default, unchanged"),
        pytest.param(allowed(priority=0), {}, 100, False, id="no class: a new global default"),
        pytest.param(allowed(), {}, 0, False, id="the pod's priority is unknown"),
    ],
)
def test_a_placeholder_may_preempt_only_with_the_pods_own_priority(
    rsv: Object, classes: dict[str, int], default: int, expected: bool
) -> None:
    assert build.may_preempt(rsv, classes, default) is expected


def test_the_reservation_of_a_job_that_allows_preemption_says_so() -> None:
    source = pod()
    asking = job()
    plain = build.reservation_for(job=asking, pod=source, workload_uid=None, ttl="5m")
    assert keys.PREEMPTION not in plain["metadata"]["annotations"]
    asking["spec"]["reservationOptions"] = {"preemptionOptions": {}}
    made = build.reservation_for(job=asking, pod=source, workload_uid=None, ttl="5m")
    assert made["metadata"]["annotations"][keys.PREEMPTION] == keys.PREEMPTION_ALLOWED


def test_a_template_cannot_allow_preemption() -> None:
    """The annotation is Berth's: a template's metadata never carries it through."""
    template = {"metadata": {"annotations": {keys.PREEMPTION: keys.PREEMPTION_ALLOWED}}}
    made = build.reservation_for(
        job=job(), pod=pod(), workload_uid=None, ttl="5m", template=template
    )
    assert keys.PREEMPTION not in made["metadata"]["annotations"]
    assert not build.may_preempt(made, {}, 0)


def test_a_placeholder_allowed_to_preempt_keeps_the_pods_own_class() -> None:
    rsv = allowed(priorityClassName="high", priority=1000, preemptionPolicy="PreemptLowerPriority")
    spec = build.placeholder_for(rsv, image="pause")["spec"]
    assert (spec["priorityClassName"], spec["preemptionPolicy"]) == (
        "high",
        "PreemptLowerPriority",
    )
    assert "priority" not in spec  # admission sets it from the class


# ----- the victims ------------------------------------------------------------------------


def nominated(*, node: str = "node-1", priority: int = 1000) -> Object:
    """The placeholder, unbound, nominated to `node` by the scheduler."""
    obj = placeholder(node=None)
    obj["spec"]["priority"] = priority
    obj["status"]["nominatedNodeName"] = node
    return obj


def bound(at: datetime, *, node: str = "node-1", priority: int = 1000) -> Object:
    obj = placeholder(node=node)
    obj["spec"]["priority"] = priority
    obj["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(at)}
    ]
    return obj


def victim(
    name: str = "filler",
    *,
    node: str = "node-1",
    priority: int = 0,
    at: datetime | None = None,
    reason: str = "PreemptionByScheduler",
    scheduler: str = "default-scheduler",
    status: str = "True",
) -> Object:
    obj = pod(name, namespace="other", node=node, rs=None)
    obj["spec"]["priority"] = priority
    obj["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": status,
            "reason": reason,
            "message": f"{scheduler}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": ts(at or later(5)),
        }
    )
    return obj


@pytest.mark.parametrize(
    ("candidate", "found"),
    [
        pytest.param(victim(), True, id="marked on the nominated node"),
        pytest.param(victim(node="node-2"), False, id="on another node"),
        pytest.param(victim(priority=1000), False, id="not of lower priority"),
        pytest.param(victim(at=later(-5)), False, id="marked before the placeholder existed"),
        pytest.param(victim(reason="DeletionByTaintManager"), False, id="not a preemption"),
        pytest.param(victim(status="False"), False, id="condition not true"),
        pytest.param(victim(scheduler="other-scheduler"), False, id="another scheduler's"),
        pytest.param(pod("plain", node="node-1"), False, id="never marked"),
    ],
)
def test_victims_are_the_pods_the_scheduler_marked_for_the_placeholder(
    candidate: Object, found: bool
) -> None:
    assert (victims(nominated(), [candidate]) != []) is found


def test_victims_are_marked_before_the_placeholder_bound() -> None:
    marked = victim(at=later(5))
    assert victims(bound(later(6)), [marked]) == [marked]
    assert victims(bound(later(4)), [marked]) == []


def test_a_placeholder_that_may_not_preempt_has_no_victims() -> None:
    """Under the non-preempting twin it made no room: another pod preempted there."""
    never = bound(later(6))
    never["spec"]["preemptionPolicy"] = "Never"
    assert victims(never, [victim(at=later(5))]) == []


def test_an_unplaced_placeholder_has_no_victims() -> None:
    waiting = placeholder(node=None)
    assert victims(waiting, [victim()]) == []


# ----- the job's record -------------------------------------------------------------------


def job_view(
    rsv: Object,
    *,
    job_obj: Object | None = None,
    ph: Object | None = None,
    preempted: tuple[Object, ...] = (),
    now: datetime | None = None,
) -> jobs.JobView:
    job_obj = job_obj or job()
    if rsv["metadata"]["name"] == job_obj["metadata"]["uid"]:  # recorded on the job
        job_obj["spec"]["reservationOptions"] = {"reservationRef": {"name": "uid-job-1"}}
    return jobs.JobView(
        job=job_obj,
        pod=pod(),
        reservation=rsv,
        owner=None,
        namespace_labelled=True,
        workload_uid="uid-deploy",
        now=now or later(10),
        args=ARGS,
        admission_key=ADMISSION_KEY,
        placeholder=ph,
        preempted=preempted,
    )


def test_a_job_records_the_pods_preempted_while_its_placeholder_waits() -> None:
    waiting = allowed()
    waiting["status"]["conditions"] = [
        {"type": "Scheduled", "status": "False", "reason": "Unschedulable", "message": "full"}
    ]
    plan = jobs.decide(job_view(waiting, ph=nominated(), preempted=(victim(), victim("other"))))
    status = status_of(plan)
    assert [(ref["namespace"], ref["name"]) for ref in status["preemptedPodsRef"]] == [
        ("other", "filler"),
        ("other", "other"),
    ]
    assert status["preemptedPodsRef"][0]["uid"] == "uid-filler"
    preemption = cond(status, "Preemption")
    assert (preemption["status"], preemption["reason"]) == ("False", "Preempting")
    assert "node-1" in preemption["message"]
    assert cond(status, "ReservationScheduled")["reason"] == "Unschedulable"
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:Preempting"]
    assert status["phase"] == "Running"


def test_a_recorded_victim_is_recorded_once() -> None:
    waiting = allowed()
    first = status_of(jobs.decide(job_view(waiting, ph=nominated(), preempted=(victim(),))))
    again = job()
    again["status"] = first
    plan = jobs.decide(job_view(waiting, job_obj=again, ph=nominated(), preempted=(victim(),)))
    assert "Event:Preempting" not in kinds(plan)
    assert all(a.obj["status"] == first for a in plan.actions if hasattr(a, "obj"))


def test_the_place_held_completes_the_preemption_before_the_eviction() -> None:
    available = allowed()
    available["status"] = {"phase": "Available", "nodeName": "node-1"}
    available["metadata"]["annotations"][keys.CONSUMABLE] = "true"
    available["metadata"]["annotations"][keys.OPENED_AT] = ts(T0)
    # The victim was deleted before the placeholder bound: only the caches remember it.
    plan = jobs.decide(job_view(available, ph=bound(later(6)), preempted=(victim(),)))
    names = kinds(plan)
    assert names[:3] == [
        "UpdateStatus:podmigrationjobs",
        "Event:ReservationScheduled",
        "Event:PreemptComplete",
    ]
    assert names.index("Event:PreemptComplete") < names.index("Evict")
    status = status_of(plan)
    preemption = cond(status, "Preemption")
    assert (preemption["status"], preemption["reason"]) == ("True", "PreemptComplete")
    assert [ref["name"] for ref in status["preemptedPodsRef"]] == ["filler"]


def test_no_victim_means_no_preemption_in_the_status() -> None:
    """The default: nothing preempted, nothing said about preemption."""
    available = allowed()
    available["status"] = {"phase": "Available", "nodeName": "node-1"}
    status = status_of(jobs.decide(job_view(available, ph=bound(later(6)))))
    assert "preemptedPodsRef" not in status
    assert all(c["type"] != "Preemption" for c in status["conditions"])


def test_a_job_allowing_preemption_creates_its_reservation_as_usual() -> None:
    asking = job()
    asking["spec"]["reservationOptions"] = {"preemptionOptions": {}}
    plan = jobs.decide(
        jobs.JobView(
            job=asking,
            pod=pod(),
            reservation=None,
            owner=None,
            workload_uid=None,
            now=T0,
            args=ARGS,
            admission_key=ADMISSION_KEY,
        )
    )
    assert kinds(plan)[0] == "Create:reservations"
    created = plan.actions[0]
    assert isinstance(created, Create)
    assert created.body["metadata"]["annotations"][keys.PREEMPTION] == "allowed"


def test_preemption_for_a_reservation_the_job_did_not_make_is_refused() -> None:
    """reservationRef names a Reservation made by hand: its placeholder's class is not the
    job's to change, so the job fails at once rather than silently never preempting."""
    asking = job(reservation_ref="by-hand")
    asking["spec"]["reservationOptions"]["preemptionOptions"] = {}
    hand_made = copy.deepcopy(reservation("by-hand"))
    plan = jobs.decide(job_view(hand_made, job_obj=asking, now=T0))
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "ForbiddenPreemption")
    assert "reservationRef" in status["message"]
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:ForbiddenPreemption"]
