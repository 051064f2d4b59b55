"""The job state machine (controller.jobs.decide): what each observed state leads to,
step by step, and in what order."""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime, timedelta
from typing import Any

import pytest

from berth import protocol
from berth.api import keys
from berth.eviction import soft_eviction
from berth.settings import MigrationControllerArgs
from controller import jobs
from controller.actions import Create, Delete, Evict, Patch, UpdateStatus
from controller.jobs.evict import start_eviction
from controller.jobs.view import EVICTION_RETRY, evict, released
from controller.namespaces import LabelRefused
from controller.status import job_deadline, micro_timestamp
from tests.unit.arbitration.helpers import one
from tests.unit.builders import ADMISSION_KEY, T0, job, later, placeholder, pod, reservation, ts
from tests.unit.controller_cases import (
    ARGS,
    EVICTING,
    cond,
    kinds,
    rsv_plan,
    status_of,
    view,
    view_plan,
)

# ----- a job not started yet --------------------------------------------------------------


def test_pending_job_is_left_to_arbitration() -> None:
    assert view_plan(job_obj=job(phase=None), pod_obj=pod()).actions == []


def test_pending_job_times_out_with_the_reason_it_waited() -> None:
    waiting = job(phase="Pending")
    waiting["status"].update(reason="MaxMigratingPerNode", message="2 migrations already run")
    assert view_plan(job_obj=waiting, pod_obj=pod(), now=later(200)).actions == []
    status = status_of(view_plan(job_obj=waiting, pod_obj=pod(), now=later(301)))
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout")
    assert "MaxMigratingPerNode" in status["message"]


def without_ttl(ttl: str | None, **fields: Any) -> dict[str, Any]:
    """A job that sets no ttl (None) or the one given."""
    written = job(**fields)
    if ttl is None:
        del written["spec"]["ttl"]
    else:
        written["spec"]["ttl"] = ttl
    return written


@pytest.mark.parametrize("ttl", [None, "0s"])
def test_a_job_that_sets_no_ttl_or_0_never_times_out(ttl: str | None) -> None:
    """As in Koordinator: `defaultJobTTL` is the ttl of the jobs Berth writes itself
    (evictions it intercepts), not of a job someone wrote without one."""
    a_day = later(86_400)
    waiting = without_ttl(ttl, phase="Pending")
    waiting["status"].update(reason="ExpectedReplicas", message="a workload of 1 replica")
    pending = view_plan(job_obj=waiting, pod_obj=pod(), now=a_day)
    assert pending.actions == []
    assert pending.requeue_after is None
    running = view_plan(job_obj=without_ttl(ttl), pod_obj=pod(), now=a_day)
    assert "Timeout" not in str(running.actions)
    assert kinds(running)[0] == "Create:reservations"
    created = running.actions[0]
    assert isinstance(created, Create)
    # Its Reservation lasts the Reservation's default (24h), as Koordinator's would.
    assert "ttl" not in created.body["spec"]


def test_a_ttl_under_a_microsecond_has_run_out_rather_than_never_ending() -> None:
    assert job_deadline(without_ttl("500ns")) == T0
    assert job_deadline(without_ttl("0s")) is None


def test_a_job_with_a_ttl_gives_it_to_its_reservation() -> None:
    created = view_plan(job_obj=without_ttl("10m0s"), pod_obj=pod()).actions[0]
    assert isinstance(created, Create)
    assert created.body["spec"]["ttl"] == "10m0s"


@pytest.mark.parametrize("phase", ["Pending", "Running"])
@pytest.mark.parametrize("default", ["ReservationFirst", "EvictDirectly"])
def test_a_job_without_a_mode_first_gets_the_default_mode_recorded(
    phase: str, default: str
) -> None:
    modeless = job(phase=phase)
    del modeless["spec"]["mode"]
    args = MigrationControllerArgs.model_validate({"defaultJobMode": default})
    plan = jobs.decide(
        jobs.JobView(
            job=modeless,
            pod=pod(),
            reservation=None,
            owner=None,
            workload_uid=None,
            now=T0,
            args=args,
            admission_key=ADMISSION_KEY,
        )
    )
    assert kinds(plan) == ["Patch:podmigrationjobs"]
    patch = plan.actions[0]
    assert isinstance(patch, Patch)
    assert patch.patch == {"spec": {"mode": default}}


@pytest.mark.parametrize(
    ("ttl", "recorded"),
    [("5m", "5m0s"), ("1.5h", "1h30m0s"), ("90s", "1m30s"), ("0", "0s"), ("1500ns", "1.5µs")],
)
@pytest.mark.parametrize("phase", ["Pending", "Running"])
def test_a_ttl_is_first_recorded_as_go_prints_it(phase: str, ttl: str, recorded: str) -> None:
    plan = view_plan(job_obj=job(phase=phase, ttl=ttl), pod_obj=pod())
    assert kinds(plan) == ["Patch:podmigrationjobs"]
    patch = plan.actions[0]
    assert isinstance(patch, Patch)
    assert patch.patch == {"spec": {"ttl": recorded}}


def test_mode_and_ttl_are_recorded_in_one_patch() -> None:
    modeless = job(phase="Pending", ttl="5m")
    del modeless["spec"]["mode"]
    patch = view_plan(job_obj=modeless, pod_obj=pod()).actions[0]
    assert isinstance(patch, Patch)
    assert patch.patch == {"spec": {"mode": "ReservationFirst", "ttl": "5m0s"}}


@pytest.mark.parametrize("phase", ["Succeed", "Succeeded", "Failed", "Aborted"])
def test_a_finished_job_keeps_its_ttl_as_written(phase: str) -> None:
    plan = view_plan(job_obj=job(phase=phase, ttl="5m"), pod_obj=pod())
    assert "Patch:podmigrationjobs" not in kinds(plan)


def test_a_job_stored_as_succeeded_by_an_earlier_release_is_finished() -> None:
    """`Succeeded` (Berth's former spelling) is terminal: the job releases what it held,
    as a `Succeed` job does, and is never run again."""
    held = reservation(phase="Available", node="node-1")
    old, new = (
        view_plan(job_obj=job(phase=phase, conditions=EVICTING), pod_obj=None, rsv=held)
        for phase in ("Succeeded", "Succeed")
    )
    assert kinds(old) == kinds(new)
    assert "Evict" not in kinds(old)


# ----- ReservationFirst, before the eviction ----------------------------------------------


def test_running_job_creates_its_reservation_and_records_it() -> None:
    plan = view_plan(pod_obj=pod())
    assert kinds(plan) == [
        "Create:reservations",
        "Patch:podmigrationjobs",
        "UpdateStatus:podmigrationjobs",
        "Event:ReservationCreated",
    ]
    created = plan.actions[0]
    assert isinstance(created, Create)
    assert created.body["metadata"]["name"] == "uid-job-1"
    patch = plan.actions[1]
    assert isinstance(patch, Patch)
    assert patch.patch["spec"]["reservationOptions"]["reservationRef"]["name"] == "uid-job-1"
    # Conditional on the job as read: the status write after it builds on the patch's
    # version, so a patch that went through whatever changed (an abort written meanwhile)
    # would let that write undo the change.
    assert patch.patch["metadata"] == {"resourceVersion": "10"}
    assert cond(status_of(plan), "ReservationCreated")["status"] == "True"


def test_a_reservation_created_but_not_recorded_is_recorded_on_the_next_pass() -> None:
    """The create went through, the record after it lost a race (the job changed between
    the two, and the patch is conditional on the job as read): the next pass finds the
    Reservation by the job's UID and records it then, RESERVATION column, condition and
    event, before anything else."""
    rsv = reservation(phase="Pending", node=None)
    plan = jobs.decide(view(job_obj=job(), pod_obj=pod(), rsv=rsv, recorded=False))
    assert kinds(plan) == [
        "Patch:podmigrationjobs",
        "UpdateStatus:podmigrationjobs",
        "Event:ReservationCreated",
    ]
    patch = plan.actions[0]
    assert isinstance(patch, Patch)
    assert patch.patch["spec"]["reservationOptions"]["reservationRef"]["name"] == "uid-job-1"
    assert patch.patch["metadata"] == {"resourceVersion": "10"}


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        pytest.param(
            {"metadata": {"labels": ["team-a"]}},
            "reservationOptions.template cannot be read (AttributeError",
            id="labels a list",
        ),
        pytest.param(
            {"spec": {"template": {"spec": {"nodeSelector": {"zone": "a"}, "priority": "9"}}}},
            "reservationOptions.template.spec.template.spec.priority: cannot be read",
            id="priority a string",
        ),
    ],
)
def test_a_template_berth_cannot_read_ends_the_job_once(
    template: dict[str, Any], problem: str
) -> None:
    written = job()
    written["spec"]["reservationOptions"] = {"template": template}
    plan = view_plan(job_obj=written, pod_obj=pod())
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "ForbiddenTemplate")
    assert problem in status["message"]
    assert "Create:reservations" not in kinds(plan)


