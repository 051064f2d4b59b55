"""The Reservation lifecycle, as a pure decision over what the API server shows.

Pending: its placeholder pod exists and waits for the scheduler. The placeholder is the
pod the controller created and recorded on the Reservation (`berth.sh/placeholder`, from
the create response; see berth.protocol); any other pod whose controller reference names
the Reservation is a stray (a placeholder whose record was lost to a crash between its
creation and the record, or a pod made to pass for one). Strays are deleted, with their
UID as precondition and a Warning event on them: they hold nothing for the Reservation,
and every component counts them as the ordinary pods they are until they are gone. Available: the
placeholder is bound to a node, so that capacity is held. Then the handover (see
berth.protocol and `handover_step`): the pod that claimed it is recorded as owner, the
owner is nominated to the node, the placeholder is deleted, and once it is gone the
owner's scheduling gate is removed. Succeeded: the owner is bound to the node. Failed:
expired or released; its placeholder is deleted and any pod still gated on it is let go,
so no pod ever stays gated on a dead Reservation.

A claim token is no credential: a pod may carry one copied from the Reservation or from
another pod. The claimer is recorded only if it is the one pod carrying the token, in the
Reservation's namespace, and its controller, as the caches know it, is the Reservation's
owner workload (`protocol.may_claim`). With two pods or more carrying it, none is: which
one the webhook meant cannot be told, so the Reservation stays unowned and keeps its
place. Either way, a claim that no pod has taken `CLAIM_BOUND` after it was written is
released (removed, conditional on the token and the resourceVersion), the Reservation is
consumable again for another replacement until its TTL, and the pods still carrying the
old token are ungated by the stray-gate sweep.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from berth import protocol
from berth.api import (
    ReservationConditionType,
    ReservationPhase,
    ReservationReason,
    keys,
)
from berth.api.times import read_time
from berth.kube.client import PODS, PRIORITYCLASSES, RESERVATIONS
from berth.protocol import expires_at
from controller import build
from controller.actions import Action, Create, Delete, Event, Patch, Plan, Record, UpdateStatus
from controller.build import allocatable_of, placeholder_for, placeholder_prefix
from controller.status import (
    UNREADABLE,
    parse_time,
    reference,
    same_condition,
    scheduling_message,
    timestamp,
    unreadable,
    with_condition,
)

Object = dict[str, Any]

Condition = ReservationConditionType
Reason = ReservationReason

HANDOVER_POLL = 1.0
CLAIM_POLL = 1.0
CLASS_SETTLES = 1.0
"""Seconds between creating a placeholder's PriorityClass and creating the placeholder."""
LOOK_AGAIN = 3600.0
"""Seconds at most before a Reservation waiting for its expiry is looked at again."""


@dataclass(frozen=True)
class ReservationView:
    """A Reservation and the pods that matter to it, as the caches hold them."""

    reservation: Object
    placeholder: Object | None
    """Its placeholder: the pod it records (`protocol.is_placeholder_of`)."""
    claimers: tuple[Object, ...]
    """The pods carrying the Reservation's claim token."""
    accepted: tuple[Object, ...]
    """Those of `claimers` that may own it (`protocol.may_claim`, controller resolved
    through the caches)."""
    owner: Object | None
    """The pod recorded in status.currentOwners, if it still exists."""
    now: datetime
    image: str
    strays: tuple[Object, ...] = ()
    """Pods, not terminating, whose controller reference names it but that are not its
    placeholder."""
    priority_class: Object | None = None
    """The non-preempting PriorityClass its placeholder runs under
    (`build.non_preempting_class`); None keeps the pod's own class."""
    node_gone: bool = False
    """The placeholder is bound to a node the node cache no longer holds: deleted."""
    node_refuses: str | None = None
    """Why the placeholder's node takes no new pod like it (cordoned, a taint it does not
    tolerate, labels its placement excludes: `scheduling.node_refusal`): a replacement
    could not take the place there."""
    stranded: tuple[Object, ...] = ()
    """Of its owner and `accepted`, those not bound nor terminating whose required
    affinity ties them to a node the node cache no longer holds (`protocol.tied_node`):
    they can never be scheduled."""
    priority_class_found: Object | None = None
    """The PriorityClass of `priority_class`'s name as the caches hold it (None: none
    yet, so it is created first); used only if it is what `priority_class` says
    (`build.unusable_class`)."""


