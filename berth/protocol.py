"""The handshake between controller, webhook and extender, read off API objects.

The three components share nothing but the API server, so every step of a migration is
written on the objects themselves and read back with these functions:

1. The controller creates Reservation R (owners = the pod's controller, annotation
   `berth.sh/workload` = its top-level workload) and a placeholder pod labelled
   `berth.sh/reservation=R`. When the placeholder is bound, R is Available on that node.
2. Just before evicting, the controller annotates R `berth.sh/consumable: "true"`.
3. The webhook, on a matching pod CREATE, writes a fresh token into R's `berth.sh/claim`
   (conditional on R's resourceVersion, so one pod wins) and the same token on the pod,
   with the scheduling gate and a required node affinity to R's node.
4. The controller finds the gated pod carrying R's token, records it in
   `R.status.currentOwners`, deletes the placeholder, and once it is gone removes the gate.
5. The extender lets R's recorded owner (and no other pod) use R's node, and keeps R's
   capacity for it between the placeholder's deletion and the owner's binding.

Objects are the API server's dicts; these functions are pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from berth.api import ReservationPhase, keys
from berth.scheduling import selector_matches

Object = Mapping[str, Any]


def annotations_of(obj: Object) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("annotations") or {}


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


def claim_of(reservation: Object) -> str | None:
    return annotations_of(reservation).get(keys.CLAIM) or None


def is_consumable(reservation: Object) -> bool:
    """Available, opened for its replacement, and not yet claimed by any pod."""
    return (
        phase(reservation) == ReservationPhase.AVAILABLE
        and node_of(reservation) is not None
        and annotations_of(reservation).get(keys.CONSUMABLE) == "true"
        and claim_of(reservation) is None
    )


def owner_uids(reservation: Object) -> set[str]:
    """UIDs of the pods recorded as holding the capacity (status.currentOwners)."""
    owners = reservation.get("status", {}).get("currentOwners") or []
    return {str(owner["uid"]) for owner in owners if owner.get("uid")}


def template_namespace(reservation: Object) -> str | None:
    template = reservation.get("spec", {}).get("template") or {}
    namespace = (template.get("metadata") or {}).get("namespace")
    return str(namespace) if namespace else None


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


def is_replicaset(reference: Mapping[str, Any]) -> bool:
    """Whether an owner reference names an apps/v1 ReplicaSet."""
    return reference.get("apiVersion") == "apps/v1" and reference.get("kind") == "ReplicaSet"


def _same_controller(wanted: Object, controller: Object) -> bool:
    """The same UID, and the same kind and name where the owner records them: a pod
    that names another workload's UID under its own kind or name is not that workload."""
    return wanted.get("uid") == controller.get("uid") and all(
        wanted.get(key) in (None, controller.get(key)) for key in ("kind", "name")
    )


def matches_owner(reservation: Object, pod: Object, *, workload_uid: str | None) -> bool:
    """Whether `pod` may use `reservation`.

    Its controller must be one of the Reservation's controller owners, or its top-level
    workload (`workload_uid`, e.g. the Deployment above a new ReplicaSet) must be the one
    the Reservation was made for. Object and label-selector owners match as in the API.
    """
    namespace = pod.get("metadata", {}).get("namespace")
    expected_namespace = template_namespace(reservation)
    if expected_namespace and namespace != expected_namespace:
        return False
    controller = controller_of(pod)
    reserved_workload = annotations_of(reservation).get(keys.WORKLOAD)
    if workload_uid and reserved_workload == workload_uid:
        return True
    for owner in reservation.get("spec", {}).get("owners") or []:
        wanted = owner.get("controller")
        if wanted and controller and _same_controller(wanted, controller):
            return True
        obj = owner.get("object")
        if (
            obj
            and obj.get("name") == pod.get("metadata", {}).get("name")
            and obj.get("namespace", namespace) == namespace
        ):
            return True
        selector = owner.get("labelSelector")
        # An empty selector would match every pod: an owner must name its pods.
        if (
            selector
            and (selector.get("matchLabels") or selector.get("matchExpressions"))
            and selector_matches(selector, labels_of(pod))
        ):
            return True
    return False


def top_level_workload(controller: Mapping[str, Any], replicaset: Object | None) -> str:
    """UID of the workload a pod belongs to: for a pod of ReplicaSet `replicaset`, the
    ReplicaSet's own controller (a Deployment's UID stays the same across a rollout);
    otherwise the pod's controller itself."""
    if replicaset is not None and replicaset["metadata"].get("uid") == controller.get("uid"):
        above = controller_of(replicaset)
        if above is not None:
            return str(above["uid"])
    return str(controller["uid"])


# ----- pods -------------------------------------------------------------------------------


def placeholder_reservation(pod: Object) -> str | None:
    """The Reservation a placeholder pod holds capacity for (None for any other pod)."""
    return labels_of(pod).get(keys.RESERVATION_LABEL) or None


def pod_claim(pod: Object) -> str | None:
    return annotations_of(pod).get(keys.CLAIM) or None


def is_gated(pod: Object) -> bool:
    """Held by Berth's scheduling gate."""
    gates = pod.get("spec", {}).get("schedulingGates") or []
    return any(gate.get("name") == keys.RESERVATION_GATE for gate in gates)


def is_terminal_pod(pod: Object) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def is_ready(pod: Object) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return pod.get("status", {}).get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )
