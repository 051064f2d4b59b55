"""The handshake between controller, webhook and extender, read off API objects.

The three components share nothing but the API server, so every step of a migration is
written on the objects themselves and read back with these functions:

1. The controller creates Reservation R (owners = the pod's controller, annotation
   `berth.sh/workload` = its top-level workload) and a placeholder pod controlled by R,
   named by the API server (`generateName`), and records the pod's name and UID from the
   create response in R's `berth.sh/placeholder`. The placeholder is that pod and no
   other: one controlled by R in R's placeholder namespace whose UID is the recorded one.
   An ownerReference naming R's name and UID proves nothing on its own (R's UID is
   readable by everyone who may read Reservations), nor does the label
   `berth.sh/reservation=R` (for people and selectors only). Reservations are written
   only by Berth, so the record is the controller's word. When the placeholder is bound,
   R is Available on that node.
2. Just before evicting, the controller labels R's namespace `berth.sh/migrating: "true"`
   (the webhook's namespaceSelector requires it) and annotates R
   `berth.sh/consumable: "true"`.
3. The webhook, on a matching pod CREATE, writes a fresh token into R's `berth.sh/claim`
   (conditional on R's resourceVersion, so one pod wins) and the same token on the pod,
   with the scheduling gate, a required node affinity to R's node and Berth's extended
   resource (so that kube-scheduler asks the extender about it).
4. The controller finds the gated pod carrying R's token, and if it is the only one and
   a pod of R's owner workload in R's namespace, records it in `R.status.currentOwners`,
   sets its `status.nominatedNodeName` to R's node, deletes the placeholder, and once it
   is gone removes the gate. A claim no acceptable pod takes within `CLAIM_BOUND` is
   released for another replacement.
5. kube-scheduler keeps R's capacity for the nominated owner from pods of equal or lower
   priority between the placeholder's deletion and the owner's binding; the extender
   lets R's recorded owner (and no other pod) use R's node, and, for the pods it is
   asked about (every pod in the strict scope), keeps R's capacity for it too.

Objects are the API server's dicts; these functions are pure.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import orjson

from berth.api import API_VERSION, ReservationPhase, is_zero, keys, parse_duration
from berth.api.times import read_time
from berth.resources import format_quantity, held_requests
from berth.scheduling import selector_matches

Object = Mapping[str, Any]


def annotations_of(obj: Object) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("annotations") or {}


def made_from_eviction(job: Object) -> bool:
    """Whether the webhook made the PodMigrationJob from an eviction it intercepted
    (`keys.REQUESTER`, the requester's name). A job's creator who writes it on their own
    job only narrows what Berth does with it: the Eviction API always, no limit lifted by
    the pod's annotation, deleted once finished and its pod gone."""
    return bool(annotations_of(job).get(keys.REQUESTER))


def labels_of(obj: Object) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def controller_of(obj: Object) -> Mapping[str, Any] | None:
    """The owner reference marked as controller, if any."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


# ----- reservations -----------------------------------------------------------------------


def phase(reservation: Object) -> str:
    return str(reservation.get("status", {}).get("phase") or ReservationPhase.PENDING)


def node_of(reservation: Object) -> str | None:
    node = reservation.get("status", {}).get("nodeName")
    return str(node) if node else None


NEVER = datetime.max.replace(tzinfo=UTC)
"""When a Reservation with `ttl: 0` expires."""

DEFAULT_TTL = timedelta(hours=24)
"""A Reservation's life when it has neither ttl nor expires (made by hand), as
Koordinator's API defaults it; a job's Reservation always has the job's ttl."""


def expires_at(reservation: Mapping[str, Any]) -> datetime:
    """When the Reservation expires: its `expires`, else its creation plus its `ttl` (or
    `DEFAULT_TTL`); a `ttl` of 0 never (Koordinator's "0 disables expiration"). An
    `expires` that is no time (`read_time`: year 0000, say, which the schema lets in)
    counts as absent. A `ttl` that is no Go duration raises ValueError."""
    spec = reservation.get("spec") or {}
    fields = (spec.get("expires"), spec.get("ttl"), reservation["metadata"]["creationTimestamp"])
    if all(field is None or isinstance(field, str) for field in fields):
        return _expiry(*fields)  # the webhook asks on every review in the namespace
    return _expiry.__wrapped__(*fields)


@functools.lru_cache(maxsize=4096)
def _expiry(expires: Any, ttl: Any, created: Any) -> datetime:
    found = read_time(expires)
    if found is not None:
        return found
    if ttl and is_zero(ttl):
        return NEVER
    start = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    return start + (parse_duration(ttl) if ttl else DEFAULT_TTL)


def has_expired(reservation: Mapping[str, Any], now: datetime) -> bool:
    """Whether the Reservation's time is up (`expires_at`); not when that cannot be read
    (the controller, which ends Reservations, says why)."""
    try:
        return now >= expires_at(reservation)
    except (KeyError, TypeError, ValueError, OverflowError):
        return False


def claim_of(reservation: Object) -> str | None:
    return annotations_of(reservation).get(keys.CLAIM) or None


def is_open(reservation: Object) -> bool:
    """Available on a node and opened for its replacement (claimed or not)."""
    return (
        phase(reservation) == ReservationPhase.AVAILABLE
        and node_of(reservation) is not None
        and annotations_of(reservation).get(keys.CONSUMABLE) == "true"
    )


def is_taken(reservation: Object) -> bool:
    """Claimed by a pod, or held for one (an owner recorded), already."""
    return claim_of(reservation) is not None or bool(owner_uids(reservation))


def is_consumable(reservation: Object) -> bool:
    """Open, and not yet claimed by any pod."""
    return is_open(reservation) and claim_of(reservation) is None


def is_closed(reservation: Object) -> bool:
    """Available on a node, opened for its pod's eviction and closed again (the API
    server refused that eviction, or the job was paused): no replacement may claim it
    until it is reopened for the next attempt."""
    return (
        phase(reservation) == ReservationPhase.AVAILABLE
        and node_of(reservation) is not None
        and annotations_of(reservation).get(keys.CONSUMABLE) == keys.CLOSED
    )


def was_opened(reservation: Object) -> bool:
    """Opened for its pod's eviction at some point (open now or closed again, wherever its
    place is now). Reservations are written only by Berth: its word that the eviction was
    Berth's."""
    return annotations_of(reservation).get(keys.CONSUMABLE) in ("true", keys.CLOSED)


def opened_at(reservation: Object) -> datetime | None:
    """When the controller last opened it (`berth.sh/opened-at`, to the microsecond); None
    when the annotation is missing or unreadable."""
    return _time_annotation(reservation, keys.OPENED_AT)


def closed_at(reservation: Object) -> datetime | None:
    """When the controller closed it after a refused eviction (`berth.sh/closed-at`)."""
    return _time_annotation(reservation, keys.CLOSED_AT)


def _time_annotation(obj: Object, key: str) -> datetime | None:
    return read_time(annotations_of(obj).get(key))


def opening_order(reservation: Object) -> tuple[datetime, str, str]:
    """The order in which open Reservations are offered to replacements: the one opened
    first, first. Its pod's eviction follows its opening by the settle time, so the
    earliest-opened Reservation is the one whose pod left first; a Reservation opened a
    moment ago, whose pod is still running, comes last. Ties (opened in the same instant,
    or opened by a Berth that wrote no time) by creation, then name."""
    metadata = reservation["metadata"]
    return (
        opened_at(reservation) or _NEVER,
        str(metadata.get("creationTimestamp") or ""),
        str(metadata["name"]),
    )


_NEVER = datetime.min.replace(tzinfo=UTC)


def fingerprint(token: str) -> str:
    """What a log line or an event may say of a claim token: enough to tell two apart,
    nothing that would let a reader present it."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:12]


CLAIM_BOUND = timedelta(seconds=30)
"""How long a claim waits for its pod to be recorded as owner before it is released."""


def claimed_at(reservation: Object) -> datetime | None:
    """When the claim annotation was last written, from managedFields: the latest time of
    an entry that owns it (None when no entry shows it)."""
    times = [
        entry["time"]
        for entry in reservation.get("metadata", {}).get("managedFields") or []
        if entry.get("time")
        and f"f:{keys.CLAIM}"
        in ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations", {})
    ]
    return datetime.fromisoformat(max(times).replace("Z", "+00:00")) if times else None


def owner_uids(reservation: Object) -> set[str]:
    """UIDs of the pods recorded as holding the capacity (status.currentOwners)."""
    owners = reservation.get("status", {}).get("currentOwners") or []
    return {str(owner["uid"]) for owner in owners if owner.get("uid")}


def template_namespace(reservation: Object) -> str | None:
    """The namespace its template names, if it names one (a template is free-form: a
    metadata that is no object names none)."""
    template = reservation.get("spec", {}).get("template") or {}
    metadata = template.get("metadata") if isinstance(template, dict) else None
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    return namespace if isinstance(namespace, str) and namespace else None


def placeholder_namespace(reservation: Object) -> str:
    """Where the placeholder runs: the template's namespace, else its owners', else default."""
    namespace = template_namespace(reservation)
    if namespace:
        return namespace
    for owner in reservation.get("spec", {}).get("owners") or []:
        for kind in ("controller", "object"):
            if (owner.get(kind) or {}).get("namespace"):
                return str(owner[kind]["namespace"])
    return "default"


_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def is_object_name(value: str) -> bool:
    """Whether `value` can name a pod, a ReplicaSet or a namespace as the API allows them
    (at most a DNS subdomain): one URL path segment, safe to put in a request's path."""
    return _OBJECT_NAME.fullmatch(value) is not None


def is_replicaset(reference: Mapping[str, Any]) -> bool:
    """Whether an owner reference names an apps/v1 ReplicaSet."""
    return reference.get("apiVersion") == "apps/v1" and reference.get("kind") == "ReplicaSet"


# ----- who makes replacement pods ---------------------------------------------------------

CONTROLLER_IDENTITIES: Mapping[tuple[str, str], str] = {
    ("apps/v1", "ReplicaSet"): "system:serviceaccount:kube-system:replicaset-controller",
    ("apps/v1", "StatefulSet"): "system:serviceaccount:kube-system:statefulset-controller",
    ("batch/v1", "Job"): "system:serviceaccount:kube-system:job-controller",
}
"""The controller kinds whose replacement pods can take a Reservation, and the user
kube-controller-manager creates their pods as when it runs with
`--use-service-account-credentials` (`cmd/kube-controller-manager/app`: each controller's
`NewClient` name is a ServiceAccount in kube-system)."""

CONTROLLER_MANAGER = "system:kube-controller-manager"
"""The user kube-controller-manager creates every controller's pods as without
`--use-service-account-credentials` (the name of its client certificate)."""


def controller_users() -> list[str]:
    """Every user a pod that can take a Reservation is created as: the API server sends
    Berth's webhook only pod creations by one of them (its matchConditions)."""
    return [*CONTROLLER_IDENTITIES.values(), CONTROLLER_MANAGER]


def _kind(reference: Mapping[str, Any]) -> tuple[str, str]:
    return str(reference.get("apiVersion")), str(reference.get("kind"))


def is_bindable(controller: Mapping[str, Any] | None) -> bool:
    """Whether a pod of this controller reference can take a Reservation: its kind is one
    whose pod creator Berth's webhook can recognise (`created_by_controller`)."""
    return controller is not None and _kind(controller) in CONTROLLER_IDENTITIES


def created_by_controller(controller: Mapping[str, Any] | None, username: str | None) -> bool:
    """Whether the API server says a pod naming `controller` was created by that kind's
    controller (`username` is the request's authenticated user). A pod's ownerReferences
    are whatever its author wrote; its creator is the API server's word, and no user can
    create pods as kube-controller-manager or its ServiceAccounts."""
    if controller is None or not username:
        return False
    identity = CONTROLLER_IDENTITIES.get(_kind(controller))
    return identity is not None and username in (identity, CONTROLLER_MANAGER)


def same_controller(wanted: Object, controller: Object) -> bool:
    """The same UID, and the same kind and name where the owner records them: a pod
    that names another workload's UID under its own kind or name is not that workload."""
    return wanted.get("uid") == controller.get("uid") and all(
        wanted.get(key) in (None, controller.get(key)) for key in ("kind", "name")
    )


def matches_owner(reservation: Object, pod: Object, *, workload_uid: str | None) -> bool:
    """Whether `pod` may use `reservation`.

    It must be in the namespace where the Reservation's replacement is made
    (`placeholder_namespace`, as `may_claim` requires). Its controller must be one of the
    Reservation's controller owners, or its top-level workload (`workload_uid`, e.g. the
    Deployment above a new ReplicaSet) must be the one the Reservation was made for.
    Object and label-selector owners match as in the API.
    """
    namespace = pod.get("metadata", {}).get("namespace")
    if namespace != placeholder_namespace(reservation):
        return False
    controller = controller_of(pod)
    reserved_workload = annotations_of(reservation).get(keys.WORKLOAD)
    if workload_uid and reserved_workload == workload_uid:
        return True
    return any(
        _owner_matches(
            owner,
            pod,
            lambda wanted: controller is not None and same_controller(wanted, controller),
        )
        for owner in reservation.get("spec", {}).get("owners") or []
    )


def _owner_matches(owner: Any, pod: Object, controller_is: Callable[[Object], bool]) -> bool:
    """Whether one of a Reservation's owners names `pod`: every field of it that is set
    matches, as the API says (an object, the pod's controller as `controller_is` judges
    it, a label selector). An owner must name its pods: one with nothing but an empty
    selector, which would match every pod, names none."""
    if not isinstance(owner, Mapping):
        return False
    wanted, obj = owner.get("controller"), owner.get("object")
    selector = owner.get("labelSelector") or {}
    if not (wanted or obj or selector.get("matchLabels") or selector.get("matchExpressions")):
        return False
    return (
        (not wanted or controller_is(wanted))
        and (not obj or _same_object(obj, pod))
        and selector_matches(selector, labels_of(pod))
    )


def asks_more(pod: Object, reservation: Object) -> str | None:
    """Why `pod` asks for more than `reservation` holds (None: it does not). A
    Reservation holds what its template requests (its placeholder asks exactly that), and
    a pod asking more of one of those resources may not fit its node, where its required
    affinity could never be lifted: a rollout's pod of a larger template, or a template
    that reserved less than the pod. Resources the template does not request are not
    judged (a Reservation made by hand for CPU alone); nor is the runtime class's overhead,
    which the API server sets on the pod and the placeholder alike."""
    name = reservation["metadata"].get("name")
    template = (reservation.get("spec") or {}).get("template") or {}
    try:
        held = held_requests(template.get("spec") or {})
    except (ValueError, TypeError, AttributeError) as error:
        return f"reservation {name} holds requests that cannot be read ({error})"
    try:
        asked = held_requests(pod["spec"])
    except (ValueError, TypeError, AttributeError) as error:
        return f"has requests that cannot be read ({error})"
    above = sorted(r for r, value in asked.items() if r in held and value > held[r])
    if not above:
        return None
    more = ", ".join(
        f"{r} {format_quantity(r, asked[r])} (it holds {format_quantity(r, held[r])})"
        for r in above
    )
    return f"requests more than reservation {name} holds: {more}"


def _same_object(wanted: Any, pod: Object) -> bool:
    """Whether an object owner names `pod`: by its name (a pod being created under a
    generated name has none yet, and matches no object owner), in its namespace, and by
    its UID when the owner gives one (a pod being created has none yet)."""
    metadata = pod.get("metadata") or {}
    return (
        isinstance(wanted, Mapping)
        and bool(metadata.get("name"))
        and wanted.get("name") == metadata.get("name")
        and wanted.get("namespace", metadata.get("namespace")) == metadata.get("namespace")
        and wanted.get("uid") in (None, "", metadata.get("uid"))
    )


def controlled_key(namespace: str, uid: str) -> str:
    """How the pods a controller controls are found: by its UID within the namespace
    they share with it. A pod elsewhere may name any UID in its ownerReferences (the
    garbage collector removes it only once it resolves the owner's kind), and is none of
    that controller's pods."""
    return f"{namespace}/{uid}"


def top_level_workload(controller: Mapping[str, Any], replicaset: Object | None) -> str:
    """UID of the workload a pod belongs to: for a pod of ReplicaSet `replicaset`, the
    ReplicaSet's own controller when that is a Deployment (whose UID stays the same across
    a rollout); otherwise the pod's controller itself. No other kind above a ReplicaSet
    counts: a ReplicaSet's ownerReferences are written by whoever creates it, and one
    naming a StatefulSet's UID would make its pods that StatefulSet's replacements."""
    if replicaset is not None and replicaset["metadata"].get("uid") == controller.get("uid"):
        above = deployment_above(replicaset)
        if above is not None:
            return above
    return str(controller["uid"])


def deployment_above(replicaset: Object) -> str | None:
    """The UID of the `apps/v1` Deployment the ReplicaSet's controller reference names, if
    it names one: the one reading of a ReplicaSet's workload, for the webhook, the
    limits and the admission's record alike."""
    above = controller_of(replicaset)
    if above is None or (above.get("apiVersion"), above.get("kind")) != ("apps/v1", "Deployment"):
        return None
    return str(above["uid"])


# ----- pods -------------------------------------------------------------------------------


def placeholder_ref(pod: Object) -> tuple[str, str] | None:
    """`(name, uid)` of the Reservation the pod's controller reference names, if any.

    What the pod says of itself, which anyone who may create pods can write: good for
    keeping a pod out of things, never for giving it anything (`is_placeholder_of`)."""
    ref = controller_of(pod)
    if ref is None or ref.get("kind") != "Reservation" or ref.get("apiVersion") != API_VERSION:
        return None
    if not ref.get("name") or not ref.get("uid"):
        return None
    return str(ref["name"]), str(ref["uid"])


def placeholder_reservation(pod: Object) -> str | None:
    """The Reservation a pod says it is the placeholder of (None for any other pod).

    Good for keeping a pod out of things (eviction, claims); never for giving it anything:
    use `is_placeholder_of` for that. The label is not read: anyone can set it."""
    ref = placeholder_ref(pod)
    return ref[0] if ref else None


class Placeholder(NamedTuple):
    """What makes a pod a Reservation's placeholder: the Reservation (name and UID), the
    namespace the pod runs in, and the pod's own UID."""

    reservation: str
    reservation_uid: str
    namespace: str
    pod_uid: str


def name_and_uid(obj: Object) -> str:
    """How Berth writes down an object it refers to in an annotation: `{"name", "uid"}`."""
    metadata = obj.get("metadata", {})
    return json.dumps({"name": metadata.get("name"), "uid": metadata.get("uid")})


def placeholder_claim(pod: Object) -> Placeholder | None:
    """What a pod says it is: the placeholder of the Reservation its controller reference
    names (None for a pod that names none)."""
    ref = placeholder_ref(pod)
    metadata = pod.get("metadata", {})
    if ref is None or not metadata.get("uid"):
        return None
    return Placeholder(*ref, str(metadata.get("namespace")), str(metadata["uid"]))


def recorded_placeholder(reservation: Object) -> Placeholder | None:
    """The placeholder the controller recorded on the Reservation (`berth.sh/placeholder`,
    written from its create response), or None before one is recorded."""
    metadata = reservation.get("metadata", {})
    try:
        # orjson: nesting however deep is a ValueError, never a RecursionError.
        record = orjson.loads(annotations_of(reservation).get(keys.PLACEHOLDER) or "null")
    except ValueError:
        return None
    if not isinstance(record, dict) or not record.get("uid") or not metadata.get("uid"):
        return None
    return Placeholder(
        str(metadata.get("name")),
        str(metadata["uid"]),
        placeholder_namespace(reservation),
        str(record["uid"]),
    )


def is_recorded(claim: Placeholder | None, record: Placeholder | None) -> bool:
    """Whether a pod's claim (`placeholder_claim`) is its Reservation's record
    (`recorded_placeholder`): the same Reservation, namespace and pod UID."""
    return claim is not None and claim == record


def is_placeholder_of(pod: Object, reservation: Object) -> bool:
    """Whether `pod` is `reservation`'s placeholder: controlled by it (name and UID), in
    its placeholder namespace, and the very pod the controller recorded on it."""
    return is_recorded(placeholder_claim(pod), recorded_placeholder(reservation))


def may_claim(
    reservation: Object, pod: Object, *, controller_uid: str | None, workload_uid: str | None
) -> bool:
    """Whether `pod`, carrying the Reservation's claim, may be recorded as its owner.

    It must be in the Reservation's namespace, ask no more than the Reservation holds
    (`asks_more`), and its controller (`controller_uid`, as the
    reader resolved it from its own caches, never from the pod alone) or that controller's
    top-level workload (`workload_uid`) must be the one the Reservation was made for, or
    one of its owners must name the pod as in `matches_owner` (every field set), the
    controller judged by `controller_uid`: the webhook and the controller read owners
    alike.
    """
    if pod.get("metadata", {}).get("namespace") != placeholder_namespace(reservation):
        return False
    if placeholder_reservation(pod) is not None:
        return False
    if asks_more(pod, reservation) is not None:
        # Made larger after the webhook bound it (a later mutating webhook, the VPA's):
        # the place would not hold it, as the webhook would not have bound it.
        return False
    reserved_workload = annotations_of(reservation).get(keys.WORKLOAD)
    if workload_uid and reserved_workload == workload_uid:
        return True
    return any(
        _owner_matches(
            owner, pod, lambda wanted: bool(controller_uid) and wanted.get("uid") == controller_uid
        )
        for owner in reservation.get("spec", {}).get("owners") or []
    )


def pod_claim(pod: Object) -> str | None:
    return annotations_of(pod).get(keys.CLAIM) or None


def is_gated(pod: Object) -> bool:
    """Held by Berth's scheduling gate."""
    gates = pod.get("spec", {}).get("schedulingGates") or []
    return any(gate.get("name") == keys.RESERVATION_GATE for gate in gates)


NODE_NAME_FIELD = "metadata.name"
"""The node field the webhook's required affinity names (`matchFields`)."""


def tied_node(pod: Object) -> str | None:
    """The one node an unbound pod's required node affinity allows, when every term names
    it alone by `metadata.name In [node]` (the term Berth's webhook ANDs into each one);
    None when the pod is bound or may go to other nodes as far as this tells."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return None
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    # An empty term matches no node: it widens nothing.
    terms = [
        t
        for t in required.get("nodeSelectorTerms") or []
        if t.get("matchFields") or t.get("matchExpressions")
    ]
    named = {_named_node(term) for term in terms}
    return named.pop() if len(named) == 1 and terms else None


def _named_node(term: Object) -> str | None:
    """The node a node selector term names alone by `metadata.name In [node]`, if one."""
    nodes = {
        values[0]
        for field in term.get("matchFields") or []
        if field.get("key") == NODE_NAME_FIELD
        and field.get("operator") == "In"
        and len(values := field.get("values") or []) == 1
    }
    return nodes.pop() if len(nodes) == 1 else None


def is_terminal_pod(pod: Object) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def placeholder_holds(reservation: Object, placeholder: Object | None) -> bool:
    """Whether `placeholder` holds the Reservation's place, as far as the pod goes: it is
    there, not finished (the scheduler no longer counts a pod that is), and bound to the
    Reservation's node. The one judgement of the Reservation's own pass and of a job
    before it evicts into the place."""
    return (
        placeholder is not None
        and not is_terminal_pod(placeholder)
        and (placeholder.get("spec") or {}).get("nodeName") == node_of(reservation)
    )


def is_ready(pod: Object) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return pod.get("status", {}).get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )
