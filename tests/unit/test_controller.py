"""The controller's pure decisions: what each observed state leads to, step by step."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from berth.api import (
    PodMigrationJobConditionType,
    PodMigrationJobReason,
    ReservationConditionType,
    ReservationReason,
    keys,
)
from berth.kube.client import PODMIGRATIONJOBS, PODS, RESERVATIONS
from berth.resources import parse_quantity, pod_requests
from berth.settings import MigrationControllerArgs
from controller import build, jobs, reservations
from controller.actions import Create, Delete, Event, Evict, Patch, Plan, UpdateStatus
from controller.arbitration import Decision, WaitReason
from tests.unit.builders import (
    T0,
    job,
    later,
    placeholder,
    pod,
    reservation,
)

ARGS = MigrationControllerArgs()


def vocabulary(plan: Plan) -> None:
    """Every reason and condition type a plan writes is a member of the API's enums."""
    job_reasons = {"", *PodMigrationJobReason}
    for action in plan.actions:
        if isinstance(action, Event):
            known = (
                {*PodMigrationJobReason, *PodMigrationJobConditionType}
                if action.involved.get("kind") == "PodMigrationJob"
                else set(ReservationReason)
            )
            assert action.reason in known, f"event reason {action.reason!r}"
        if not isinstance(action, UpdateStatus):
            continue
        status = action.obj["status"]
        if action.resource is PODMIGRATIONJOBS:
            types, reasons = set(PodMigrationJobConditionType), job_reasons
            assert status.get("reason", "") in reasons, f"reason {status.get('reason')!r}"
        else:
            types, reasons = set(ReservationConditionType), set(ReservationReason)
        for item in status.get("conditions") or []:
            assert item["type"] in types, f"condition type {item['type']!r}"
            assert item.get("reason", "") in reasons, f"condition reason {item.get('reason')!r}"


def kinds(plan: Plan) -> list[str]:
    vocabulary(plan)
    names = []
    for action in plan.actions:
        if isinstance(action, Event):
            names.append(f"Event:{action.reason}")
        elif isinstance(action, (Create, Patch, Delete, UpdateStatus)):
            names.append(f"{type(action).__name__}:{action.resource.plural}")
        else:
            names.append(type(action).__name__)
    return names


def status_of(plan: Plan) -> dict[str, Any]:
    vocabulary(plan)
    updates = [a for a in plan.actions if isinstance(a, UpdateStatus)]
    assert updates, f"no status update in {kinds(plan)}"
    status: dict[str, Any] = updates[-1].obj["status"]
    return status


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def view(
    *,
    job_obj: dict[str, Any] | None = None,
    pod_obj: dict[str, Any] | None = None,
    rsv: dict[str, Any] | None = None,
    owner: dict[str, Any] | None = None,
    now: datetime = T0,
) -> jobs.JobView:
    return jobs.JobView(
        job=job_obj or job(),
        pod=pod_obj,
        reservation=rsv,
        owner=owner,
        workload_uid="uid-deploy",
        now=now,
        args=ARGS,
    )


EVICTING = [{"type": "Eviction", "status": "False", "reason": "Evicting", "message": "m"}]


# ----- the job state machine --------------------------------------------------------------


def test_pending_job_is_left_to_arbitration() -> None:
    assert view_plan(job_obj=job(phase=None), pod_obj=pod()).actions == []


def view_plan(**kwargs: Any) -> Plan:
    return jobs.decide(view(**kwargs))


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
    assert cond(status_of(plan), "ReservationCreated")["status"] == "True"


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


def test_paused_job_waits_with_its_reservation() -> None:
    plan = view_plan(
        job_obj=job(paused=True), pod_obj=pod(), rsv=reservation(phase="Available", node="node-1")
    )
    assert not any(isinstance(a, Evict) for a in plan.actions)


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
    assert evict.delete_options == {"gracePeriodSeconds": 60}


