"""Reservation: capacity held on one node for a pod that does not exist yet.

Berth makes a Reservation real capacity that kube-scheduler already accounts for: the
controller runs a placeholder pod built from `spec.template`, and hands its place to the
first replacement pod matching `spec.owners`. The API is the one of the PodMigrationJob
design, reduced to the fields Berth acts on.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AwareDatetime, ConfigDict, Field

from berth.api.duration import Duration
from berth.api.meta import (
    LIST_MAP_BY_TYPE,
    ApiModel,
    Condition,
    KubeObject,
    LabelSelector,
    ObjectReference,
    Rule,
    cel,
    duration_rules,
)


class ReservationPhase(StrEnum):
    PENDING = "Pending"
    """Waiting for its placeholder to be scheduled."""
    AVAILABLE = "Available"
    """Holding capacity on `status.nodeName`."""
    SUCCEEDED = "Succeeded"
    """Its capacity went to an owner."""
    FAILED = "Failed"
    """Expired or released before an owner used it."""


class ReservationConditionType(StrEnum):
    SCHEDULED = "Scheduled"
    READY = "Ready"


class ReservationReason(StrEnum):
    """Why a Reservation's condition is as it is, and the reasons of its events."""

    SCHEDULED = "Scheduled"
    """Scheduled=True: its placeholder is bound to a node."""
    UNSCHEDULABLE = "Unschedulable"
    """Scheduled=False: the scheduler has no node for its placeholder (its message says why)."""
    LOST = "Lost"
    """Scheduled=False: its placeholder disappeared; a new one is created."""
    FAILED_CREATE = "FailedCreate"
    """Scheduled=False, and a Warning event: the API server refused to create its
    placeholder (a ResourceQuota, Pod Security, an admission webhook): tried again, with
    a growing delay, until it is created or the Reservation expires."""
    PRIORITY_CLASS_MISMATCH = "PriorityClassMismatch"
    """Scheduled=False, and a Warning event: the PriorityClass its placeholder must run
    under exists with another value or a preemptionPolicy other than Never; no placeholder
    is created until it is fixed."""
    AVAILABLE = "Available"
    """Ready=True: capacity is held on its node."""
    ALLOCATED = "Allocated"
    """Ready=False: its owner is bound to the node (phase Succeeded)."""
    EXPIRED = "Expired"
    """Ready=False: its ttl or expires passed (phase Failed)."""
    OWNER_GONE = "OwnerGone"
    """Ready=False: the owner was deleted before it was bound (phase Failed)."""
    RELEASED = "Released"
    """Ready=False: its job ended (phase Failed)."""
    INVALID = "Invalid"
    """Ready=False: its spec, which the schema lets in, holds no place Berth can make (a
    template without containers, an unreadable quantity or ttl) (phase Failed)."""
    RESERVATION_EXPIRED = "ReservationExpired"
    """Event: it expired and its capacity is released."""
    RESERVATION_CLAIMED = "ReservationClaimed"
    """Event: a replacement pod claimed it and is recorded as its owner."""
    RESERVATION_CLAIM_REFUSED = "ReservationClaimRefused"
    """Event: several pods carry its claim token; none is recorded as owner."""
    RESERVATION_CLAIM_RELEASED = "ReservationClaimReleased"
    """Event: no pod took its claim in time; the claim is removed for another replacement."""
    RESERVATION_HANDOVER = "ReservationHandover"
    """Event: its placeholder is gone and the owner's scheduling gate removed."""
    RESERVATION_RELEASED = "ReservationReleased"
    """Event: it ended while a pod was gated on it; the gate is removed."""
    RESERVATION_GATE_REMOVED = "ReservationGateRemoved"
    """Event on a pod gated by Berth that no live Reservation waits for: gate removed."""
    STRANDED_POD_DELETED = "StrandedPodDeleted"
    """Event on a pod deleted because it took the Reservation and the node its affinity
    ties it to was deleted before it was bound there."""
    PINNED_POD_DELETED = "PinnedPodDeleted"
    """Event on a pod deleted because it took a Reservation, which tied it to the
    Reservation's node, and the scheduler keeps refusing it that node although no live
    Reservation holds its claim any more (its job ended)."""
    STRAY_PLACEHOLDER_DELETED = "StrayPlaceholderDeleted"
    """Event on a pod deleted because its controller reference names a Reservation whose
    recorded placeholder it is not."""


