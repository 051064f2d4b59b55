"""What a job's decision reads (`JobView`), and the plans every step of a job builds on."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from berth import protocol
from berth.api import PodMigrationJobMode, PodMigrationJobPhase, keys
from berth.kube.client import PODMIGRATIONJOBS
from berth.settings import EvictionPolicy, MigrationControllerArgs
from controller import build
from controller.actions import Action, Event, Evict, Plan, UpdateStatus
from controller.namespaces import LabelRefused

Object = dict[str, Any]

WAIT_POLL = 2.0
"""How often a job that waits for another object looks again, if no event comes first."""
EVICTION_RETRY = 5.0
"""How often a refused eviction is tried again."""
CONSUMABLE_SETTLE = timedelta(seconds=1)
"""How long a Reservation stays open before the eviction, so that the webhooks' caches
have seen it open when the replacement, created right after the eviction, claims it."""
REOPEN_AFTER = timedelta(seconds=EVICTION_RETRY) - CONSUMABLE_SETTLE
"""How long a Reservation closed after a refused eviction stays closed: reopened then, the
eviction is tried again `EVICTION_RETRY` after the refusal."""


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
    admission_key: bytes
    """The key admission marks are signed with (`controller.jobs.marker`)."""
    namespace_labelled: bool = False
    """The namespace where the replacement will be created carries berth.sh/migrating, as
    the controller's namespace watch shows it (`controller.namespaces`)."""
    label_refused: LabelRefused | None = None
    """While it does not: the API server's last refusal of that label there, for good
    (`Caches.label_refusals`; the namespace's passes ask again until it takes it)."""
    siblings: tuple[Object, ...] = ()
    """Pods of the migrated pod's controller, to spot a replacement that bypassed the
    Reservation (created while the webhook was unreachable)."""
    sharing: tuple[Object, ...] = ()
    """Other jobs not finished that name the same Reservation (a hand-made one, in
    reservationRef): one Reservation holds one place."""
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    """PriorityClass name → value, for a priorityThreshold given by name."""
    placeholder: Object | None = None
    """The Reservation's placeholder (`protocol.is_placeholder_of`), if it exists."""
    preempted: tuple[Object, ...] = ()
    """Pods the scheduler marked for preemption on the placeholder's node, live or lately
    deleted (`controller.jobs.preempt`)."""
    reserved_node_gone: bool = False
    """The Reservation's node is gone (deleted, `caches.Absences`): its place is not held,
    whatever its status still says."""
    reserved_node_unseen: bool = False
    """The Reservation's node is missing from the node cache but not counted as gone yet
    (added moments ago, or deleted while the controller was away): nothing is evicted on
    the strength of a place there until the cache knows which."""
    reserved_node_refuses: str | None = None
    """Why the Reservation's node takes no new pod like this one (or, once it is gone,
    like the replacement recorded as the Reservation's owner): cordoned, a taint it does
    not tolerate, labels its node selector or required node affinity excludes
    (`scheduling.node_refusal`; a pod Berth bound before is judged without the term tying
    it to its node, as its replacement). Before the eviction nothing is evicted while
    it says so, and the Reservation moves its placeholder (`reservations._place_lost`);
    after it, a replacement the scheduler keeps refusing there is let go."""
    reserved_node_spread: str | None = None
    """Before the eviction: why the pod's replacement could not go to the Reservation's
    node for one of the pod's `DoNotSchedule` topology spread constraints, once the pod
    has left (`scheduling.spread_refusal`: the placeholder, which carries none of the
    pod's labels, is placed without counting as one of them). Nothing is evicted while
    it says so."""
    workload: Object | None = None
    """The controller the Reservation was made for (its one owner by controller
    reference, a ReplicaSet or StatefulSet), as the caches hold it."""
    deployment: Object | None = None
    """That ReplicaSet's Deployment, when it has one and the cache holds it."""
    making_room: bool = False
    """Room is being made on the Reservation's node by a preemption (for the replacement,
    after the handover): a pod the scheduler marked there is terminating within its grace
    period, or left moments ago (`Caches.making_room_on`)."""
    workload_deleted: str | None = None
    """That controller, named, when it was deleted, and the Deployment above it too
    (the caches hold neither): no replacement will come."""
    exhausted_pdb: str | None = None
    """While the Reservation is closed after a refused eviction: a PodDisruptionBudget
    covering the (ready) pod that the cache shows allowing no disruption now
    (namespace/name), so that the next attempt would be refused as well."""
    volume_terms: tuple[tuple[Object, ...], ...] = ()
    """For each PersistentVolume bound to a claim the pod mounts (the cache's), the node
    selector terms its node affinity requires: a replacement that mounts the same claims
    can only run where each of them matches (`build.reservation_for`)."""