@pytest.mark.parametrize(
    "rsv", [None, reservation(), reservation(phase="Available", node="node-1")]
)
def test_ttl_before_eviction_fails_without_evicting(rsv: dict[str, Any] | None) -> None:
    plan = view_plan(pod_obj=pod(), rsv=rsv, now=later(301))
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout")
    assert not any(isinstance(a, Evict) for a in plan.actions)


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


def test_missing_pod_before_eviction_fails_the_job() -> None:
    plan = view_plan(pod_obj=None, rsv=reservation())
    assert (status_of(plan)["phase"], status_of(plan)["reason"]) == ("Failed", "MissingPod")


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
        rsv=reservation(phase="Available", node="node-1"),
    )
    assert kinds(plan) == ["Evict"]


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


def test_bound_and_ready_owner_completes_the_job() -> None:
    new = pod("web-2", node="node-1")
    plan = view_plan(
        job_obj=job(conditions=EVICTING),
        pod_obj=None,
        rsv=reservation(phase="Succeeded", node="node-1", owners=["web-2"]),
        owner=new,
    )
    status = status_of(plan)
    assert (status["phase"], status["status"]) == ("Succeeded", "Complete")
    assert status["podRef"]["name"] == "web-2"
    assert cond(status, "PodBoundReservation")["status"] == "True"
    assert cond(status, "BoundPodReady")["status"] == "True"
    assert kinds(plan)[-1] == "Event:Complete"


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


def test_missing_referenced_reservation_fails() -> None:
    plan = view_plan(job_obj=job(reservation_ref="reservation-0"), pod_obj=pod())
    assert status_of(plan)["reason"] == "MissingReservation"


def test_evict_directly_evicts_then_succeeds_when_the_pod_is_gone() -> None:
    direct = job(mode="EvictDirectly")
    plan = view_plan(job_obj=direct, pod_obj=pod())
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:Evicting", "Evict"]
    direct["status"]["conditions"] = EVICTING
    done = view_plan(job_obj=direct, pod_obj=None)
    assert (status_of(done)["phase"], status_of(done)["status"]) == ("Succeeded", "Complete")


def test_blocked_eviction_is_reported_as_blocked_by_pdb() -> None:
    plan = jobs.eviction_refused(
        view(job_obj=job(conditions=EVICTING), pod_obj=pod()),
        status_code=429,
        message="Cannot evict pod as it would violate the pod's disruption budget.",
    )
    status = status_of(plan)
    assert cond(status, "Eviction")["reason"] == "BlockedByPDB"
    assert status["reason"] == "BlockedByPDB"
    assert "Event:BlockedByPDB" in kinds(plan)


# ----- the Reservation lifecycle ----------------------------------------------------------


def rsv_plan(
    rsv: dict[str, Any],
    *,
    ph: dict[str, Any] | None = None,
    claimer: dict[str, Any] | None = None,
    owner: dict[str, Any] | None = None,
    now: datetime = T0,
) -> Plan:
    return reservations.decide(
        reservations.ReservationView(
            reservation=rsv, placeholder=ph, claimer=claimer, owner=owner, now=now, image="pause"
        )
    )


def test_new_reservation_gets_a_placeholder() -> None:
    plan = rsv_plan(reservation())
    assert kinds(plan) == ["Create:pods"]


def test_bound_placeholder_makes_the_reservation_available() -> None:
    plan = rsv_plan(reservation(), ph=placeholder(node="node-1"))
    status = status_of(plan)
    assert (status["phase"], status["nodeName"]) == ("Available", "node-1")
    assert status["allocatable"] == {"cpu": "200m"}


def test_claimer_is_recorded_as_owner() -> None:
    rsv = reservation(
        phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true", keys.CLAIM: "tok"}
    )
    claimer = pod(
        "web-2", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "tok"}
    )
    plan = rsv_plan(rsv, ph=placeholder(), claimer=claimer)
    assert status_of(plan)["currentOwners"][0]["uid"] == "uid-web-2"