class ControllerReference(ApiModel):
    """An owner reference to a workload controller, with the namespace it lives in."""

    api_version: str
    """API version of the controller."""
    kind: str
    """Kind of the controller, e.g. ReplicaSet."""
    name: str
    """Name of the controller."""
    uid: str
    """UID of the controller."""
    controller: bool | None = None
    """Whether the reference is the managing controller."""
    block_owner_deletion: bool | None = None
    """As in an owner reference."""
    namespace: str | None = None
    """Namespace of the controller."""


class ReservationOwner(ApiModel):
    """Which pods may use a Reservation; every selector that is set must match."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            Rule(
                "has(self.object) || has(self.controller) || has(self.labelSelector)",
                "each of owners needs object, controller or labelSelector",
            ),
        )
    )

    object: ObjectReference | None = None
    """One specific pod."""
    controller: ControllerReference | None = None
    """Pods of this controller."""
    label_selector: LabelSelector | None = None
    """Pods with these labels."""


class ReservationSpec(ApiModel):
    """What to reserve, for whom, and for how long."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            Rule(
                "!(has(self.ttl) && has(self.expires))",
                "set ttl or expires, not both",
                field_path=".expires",
                reason="FieldValueForbidden",
            ),
        )
    )

    template: KubeObject | None = None
    """Pod template whose scheduling constraints and requests the placeholder copies."""
    owners: list[ReservationOwner] | None = None
    """Pods allowed to use the reserved capacity; any one of the entries may match."""
    ttl: Duration | None = Field(default=None, json_schema_extra=cel(*duration_rules("ttl")))
    """How long the Reservation lives after creation, as a Go duration."""
    expires: AwareDatetime | None = None
    """When the Reservation expires; the alternative to ttl."""
    allocate_once: bool = True
    """Whether the capacity goes to one pod only."""


MAX_RESOURCES = 64
"""Resource names a Reservation's allocatable may list."""
MAX_QUANTITY_LENGTH = 64
"""Characters of one quantity."""


class ReservationStatus(ApiModel):
    """Where the Reservation stands, as the controller last observed it."""

    phase: ReservationPhase = ReservationPhase.PENDING
    """Pending, Available, Succeeded or Failed."""
    node_name: str | None = None
    """Node the capacity is held on."""
    conditions: list[Condition[ReservationConditionType]] | None = Field(
        default=None, json_schema_extra=LIST_MAP_BY_TYPE
    )
    """Scheduled and Ready."""
    current_owners: list[ObjectReference] | None = None
    """Pods that hold the capacity now."""
    allocatable: dict[str, Annotated[str, Field(max_length=MAX_QUANTITY_LENGTH)]] | None = Field(
        default=None,
        max_length=MAX_RESOURCES,
        json_schema_extra=cel(
            Rule(
                "self.all(name, isQuantity(self[name]))",
                "allocatable values must be quantities, such as 1500m or 2Gi",
            )
        ),
    )
    """Resources held, as quantities."""
    # Checked by the API server, so that no cache meets a value it cannot parse; the
    # bounds keep the rule's estimated cost within what the API server allows.


class ReservationTemplateSpec(ApiModel):
    """Metadata and spec for a Reservation that a PodMigrationJob creates."""

    metadata: KubeObject | None = None
    """Labels and annotations for the Reservation."""
    spec: ReservationSpec | None = None
    """Merged with what the controller derives from the pod being migrated."""


class Reservation(ApiModel):
    """Capacity on one node, held for the pods named by its owners."""

    api_version: Literal["scheduling.koordinator.sh/v1alpha1"] = (
        "scheduling.koordinator.sh/v1alpha1"
    )
    kind: Literal["Reservation"] = "Reservation"
    metadata: KubeObject = Field(default_factory=dict)
    spec: ReservationSpec = Field(
        json_schema_extra=cel(
            Rule(
                "has(self.template)",
                "template is required",
                field_path=".template",
                reason="FieldValueRequired",
            ),
            Rule(
                "has(self.owners) && size(self.owners) > 0",
                "owners must list at least one owner",
                field_path=".owners",
                reason="FieldValueRequired",
            ),
        )
    )
    """What to reserve and for whom."""
    status: ReservationStatus = Field(default_factory=ReservationStatus)
    """Written by the controller."""
