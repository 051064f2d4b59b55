"""The PodMigrationJob state machine: a pure function from the observed world to actions.

Everything it needs to know is on the API objects (the job's conditions, the Reservation,
the pods), so a restarted or newly elected controller picks up any job where it stood.
The order of actions is part of the protocol: the job records "Evicting" before it
evicts, so that a pod found missing later is known to have been evicted, never mistaken
for a pod that vanished on its own.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from berth import protocol
from berth.api import (
    TERMINAL_PHASES,
    PodMigrationJobConditionType,
    PodMigrationJobMode,
    PodMigrationJobPhase,
    PodMigrationJobReason,
    ReservationPhase,
    keys,
)
from berth.kube.client import PODMIGRATIONJOBS, RESERVATIONS
from berth.settings import MigrationControllerArgs
from controller.actions import Create, Delete, Event, Evict, Patch, Plan, UpdateStatus
from controller.arbitration import Decision
from controller.build import reservation_for
from controller.status import (
    condition,
    deadline,
    parse_time,
    reference,
    same_condition,
    timestamp,
    with_condition,
)

Object = dict[str, Any]

Type = PodMigrationJobConditionType
Reason = PodMigrationJobReason
Phase = PodMigrationJobPhase

EVICTION_RETRY = 5.0
CONSUMABLE_SETTLE = timedelta(seconds=1)
WAIT_POLL = 2.0


@dataclass(frozen=True)
class JobView:
    """One job and what it depends on, as the caches hold them."""

    job: Object
    pod: Object | None
    """The pod at spec.podRef's namespace/name now (may be a new pod of the same name)."""
    reservation: Object | None
    owner: Object | None
    """The pod recorded as the Reservation's owner, if it exists."""
    workload_uid: str | None
    now: datetime
    args: MigrationControllerArgs
    siblings: tuple[Object, ...] = ()
    """Pods of the migrated pod's controller, to spot a replacement that bypassed the
    Reservation (created while the webhook was unreachable)."""


def job_name(view: JobView) -> str:
    return str(view.job["metadata"]["name"])


def pod_key(view: JobView) -> str:
    ref = view.job["spec"]["podRef"]
    return f"{ref.get('namespace')}/{ref.get('name')}"


def reservation_name(job: Mapping[str, Any]) -> str:
    """The Reservation a job uses: the one it names, else the one named after its UID."""
    options = job["spec"].get("reservationOptions") or {}
    ref = options.get("reservationRef") or {}
    return str(ref.get("name") or job["metadata"]["uid"])


def source_uid(job: Mapping[str, Any]) -> str | None:
    """The UID of the pod being migrated, recorded when the job started."""
    return (job["metadata"].get("annotations") or {}).get(keys.POD_UID)


def _status(view: JobView, status: Mapping[str, Any]) -> UpdateStatus:
    obj = copy.deepcopy(view.job)
    obj["status"] = dict(status)
    return UpdateStatus(PODMIGRATIONJOBS, obj)


def _finish(
    view: JobView, status: Object, *, phase: Phase, reason: str, message: str, state: str = ""
) -> Plan:
    """End the job; the Reservation, if any, is released by the next passes."""
    status.update(phase=phase, reason=reason, message=message, status=state or reason)
    event_type = "Normal" if phase == Phase.SUCCEEDED else "Warning"
    event_reason = "Complete" if phase == Phase.SUCCEEDED else reason
    return Plan().then(
        _status(view, status), Event(view.job, event_reason, message, type=event_type)
    )


def pod_gone(view: JobView) -> bool:
    """The migrated pod no longer exists: deleted, or replaced under the same name."""
    uid = source_uid(view.job)
    return view.pod is None or (uid is not None and view.pod["metadata"]["uid"] != uid)