def test_handover_deletes_the_placeholder_first_then_ungates() -> None:
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    owner = pod("web-2", node=None, gates=[keys.RESERVATION_GATE, "other/gate"])
    first = rsv_plan(rsv, ph=placeholder(), owner=owner)
    assert kinds(first) == ["Delete:pods"]
    delete = first.actions[0]
    assert isinstance(delete, Delete)
    assert delete.uid
    assert delete.grace_period_seconds == 0
    second = rsv_plan(rsv, ph=None, owner=owner)
    assert kinds(second) == ["Patch:pods", "Event:ReservationHandover"]
    ungate = second.actions[0]
    assert isinstance(ungate, Patch)
    assert ungate.json_patch
    assert ungate.patch[-1] == {"op": "remove", "path": "/spec/schedulingGates/0"}


def test_bound_owner_makes_the_reservation_succeeded() -> None:
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    plan = rsv_plan(rsv, owner=pod("web-2", node="node-1"))
    assert status_of(plan)["phase"] == "Succeeded"


def test_expired_reservation_fails_then_cleans_up_and_lets_the_pod_go() -> None:
    rsv = reservation(phase="Available", node="node-1", ttl="1m")
    assert status_of(rsv_plan(rsv, ph=placeholder(), now=later(61)))["phase"] == "Failed"
    failed = reservation(phase="Failed", node="node-1", owners=["web-2"])
    gated = pod("web-2", node=None, gates=[keys.RESERVATION_GATE])
    plan = rsv_plan(failed, ph=placeholder(), owner=gated)
    assert kinds(plan) == ["Delete:pods", "Patch:pods", "Event:ReservationReleased"]


def test_lost_placeholder_is_recreated_and_the_reservation_pending_again() -> None:
    plan = rsv_plan(reservation(phase="Available", node="node-1"), ph=None)
    assert kinds(plan) == ["Create:pods", "UpdateStatus:reservations"]
    assert status_of(plan)["phase"] == "Pending"


# ----- building the Reservation and its placeholder ---------------------------------------


