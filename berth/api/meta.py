"""The conventions every Berth API type shares, and the few core types it models.

The models are the one source of truth for the wire format: `berth.crds` derives the
CustomResourceDefinitions from them, including the CEL rules attached here with `cel()`.
Core Kubernetes types that Berth only passes through (pod templates, object metadata,
delete options) stay free-form `KubeObject` dicts: re-modelling core v1 would tie Berth to
one Kubernetes version and add nothing the API server does not already check. The small
core types Berth reads field by field (object references, label selectors, conditions)
are modelled.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from enum import StrEnum
from typing import Annotated, Any, Generic, Literal, Self, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from berth.api.duration import DURATION_PATTERN

GROUP = "scheduling.koordinator.sh"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


class ApiModel(BaseModel):
    """Base of the API types: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        # The API server prunes fields its schema (generated from these models) does not
        # know, so an unknown key can only be a typo in Python code: fail loudly.
        extra="forbid",
        use_attribute_docstrings=True,  # field docstrings become the CRD's descriptions
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as JSON for the API server: camelCase keys, unset fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


KubeObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""A core Kubernetes object (pod template, metadata, delete options) kept as it is."""


@dataclass(frozen=True)
class Rule:
    """One CEL validation rule; `field_path` and `reason` say where and how it reports."""

    expression: str
    message: str
    _: KW_ONLY
    field_path: str | None = None
    reason: Literal["FieldValueRequired", "FieldValueForbidden"] | None = None


def cel(*rules: Rule) -> JsonDict:
    """Schema extras that make the API server check `rules` (`x-kubernetes-validations`)."""
    validations: list[Any] = []
    for rule in rules:
        entry: dict[str, str] = {"rule": rule.expression, "message": rule.message}
        if rule.field_path:
            entry["fieldPath"] = rule.field_path
        if rule.reason:
            entry["reason"] = rule.reason
        validations.append(entry)
    return {"x-kubernetes-validations": validations}


def duration_rules(field: str) -> tuple[Rule, Rule]:
    """The CEL twin of `berth.api.duration.Duration`'s check, for the field named `field`."""
    return (
        Rule(
            f"self.matches('{DURATION_PATTERN}')",
            f"{field} must be a Go duration such as 90s, 5m or 1h30m",
        ),
        Rule("!self.startsWith('-')", f"{field} must not be negative"),
    )


LIST_MAP_BY_TYPE: JsonDict = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}
"""Schema extras for a conditions list: at most one entry per type, merged by type."""


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


ConditionType = TypeVar("ConditionType", bound=StrEnum)


class Condition(ApiModel, Generic[ConditionType]):
    """An observation of one aspect of an object's state."""

    type: ConditionType
    """What the condition is about."""
    status: ConditionStatus
    """True, False or Unknown."""
    last_probe_time: AwareDatetime | None = None
    """When the condition was last checked."""
    last_transition_time: AwareDatetime | None = None
    """When the status last changed."""
    reason: str | None = None
    """Why the status last changed, one CamelCase word."""
    message: str | None = None
    """Why the status last changed, for humans."""


class ObjectReference(ApiModel):
    """A reference to another object (core v1 ObjectReference)."""

    api_version: str | None = None
    """API version of the referent."""
    kind: str | None = None
    """Kind of the referent."""
    namespace: str | None = None
    """Namespace of the referent."""
    name: str | None = None
    """Name of the referent."""
    uid: str | None = None
    """UID of the referent."""
    resource_version: str | None = None
    """Resource version of the referent the reference was made from."""
    field_path: str | None = None
    """A field of the referent, when the reference points inside it."""


class LabelSelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


_NEEDS_VALUES = (LabelSelectorOperator.IN, LabelSelectorOperator.NOT_IN)


class LabelSelectorRequirement(ApiModel):
    """One requirement of a label selector: `key operator values`."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            Rule(
                "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0)"
                " : (!has(self.values) || size(self.values) == 0)",
                "matchExpressions values must be set for In and NotIn and empty otherwise",
                field_path=".values",
            ),
        )
    )

    key: str
    """The label key."""
    operator: LabelSelectorOperator
    """How the key's value relates to `values`."""
    values: list[str] | None = None
    """Label values; required by In and NotIn, empty for Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _values_fit_operator(self) -> Self:
        if (self.operator in _NEEDS_VALUES) != bool(self.values):
            needs = "needs values" if self.operator in _NEEDS_VALUES else "takes no values"
            raise ValueError(f"operator {self.operator} {needs}")
        return self


class LabelSelector(ApiModel):
    """A label query; all of its requirements must hold (meta v1 LabelSelector)."""

    match_labels: dict[str, str] | None = None
    """Labels that must be present with exactly these values."""
    match_expressions: list[LabelSelectorRequirement] | None = None
    """Further requirements on labels."""