def decide(view: JobView) -> Plan:
    """The next step for one job in phase Running, or the clean-up of a finished one."""
    status: Object = dict(view.job.get("status") or {})
    phase = status.get("phase") or Phase.PENDING
    if phase in TERMINAL_PHASES:
        return _release(view, status)
    expired = view.now >= deadline(view.job, view.job["spec"].get("ttl"), view.args.default_job_ttl)
    if phase != Phase.RUNNING:
        if not expired:
            return Plan().again_in(
                max(
                    0.5,
                    (
                        deadline(view.job, view.job["spec"].get("ttl"), view.args.default_job_ttl)
                        - view.now
                    ).total_seconds(),
                )
            )
        waited = (
            f": {status['reason']}: {status.get('message', '')}" if status.get("reason") else ""
        )
        paused = " (paused)" if view.job["spec"].get("paused") else ""
        return _finish(
            view,
            status,
            phase=Phase.FAILED,
            reason=Reason.TIMEOUT,
            message=f"TTL expired before the job started{paused}{waited}",
        )
    evicting = condition(status, Type.EVICTION) is not None
    if view.job["spec"].get("mode") == PodMigrationJobMode.EVICT_DIRECTLY:
        return _evict_directly(view, status, expired=expired, evicting=evicting)
    if not evicting:
        return _before_eviction(view, status, expired=expired)
    return _after_eviction(view, status, expired=expired)


def _before_eviction(view: JobView, status: Object, *, expired: bool) -> Plan:
    """Reserve, wait for the place, then announce and start the eviction."""
    reservation = view.reservation
    if expired:
        return _finish(
            view,
            status,
            phase=Phase.FAILED,
            reason=Reason.TIMEOUT,
            message="TTL expired before the pod was evicted; nothing was evicted "
            "and the reservation is released",
        )
    if pod_gone(view) or view.pod is None:
        return _finish(
            view,
            status,
            phase=Phase.FAILED,
            reason=Reason.MISSING_POD,
            message=f"pod {pod_key(view)} no longer exists",
        )
    if reservation is None:
        return _create_reservation(view, status)
    rsv_name = reservation["metadata"]["name"]
    rsv_phase = protocol.phase(reservation)
    if rsv_phase == ReservationPhase.FAILED or (rsv_phase == ReservationPhase.SUCCEEDED):
        return _finish(
            view,
            status,
            phase=Phase.FAILED,
            reason=Reason.RESERVATION_EXPIRED,
            message=f"Reservation {rsv_name!r} is {rsv_phase} before it was used",
        )
    node = protocol.node_of(reservation)
    if rsv_phase != ReservationPhase.AVAILABLE or node is None:
        scheduled = condition(reservation.get("status") or {}, "Scheduled") or {}
        message = str(scheduled.get("message") or "waiting for the scheduler")
        if same_condition(
            status,
            kind=Type.RESERVATION_SCHEDULED,
            state="False",
            reason=Reason.UNSCHEDULABLE,
            message=message,
        ):
            return Plan().again_in(WAIT_POLL)
        status = with_condition(
            status,
            kind=Type.RESERVATION_SCHEDULED,
            state="False",
            reason=Reason.UNSCHEDULABLE,
            message=message,
            now=view.now,
        )
        status.update(status=Reason.UNSCHEDULABLE, reason=Reason.UNSCHEDULABLE, message=message)
        return Plan().then(_status(view, status)).again_in(WAIT_POLL)
    if node == view.pod["spec"].get("nodeName"):
        return _finish(
            view,
            status,
            phase=Phase.FAILED,
            reason=Reason.UNSCHEDULABLE,
            message=f"Reservation {rsv_name!r} holds its place on {node}, the node "
            "the pod already runs on; nothing was evicted",
        )
    plan = Plan()
    current = condition(status, Type.RESERVATION_SCHEDULED)
    if not current or current.get("status") != "True":
        status = with_condition(
            status,
            kind=Type.RESERVATION_SCHEDULED,
            state="True",
            reason="Scheduled",
            message=f"reserved on {node}",
            now=view.now,
        )
        status.update(nodeName=node, status="ReservationScheduled", reason="", message="")
        plan.then(
            Event(
                view.job,
                "ReservationScheduled",
                f"Assigned Reservation {rsv_name!r} to node {node!r}",
            )
        )
    if view.job["spec"].get("paused"):
        plan.actions.insert(0, _status(view, status))
        return plan.again_in(WAIT_POLL)
    return _start_eviction(view, status, plan)