def test_unscheduled_reservation_reports_the_schedulers_message() -> None:
    rsv = reservation()
    rsv["status"]["conditions"] = [
        {
            "type": "Scheduled",
            "status": "False",
            "message": "0/3 nodes are available: Insufficient cpu.",
        }
    ]
    plan = view_plan(pod_obj=pod(), rsv=rsv)
    scheduled = cond(status_of(plan), "ReservationScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert "Insufficient cpu" in scheduled["message"]
    assert not any(isinstance(a, Evict) for a in plan.actions)


def test_a_job_whose_reservation_never_found_a_node_says_so_at_its_ttl() -> None:
    rsv = reservation()
    rsv["status"]["conditions"] = [
        {"type": "Scheduled", "status": "False", "message": "0/3 nodes: Insufficient cpu."}
    ]
    waiting = status_of(view_plan(pod_obj=pod(), rsv=rsv))
    ended = job(conditions=waiting["conditions"])
    status = status_of(view_plan(job_obj=ended, pod_obj=pod(), rsv=rsv, now=later(301)))
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout")
    assert "not scheduled: Unschedulable: " in status["message"]
    assert "Insufficient cpu" in status["message"]


def test_available_reservation_opens_it_then_records_evicting_before_evicting() -> None:
    plan = view_plan(pod_obj=pod(), rsv=reservation(phase="Available", node="node-1"))
    assert kinds(plan) == [
        "UpdateStatus:podmigrationjobs",
        "Event:ReservationScheduled",
        "Patch:reservations",
    ]
    opened = plan.actions[-1]
    assert isinstance(opened, Patch)
    assert opened.patch["metadata"]["annotations"][keys.CONSUMABLE] == "true"
    assert status_of(plan)["nodeName"] == "node-1"
    assert not any(isinstance(a, Evict) for a in plan.actions)
    scheduled = job(
        conditions=[
            {
                "type": "ReservationScheduled",
                "status": "True",
                "reason": "Scheduled",
                "message": "reserved on node-1",
            }
        ]
    )
    plan = view_plan(
        job_obj=scheduled,
        pod_obj=pod(),
        rsv=reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"}),
    )
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:Evicting", "Evict"]
    assert cond(status_of(plan), "Eviction")["reason"] == "Evicting"
    evict = plan.actions[-1]
    assert isinstance(evict, Evict)
    assert evict.uid == "uid-web-1"
    assert evict.policy == "Eviction"
    # Read again just before the eviction: the caches may lag a deletion.
    assert evict.reserved_node == "node-1"


@pytest.mark.parametrize("policy", ["Delete", "SoftEviction"])
def test_a_job_made_from_an_intercepted_eviction_always_evicts_through_the_api(
    policy: str,
) -> None:
    """Its requester asked for an eviction, which honours PodDisruptionBudgets: a policy
    changed since the job was made (the webhook makes none under another) never deletes
    the pod instead; other jobs follow the policy."""
    made = job()
    made["metadata"]["annotations"][keys.REQUESTER] = "system:serviceaccount:ops:drainer"
    args = MigrationControllerArgs.model_validate({"evictionPolicy": policy})
    for one_job, expected in ((made, "Eviction"), (job(), policy)):
        action = evict(dataclasses.replace(view(job_obj=one_job, pod_obj=pod()), args=args))
        assert action.policy == expected


def test_a_finished_job_made_from_an_eviction_is_deleted_once_kept_long_enough() -> None:
    """Drains make a job per pod they move, cluster-wide, and nobody deletes them: the
    controller marks one finished when it first sees it so (after an outage too: from
    then), and deletes it keepFinished (1h) later; jobs a user made are theirs."""
    made = job(phase="Failed", ttl="5m0s")
    made["metadata"]["annotations"][keys.REQUESTER] = "system:serviceaccount:ops:drainer"
    # Seen finished two hours past its TTL (the controller was down): marked now.
    first = view_plan(job_obj=made, now=later(7200))
    [mark] = [a for a in first.actions if isinstance(a, Patch)]
    assert mark.patch["metadata"]["annotations"] == {keys.FINISHED_AT: micro_timestamp(later(7200))}
    assert "Delete:podmigrationjobs" not in kinds(first)
    assert first.requeue_after == 3600
    made["metadata"]["annotations"][keys.FINISHED_AT] = micro_timestamp(later(7200))
    kept = view_plan(job_obj=made, now=later(7200 + 3599))
    assert "Delete:podmigrationjobs" not in kinds(kept)
    assert kept.requeue_after == 1.0
    gone = view_plan(job_obj=made, now=later(7200 + 3600))
    [delete] = [a for a in gone.actions if isinstance(a, Delete)]
    assert (delete.name, delete.uid) == ("job-1", "uid-job-1")
    # Not while its pod lives: the webhook would make a job of that name again, beside
    # a later attempt for the same pod.
    alive = view_plan(job_obj=made, pod_obj=pod(), now=later(7200 + 3600))
    assert "Delete:podmigrationjobs" not in kinds(alive)
    replaced = pod()
    replaced["metadata"]["uid"] = "uid-web-1-again"
    assert "Delete:podmigrationjobs" in kinds(
        view_plan(job_obj=made, pod_obj=replaced, now=later(7200 + 3600))
    )
    # A finished job still releases its Reservation first, whatever its spec says now.
    made["spec"]["ttl"] = "3000000h"
    held = view_plan(job_obj=made, rsv=reservation(phase="Available", node="node-1"),
                     now=later(7200 + 3600))  # fmt: skip
    assert kinds(held)[0] == "Delete:reservations"  # nothing was evicted
    made["metadata"]["annotations"][keys.FINISHED_AT] = "9999-12-31T23:59:59Z"
    assert kinds(view_plan(job_obj=made, now=later(60))) == ["Patch:podmigrationjobs"]
    # Never admitted (timed out Pending, say): the pod's UID is the one the webhook wrote in
    # podRef; a StatefulSet's pod of the same name made again does not keep the job.
    pending = job(phase="Failed", pod_uid=None)
    pending["spec"]["podRef"]["uid"] = "uid-web-1"
    pending["metadata"]["annotations"].update(
        {keys.REQUESTER: "tenant", keys.FINISHED_AT: micro_timestamp(later(7200))}
    )
    for uid, deleted in (("uid-web-1", False), ("uid-web-1-again", True)):
        again = pod()
        again["metadata"]["uid"] = uid
        plan = view_plan(job_obj=pending, pod_obj=again, now=later(7200 + 3600))
        assert ("Delete:podmigrationjobs" in kinds(plan)) is deleted
    # Never before the webhook stops reading it (creation, defaultJobTTL and a minute),
    # however short keepFinished is.
    brief = dataclasses.replace(
        view(job_obj=pending, now=later(300 + 59)),
        args=MigrationControllerArgs.model_validate(
            {"evictionInterception": {"keepFinished": "1s"}}
        ),
    )
    pending["metadata"]["annotations"][keys.FINISHED_AT] = micro_timestamp(later(10))
    assert jobs.decide(brief).requeue_after == 1.0
    # Nor before its own ttl has run out, when defaultJobTTL was lowered since.
    lowered = dataclasses.replace(
        brief,
        args=MigrationControllerArgs.model_validate(
            {"defaultJobTTL": "1m", "evictionInterception": {"keepFinished": "1s"}}
        ),
    )
    assert jobs.decide(lowered).requeue_after == 1.0
    mine = job(phase="Failed")
    assert "Delete:podmigrationjobs" not in kinds(view_plan(job_obj=mine, now=later(86400)))
    forever = dataclasses.replace(
        view(job_obj=made, now=later(86400)),
        args=MigrationControllerArgs.model_validate(
            {"evictionInterception": {"keepFinished": "0s"}}
        ),
    )
    assert kinds(jobs.decide(forever)) == []


def test_a_reservation_available_on_a_deleted_node_is_no_place_to_evict_to() -> None:
    scheduled = job(
        conditions=[
            {
                "type": "ReservationScheduled",
                "status": "True",
                "reason": "Scheduled",
                "message": "reserved on node-1",
            }
        ]
    )
    plan = view_plan(
        job_obj=scheduled,
        pod_obj=pod(),
        rsv=reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"}),
        node_gone=True,
    )
    assert not any(isinstance(a, Evict) for a in plan.actions)
    assert cond(status_of(plan), "ReservationScheduled")["status"] == "False"


@pytest.mark.parametrize(
    ("node", "said"),
    [
        # Placed on a node the node watch has not shown: added moments ago, or deleted
        # while the controller was away.
        pytest.param({"node_unseen": True}, None, id="not in the cache"),
        # A cordon, or a taint the pod does not tolerate: the replacement would stay
        # Pending there; the Reservation places its placeholder again.
        pytest.param(
            {"node_refuses": "node node-1 is cordoned"}, "node node-1 is cordoned", id="cordoned"
        ),
    ],
)
def test_nothing_is_evicted_into_a_place_on_a_node_not_known_to_take_the_replacement(
    node: dict[str, Any], said: str | None
) -> None:
    """The job neither opens the place nor evicts, and says why when it knows."""
    for rsv in (
        reservation(phase="Available", node="node-1"),
        reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"}),
    ):
        plan = view_plan(job_obj=job(conditions=[SCHEDULED]), pod_obj=pod(), rsv=rsv, **node)
        assert not [a for a in plan.actions if not isinstance(a, UpdateStatus)], kinds(plan)
        assert plan.requeue_after is not None
        if said is not None:
            scheduled = cond(status_of(plan), "ReservationScheduled")
            assert (scheduled["status"], said in scheduled["message"]) == ("False", True)
        seen = view_plan(job_obj=job(conditions=[SCHEDULED]), pod_obj=pod(), rsv=rsv)
        assert [a for a in seen.actions if not isinstance(a, UpdateStatus)], kinds(seen)


SCHEDULED = {
    "type": "ReservationScheduled",
    "status": "True",
    "reason": "Scheduled",
    "message": "reserved on node-1",
}
OPEN = reservation(
    phase="Available",
    node="node-1",
    annotations={keys.CONSUMABLE: "true", keys.OPENED_AT: "2026-01-01T12:00:00Z"},
)


def test_eviction_waits_a_moment_after_the_reservation_opened() -> None:
    scheduled = job(conditions=[SCHEDULED])
    opened = OPEN
    waiting = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=opened, now=later(0.5))
    assert waiting.actions == []
    assert waiting.requeue_after
    go = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=opened, now=later(1))
    assert kinds(go)[-1] == "Evict"


def test_the_opening_time_is_kept_to_the_microsecond_and_a_whole_second_is_waited() -> None:
    # Kept to the second, a Reservation opened at .9 would be evicted for 0.1 s later, before
    # the webhooks' caches saw it open, and two opened in the same second would tie in the
    # order the webhook offers them to replacements.
    opening = view_plan(
        pod_obj=pod(), rsv=reservation(phase="Available", node="node-1"), now=later(0.9)
    ).actions[-1]
    assert isinstance(opening, Patch)
    written = opening.patch["metadata"]["annotations"][keys.OPENED_AT]
    assert written == "2026-01-01T12:00:00.900000Z"
    scheduled = job(conditions=[SCHEDULED])
    opened = reservation(
        phase="Available",
        node="node-1",
        annotations={keys.CONSUMABLE: "true", keys.OPENED_AT: written},
    )
    waiting = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=opened, now=later(1.5))
    assert waiting.actions == []
    assert waiting.requeue_after == pytest.approx(0.4)
    go = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=opened, now=later(1.9))
    assert kinds(go)[-1] == "Evict"


NEVER = {keys.EVICTION_COST: str(keys.EVICTION_COST_NEVER)}


@pytest.mark.parametrize(
    ("change", "config"),
    [
        pytest.param({"annotations": NEVER}, {}, id="eviction cost MaxInt32"),
        pytest.param(
            {"labels": {"app": "web"}},
            {"labelSelector": {"matchLabels": {"tier": "batch"}}},
            id="labelSelector",
        ),
        pytest.param({}, {"namespaces": {"exclude": ["default"]}}, id="namespaces.exclude"),
        pytest.param(
            {"priority": 100}, {"priorityThreshold": {"name": "high"}}, id="priorityThreshold"
        ),
        pytest.param({"priorityClassName": "system-node-critical"}, {}, id="system-critical"),
        pytest.param({"volumes": [{"name": "cache", "emptyDir": {}}]}, {}, id="local storage"),
    ],
)
def test_a_pod_forbidden_since_admission_is_never_evicted(
    change: dict[str, Any], config: dict[str, Any]
) -> None:
    """The job was admitted, its Reservation is open; since then the pod changed, or the
    configuration did, so that arbitration would refuse it now: the job fails as
    arbitration would fail it (reason and message), and nothing is evicted."""
    target = pod(annotations=change.get("annotations"), labels=change.get("labels"))
    for field in ("priority", "priorityClassName", "volumes"):
        if field in change:
            target["spec"][field] = change[field]
    args = MigrationControllerArgs.model_validate(config)
    plan = jobs.decide(
        jobs.JobView(
            job=job(conditions=[SCHEDULED]),
            pod=target,
            reservation=OPEN,
            owner=None,
            workload_uid="uid-deploy",
            now=later(5),
            args=args,
            admission_key=ADMISSION_KEY,
            priority_classes={"high": 50},
        )
    )
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:ForbiddenMigratePod"]
    status = status_of(plan)
    refused = one(copy.deepcopy(target), priority_classes={"high": 50}, **config)
    assert (refused.verdict, refused.reason) == ("fail", "ForbiddenMigratePod")
    assert (status["phase"], status["reason"], status["message"]) == (
        "Failed",
        refused.reason,
        refused.message,
    )


SOFT = soft_eviction("job-1", {}, T0)
"""The soft eviction job-1 writes on its pod."""


@pytest.mark.parametrize(
    ("sent", "forbidden"),
    [
        pytest.param({}, True, id="held back before it was sent"),
        pytest.param({"deletionTimestamp": ts(later(1))}, False, id="terminating"),
        pytest.param({"annotations": {**NEVER, keys.SOFT_EVICTION: SOFT}}, False, id="soft"),
        # Someone else's soft eviction reached the pod too: whatever acts on it removes it.
        pytest.param({"annotations": {**NEVER, keys.SOFT_EVICTION: "{}"}}, False, id="not ours"),
    ],
)
def test_a_pod_forbidden_while_its_eviction_waits_is_never_evicted(
    sent: dict[str, Any], forbidden: bool
) -> None:
    """The job recorded Evicting, but the eviction was not sent (the executor held it back
    for a node cordoned moments before, or the controller restarted): arbitration's rules
    are run again before it is, as before a retry of a refused one. Once an eviction
    reached the pod, nothing is judged again."""
    target = pod(annotations=NEVER)
    target["metadata"] |= sent
    plan = view_plan(job_obj=job(conditions=EVICTING), pod_obj=target, rsv=OPEN, now=later(5))
    refused = "Event:ForbiddenMigratePod" in kinds(plan)
    assert refused is forbidden, kinds(plan)
    assert not any(isinstance(a, Evict) for a in plan.actions) or not forbidden


def test_a_soft_eviction_is_sent_once_and_withdrawn_when_its_job_ends_with_the_pod_there() -> None:
    """SoftEviction only annotates the pod; whatever acts on the annotation evicts it. The
    job waits for that without annotating it again; at its TTL it fails saying so, and
    the annotation goes (UID-guarded): acted on later, it would evict the pod with no
    Reservation holding a place. Another's soft eviction on the pod is left alone."""
    soft = MigrationControllerArgs.model_validate({"evictionPolicy": "SoftEviction"})
    annotated = pod(annotations={keys.SOFT_EVICTION: SOFT})

    def plan(job_obj: dict[str, Any], pod_obj: dict[str, Any], at: datetime) -> Any:
        seen = view(job_obj=job_obj, pod_obj=pod_obj, rsv=OPEN, now=at)
        return jobs.decide(dataclasses.replace(seen, args=soft))

    fresh = plan(job(conditions=EVICTING), pod(), later(5))
    assert any(isinstance(a, Evict) and a.job == "job-1" for a in fresh.actions)
    waiting = plan(job(conditions=EVICTING), annotated, later(5))
    assert waiting.actions == []
    assert waiting.requeue_after is not None
    expired = plan(job(conditions=EVICTING), annotated, later(400))
    assert kinds(expired) == ["UpdateStatus:podmigrationjobs", "Event:Timeout"]
    message = status_of(expired)["message"]
    assert "annotated for soft eviction" in message
    assert "nothing was evicted" not in message
    ended = job(phase="Failed", conditions=EVICTING)
    [withdrawn] = [
        a
        for a in plan(ended, annotated, later(401)).actions
        if isinstance(a, Patch) and a.namespace
    ]
    assert withdrawn.patch == {
        "metadata": {"uid": "uid-web-1", "annotations": {keys.SOFT_EVICTION: None}}
    }
    # One an earlier version wrote names no job: only one job migrates a pod at a time.
    legacy = pod(annotations={keys.SOFT_EVICTION: '{"reason": "PodMigrationJob"}'})
    assert any(isinstance(a, Patch) for a in plan(ended, legacy, later(401)).actions)
    for value in (soft_eviction("job-2", {}, T0), '{"reason": "another tool"}', "{"):
        others = pod(annotations={keys.SOFT_EVICTION: value})
        assert not any(isinstance(a, Patch) for a in plan(ended, others, later(401)).actions)
        left = status_of(plan(job(conditions=EVICTING), others, later(400)))["message"]
        assert "the annotation is left to its writer" in left
    assert not any(isinstance(a, Patch) for a in plan(ended, pod(), later(401)).actions)
    # Annotated by someone else before the eviction: not overwritten, and waited for.
    status, effects = start_eviction(
        dataclasses.replace(view(job_obj=job(), pod_obj=others, rsv=OPEN), args=soft), {}
    )
    assert not any(isinstance(e, Evict) for e in effects)
    assert cond(status, "Eviction")["reason"] == "Evicting"


