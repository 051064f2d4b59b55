"""ReservationFirst, after the eviction: wait for the replacement to bind the Reservation
and become Ready.

From here a TTL never strands anything: the job fails, and the passes that follow release
the Reservation and let any gated pod go (`controller.jobs.release`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from berth import protocol
from berth.api import (
    PodMigrationJobConditionType,
    PodMigrationJobPhase,
    PodMigrationJobReason,
    ReservationConditionType,
    ReservationPhase,
    ReservationReason,
)
from berth.api.times import read_time
from berth.eviction import soft_evicted
from controller.actions import Event, Plan
from controller.arbitration.workloads import rollout_of
from controller.jobs.consumable import (
    closing,
    ended_before_eviction,
    opened_before_placed,
    opening,
    settling,
)
from controller.jobs.evict import evicted, still_evicting
from controller.jobs.view import (
    CONSUMABLE_SETTLE,
    EVICTION_RETRY,
    OVERDUE,
    REOPEN_AFTER,
    WAIT_POLL,
    JobView,
    Object,
    fail,
    own_reservation,
    place_held,
    pod_gone,
    pod_key,
    released,
    reservation_name,
    source_uid,
    step,
)
from controller.reservations import NEVER_SEEN, STRAY_GRACE, unschedulable_since
from controller.status import (
    condition,
    reference,
    same_condition,
    scheduling_message,
    timestamp,
    with_condition,
)

Type = PodMigrationJobConditionType
Reason = PodMigrationJobReason


def _not_open_elsewhere(view: JobView) -> tuple[Reason, str] | None:
    """Why the pod may not be evicted (again) now, if so: its Reservation must be
    Available and opened on another node. The Eviction condition is status, which a user
    may write; the Reservation is Berth's record that the place is really held."""
    reservation = view.reservation
    pod_node = (view.pod or {}).get("spec", {}).get("nodeName")
    if (
        reservation is not None
        and (protocol.is_open(reservation) or protocol.is_closed(reservation))
        and protocol.node_of(reservation) != pod_node
    ):
        return None
    if reservation is not None and protocol.phase(reservation) in (
        ReservationPhase.SUCCEEDED,
        ReservationPhase.FAILED,
    ):
        return Reason.RESERVATION_EXPIRED, (
            f"{ended_before_eviction(reservation)}: the Reservation ended while the pod was "
            "still to be evicted; nothing more is evicted"
        )
    if reservation is None:
        return Reason.MISSING_RESERVATION, (
            f"Reservation {reservation_name(view.job)!r} does not exist (deleted while the "
            "pod was still to be evicted, or never made by Berth); nothing is evicted"
        )
    return Reason.NOT_ADMITTED, (
        "the job records an eviction, but its Reservation is not open on another node: "
        "that status was not written by Berth; nothing is evicted"
    )


def _place_lost(view: JobView) -> str | None:
    """Why the pod is not to be evicted again yet, if its Reservation was opened for it and
    has since lost its place (its node was deleted: `reservations._place_lost`) while the
    pod was still there: the Reservation waits for a new placeholder to be bound. The open
    mark is Berth's word that the eviction was Berth's (Reservations are written only by
    Berth), so this is no forged Eviction condition."""
    reservation = view.reservation
    if reservation is None or protocol.phase(reservation) != ReservationPhase.PENDING:
        return None
    if not protocol.was_opened(reservation):
        return None
    scheduled = condition(reservation.get("status") or {}, ReservationConditionType.SCHEDULED)
    return (scheduled or {}).get("message") or "its placeholder is not bound to a node"


def _wait_for_place(view: JobView, status: Object, why: str) -> Plan:
    """Evict nothing until the Reservation holds a place again (then the eviction goes on
    to the new node), or the TTL ends the job with nothing evicted. Said once."""
    message = (
        f"Reservation {reservation_name(view.job)!r} lost its place ({why}); nothing is "
        "evicted until a new placeholder holds one"
    )
    said = {"kind": Type.EVICTION, "state": "False", "reason": Reason.EVICTING, "message": message}
    if not same_condition(status, **said):
        status = with_condition(status, **said, now=view.now)
    return step(view, status).again_in(WAIT_POLL)


