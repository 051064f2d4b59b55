"""Helpers for the tests of the controller's pure decisions: views, plans read back as
names, and the check that a plan speaks the API's vocabulary."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from berth.api import (
    PodMigrationJobConditionType,
    PodMigrationJobReason,
    ReservationConditionType,
    ReservationReason,
)
from berth.kube.client import PODMIGRATIONJOBS
from berth.settings import MigrationControllerArgs
from controller import jobs, reservations
from controller.actions import Create, Delete, Event, Patch, Plan, UpdateStatus
from controller.namespaces import LabelRefused
from tests.unit.builders import ADMISSION_KEY, T0, job, placeholder

ARGS = MigrationControllerArgs()
EVICTING = [{"type": "Eviction", "status": "False", "reason": "Evicting", "message": "m"}]


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
    labelled: bool = True,
    label_refused: LabelRefused | None = None,
    node_gone: bool = False,
    node_unseen: bool = False,
    node_refuses: str | None = None,
    node_spread: str | None = None,
    workload: dict[str, Any] | None = None,
    deployment: dict[str, Any] | None = None,
    workload_deleted: str | None = None,
    making_room: bool = False,
    exhausted_pdb: str | None = None,
    sharing: tuple[dict[str, Any], ...] = (),
    ph: dict[str, Any] | str | None = "bound",
    recorded: bool = True,
) -> jobs.JobView:
    """`ph`: the Reservation's placeholder; "bound" (the default): bound to the node of
    `rsv` if it has one, else none. `recorded`: the job's own Reservation (`rsv` named
    after the job's UID) is recorded in its reservationRef, as the controller does right
    after creating it."""
    job_obj = job_obj or job()
    if recorded and rsv and rsv["metadata"]["name"] == job_obj["metadata"]["uid"]:
        options = job_obj["spec"].setdefault("reservationOptions", {})
        options.setdefault("reservationRef", {"name": rsv["metadata"]["name"]})
    if ph == "bound":
        node = ((rsv or {}).get("status") or {}).get("nodeName")
        ph = placeholder(rsv["metadata"]["name"], node=node) if rsv and node else None
    assert not isinstance(ph, str)
    return jobs.JobView(
        job=job_obj,
        pod=pod_obj,
        reservation=rsv,
        owner=owner,
        namespace_labelled=labelled,
        label_refused=label_refused,
        workload_uid="uid-deploy",
        now=now,
        args=ARGS,
        admission_key=ADMISSION_KEY,
        reserved_node_gone=node_gone,
        reserved_node_unseen=node_unseen,
        reserved_node_refuses=node_refuses,
        reserved_node_spread=node_spread,
        workload=workload,
        deployment=deployment,
        workload_deleted=workload_deleted,
        making_room=making_room,
        exhausted_pdb=exhausted_pdb,
        sharing=sharing,
        placeholder=ph,
    )


def view_plan(**kwargs: Any) -> Plan:
    return jobs.decide(view(**kwargs))


def rsv_plan(
    rsv: dict[str, Any],
    *,
    ph: dict[str, Any] | None = None,
    claimer: dict[str, Any] | None = None,
    claimers: tuple[dict[str, Any], ...] | None = None,
    accepted: tuple[dict[str, Any], ...] | None = None,
    owner: dict[str, Any] | None = None,
    strays: tuple[dict[str, Any], ...] = (),
    now: datetime = T0,
    priority_class: dict[str, Any] | None = None,
    priority_class_found: dict[str, Any] | None = None,
    node_gone: bool = False,
    node_refuses: str | None = None,
    stranded: tuple[dict[str, Any], ...] = (),
) -> Plan:
    return reservations.decide(
        reservations.ReservationView(
            reservation=rsv,
            placeholder=ph,
            # By default a claimer is the one pod carrying the token, and acceptable.
            claimers=claimers if claimers is not None else (claimer,) if claimer else (),
            accepted=accepted if accepted is not None else (claimer,) if claimer else (),
            owner=owner,
            now=now,
            image="pause",
            strays=strays,
            priority_class=priority_class,
            priority_class_found=priority_class_found,
            node_gone=node_gone,
            node_refuses=node_refuses,
            stranded=stranded,
        )
    )