def test_nothing_is_opened_or_evicted_until_the_namespace_shows_the_label() -> None:
    scheduled = job(
        conditions=[
            {
                "type": "ReservationScheduled",
                "status": "True",
                "reason": "Scheduled",
                "message": "reserved on node-1",
            }
        ]
    )
    unopened = reservation(phase="Available", node="node-1")
    plan = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=unopened, labelled=False)
    assert plan.actions == []
    assert plan.requeue_after
    opened = reservation(
        phase="Available",
        node="node-1",
        annotations={keys.CONSUMABLE: "true", keys.OPENED_AT: "2026-01-01T12:00:00Z"},
    )
    # Opened, settled, but the label is gone: no eviction until it is back.
    plan = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=opened, now=later(5), labelled=False)
    assert plan.actions == []
    go = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=opened, now=later(5), labelled=True)
    assert kinds(go)[-1] == "Evict"


def placed_again(*, opened: datetime, placed: datetime) -> dict[str, Any]:
    """An open Reservation whose Scheduled condition turned True at `placed`."""
    moved = reservation(
        phase="Available",
        node="node-2",
        annotations={keys.CONSUMABLE: "true", keys.OPENED_AT: micro_timestamp(opened)},
    )
    moved["status"]["conditions"] = [
        {"type": "Scheduled", "status": "True", "reason": "Scheduled",
         "lastTransitionTime": ts(placed)},
    ]  # fmt: skip
    return moved


def test_a_reservation_opened_before_its_place_moved_is_opened_again_before_the_eviction() -> None:
    """Opened, then its node was cordoned (the eviction held back) and its placeholder
    placed again on node-2: the settle time runs again from a new opening, so that the
    webhooks' caches can have seen the Reservation on node-2 before the replacement."""
    scheduled = job(
        conditions=[
            {"type": "ReservationScheduled", "status": "True", "reason": "Scheduled",
             "message": "reserved on node-2", "lastTransitionTime": ts(later(3))},
        ]
    )  # fmt: skip
    moved = placed_again(opened=T0, placed=later(3))
    plan = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=moved, now=later(5))
    assert not any(isinstance(a, Evict) for a in plan.actions)
    [opening] = [a for a in plan.actions if isinstance(a, Patch)]
    assert opening.patch["metadata"]["annotations"][keys.OPENED_AT] == micro_timestamp(later(5))
    assert plan.requeue_after == 1.0
    # Opened after it was placed, and settled: the eviction goes ahead.
    settled = placed_again(opened=later(3.5), placed=later(3))
    assert kinds(view_plan(job_obj=scheduled, pod_obj=pod(), rsv=settled, now=later(5)))[-1] == (
        "Evict"
    )


def _failed(ph: dict[str, Any]) -> None:
    ph["status"]["phase"] = "Failed"


def _elsewhere(ph: dict[str, Any]) -> None:
    ph["spec"]["nodeName"] = "node-2"


@pytest.mark.parametrize(
    "change",
    [pytest.param(None, id="none"), _failed, _elsewhere],
)
@pytest.mark.parametrize("conditions", [None, EVICTING], ids=["first attempt", "again"])
def test_no_eviction_while_the_placeholder_does_not_hold_the_place(
    change: Any, conditions: Any
) -> None:
    """The placeholder was preempted, deleted or finished, or is bound elsewhere: the
    Reservation still says
    Available until its own pass sees that. No eviction, first or again, is sent into a
    place nothing holds; once the placeholder holds it, the eviction goes."""
    scheduled = job(conditions=conditions or [
        {"type": "ReservationScheduled", "status": "True", "reason": "Scheduled",
         "message": "reserved on node-1"},
    ])  # fmt: skip
    rsv = reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"})
    ph = None
    if change is not None:
        ph = placeholder("uid-job-1", node="node-1")
        change(ph)
    waiting = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=rsv, ph=ph)
    assert not any(isinstance(a, Evict) for a in waiting.actions)
    assert waiting.requeue_after is not None
    held = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=rsv)
    assert kinds(held)[-1] == "Evict"


def test_an_eviction_held_back_while_the_place_moved_is_sent_after_a_new_opening() -> None:
    """Recorded Evicting, the eviction was held back (its node cordoned moments before),
    and the place moved to node-2: it is opened again and settles before it is sent."""
    moved = placed_again(opened=T0, placed=later(3))
    plan = view_plan(job_obj=job(conditions=EVICTING), pod_obj=pod(), rsv=moved, now=later(5))
    assert not any(isinstance(a, Evict) for a in plan.actions)
    [opening] = [a for a in plan.actions if isinstance(a, Patch)]
    assert opening.patch["metadata"]["annotations"][keys.OPENED_AT] == micro_timestamp(later(5))
    settled = placed_again(opened=later(5), placed=later(3))
    sent = view_plan(job_obj=job(conditions=EVICTING), pod_obj=pod(), rsv=settled, now=later(6))
    assert kinds(sent) == ["UpdateStatus:podmigrationjobs", "Evict"]


PLACED_AT_T0 = job(
    conditions=[
        {
            "type": "ReservationScheduled",
            "status": "True",
            "reason": "Scheduled",
            "message": "reserved on node-1",
            "lastTransitionTime": ts(T0),
        }
    ]
)
WHY = "403: admission webhook denied the request: no such labels here"


def test_a_namespace_refused_the_label_ends_the_job_before_anything_is_opened() -> None:
    unopened = reservation(phase="Available", node="node-1")
    refused = LabelRefused(why=WHY, waiting=frozenset({unopened["metadata"]["uid"]}))
    plan = view_plan(
        job_obj=PLACED_AT_T0, pod_obj=pod(), rsv=unopened, labelled=False, label_refused=refused
    )
    assert not any(isinstance(a, (Evict, Patch)) for a in plan.actions)
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "NamespaceNotLabelled")
    message = status["message"]
    assert WHY in message
    assert "nothing was evicted" in message
    assert f"'default' {keys.MIGRATING_LABEL}=true" in message


def test_a_refusal_given_for_other_reservations_is_no_answer_for_the_job() -> None:
    """Given for another job's, before a policy changed: this job waits for the
    namespace's next pass, which asks again."""
    unopened = reservation(phase="Available", node="node-1")
    stale = LabelRefused(why=WHY, waiting=frozenset({"uid-rsv-another"}))
    plan = view_plan(
        job_obj=PLACED_AT_T0, pod_obj=pod(), rsv=unopened, labelled=False, label_refused=stale
    )
    assert plan.actions == []
    assert plan.requeue_after


def test_paused_job_waits_with_its_reservation() -> None:
    plan = view_plan(
        job_obj=job(paused=True), pod_obj=pod(), rsv=reservation(phase="Available", node="node-1")
    )
    assert not any(isinstance(a, Evict) for a in plan.actions)
    assert not any(isinstance(a, Patch) for a in plan.actions)  # not opened: nothing to close


def test_a_job_paused_once_its_reservation_was_opened_closes_it_until_resumed() -> None:
    """Opened, then paused: a pod the workload makes meanwhile (a scale-up) would take the
    place of a pod that stays. Closed while paused; opened again when resumed."""
    opened = reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"})
    plan = view_plan(job_obj=job(paused=True), pod_obj=pod(), rsv=opened)
    assert not any(isinstance(a, Evict) for a in plan.actions)
    [close] = [a for a in plan.actions if isinstance(a, Patch)]
    assert close.patch["metadata"]["annotations"][keys.CONSUMABLE] == keys.CLOSED
    assert close.patch["metadata"]["resourceVersion"] == opened["metadata"]["resourceVersion"]
    closed = reservation(
        phase="Available", node="node-1", annotations={keys.CONSUMABLE: keys.CLOSED}
    )
    resumed = view_plan(job_obj=job(), pod_obj=pod(), rsv=closed)
    [reopen] = [a for a in resumed.actions if isinstance(a, Patch)]
    assert reopen.patch["metadata"]["annotations"][keys.CONSUMABLE] == "true"


def test_a_job_paused_after_its_admission_creates_no_reservation() -> None:
    """Nothing happens to a paused job until it is resumed: it holds no place either."""
    paused = view_plan(job_obj=job(paused=True), pod_obj=pod())
    assert paused.actions == []
    assert paused.requeue_after
    resumed = view_plan(job_obj=job(), pod_obj=pod())
    assert "Create:reservations" in kinds(resumed)


def test_job_delete_options_reach_the_eviction() -> None:
    job_obj = job()
    job_obj["spec"]["deleteOptions"] = {"gracePeriodSeconds": 60}
    plan = view_plan(
        job_obj=job_obj,
        pod_obj=pod(),
        rsv=reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"}),
    )
    evict = plan.actions[-1]
    assert isinstance(evict, Evict)
    assert evict.delete_options == {"gracePeriodSeconds": 60, "preconditions": {"uid": "uid-web-1"}}


@pytest.mark.parametrize(
    "rsv", [None, reservation(), reservation(phase="Available", node="node-1")]
)
def test_ttl_before_eviction_fails_without_evicting(rsv: dict[str, Any] | None) -> None:
    plan = view_plan(pod_obj=pod(), rsv=rsv, now=later(301))
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout")
    assert not any(isinstance(a, Evict) for a in plan.actions)


@pytest.mark.parametrize("mode", ["EvictDirectly", "ReservationFirst"])
def test_a_pod_that_stays_terminating_ends_its_job_at_the_ttl(mode: str) -> None:
    """A finalizer or an unreachable node may keep an evicted pod terminating for good:
    the job waits for it until its TTL, then fails (Timeout) saying so, and its place is
    released; it never counts as running for ever."""
    stuck = pod()
    stuck["metadata"].update(deletionTimestamp=ts(later(10)), finalizers=["example.com/keep"])
    evicting = [{"type": "Eviction", "status": "False", "reason": "Evicting", "message": "m"}]
    opened = reservation(
        phase="Available",
        node="node-1",
        annotations={keys.CONSUMABLE: "true", keys.OPENED_AT: ts(T0)},
    )
    rsv = opened if mode == "ReservationFirst" else None
    running = job(mode=mode, conditions=evicting)
    waiting = view_plan(job_obj=running, pod_obj=stuck, rsv=rsv, now=later(299))
    assert "Evict" not in kinds(waiting)
    assert waiting.requeue_after is not None
    if mode == "ReservationFirst":  # past its grace period: recorded, then waited for
        recorded = status_of(waiting)
        assert recorded["phase"] == "Running"
        assert (
            "a finalizer or an unreachable node keeps it" in cond(recorded, "Eviction")["message"]
        )
        running["status"] = recorded
        again = view_plan(job_obj=running, pod_obj=stuck, rsv=rsv, now=later(299))
        assert again.actions == []
    status = status_of(view_plan(job_obj=running, pod_obj=stuck, rsv=rsv, now=later(301)))
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout")
    assert "web-1 was still terminating" in status["message"]