def _pod_still_there(view: JobView, status: Object, *, expired: bool) -> Plan:
    """The pod is not gone yet: wait for it, evict it again, or see why not."""
    terminating = (view.pod or {}).get("metadata", {}).get("deletionTimestamp")
    closed = view.reservation is not None and protocol.is_closed(view.reservation)
    if terminating and closed:
        # Leaving while its eviction was held back (deleted by someone else): its
        # replacement may come any moment, so the place is opened to it at once.
        return Plan().then(opening(view)).again_in(WAIT_POLL)
    if not terminating and not expired:
        # Past the TTL nothing is evicted again, and the TTL is what ended the job (its
        # Reservation, with the same TTL, may have been seen to end first).
        lost = _place_lost(view)
        if lost is not None:
            return _wait_for_place(view, status, lost)
        unopened = _not_open_elsewhere(view)
        if unopened is not None:
            return fail(view, status, reason=unopened[0], message=unopened[1])
        if _held_back(view):
            # Paused meanwhile: an open place is closed again (see `reserve`), else a
            # scale-up's pod would take the place of a pod that stays. Not a pod annotated
            # for soft eviction: whatever acts on it may remove the pod any moment.
            paused = view.job["spec"].get("paused") and not soft_evicted(view.pod or {})
            close = closing(view) if paused else None
            return Plan().then(*([close] if close else [])).again_in(WAIT_POLL)
        if closed:
            return _reopen_when_due(view, status)
        waiting = _before_another_attempt(view)
        if waiting is not None:
            return waiting
    return still_evicting(view, status, expired=expired)


def _before_another_attempt(view: JobView) -> Plan | None:
    """What an eviction to be sent again waits for, as before the first attempt
    (`reserve`): a place a pod made meanwhile took, or its placeholder no longer holds
    (`place_held`); a place that moved while the eviction
    was held back (opened again, so that the webhooks' caches get the settle time to see
    it there); the settle time. None to send it."""
    reservation = view.reservation
    if reservation is None:
        return None
    if protocol.is_taken(reservation) or not place_held(view):
        return Plan().again_in(WAIT_POLL)
    if opened_before_placed(reservation):
        return Plan().then(opening(view)).again_in(CONSUMABLE_SETTLE.total_seconds())
    left = settling(view)
    return Plan().again_in(left) if left is not None else None


def _held_back(view: JobView) -> bool:
    """Whether the eviction is not to be tried again now, as it would not be tried the
    first time: the job is paused, or the Reservation's node is gone, not seen yet or
    takes no replacement (the Reservation goes back to Pending, or the node comes into the
    cache, within moments). Nothing is reopened meanwhile."""
    return bool(
        view.job["spec"].get("paused")
        or view.reserved_node_gone
        or view.reserved_node_unseen
        or view.reserved_node_refuses is not None
    )


def _reopen_when_due(view: JobView, status: Object) -> Plan:
    """The Reservation was closed after a refused eviction: open it again `REOPEN_AFTER`
    the refusal, so that the eviction, tried once the webhooks have seen it open as the
    first time, comes `EVICTION_RETRY` after the refusal; not while a PDB that refused it
    still allows no disruption (that attempt would be refused too)."""
    assert view.reservation is not None
    refusal = (condition(status, Type.EVICTION) or {}).get("reason")
    if refusal == Reason.BLOCKED_BY_PDB and view.exhausted_pdb is not None:
        return Plan().again_in(EVICTION_RETRY)
    closed = protocol.closed_at(view.reservation)
    if closed is not None and view.now < closed + REOPEN_AFTER:
        return Plan().again_in((closed + REOPEN_AFTER - view.now).total_seconds())
    return Plan().then(opening(view)).again_in(CONSUMABLE_SETTLE.total_seconds())