def test_reservation_excludes_the_source_node_and_keeps_constraints() -> None:
    source = pod(node="node-0")
    source["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    source["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    body = build.reservation_for(job=job(), pod=source, workload_uid="uid-deploy", ttl="5m")
    spec = body["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 2
    for term in terms:
        assert {"key": "metadata.name", "operator": "NotIn", "values": ["node-0"]} in term[
            "matchFields"
        ]
    assert spec["tolerations"] == source["spec"]["tolerations"]
    assert body["spec"]["owners"][0]["controller"]["uid"] == "uid-web-rs"
    assert body["metadata"]["annotations"][keys.WORKLOAD] == "uid-deploy"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-job-1"


def test_placeholder_holds_the_effective_requests_and_matches_no_selector() -> None:
    source = pod()
    source["spec"]["initContainers"] = [
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
        {"name": "init", "resources": {"requests": {"cpu": "1"}}},
    ]
    source["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    rsv = build.reservation_for(job=job(), pod=source, workload_uid=None, ttl="5m")
    rsv["metadata"]["uid"] = "uid-rsv"
    ph = build.placeholder_for(rsv, image="pause")
    assert pod_requests(ph["spec"]) == {"cpu": parse_quantity("1.1")}
    assert pod_requests(ph["spec"]) == pod_requests(source["spec"])
    assert ph["metadata"]["labels"] == {keys.RESERVATION_LABEL: rsv["metadata"]["name"]}
    assert ph["metadata"]["ownerReferences"][0]["kind"] == "Reservation"
    assert ph["spec"]["terminationGracePeriodSeconds"] == 0
    assert ph["spec"]["containers"][0]["ports"] == [{"containerPort": 80, "hostPort": 8080}]
    assert ph["spec"]["securityContext"]["runAsNonRoot"] is True


# ----- pending jobs -----------------------------------------------------------------------


def test_pending_job_times_out_with_the_reason_it_waited() -> None:
    waiting = job(phase="Pending")
    waiting["status"].update(reason="MaxMigratingPerNode", message="2 migrations already run")
    assert view_plan(job_obj=waiting, pod_obj=pod(), now=later(200)).actions == []
    status = status_of(view_plan(job_obj=waiting, pod_obj=pod(), now=later(301)))
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout")
    assert "MaxMigratingPerNode" in status["message"]


def test_actions_target_the_right_resources() -> None:
    plan = view_plan(pod_obj=pod())
    assert plan.actions[0].resource is RESERVATIONS  # type: ignore[union-attr]
    assert plan.actions[1].resource is PODMIGRATIONJOBS  # type: ignore[union-attr]
    assert rsv_plan(reservation()).actions[0].resource is PODS  # type: ignore[union-attr]


def test_rolled_back_job_deletes_even_an_expired_reservation() -> None:
    plan = view_plan(job_obj=job(phase="Failed"), rsv=reservation(phase="Failed"))
    assert kinds(plan) == ["Delete:reservations"]


@pytest.mark.parametrize(
    ("age", "claimed", "expected"),
    [
        (5, False, []),
        (31, False, ["Patch:pods", "Event:ReservationGateRemoved"]),
        (31, True, []),
    ],
)
def test_stray_gate_is_removed_after_a_grace_period(
    age: int, claimed: bool, expected: list[str]
) -> None:
    gated = pod(
        "web-9", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "forged"}
    )
    plan = reservations.stray_gate(
        gated, claimed=reservation() if claimed else None, now=later(age)
    )
    assert kinds(plan) == expected


def test_reservation_without_template_namespace_places_its_placeholder_by_its_owner() -> None:
    rsv = reservation()
    del rsv["spec"]["template"]["metadata"]
    plan = rsv_plan(rsv)
    create = plan.actions[0]
    assert isinstance(create, Create)
    assert create.namespace == "default"
    assert create.body["metadata"]["namespace"] == "default"


def test_replacement_that_bypassed_the_reservation_ends_the_job_with_the_reason() -> None:
    evicting = [
        *EVICTING,
        {
            "type": "ReservationCreated",
            "status": "True",
            "lastTransitionTime": "2026-01-01T12:00:05Z",
        },
    ]
    stray = pod("web-2", node="node-2")
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
        siblings=(older, stray),
    )
    status = status_of(jobs.decide(jv))
    assert (status["phase"], status["reason"]) == ("Failed", "ReservationNotUsed")
    assert "web-2" in status["message"]
    assert "webhook" in status["message"]


def test_reservation_on_the_pods_own_node_is_never_a_reason_to_evict() -> None:
    plan = view_plan(
        job_obj=job(reservation_ref="mine"),
        pod_obj=pod(node="node-0"),
        rsv=reservation("mine", phase="Available", node="node-0"),
    )
    assert status_of(plan)["phase"] == "Failed"
    assert not any(isinstance(a, Evict) for a in plan.actions)


def test_a_pod_bound_by_berth_before_is_not_pinned_to_its_node_again() -> None:
    moved = pod(node="node-1", annotations={keys.RESERVATION_ALLOCATED: '{"name":"r"}'})
    moved["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
                        ]
                    }
                ]
            }
        }
    }
    body = build.reservation_for(job=job(), pod=moved, workload_uid=None, ttl="5m")
    terms = body["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}
    ]