@pytest.mark.parametrize("phase", ["Pending", "Running"])
@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        pytest.param(
            {"ttl": "3000000h"},
            "spec.ttl: '3000000h' is longer than a Go duration can be",
            id="a ttl beyond a Go duration",
        ),
        pytest.param(
            {"reservationOptions": {"template": {"spec": {"ttl": "3000000h"}}}},
            "spec.reservationOptions.template.spec.ttl: '3000000h' is longer than",
            id="the template's ttl beyond a Go duration",
        ),
        pytest.param(
            {"deleteOptions": {"gracePeriodSeconds": "60"}},
            "spec.deleteOptions.gracePeriodSeconds '60' is not a number of seconds",
            id="a grace period as a string",
        ),
        pytest.param(
            {"deleteOptions": {"gracePeriodSeconds": -1}},
            "gracePeriodSeconds -1 is not a number of seconds",
            id="a negative grace period",
        ),
        pytest.param(
            {"deleteOptions": {"propagationPolicy": "Sometimes"}},
            "propagationPolicy 'Sometimes' is not one of Orphan, Background, Foreground",
            id="an unknown propagation policy",
        ),
        pytest.param(
            {"deleteOptions": ["gracePeriodSeconds"]},
            "spec.deleteOptions is not an object",
            id="deleteOptions a list",
        ),
    ],
)
def test_a_spec_that_cannot_be_carried_out_ends_the_job_at_once(
    phase: str, spec: dict[str, Any], problem: str
) -> None:
    """The schema lets these in (ttl by its pattern; deleteOptions free-form, as the
    seeds' metav1.DeleteOptions): the job fails at once naming the field, before anything
    is created or evicted, and never raises on every pass."""
    written = job(phase=phase)
    written["spec"].update(spec)
    plan = view_plan(job_obj=written, pod_obj=pod(), now=later(1))
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert problem in status["message"]
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:InvalidSpec"]


def test_missing_pod_before_eviction_fails_the_job() -> None:
    plan = view_plan(pod_obj=None, rsv=reservation())
    assert (status_of(plan)["phase"], status_of(plan)["reason"]) == ("Failed", "MissingPod")


@pytest.mark.parametrize("mode", ["ReservationFirst", "EvictDirectly"])
def test_a_pod_replaced_under_its_name_before_eviction_fails_the_job_saying_so(mode: str) -> None:
    """A StatefulSet's pod recreated under the same name is another pod: the job evicts
    nothing and says the pod was replaced, not that none of that name exists."""
    plan = view_plan(job_obj=job(mode=mode), pod_obj=pod(uid="uid-web-1-again"))
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "MissingPod")
    assert status["message"] == (
        "pod default/web-1 was replaced before it was evicted (uid uid-web-1, now "
        "uid-web-1-again): the pod this job started for is gone"
    )
    assert not any(isinstance(a, Evict) for a in plan.actions)


def test_missing_referenced_reservation_fails() -> None:
    plan = view_plan(job_obj=job(reservation_ref="reservation-0"), pod_obj=pod())
    assert status_of(plan)["reason"] == "MissingReservation"


def by_hand(**changes: Any) -> dict[str, Any]:
    """A Reservation made by hand for the pod's ReplicaSet, Available on node-1."""
    found = reservation("by-hand", phase="Available", node="node-1")
    del found["metadata"]["annotations"][keys.JOB]
    for path, value in changes.items():
        if path == "owner_uid":
            found["spec"]["owners"][0]["controller"]["uid"] = value
        else:
            found["metadata"]["annotations"][path] = value
    return found


def smaller(found: dict[str, Any], *, cpu: str) -> dict[str, Any]:
    found["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return found


@pytest.mark.parametrize(
    ("rsv", "problem"),
    [
        pytest.param(
            by_hand(**{keys.JOB: "job-2"}),
            "was made for PodMigrationJob 'job-2'",
            id="another job's",
        ),
        pytest.param(
            smaller(by_hand(), cpu="100m"),
            "the pod requests more than reservation by-hand holds: cpu 200m (it holds 100m); "
            "its replacement would not be bound there",
            id="one that holds less than the pod asks",
        ),
        pytest.param(
            by_hand(owner_uid="uid-other-rs"),
            "Reservation 'by-hand' is not for this pod: its owners do not name it",
            id="one whose owners name another workload",
        ),
    ],
)
def test_another_jobs_reservation_named_evicts_nothing(rsv: dict[str, Any], problem: str) -> None:
    """Opening another job's Reservation for this pod would hand that job's place over
    before its own pod has left; one smaller than the pod, or for other pods, would be
    opened for a replacement the webhook does not bind there."""
    plan = view_plan(job_obj=job(reservation_ref="by-hand"), pod_obj=pod(), rsv=rsv)
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert problem in status["message"]
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:InvalidSpec"]


def test_the_jobs_own_reservation_is_not_judged_against_the_pods_requests() -> None:
    """Made from the pod, it holds what the workload's next pod asks, even when the pod
    was resized in place since: that one asks its template's requests."""
    resized = pod(cpu="500m")
    plan = view_plan(
        job_obj=job(), pod_obj=resized, rsv=reservation(phase="Available", node="node-1")
    )
    assert "Failed" not in str(status_of(plan).get("phase"))


def test_a_reservation_made_by_hand_for_the_pods_workload_is_used() -> None:
    plan = view_plan(job_obj=job(reservation_ref="by-hand"), pod_obj=pod(), rsv=by_hand())
    assert "Failed" not in str(status_of(plan).get("phase"))
    assert kinds(plan)[-1] == "Patch:reservations"  # opened


@pytest.mark.parametrize(
    ("named", "moves"),
    [
        (None, "its placeholder, refused there too, is placed again"),
        ("by-hand", "the Reservation, named in reservationRef, moves only if its own template"),
    ],
)
def test_a_place_on_a_node_the_pods_placement_excludes_evicts_nothing(
    named: str | None, moves: str
) -> None:
    """The job says why it waits, and what moves the place: its own Reservation's
    placeholder is placed again; one named in reservationRef is placed by its template."""
    rsv = by_hand() if named else reservation(phase="Available", node="node-1")
    refuses = "node node-1 does not match the pod's node selector or required node affinity"
    plan = view_plan(
        job_obj=job(reservation_ref=named, conditions=[SCHEDULED]),
        pod_obj=pod(),
        rsv=rsv,
        node_refuses=refuses,
    )
    assert not any(isinstance(a, Evict) for a in plan.actions)
    message = cond(status_of(plan), "ReservationScheduled")["message"]
    assert message.startswith(f"Reservation {rsv['metadata']['name']!r}: {refuses}")
    assert moves in message


@pytest.mark.parametrize("ref", [None, "by-hand"])
def test_nothing_is_evicted_where_the_replacement_would_break_its_topology_spread(
    ref: str | None,
) -> None:
    """The placeholder, of none of the pod's labels, was placed as none of its kind: its
    replacement could not go there. The job waits, saying why, and evicts nothing."""
    spread = "a pod like it on node node-1 would break its topology spread on zone (maxSkew 1)"
    rsv = by_hand() if ref else OPEN
    plan = view_plan(job_obj=job(reservation_ref=ref), pod_obj=pod(), rsv=rsv, node_spread=spread)
    assert not any(isinstance(a, Evict) for a in plan.actions)
    message = cond(status_of(plan), "ReservationScheduled")["message"]
    assert spread in message
    assert "nothing is evicted while it would" in message
    if ref is None:  # opened: closed again, so that no other pod takes the place meanwhile
        [close] = [a for a in plan.actions if isinstance(a, Patch)]
        assert close.patch["metadata"]["annotations"][keys.CONSUMABLE] == keys.CLOSED


def test_the_eviction_reads_the_node_again_for_where_the_replacement_may_go() -> None:
    """Just before the eviction the executor reads the Reservation's node again: judged
    by the pod's whole placement for the job's own Reservation, by its tolerations alone
    for one made by hand (its owners may name another pod)."""
    toleration = {"key": "gpu", "operator": "Exists"}
    placed = pod()
    placed["spec"] |= {"nodeSelector": {"pool": "a"}, "tolerations": [toleration]}
    own = evict(view(job_obj=job(), pod_obj=placed, rsv=OPEN))
    assert (own.reserved_node, own.placement) == (
        "node-1",
        {"tolerations": [toleration], "nodeSelector": {"pool": "a"}},
    )
    named = evict(view(job_obj=job(reservation_ref="by-hand"), pod_obj=placed, rsv=by_hand()))
    assert (named.reserved_node, named.placement) == ("node-1", {"tolerations": [toleration]})


def rival(name: str, *, created: datetime = T0, evicting: bool = False) -> dict[str, Any]:
    """Another job naming the Reservation made by hand, for another pod of the workload."""
    other = job(name, pod_name=f"pod-of-{name}", reservation_ref="by-hand")
    other["metadata"]["creationTimestamp"] = ts(created)
    if evicting:
        other["status"]["conditions"] = EVICTING
    return other


@pytest.mark.parametrize(
    ("others", "first"),
    [
        pytest.param((rival("job-0"),), "job-0", id="created in the same second, name first"),
        pytest.param((rival("job-9", created=T0 - timedelta(seconds=1)),), "job-9", id="earlier"),
        pytest.param((rival("job-9", created=later(5), evicting=True),), "job-9", id="evicting"),
        pytest.param(
            (rival("job-0", created=later(5)), rival("job-9", evicting=True)),
            "job-9",
            id="of two, the one evicting",
        ),
    ],
)
def test_of_two_jobs_naming_one_reservation_the_one_after_evicts_nothing(
    others: tuple[dict[str, Any], ...], first: str
) -> None:
    """One Reservation holds one place: the second job's pod, evicted too, would find
    none. The job that goes first (`goes_first`) is the same whichever job asks."""
    plan = view_plan(
        job_obj=job(reservation_ref="by-hand"), pod_obj=pod(), rsv=by_hand(), sharing=others
    )
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert f"is named by PodMigrationJob {first!r} too" in status["message"]
    assert not any(isinstance(a, Evict) for a in plan.actions)


@pytest.mark.parametrize(
    ("opener", "others", "first"),
    [
        pytest.param(
            "uid-job-9",
            (rival("job-0", evicting=True), rival("job-9", created=later(5))),
            "job-9",
            id="the opener, whatever another's status says",
        ),
        pytest.param(
            "uid-job-9",
            (rival("job-0", evicting=True), rival("job-9", created=later(5)), rival("job-8")),
            "job-9",
            id="the opener of three",
        ),
        pytest.param(
            "uid-gone",
            (
                rival("job-0", created=later(5), evicting=True),
                rival("job-2", created=T0 - timedelta(seconds=1)),
            ),
            "job-2",
            id="an opener that has ended: by creation, status aside",
        ),
    ],
)
def test_the_job_that_opened_a_shared_reservation_goes_first(
    opener: str, others: tuple[dict[str, Any], ...], first: str
) -> None:
    """Whether a job tried an eviction is said by its status, which whoever may abort the
    job writes: the Reservation's record of who opened it, which only Berth writes, orders
    the jobs once there is one."""
    plan = view_plan(
        job_obj=job(reservation_ref="by-hand"),
        pod_obj=pod(),
        rsv=by_hand(**{keys.OPENED_FOR: opener}),
        sharing=others,
    )
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert f"is named by PodMigrationJob {first!r} too" in status["message"]
    assert not any(isinstance(a, Evict) for a in plan.actions)


def test_the_job_that_opened_a_shared_reservation_goes_on_before_one_evicting() -> None:
    mine = job(reservation_ref="by-hand")
    mine["metadata"]["creationTimestamp"] = ts(later(9))
    plan = view_plan(
        job_obj=mine,
        pod_obj=pod(),
        rsv=by_hand(**{keys.OPENED_FOR: "uid-job-1"}),
        sharing=(rival("job-0", evicting=True),),
    )
    assert "Failed" not in str(status_of(plan).get("phase"))


def test_opening_records_the_job_that_opened() -> None:
    plan = view_plan(job_obj=job(reservation_ref="by-hand"), pod_obj=pod(), rsv=by_hand())
    opened = [a for a in plan.actions if isinstance(a, Patch)][-1]
    annotations = opened.patch["metadata"]["annotations"]
    assert annotations[keys.OPENED_FOR] == "uid-job-1"
    assert annotations[keys.CONSUMABLE] == "true"


def test_of_two_jobs_naming_one_reservation_the_first_goes_on() -> None:
    plan = view_plan(
        job_obj=job(reservation_ref="by-hand"),
        pod_obj=pod(),
        rsv=by_hand(),
        sharing=(rival("job-2"), rival("job-3", created=later(1))),
    )
    assert "Failed" not in str(status_of(plan).get("phase"))
    assert kinds(plan)[-1] == "Patch:reservations"  # opened


def test_reservation_on_the_pods_own_node_is_never_a_reason_to_evict() -> None:
    plan = view_plan(
        job_obj=job(reservation_ref="mine"),
        pod_obj=pod(node="node-0"),
        rsv=reservation("mine", phase="Available", node="node-0"),
    )
    assert status_of(plan)["phase"] == "Failed"
    assert not any(isinstance(a, Evict) for a in plan.actions)


# ----- the eviction -----------------------------------------------------------------------


def test_missing_pod_after_evicting_is_evict_complete_not_missing() -> None:
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=None,
        rsv=reservation(phase="Available", node="node-1"),
    )
    status = status_of(plan)
    assert status["phase"] == "Running"
    assert cond(status, "Eviction")["reason"] == "EvictComplete"
    assert cond(status, "PodBoundReservation")["reason"] == "WaitForPodBindReservation"
    assert "Event:EvictComplete" in kinds(plan)