def _create_reservation(view: JobView, status: Object) -> Plan:
    options = view.job["spec"].get("reservationOptions") or {}
    if (options.get("reservationRef") or {}).get("name"):
        return _finish(
            view,
            status,
            phase=Phase.FAILED,
            reason=Reason.MISSING_RESERVATION,
            message=f"Reservation {reservation_name(view.job)!r} does not exist",
        )
    assert view.pod is not None
    ttl = view.job["spec"].get("ttl") or f"{int(view.args.default_job_ttl.total_seconds())}s"
    body = reservation_for(
        job=view.job,
        pod=view.pod,
        workload_uid=view.workload_uid,
        ttl=ttl,
        template=options.get("template"),
    )
    name = body["metadata"]["name"]
    status = with_condition(
        status,
        kind=Type.RESERVATION_CREATED,
        state="True",
        reason="Created",
        message=f"Reservation {name!r}",
        now=view.now,
    )
    status.update(status="ReservationCreated", reason="", message="")
    return (
        Plan()
        .then(
            Create(RESERVATIONS, body),
            # Record it where the RESERVATION column reads it, as the design describes.
            Patch(
                PODMIGRATIONJOBS,
                job_name(view),
                {"spec": {"reservationOptions": {"reservationRef": {"name": name}}}},
            ),
            _status(view, status),
            Event(view.job, "ReservationCreated", f"Successfully create Reservation {name!r}"),
        )
        .again_in(WAIT_POLL)
    )


def _start_eviction(view: JobView, status: Object, plan: Plan) -> Plan:
    """Open the Reservation to the replacement, record Evicting, then evict."""
    assert view.pod is not None
    assert view.reservation is not None
    rsv = view.reservation["metadata"]["name"]
    pod = view.pod["metadata"]
    annotations = protocol.annotations_of(view.reservation)
    if annotations.get(keys.CONSUMABLE) != "true":
        # Open it a moment before evicting, so that the webhooks' caches have seen it open
        # when the replacement, created right after the eviction, comes to claim it.
        if plan.actions:  # the ReservationScheduled news of this pass
            plan.actions.insert(0, _status(view, status))
        return plan.then(
            Patch(
                RESERVATIONS,
                rsv,
                {
                    "metadata": {
                        "annotations": {
                            keys.CONSUMABLE: "true",
                            keys.OPENED_AT: timestamp(view.now),
                        }
                    }
                },
            )
        ).again_in(CONSUMABLE_SETTLE.total_seconds())
    opened = annotations.get(keys.OPENED_AT)
    if opened and view.now < parse_time(opened) + CONSUMABLE_SETTLE:
        if plan.actions:
            plan.actions.insert(0, _status(view, status))
        return plan.again_in((parse_time(opened) + CONSUMABLE_SETTLE - view.now).total_seconds())
    status = with_condition(
        status,
        kind=Type.EVICTION,
        state="False",
        reason=Reason.EVICTING,
        message=f"evicting {pod['namespace']}/{pod['name']}",
        now=view.now,
    )
    status.update(status=Reason.EVICTING, reason="", message="")
    earlier_events = plan.actions
    plan = Plan()
    plan.then(
        _status(view, status),
        *earlier_events,
        Event(view.job, "Evicting", f'Try to evict Pod "{pod["namespace"]}/{pod["name"]}"'),
        _evict(view),
    )
    return plan.again_in(WAIT_POLL)