def delete_placeholder(placeholder: Mapping[str, Any]) -> Delete:
    """Delete the placeholder at once (it runs nothing), only if it is still that pod."""
    metadata = placeholder["metadata"]
    return Delete(
        PODS,
        metadata["name"],
        namespace=metadata["namespace"],
        uid=metadata["uid"],
        grace_period_seconds=0,
    )


def ungate(pod: Mapping[str, Any]) -> Patch:
    """Remove Berth's gate from a pod, keeping any other gate; the tests guard the pod (a
    pod of the same name made since, a StatefulSet's, is another) and the index."""
    gates = pod["spec"].get("schedulingGates") or []
    index = next(i for i, gate in enumerate(gates) if gate.get("name") == keys.RESERVATION_GATE)
    operations = [
        {"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
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


def spec_problem(reservation: Object) -> str | None:
    """Why the Reservation holds no place Berth can make, if so: its spec is what the
    schema lets in (a template is free-form), yet its placeholder, its capacity or its
    expiry cannot be worked out from it. Said once, rather than failing every pass."""
    template = (reservation.get("spec") or {}).get("template")
    spec = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(spec, dict) or not spec.get("containers"):
        return (
            "its spec cannot be carried out (template.spec.containers is empty: a place "
            "is what the template's containers ask for)"
        )
    try:
        expires_at(reservation)
        allocatable_of(reservation)
        placeholder_for(reservation, image="pause")
        build.placeholder_priority(reservation, {}, 0)
    except UNREADABLE as error:
        return f"its spec cannot be carried out ({unreadable(error)})"
    return None


def _ended(
    view: ReservationView, status: Object, reason: str, message: str, *, event_type: str
) -> tuple[Action, ...]:
    """The Reservation Failed for `reason`: its status, then an event saying why."""
    status = with_condition(
        status, kind=Condition.READY, state="False", reason=reason, message=message, now=view.now
    )
    status["phase"] = ReservationPhase.FAILED
    return (
        _status(view, status),
        Event(view.reservation, reason, f"Reservation {_name(view)!r}: {message}", type=event_type),
    )


def decide(view: ReservationView) -> Plan:
    """The next step for one Reservation."""
    reservation = view.reservation
    status: Object = dict(reservation.get("status") or {})
    phase = protocol.phase(reservation)
    plan = Plan().then(*_delete_strays(view))
    if view.stranded:
        # Their deletion is the whole pass: the next one sees the owner gone or the claim
        # untaken, and goes on from there.
        return plan.then(*_delete_stranded(view)).again_in(HANDOVER_POLL)
    if phase in (ReservationPhase.SUCCEEDED, ReservationPhase.FAILED):
        return _cleanup(view, plan, released=phase == ReservationPhase.FAILED)
    invalid = spec_problem(reservation)
    if invalid is not None:
        return plan.then(*_ended(view, status, Reason.INVALID, invalid, event_type="Warning"))
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
    token = protocol.claim_of(reservation)
    if token and _claim(view, status, token, plan):
        return plan
    return _hold(view, status, plan)


def _delete_strays(view: ReservationView) -> list[Action]:
    """Delete the pods that pass for the Reservation's placeholder without being it."""
    return [
        action
        for pod in view.strays
        for action in _delete_pod(
            pod,
            Reason.STRAY_PLACEHOLDER_DELETED,
            f"it names Reservation {_name(view)!r} as its controller, but is not its placeholder",
        )
    ]


def _delete_stranded(view: ReservationView) -> list[Action]:
    """Delete the pods tied to a deleted node (`ReservationView.stranded`). An affinity
    can only be narrowed, so each would stay Pending for ever; none has run, and its
    workload's controller creates another, which is scheduled anywhere (or takes this
    Reservation again once its placeholder holds a place elsewhere)."""
    return [
        action
        for pod in view.stranded
        for action in _delete_pod(
            pod,
            Reason.STRANDED_POD_DELETED,
            f"it took Reservation {_name(view)!r}, which tied it to node "
            f"{protocol.tied_node(pod)}, and that node was deleted; its workload creates one "
            "that can be scheduled",
            as_read=True,
        )
    ]


def _delete_pod(pod: Object, reason: Reason, why: str, *, as_read: bool = False) -> list[Action]:
    """Delete `pod` if it is still that pod (UID precondition), saying why on it. With
    `as_read`, only if it has not changed since it was read (resourceVersion
    precondition): a pod deleted because it could not be scheduled may have been bound
    since, and runs then."""
    metadata = pod["metadata"]
    version = metadata.get("resourceVersion")
    options = {"preconditions": {"resourceVersion": version}} if as_read and version else None
    return [
        Delete(
            PODS,
            metadata["name"],
            namespace=metadata["namespace"],
            uid=metadata["uid"],
            options=options,
        ),
        Event(pod, reason, f"Deleted pod {_pod_name(pod)}: {why}", type="Warning"),
    ]


def _claim(view: ReservationView, status: Object, token: str, plan: Plan) -> bool:
    """Record the one acceptable claimer as owner (True: that is the whole plan), or refuse
    several, or release a claim no pod took in time."""
    reservation = view.reservation
    if protocol.phase(reservation) != ReservationPhase.AVAILABLE or not protocol.node_of(
        reservation
    ):
        # Its placeholder was lost after the claim: no place to hand over. The claimer's
        # gate comes off as a stray's, and the place, once held again, is opened anew.
        plan.then(
            release_claim(reservation, token),
            Event(
                reservation,
                Reason.RESERVATION_CLAIM_RELEASED,
                f"Released claim {protocol.fingerprint(token)}: the Reservation holds no "
                "place now (its placeholder was lost)",
                type="Warning",
            ),
        )
        return True
    if not _holds_place(view):
        # Lost after the claim, before this pass (preempted, deleted, finished, its node
        # gone): `_hold` says so first, and the claim is released on the next pass. A
        # claimer recorded now would be handed a place nothing holds.
        return False
    if len(view.claimers) == 1 and len(view.accepted) == 1 and protocol.is_gated(view.accepted[0]):
        status["currentOwners"] = [reference(view.accepted[0])]
        plan.then(
            _status(view, status),
            Event(
                reservation,
                Reason.RESERVATION_CLAIMED,
                f"Pod {_pod_name(view.accepted[0])} claimed Reservation {_name(view)!r}",
            ),
        )
        return True
    if len(view.claimers) > 1:
        names = ", ".join(sorted(_pod_name(p) for p in view.claimers))
        plan.then(
            Event(
                reservation,
                Reason.RESERVATION_CLAIM_REFUSED,
                f"{len(view.claimers)} pods carry claim {protocol.fingerprint(token)} "
                f"({names}): none is recorded as owner",
                type="Warning",
            )
        )
    claimed = protocol.claimed_at(reservation)
    if claimed is None:
        return False  # no record of when: the TTL bounds it
    left = (claimed + protocol.CLAIM_BOUND - view.now).total_seconds()
    if left > 0:
        # A claimer whose controller the caches do not show yet is looked at again soon.
        plan.again_in(min(left, CLAIM_POLL) if len(view.claimers) == 1 else left)
        return False
    plan.then(
        release_claim(reservation, token),
        Event(
            reservation,
            Reason.RESERVATION_CLAIM_RELEASED,
            f"No pod took claim {protocol.fingerprint(token)} within "
            f"{protocol.CLAIM_BOUND.total_seconds():.0f}s: released it for another replacement",
            type="Warning",
        ),
    )
    return False


def _holds_place(view: ReservationView) -> bool:
    """Whether the placeholder holds the Reservation's place now: there, not finished,
    bound to the Reservation's node, which is not gone."""
    return (
        protocol.placeholder_holds(view.reservation, view.placeholder)
        and not view.node_gone
        and view.node_refuses is None
    )


def release_claim(reservation: Mapping[str, Any], token: str) -> Patch:
    """Remove the claim, only if it is still `token` and nothing else changed meanwhile."""
    path = "/metadata/annotations/" + keys.CLAIM.replace("~", "~0").replace("/", "~1")
    operations = [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": reservation["metadata"]["resourceVersion"],
        },
        {"op": "test", "path": path, "value": token},
        {"op": "remove", "path": path},
    ]
    return Patch(RESERVATIONS, reservation["metadata"]["name"], operations, json_patch=True)


def _pod_name(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"


def _hold(view: ReservationView, status: Object, plan: Plan) -> Plan:
    """Keep the placeholder alive and the status in step with it."""
    reservation = view.reservation
    placeholder = view.placeholder
    if placeholder is not None and protocol.is_terminal_pod(placeholder):
        # Failed (evicted by the kubelet under pressure, refused at admission on the node)
        # or Succeeded: the scheduler no longer counts it, so it holds nothing. A new one
        # is made; this one, no longer recorded, goes as a stray.
        placeholder = None
    available = protocol.phase(reservation) == ReservationPhase.AVAILABLE
    held_on = protocol.node_of(reservation)
    lost = available and (placeholder is None or not placeholder["spec"].get("nodeName"))
    if lost:
        # The place is no longer held: Pending before anything else is done, so that a
        # plan stopped halfway (a crash, a conflict, a refused create) never leaves the
        # Reservation Available where nothing holds its place.
        status.update(phase=ReservationPhase.PENDING, nodeName=None)
        available = False
    if placeholder is None:
        return _replace_placeholder(view, status, plan, lost=lost)
    node = placeholder["spec"].get("nodeName")
    if node and view.node_gone:
        return _place_lost(
            view, status, plan, why=f"node {node} of the placeholder pod was deleted"
        )
    if node and view.node_refuses is not None:
        return _place_lost(
            view,
            status,
            plan,
            why=f"{view.node_refuses}: a replacement could not be scheduled there, so the "
            "placeholder pod is deleted and placed again",
        )
    if node and (not available or node != held_on):
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
        if lost or not same_condition(
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


def _replace_placeholder(view: ReservationView, status: Object, plan: Plan, *, lost: bool) -> Plan:
    """No placeholder holds the place (none, or a finished one): say so first if the
    Reservation was Available (`lost`), then make one."""
    reservation = view.reservation
    if lost:
        status = with_condition(
            status,
            kind=Condition.SCHEDULED,
            state="False",
            reason=Reason.LOST,
            message="placeholder pod disappeared",
            now=view.now,
        )
        plan.then(_status(view, status))
    priority_class = view.priority_class
    found = view.priority_class_found
    if priority_class is not None and found is None:
        # Created once per priority value, then kept (an existing one counts as done:
        # the placeholder states the class's value and policy, and admission refuses
        # it under a class made otherwise). The placeholder waits for the next pass:
        # the API server's priority admission refuses a pod whose class its own cache
        # has not seen yet, and by then this process's cache has seen it too.
        plan.then(Create(PRIORITYCLASSES, priority_class))
        return plan.again_in(CLASS_SETTLES)
    unusable = build.unusable_class(priority_class, found) if priority_class and found else None
    if unusable:
        return _refuse_class(view, status, plan, unusable)
    plan.then(
        Create(
            PODS,
            placeholder_for(reservation, image=view.image, priority_class=priority_class),
            namespace=protocol.placeholder_namespace(reservation),
            record=Record(RESERVATIONS, _name(view), keys.PLACEHOLDER),
        )
    )
    return plan.again_in(_seconds_until(view))


def placeholder_refused(
    view: ReservationView, *, status_code: int, message: str, resource: str = "pods"
) -> Plan:
    """The API server refused to create the placeholder, or (`resource` priorityclasses)
    the PriorityClass it runs under: say why on the Reservation
    (Scheduled=False, `FailedCreate`, and a Warning event, once per message), so that its
    job does not wait "for the scheduler" until its TTL. The create is tried again,
    backing off: the name the API server generated for each attempt is left out of the
    message, which would otherwise differ each time, and each write of it bring the
    Reservation straight back to the queue, and the create with it."""
    status: Object = dict(view.reservation.get("status") or {})
    # As the API server makes a name of a generateName: at most 58 characters of it,
    # then 5 random ones (`names.SimpleNameGenerator`).
    prefix = placeholder_prefix(_name(view))[:58]
    message = re.sub(re.escape(prefix) + r"[a-z0-9]{5}", f"{prefix}*", message)
    made = "the placeholder pod"
    if resource == PRIORITYCLASSES.plural and view.priority_class is not None:
        made = f"the placeholder's PriorityClass {view.priority_class['metadata']['name']!r}"
    said = f"{made} cannot be created: the API server answered {status_code}: {message}"
    if same_condition(
        status, kind=Condition.SCHEDULED, state="False", reason=Reason.FAILED_CREATE, message=said
    ):
        return Plan()
    status = with_condition(
        status,
        kind=Condition.SCHEDULED,
        state="False",
        reason=Reason.FAILED_CREATE,
        message=said,
        now=view.now,
    )
    return Plan().then(
        _status(view, status),
        Event(view.reservation, Reason.FAILED_CREATE, said, type="Warning"),
    )


CLASS_POLL = 10.0
"""Seconds between looks at a PriorityClass that is not as Berth needs it (its changes
bring no Reservation into the queue)."""


def _refuse_class(view: ReservationView, status: Object, plan: Plan, message: str) -> Plan:
    """No placeholder under a PriorityClass that is not as Berth makes it: the Reservation
    stays Pending (its job waits, with this message, until fixed or its TTL), and says so
    once with a Warning event naming the class."""
    if not same_condition(
        status,
        kind=Condition.SCHEDULED,
        state="False",
        reason=Reason.PRIORITY_CLASS_MISMATCH,
        message=message,
    ):
        status.update(phase=ReservationPhase.PENDING, nodeName=None)
        status = with_condition(
            status,
            kind=Condition.SCHEDULED,
            state="False",
            reason=Reason.PRIORITY_CLASS_MISMATCH,
            message=message,
            now=view.now,
        )
        plan.then(
            _status(view, status),
            Event(view.reservation, Reason.PRIORITY_CLASS_MISMATCH, message, type="Warning"),
        )
    return plan.again_in(min(CLASS_POLL, _seconds_until(view)))


def _place_lost(view: ReservationView, status: Object, plan: Plan, *, why: str) -> Plan:
    """The placeholder's node was deleted (nothing will run there, and the pod garbage
    collector removes it only later), or takes no new pod like it: its place cannot be
    handed over. Delete it, so that a new one is placed elsewhere, and never let the
    Reservation count as Available meanwhile: a job evicting on the strength of it would
    send its replacement where it cannot go."""
    assert view.placeholder is not None
    plan.then(delete_placeholder(view.placeholder))
    if protocol.phase(view.reservation) == ReservationPhase.AVAILABLE:
        status.update(phase=ReservationPhase.PENDING, nodeName=None)
        status = with_condition(
            status,
            kind=Condition.SCHEDULED,
            state="False",
            reason=Reason.LOST,
            message=why,
            now=view.now,
        )
        plan.then(_status(view, status))
    return plan.again_in(_seconds_until(view))


class Step(StrEnum):
    """The next step of a handover, for an owner recorded but not bound yet."""

    NOMINATE = "nominate"
    """Set the owner's status.nominatedNodeName to the node, and see it written."""
    FREE = "free"
    """Delete the placeholder (the owner is nominated), and see it gone."""
    UNGATE = "ungate"
    """Remove Berth's gate: the placeholder is gone, the owner nominated."""
    NOMINATE_AND_UNGATE = "nominate-and-ungate"
    """The placeholder is gone but the owner is not nominated (a handover begun by a
    Berth without this step): nominate, then ungate, in that order."""
    RENOMINATE = "renominate"
    """Ungated, unbound, and no longer nominated: the scheduler clears the nomination of
    a pod that fails to fit, which it may try once before its cache shows the placeholder
    gone. Nominate it again."""
    WAIT = "wait"
    """Nothing to do until the scheduler binds the owner."""


def handover_step(*, placeholder: bool, nominated: bool, gated: bool) -> Step:
    """What to do next for an unbound owner, given whether the placeholder still exists,
    whether the owner is nominated to the Reservation's node and whether it is gated.

    The order comes from kube-scheduler (v1.36) itself:

    - Pods other than Berth's never reach the extender (managedResources), so once the
      placeholder is gone nothing but the scheduler's own accounting keeps them off the
      node. It counts a pending pod's nominatedNodeName against pods of equal or lower
      priority (framework/runtime/framework.go, addGENominatedPods). So the owner is
      nominated before the placeholder goes.
    - The nominator takes a nomination written by someone else from the pod's update
      event, gated or not (backend/queue/scheduling_queue.go, PriorityQueue.Update, the
      unschedulablePods branch, UpdateNominatedPod); a gated pod seen first by a starting
      scheduler is not nominated until its next update (moveToActiveQ returns before
      nominator.addNominatedPod for a gated pod), and the ungating is that update.
    - The gate comes off only once the placeholder is gone: a nominated pod that fails to
      fit, with no preemption victims, loses its nomination (framework/preemption/
      preemption.go, Evaluator.Preempt, NewPostFilterResultWithNominatedNode("")), and one
      that fits after preempting could evict a pod of lower priority from the node that is
      only full because of its own placeholder.
    """
    if placeholder:
        return Step.FREE if nominated else Step.NOMINATE
    if gated:
        return Step.UNGATE if nominated else Step.NOMINATE_AND_UNGATE
    return Step.WAIT if nominated else Step.RENOMINATE


def nominate(pod: Mapping[str, Any], node: str | None) -> Patch:
    """Set (or, with None, clear) the pod's status.nominatedNodeName; of that very pod (its
    UID, which the API server refuses to change: a pod of the same name made since is
    another)."""
    metadata = pod["metadata"]
    return Patch(
        PODS,
        metadata["name"],
        {"metadata": {"uid": metadata["uid"]}, "status": {"nominatedNodeName": node}},
        namespace=metadata["namespace"],
        subresource="status",
    )


def nominated_node(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("nominatedNodeName") or None


def _handover(view: ReservationView, status: Object, plan: Plan) -> Plan:
    """Owner recorded: nominate it to the node, free the place, then let it be scheduled
    there (`handover_step`)."""
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
    if not bound and node is None:
        # Recorded while its place was lost (an earlier version recorded owners of a
        # Reservation without a node): nothing to hand over, the owner is let go.
        message = "the Reservation held no place when its owner was recorded"
        return plan.then(*_ended(view, status, Reason.LOST, message, event_type="Warning"))
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
    step = handover_step(
        placeholder=view.placeholder is not None,
        nominated=node is not None and nominated_node(owner) == node,
        gated=protocol.is_gated(owner),
    )
    released = Event(
        view.reservation,
        Reason.RESERVATION_HANDOVER,
        f"Released the place on {node} to pod {owner['metadata']['name']}",
    )
    if step in (Step.NOMINATE, Step.RENOMINATE):
        # The pod's update event brings this Reservation back once the cache shows it.
        return plan.then(nominate(owner, node)).again_in(HANDOVER_POLL)
    if step == Step.FREE:
        assert view.placeholder is not None
        return plan.then(delete_placeholder(view.placeholder)).again_in(HANDOVER_POLL)
    if step == Step.NOMINATE_AND_UNGATE:
        plan.then(nominate(owner, node), ungate(owner), released)
    elif step == Step.UNGATE:
        plan.then(ungate(owner), released)
    return plan.again_in(_seconds_until(view))


def _cleanup(view: ReservationView, plan: Plan, *, released: bool) -> Plan:
    if view.placeholder is not None:
        plan.then(delete_placeholder(view.placeholder))
    gated = [] if view.owner is None else [view.owner]
    gated += [pod for pod in view.claimers if pod is not view.owner]
    for pod in gated:
        if released and protocol.is_gated(pod):
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
    owner, node = view.owner, protocol.node_of(view.reservation)
    if (
        released
        and owner is not None
        and not owner["spec"].get("nodeName")
        and node is not None
        and nominated_node(owner) == node
    ):
        # The node is no longer kept for it: other pods need not yield to it there.
        plan.then(nominate(owner, None))
    return plan


def _seconds_until(view: ReservationView) -> float:
    """Until the Reservation expires (at most `LOOK_AGAIN`)."""
    left = (expires_at(view.reservation) - view.now).total_seconds()
    return min(max(0.5, left), LOOK_AGAIN)


STRAY_GRACE = timedelta(seconds=30)


def unschedulable_since(pod: Mapping[str, Any]) -> datetime | None:
    """Since when kube-scheduler has found no node for the pod (`PodScheduled=False`,
    `Unschedulable`); None when it has not said so."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return read_time(condition.get("lastTransitionTime")) or NEVER_SEEN
    return None


NEVER_SEEN = datetime.min.replace(tzinfo=UTC)
"""A condition without a readable time: as old as can be."""


def stray(pod: Object, *, holders: Sequence[Object], node_gone: bool, now: datetime) -> Plan:
    """Let go of a pod Berth gated or tied that no Reservation looks after.

    `holders` are the Reservations (in any phase) that carry the pod's claim token;
    `node_gone`, whether the node the pod's affinity ties it to (`protocol.tied_node`) was
    deleted.

    A pod gated with a token no live Reservation holds (its Reservation ended or vanished,
    the claim was lost, the annotation was forged) would otherwise never be scheduled: its
    gate is removed. A pod with a claim, tied to a deleted node, that no Reservation holds
    any more (deleted before its pass saw the node go, `ReservationView.stranded`) could
    never be scheduled either, gate or not: an affinity can only be narrowed, so it is
    deleted and its workload creates one that can run. Both after a grace period that
    covers the caches catching up with the webhook's claim and with a new node.

    A pod with a claim, ungated, tied to a node that is there but that the scheduler has
    refused it for `STRAY_GRACE`, once no live Reservation holds its claim (its job ended:
    a pod of higher priority took the place, the node was cordoned, a rollout's pod asked
    for what the place does not give), would wait for that one node for ever: it is
    deleted too, and its workload creates one without the tie.
    """
    token = protocol.pod_claim(pod)
    stranded = node_gone and token is not None and not holders
    live = any(
        protocol.phase(r) not in (ReservationPhase.SUCCEEDED, ReservationPhase.FAILED)
        for r in holders
    )
    refused = unschedulable_since(pod)
    pinned = (
        token is not None
        and not live
        and refused is not None
        and not protocol.is_gated(pod)
        and protocol.tied_node(pod) is not None
    )
    if not stranded and not pinned and (live or not protocol.is_gated(pod)):
        return Plan()
    if pod["metadata"].get("deletionTimestamp"):
        return Plan()
    created = parse_time(pod["metadata"]["creationTimestamp"])
    since = max(created, refused) if pinned and refused is not None else created
    if now - since < STRAY_GRACE:
        return Plan().again_in((since + STRAY_GRACE - now).total_seconds())
    shown = protocol.fingerprint(token) if token else "none"
    if pinned and not stranded:
        return Plan().then(
            *_delete_pod(
                pod,
                Reason.PINNED_POD_DELETED,
                f"its affinity ties it to node {protocol.tied_node(pod)}, where the scheduler "
                f"has found no room for it since {timestamp(since)}, and no live Reservation "
                f"holds its claim {shown} any more; its workload creates one that can be "
                "scheduled anywhere",
                as_read=True,
            )
        )
    if stranded:
        return Plan().then(
            *_delete_pod(
                pod,
                Reason.STRANDED_POD_DELETED,
                f"its affinity ties it to node {protocol.tied_node(pod)}, which was deleted, "
                f"and no Reservation holds its claim {shown} any more; its workload creates "
                "one that can be scheduled",
                as_read=True,
            )
        )
    return Plan().then(
        ungate(pod),
        Event(
            pod,
            Reason.RESERVATION_GATE_REMOVED,
            f"No Reservation holds claim {shown}: removed Berth's scheduling gate so the pod "
            "is scheduled normally",
            type="Warning",
        ),
    )