def test_same_name_pod_with_a_new_uid_counts_as_evicted() -> None:
    statefulset_pod = pod(uid="uid-new", rs=None)
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=statefulset_pod,
        rsv=reservation(phase="Available", node="node-1"),
    )
    assert cond(status_of(plan), "Eviction")["reason"] == "EvictComplete"


def test_pod_still_there_is_evicted_again() -> None:
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=pod(),
        rsv=reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"}),
    )
    # The status written back as read first: refused (409) if the job was aborted or
    # paused since this copy, and then nothing is evicted.
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Evict"]
    written = plan.actions[0]
    assert isinstance(written, UpdateStatus)
    assert written.obj["metadata"]["resourceVersion"] == "10"
    assert written.obj["status"] == job(conditions=EVICTING)["status"]


@pytest.mark.parametrize(
    ("phase", "node", "opened"),
    [
        pytest.param("Pending", None, False, id="reservation not yet placed"),
        pytest.param("Available", "node-1", False, id="reservation not opened"),
        pytest.param("Available", "node-0", True, id="reservation on the pod's own node"),
    ],
)
def test_an_eviction_written_by_a_user_evicts_nothing(
    phase: str, node: str | None, *, opened: bool
) -> None:
    """An Eviction condition is status a user may write on an admitted job: without a
    Reservation open on another node, nothing is evicted and the job ends."""
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=pod(),
        rsv=reservation(
            phase=phase, node=node, annotations={keys.CONSUMABLE: "true"} if opened else {}
        ),
    )
    assert "Evict" not in kinds(plan)
    assert status_of(plan)["phase"] == "Failed"
    assert status_of(plan)["reason"] == "NotAdmitted"


def test_a_reservation_deleted_while_the_pod_is_still_to_be_evicted_ends_the_job() -> None:
    """Deleted by hand while a PDB refused the eviction (or never made, the Eviction
    condition being a user's): nothing is evicted, and the job says the Reservation is
    missing rather than blaming the status."""
    plan = view_plan(job_obj=job(conditions=EVICTING), pod_obj=pod(), rsv=None)
    assert "Evict" not in kinds(plan)
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "MissingReservation")
    assert "Reservation 'uid-job-1' does not exist" in status["message"]


def test_a_reservation_that_lost_its_place_while_the_pod_was_still_there_is_waited_for() -> None:
    """Berth opened the Reservation and tried to evict (a PDB refused); then the node under
    the placeholder was deleted and the Reservation is Pending again. Nothing is evicted,
    the job says why and waits; once a new placeholder holds a place, the eviction goes on
    there."""
    blocked = [{**EVICTING[0], "reason": "BlockedByPDB"}]
    lost = reservation(phase="Pending", annotations={keys.CONSUMABLE: "true"})
    lost["status"]["conditions"] = [
        {"type": "Scheduled", "status": "False", "reason": "Lost",
         "message": "node node-1 of the placeholder pod was deleted"},
    ]  # fmt: skip
    plan = view_plan(job_obj=job(conditions=blocked), pod_obj=pod(), rsv=lost)
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs"]
    status = status_of(plan)
    assert status["phase"] == "Running"
    eviction = cond(status, "Eviction")
    assert (eviction["status"], eviction["reason"]) == ("False", "Evicting")
    assert "node node-1 of the placeholder pod was deleted" in eviction["message"]
    assert plan.requeue_after is not None
    # Said once: the next pass writes nothing until something changes.
    again = view_plan(job_obj=job(conditions=status["conditions"]), pod_obj=pod(), rsv=lost)
    assert kinds(again) == []
    # A new placeholder bound on node-2: the eviction goes on, to there.
    placed = reservation(phase="Available", node="node-2", annotations={keys.CONSUMABLE: "true"})
    assert "Evict" in kinds(view_plan(job_obj=job(conditions=blocked), pod_obj=pod(), rsv=placed))


def test_ttl_while_a_pdb_blocks_the_eviction_is_a_timeout_even_once_its_reservation_ended() -> None:
    """The job's TTL and its Reservation's are the same: whichever the controller sees end
    first, a job whose eviction a PDB kept refusing ends as Timeout, evicting nothing."""
    blocked = [{**EVICTING[0], "reason": "BlockedByPDB"}]
    expired = reservation(phase="Failed", node="node-1", annotations={keys.CONSUMABLE: "true"})
    plan = view_plan(job_obj=job(conditions=blocked), pod_obj=pod(), rsv=expired, now=later(301))
    assert "Evict" not in kinds(plan)
    assert (status_of(plan)["phase"], status_of(plan)["reason"]) == ("Failed", "Timeout")


def test_terminating_pod_is_waited_for() -> None:
    terminating = pod()
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:01Z"
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=terminating,
        rsv=reservation(phase="Available", node="node-1"),
    )
    assert plan.actions == []
    assert plan.requeue_after


def test_blocked_eviction_is_reported_as_blocked_by_pdb() -> None:
    plan = jobs.eviction_refused(
        view(job_obj=job(conditions=EVICTING), pod_obj=pod()),
        status_code=429,
        message="Cannot evict pod as it would violate the pod's disruption budget.",
        by_budget=True,
    )
    status = status_of(plan)
    assert cond(status, "Eviction")["reason"] == "BlockedByPDB"
    assert status["reason"] == "BlockedByPDB"
    assert "Event:BlockedByPDB" in kinds(plan)
    assert plan.requeue_after == EVICTION_RETRY


def open_reservation(**annotations: str) -> dict[str, Any]:
    return reservation(
        phase="Available",
        node="node-1",
        annotations={
            keys.CONSUMABLE: "true",
            keys.OPENED_AT: "2026-01-01T12:00:00Z",
            **annotations,
        },
    )


def closed_reservation(at: str = "2026-01-01T12:00:01.000000Z") -> dict[str, Any]:
    return open_reservation(**{keys.CONSUMABLE: keys.CLOSED, keys.CLOSED_AT: at})


@pytest.mark.parametrize("status_code", [429, 500])
def test_a_refused_eviction_closes_the_reservation_while_the_pod_stays(status_code: int) -> None:
    """Open while the pod stays, the place could be taken by another pod of the workload
    (another job's replacement): closed, conditional on the copy read."""
    plan = jobs.eviction_refused(
        view(job_obj=job(conditions=EVICTING), pod_obj=pod(), rsv=open_reservation(), now=later(1)),
        status_code=status_code,
        message="refused",
        by_budget=status_code == 429,
    )
    close = plan.actions[-1]
    assert isinstance(close, Patch)
    assert close.name == "uid-job-1"
    assert close.patch == {
        "metadata": {
            "resourceVersion": "5",
            "annotations": {
                keys.CONSUMABLE: keys.CLOSED,
                keys.CLOSED_AT: "2026-01-01T12:00:01.000000Z",
            },
        }
    }
    # Reopened a settle time before the next attempt, which comes EVICTION_RETRY after this.
    assert plan.requeue_after == EVICTION_RETRY - 1
    # Refused again the same way: nothing more is said, the Reservation is closed again.
    said = job(conditions=status_of(plan)["conditions"])
    again = jobs.eviction_refused(
        view(job_obj=said, pod_obj=pod(), rsv=open_reservation(), now=later(6)),
        status_code=status_code,
        message="refused",
        by_budget=status_code == 429,
    )
    assert kinds(again) == ["Patch:reservations"]


def test_a_refused_eviction_leaves_a_claimed_reservation_open() -> None:
    claimed = open_reservation(**{keys.CLAIM: "token"})
    plan = jobs.eviction_refused(
        view(job_obj=job(conditions=EVICTING), pod_obj=pod(), rsv=claimed),
        status_code=429,
        message="refused",
        by_budget=True,
    )
    assert "Patch:reservations" not in kinds(plan)
    assert plan.requeue_after == EVICTION_RETRY


def test_a_closed_reservation_is_reopened_then_the_eviction_tried_again_after_the_settle() -> None:
    blocked = job(conditions=[{**EVICTING[0], "reason": "BlockedByPDB"}])
    early = view_plan(job_obj=blocked, pod_obj=pod(), rsv=closed_reservation(), now=later(3))
    assert early.actions == []
    assert early.requeue_after == pytest.approx(2)
    reopen = view_plan(job_obj=blocked, pod_obj=pod(), rsv=closed_reservation(), now=later(5))
    assert kinds(reopen) == ["Patch:reservations"]
    patch = reopen.actions[0]
    assert isinstance(patch, Patch)
    assert patch.patch["metadata"]["annotations"] == {
        keys.CONSUMABLE: "true",
        keys.OPENED_AT: "2026-01-01T12:00:05.000000Z",
        keys.OPENED_FOR: "uid-job-1",
        keys.CLOSED_AT: None,
    }
    reopened = open_reservation(**{keys.OPENED_AT: "2026-01-01T12:00:05.000000Z"})
    settling = view_plan(job_obj=blocked, pod_obj=pod(), rsv=reopened, now=later(5.5))
    assert settling.actions == []
    assert settling.requeue_after == pytest.approx(0.5)
    assert kinds(view_plan(job_obj=blocked, pod_obj=pod(), rsv=reopened, now=later(6))) == [
        "UpdateStatus:podmigrationjobs",
        "Evict",
    ]


def test_a_closed_reservation_stays_closed_while_a_budget_allows_no_disruption() -> None:
    """Refused again for sure: no reopening, no eviction, nothing written; looked at again
    as often as an eviction would be tried."""
    blocked = job(conditions=[{**EVICTING[0], "reason": "BlockedByPDB"}])
    plan = jobs.decide(
        view(
            job_obj=blocked,
            pod_obj=pod(),
            rsv=closed_reservation(),
            now=later(60),
            exhausted_pdb="default/tight",
        )
    )
    assert plan.actions == []
    assert plan.requeue_after == EVICTION_RETRY
    # Refused for another reason (a Delete the API server refused ignores budgets): the
    # budget holds nothing back.
    failed = job(conditions=[{**EVICTING[0], "reason": "FailedEvict"}])
    plan = jobs.decide(
        view(
            job_obj=failed,
            pod_obj=pod(),
            rsv=closed_reservation(),
            now=later(60),
            exhausted_pdb="default/tight",
        )
    )
    assert kinds(plan) == ["Patch:reservations"]


def test_a_pod_gone_while_its_reservation_is_closed_opens_it_to_the_replacement() -> None:
    """Deleted by someone else between two attempts: its replacement may come now."""
    blocked = job(conditions=[{**EVICTING[0], "reason": "BlockedByPDB"}])
    plan = view_plan(job_obj=blocked, pod_obj=None, rsv=closed_reservation(), now=later(2))
    assert "Patch:reservations" in kinds(plan)
    assert cond(status_of(plan), "Eviction")["reason"] == "EvictComplete"
    assert "Failed" not in str(status_of(plan).get("phase"))
    # The same as soon as it is terminating: the workload replaces it from then on.
    leaving = pod()
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:01Z"
    plan = view_plan(
        job_obj=blocked,
        pod_obj=leaving,
        rsv=closed_reservation(),
        now=later(2),
    )
    assert kinds(plan) == ["Patch:reservations"]


def test_a_closed_reservation_that_lost_its_place_is_waited_for_not_taken_for_forgery() -> None:
    blocked = job(conditions=[{**EVICTING[0], "reason": "BlockedByPDB"}])
    lost = closed_reservation()
    lost["status"] = {"phase": "Pending"}
    plan = view_plan(job_obj=blocked, pod_obj=pod(), rsv=lost, now=later(9))
    assert "Evict" not in kinds(plan)
    assert status_of(plan)["phase"] == "Running"
    assert "lost its place" in cond(status_of(plan), "Eviction")["message"]


@pytest.mark.parametrize("status_code", [403, 429, 500, 503])
def test_any_other_refused_eviction_is_recorded_with_its_code_and_an_event(
    status_code: int,
) -> None:
    plan = jobs.eviction_refused(
        view(job_obj=job(conditions=EVICTING), pod_obj=pod()),
        status_code=status_code,
        message='pods "web-1" is forbidden',
        by_budget=False,
    )
    status = status_of(plan)
    assert cond(status, "Eviction")["reason"] == "FailedEvict"
    assert (
        status["message"] == f'the Eviction API answered {status_code}: pods "web-1" is forbidden'
    )
    assert "Event:FailedEvict" in kinds(plan)
    assert plan.requeue_after == EVICTION_RETRY


def test_evict_directly_evicts_then_succeeds_when_the_pod_is_gone() -> None:
    direct = job(mode="EvictDirectly")
    plan = view_plan(job_obj=direct, pod_obj=pod())
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:Evicting", "Evict"]
    direct["status"]["conditions"] = EVICTING
    done = view_plan(job_obj=direct, pod_obj=None)
    assert (status_of(done)["phase"], status_of(done)["status"]) == ("Succeed", "Complete")