def test_job_template_narrows_the_pods_placement() -> None:
    source = pod(node="node-0")
    source["spec"]["nodeSelector"] = {"disk": "ssd"}
    source["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    to_node_2 = {
        "spec": {
            "template": {
                "spec": {
                    "nodeSelector": {"pool": "big"},
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchFields": [
                                            {
                                                "key": "metadata.name",
                                                "operator": "In",
                                                "values": ["node-2"],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                }
            }
        }
    }
    body = build.reservation_for(
        job=job(), pod=source, workload_uid=None, ttl="5m", template=to_node_2
    )
    spec = body["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"disk": "ssd", "pool": "big"}
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [{"key": "zone", "operator": "In", "values": ["a"]}]
    assert {"key": "metadata.name", "operator": "In", "values": ["node-2"]} in term["matchFields"]
    assert {"key": "metadata.name", "operator": "NotIn", "values": ["node-0"]} in term[
        "matchFields"
    ]


def test_eviction_waits_a_moment_after_the_reservation_opened() -> None:
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
    opened = reservation(
        phase="Available",
        node="node-1",
        annotations={keys.CONSUMABLE: "true", keys.OPENED_AT: "2026-01-01T12:00:00Z"},
    )
    waiting = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=opened, now=later(0.5))
    assert waiting.actions == []
    assert waiting.requeue_after
    go = view_plan(job_obj=scheduled, pod_obj=pod(), rsv=opened, now=later(1))
    assert kinds(go)[-1] == "Evict"


# ----- admission: arbitration's decision written on the job -------------------------------


def pending_job() -> dict[str, Any]:
    return job("job-1", phase="Pending", pod_uid=None)


@pytest.mark.parametrize("dry_run", [False, True])
def test_admission_of_an_admitted_job(dry_run: bool) -> None:
    target = pod("web-1", node="node-0")
    decision = Decision(pending_job(), "admit", pod=target)
    plan = jobs.admission(decision, workload_uid="uid-web", dry_run=dry_run)
    if not dry_run:
        assert kinds(plan) == ["Patch:podmigrationjobs", "UpdateStatus:podmigrationjobs"]
        patch = next(a for a in plan.actions if isinstance(a, Patch))
        assert patch.patch["metadata"]["annotations"] == {
            keys.POD_UID: target["metadata"]["uid"],
            keys.SOURCE_NODE: "node-0",
            keys.WORKLOAD: "uid-web",
        }
        assert status_of(plan)["phase"] == "Running"
        return
    # A dry run starts nothing: the job stays Pending and says what would have happened.
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:DryRun"]
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Pending", "DryRun")
    assert "nothing is reserved or evicted" in status["message"]
    # Written once: the next round's same decision changes nothing.
    again = Decision({**decision.job, "status": status}, "admit", pod=target)
    assert jobs.admission(again, workload_uid="uid-web", dry_run=True).actions == []


@pytest.mark.parametrize("dry_run", [False, True])
def test_admission_of_a_failed_job_ends_it_in_either_mode(dry_run: bool) -> None:
    decision = Decision(pending_job(), "fail", "ForbiddenMigratePod", "pod is a DaemonSet pod")
    plan = jobs.admission(decision, workload_uid=None, dry_run=dry_run)
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:ForbiddenMigratePod"]
    assert (status_of(plan)["phase"], status_of(plan)["message"]) == (
        "Failed",
        "pod is a DaemonSet pod",
    )


def test_admission_writes_a_wait_reason_only_when_it_changes() -> None:
    decision = Decision(pending_job(), "wait", "MaxMigratingPerNode", "2 migrations already")
    plan = jobs.admission(decision, workload_uid=None, dry_run=False)
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs"]
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Pending", "MaxMigratingPerNode")
    unchanged = Decision(
        {**decision.job, "status": status}, "wait", "MaxMigratingPerNode", "2 migrations already"
    )
    assert jobs.admission(unchanged, workload_uid=None, dry_run=False).actions == []


# ----- defaultJobMode: the mode of a job that sets none ----------------------------------


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
        )
    )
    assert kinds(plan) == ["Patch:podmigrationjobs"]
    patch = plan.actions[0]
    assert isinstance(patch, Patch)
    assert patch.patch == {"spec": {"mode": default}}


def test_a_finished_job_without_a_mode_is_only_cleaned_up() -> None:
    modeless = job(phase="Failed")
    del modeless["spec"]["mode"]
    plan = view_plan(job_obj=modeless, rsv=reservation(phase="Available", node="node-1"))
    assert kinds(plan) == ["Delete:reservations"]


def test_every_reason_arbitration_writes_on_a_waiting_job_is_an_api_reason() -> None:
    assert set(WaitReason) <= set(PodMigrationJobReason)