def _evict(view: JobView) -> Evict:
    assert view.pod is not None
    pod = view.pod["metadata"]
    options = view.job["spec"].get("deleteOptions") or view.args.default_delete_options
    return Evict(
        pod["namespace"],
        pod["name"],
        pod["uid"],
        policy=view.args.eviction_policy,
        delete_options=options,
    )


def _evicted(view: JobView, status: Object, plan: Plan) -> Object:
    """Record EvictComplete once the pod is gone."""
    eviction = condition(status, Type.EVICTION) or {}
    if eviction.get("status") == "True":
        return status
    status = with_condition(
        status,
        kind=Type.EVICTION,
        state="True",
        reason=Reason.EVICT_COMPLETE,
        message=f"pod {pod_key(view)} is gone",
        now=view.now,
    )
    status.update(status=Reason.EVICT_COMPLETE, reason="", message="")
    plan.then(Event(view.job, "EvictComplete", f'Pod "{pod_key(view)}" has been evicted'))
    return status


def _still_evicting(view: JobView, status: Object, *, expired: bool) -> Plan:
    """The pod is still there: wait for its termination, or evict again."""
    assert view.pod is not None
    if view.pod["metadata"].get("deletionTimestamp"):
        return Plan().again_in(WAIT_POLL)
    if expired:
        return _finish(
            view,
            status,
            phase=Phase.FAILED,
            reason=Reason.TIMEOUT,
            message=f"TTL expired while pod {pod_key(view)} could not be evicted "
            f"({(condition(status, Type.EVICTION) or {}).get('message')}); "
            "nothing was evicted and the reservation is released",
        )
    return Plan().then(_evict(view)).again_in(EVICTION_RETRY)


def _after_eviction(view: JobView, status: Object, *, expired: bool) -> Plan:
    if not pod_gone(view):
        return _still_evicting(view, status, expired=expired)
    plan = Plan()
    status = _evicted(view, status, plan)
    reservation = view.reservation
    owner = view.owner
    rsv = reservation["metadata"]["name"] if reservation else reservation_name(view.job)
    node = protocol.node_of(reservation) if reservation else None
    if owner is not None and owner["spec"].get("nodeName"):
        owner_ref = reference(owner)
        status["podRef"] = owner_ref
        if not same_condition(
            status,
            kind=Type.POD_BOUND_RESERVATION,
            state="True",
            reason="Bound",
            message=f"pod {owner_ref['name']} on {node}",
        ):
            status = with_condition(
                status,
                kind=Type.POD_BOUND_RESERVATION,
                state="True",
                reason="Bound",
                message=f"pod {owner_ref['name']} on {node}",
                now=view.now,
            )
        if protocol.is_ready(owner):
            status = with_condition(
                status,
                kind=Type.BOUND_POD_READY,
                state="True",
                reason="Ready",
                message=f"pod {owner_ref['name']} is ready",
                now=view.now,
            )
            status.update(
                phase=Phase.SUCCEEDED,
                status="Complete",
                reason="",
                message="",
                nodeName=owner["spec"]["nodeName"],
            )
            plan.actions.insert(0, _status(view, status))
            return plan.then(
                Event(
                    view.job,
                    "Complete",
                    f'Bind Pod "{owner["metadata"]["namespace"]}/'
                    f'{owner_ref["name"]}" in Reservation {rsv!r}',
                )
            )
        wait = (Reason.WAIT_FOR_BOUND_POD_READY, f"waiting for pod {owner_ref['name']} to be ready")
        kind = Type.BOUND_POD_READY
    else:
        bypass = _unbound_replacement(view, status)
        if (
            bypass is not None
            and reservation is not None
            and protocol.claim_of(reservation) is None
        ):
            plan.actions.clear()
            return _finish(
                view,
                status,
                phase=Phase.FAILED,
                reason="ReservationNotUsed",
                message=f"replacement pod {bypass['metadata']['name']} was created "
                f"without claiming Reservation {rsv!r} (is the webhook "
                "running?); it is scheduled as any pod, and the "
                "reservation is released",
            )
        wait = (
            Reason.WAIT_FOR_POD_BIND_RESERVATION,
            f"waiting for a replacement pod to bind Reservation {rsv!r} on {node}",
        )
        kind = Type.POD_BOUND_RESERVATION
    if expired:
        plan.actions.clear()
        return _finish(
            view,
            status,
            phase=Phase.FAILED,
            reason=Reason.TIMEOUT,
            message=f"TTL expired after the pod was evicted, {wait[1]}; the "
            "reservation is released and any gated pod let go",
        )
    if not same_condition(status, kind=kind, state="False", reason=wait[0], message=wait[1]):
        status = with_condition(
            status, kind=kind, state="False", reason=wait[0], message=wait[1], now=view.now
        )
        status.update(status=wait[0])
        plan.actions.insert(0, _status(view, status))
    elif plan.actions:
        plan.actions.insert(0, _status(view, status))
    return plan.again_in(WAIT_POLL)