def job_name(view: JobView) -> str:
    return str(view.job["metadata"]["name"])


def place_held(view: JobView) -> bool:
    """Whether the Reservation's placeholder holds its place, as the caches show it
    (`protocol.placeholder_holds`, as the Reservation's own pass judges it). A
    placeholder preempted or deleted leaves the Reservation Available until that pass
    sees it (`reservations._place_lost`, which sends it back to Pending): an eviction in
    that moment would send the pod to a place nothing holds."""
    reservation = view.reservation
    return reservation is not None and protocol.placeholder_holds(reservation, view.placeholder)


def as_read(job: Mapping[str, Any]) -> Object:
    """The metadata that makes a patch of the job conditional on the version the decision
    read: the API server refuses it (409) if the job changed since (aborted, paused,
    edited), and the next pass decides on the job as it is. A patch without it always
    goes through, and a status write after it in the same plan builds on the patch's
    version: the change it skipped would be overwritten."""
    version = job["metadata"].get("resourceVersion")
    return {"resourceVersion": version} if version else {}


OVERDUE = timedelta(seconds=15)
"""How long past its deletion timestamp (the end of its grace period) a terminating pod
is taken to be kept, by a finalizer or a node that no longer answers (`bind.overdue`)."""


def pod_key(view: JobView) -> str:
    ref = view.job["spec"]["podRef"]
    return f"{ref.get('namespace')}/{ref.get('name')}"


def reservation_of(job: Mapping[str, Any]) -> str | None:
    """The name of the Reservation the job uses (`reservation_name`), or None: an
    EvictDirectly job evicts with none, whatever its reservationOptions name (it neither
    opens, closes, shares nor releases one)."""
    if job["spec"].get("mode") == PodMigrationJobMode.EVICT_DIRECTLY:
        return None
    return reservation_name(job)


def reservation_name(job: Mapping[str, Any]) -> str:
    """The Reservation a job uses: the one it names, else the one named after its UID."""
    options = job["spec"].get("reservationOptions") or {}
    ref = options.get("reservationRef") or {}
    return str(ref.get("name") or job["metadata"]["uid"])


def source_uid(job: Mapping[str, Any]) -> str | None:
    """The UID of the pod being migrated, recorded when the job started."""
    return (job["metadata"].get("annotations") or {}).get(keys.POD_UID)


def pod_gone(view: JobView) -> bool:
    """The migrated pod no longer exists: deleted, or replaced under the same name."""
    uid = source_uid(view.job)
    return view.pod is None or (uid is not None and view.pod["metadata"]["uid"] != uid)


def why_pod_gone(view: JobView) -> str:
    """What became of the migrated pod, for a job that ends before evicting it: deleted, or
    replaced by another pod of the same name (a StatefulSet's)."""
    if view.pod is None:
        return f"pod {pod_key(view)} no longer exists"
    return (
        f"pod {pod_key(view)} was replaced before it was evicted (uid {source_uid(view.job)}, "
        f"now {view.pod['metadata']['uid']}): the pod this job started for is gone"
    )


def write_status(view: JobView, status: Mapping[str, Any]) -> UpdateStatus:
    obj = copy.deepcopy(view.job)
    obj["status"] = dict(status)
    return UpdateStatus(PODMIGRATIONJOBS, obj)


def step(view: JobView, status: Object, *effects: Action) -> Plan:
    """A step's plan, in the order it runs: the job's status first, when it changed (so the
    job records what is about to happen before it happens), then the effects in order."""
    plan = Plan()
    if status != (view.job.get("status") or {}):
        plan.then(write_status(view, status))
    return plan.then(*effects)