def after_eviction(view: JobView, status: Object, *, expired: bool) -> Plan:
    """Evicting: see the pod gone, then follow the replacement until it is bound and Ready.

    A pod left terminating past its grace period (`overdue`) counts as gone: what ends
    the job then is what the replacement and the Reservation say, as for a pod gone.

    A job that ends in this pass reports only its end (its status, then its event)."""
    terminating: str | None = None
    if not pod_gone(view):
        terminating = overdue(view, expired=expired)
        if terminating is None:
            return _pod_still_there(view, status, expired=expired)
    status, news = evicted(view, status, terminating_since=terminating)
    reservation = view.reservation
    if reservation is not None and protocol.is_closed(reservation):
        # The pod left while its eviction waited to be tried again (deleted by someone
        # else): its replacement may come now, so the place is opened to it at once.
        return step(view, status, *news, opening(view)).again_in(WAIT_POLL)
    rsv = reservation["metadata"]["name"] if reservation else reservation_name(view.job)
    owner = view.owner
    if owner is not None and owner["spec"].get("nodeName"):
        status = _bound(view, status, owner)
        if protocol.is_ready(owner):
            return _complete(view, status, owner, rsv=rsv, news=news)
        kind, reason = Type.BOUND_POD_READY, Reason.WAIT_FOR_BOUND_POD_READY
        waiting = f"waiting for pod {owner['metadata']['name']} to be ready"
    elif (ended := _none_to_bind(view, status, owner, rsv=rsv)) is not None:
        return ended
    else:
        kind, reason = Type.POD_BOUND_RESERVATION, Reason.WAIT_FOR_POD_BIND_RESERVATION
        waiting = _waiting_to_bind(view, owner, rsv=rsv)
    if expired:
        return _timed_out(view, status, waiting=waiting, terminating=terminating)
    if not same_condition(status, kind=kind, state="False", reason=reason, message=waiting):
        status = with_condition(
            status, kind=kind, state="False", reason=reason, message=waiting, now=view.now
        )
        status["status"] = reason
    return step(view, status, *news).again_in(WAIT_POLL)


def _none_to_bind(view: JobView, status: Object, owner: Object | None, *, rsv: str) -> Plan | None:
    """The job's end when no replacement is bound and none will be: the Reservation's node
    was deleted, no replacement will bind the Reservation (`_not_to_be_bound`), or the
    one handed over is kept off the node (`_kept_off`). None while one may be."""
    if view.reserved_node_gone:
        return _node_lost(view, status, owner, rsv=rsv)
    unused = _not_to_be_bound(view, status, rsv=rsv)
    if unused is not None:
        return unused
    kept_off = _kept_off(view, owner, rsv=rsv) if owner is not None else None
    if kept_off is not None:
        # The job's own Reservation is released, and the replacement, tied to that node
        # by its affinity, then deleted as a pod no live Reservation holds
        # (`reservations.stray`); one made by hand stays, and holds the replacement.
        return fail(view, status, reason=Reason.RESERVATION_LOST, message=kept_off)
    return None


def _timed_out(view: JobView, status: Object, *, waiting: str, terminating: str | None) -> Plan:
    """The job's end at its TTL after the eviction, saying what it waited for."""
    still = (
        ""
        if terminating is None
        else f" (pod {pod_key(view)} was still terminating, due to be gone at {terminating})"
    )
    return fail(
        view,
        status,
        reason=Reason.TIMEOUT,
        message=f"TTL expired after the pod was evicted{still}, {waiting}; {released(view)}"
        + (" and any gated pod let go" if own_reservation(view.job, view.reservation) else ""),
    )


def overdue(view: JobView, *, expired: bool) -> str | None:
    """The deletion timestamp of the evicted pod when it is to count as gone although it
    is still terminating: `OVERDUE` past it (a finalizer, or a node that no longer
    answers: the very pods a drain of a failing node moves), or within its grace period
    once the TTL has expired. Its replacement (a ReplicaSet's comes at once) may have
    taken the place meanwhile, and the job must end on what that replacement and the
    Reservation say rather than hold its migration slots until its TTL, or for ever
    without one. None to wait for the pod as any pod's shutdown is waited for: not
    deleted, within its grace period, or the Reservation's owner being the pod itself."""
    assert view.pod is not None
    deleted = view.pod["metadata"].get("deletionTimestamp")
    due = read_time(deleted)
    if due is None or (view.now < due + OVERDUE and not expired):
        return None
    owner = view.owner
    if owner is not None and owner["metadata"].get("uid") == view.pod["metadata"].get("uid"):
        return None
    return str(deleted)


