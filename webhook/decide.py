"""What the webhook does with a pod CREATE: which Reservations to try, and the pod patch.

Both are pure so that every case is a line in a test table; `webhook.app` does the I/O
(the claim on the API server) between them. A mutating webhook sees a pod before it has a
UID, and often before it has a name, so nothing here is keyed on either: the pod is
matched to a Reservation through its controller and top-level workload only. A pod's
ownerReferences are whatever its author wrote, so they count only for a pod the API
server says its controller created (`berth.protocol.created_by_controller`: the kinds
Berth binds, created by kube-controller-manager's identity for that kind); then a
ReplicaSet's Deployment is read from the API server (`webhook.owners`), any other
controller is matched by its kind, name and UID.

A claim token is what entitles a pod to a Reservation: it is never written into a reason
or a log line, only its `fingerprint`.

The patch only adds what the pod lacks. The API server calls the webhook again when a
later webhook changed the pod (`reinvocationPolicy: IfNeeded`); the pod then carries its
claim, the same Reservation is re-asserted without a second claim, and a pod that still
has everything gets no patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from berth.api import ReservationPhase, keys
from berth.protocol import (
    NODE_NAME_FIELD,
    Object,
    annotations_of,
    asks_more,
    claim_of,
    controller_of,
    created_by_controller,
    fingerprint,
    is_bindable,
    is_consumable,
    is_open,
    is_replicaset,
    is_taken,
    matches_owner,
    node_of,
    opening_order,
    owner_uids,
    phase,
    placeholder_reservation,
    pod_claim,
)

Patch = list[dict[str, Any]]


@dataclass(frozen=True)
class Skip:
    """Leave the pod as it is; `reason` is for the log."""

    reason: str
    unconfirmed: bool = False
    """Decided without the pod's top-level workload, which could change it: worth asking
    the API server for the pod's ReplicaSet and deciding again."""
    recheck: str | None = None
    """The Reservation the pod's claim names, which this cache shows open with no owner
    recorded but not holding that claim: a review reinvoked moments after the claim (or
    after a takeover) may come before the cache has seen it, and the pod then needs its
    patch again (a later webhook may have changed its affinity or gates). Worth reading
    from the API server and deciding again."""


@dataclass(frozen=True)
class Claim:
    """Try to claim these Reservations, in this order, until one is won."""

    candidates: tuple[Object, ...]


@dataclass(frozen=True)
class Reassert:
    """The pod already carries its claim on `reservation`: this webhook was called again
    for the same creation. Add back what is missing, claim nothing."""

    reservation: Object
    token: str


@dataclass(frozen=True)
class TakeOver:
    """No Reservation is open to a claim, but these are claimed by a pod that may never
    have been stored, no owner recorded yet: the claim is written while its pod is being
    admitted, which may refuse it after (a ResourceQuota, a policy, a validating
    webhook). Each may be claimed anew, in this order, once the API server shows no pod
    carrying its claim."""

    candidates: tuple[Object, ...]


Decision = Skip | Claim | Reassert | TakeOver


def decide(
    request: Mapping[str, Any],
    *,
    reservations: Mapping[str, Object],
    workload_uid: str | None,
    contest: bool = False,
) -> Decision:
    """The decision for one AdmissionReview `request`, given the cached `reservations` by
    name. `workload_uid` is the pod's top-level workload (see `berth.protocol.top_level_workload`),
    resolved by the caller through the API server; None when the API server did not
    confirm the pod's controller, and then the pod takes no Reservation. `contest` lets a
    claim that no pod may carry be taken over (`TakeOver`)."""
    if request.get("operation") != "CREATE":
        return Skip("not a pod CREATE")
    if request.get("dryRun"):
        return Skip("dry run: nothing is claimed")
    pod = pod_of(request)
    token = pod_claim(pod)
    not_a_replacement = _why_not_a_replacement(pod) if token is None else None
    if not_a_replacement:
        return Skip(not_a_replacement)
    not_its_controllers = _why_not_its_controllers(pod, creator_of(request))
    if not_its_controllers:
        return Skip(not_its_controllers)
    if token is not None:
        return _reassert(pod, token=token, reservations=reservations, workload_uid=workload_uid)
    controller = controller_of(pod) or {}
    consumable = [r for r in reservations.values() if is_consumable(r)]
    if consumable and unconfirmed(pod, workload_uid):
        return Skip(
            f"its controller {controller.get('kind')} {controller.get('name')} "
            f"(uid {controller.get('uid')}) is not confirmed by the API server"
        )
    decision = _claim(pod, consumable, workload_uid=workload_uid)
    if isinstance(decision, Skip) and contest:
        return _take_over(pod, reservations, workload_uid=workload_uid) or decision
    return decision