def _unbound_replacement(view: JobView, status: Mapping[str, Any]) -> Object | None:
    """A pod of the same controller, created since the job reserved its place, that
    carries no claim: the workload replaced the pod without going through the webhook.
    (The reservation's creation, unlike the eviction's start, is a time that stays put.)"""
    reserved = (
        condition(status, Type.RESERVATION_CREATED)
        or condition(status, Type.RESERVATION_SCHEDULED)
        or {}
    )
    started = reserved.get("lastTransitionTime")
    if not started:
        return None
    for pod in view.siblings:
        metadata = pod["metadata"]
        if (
            metadata.get("uid") == source_uid(view.job)
            or protocol.pod_claim(pod)
            or protocol.placeholder_reservation(pod)
        ):
            continue
        # Timestamps have whole seconds: only a pod from a later second is surely newer.
        if metadata.get("creationTimestamp", "") > started:
            return pod
    return None


def _evict_directly(view: JobView, status: Object, *, expired: bool, evicting: bool) -> Plan:
    if not evicting:
        if pod_gone(view) or view.pod is None:
            return _finish(
                view,
                status,
                phase=Phase.FAILED,
                reason=Reason.MISSING_POD,
                message=f"pod {pod_key(view)} no longer exists",
            )
        if expired:
            return _finish(
                view,
                status,
                phase=Phase.FAILED,
                reason=Reason.TIMEOUT,
                message="TTL expired before the pod was evicted",
            )
        pod = view.pod["metadata"]
        status = with_condition(
            status,
            kind=Type.EVICTION,
            state="False",
            reason=Reason.EVICTING,
            message=f"evicting {pod['namespace']}/{pod['name']}",
            now=view.now,
        )
        status.update(status=Reason.EVICTING)
        return (
            Plan()
            .then(
                _status(view, status),
                Event(view.job, "Evicting", f'Try to evict Pod "{pod["namespace"]}/{pod["name"]}"'),
                _evict(view),
            )
            .again_in(WAIT_POLL)
        )
    if not pod_gone(view):
        return _still_evicting(view, status, expired=expired)
    plan = Plan()
    status = _evicted(view, status, plan)
    status.update(phase=Phase.SUCCEEDED, status="Complete", reason="", message="")
    plan.actions.insert(0, _status(view, status))
    return plan.then(Event(view.job, "Complete", f'Pod "{pod_key(view)}" evicted directly'))


def _release(view: JobView, status: Object) -> Plan:
    """A finished job (by us, or aborted by the user) frees its Reservation if unused."""
    plan = Plan()
    reservation = view.reservation
    if reservation is None or not _created_by(reservation, view.job):
        return plan
    phase = protocol.phase(reservation)
    evicting = condition(status, Type.EVICTION) is not None
    if not evicting and not protocol.owner_uids(reservation):
        # Rolled back before anything was evicted: the Reservation simply goes away.
        meta = reservation["metadata"]
        return plan.then(Delete(RESERVATIONS, meta["name"], uid=meta["uid"]))
    if phase in (ReservationPhase.SUCCEEDED, ReservationPhase.FAILED):
        return plan
    released = copy.deepcopy(reservation)
    released["status"] = {**(reservation.get("status") or {}), "phase": ReservationPhase.FAILED}
    released["status"] = with_condition(
        released["status"],
        kind="Ready",
        state="False",
        reason="Released",
        message=f"job {job_name(view)} ended",
        now=view.now,
    )
    return plan.then(UpdateStatus(RESERVATIONS, released))