def _node_lost(view: JobView, status: Object, owner: Object | None, *, rsv: str) -> Plan:
    """The Reservation's node was deleted after the eviction and its replacement is not
    bound there: the place is gone. The replacement, tied to that node by its affinity,
    is deleted by the Reservation's own pass (`reservations.ReservationView.stranded`), so
    that its workload creates one scheduled anywhere; the job ends saying so."""
    node = protocol.node_of(view.reservation) if view.reservation else None
    message = (
        f"node {node}, where Reservation {rsv!r} held the place, was deleted after the pod "
        f"was evicted; {released(view)}"
    )
    if owner is not None:
        message += (
            f", and replacement pod {owner['metadata']['name']}, tied to {node}, is deleted "
            "so that its workload creates one that can run elsewhere"
        )
    return fail(view, status, reason=Reason.RESERVATION_LOST, message=message)


def _waiting_to_bind(view: JobView, owner: Object | None, *, rsv: str) -> str:
    """What the job waits for while no replacement is bound to its Reservation's node."""
    node = protocol.node_of(view.reservation) if view.reservation else None
    refused = _refused(owner) if owner is not None else None
    if owner is None or not refused:
        return f"waiting for a replacement pod to bind Reservation {rsv!r} on {node}"
    # Handed over, yet the scheduler does not place it: e.g. a pod of higher priority
    # took the place once the placeholder was gone (README, "Scope").
    return (
        f"replacement pod {owner['metadata']['name']} does not fit on {node}, "
        f"where Reservation {rsv!r} held its place: {refused}"
    )


NO_FIT_GRACE = timedelta(minutes=2)
"""How long the scheduler may refuse a replacement, handed over, on its Reservation's node
for a reason other than the node's own (in the default scope a pod of higher priority
that took the place; a volume's zone; a spread constraint) before it is let go: longer
than the victims of a preemption for it take to leave."""


def _kept_off(view: JobView, owner: Object, *, rsv: str) -> str | None:
    """Why the replacement, handed over, will not be bound where its place was held, once
    the scheduler has refused it there long enough: `STRAY_GRACE` when the node was
    cordoned, or tainted or relabelled against it (a cordon of moments, a node's
    readiness flapping, does not end the job); `NO_FIT_GRACE` for any other reason.
    None while it may still be bound there.

    Counted from its PodScheduled condition's transition, which the scheduler's refusals
    keep from the gated pod's creation (False either way): a handover takes moments, so
    about since it was handed the place."""
    refused = _refused(owner)
    since = unschedulable_since(owner) if refused else None
    if since is None or since == NEVER_SEEN or view.making_room:
        # A refusal of no readable time is not counted; nor one while pods on that node
        # leave, preempted for it.
        return None
    waited = view.now - since
    name = owner["metadata"]["name"]
    tail = (
        f"replacement pod {name}, tied to that node, is deleted so that its workload creates "
        "one that can run elsewhere"
        if own_reservation(view.job, view.reservation)
        else f"{released(view)}, and replacement pod {name} stays tied to that node while it does"
    )
    if view.reserved_node_refuses is not None and waited >= STRAY_GRACE:
        return (
            f"{view.reserved_node_refuses} after the pod was evicted, where Reservation "
            f"{rsv!r} held the place; {tail}"
        )
    if waited >= NO_FIT_GRACE:
        node = protocol.node_of(view.reservation) if view.reservation else None
        return (
            f"the scheduler has refused the replacement on {node}, where Reservation {rsv!r} "
            f"held the place, for {int(waited.total_seconds())}s ({refused}); {tail}"
        )
    return None