def _take_over(
    pod: Object, reservations: Mapping[str, Object], *, workload_uid: str | None
) -> TakeOver | None:
    """The open Reservations `pod` would take but for a claim no owner was recorded for,
    oldest opening first (None: none). A ReplicaSet's pod whose controller the API server
    did not confirm takes none."""
    if unconfirmed(pod, workload_uid):
        return None
    claimed = [
        r
        for r in reservations.values()
        if contested(r)
        and matches_owner(r, pod, workload_uid=workload_uid)
        and asks_more(pod, r) is None
    ]
    return TakeOver(tuple(sorted(claimed, key=opening_order))) if claimed else None


def unconfirmed(pod: Object, workload_uid: str | None) -> bool:
    """A ReplicaSet's pod whose controller the API server did not confirm (no workload
    found for it): it takes no Reservation."""
    return workload_uid is None and is_replicaset(controller_of(pod) or {})


def contested(reservation: Object) -> bool:
    """Open, claimed, and no owner recorded yet: its claim may be one no pod carries."""
    return (
        is_open(reservation) and claim_of(reservation) is not None and not owner_uids(reservation)
    )


def _claim(pod: Object, consumable: list[Object], *, workload_uid: str | None) -> Decision:
    """The Reservations of `consumable` that `pod` may take, oldest opening first: made
    for its controller or workload, and holding as much as the pod asks (`asks_more`)."""
    matching = sorted(
        (r for r in consumable if matches_owner(r, pod, workload_uid=workload_uid)),
        key=opening_order,
    )
    if not matching:
        controller = controller_of(pod) or {}
        return Skip(
            f"no consumable reservation for {controller.get('kind')} "
            f"{controller.get('name')} of workload {workload_uid}"
        )
    too_small = {r["metadata"]["name"]: asks_more(pod, r) for r in matching}
    candidates = [r for r in matching if too_small[r["metadata"]["name"]] is None]
    if not candidates:
        return Skip("; ".join(why for why in too_small.values() if why))
    return Claim(tuple(candidates))


def worth_a_fresh_look(
    decision: Decision,
    pod: Object,
    reservations: Mapping[str, Object],
    looked_up: bool,
    workload_uid: str | None,
) -> list[str]:
    """The Reservations to read again from the API server for a pod skipped on this
    cache: the controller opens a Reservation just before evicting, and the replacement
    may come before this cache has seen that. Those this cache shows about to open that
    the pod would match, for a pod its controller created (`looked_up`: a ReplicaSet's pod
    by its workload, a StatefulSet's or Job's by its controller, `workload_uid` None)."""
    if not isinstance(decision, Skip) or not looked_up:
        return []
    if unconfirmed(pod, workload_uid):
        return []  # its controller not confirmed: it takes no Reservation (`decide`)
    return [
        name
        for name, cached in reservations.items()
        if opening(cached)
        and matches_owner(cached, pod, workload_uid=workload_uid)
        and asks_more(pod, cached) is None
    ]


def opening(reservation: Object) -> bool:
    """Live and untouched, but not (yet, in this cache) open to a replacement: this cache
    may lag behind the Reservation becoming Available and being opened."""
    return (
        phase(reservation) in (ReservationPhase.PENDING, ReservationPhase.AVAILABLE)
        and not is_consumable(reservation)
        and not is_taken(reservation)
    )


def _why_not_a_replacement(pod: Object) -> str | None:
    """Why `pod` can never take a Reservation (None: it may)."""
    bound = annotations_of(pod).get(keys.RESERVATION_ALLOCATED)
    if bound:
        return f"already bound to reservation {bound}"
    if placeholder_reservation(pod):
        return "a placeholder pod"
    if pod["spec"].get("nodeName"):
        return f"already assigned to node {pod['spec']['nodeName']}"
    if controller_of(pod) is None:
        return "no controller"
    return None


