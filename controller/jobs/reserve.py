"""ReservationFirst, before the eviction: reserve, wait for the place, open it, evict.

Nothing is evicted unless the Reservation is Available on another node; a job that ends
here (TTL, missing pod or Reservation) has evicted nothing.
"""

from __future__ import annotations

from berth import protocol
from berth.api import (
    PodMigrationJobConditionType,
    PodMigrationJobReason,
    ReservationConditionType,
    ReservationPhase,
    keys,
)
from berth.kube.client import PODMIGRATIONJOBS, RESERVATIONS
from controller import template
from controller.actions import Create, Event, Patch, Plan
from controller.build import asks_for_preemption, reservation_for
from controller.jobs import preempt
from controller.jobs.consumable import (
    closing,
    ended_before_eviction,
    opened_before_placed,
    opening,
    settling,
)
from controller.jobs.evict import start_eviction
from controller.jobs.view import (
    CONSUMABLE_SETTLE,
    WAIT_POLL,
    JobView,
    Object,
    as_read,
    fail,
    job_name,
    own_reservation,
    place_held,
    pod_gone,
    released,
    reservation_name,
    step,
    why_pod_gone,
    write_status,
)
from controller.status import (
    UNREADABLE,
    condition,
    job_deadline,
    same_condition,
    unreadable,
    with_condition,
)

Type = PodMigrationJobConditionType
Reason = PodMigrationJobReason


def preemption_refused(reservation: str) -> str:
    return (
        "reservationOptions.preemptionOptions applies to the Reservation a job creates; "
        f"Reservation {reservation!r} named in reservationRef is used as it is, and its "
        "placeholder never preempts; remove preemptionOptions or reservationRef; nothing "
        "was evicted"
    )


def before_eviction(view: JobView, status: Object, *, expired: bool) -> Plan:
    """Reserve, wait for the place, then open it and evict."""
    ended = _cannot_go_on(view, status, expired=expired)
    if ended is not None:
        return ended
    assert view.pod is not None
    reservation = view.reservation
    made = _make_or_record(view, status)
    if made is not None:
        return made
    assert reservation is not None
    unusable = _unusable(view, status, reservation)
    if unusable is not None:
        return unusable
    name, phase = reservation["metadata"]["name"], protocol.phase(reservation)
    node = protocol.node_of(reservation)
    if phase != ReservationPhase.AVAILABLE or node is None or view.reserved_node_gone:
        return _wait_for_place(view, status, reservation)
    waiting = _node_not_ready(view, status, reservation)
    if waiting is not None:
        return waiting
    if node == view.pod["spec"].get("nodeName"):
        return fail(
            view,
            status,
            reason=Reason.UNSCHEDULABLE,
            message=f"Reservation {name!r} holds its place on {node}, the node "
            "the pod already runs on; nothing was evicted",
        )
    status, news = _scheduled(view, status, name=name, node=node)
    status, preempted = preempt.record(view, status, placed=True)
    news = (*news, *preempted)
    if view.job["spec"].get("paused"):
        # Paused after it was opened: closed again, or a pod the workload makes meanwhile
        # (a scale-up) takes the place of a pod that stays. Opened again on resuming.
        close = closing(view)
        return step(view, status, *news, *([close] if close else [])).again_in(WAIT_POLL)
    return _open_then_evict(view, status, news)


def _node_not_ready(view: JobView, status: Object, reservation: Object) -> Plan | None:
    """The wait while the Reservation's node is not in the cache yet, or takes no
    replacement; None if neither."""
    if view.reserved_node_unseen:
        # The node comes into the cache, or counts as gone, within moments: wait quietly.
        return step(view, status).again_in(WAIT_POLL)
    if view.reserved_node_refuses is not None:
        # The replacement could not be scheduled there: the job's own Reservation, made
        # from the pod, places its placeholder again (`reservations._place_lost`), and
        # nothing is evicted until then. One named in reservationRef is placed by its own
        # template, which may take that node still.
        name = reservation["metadata"]["name"]
        moves = (
            "its placeholder, refused there too, is placed again"
            if own_reservation(view.job, reservation)
            else "the Reservation, named in reservationRef, moves only if its own template "
            "is refused there too"
        )
        return _wait_for_place(
            view,
            status,
            reservation,
            message=f"Reservation {name!r}: {view.reserved_node_refuses}; nothing is "
            f"evicted while it does ({moves})",
        )
    if view.reserved_node_spread is not None:
        # The scheduler placed the placeholder as none of the pod's kind: there the
        # replacement, pinned, would break its spread (`nodeAffinityPolicy: Ignore`, or
        # `minDomains`) and wait for a place it cannot take. Nothing is evicted while the
        # spread says so, and the place is closed (pods of the workload coming and going
        # may change it).
        name = reservation["metadata"]["name"]
        waiting = _wait_for_place(
            view,
            status,
            reservation,
            message=f"Reservation {name!r}: {view.reserved_node_spread}; nothing is evicted "
            "while it would (the job ends at its TTL if it stays so)",
        )
        close = closing(view)
        return waiting.then(close) if close is not None else waiting
    return None