def _not_to_be_bound(view: JobView, status: Object, *, rsv: str) -> Plan | None:
    """The job's end when no replacement will bind its Reservation any more: the
    Reservation was deleted (no place is held; the caches saw it before the eviction, which
    needs it open), the one that took it was deleted unbound, one was created without
    claiming it, or, none having claimed it, the workload was scaled so as to make none."""
    reservation = view.reservation
    if reservation is None:
        return fail(
            view,
            status,
            reason=Reason.MISSING_RESERVATION,
            message=f"Reservation {rsv!r} was deleted after the pod was evicted; no place is "
            "held any more, and the workload's next pod is scheduled as any pod",
        )
    gone = _owner_deleted(reservation)
    if gone is not None:
        return fail(
            view,
            status,
            reason=Reason.RESERVATION_OWNER_GONE,
            message=f"replacement pod {gone} took Reservation {rsv!r} but was deleted "
            "before it was bound; the place is released, and the workload's next pod is "
            "scheduled as any pod",
        )
    ended = _ended_after_eviction(reservation, rsv=rsv)
    if ended is not None:
        return fail(view, status, reason=ended[0], message=ended[1])
    if protocol.claim_of(reservation) is not None:
        # A replacement is on its way (a claim no pod takes is released after CLAIM_BOUND).
        return None
    bypass = _unbound_replacement(view, status)
    if bypass is not None:
        too_small = protocol.asks_more(bypass, reservation)
        return fail(
            view,
            status,
            reason=Reason.RESERVATION_NOT_USED,
            message=f"replacement pod {bypass['metadata']['name']} was created "
            f"without claiming Reservation {rsv!r} "
            f"({f'it {too_small}' if too_small else 'is the webhook running?'}); it is "
            f"scheduled as any pod, and {released(view)}",
        )
    if view.workload_deleted is not None:
        return fail(
            view,
            status,
            reason=Reason.WORKLOAD_SCALED_DOWN,
            message=f"{view.workload_deleted} was deleted, so no replacement will take "
            f"Reservation {rsv!r}; {released(view)}",
        )
    scaled = (
        scaled_away(view.job["spec"]["podRef"].get("name") or "", view.workload, view.deployment)
        or _scaled_down(view, status)
        or _rolled_past(view)
    )
    if scaled is not None:
        return fail(
            view,
            status,
            reason=Reason.WORKLOAD_SCALED_DOWN,
            message=f"{scaled}, so no replacement will take Reservation {rsv!r}; {released(view)}",
        )
    return None


def scaled_away(pod: str, workload: Object | None, deployment: Object | None) -> str | None:
    """Why the workload of the migrated pod `pod` (by name) makes no replacement for it, as
    its objects say: a ReplicaSet scaled to zero, or the Deployment above it; a
    StatefulSet whose ordinals no longer include the pod's. None when one may come, or
    when the workload is not known (not cached, or a Deployment's ReplicaSet whose
    Deployment is not)."""
    kind = (workload or {}).get("kind")
    if workload is None or kind not in ("ReplicaSet", "StatefulSet"):
        return None
    if kind == "StatefulSet":
        return _below_ordinals(pod, workload)
    parent = protocol.controller_of(workload)
    if parent is None or parent.get("kind") != "Deployment":
        return _scaled_to_zero(workload)
    above = _deployment_of(workload, deployment)
    return None if above is None else _scaled_to_zero(above)


def _deployment_of(replicaset: Object, deployment: Object | None) -> Object | None:
    """`deployment` when it is the Deployment that `replicaset`'s controller reference
    names (by UID); None otherwise."""
    parent = protocol.controller_of(replicaset)
    if parent is None or parent.get("kind") != "Deployment" or deployment is None:
        return None
    return deployment if deployment["metadata"].get("uid") == parent.get("uid") else None


REVISION = "deployment.kubernetes.io/revision"
"""The Deployment's revision, which its controller copies to its newest ReplicaSet."""


def _scaled_down(view: JobView, status: Mapping[str, Any]) -> str | None:
    """Why a ReplicaSet scaled down, not to zero, makes no replacement for the pod gone: it
    runs as many pods as it wants (and its Deployment, when it is the Deployment's newest)
    without one, each made before the place was open to it (`_open_since`), so none is a
    replacement that may yet claim it. None during a rollout (the Reservation's ReplicaSet
    not the newest), when the new ReplicaSet's pods may yet take the place."""
    workload = view.workload
    started = _open_since(view, status)
    if workload is None or workload.get("kind") != "ReplicaSet" or not started:
        return None
    wanted = [(workload.get("spec") or {}).get("replicas", 1)]
    if protocol.controller_of(workload) is not None:
        deployment = _deployment_of(workload, view.deployment)
        if (
            deployment is None
            or _revision(deployment) is None
            or _revision(deployment) != _revision(workload)
        ):
            return None
        wanted.append((deployment.get("spec") or {}).get("replicas", 1))
    if not all(isinstance(replicas, int) for replicas in wanted):
        return None
    running = [pod for pod in view.siblings if _kept(pod, view.job, started)]
    if len(running) < max(wanted):
        return None
    return (
        f"ReplicaSet {workload['metadata']['name']} is scaled to {wanted[0]} replicas and "
        f"runs {len(running)} pods created before Reservation {reservation_name(view.job)!r} "
        "was open to them"
    )