def creator_of(request: Mapping[str, Any]) -> str | None:
    """Who the API server says is creating the pod (the request's authenticated user)."""
    user = request.get("userInfo")
    name = user.get("username") if isinstance(user, Mapping) else None
    return name if isinstance(name, str) and name else None


def _why_not_its_controllers(pod: Object, creator: str | None) -> str | None:
    """Why `pod` is not known to come from the controller its ownerReferences name (None:
    it is). Anyone who may create pods in a namespace can name any controller there, UID
    included; only the pod's creator, as the API server authenticated it, tells the
    workload's own pods from such copies."""
    controller = controller_of(pod)
    if controller is None:
        return "no controller"
    kind = f"{controller.get('apiVersion')} {controller.get('kind')}"
    if not is_bindable(controller):
        return f"its controller is a {kind}, whose pods Berth does not bind to Reservations"
    if not created_by_controller(controller, creator):
        return f"created by {creator or 'an unknown user'}, not by the {kind} controller"
    return None


def _reassert(
    pod: Object, *, token: str, reservations: Mapping[str, Object], workload_uid: str | None
) -> Decision:
    """For a pod that carries a claim: the Reservation it names, if that still waits for
    it, and if the pod may take it as a pod without a claim would (`_claim`: its owners,
    what it asks). A pod made from the manifest of one bound earlier carries a stale
    claim, and must not be gated again on a Reservation that is used up; the claim's
    token, readable on the pod that made it, binds no other pod."""
    try:
        allocated = orjson.loads(annotations_of(pod).get(keys.RESERVATION_ALLOCATED) or "")
        name, uid = allocated["name"], allocated["uid"]
        if not (isinstance(name, str) and isinstance(uid, str)):
            raise TypeError("name and uid must be strings")
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return Skip(
            f"carries claim {fingerprint(token)} without a readable {keys.RESERVATION_ALLOCATED}"
        )
    reservation = reservations.get(name)
    if reservation is None or reservation["metadata"].get("uid") != uid:
        return Skip(
            f"carries claim {fingerprint(token)} for reservation {name}, which is not in the cache"
        )
    if not _waits_for(reservation, token):
        return Skip(
            f"carries claim {fingerprint(token)} for reservation {name}, "
            "which no longer waits for it",
            # Available, no owner yet: this cache may not show the claim, a takeover, or
            # the opening itself yet (the claim was made through another replica).
            recheck=(
                name
                if phase(reservation) == ReservationPhase.AVAILABLE and not owner_uids(reservation)
                else None
            ),
        )
    if not matches_owner(reservation, pod, workload_uid=workload_uid):
        return Skip(
            f"carries claim {fingerprint(token)} for reservation {name}, "
            "which was not made for its workload",
            unconfirmed=unconfirmed(pod, workload_uid),
        )
    too_small = asks_more(pod, reservation)
    if too_small is not None:
        return Skip(f"carries claim {fingerprint(token)}, but {too_small}")
    return Reassert(reservation, token)


def _waits_for(reservation: Object, token: str) -> bool:
    """Claimed with `token` and not yet handed over to a pod. A Reservation this cache
    still sees unclaimed does not count: a pod reinvoked right after its own claim already
    carries the whole patch, while a pod that brings a token of its own making (forged)
    must get nothing."""
    claim = claim_of(reservation)
    return (
        claim == token
        and phase(reservation) == ReservationPhase.AVAILABLE
        and node_of(reservation) is not None
        and not owner_uids(reservation)
    )


def pod_of(request: Mapping[str, Any]) -> Object:
    """The pod under review, in the request's namespace when it names none itself."""
    pod: Object = request["object"]
    if pod["metadata"].get("namespace") or not request.get("namespace"):
        return pod
    return {**pod, "metadata": {**pod["metadata"], "namespace": request["namespace"]}}