def _unusable(view: JobView, status: Object, reservation: Object) -> Plan | None:
    """The job's end when its Reservation holds no place for this pod's replacement:
    another's or too small (`_not_for_this_pod`), or ended before the eviction; None if it
    may."""
    elsewhere = _not_for_this_pod(view, reservation)
    if elsewhere is not None:
        return fail(view, status, reason=Reason.INVALID_SPEC, message=elsewhere)
    if protocol.phase(reservation) in (ReservationPhase.FAILED, ReservationPhase.SUCCEEDED):
        return fail(
            view,
            status,
            reason=Reason.RESERVATION_EXPIRED,
            message=f"{ended_before_eviction(reservation)}; nothing was evicted",
        )
    return None


def _not_for_this_pod(view: JobView, reservation: Object) -> str | None:
    """Why a Reservation the job names is not its to use, if so: another job made it
    (opening it would hand that job's place to this one's pod, before that job's pod has
    left), it holds less than the pod asks (`protocol.asks_more`: the webhook would not
    bind the replacement there), it is not for the pod (its owners and namespace, as the
    webhook reads them), or another job uses it first (`goes_first`). None for
    the job's own (made from the pod), and for one made by hand for the pod that no other
    job uses first."""
    name = reservation["metadata"]["name"]
    if own_reservation(view.job, reservation):
        return None
    made_for = protocol.annotations_of(reservation).get(keys.JOB)
    if made_for is not None and made_for != view.job["metadata"]["name"]:
        return (
            f"spec.reservationOptions.reservationRef: Reservation {name!r} was made for "
            f"PodMigrationJob {made_for!r}; nothing was evicted"
        )
    assert view.pod is not None
    if not protocol.matches_owner(reservation, view.pod, workload_uid=view.workload_uid):
        return (
            f"spec.reservationOptions.reservationRef: Reservation {name!r} is not for this "
            f"pod: its owners do not name it, or its replacements are made in namespace "
            f"{protocol.placeholder_namespace(reservation)!r}; the webhook would not bind "
            "the replacement there; nothing was evicted"
        )
    too_small = protocol.asks_more(view.pod, reservation)
    if too_small is not None:
        return (
            f"spec.reservationOptions.reservationRef: the pod {too_small}; its replacement "
            "would not be bound there (the webhook binds a pod only to a place that holds "
            "what it asks); nothing was evicted"
        )
    first = goes_first(view.job, view.sharing, reservation)
    if first is not None:
        return (
            f"spec.reservationOptions.reservationRef: Reservation {name!r} is named by "
            f"PodMigrationJob {first!r} too, which uses it first; one Reservation holds one "
            "place; nothing was evicted"
        )
    return None


def goes_first(job: Object, sharing: tuple[Object, ...], reservation: Object) -> str | None:
    """The job, of the others not finished that name the same Reservation, that uses it
    before `job` (None: `job` goes first): the one that opened it (`keys.OPENED_FOR`, which
    only Berth writes), else the one created first (by name when created in the same
    second). The same order for every job of them, so that at most one evicts into the
    place. A Reservation opened before openings were recorded falls back on the jobs'
    Eviction condition (one that has tried an eviction first)."""
    opener = protocol.annotations_of(reservation).get(keys.OPENED_FOR)

    def order(one: Object) -> tuple[bool, str, str]:
        if opener:
            first = one["metadata"].get("uid") == opener
        else:
            first = condition(dict(one.get("status") or {}), Type.EVICTION) is not None
        metadata = one["metadata"]
        return (not first, str(metadata.get("creationTimestamp") or ""), metadata["name"])

    mine = order(job)
    before = [other for other in sharing if order(other) < mine]
    return min(before, key=order)["metadata"]["name"] if before else None