def _created_by(reservation: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    return bool(protocol.annotations_of(reservation).get(keys.JOB) == job["metadata"]["name"])


def eviction_refused(view: JobView, *, status_code: int, message: str) -> Plan:
    """The API server refused the eviction: say why on the job and try again later.

    HTTP 429 means a PodDisruptionBudget allows no disruption now; the job keeps trying
    until its TTL, and reports BlockedByPDB meanwhile.
    """
    status: Object = dict(view.job.get("status") or {})
    reason = Reason.BLOCKED_BY_PDB if status_code == 429 else Reason.FAILED_EVICT
    if same_condition(status, kind=Type.EVICTION, state="False", reason=reason, message=message):
        return Plan().again_in(EVICTION_RETRY)
    status = with_condition(
        status, kind=Type.EVICTION, state="False", reason=reason, message=message, now=view.now
    )
    status.update(status=reason, reason=reason, message=message)
    plan = Plan().then(_status(view, status))
    if reason == Reason.BLOCKED_BY_PDB:
        plan.then(Event(view.job, "BlockedByPDB", message, type="Warning"))
    return plan.again_in(EVICTION_RETRY)


# ----- admission: what arbitration decided, written on the job ----------------------------

DRY_RUN_MESSAGE = (
    "dryRun: arbitration would start this job now; nothing is reserved or "
    "evicted while dryRun is set"
)


def admission(decision: Decision, *, workload_uid: str | None, dry_run: bool) -> Plan:
    """Write arbitration's decision on a Pending job.

    Admitted: phase Running, with the pod's UID, source node and workload recorded (what
    the limits count from then on). Failed: phase Failed with the rule, and a Warning
    event. Waiting: the reason and message in the status, written only when they change.
    With dryRun an admitted job stays Pending and says so (reason DryRun): nothing starts.
    """
    job = dict(decision.job)
    status: Object = dict(job.get("status") or {})
    name = job["metadata"]["name"]
    if decision.verdict == "admit" and not dry_run:
        assert decision.pod is not None
        pod = decision.pod
        status.update(phase=Phase.RUNNING, reason="", message="", status="")
        return Plan().then(
            Patch(
                PODMIGRATIONJOBS,
                name,
                {
                    "metadata": {
                        "annotations": {
                            keys.POD_UID: pod["metadata"]["uid"],
                            keys.SOURCE_NODE: pod["spec"].get("nodeName") or "",
                            keys.WORKLOAD: workload_uid or "",
                        }
                    }
                },
            ),
            UpdateStatus(PODMIGRATIONJOBS, {**job, "status": status}),
        )
    if decision.verdict == "fail":
        status.update(
            phase=Phase.FAILED,
            reason=decision.reason,
            message=decision.message,
            status=decision.reason,
        )
        return Plan().then(
            UpdateStatus(PODMIGRATIONJOBS, {**job, "status": status}),
            Event(job, decision.reason, decision.message, type="Warning"),
        )
    reason, message = (
        (Reason.DRY_RUN.value, DRY_RUN_MESSAGE)
        if decision.verdict == "admit"
        else (decision.reason, decision.message)
    )
    if (status.get("reason"), status.get("message")) == (reason, message):
        return Plan()
    status.update(reason=reason, message=message)
    plan = Plan().then(UpdateStatus(PODMIGRATIONJOBS, {**job, "status": status}))
    return plan.then(Event(job, reason, message)) if reason == Reason.DRY_RUN else plan