# ----- ReservationFirst, after the eviction -----------------------------------------------


def test_bound_and_ready_owner_completes_the_job() -> None:
    new = pod("web-2", node="node-1")
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=None,
        rsv=reservation(phase="Succeeded", node="node-1", owners=["web-2"]),
        owner=new,
    )
    status = status_of(plan)
    assert (status["phase"], status["status"]) == ("Succeed", "Complete")
    assert status["podRef"]["name"] == "web-2"
    assert cond(status, "PodBoundReservation")["status"] == "True"
    assert cond(status, "BoundPodReady")["status"] == "True"
    assert kinds(plan)[-1] == "Event:Complete"


def stuck_terminating() -> dict[str, Any]:
    """The migrated pod, evicted, kept by a finalizer (or a node that no longer answers)."""
    stuck = pod()
    stuck["metadata"].update(deletionTimestamp=ts(later(1)), finalizers=["example.com/keep"])
    return stuck


def test_a_pod_left_terminating_whose_replacement_runs_completes_the_job() -> None:
    """A drain of a failing node: the evicted pod never finishes terminating, while its
    ReplicaSet's replacement took the place and is Ready: the job ends there, rather
    than holding its migration slots until its TTL (or for ever, without one)."""
    done = reservation(phase="Succeeded", node="node-1", owners=["web-2"])
    # Within its grace period (its deletion timestamp, and a margin): its shutdown is
    # waited for, as any pod's.
    for now in (T0, later(15)):
        waiting = view_plan(
            job_obj=job(conditions=EVICTING),
            pod_obj=stuck_terminating(),
            rsv=done,
            owner=pod("web-2", node="node-1"),
            now=now,
        )
        assert waiting.actions == []
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=stuck_terminating(),
        rsv=done,
        owner=pod("web-2", node="node-1"),
        now=later(16),
    )
    status = status_of(plan)
    assert (status["phase"], status["status"]) == ("Succeed", "Complete")
    assert status["podRef"]["name"] == "web-2"
    eviction = cond(status, "Eviction")
    assert (eviction["status"], eviction["reason"]) == ("True", "EvictComplete")
    assert "still terminating" in eviction["message"]
    assert kinds(plan)[-1] == "Event:Complete"
    # Past the TTL, within a long grace period: the migration worked, and says so.
    long_grace = stuck_terminating()
    long_grace["metadata"]["deletionTimestamp"] = ts(later(600))
    late = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=long_grace,
        rsv=done,
        owner=pod("web-2", node="node-1"),
        now=later(301),
    )
    assert (status_of(late)["phase"], status_of(late)["status"]) == ("Succeed", "Complete")


@pytest.mark.parametrize(
    ("owner", "rsv"),
    [
        pytest.param(
            pod("web-2", node="node-1", ready=False),
            reservation(phase="Succeeded", node="node-1", owners=["web-2"]),
            id="bound, not ready",
        ),
        pytest.param(
            pod("web-2", node=None, gates=[keys.RESERVATION_GATE]),
            reservation(phase="Available", node="node-1", owners=["web-2"]),
            id="in handover",
        ),
        pytest.param(None, reservation(phase="Available", node="node-1"), id="none yet"),
    ],
)
def test_a_pod_left_terminating_is_waited_for_while_its_replacement_is_not_ready(
    owner: dict[str, Any] | None, rsv: dict[str, Any]
) -> None:
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=stuck_terminating(),
        rsv=rsv,
        owner=owner,
        now=later(60),
    )
    assert "Evict" not in kinds(plan)
    assert plan.requeue_after
    status = status_of(plan)
    assert status["phase"] == "Running"
    assert "still terminating" in cond(status, "Eviction")["message"]


def test_a_pod_left_terminating_ends_its_job_when_the_reservation_ends() -> None:
    """A StatefulSet's pod (its replacement comes only once it is gone): the Reservation
    expires, and the job ends then, saying so, rather than waiting for the pod."""
    expired = reservation(phase="Failed", node="node-1")
    plan = view_plan(
        job_obj=job(conditions=EVICTING), pod_obj=stuck_terminating(), rsv=expired, now=later(60)
    )
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "ReservationExpired")
    assert "still terminating" in cond(status, "Eviction")["message"]


def _refused_owner() -> dict[str, Any]:
    owner = pod("web-2", node=None)
    owner["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu.",
                "lastTransitionTime": ts(later(1)),
            }
        ],
    }
    return owner


def _owner_gone() -> dict[str, Any]:
    claimed = reservation(phase="Available", node="node-1", owners=["web-2"])
    [update] = [a for a in rsv_plan(claimed, owner=None).actions if isinstance(a, UpdateStatus)]
    return {**claimed, "status": update.obj["status"]}


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        pytest.param({"rsv": None}, "MissingReservation", id="Reservation deleted"),
        pytest.param({"rsv": _owner_gone()}, "ReservationOwnerGone", id="owner deleted unbound"),
        pytest.param(
            {"workload_deleted": "ReplicaSet web-rs (uid uid-web-rs)"},
            "WorkloadScaledDown",
            id="workload deleted",
        ),
        pytest.param(
            {
                "rsv": reservation(phase="Available", node="node-1", owners=["web-2"]),
                "owner": _refused_owner(),
                "now": later(200),
            },
            "ReservationLost",
            id="handed over, refused for two minutes",
        ),
        pytest.param({"node_gone": True}, "ReservationLost", id="node deleted"),
    ],
)
def test_a_pod_left_terminating_ends_its_job_as_a_pod_gone_would(
    case: dict[str, Any], reason: str
) -> None:
    """Past its grace period the evicted pod counts as gone: whatever ends a job whose pod
    is gone ends it too, rather than the job waiting for the pod until its TTL, or for
    ever without one."""
    args: dict[str, Any] = {
        "rsv": reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"}),
        "now": later(60),
        **case,
    }
    ttl = "" if reason != "ReservationLost" else "5m0s"
    for pod_obj in (None, stuck_terminating()):
        plan = view_plan(job_obj=job(conditions=EVICTING, ttl=ttl), pod_obj=pod_obj, **args)
        status = status_of(plan)
        assert (status["phase"], status["reason"]) == ("Failed", reason), pod_obj
        said = cond(status, "Eviction")["message"]
        assert ("still terminating" in said) is (pod_obj is not None)


def test_a_job_ending_on_a_reservation_made_by_hand_says_that_it_stays() -> None:
    """A Reservation a job's reservationRef names is its maker's: the job's end releases
    nothing (`release`), and its message says so rather than that the place is freed
    and the replacement let go."""
    made = reservation(name="made", phase="Available", node="node-1", owners=["web-2"])
    lost = status_of(
        view_plan(
            job_obj=job(conditions=EVICTING, reservation_ref="made"),
            rsv=made,
            owner=_refused_owner(),
            now=later(200),
        )
    )
    assert (lost["phase"], lost["reason"]) == ("Failed", "ReservationLost")
    assert "Reservation 'made', made by hand, is not the job's to release" in lost["message"]
    assert "replacement pod web-2 stays tied to that node" in lost["message"]
    assert "is deleted" not in lost["message"]
    own = status_of(
        view_plan(job_obj=job(conditions=EVICTING), rsv=reservation(phase="Available",
                  node="node-1", owners=["web-2"]), owner=_refused_owner(), now=later(200))
    )  # fmt: skip
    assert "is deleted so that its workload creates one" in own["message"]


def test_a_pod_seen_terminating_then_gone_has_its_eviction_brought_up_to_date() -> None:
    """Within its grace period when the TTL came, the pod is said to be still in it; once
    gone, the condition says so, with no second event."""
    long_grace = stuck_terminating()
    long_grace["metadata"]["deletionTimestamp"] = ts(later(600))
    waiting = reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"})
    ended = status_of(
        view_plan(job_obj=job(conditions=EVICTING), pod_obj=long_grace, rsv=waiting, now=later(301))
    )
    assert (ended["phase"], ended["reason"]) == ("Failed", "Timeout")
    assert "its grace period has not ended" in cond(ended, "Eviction")["message"]
    assert "web-1 was still terminating" in ended["message"]
    running = job(conditions=EVICTING)
    first = view_plan(job_obj=running, pod_obj=stuck_terminating(), rsv=waiting, now=later(60))
    running["status"] = status_of(first)
    assert "Event:EvictComplete" in kinds(first)
    gone = view_plan(job_obj=running, pod_obj=None, rsv=waiting, now=later(70))
    assert "Event:EvictComplete" not in kinds(gone)
    assert cond(status_of(gone), "Eviction")["message"] == "pod default/web-1 is gone"


def test_bound_owner_not_ready_waits() -> None:
    new = pod("web-2", node="node-1", ready=False)
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=None,
        rsv=reservation(phase="Succeeded", node="node-1", owners=["web-2"]),
        owner=new,
    )
    status = status_of(plan)
    assert status["phase"] == "Running"
    assert cond(status, "BoundPodReady")["reason"] == "WaitForBoundPodReady"


def test_a_workload_deleted_after_the_eviction_ends_the_job_at_once() -> None:
    """No replacement will come: the place is released rather than held (with the
    namespace's label) until the TTL, or for a day without one."""
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=None,
        rsv=reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"}),
        workload_deleted="ReplicaSet web-rs (uid uid-web-rs)",
    )
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "WorkloadScaledDown")
    assert status["message"].startswith("ReplicaSet web-rs (uid uid-web-rs) was deleted")


def test_ttl_after_eviction_fails_and_says_what_happened() -> None:
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=None,
        rsv=reservation(phase="Available", node="node-1"),
        now=later(301),
    )
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout")
    assert "after the pod was evicted" in status["message"]


def test_a_replacement_the_scheduler_refuses_is_reported_then_let_go() -> None:
    """Handed over, the replacement does not fit where its place was held (in the default
    scope, a pod of higher priority took it): the job says so; refused for two minutes,
    it ends ReservationLost and the replacement is let go, rather than staying Pending
    until the TTL (or for ever, without one); the TTL, if it comes first, ends it too."""
    owner = pod("web-2", node=None)
    refused = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient cpu.",
        "lastTransitionTime": ts(later(1)),
    }
    owner["status"] = {"phase": "Pending", "conditions": [refused]}
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    for now in (later(1), later(120)):
        waiting = status_of(
            view_plan(job_obj=job(conditions=EVICTING), rsv=rsv, owner=owner, now=now)
        )
        bound = cond(waiting, "PodBoundReservation")
        assert (bound["status"], bound["reason"]) == ("False", "WaitForPodBindReservation")
        assert "web-2 does not fit on node-1" in bound["message"]
        assert "3 Insufficient cpu" in bound["message"]
    lost = status_of(
        view_plan(job_obj=job(conditions=EVICTING), rsv=rsv, owner=owner, now=later(121))
    )
    assert (lost["phase"], lost["reason"]) == ("Failed", "ReservationLost")
    assert "refused the replacement on node-1" in lost["message"]
    assert "for 120s (0/3 nodes are available: 3 Insufficient cpu.)" in lost["message"]
    refused["lastTransitionTime"] = ts(later(250))
    ended = status_of(
        view_plan(job_obj=job(conditions=EVICTING), rsv=rsv, owner=owner, now=later(301))
    )
    assert (ended["phase"], ended["reason"]) == ("Failed", "Timeout")
    assert "3 Insufficient cpu" in ended["message"]
    # Just ungated, not tried yet: its condition still says it was gated.
    owner["status"]["conditions"][0].update(
        reason="SchedulingGated", message="Scheduling is blocked due to non-empty scheduling gates"
    )
    plain = status_of(view_plan(job_obj=job(conditions=EVICTING), rsv=rsv, owner=owner))
    assert "waiting for a replacement pod" in cond(plain, "PodBoundReservation")["message"]


@pytest.mark.parametrize(
    ("since", "making_room"),
    [
        pytest.param(None, False, id="a refusal of no readable time"),
        pytest.param(ts(later(1)), True, id="victims of a preemption for it still leaving"),
    ],
)
def test_a_refused_replacement_is_not_let_go_while_it_may_yet_bind(
    since: str | None, making_room: bool
) -> None:
    owner = pod("web-2", node=None)
    refused: dict[str, Any] = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 1 Insufficient cpu.",
    }
    if since is not None:
        refused["lastTransitionTime"] = since
    owner["status"] = {"phase": "Pending", "conditions": [refused]}
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        rsv=rsv,
        owner=owner,
        now=later(200),
        making_room=making_room,
    )
    status = status_of(plan)
    assert status["phase"] == "Running"
    assert "does not fit on node-1" in cond(status, "PodBoundReservation")["message"]