def _cannot_go_on(view: JobView, status: Object, *, expired: bool) -> Plan | None:
    """The end of a job that asks for preemption of a Reservation it did not make, ran out
    of time, or lost its pod, before anything was evicted; None if it goes on."""
    reservation = reservation_name(view.job)
    if asks_for_preemption(view.job) and reservation != view.job["metadata"]["uid"]:
        return fail(
            view,
            status,
            reason=Reason.FORBIDDEN_PREEMPTION,
            message=preemption_refused(reservation),
        )
    if expired:
        scheduled = condition(status, Type.RESERVATION_SCHEDULED) or {}
        waited = (
            f" (the Reservation was not scheduled: {scheduled.get('reason')}: "
            f"{scheduled.get('message', '')})"
            if scheduled.get("status") == "False"
            else ""
        )
        return fail(
            view,
            status,
            reason=Reason.TIMEOUT,
            message=f"TTL expired before the pod was evicted{waited}; nothing was evicted "
            + (
                f"and {released(view)}"
                if view.reservation is not None
                else "and no reservation was created"
            ),
        )
    if pod_gone(view) or view.pod is None:
        return fail(view, status, reason=Reason.MISSING_POD, message=why_pod_gone(view))
    return None


def _make_or_record(view: JobView, status: Object) -> Plan | None:
    """Create the job's Reservation if there is none, or record the one it made if that
    is not recorded yet (`_recorded`); None when it exists and is recorded."""
    reservation = view.reservation
    if reservation is None:
        return _create_reservation(view, status)
    options = view.job["spec"].get("reservationOptions") or {}
    if own_reservation(view.job, reservation) and not options.get("reservationRef"):
        return _recorded(view, status, reservation)
    return None


def _create_reservation(view: JobView, status: Object) -> Plan:
    """Create the Reservation, record it on the job, then say so; nothing for a job
    paused after its admission, until it is resumed."""
    if view.job["spec"].get("paused"):
        return step(view, status).again_in(WAIT_POLL)
    options = view.job["spec"].get("reservationOptions") or {}
    if (options.get("reservationRef") or {}).get("name"):
        return fail(
            view,
            status,
            reason=Reason.MISSING_RESERVATION,
            message=f"Reservation {reservation_name(view.job)!r} does not exist",
        )
    assert view.pod is not None
    why = template.refused(options.get("template"), view.pod)
    if why is not None:
        return fail(
            view,
            status,
            reason=Reason.FORBIDDEN_TEMPLATE,
            message=f"{why}; a template may only narrow where the pod may run and must ask "
            "what the pod asks; nothing was created",
        )
    ttl = view.job["spec"].get("ttl") if job_deadline(view.job) else None
    try:
        body = reservation_for(
            job=view.job,
            pod=view.pod,
            workload_uid=view.workload_uid,
            ttl=ttl,
            template=options.get("template"),
            volume_terms=view.volume_terms,
        )
    except UNREADABLE as error:
        # Free-form in the schema: a shape `template.refused` does not read (a label map
        # that is a list, a node selector term that is a string) ends the job, once.
        return fail(
            view,
            status,
            reason=Reason.FORBIDDEN_TEMPLATE,
            message=f"reservationOptions.template cannot be read ({unreadable(error)}); "
            "nothing was created",
        )
    return Plan().then(Create(RESERVATIONS, body), *_recorded(view, status, body).actions)


def _recorded(view: JobView, status: Object, reservation: Object) -> Plan:
    """Record the job's own Reservation on the job (where the RESERVATION column reads
    it, as the design describes), then say so. After its create, or on a later pass if
    the record lost a race then (the job changed between the create and the patch, which
    is conditional on the job as read)."""
    name = reservation["metadata"]["name"]
    status = with_condition(
        status,
        kind=Type.RESERVATION_CREATED,
        state="True",
        reason=Reason.CREATED,
        message=f"Reservation {name!r}",
        now=view.now,
    )
    status.update(status=Type.RESERVATION_CREATED, reason="", message="")
    return (
        Plan()
        .then(
            Patch(
                PODMIGRATIONJOBS,
                job_name(view),
                {
                    "metadata": as_read(view.job),
                    "spec": {"reservationOptions": {"reservationRef": {"name": name}}},
                },
            ),
            write_status(view, status),
            # The event messages of the design's quick start, word for word (Go's %q quotes).
            Event(view.job, Type.RESERVATION_CREATED, f'Successfully create Reservation "{name}"'),
        )
        .again_in(WAIT_POLL)
    )


REFUSED_FOR_GOOD = (400, 403, 422)
"""What the API server answers to a write it will refuse again as long as nothing is
changed: a body it does not take (400, 422 Invalid: a template's labels or annotations),
or a denial (403: RBAC, an admission policy or webhook). Said of a Reservation's create,
and of a namespace's berth.sh/migrating label (`controller.reconcile`)."""