def fail(view: JobView, status: Object, *, reason: str, message: str) -> Plan:
    """End the job as Failed: its status, then a Warning event saying why. The Reservation,
    if any, is released by the passes that follow (`controller.jobs.release`)."""
    ended = {
        **status,
        "phase": PodMigrationJobPhase.FAILED,
        "reason": reason,
        "message": message,
        "status": reason,
    }
    return Plan().then(write_status(view, ended), Event(view.job, reason, message, type="Warning"))


def delete_options(job_options: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> Object:
    """The job's deleteOptions, allow-listed: a grace period no shorter than the pod's own
    (more time for a graceful shutdown, never a forced kill the job's creator could not
    do themselves) and a propagation policy. Never dryRun (the job would think the pod
    gone) and never the job's preconditions: the pod's UID is always the precondition,
    so a new pod of the same name is never evicted in its place."""
    options = job_options or {}
    kept: Object = {}
    if options.get("propagationPolicy") is not None:
        kept["propagationPolicy"] = options["propagationPolicy"]
    grace = options.get("gracePeriodSeconds")
    if grace is not None:
        own = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        kept["gracePeriodSeconds"] = max(grace, own if own is not None else 30)
    kept["preconditions"] = {"uid": pod["metadata"]["uid"]}
    return kept


def own_reservation(job: Mapping[str, Any], reservation: Mapping[str, Any] | None) -> bool:
    """Whether `reservation` is the one the job made from its pod (named after the job's
    UID), rather than one made by hand that its `reservationRef` names."""
    return reservation is not None and reservation["metadata"].get("name") == job["metadata"].get(
        "uid"
    )


def used_on(view: JobView) -> str | None:
    """The node the Reservation's recorded owner is bound to, if it is: the Reservation
    was used, and its own pass records it so."""
    if view.reservation is None or view.owner is None:
        return None
    return (view.owner.get("spec") or {}).get("nodeName") or None


def released(view: JobView) -> str:
    """What the job's end does to its Reservation, as its message says it: the one it made
    is released (`controller.jobs.release`); one made by hand that its reservationRef
    names is its maker's, and stays as they wrote it; one whose recorded owner is bound was
    used, and is recorded so (`controller.jobs.release`)."""
    bound = used_on(view)
    if bound:
        name = (view.owner or {}).get("metadata", {}).get("name")
        return f"the reservation was used: its replacement {name} is bound to {bound}"
    if view.reservation is None or own_reservation(view.job, view.reservation):
        return "the reservation is released"
    name = view.reservation["metadata"]["name"]
    return (
        f"Reservation {name!r}, made by hand, is not the job's to release: it stays until "
        "its own ttl or its deletion"
    )


def eviction_policy(view: JobView) -> EvictionPolicy:
    """The configured evictionPolicy; the Eviction API always for a job made from an
    eviction the webhook intercepted (`protocol.made_from_eviction`): its requester asked
    for an eviction that honours the pod's PodDisruptionBudgets, whatever the policy
    became after the job was made (the webhook makes none under another)."""
    if protocol.made_from_eviction(view.job):
        return EvictionPolicy.EVICTION
    return view.args.eviction_policy


def evict(view: JobView) -> Evict:
    """Evict the migrated pod, by `eviction_policy` and the job's delete options."""
    assert view.pod is not None
    pod = view.pod["metadata"]
    options = delete_options(
        view.job["spec"].get("deleteOptions") or view.args.default_delete_options, view.pod
    )
    reserved = (
        view.reservation
        if view.job["spec"].get("mode") != PodMigrationJobMode.EVICT_DIRECTLY
        else None
    )
    return Evict(
        pod["namespace"],
        pod["name"],
        pod["uid"],
        policy=eviction_policy(view),
        delete_options=options,
        reserved_node=protocol.node_of(reserved) if reserved is not None else None,
        placement=build.replacement_placement(
            view.pod, where=reserved is not None and own_reservation(view.job, reserved)
        ),
        job=job_name(view),
    )
