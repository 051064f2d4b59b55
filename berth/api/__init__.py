"""Berth's API: PodMigrationJob and Reservation in `scheduling.koordinator.sh/v1alpha1`.

Pydantic models are the single definition of both kinds: the controller, the webhook and
the extender read and write objects through them, and `berth.crds` generates the
CustomResourceDefinitions from them.
"""

from berth.api.duration import Duration, format_duration, go_form, is_zero, parse_duration
from berth.api.meta import (
    API_VERSION,
    GROUP,
    VERSION,
    ApiModel,
    Condition,
    ConditionStatus,
    LabelSelector,
    LabelSelectorOperator,
    LabelSelectorRequirement,
    ObjectReference,
)
from berth.api.podmigrationjob import (
    ALREADY_MIGRATING,
    LEGACY_SUCCEEDED,
    SUCCEEDED_PHASES,
    TERMINAL_PHASES,
    PodMigrateReservationOptions,
    PodMigrationJob,
    PodMigrationJobConditionType,
    PodMigrationJobMode,
    PodMigrationJobPhase,
    PodMigrationJobPreemptedReservation,
    PodMigrationJobPreemptionOptions,
    PodMigrationJobReason,
    PodMigrationJobSpec,
    PodMigrationJobStatus,
)
from berth.api.reservation import (
    ControllerReference,
    Reservation,
    ReservationConditionType,
    ReservationOwner,
    ReservationPhase,
    ReservationReason,
    ReservationSpec,
    ReservationStatus,
    ReservationTemplateSpec,
)

__all__ = [
    "ALREADY_MIGRATING",
    "API_VERSION",
    "GROUP",
    "LEGACY_SUCCEEDED",
    "SUCCEEDED_PHASES",
    "TERMINAL_PHASES",
    "VERSION",
    "ApiModel",
    "Condition",
    "ConditionStatus",
    "ControllerReference",
    "Duration",
    "LabelSelector",
    "LabelSelectorOperator",
    "LabelSelectorRequirement",
    "ObjectReference",
    "PodMigrateReservationOptions",
    "PodMigrationJob",
    "PodMigrationJobConditionType",
    "PodMigrationJobMode",
    "PodMigrationJobPhase",
    "PodMigrationJobPreemptedReservation",
    "PodMigrationJobPreemptionOptions",
    "PodMigrationJobReason",
    "PodMigrationJobSpec",
    "PodMigrationJobStatus",
    "Reservation",
    "ReservationConditionType",
    "ReservationOwner",
    "ReservationPhase",
    "ReservationReason",
    "ReservationSpec",
    "ReservationStatus",
    "ReservationTemplateSpec",
    "format_duration",
    "go_form",
    "is_zero",
    "parse_duration",
]
