"""PodMigrationJob: a request to move one pod, carried out by the controller.

The API is the PodMigrationJob design field for field, so the YAML of its documentation
works unchanged. Berth adds the condition type BoundPodReady and the reasons after the
design's list in `PodMigrationJobReason`. A job is Pending until arbitration admits it,
Running while it reserves, evicts and waits for the replacement, and then Succeed,
Failed or Aborted for good. Success is spelled `Succeed`, as in the design; `Succeeded`,
which earlier Berth releases wrote, is still accepted and read as `Succeed`.

`spec.mode` has no schema default, as in the design: a job that sets none runs in the
controller's `defaultJobMode`, which the controller then records on the job.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema

from berth.api.duration import Duration
from berth.api.meta import (
    LIST_MAP_BY_TYPE,
    ApiModel,
    Condition,
    KubeObject,
    ObjectReference,
    Rule,
    cel,
    duration_rules,
)
from berth.api.reservation import ReservationTemplateSpec


class PodMigrationJobMode(StrEnum):
    RESERVATION_FIRST = "ReservationFirst"
    """Reserve capacity elsewhere, then evict: the replacement is sure of a place."""
    EVICT_DIRECTLY = "EvictDirectly"
    """Evict at once; the replacement takes its chances with the scheduler."""


class PodMigrationJobPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEED = "Succeed"
    FAILED = "Failed"
    ABORTED = "Aborted"


LEGACY_SUCCEEDED = "Succeeded"
"""How earlier Berth releases spelled the succeeded phase. A job stored then keeps it (a
finished job's phase never changes), so it is read as `Succeed`; Berth never writes it."""

SUCCEEDED_PHASES: frozenset[str] = frozenset({PodMigrationJobPhase.SUCCEED, LEGACY_SUCCEEDED})
"""The phases of a job that succeeded, either spelling."""

TERMINAL_PHASES: frozenset[str] = SUCCEEDED_PHASES | {
    PodMigrationJobPhase.FAILED,
    PodMigrationJobPhase.ABORTED,
}
"""Phases a job never leaves."""


def _read_phase(value: object) -> object:
    return PodMigrationJobPhase.SUCCEED if value == LEGACY_SUCCEEDED else value


JobPhase = Annotated[
    PodMigrationJobPhase,
    BeforeValidator(_read_phase),
    # The API server accepts the old spelling too, so a job stored with it stays valid.
    WithJsonSchema({"type": "string", "enum": [*map(str, PodMigrationJobPhase), LEGACY_SUCCEEDED]}),
]
"""A job's phase; `Succeeded` reads as `Succeed`."""


class PodMigrationJobConditionType(StrEnum):
    RESERVATION_CREATED = "ReservationCreated"
    RESERVATION_SCHEDULED = "ReservationScheduled"
    PREEMPTION = "Preemption"
    EVICTION = "Eviction"
    POD_SCHEDULED = "PodScheduled"
    POD_BOUND_RESERVATION = "PodBoundReservation"
    RESERVATION_BOUND = "ReservationBound"
    BOUND_POD_READY = "BoundPodReady"


ALREADY_MIGRATING = "is already being migrated by another job"
"""In the message of a job arbitration failed (ForbiddenMigratePod) because another job
not finished migrates its pod: the eviction webhook reads it to keep answering 429."""


def already_migrating(pod_key: str, job: str) -> str:
    """The message of a job arbitration failed because job `job` migrates its pod."""
    return f"pod {pod_key} {ALREADY_MIGRATING} (PodMigrationJob {job})"


_MIGRATING_JOB = re.compile(re.escape(ALREADY_MIGRATING) + r" \(PodMigrationJob ([a-z0-9.-]+)\)$")


def migrating_job(message: str) -> str | None:
    """The job `already_migrating` names in `message` (None: none named; a message of an
    earlier version names none)."""
    found = _MIGRATING_JOB.search(message)
    return found.group(1) if found else None


class PodMigrationJobReason(StrEnum):
    """Every reason Berth writes on a job: `status.reason`, its conditions' reasons, and
    the reasons of its events. The design's list first, then Berth's own."""

    TIMEOUT = "Timeout"
    FAILED_CREATE_RESERVATION = "FailedCreateReservation"
    UNSCHEDULABLE = "Unschedulable"
    MISSING_POD = "MissingPod"
    MISSING_RESERVATION = "MissingReservation"
    PREEMPTING = "Preempting"
    PREEMPT_COMPLETE = "PreemptComplete"
    EVICTING = "Evicting"
    FAILED_EVICT = "FailedEvict"
    EVICT_COMPLETE = "EvictComplete"
    WAIT_FOR_POD_BIND_RESERVATION = "WaitForPodBindReservation"
    WAIT_FOR_BOUND_POD_READY = "WaitForBoundPodReady"
    # Berth's: how a job ends
    RESERVATION_EXPIRED = "ReservationExpired"
    """The Reservation ended before the pod was evicted."""
    RESERVATION_NOT_USED = "ReservationNotUsed"
    """The replacement was created without claiming the Reservation (webhook down?)."""
    RESERVATION_LOST = "ReservationLost"
    """The Reservation's node was deleted after the eviction, before the replacement was
    bound there: the replacement the webhook tied to that node is deleted, so that its
    workload creates one that can run elsewhere."""
    RESERVATION_OWNER_GONE = "ReservationOwnerGone"
    """The replacement recorded as the Reservation's owner was deleted before it was
    bound: the place is no longer held for anyone."""
    NAMESPACE_NOT_LABELLED = "NamespaceNotLabelled"
    """The API server refused for good to label the namespace of the pod's replacement
    berth.sh/migrating (an admission policy, RBAC): without it the webhook is not called
    for pods created there, so nothing is evicted."""
    WORKLOAD_SCALED_DOWN = "WorkloadScaledDown"
    """After the eviction, before any replacement took the Reservation, the pod's workload
    was scaled so that it replaces the pod no more (to zero, or a StatefulSet below the
    pod's ordinal), or deleted: the place is released rather than held for nobody until
    the TTL."""
    FORBIDDEN_MIGRATE_POD = "ForbiddenMigratePod"
    """Arbitration: the pod may never be migrated; the message names the rule (for a pod
    another job is migrating, it contains `ALREADY_MIGRATING`)."""
    NOT_ADMITTED = "NotAdmitted"
    """The job was Running without arbitration's admission mark (its phase was written by
    someone else): it is Pending again and arbitration decides."""
    FORBIDDEN_TEMPLATE = "ForbiddenTemplate"
    """reservationOptions.template asks for more than the pod has; the message names the
    field."""
    INVALID_SPEC = "InvalidSpec"
    """A field the schema lets in cannot be carried out as written (a ttl beyond a Go
    duration, deleteOptions of the wrong type); the message names the field."""
    FORBIDDEN_PREEMPTION = "ForbiddenPreemption"
    """reservationOptions.preemptionOptions is set with a reservationRef: only the
    placeholder of a Reservation the job creates may preempt."""
    COMPLETE = "Complete"
    """The migration succeeded (`status.status` and the last event)."""
    # Berth's: the reasons of conditions that hold (status True)
    CREATED = "Created"
    SCHEDULED = "Scheduled"
    BOUND = "Bound"
    READY = "Ready"
    # Berth's: why arbitration keeps a Pending job waiting (each names its rule)
    BLOCKED_BY_PDB = "BlockedByPDB"
    """Also the Eviction condition's reason when the Eviction API answers 429."""
    DRY_RUN = "DryRun"
    NODE_FIT = "NodeFit"
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    EXPECTED_REPLICAS = "ExpectedReplicas"
    MAX_MIGRATING_PER_WORKLOAD = "MaxMigratingPerWorkload"
    MAX_UNAVAILABLE_PER_WORKLOAD = "MaxUnavailablePerWorkload"
    MAX_MIGRATING_PER_NODE = "MaxMigratingPerNode"
    MAX_MIGRATING_PER_NAMESPACE = "MaxMigratingPerNamespace"
    MAX_MIGRATING_GLOBALLY = "MaxMigratingGlobally"
    OBJECT_LIMITERS = "ObjectLimiters"
    EVICT_QPS = "EvictQPS"
    FLOW_CONTROL_QPS = "FlowControlQPS"
    PRIORITY_THRESHOLD = "PriorityThreshold"
    """priorityThreshold.name names a PriorityClass that does not exist (a typo, or a
    class deleted and made again): no pod is judged against it until it does."""
    # Berth's: a Warning event
    WRITE_REFUSED = "WriteRefused"
    """A write of the job's pass (its record, its status, a patch of its pod or
    Reservation) was refused in a way that a retry alone will not change (400, 403,
    422: a policy, RBAC, validation); it is tried again with back-off, and the event
    names the write and the API server's answer."""


class PodMigrationJobPreemptionOptions(ApiModel):
    """Set (even empty: it has no fields yet), the placeholder of the Reservation the job
    creates runs under the pod's own PriorityClass, so kube-scheduler may preempt pods of
    lower priority to place it (never past a PodDisruptionBudget while Berth's extender
    answers); unset, the placeholder never preempts. With a reservationRef the job fails
    with ForbiddenPreemption."""


def _required(reference: str, field: str) -> Rule:
    """A rule on the object reference `reference` that its `field` is set and not empty."""
    # CEL reaches a property named like a CEL keyword (namespace) as __namespace__.
    name = "__namespace__" if field == "namespace" else field
    return Rule(
        f"has(self.{name}) && self.{name} != ''",
        f"{reference}.{field} is required",
        field_path=f".{field}",
        reason="FieldValueRequired",
    )


REF_FIXED = "reservationOptions.reservationRef cannot be changed or removed once set"
"""The job's Reservation, once named, stays its own: released when the job ends, never
left holding capacity for a name that no longer points at it."""


class PodMigrateReservationOptions(ApiModel):
    """How the capacity for the migrated pod is reserved."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            Rule(
                "!has(oldSelf.reservationRef) || has(self.reservationRef)",
                REF_FIXED,
                field_path=".reservationRef",
            )
        )
    )

    reservation_ref: ObjectReference | None = Field(
        default=None,
        json_schema_extra=cel(
            _required("reservationRef", "name"), Rule("self == oldSelf", REF_FIXED)
        ),
    )
    """An existing Reservation to use; when unset, the controller creates one and records
    it here. Once set, it never changes."""
    template: ReservationTemplateSpec | None = None
    """Additions to the Reservation the controller creates from the pod."""
    preemption_options: PodMigrationJobPreemptionOptions | None = None
    """Set, the placeholder may preempt pods of lower priority than the pod's own."""


class PodMigrationJobSpec(ApiModel):
    """Which pod to move and how."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            # `self == oldSelf` on the field itself only runs when both are set.
            Rule(
                "!has(oldSelf.mode) || has(self.mode)",
                "mode cannot be removed once set",
                field_path=".mode",
            ),
            Rule(
                "!has(oldSelf.reservationOptions) || "
                "!has(oldSelf.reservationOptions.reservationRef) || has(self.reservationOptions)",
                REF_FIXED,
                field_path=".reservationOptions",
            ),
        )
    )

    paused: bool = False
    """While true the controller leaves the job alone; the ttl still runs."""
    ttl: Duration | None = Field(default=None, json_schema_extra=cel(*duration_rules("ttl")))
    """How long the job may take, as a Go duration such as 5m; unset or 0: no limit."""
    mode: PodMigrationJobMode | None = Field(
        default=None, json_schema_extra=cel(Rule("self == oldSelf", "mode is immutable"))
    )
    """ReservationFirst or EvictDirectly. Unset, the job runs in the controller's
    defaultJobMode (ReservationFirst unless configured), which the controller records
    here when it first sees the job; once set, it never changes."""
    pod_ref: ObjectReference = Field(
        json_schema_extra=cel(
            _required("podRef", "name"),
            _required("podRef", "namespace"),
            Rule("self == oldSelf", "podRef is immutable"),
        )
    )
    """The pod to migrate, by namespace and name."""
    reservation_options: PodMigrateReservationOptions | None = None
    """How the capacity for the pod is reserved."""
    delete_options: KubeObject | None = None
    """Delete options for evicting the pod, such as gracePeriodSeconds."""


class PodMigrationJobPreemptedReservation(ApiModel):
    """A Reservation made for a pod that the migration preempted."""

    namespace: str | None = None
    """Namespace of the Reservation."""
    name: str | None = None
    """Name of the Reservation."""
    node_name: str | None = None
    """Node the Reservation was scheduled to."""
    phase: str | None = None
    """Phase of the Reservation."""
    preempted_pod_ref: ObjectReference | None = None
    """The preempted pod."""
    pods_ref: list[ObjectReference] | None = None
    """Pods created after the preemption."""


_TERMINAL = ", ".join(f"'{phase}'" for phase in sorted(TERMINAL_PHASES))


class PodMigrationJobStatus(ApiModel):
    """Where the job stands, written by the controller (or by a user aborting it)."""

    phase: JobPhase = Field(
        default=PodMigrationJobPhase.PENDING,
        json_schema_extra=cel(
            Rule(
                f"!(oldSelf in [{_TERMINAL}]) || self == oldSelf",
                "phase cannot change once it is Succeed, Failed or Aborted",
            ),
        ),
    )
    """Pending, Running, Succeed, Failed or Aborted; set Failed or Aborted to abort.
    Succeeded, written by earlier Berth releases, means Succeed."""
    status: str | None = None
    """The step the job is at, e.g. ReservationCreated or Complete."""
    reason: str | None = None
    """Why the job is in this state, one CamelCase word."""
    message: str | None = None
    """Why the job is in this state, for humans."""
    conditions: list[Condition[PodMigrationJobConditionType]] | None = Field(
        default=None, json_schema_extra=LIST_MAP_BY_TYPE
    )
    """What happened so far, one entry per condition type."""
    node_name: str | None = None
    """Node the replacement pod was placed on."""
    pod_ref: ObjectReference | None = None
    """The replacement pod."""
    preempted_pods_ref: list[ObjectReference] | None = None
    """Pods kube-scheduler preempted to place the Reservation's placeholder."""
    preempted_pods_reservation: list[PodMigrationJobPreemptedReservation] | None = None
    """Reservations made for the preempted pods (Berth makes none: always empty)."""


class PodMigrationJob(ApiModel):
    """A request to move one pod to another node safely."""

    api_version: Literal["scheduling.koordinator.sh/v1alpha1"] = (
        "scheduling.koordinator.sh/v1alpha1"
    )
    kind: Literal["PodMigrationJob"] = "PodMigrationJob"
    metadata: KubeObject = Field(default_factory=dict)
    spec: PodMigrationJobSpec
    """Which pod to move and how."""
    status: PodMigrationJobStatus = Field(
        # The API server drops a created object's status (a subresource); defaulting it
        # to {} on every read gives a job its phase Pending until the controller writes,
        # as the seeds' `status: {phase: Pending}` says.
        default_factory=PodMigrationJobStatus,
        json_schema_extra={"default": {}},
    )
    """Written by the controller."""
