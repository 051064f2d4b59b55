"""The `berth.sh/migrating` label on namespaces, as a pure decision over the caches.

The webhook's namespaceSelector requires the label (manifests/webhook), so that a pod
creation anywhere else never calls it. A namespace must carry it whenever a replacement
pod created there may have to be bound to a Reservation: from the moment a Reservation
for a pod of that namespace holds its place (Available) until its replacement is recorded
as owner, or it ends. The job opens its Reservation and evicts only once its own watch
shows the label (`controller.jobs.reserve`); the API server matches the selector against
its own informer's copy of the namespace (k8s.io/apiserver, pkg/admission/plugin/webhook/
predicates/namespace/matcher.go, Matcher.GetNamespaceLabels), which the settle time
between opening and evicting leaves time to catch up.

This is the only writer of the label. It adds the label when a Reservation waits for its
replacement there, and removes it only when no Reservation of the namespace is live and
unowned at all (Pending ones included): a label removed on the strength of a cache that
has not seen a new Reservation yet would have to outlast that Reservation's scheduling,
its opening and the settle time before it could matter, and the job looks at the label
again right before it evicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from berth import protocol
from berth.api import ReservationPhase, keys
from berth.kube.client import NAMESPACES
from controller.actions import Patch, Plan

Object = Mapping[str, Any]

LIVE = (ReservationPhase.PENDING, ReservationPhase.AVAILABLE)


@dataclass(frozen=True)
class LabelRefused:
    """The API server's last answer when it refused a namespace the label for good (an
    admission policy, RBAC): `why`, its status code and words; `waiting`, the UIDs of the
    Reservations that waited there for their replacements when it was asked (an answer
    given for others, before a policy changed, is none for a Reservation placed since:
    the namespace's next pass asks again)."""

    why: str
    waiting: frozenset[str]


def _unowned(reservation: Object) -> bool:
    return protocol.phase(reservation) in LIVE and not protocol.owner_uids(reservation)


def waits_for_replacement(reservation: Object) -> bool:
    """The Reservation holds its place, and no replacement has been recorded as its owner
    yet: a pod created in its namespace may be the one to bind to it."""
    return (
        _unowned(reservation)
        and protocol.phase(reservation) == ReservationPhase.AVAILABLE
        and protocol.node_of(reservation) is not None
    )


def is_labelled(namespace: Object | None) -> bool:
    return namespace is not None and protocol.labels_of(namespace).get(keys.MIGRATING_LABEL) == (
        "true"
    )


def decide(namespace: Object | None, reservations: Iterable[Object]) -> Plan:
    """Add or remove the label on `namespace`, given the Reservations whose replacements
    are created there (`protocol.placeholder_namespace`)."""
    if namespace is None:
        return Plan()
    present = keys.MIGRATING_LABEL in protocol.labels_of(namespace)
    mine = list(reservations)
    name = str(namespace["metadata"]["name"])
    terminating = bool(namespace["metadata"].get("deletionTimestamp"))
    if any(waits_for_replacement(r) for r in mine) and not terminating:
        if is_labelled(namespace):
            return Plan()
        return Plan().then(label(name, "true"))
    if present and not any(_unowned(r) for r in mine):
        return Plan().then(label(name, None))
    return Plan()


def adds_label(plan: Plan) -> bool:
    """Whether `plan` sets the label (rather than removing it, or doing nothing)."""
    return any(
        isinstance(action, Patch)
        and action.resource == NAMESPACES
        and action.patch["metadata"]["labels"].get(keys.MIGRATING_LABEL) == "true"
        for action in plan.actions
    )


def label(name: str, value: str | None) -> Patch:
    """Set (or, with None, remove) the label: a merge patch touches no other label."""
    return Patch(NAMESPACES, name, {"metadata": {"labels": {keys.MIGRATING_LABEL: value}}})