def test_a_node_cordoned_after_the_handover_ends_the_job_once_it_keeps_refusing() -> None:
    """The replacement was handed the place, then its node was cordoned (or tainted
    against it): its affinity ties it there. Refused for a moment, the job waits (a node's
    readiness may flap); refused for 30 s, the job ends at once rather than at its TTL,
    which it may not have, and the released replacement is then let go."""
    owner = pod("web-2", node=None)
    owner["status"] = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 1 node(s) were unschedulable.",
                "lastTransitionTime": ts(T0),
            }
        ],
    }
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    cordoned = "node node-1 is cordoned"

    def decided(seconds: float, refuses: str | None) -> dict[str, Any]:
        return status_of(
            view_plan(
                job_obj=job(conditions=EVICTING),
                rsv=rsv,
                owner=owner,
                now=later(seconds),
                node_refuses=refuses,
            )
        )

    assert decided(10, cordoned).get("phase") != "Failed"
    assert decided(40, None).get("phase") != "Failed"  # full, say: the TTL decides
    ended = decided(40, cordoned)
    assert (ended["phase"], ended["reason"]) == ("Failed", "ReservationLost")
    assert ended["message"].startswith("node node-1 is cordoned after the pod was evicted")
    assert "web-2" in ended["message"]


def test_a_node_deleted_after_the_eviction_frees_the_replacement_tied_to_it() -> None:
    owner = pod("web-2", node=None)
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    plan = view_plan(job_obj=job(conditions=EVICTING), rsv=rsv, owner=owner, node_gone=True)
    # The replacement is deleted by its Reservation's pass (ReservationView.stranded).
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:ReservationLost"]
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "ReservationLost")
    assert "node-1" in status["message"]
    assert "web-2" in status["message"]
    # Bound there before the node went: the pod garbage collector removes it, not Berth.
    bound = view_plan(
        job_obj=job(conditions=EVICTING),
        rsv=rsv,
        owner=pod("web-2", node="node-1", ready=False),
        node_gone=True,
    )
    assert not any(isinstance(a, Delete) for a in bound.actions)


def test_an_owner_deleted_before_its_binding_ends_the_job_at_once() -> None:
    """The Reservation fails when its recorded owner is deleted unbound (a drain evicting
    the gated replacement, say); the job says so then rather than waiting for its TTL
    while no place is held."""
    claimed = reservation(phase="Available", node="node-1", owners=["web-2"])
    failed = copy.deepcopy(claimed)
    [update] = [a for a in rsv_plan(claimed, owner=None).actions if isinstance(a, UpdateStatus)]
    failed["status"] = update.obj["status"]
    assert failed["status"]["phase"] == "Failed"
    plan = view_plan(job_obj=job(conditions=EVICTING), rsv=failed, owner=None)
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:ReservationOwnerGone"]
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "ReservationOwnerGone")
    assert "web-2" in status["message"]


@pytest.mark.parametrize(
    ("phase", "ready", "reason", "said"),
    [
        ("Failed", {"reason": "Expired", "message": "its ttl passed"}, "ReservationExpired",
         "Reservation 'uid-job-1' ended after the pod was evicted (its ttl passed), before a "
         "replacement was bound there"),
        ("Failed", {"reason": "Released", "message": "job job-2 ended"}, "ReservationExpired",
         "(job job-2 ended)"),
        ("Failed", None, "ReservationExpired", "ended after the pod was evicted, before"),
        ("Succeeded", {"reason": "Allocated"}, "ReservationOwnerGone",
         "replacement pod web-2 was bound to node-1 through Reservation 'uid-job-1' but was "
         "deleted before it was ready"),
    ],
)  # fmt: skip
def test_a_reservation_ended_after_the_eviction_ends_the_job_though_its_claim_stays(
    phase: str, ready: dict[str, str] | None, reason: str, said: str
) -> None:
    """Expired, released by another job sharing it, or used by a replacement deleted
    since before it was ready: nothing will bind it any more, claim or not, so a job
    without a TTL does not wait for ever."""
    ended = reservation(
        phase=phase, node="node-1", owners=["web-2"], annotations={keys.CLAIM: "token"}
    )
    ended["status"]["conditions"] = [{"type": "Ready", "status": "False", **ready}] if ready else []
    plan = view_plan(job_obj=job(conditions=EVICTING, ttl=""), rsv=ended, owner=None)
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", reason)
    assert said in status["message"]


def test_a_reservation_deleted_after_the_eviction_ends_the_job_at_once() -> None:
    """Deleted by hand (or with its owner) once the pod is gone: nothing holds the place,
    so the job ends then rather than at its TTL."""
    plan = view_plan(job_obj=job(conditions=EVICTING), rsv=None, owner=None)
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:MissingReservation"]
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "MissingReservation")
    assert "was deleted after the pod was evicted" in status["message"]


def workload(kind: str, name: str, replicas: int, *, parent: str | None = None) -> dict[str, Any]:
    """A ReplicaSet, StatefulSet or Deployment as the caches hold it; `parent` names the
    ReplicaSet's Deployment."""
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if parent is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": parent,
             "uid": f"uid-{parent}", "controller": True}
        ]  # fmt: skip
    return {"kind": kind, "metadata": metadata, "spec": {"replicas": replicas}}


def test_a_workload_scaled_to_zero_after_the_eviction_ends_the_job_at_once() -> None:
    """No replacement will come: the place is released rather than held until the TTL."""
    rsv = reservation(phase="Available", node="node-1")
    rsv["metadata"]["annotations"][keys.CONSUMABLE] = "true"
    zero = workload("ReplicaSet", "web-rs", 0)
    plan = view_plan(job_obj=job(conditions=EVICTING), rsv=rsv, owner=None, workload=zero)
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:WorkloadScaledDown"]
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "WorkloadScaledDown")
    assert "ReplicaSet web-rs is scaled to zero" in status["message"]
    # A pod claimed the place (it may yet be recorded): wait for the claim's fate.
    claimed = copy.deepcopy(rsv)
    claimed["metadata"]["annotations"][keys.CLAIM] = "token"
    waiting = view_plan(job_obj=job(conditions=EVICTING), rsv=claimed, owner=None, workload=zero)
    assert status_of(waiting)["phase"] == "Running"
    # Replicas wanted: the replacement is still to come.
    one_left = workload("ReplicaSet", "web-rs", 1)
    plan = view_plan(job_obj=job(conditions=EVICTING), rsv=rsv, owner=None, workload=one_left)
    assert status_of(plan)["phase"] == "Running"


def test_a_deployments_replicaset_counts_as_scaled_down_only_with_its_deployment() -> None:
    """An old ReplicaSet of a Deployment is at zero once a rollout is over, yet the new
    one's pods may take the place: the Deployment's replicas decide."""
    rsv = reservation(phase="Available", node="node-1")
    old = workload("ReplicaSet", "web-rs", 0, parent="web")
    cases = [
        (None, "Running"),  # the Deployment not cached: not known
        (workload("Deployment", "web", 3), "Running"),
        (workload("Deployment", "other", 0), "Running"),  # not this ReplicaSet's
        (workload("Deployment", "web", 0), "Failed"),
    ]
    for deployment, phase in cases:
        plan = view_plan(
            job_obj=job(conditions=EVICTING),
            rsv=rsv,
            owner=None,
            workload=old,
            deployment=deployment,
        )
        assert status_of(plan)["phase"] == phase, deployment


@pytest.mark.parametrize(
    ("pod_name", "replicas", "start", "gone"),
    [
        ("db-2", 2, None, True),  # scaled from 3 to 2: db-2 is not made again
        ("db-1", 2, None, False),
        ("db-2", 3, None, False),
        ("db-4", 2, 3, False),  # ordinals 3 and 4
        ("db-2", 2, 3, True),
        ("dbx-2", 0, None, False),  # not a name the StatefulSet gives
        ("db-a", 0, None, False),
    ],
)
def test_a_statefulset_scaled_below_the_pods_ordinal_makes_no_replacement(
    pod_name: str, replicas: int, start: int | None, gone: bool
) -> None:
    db = workload("StatefulSet", "db", replicas)
    if start is not None:
        db["spec"]["ordinals"] = {"start": start}
    found = jobs.bind.scaled_away(pod_name, db, None)
    assert (found is not None) == gone
    if gone:
        assert found == (
            f"StatefulSet db is scaled to {replicas} replicas and does not make {pod_name} again"
        )


RESERVED_AT = {"type": "ReservationCreated", "status": "True", "lastTransitionTime": ts(later(5))}


def _revision(workload_obj: dict[str, Any], revision: str) -> dict[str, Any]:
    workload_obj["metadata"]["annotations"] = {jobs.bind.REVISION: revision}
    return workload_obj


def _older(name: str, *, terminating: bool = False) -> dict[str, Any]:
    """A pod of web-rs created before the job reserved its place."""
    found = pod(name, node="node-2")
    if terminating:
        found["metadata"]["deletionTimestamp"] = ts(later(8))
    return found


def _newer(name: str) -> dict[str, Any]:
    """A pod of web-rs created after the job reserved its place, claiming it."""
    found = pod(name, node="node-2", annotations={keys.CLAIM: "token"})
    found["metadata"]["creationTimestamp"] = ts(later(6))
    return found


TWO_OLDER = (_older("web-0"), _older("web-2"))


def assert_after_eviction(
    rs: dict[str, Any],
    deployment: dict[str, Any] | None,
    siblings: tuple[dict[str, Any], ...],
    *,
    phase: str,
    scaled: str,
) -> None:
    """The job's phase after its pod's eviction, its Reservation open and unclaimed, the
    pod's ReplicaSet `rs` (of `deployment`) running `siblings`: `phase`, and if Failed,
    WorkloadScaledDown with a message that starts with `scaled`."""
    status = _after_eviction(siblings, rs=rs, deployment=deployment, opened=None, now=later(10))
    assert status["phase"] == phase, status
    if phase == "Failed":
        assert status["reason"] == "WorkloadScaledDown"
        assert status["message"].startswith(scaled), status["message"]


@pytest.mark.parametrize(
    ("rs_replicas", "deployment", "siblings", "phase"),
    [
        (2, None, TWO_OLDER, "Failed"),  # 3 → 2: it runs 2 without a replacement
        (3, None, TWO_OLDER, "Running"),  # the replacement is to come
        (2, None, (_older("web-0"), _older("web-2", terminating=True)), "Running"),
        (2, None, (_older("web-0"), _newer("web-3")), "Running"),  # a replacement counts not
        (2, ("web", 2, "4"), TWO_OLDER, "Failed"),
        (2, ("web", 3, "4"), TWO_OLDER, "Running"),  # not scaled down yet
        (2, ("web", 2, "3"), TWO_OLDER, "Running"),  # an old one, mid-rollout
        (2, ("other", 2, "4"), TWO_OLDER, "Running"),  # not its Deployment
    ],
)
def test_a_replicaset_scaled_down_without_a_replacement_ends_the_job_at_once(
    rs_replicas: int,
    deployment: tuple[str, int, str] | None,
    siblings: tuple[dict[str, Any], ...],
    phase: str,
) -> None:
    """A ReplicaSet scaled down (not to zero) while its pod was evicted runs the pods it
    wants without making one again: the place is released rather than held until the TTL."""
    rs = workload("ReplicaSet", "web-rs", rs_replicas, parent=None if deployment is None else "web")
    parent = None
    if deployment is not None:
        name, replicas, revision = deployment
        parent = _revision(workload("Deployment", name, replicas), revision)
        _revision(rs, "4")
    scaled = "ReplicaSet web-rs is scaled to 2 replicas and runs 2 pods created before Reservation"
    assert_after_eviction(rs, parent, siblings, phase=phase, scaled=scaled)


@pytest.mark.parametrize(
    ("rs_replicas", "parent", "updated", "total", "phase"),
    [
        (0, "web", 2, 2, "Failed"),  # rolled out: no ReplicaSet of it makes a pod
        (0, "web", 1, 2, "Running"),  # rolling out: a new pod may yet take the place
        (0, "web", 2, 3, "Running"),  # an old pod still going
        (1, "web", 2, 2, "Running"),  # the old ReplicaSet not scaled to zero yet
        (0, "other", 2, 2, "Running"),  # not its Deployment
    ],
)
def test_a_replicaset_a_finished_rollout_left_behind_ends_the_job_at_once(
    rs_replicas: int, parent: str, updated: int, total: int, phase: str
) -> None:
    """The pod's ReplicaSet was rolled past after the eviction and no new pod took the
    place: once the rollout is over none will, and the place is released rather than held
    until the TTL."""
    rs = _revision(workload("ReplicaSet", "web-rs", rs_replicas, parent=parent), "3")
    deployment = _revision(workload("Deployment", "web", 2), "4")
    deployment["metadata"]["generation"] = 5
    deployment["status"] = {"observedGeneration": 5, "updatedReplicas": updated, "replicas": total}
    scaled = (
        "Deployment web has rolled out revision 4 on all its replicas, and ReplicaSet web-rs "
        "is scaled to zero, so no replacement will take Reservation"
    )
    assert_after_eviction(rs, deployment, TWO_OLDER, phase=phase, scaled=scaled)


