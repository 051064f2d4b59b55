"""The Reservation lifecycle, as a pure decision over what the API server shows.

Pending: its placeholder pod exists and waits for the scheduler. Available: the
placeholder is bound to a node, so that capacity is held. Then the handover (see
berth.protocol): the pod that claimed it is recorded as owner, the placeholder is
deleted, and once it is gone the owner's scheduling gate is removed. Succeeded: the
owner is bound to the node. Failed: expired or released; its placeholder is deleted
and any pod still gated on it is let go, so no pod ever stays gated on a dead Reservation.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from berth import protocol
from berth.api import ReservationConditionType, ReservationPhase, ReservationReason, keys
from berth.kube.client import PODS, RESERVATIONS
from controller.actions import Create, Delete, Event, Patch, Plan, UpdateStatus
from controller.build import allocatable_of, placeholder_for
from controller.status import (
    deadline,
    parse_time,
    reference,
    same_condition,
    scheduling_message,
    with_condition,
)

Object = dict[str, Any]

Condition = ReservationConditionType
Reason = ReservationReason

HANDOVER_POLL = 1.0
DEFAULT_TTL = timedelta(hours=1)  # a Reservation made by hand with neither ttl nor expires


@dataclass(frozen=True)
class ReservationView:
    """A Reservation and the pods that matter to it, as the caches hold them."""

    reservation: Object
    placeholder: Object | None
    claimer: Object | None
    """The pod carrying the Reservation's claim token, if any."""
    owner: Object | None
    """The pod recorded in status.currentOwners, if it still exists."""
    now: datetime
    image: str


def expires_at(reservation: Mapping[str, Any]) -> datetime:
    spec = reservation.get("spec") or {}
    if spec.get("expires"):
        return parse_time(spec["expires"])
    return deadline(reservation, spec.get("ttl"), DEFAULT_TTL)


