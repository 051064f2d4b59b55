"""MigrationControllerArgs: the controller's configuration, and loading it from a file.

The keys, their camelCase names and their defaults are those of the MigrationController
(the table of its documentation and the Go struct of the PodMigrationJob design), so an
existing `args:` block works as it is. One default differs: `schedulerNames` is
`["default-scheduler", "koord-scheduler"]`, the two profiles of Berth's kube-scheduler
configuration: Berth reserves capacity through the stock kube-scheduler, which also answers
to Koordinator's scheduler name so that pods written for it keep working.
A bad file stops the controller at start with one line per problem, each naming the file
and the key, instead of surfacing later as a surprising migration.
"""

from __future__ import annotations

import difflib
import re
import typing
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from berth.api import Duration, LabelSelector, PodMigrationJobMode, format_duration
from berth.eviction import delete_options_problem
from berth.scheduling import parse_selector

DEFAULT_SCHEDULER_NAMES = ("default-scheduler", "koord-scheduler")
"""The profiles of Berth's kube-scheduler configuration (manifests/scheduler, the local
cluster): the stock name, and Koordinator's, so pods that name koord-scheduler are scheduled
by the same kube-scheduler, with the same plugins and Berth's extender."""

KIND = "MigrationControllerArgs"
API_VERSION = "descheduler/v1alpha2"


REPLACEMENT_GRACE = timedelta(minutes=1)
"""How long after a job's TTL the webhook still takes its requester's evictions of the
replacement for retries of the first eviction (`webhook.evictions.already_migrated`),
reading the finished job: the controller does not delete it before then."""


class ConfigError(Exception):
    """The controller's configuration file cannot be used; the message says why."""


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError(f"must be longer than 0s, got {format_duration(value)}")
    return value


PositiveDuration = Annotated[Duration, AfterValidator(_positive)]