@pytest.mark.parametrize(
    ("cpu", "why"),
    [
        ("200m", "(is the webhook running?)"),
        ("300m", "(it requests more than reservation uid-job-1 holds: cpu 300m (it holds 200m))"),
    ],
)
def test_replacement_that_bypassed_the_reservation_ends_the_job_with_the_reason(
    cpu: str, why: str
) -> None:
    """A replacement that took no claim: the webhook was not called, or left it alone
    because it asks more than the place holds."""
    evicting = [
        *EVICTING,
        {
            "type": "ReservationCreated",
            "status": "True",
            "lastTransitionTime": "2026-01-01T12:00:05Z",
        },
    ]
    stray = pod("web-2", node="node-2", cpu=cpu)
    stray["metadata"]["creationTimestamp"] = "2026-01-01T12:00:06Z"
    older = pod("web-0", node="node-1")
    jv = jobs.JobView(
        job=job(conditions=evicting),
        pod=None,
        reservation=reservation(phase="Available", node="node-1"),
        owner=None,
        workload_uid=None,
        now=later(10),
        args=ARGS,
        admission_key=ADMISSION_KEY,
        siblings=(older, stray),
    )
    status = status_of(jobs.decide(jv))
    assert (status["phase"], status["reason"]) == ("Failed", "ReservationNotUsed")
    assert status["message"] == (
        f"replacement pod web-2 was created without claiming Reservation 'uid-job-1' {why}; "
        "it is scheduled as any pod, and the reservation is released"
    )


def _made_at(name: str, moment: datetime, *, claimed: bool = False) -> dict[str, Any]:
    """A pod of web-rs created at `moment`, claiming the job's Reservation or not."""
    found = pod(name, node="node-2", annotations={keys.CLAIM: "token"} if claimed else None)
    found["metadata"]["creationTimestamp"] = ts(moment)
    return found


def _after_eviction(
    siblings: tuple[dict[str, Any], ...],
    *,
    opened: datetime | str | None,
    rs: dict[str, Any] | None = None,
    deployment: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The job's status after its pod's eviction (reserved at +5 s), its Reservation open
    (since `opened`, or with no opening time) and unclaimed, the pod's ReplicaSet `rs`
    (default: web-rs wanting 3, of no Deployment) running `siblings`."""
    rsv = reservation(phase="Available", node="node-1")
    rsv["metadata"]["annotations"][keys.CONSUMABLE] = "true"
    if opened is not None:
        written = opened if isinstance(opened, str) else micro_timestamp(opened)
        rsv["metadata"]["annotations"][keys.OPENED_AT] = written
    jv = jobs.JobView(
        job=job(conditions=[*EVICTING, RESERVED_AT]),
        pod=None,
        reservation=rsv,
        owner=None,
        workload_uid=None,
        now=now or later(60),
        args=ARGS,
        admission_key=ADMISSION_KEY,
        siblings=siblings,
        workload=rs or workload("ReplicaSet", "web-rs", 3),
        deployment=deployment,
    )
    return status_of(jobs.decide(jv))


def test_a_pod_made_while_the_place_was_not_open_is_no_replacement_that_bypassed_it() -> None:
    """A pod of the workload made after the Reservation but before its last opening (a
    scale-up while a PDB refused the eviction and the place was closed) could not claim
    it. Once the eviction succeeds and before the replacement's claim shows, it is not
    taken for a replacement that bypassed the webhook: the job waits for the claim."""
    scaled_up = _made_at("web-3", later(20))
    status = _after_eviction((_older("web-0"), scaled_up), opened=later(40.5))
    assert status["phase"] == "Running", status
    # Made after the opening, unclaimed: the webhook was bypassed.
    status = _after_eviction((_older("web-0"), _made_at("web-3", later(42))), opened=later(40.5))
    assert (status["phase"], status["reason"]) == ("Failed", "ReservationNotUsed")
    # A Reservation with no opening time: the cut is its creation, as before.
    status = _after_eviction((_older("web-0"), scaled_up), opened=None)
    assert (status["phase"], status["reason"]) == ("Failed", "ReservationNotUsed")


def test_a_replacement_made_before_the_place_reopened_counts_with_the_pods_kept() -> None:
    """The pod was deleted by someone else while its eviction was refused and its
    Reservation closed; the ReplicaSet's new pod reached the webhook in the second the
    controller reopened the place, before it showed open, and went elsewhere. The
    ReplicaSet runs every replica it wants without a replacement: the job ends at once
    rather than holding the place for nobody until the TTL."""
    replaced = _made_at("web-3", later(40))
    rs = workload("ReplicaSet", "web-rs", 2)
    status = _after_eviction((_older("web-0"), replaced), opened=later(40.2), rs=rs)
    assert (status["phase"], status["reason"]) == ("Failed", "WorkloadScaledDown")
    assert "runs 2 pods created before Reservation" in status["message"], status["message"]


@pytest.mark.parametrize(
    "written",
    [
        "9999-12-31T23:59:59.999999Z",  # a second later overflows
        "0001-01-01T00:00:00+14:00",  # in UTC, before year 1
        "9999-12-31T23:00:00-10:00",  # in UTC, after year 9999
        "2026-01-01T12:00:40",  # no zone
        "yesterday",
    ],
)
def test_an_opening_time_berth_could_not_have_written_reads_as_none(written: str) -> None:
    """Whoever can write a Reservation's annotations can write any string there: one
    that is no time Berth writes reads as no opening time, and no decision fails on it."""
    rsv = reservation(phase="Available", node="node-1", annotations={keys.OPENED_AT: written})
    assert protocol.opened_at(rsv) is None
    status = _after_eviction((_older("web-0"), _made_at("web-3", later(20))), opened=written)
    assert (status["phase"], status["reason"]) == ("Failed", "ReservationNotUsed")


# ----- a finished job ---------------------------------------------------------------------


def test_finished_job_deletes_its_unused_reservation() -> None:
    failed = job(phase="Failed")
    plan = view_plan(job_obj=failed, rsv=reservation(phase="Available", node="node-1"))
    assert kinds(plan) == ["Delete:reservations"]


def test_finished_job_after_eviction_releases_its_reservation() -> None:
    aborted = job(phase="Aborted", conditions=EVICTING)
    plan = view_plan(job_obj=aborted, rsv=reservation(phase="Available", node="node-1"))
    assert kinds(plan) == ["UpdateStatus:reservations"]
    update = plan.actions[0]
    assert isinstance(update, UpdateStatus)
    assert update.obj["status"]["phase"] == "Failed"


def test_a_job_ended_with_its_replacement_bound_leaves_the_reservation_to_record_its_use() -> None:
    """The job Succeeded on seeing its replacement bound and Ready; the Reservation's own
    pass records it Succeeded (Allocated). A release coming first would make it Failed
    (Released), as if its place had not been used."""
    used = reservation(phase="Available", node="node-1")
    used["status"]["currentOwners"] = [{"namespace": "default", "name": "web-2", "uid": "u2"}]
    replacement = pod("web-2", node="node-1")
    done = job(phase="Succeed", conditions=EVICTING)
    assert view_plan(job_obj=done, rsv=used, owner=replacement).actions == []
    unbound = pod("web-2", node=None)
    aborted = job(phase="Aborted", conditions=EVICTING)
    assert kinds(view_plan(job_obj=aborted, rsv=used, owner=unbound)) == [
        "UpdateStatus:reservations"
    ]
    # What a job's end says of it then.
    said = released(view(job_obj=done, rsv=used, owner=replacement))
    assert said == "the reservation was used: its replacement web-2 is bound to node-1"
    assert released(view(job_obj=aborted, rsv=used, owner=unbound)) == "the reservation is released"


def test_rolled_back_job_deletes_even_an_expired_reservation() -> None:
    plan = view_plan(job_obj=job(phase="Failed"), rsv=reservation(phase="Failed"))
    assert kinds(plan) == ["Delete:reservations"]


def test_a_finished_job_without_a_mode_is_only_cleaned_up() -> None:
    modeless = job(phase="Failed")
    del modeless["spec"]["mode"]
    plan = view_plan(job_obj=modeless, rsv=reservation(phase="Available", node="node-1"))
    assert kinds(plan) == ["Delete:reservations"]


# ----- what holds an eviction back, the first time and each time again ----------------------

BLOCKED = [{**EVICTING[0], "reason": "BlockedByPDB"}]


def taken_reservation() -> dict[str, Any]:
    """Open, and claimed by a pod the workload made meanwhile (a scale-up)."""
    rsv = open_reservation(**{keys.CLAIM: "a-token"})
    rsv["status"]["currentOwners"] = [{"namespace": "default", "name": "web-9", "uid": "u9"}]
    return rsv


@pytest.mark.parametrize(
    ("changes", "rsv", "view_kwargs"),
    [
        pytest.param({"paused": True}, open_reservation(), {}, id="paused"),
        pytest.param({"paused": True}, closed_reservation(), {}, id="paused, closed: not reopened"),
        pytest.param({}, open_reservation(), {"node_gone": True}, id="its node gone"),
        pytest.param({}, open_reservation(), {"node_unseen": True}, id="its node not seen yet"),
        pytest.param(
            {}, open_reservation(), {"node_refuses": "node node-1 is cordoned"}, id="cordoned"
        ),
        pytest.param({}, taken_reservation(), {}, id="taken by another pod of the workload"),
    ],
)
def test_a_refused_eviction_is_tried_again_only_as_the_first_would_be(
    changes: dict[str, Any], rsv: dict[str, Any], view_kwargs: dict[str, Any]
) -> None:
    """After a refusal, the next attempt waits for what would have held the first one
    back: nothing is evicted, nothing reopened, and the job goes on. Paused with its
    place open again, the place is closed (a scale-up's pod would take it meanwhile)."""
    blocked = job(conditions=BLOCKED)
    blocked["spec"].update(changes)
    plan = view_plan(job_obj=blocked, pod_obj=pod(), rsv=rsv, now=later(10), **view_kwargs)
    if changes.get("paused") and protocol.is_consumable(rsv):
        [close] = plan.actions
        assert isinstance(close, Patch)
        assert close.patch["metadata"]["annotations"][keys.CONSUMABLE] == keys.CLOSED
    else:
        assert plan.actions == []
    assert plan.requeue_after is not None


def test_a_paused_job_leaves_the_place_of_a_pod_annotated_for_soft_eviction_open() -> None:
    """Whatever acts on the annotation may remove the pod any moment, paused or not: its
    replacement must find the place open."""
    blocked = job(conditions=BLOCKED, paused=True)
    annotated = pod(annotations={keys.SOFT_EVICTION: SOFT})
    plan = view_plan(job_obj=blocked, pod_obj=annotated, rsv=open_reservation(), now=later(10))
    assert not any(isinstance(a, Patch) for a in plan.actions)


def test_a_pod_forbidden_since_its_admission_is_not_evicted_again() -> None:
    never = pod(annotations={keys.EVICTION_COST: str(2**31 - 1)})
    blocked = job(conditions=BLOCKED)
    plan = view_plan(job_obj=blocked, pod_obj=never, rsv=open_reservation(), now=later(10))
    assert not any(isinstance(a, Evict) for a in plan.actions)
    assert (status_of(plan)["phase"], status_of(plan)["reason"]) == (
        "Failed",
        "ForbiddenMigratePod",
    )


def test_a_place_taken_while_it_settled_is_not_evicted_into() -> None:
    """Claimed between its opening and the eviction (by a pod the workload made, or the
    replacement of a pod deleted by someone else, which this cache still shows): the
    pod is not evicted; once the Reservation is used by that pod the job ends saying so."""
    scheduled = job(conditions=[SCHEDULED])
    plan = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=taken_reservation(), now=later(2))
    assert not any(isinstance(a, Evict) for a in plan.actions)
    used = taken_reservation()
    used["status"]["phase"] = "Succeeded"
    ended = status_of(view_plan(job_obj=scheduled, pod_obj=pod(), rsv=used, now=later(3)))
    assert (ended["phase"], ended["reason"]) == ("Failed", "ReservationExpired")
    assert (
        "was taken by pod web-9, which the workload made before the pod was evicted"
        in (ended["message"])
    )


def test_a_paused_evict_directly_job_evicts_nothing() -> None:
    paused = job(mode="EvictDirectly", paused=True)
    plan = view_plan(job_obj=paused, pod_obj=pod(), now=later(1))
    assert plan.actions == []
    refused = job(mode="EvictDirectly", paused=True, conditions=BLOCKED)
    assert view_plan(job_obj=refused, pod_obj=pod(), now=later(10)).actions == []