def bind_patch(pod: Object, *, reservation: Object, token: str) -> Patch:
    """The JSONPatch that binds `pod` to the claimed `reservation`: Berth's scheduling
    gate, a required node affinity to the Reservation's node, the binding annotations, the
    claim as a label too (so that the API server can say whether any pod carries a claim:
    `TakeOver`), and Berth's extended resource on the first container (so that
    kube-scheduler asks the extender about this pod). Only what is missing is added, so a
    patched pod yields an empty patch."""
    node = reservation["status"]["nodeName"]
    allocated = orjson.dumps(
        {"name": reservation["metadata"]["name"], "uid": reservation["metadata"]["uid"]}
    ).decode()
    return [
        *_metadata_patch(
            pod, "annotations", {keys.RESERVATION_ALLOCATED: allocated, keys.CLAIM: token}
        ),
        *_metadata_patch(pod, "labels", {keys.CLAIM: token}),
        *_gate_patch(pod),
        *_affinity_patch(pod, node),
        *_resource_patch(pod),
    ]


MARKER = "1"
"""How much of `keys.RESERVATION_RESOURCE` a bound pod requests: its presence is what
counts."""


def _resource_patch(pod: Object) -> Patch:
    """Request Berth's extended resource in the first container, in requests and limits
    alike (the API requires them equal for an extended resource). The kubelet admits the
    pod on a node that does not advertise it (see the README, "Scope")."""
    containers = pod["spec"].get("containers") or []
    if not containers:
        return []
    path = "/spec/containers/0/resources"
    resources = containers[0].get("resources")
    if not resources:
        return [
            {
                "op": "add",
                "path": path,
                "value": {
                    "requests": {keys.RESERVATION_RESOURCE: MARKER},
                    "limits": {keys.RESERVATION_RESOURCE: MARKER},
                },
            }
        ]
    patch: Patch = []
    for part in ("requests", "limits"):
        values = resources.get(part)
        if not values:
            patch.append(
                {
                    "op": "add",
                    "path": f"{path}/{part}",
                    "value": {keys.RESERVATION_RESOURCE: MARKER},
                }
            )
        elif values.get(keys.RESERVATION_RESOURCE) != MARKER:
            patch.append(
                {
                    "op": "add",
                    "path": f"{path}/{part}/{_escape(keys.RESERVATION_RESOURCE)}",
                    "value": MARKER,
                }
            )
    return patch


def _metadata_patch(pod: Object, field: str, wanted: Mapping[str, str]) -> Patch:
    """Add to the pod's `metadata.<field>` (annotations, labels) what `wanted` has that
    it lacks."""
    current = pod["metadata"].get(field)
    if not current:
        return [{"op": "add", "path": f"/metadata/{field}", "value": dict(wanted)}]
    return [
        {"op": "add", "path": f"/metadata/{field}/{_escape(key)}", "value": value}
        for key, value in wanted.items()
        if current.get(key) != value
    ]


def _gate_patch(pod: Object) -> Patch:
    gate = {"name": keys.RESERVATION_GATE}
    gates = pod["spec"].get("schedulingGates")
    if not gates:
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]
    if any(g.get("name") == keys.RESERVATION_GATE for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]


def _affinity_patch(pod: Object, node: str) -> Patch:
    """AND `metadata.name In [node]` into every node selector term, creating the term (and
    any missing parent) when the pod has none."""
    requirement = {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}
    term = {"matchFields": [requirement]}
    path = "/spec/affinity"
    affinity = pod["spec"].get("affinity")
    if not affinity:
        return [
            {
                "op": "add",
                "path": path,
                "value": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [term]
                        }
                    }
                },
            }
        ]
    path += "/nodeAffinity"
    node_affinity = affinity.get("nodeAffinity")
    if not node_affinity:
        return [
            {
                "op": "add",
                "path": path,
                "value": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                },
            }
        ]
    path += "/requiredDuringSchedulingIgnoredDuringExecution"
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return [{"op": "add", "path": path, "value": {"nodeSelectorTerms": [term]}}]
    path += "/nodeSelectorTerms"
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return [{"op": "add", "path": path, "value": [term]}]
    patch: Patch = []
    for index, existing in enumerate(terms):
        fields = existing.get("matchFields")
        if requirement in (fields or []):
            continue
        if not fields and not existing.get("matchExpressions"):
            # An empty term matches no node; ANDed with anything it still matches none.
            continue
        if fields:
            patch.append(
                {"op": "add", "path": f"{path}/{index}/matchFields/-", "value": requirement}
            )
        else:
            patch.append(
                {"op": "add", "path": f"{path}/{index}/matchFields", "value": [requirement]}
            )
    return patch


def _escape(key: str) -> str:
    """A map key as a JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")