def _rolled_past(view: JobView) -> str | None:
    """Why a ReplicaSet that a finished rollout left behind makes no replacement for the
    pod gone: scaled to zero, it is not its Deployment's newest, and the Deployment has
    rolled out every replica (`rollout_of`), so no ReplicaSet of it makes a pod now. None
    while the rollout goes on, when the new ReplicaSet's pods may yet take the place."""
    workload = view.workload
    if workload is None or workload.get("kind") != "ReplicaSet":
        return None
    deployment = _deployment_of(workload, view.deployment)
    if deployment is None or (workload.get("spec") or {}).get("replicas", 1) != 0:
        return None
    newest = _revision(deployment)
    if newest is None or newest == _revision(workload) or rollout_of(deployment) is not None:
        return None
    return (
        f"Deployment {deployment['metadata']['name']} has rolled out revision {newest} on "
        f"all its replicas, and ReplicaSet {workload['metadata']['name']} is scaled to zero"
    )


def _revision(workload: Object) -> str | None:
    return (workload["metadata"].get("annotations") or {}).get(REVISION)


def _kept(pod: Object, job: Object, started: str) -> bool:
    """A pod of the workload that counts towards its replicas and was made before the
    place was open to it (`started`, whole seconds): not the migrated pod, not
    terminating or finished."""
    metadata = pod["metadata"]
    return not (
        metadata.get("uid") == source_uid(job)
        or metadata.get("deletionTimestamp")
        or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        or protocol.placeholder_reservation(pod)
        or metadata.get("creationTimestamp", "") > started
    )


def _scaled_to_zero(workload: Object) -> str | None:
    if (workload.get("spec") or {}).get("replicas", 1) != 0:
        return None
    name = workload["metadata"]["name"]
    return f"{workload.get('kind')} {name} is scaled to zero"


def _below_ordinals(pod: str, statefulset: Object) -> str | None:
    """Why StatefulSet `statefulset` does not make `pod` again: its ordinals (from
    `spec.ordinals.start`, `spec.replicas` of them) no longer include the pod's."""
    name, spec = statefulset["metadata"]["name"], statefulset.get("spec") or {}
    ordinal = pod.removeprefix(f"{name}-")
    replicas = spec.get("replicas", 1)
    start = (spec.get("ordinals") or {}).get("start") or 0
    if ordinal == pod or not ordinal.isdigit() or not isinstance(replicas, int):
        return None
    if not isinstance(start, int) or start <= int(ordinal) < start + replicas:
        return None
    return f"StatefulSet {name} is scaled to {replicas} replicas and does not make {pod} again"


def _ended_after_eviction(reservation: Object, *, rsv: str) -> tuple[str, str] | None:
    """The job's reason and message when its Reservation ended after the eviction with
    no replacement the caches hold bound there (`after_eviction` looks at a bound one
    first): the replacement it was used by, deleted since before it was ready
    (Succeeded), or the Reservation expired or failed otherwise; None while it lives.
    Nothing will bind it any more, whatever claim it still carries."""
    phase = protocol.phase(reservation)
    if phase == ReservationPhase.SUCCEEDED:
        owners = (reservation.get("status") or {}).get("currentOwners") or [{}]
        return Reason.RESERVATION_OWNER_GONE, (
            f"replacement pod {owners[0].get('name') or '?'} was bound to "
            f"{protocol.node_of(reservation)} through Reservation {rsv!r} but was deleted "
            "before it was ready; the workload's next pod is scheduled as any pod"
        )
    if phase == ReservationPhase.FAILED:
        ready = condition(reservation.get("status") or {}, ReservationConditionType.READY) or {}
        why = f" ({ready['message']})" if ready.get("message") else ""
        return Reason.RESERVATION_EXPIRED, (
            f"Reservation {rsv!r} ended after the pod was evicted{why}, before a replacement "
            "was bound there; no place is held any more, and the workload's next pod is "
            "scheduled as any pod"
        )
    return None