def reservation_refused(view: JobView, *, status_code: int, message: str) -> Plan | None:
    """The job's end when the API server refused to create its Reservation for good
    (`REFUSED_FOR_GOOD`); None for a refusal to try again (the key backs off as after
    any API error)."""
    if status_code not in REFUSED_FOR_GOOD:
        return None
    status: Object = dict(view.job.get("status") or {})
    return fail(
        view,
        status,
        reason=Reason.FAILED_CREATE_RESERVATION,
        message=f"the API server refused to create Reservation {reservation_name(view.job)!r} "
        f"({status_code}: {message}); nothing was evicted",
    )


def _wait_for_place(
    view: JobView, status: Object, reservation: Object, *, message: str | None = None
) -> Plan:
    """The Reservation is not placed yet: report the scheduler's message (or `message`),
    and the pods it preempts for the placeholder, while it waits."""
    status, news = preempt.record(view, status, placed=False)
    if message is None:
        scheduled = condition(reservation.get("status") or {}, ReservationConditionType.SCHEDULED)
        message = str((scheduled or {}).get("message") or "waiting for the scheduler")
    unschedulable = {
        "kind": Type.RESERVATION_SCHEDULED,
        "state": "False",
        "reason": Reason.UNSCHEDULABLE,
        "message": message,
    }
    if same_condition(status, **unschedulable):
        return step(view, status, *news).again_in(WAIT_POLL)
    status = with_condition(status, **unschedulable, now=view.now)
    status.update(status=Reason.UNSCHEDULABLE, reason=Reason.UNSCHEDULABLE, message=message)
    return step(view, status, *news).again_in(WAIT_POLL)


def _scheduled(
    view: JobView, status: Object, *, name: str, node: str
) -> tuple[Object, tuple[Event, ...]]:
    """The status that records the Reservation's node, and the news to tell (none when it
    was recorded before)."""
    current = condition(status, Type.RESERVATION_SCHEDULED)
    if current and current.get("status") == "True":
        return status, ()
    status = with_condition(
        status,
        kind=Type.RESERVATION_SCHEDULED,
        state="True",
        reason=Reason.SCHEDULED,
        message=f"reserved on {node}",
        now=view.now,
    )
    status.update(nodeName=node, status=Type.RESERVATION_SCHEDULED, reason="", message="")
    return status, (
        Event(
            view.job, Type.RESERVATION_SCHEDULED, f'Assigned Reservation "{name}" to node "{node}"'
        ),
    )


def label_refused(view: JobView) -> str | None:
    """Why the job cannot go on, when the API server refused the replacement's namespace
    the label for good while the job's Reservation waited there (`LabelRefused`)."""
    refused, reservation = view.label_refused, view.reservation
    if refused is None or reservation is None:
        return None
    if str(reservation["metadata"].get("uid")) not in refused.waiting:
        return None
    namespace = protocol.placeholder_namespace(reservation)
    return (
        f"the API server refused to label namespace {namespace!r} {keys.MIGRATING_LABEL}=true "
        f"({refused.why}), so the webhook would not be called for the replacement there; "
        "nothing was evicted"
    )


def _open_then_evict(view: JobView, status: Object, news: tuple[Event, ...]) -> Plan:
    """Once the replacement's namespace shows the berth.sh/migrating label (so that the
    webhook is called for pods created there), open the Reservation to the replacement,
    wait a moment, then record Evicting and evict, the label still in place."""
    assert view.reservation is not None
    if not view.namespace_labelled:
        refused = label_refused(view)
        if refused is not None:
            return fail(view, status, reason=Reason.NAMESPACE_NOT_LABELLED, message=refused)
        # controller.namespaces labels it, the Reservation being Available; the
        # namespace's watch event brings this job back.
        return step(view, status, *news).again_in(WAIT_POLL)
    opened = protocol.annotations_of(view.reservation).get(keys.CONSUMABLE) == "true"
    if not opened or opened_before_placed(view.reservation):
        return step(view, status, *news, opening(view)).again_in(CONSUMABLE_SETTLE.total_seconds())
    left = settling(view)
    if left is not None:
        return step(view, status, *news).again_in(left)
    if protocol.is_taken(view.reservation) or not place_held(view):
        # Before the eviction, a pod the workload made meanwhile (a scale-up), or the
        # replacement of a pod someone else deleted that this cache still shows, or a
        # placeholder preempted or deleted that the Reservation does not show yet:
        # nothing is evicted into a place that may no longer be there.
        return step(view, status, *news).again_in(WAIT_POLL)
    status, eviction = start_eviction(view, status)
    return step(view, status, *news, *eviction).again_in(WAIT_POLL)