def ungate(pod: Mapping[str, Any]) -> Patch:
    """Remove Berth's gate from a pod, keeping any other gate; the test guards the index."""
    gates = pod["spec"].get("schedulingGates") or []
    index = next(i for i, gate in enumerate(gates) if gate.get("name") == keys.RESERVATION_GATE)
    operations = [
        {
            "op": "test",
            "path": f"/spec/schedulingGates/{index}/name",
            "value": keys.RESERVATION_GATE,
        },
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
    metadata = pod["metadata"]
    return Patch(
        PODS, metadata["name"], operations, namespace=metadata["namespace"], json_patch=True
    )


def _status(view: ReservationView, status: Mapping[str, Any]) -> UpdateStatus:
    obj = copy.deepcopy(view.reservation)
    obj["status"] = dict(status)
    return UpdateStatus(RESERVATIONS, obj)


def _name(view: ReservationView) -> str:
    return str(view.reservation["metadata"]["name"])


def decide(view: ReservationView) -> Plan:
    """The next step for one Reservation."""
    reservation = view.reservation
    status: Object = dict(reservation.get("status") or {})
    phase = protocol.phase(reservation)
    plan = Plan()
    if phase in (ReservationPhase.SUCCEEDED, ReservationPhase.FAILED):
        return _cleanup(view, plan, released=phase == ReservationPhase.FAILED)
    if view.now >= expires_at(reservation):
        status = with_condition(
            status,
            kind=Condition.READY,
            state="False",
            reason=Reason.EXPIRED,
            message="the Reservation expired",
            now=view.now,
        )
        status["phase"] = ReservationPhase.FAILED
        return plan.then(
            _status(view, status),
            Event(
                reservation,
                Reason.RESERVATION_EXPIRED,
                f"Reservation {_name(view)!r} expired; its capacity is released",
            ),
        )
    if protocol.owner_uids(reservation):
        return _handover(view, status, plan)
    if (
        protocol.claim_of(reservation)
        and view.claimer is not None
        and protocol.is_gated(view.claimer)
    ):
        status["currentOwners"] = [reference(view.claimer)]
        claimer = view.claimer["metadata"]
        return plan.then(
            _status(view, status),
            Event(
                reservation,
                Reason.RESERVATION_CLAIMED,
                f"Pod {claimer['namespace']}/{claimer['name']} claimed Reservation {_name(view)!r}",
            ),
        )
    return _hold(view, status, plan)


def _hold(view: ReservationView, status: Object, plan: Plan) -> Plan:
    """Keep the placeholder alive and the status in step with it."""
    reservation = view.reservation
    placeholder = view.placeholder
    if placeholder is None:
        plan.then(
            Create(
                PODS,
                placeholder_for(reservation, image=view.image),
                namespace=protocol.placeholder_namespace(reservation),
            )
        )
        if protocol.phase(reservation) == ReservationPhase.AVAILABLE:
            # The placeholder vanished (deleted, preempted): the place is no longer held.
            status.update(phase=ReservationPhase.PENDING, nodeName=None)
            status = with_condition(
                status,
                kind=Condition.SCHEDULED,
                state="False",
                reason=Reason.LOST,
                message="placeholder pod disappeared",
                now=view.now,
            )
            plan.then(_status(view, status))
        return plan.again_in(_seconds_until(view))
    node = placeholder["spec"].get("nodeName")
    if node and protocol.phase(reservation) == ReservationPhase.PENDING:
        status.update(
            phase=ReservationPhase.AVAILABLE, nodeName=node, allocatable=allocatable_of(reservation)
        )
        status = with_condition(
            status,
            kind=Condition.SCHEDULED,
            state="True",
            reason=Reason.SCHEDULED,
            message=f"placeholder bound to {node}",
            now=view.now,
        )
        status = with_condition(
            status,
            kind=Condition.READY,
            state="True",
            reason=Reason.AVAILABLE,
            message=f"capacity held on {node}",
            now=view.now,
        )
        return plan.then(_status(view, status))
    if not node:
        message = scheduling_message(placeholder) or "waiting for the scheduler"
        if not same_condition(
            status,
            kind=Condition.SCHEDULED,
            state="False",
            reason=Reason.UNSCHEDULABLE,
            message=message,
        ):
            status = with_condition(
                status,
                kind=Condition.SCHEDULED,
                state="False",
                reason=Reason.UNSCHEDULABLE,
                message=message,
                now=view.now,
            )
            plan.then(_status(view, status))
    return plan.again_in(_seconds_until(view))


def _handover(view: ReservationView, status: Object, plan: Plan) -> Plan:
    """Owner recorded: free the place for it, then let it be scheduled there."""
    owner, node = view.owner, protocol.node_of(view.reservation)
    if owner is None:
        status["phase"] = ReservationPhase.FAILED
        status = with_condition(
            status,
            kind=Condition.READY,
            state="False",
            reason=Reason.OWNER_GONE,
            message="the owner pod was deleted before it was bound",
            now=view.now,
        )
        return plan.then(_status(view, status))
    bound = owner["spec"].get("nodeName")
    if bound:
        status["phase"] = ReservationPhase.SUCCEEDED
        status = with_condition(
            status,
            kind=Condition.READY,
            state="False",
            reason=Reason.ALLOCATED,
            message=f"pod {owner['metadata']['name']} bound to {bound}",
            now=view.now,
        )
        return plan.then(_status(view, status))
    if view.placeholder is not None:
        placeholder = view.placeholder["metadata"]
        return plan.then(
            Delete(
                PODS,
                placeholder["name"],
                namespace=placeholder["namespace"],
                uid=placeholder["uid"],
                grace_period_seconds=0,
            )
        ).again_in(HANDOVER_POLL)
    if protocol.is_gated(owner):
        plan.then(
            ungate(owner),
            Event(
                view.reservation,
                Reason.RESERVATION_HANDOVER,
                f"Released the place on {node} to pod {owner['metadata']['name']}",
            ),
        )
    return plan.again_in(_seconds_until(view))


def _cleanup(view: ReservationView, plan: Plan, *, released: bool) -> Plan:
    if view.placeholder is not None:
        placeholder = view.placeholder["metadata"]
        plan.then(
            Delete(
                PODS,
                placeholder["name"],
                namespace=placeholder["namespace"],
                uid=placeholder["uid"],
                grace_period_seconds=0,
            )
        )
    for pod in (view.owner, view.claimer):
        if released and pod is not None and protocol.is_gated(pod):
            plan.then(
                ungate(pod),
                Event(
                    view.reservation,
                    Reason.RESERVATION_RELEASED,
                    f"Let pod {pod['metadata']['name']} schedule freely: Reservation "
                    f"{_name(view)!r} is {protocol.phase(view.reservation)}",
                    type="Warning",
                ),
            )
            break
    return plan


def _seconds_until(view: ReservationView) -> float:
    return max(0.5, (expires_at(view.reservation) - view.now).total_seconds())


STRAY_GATE_GRACE = timedelta(seconds=30)


def stray_gate(pod: Object, *, claimed: Mapping[str, Any] | None, now: datetime) -> Plan:
    """Let go of a pod gated by Berth that no live Reservation waits for.

    `claimed` is the non-terminal Reservation whose claim token the pod carries, if any.
    A pod gated with a token no Reservation holds (its Reservation ended or vanished, the
    claim was lost, the annotation was forged) would otherwise never be scheduled; after a
    grace period that covers the webhook's claim reaching the caches, its gate is removed.
    """
    if claimed is not None or not protocol.is_gated(pod):
        return Plan()
    created = parse_time(pod["metadata"]["creationTimestamp"])
    if now - created < STRAY_GATE_GRACE:
        return Plan().again_in((created + STRAY_GATE_GRACE - now).total_seconds())
    token = protocol.pod_claim(pod) or "none"
    return Plan().then(
        ungate(pod),
        Event(
            pod,
            Reason.RESERVATION_GATE_REMOVED,
            f"No Reservation holds claim {token!r}: removed Berth's scheduling gate so the pod "
            "is scheduled normally",
            type="Warning",
        ),
    )