def _int_or_percent(value: object) -> int | str:
    """An IntOrString as the Kubernetes API uses it: a count (5) or a percentage ("10%")."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]+%", value):
        return f"{int(value[:-1])}%"  # "00%" is 0%: by size, as 0 is
    raise ValueError(f"{value!r} is neither a non-negative integer nor a percentage like 10%")


IntOrPercent = Annotated[int | str, PlainValidator(_int_or_percent)]


HONOURED_DELETE_OPTIONS = ("gracePeriodSeconds", "propagationPolicy")
"""The fields of defaultDeleteOptions Berth passes on. A job's deleteOptions may carry
any (the seeds' free-form metav1.DeleteOptions) and the others are ignored; the
operator's own file refuses them, so that a typo or a `dryRun` is not ignored unseen."""


def _delete_options(value: dict[str, Any] | None) -> dict[str, Any] | None:
    problem = delete_options_problem(value)
    if problem:
        raise ValueError(f"defaultDeleteOptions{problem}")
    for field in value or {}:
        if field in ("apiVersion", "kind") or field in HONOURED_DELETE_OPTIONS:
            continue
        hint = difflib.get_close_matches(str(field), HONOURED_DELETE_OPTIONS, n=1, cutoff=0.6)
        raise ValueError(
            f"defaultDeleteOptions.{field}: not used by Berth, which passes on only "
            f"{' and '.join(HONOURED_DELETE_OPTIONS)}"
            + (f" (did you mean {hint[0]}?)" if hint else "")
        )
    return value


def _rate(value: object) -> float:
    """A rate per second, written as a number or, as in the Go args, a numeric string."""
    if not isinstance(value, bool) and isinstance(value, int | float | str):
        try:
            rate = float(value)
        except ValueError:
            pass
        else:
            if rate >= 0:
                return rate
    raise ValueError(f"{value!r} is not a non-negative number of operations per second")


Rate = Annotated[float, PlainValidator(_rate)]


def _label_selector_text(value: str) -> str:
    """A label selector string, read as arbitration reads it, so that a bad one stops the
    controller at start instead of failing every arbitration round."""
    parse_selector(value)
    return value


LabelSelectorText = Annotated[str, AfterValidator(_label_selector_text)]


class EvictionPolicy(StrEnum):
    EVICTION = "Eviction"
    """The Eviction API, which honours PodDisruptionBudgets."""
    DELETE = "Delete"
    """A plain delete."""
    SOFT_EVICTION = "SoftEviction"
    """Only annotate the pod (`scheduling.koordinator.sh/soft-eviction`); someone else evicts."""


class ObjectLimiterKind(StrEnum):
    WORKLOAD = "workload"


class _Args(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


class ArbitrationArgs(_Args):
    enabled: StrictBool = True
    """Whether pending jobs go through arbitration before they start."""
    interval: PositiveDuration = timedelta(milliseconds=500)
    """How often arbitration runs."""


class ObjectLimiter(_Args):
    duration: PositiveDuration
    """The sliding window."""
    max_migrating: IntOrPercent
    """How many of a workload's pods may start migrating within one window."""


SYSTEM_NAMESPACES = ("kube-system", "berth-system")
"""Namespaces Berth's webhook never sees (its namespaceSelector excludes them, so that
a webhook outage never blocks the cluster's own pods or Berth's): a replacement pod
there is never bound to a Reservation."""


class Namespaces(_Args):
    include: list[str] | None = None
    """Only these namespaces; checked before exclude."""
    exclude: list[str] | None = None
    """Never these namespaces."""

    def refuses(self, namespace: str) -> str | None:
        """Why pods of `namespace` may not migrate, or None; include is checked first."""
        if self.include and namespace not in self.include:
            return f"namespace {namespace} is not in namespaces.include"
        if self.exclude and namespace in self.exclude:
            return f"namespace {namespace} is in namespaces.exclude"
        return None


class PriorityThreshold(_Args):
    value: StrictInt | None = None
    """Only pods with a priority below this value migrate."""
    name: str | None = None
    """Only pods with a priority below this PriorityClass's migrate."""

    @model_validator(mode="after")
    def _one_of(self) -> Self:
        if self.value is not None and self.name is not None:
            raise ValueError("set value or name, not both")
        return self


class Requesters(_Args):
    users: list[str] = Field(default_factory=list)
    """User names, e.g. `system:serviceaccount:kube-system:descheduler` for a ServiceAccount."""
    groups: list[str] = Field(default_factory=list)
    """Groups, e.g. `system:serviceaccounts:kube-system` for every ServiceAccount there."""


class EvictionInterception(_Args):
    """Berth's own keys: which evictions the webhook turns into PodMigrationJobs
    (`webhook.evictions`; the webhook reads them from this same file), and how long the
    controller keeps those jobs once finished."""

    all_namespaces: StrictBool = False
    """Intercept evictions in every namespace `namespaces` allows, not only in those
    labelled `berth.sh/intercept-evictions: "true"`."""
    requesters: Requesters | None = None
    """Only evictions requested by these users or groups; null: every requester."""
    keep_finished: Duration = timedelta(hours=1)
    """How long the controller keeps a finished job made from an eviction, from when it
    first sees it finished, before it deletes it once its pod is gone (a drain makes one
    per pod it moves, cluster-wide); 0s: kept for ever. Never deleted before its creation,
    `defaultJobTTL` and `REPLACEMENT_GRACE` have passed."""


class MigrationControllerArgs(_Args):
    """How the controller arbitrates and runs PodMigrationJobs."""

    dry_run: StrictBool = False
    """Arbitrate and report only: a job arbitration would start stays Pending with reason
    DryRun, so nothing is reserved or evicted; jobs already Running go on to their end."""
    max_concurrent_reconciles: StrictInt = Field(default=1, ge=1)
    """How many jobs are reconciled at once."""
    evict_failed_bare_pods: StrictBool = False
    """Allow migrating failed pods that have no owner."""
    evict_local_storage_pods: StrictBool = False
    """Allow migrating pods that use local storage."""
    evict_system_critical_pods: StrictBool = False
    """Allow migrating pods of any priority, system-critical ones included."""
    ignore_pvc_pods: StrictBool = False
    """Never migrate pods that use PersistentVolumeClaims."""
    label_selector: LabelSelector | None = None
    """Only pods matching this selector migrate."""
    priority_threshold: PriorityThreshold | None = None
    """Only pods below this priority migrate."""
    namespaces: Namespaces | None = Field(
        default_factory=lambda: Namespaces(exclude=list(SYSTEM_NAMESPACES))
    )
    """Namespaces whose pods may migrate; by default all but kube-system and berth-system,
    which the webhook does not see (a replacement there could never bind a Reservation)
    and where the cluster's own components run."""
    node_fit: StrictBool = False
    """Only migrate a pod if another node fits it (affinity, taints, resources)."""
    node_selector: LabelSelectorText | None = None
    """With nodeFit, only consider nodes matching this label selector, e.g.
    `pool=general`; no effect without nodeFit."""
    max_migrating_per_node: StrictInt = Field(default=2, ge=0)
    """Jobs running at once per source node; 0 means no limit."""
    max_migrating_per_namespace: StrictInt = Field(default=0, ge=0)
    """Jobs running at once per namespace; 0 means no limit."""
    max_migrating_globally: StrictInt = Field(default=0, ge=0)
    """Jobs running at once in the whole cluster; 0 means no limit."""
    max_migrating_per_workload: IntOrPercent = 0
    """Jobs running at once per workload, a count or a percentage of its replicas. 0 means
    by workload size: 10% above 10 replicas, 2 from 4 to 10 replicas, 1 below 4."""
    max_unavailable_per_workload: IntOrPercent = 0
    """Pods of a workload that may be unavailable (not ready or migrating) at once; 0 means by
    workload size, as for maxMigratingPerWorkload."""
    skip_check_expected_replicas: StrictBool = False
    """When false, a job is kept back if the workload limits are not below the workload's
    expected replicas; in particular a 1-replica workload cannot be migrated. Berth applies
    that rule to EvictDirectly jobs only: a ReservationFirst job guarantees the replacement a
    place before the pod goes, so a 1-replica workload (as in the quick start) migrates by
    default; maxUnavailablePerWorkload still applies."""
    object_limiters: dict[ObjectLimiterKind, ObjectLimiter] | None = None
    """Rate limits per object, e.g. at most maxMigrating pods of one workload per duration."""
    default_job_mode: PodMigrationJobMode = PodMigrationJobMode.RESERVATION_FIRST
    """Mode of a job that sets no spec.mode; the controller records it on the job when it
    first sees the job, so the job keeps it whatever the configuration later says."""
    default_job_ttl: PositiveDuration = Field(default=timedelta(minutes=5), alias="defaultJobTTL")
    """TTL of the jobs the controller itself creates."""
    scheduler_names: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: list(DEFAULT_SCHEDULER_NAMES)
    )
    """Schedulers that place Reservations; a ReservationFirst job may only migrate pods
    scheduled by one of them."""
    evict_qps: Rate = Field(default=10.0, alias="evictQPS")
    """Evictions per second, across the cluster; 0 means no limit."""
    evict_burst: StrictInt = Field(default=1, ge=1)
    """The most evictions let through at once (the token bucket's size)."""
    eviction_policy: EvictionPolicy = EvictionPolicy.EVICTION
    """How a pod is removed: Eviction, Delete or SoftEviction."""
    default_delete_options: Annotated[dict[str, Any] | None, AfterValidator(_delete_options)] = None
    """Delete options for evictions when a job sets none (meta v1 DeleteOptions)."""
    arbitration_args: ArbitrationArgs = Field(default_factory=ArbitrationArgs)
    """Arbitration of pending jobs."""
    placeholder_image: str = Field(default="registry.k8s.io/pause:3.10", min_length=1)
    """Berth's own key: the image of the placeholder pods that hold reserved capacity."""
    flow_control_qps: Rate | None = Field(default=None, alias="flowControlQPS")
    """Jobs admitted per second by arbitration; unset means no limit."""
    flow_control_burst: StrictInt | None = Field(default=None, ge=1)
    """The most jobs admitted at once (the token bucket's size)."""
    eviction_interception: EvictionInterception = Field(default_factory=EvictionInterception)
    """Berth's own key: evictions through the Eviction API (kubectl drain, the
    descheduler) that the webhook turns into jobs of `defaultJobMode` and `defaultJobTTL`."""


def load_args(path: Path) -> MigrationControllerArgs:
    """Read MigrationControllerArgs from a YAML file; an empty file gives the defaults.

    The file holds the args mapping, optionally with `apiVersion: descheduler/v1alpha2` and
    `kind: MigrationControllerArgs` as in a descheduler profile's `pluginConfig`; or a
    descheduler configuration (`profiles`) or profile (`pluginConfig`) that configures
    the MigrationController plugin, as the seeds show them (`plugin_args`).
    """
    data = _mapping_in(path)
    if "profiles" in data or "pluginConfig" in data:
        where, found = plugin_args(data)
        if isinstance(found, str):
            raise ConfigError(f"{path}: {found}")
        data = dict(found)
        path_named = f"{path} ({where})"
    else:
        path_named = str(path)
    problems = []
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        if key in data and data.pop(key) != expected:
            problems.append(f"{key}: must be {expected} when set")
    try:
        args = MigrationControllerArgs.model_validate(data, by_alias=True, by_name=False)
    except ValidationError as error:
        problems += [_describe(detail) for detail in error.errors()]
    if problems:
        raise ConfigError("\n".join(f"{path_named}: {problem}" for problem in problems))
    return args


def _mapping_in(path: Path) -> dict[str, Any]:
    """The YAML mapping the file holds (an empty file: an empty one)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read: {error}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of {KIND} keys, got {type(data).__name__}")
    return data


PLUGIN = "MigrationController"


def plugin_args(data: dict[str, Any]) -> tuple[str, dict[str, Any] | str]:
    """The MigrationController's args in a descheduler configuration (`profiles`) or in
    one profile or its part (`pluginConfig`), as the seeds write them, and where they
    were found; or what is wrong (a string). Everything else in the file is the
    descheduler's and is not read."""
    if "profiles" in data:
        profiles = data["profiles"]
        if not isinstance(profiles, list) or not all(isinstance(p, dict) for p in profiles):
            return "", "profiles: expected a list of descheduler profiles"
        entries = [
            (f"profiles[{i}].pluginConfig[{j}].args", entry)
            for i, profile in enumerate(profiles)
            for j, entry in enumerate(_plugin_configs(profile))
        ]
    else:
        entries = [
            (f"pluginConfig[{j}].args", entry) for j, entry in enumerate(_plugin_configs(data))
        ]
    if any(entry is None for _, entry in entries):
        return "", "pluginConfig: expected a list of {name, args} mappings"
    ours = [(where, entry) for where, entry in entries if entry and entry.get("name") == PLUGIN]
    if not ours:
        return "", f"no pluginConfig entry named {PLUGIN}: nothing for Berth's controller"
    if len(ours) > 1:
        named = ", ".join(where.removesuffix(".args") for where, _ in ours)
        return "", f"{PLUGIN} is configured {len(ours)} times ({named}); Berth runs one"
    where, entry = ours[0]
    args = entry.get("args")
    if args is None:
        return where, {}
    if not isinstance(args, dict):
        return where, f"{where}: expected a mapping of {KIND} keys, got {type(args).__name__}"
    return where, args


def _plugin_configs(profile: dict[str, Any]) -> list[dict[str, Any] | None]:
    """A profile's pluginConfig entries (None for one that is not a mapping)."""
    entries = profile.get("pluginConfig") or []
    if not isinstance(entries, list):
        return [None]
    return [entry if isinstance(entry, dict) else None for entry in entries]


def _describe(error: ErrorDetails) -> str:
    """`key.path: problem` for one validation error."""
    loc = error["loc"]
    if loc and loc[-1] == "[key]":  # a dict key was rejected, e.g. objectLimiters.<key>
        return f"{_key_path(loc[:-1])}: not a valid key here; {_lower(error['msg'])}"
    path = _key_path(loc)
    if error["type"] == "extra_forbidden":
        known = _keys_at(loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        return f"{path}: unknown key" + (f" (did you mean {hint[0]}?)" if hint else "")
    if error["type"] == "missing":
        return f"{path}: required key is missing"
    if error["type"] == "value_error":
        return f"{path}: {error['ctx']['error']}"
    return f"{path}: {_lower(error['msg'])}, got {error['input']!r}"


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path.lstrip(".") or "(top level)"


def _lower(message: str) -> str:
    return message[:1].lower() + message[1:]


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the mapping at `loc` accepts, for did-you-mean hints."""
    model: type[BaseModel] | None = MigrationControllerArgs
    for part in loc:
        if model is None:
            return []
        field = next((f for f in model.model_fields.values() if f.alias == part), None)
        if field is not None:
            model = _model_in(field.annotation)
        # otherwise `part` is a list index or a dict key: the model stays the element's
    return [f.alias or name for name, f in model.model_fields.items()] if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, looking through Optional, list and dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_model_in, typing.get_args(annotation))), None)