def _owner_deleted(reservation: Object) -> str | None:
    """The name of the owner whose deletion before its binding failed the Reservation
    (`controller.reservations`), if that is how it ended: nothing holds the place now, and
    no other pod can claim it."""
    if protocol.phase(reservation) != ReservationPhase.FAILED:
        return None
    ready = condition(reservation.get("status") or {}, ReservationConditionType.READY) or {}
    if ready.get("reason") != ReservationReason.OWNER_GONE:
        return None
    owners = reservation.get("status", {}).get("currentOwners") or [{}]
    return str(owners[0].get("name") or "?")


def _refused(owner: Object) -> str | None:
    """The scheduler's reason for not placing an ungated owner, once it has tried (the
    PodScheduled condition a gated pod carries says only that it is gated)."""
    if protocol.is_gated(owner):
        return None
    scheduled = condition(owner.get("status") or {}, "PodScheduled") or {}
    if scheduled.get("status") != "False" or scheduled.get("reason") != "Unschedulable":
        return None
    return scheduling_message(owner) or None


def _bound(view: JobView, status: Object, owner: Object) -> Object:
    """The status that records the replacement bound to the Reservation's node."""
    name = owner["metadata"]["name"]
    node = protocol.node_of(view.reservation) if view.reservation else None
    status = {**status, "podRef": reference(owner)}
    bound = {
        "kind": Type.POD_BOUND_RESERVATION,
        "state": "True",
        "reason": Reason.BOUND,
        "message": f"pod {name} on {node}",
    }
    if same_condition(status, **bound):
        return status
    return with_condition(status, **bound, now=view.now)


def _complete(
    view: JobView, status: Object, owner: Object, *, rsv: str, news: tuple[Event, ...]
) -> Plan:
    """The replacement is bound and Ready: the job Succeed."""
    metadata = owner["metadata"]
    status = with_condition(
        status,
        kind=Type.BOUND_POD_READY,
        state="True",
        reason=Reason.READY,
        message=f"pod {metadata['name']} is ready",
        now=view.now,
    )
    status.update(
        phase=PodMigrationJobPhase.SUCCEED,
        status=Reason.COMPLETE,
        reason="",
        message="",
        nodeName=owner["spec"]["nodeName"],
    )
    done = Event(
        view.job,
        Reason.COMPLETE,
        f'Bind Pod "{metadata["namespace"]}/{metadata["name"]}" in Reservation "{rsv}"',
    )
    return step(view, status, *news, done)


def _unbound_replacement(view: JobView, status: Mapping[str, Any]) -> Object | None:
    """A pod of the same controller, created since the place was open to it
    (`_open_since`), that carries no claim: the workload replaced the pod without going
    through the webhook."""
    started = _open_since(view, status)
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


def _open_since(view: JobView, status: Mapping[str, Any]) -> str | None:
    """Since when (RFC 3339, whole seconds) the job's Reservation has been open to a
    replacement: its last opening (`berth.sh/opened-at`, to the second), or its creation
    when it shows no opening time. A pod of the workload made in an earlier second
    could not claim it (a scale-up while a PDB refused the eviction and the place was
    closed): it bypassed nothing, and counts with the pods the workload kept. One made
    in that very second counts so too: a replacement of the pod that someone else
    deleted while the place was closed, which reached the webhook as the controller
    reopened it. The evicted pod's own replacement comes later: the eviction waits
    `CONSUMABLE_SETTLE` after the opening."""
    reserved = _reserved_at(status)
    opened = protocol.opened_at(view.reservation) if view.reservation else None
    if not reserved or opened is None:
        return reserved
    return max(reserved, timestamp(opened))


def _reserved_at(status: Mapping[str, Any]) -> str | None:
    """When the job created its Reservation (RFC 3339, whole seconds), as its status says.
    Every replacement was created after it: the eviction waits for the place, and the
    settle time after opening it."""
    reserved = (
        condition(status, Type.RESERVATION_CREATED)
        or condition(status, Type.RESERVATION_SCHEDULED)
        or {}
    )
    return reserved.get("lastTransitionTime") or None
