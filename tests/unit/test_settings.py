"""MigrationControllerArgs: the documented defaults, and one clear message per bad key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from berth.api import LabelSelector, PodMigrationJobMode, parse_duration
from berth.settings import (
    ConfigError,
    EvictionPolicy,
    MigrationControllerArgs,
    Namespaces,
    ObjectLimiter,
    ObjectLimiterKind,
    load_args,
)

# The MigrationController's parameter table, key by key, with its default.
SEED_TABLE: list[tuple[str, Any]] = [
    ("dryRun", False),
    ("evictFailedBarePods", False),
    ("evictLocalStoragePods", False),
    ("evictSystemCriticalPods", False),
    ("ignorePvcPods", False),  # the table spells it IgnorePvcPods; the Go struct ignorePvcPods
    ("labelSelector", None),
    ("priorityThreshold", None),
    ("maxConcurrentReconciles", 1),
    ("namespaces.include", None),
    # Berth excludes the namespaces its webhook does not see (berth.settings.SYSTEM_NAMESPACES).
    ("namespaces.exclude", ["kube-system", "berth-system"]),
    ("nodeFit", False),
    ("nodeSelector", None),  # the table says "false", but it is a label selector string
    ("maxMigratingPerNode", 2),
    ("maxMigratingPerNamespace", 0),
    ("maxMigratingGlobally", 0),
    ("maxMigratingPerWorkload", 0),
    ("maxUnavailablePerWorkload", 0),
    ("skipCheckExpectedReplicas", False),
    ("objectLimiters", None),
    ("defaultJobMode", "ReservationFirst"),
    ("defaultJobTTL", "5m"),
    # Berth's one change (["koord-scheduler"] there): the two profiles of its kube-scheduler
    ("schedulerNames", ["default-scheduler", "koord-scheduler"]),
    ("evictQPS", 10),
    ("evictBurst", 1),
    ("evictionPolicy", "Eviction"),
    ("defaultDeleteOptions", None),
    ("arbitrationArgs.enabled", True),
    ("arbitrationArgs.interval", "500ms"),
]

# Keys of the Go struct in the PodMigrationJob design that the table does not list.
STRUCT_ONLY = [("flowControlQPS", None), ("flowControlBurst", None)]
BERTH_ONLY = [
    ("placeholderImage", "registry.k8s.io/pause:3.10"),
    ("evictionInterception.allNamespaces", False),
    ("evictionInterception.requesters", None),
]


def lookup(values: dict[str, Any], path: str) -> Any:
    """`values` at a dotted key path; a missing parent mapping means None."""
    value: Any = values
    for key in path.split("."):
        value = None if value is None else value[key]
    return value


@pytest.mark.parametrize(("path", "default"), SEED_TABLE + STRUCT_ONLY)
def test_default(path: str, default: Any) -> None:
    value = lookup(MigrationControllerArgs().model_dump(), path)
    if isinstance(value, timedelta):
        default = parse_duration(default)
    assert value == default


def test_every_key_is_documented_above() -> None:
    top_level = {path.split(".")[0] for path, _ in SEED_TABLE + STRUCT_ONLY + BERTH_ONLY}
    assert set(MigrationControllerArgs().model_dump()) == top_level


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "args.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("text", ["", "\n", "# nothing set\n", "---\n"])
def test_empty_file_gives_the_defaults(tmp_path: Path, text: str) -> None:
    assert load_args(write(tmp_path, text)) == MigrationControllerArgs()


def test_args_block_of_the_documentation(tmp_path: Path) -> None:
    args = load_args(write(tmp_path, """\
apiVersion: descheduler/v1alpha2
kind: MigrationControllerArgs
evictionPolicy: Eviction
namespaces:
  exclude:
    - kube-system
evictQPS: "10"
evictBurst: 1
"""))  # fmt: skip
    assert args.eviction_policy is EvictionPolicy.EVICTION
    assert args.namespaces == Namespaces(exclude=["kube-system"])
    assert args.evict_qps == 10.0
    assert args.evict_burst == 1


def test_every_key_set(tmp_path: Path) -> None:
    args = load_args(write(tmp_path, """\
dryRun: true
maxConcurrentReconciles: 4
evictFailedBarePods: true
evictLocalStoragePods: true
evictSystemCriticalPods: true
ignorePvcPods: true
labelSelector: {matchLabels: {migrate: "yes"}}
priorityThreshold: {value: 1000}
namespaces: {include: [apps]}
nodeFit: true
nodeSelector: pool=general
maxMigratingPerNode: 0
maxMigratingPerNamespace: 3
maxMigratingPerWorkload: 25%
maxUnavailablePerWorkload: 2
skipCheckExpectedReplicas: true
objectLimiters: {workload: {duration: 1h, maxMigrating: 10%}}
defaultJobMode: EvictDirectly
defaultJobTTL: 1h30m
schedulerNames: [default-scheduler, second-scheduler]
evictQPS: 0.5
evictBurst: 3
evictionPolicy: SoftEviction
defaultDeleteOptions: {gracePeriodSeconds: 30}
arbitrationArgs: {enabled: false, interval: 2s}
flowControlQPS: "2.5"
flowControlBurst: 5
"""))  # fmt: skip
    assert args.dry_run
    assert args.node_fit
    assert args.skip_check_expected_replicas
    assert args.label_selector == LabelSelector(match_labels={"migrate": "yes"})
    assert args.priority_threshold is not None
    assert args.priority_threshold.value == 1000
    assert args.max_migrating_per_node == 0
    assert args.max_migrating_per_workload == "25%"
    assert args.max_unavailable_per_workload == 2
    assert args.object_limiters == {
        ObjectLimiterKind.WORKLOAD: ObjectLimiter(duration=timedelta(hours=1), max_migrating="10%")
    }
    assert args.default_job_mode is PodMigrationJobMode.EVICT_DIRECTLY
    assert args.default_job_ttl == timedelta(minutes=90)
    assert args.evict_qps == 0.5
    assert args.eviction_policy is EvictionPolicy.SOFT_EVICTION
    assert args.default_delete_options == {"gracePeriodSeconds": 30}
    assert (args.arbitration_args.enabled, args.arbitration_args.interval) == (
        False, timedelta(seconds=2))  # fmt: skip
    assert (args.flow_control_qps, args.flow_control_burst) == (2.5, 5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dryRun: yes please", "dryRun: input should be a valid boolean, got 'yes please'"),
        ("dryRun: 'true'", "dryRun: input should be a valid boolean, got 'true'"),
        ("dry_run: true", "dry_run: unknown key (did you mean dryRun?)"),
        ("IgnorePvcPods: true", "IgnorePvcPods: unknown key (did you mean ignorePvcPods?)"),
        ("evictQps: 5", "evictQps: unknown key (did you mean evictQPS?)"),
        ("defaultJobTtl: 5m", "defaultJobTtl: unknown key (did you mean defaultJobTTL?)"),
        ("profiles: []", "no pluginConfig entry named MigrationController"),
        ("maxConcurrentReconciles: 0", "maxConcurrentReconciles: input should be greater than"),
        ("maxMigratingPerNode: -1",
         "maxMigratingPerNode: input should be greater than or equal to 0"),
        ("maxMigratingPerNode: '2'",
         "maxMigratingPerNode: input should be a valid integer, got '2'"),
        ("maxMigratingPerNamespace: 1.5",
         "maxMigratingPerNamespace: input should be a valid integer"),
        ("maxMigratingPerWorkload: ten",
         "maxMigratingPerWorkload: 'ten' is neither a non-negative"),
        ("maxUnavailablePerWorkload: 10.5%", "maxUnavailablePerWorkload: '10.5%' is neither"),
        ("maxUnavailablePerWorkload: -1", "maxUnavailablePerWorkload: -1 is neither"),
        ("maxMigratingPerWorkload: \"\u00b2%\"", "maxMigratingPerWorkload: '\u00b2%' is neither"),
        ("defaultDeleteOptions: {gracePeriodSeconds: '60'}",
         "defaultDeleteOptions.gracePeriodSeconds '60' is not a number of seconds"),
        ("defaultDeleteOptions: {propagationPolicy: Later}",
         "defaultDeleteOptions.propagationPolicy 'Later' is not one of"),
        ("defaultDeleteOptions: {gracePeriodSecond: 0}",
         "defaultDeleteOptions.gracePeriodSecond: not used by Berth, which passes on only "
         "gracePeriodSeconds and propagationPolicy (did you mean gracePeriodSeconds?)"),
        ("defaultDeleteOptions: {dryRun: [All]}",
         "defaultDeleteOptions.dryRun: not used by Berth"),
        ("defaultJobMode: Reservation", "defaultJobMode: input should be 'ReservationFirst' or"),
        ("defaultJobTTL: soon", "defaultJobTTL: 'soon' is not a Go duration such as 90s"),
        ("defaultJobTTL: 300", "defaultJobTTL: 300 is not a Go duration string"),
        ("defaultJobTTL: -5m", "defaultJobTTL: must not be negative, got -5m0s"),
        ("defaultJobTTL: 0s", "defaultJobTTL: must be longer than 0s, got 0s"),
        ("evictionInterception: {keepFinished: -1h}", "must not be negative"),
        ("schedulerNames: koord-scheduler", "schedulerNames: input should be a valid list"),
        ("schedulerNames: [1]", "schedulerNames[0]: input should be a valid string, got 1"),
        ("schedulerNames: ['']", "schedulerNames[0]: string should have at least 1 character"),
        ("placeholderImage: ''", "placeholderImage: string should have at least 1 character"),
        ("evictQPS: fast", "evictQPS: 'fast' is not a non-negative number"),
        ("evictQPS: -1", "evictQPS: -1 is not a non-negative number"),
        ("evictQPS: true", "evictQPS: True is not a non-negative number"),
        ("evictBurst: 0", "evictBurst: input should be greater than or equal to 1"),
        ("evictionPolicy: Evict",
         "evictionPolicy: input should be 'Eviction', 'Delete' or 'SoftEviction'"),
        ("nodeSelector: false", "nodeSelector: input should be a valid string, got False"),
        ("nodeSelector: a in (b", "nodeSelector: 'a in (b' is not a label selector requirement"),
        ("nodeSelector: pool in ()", "nodeSelector: 'pool in ()' names no value in its set"),
        ("nodeSelector: 'pool=general,!'",
         "nodeSelector: '!' is not a label selector requirement"),
        ("namespaces: {include: kube-system}", "namespaces.include: input should be a valid list"),
        ("namespaces: {exclud: [a]}", "namespaces.exclud: unknown key (did you mean exclude?)"),
        ("namespaces: [a]", "namespaces: input should be a valid dictionary"),
        ("labelSelector: {matchLabels: {app: 1}}",
         "labelSelector.matchLabels.app: input should be a valid string"),
        ("labelSelector: {matchExpressions: [{key: app, operator: In}]}",
         "labelSelector.matchExpressions[0]: operator In needs values"),
        ("labelSelector: {matchExpressions: [{key: app, operator: Exists, values: [a]}]}",
         "labelSelector.matchExpressions[0]: operator Exists takes no values"),
        ("labelSelector: {matchExpressions: [{key: app, operator: Like}]}",
         "labelSelector.matchExpressions[0].operator: input should be 'In', 'NotIn'"),
        ("labelSelector: {matchExpressions: [{key: app, operator: In, value: [a]}]}",
         "labelSelector.matchExpressions[0].value: unknown key (did you mean values?)"),
        ("priorityThreshold: {value: 1, name: high}",
         "priorityThreshold: set value or name, not both"),
        ("priorityThreshold: {value: high}",
         "priorityThreshold.value: input should be a valid integer"),
        ("objectLimiters: {deployment: {duration: 5m, maxMigrating: 1}}",
         "objectLimiters.deployment: not a valid key here; input should be 'workload'"),
        ("objectLimiters: {workload: {duration: 5m}}",
         "objectLimiters.workload.maxMigrating: required key is missing"),
        ("objectLimiters: {workload: {duraton: 5m, maxMigrating: 1}}",
         "objectLimiters.workload.duraton: unknown key (did you mean duration?)"),
        ("arbitrationArgs: {interval: 0s}", "arbitrationArgs.interval: must be longer than 0s"),
        ("arbitrationArgs: {interval: 1d}", "arbitrationArgs.interval: '1d' is not a Go duration"),
        ("arbitrationArgs: {enabeld: false}",
         "arbitrationArgs.enabeld: unknown key (did you mean enabled?)"),
        ("arbitrationArgs: {enabled: 1}",
         "arbitrationArgs.enabled: input should be a valid boolean"),
        ("flowControlBurst: 0", "flowControlBurst: input should be greater than or equal to 1"),
        ("kind: LowNodeLoadArgs", "kind: must be MigrationControllerArgs when set"),
        ("apiVersion: v1", "apiVersion: must be descheduler/v1alpha2 when set"),
        ("- dryRun", "expected a mapping of MigrationControllerArgs keys, got list"),
        ("dryRun", "expected a mapping of MigrationControllerArgs keys, got str"),
        ("dryRun: [", "not valid YAML"),
    ],
)  # fmt: skip
def test_invalid_config_names_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_args(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert message in str(raised.value)


def test_each_problem_gets_its_own_line(tmp_path: Path) -> None:
    path = write(tmp_path, "dryRun: 1\nevictQps: 2\narbitrationArgs: {interval: x}\n")
    with pytest.raises(ConfigError) as raised:
        load_args(path)
    lines = str(raised.value).splitlines()
    assert sorted(line.split(": ")[1] for line in lines) == [
        "arbitrationArgs.interval", "dryRun", "evictQps"
    ]  # fmt: skip
    assert all(line.startswith(f"{path}: ") for line in lines)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read"):
        load_args(tmp_path / "missing.yaml")


def test_a_percentage_of_zero_is_by_size_however_written(tmp_path: Path) -> None:
    args = load_args(write(tmp_path, "maxMigratingPerWorkload: 00%"))
    assert args.max_migrating_per_workload == "0%"


def test_args_are_immutable() -> None:
    with pytest.raises(ValueError, match="frozen"):
        MigrationControllerArgs().dry_run = True


def test_readme_documents_every_key() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    missing = [
        field.alias or name
        for name, field in MigrationControllerArgs.model_fields.items()
        if f"`{field.alias or name}`" not in readme
    ]
    assert not missing, f"README's configuration table lacks {missing}"


# The descheduler configuration of the seeds (the MigrationController's documentation):
# the controller reads its plugin's args out of it, and nothing else.
SEED_PROFILES = """\
profiles:
  - name: koord-descheduler
    plugins:
      deschedule:
        disabled:
          - name: "*"
      balance:
        enabled:
          - name: LowNodeLoad
      evict:
        disabled:
          - name: "*"
        enabled:
          - name: MigrationController
    pluginConfig:
      - name: MigrationController
        args:
          apiVersion: descheduler/v1alpha2
          kind: MigrationControllerArgs
          evictionPolicy: Eviction
          namespaces:
            exclude:
              - kube-system
          evictQPS: "10"
          evictBurst: 1
      - name: LowNodeLoad
        args:
          apiVersion: descheduler/v1alpha2
          kind: LowNodeLoadArgs
          evictableNamespaces:
            exclude:
              - kube-system
          useDeviationThresholds: false
          lowThresholds:
            cpu: 45
            memory: 55
          highThresholds:
            cpu: 75
            memory: 80
"""

SEED_PLUGIN_CONFIG = """\
    pluginConfig:
      - name: MigrationController
        args:
          defaultJobMode: EvictDirectly
"""


def test_a_descheduler_configuration_of_the_seeds_is_read_for_its_plugin(tmp_path: Path) -> None:
    args = load_args(write(tmp_path, SEED_PROFILES))
    assert args.eviction_policy == "Eviction"
    assert args.namespaces is not None
    assert args.namespaces.exclude == ["kube-system"]
    assert (args.evict_qps, args.evict_burst) == (10, 1)
    fragment = load_args(write(tmp_path, SEED_PLUGIN_CONFIG))
    assert fragment.default_job_mode == "EvictDirectly"
    empty = load_args(write(tmp_path, "pluginConfig: [{name: MigrationController}]"))
    assert empty == MigrationControllerArgs()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pluginConfig: [{name: LowNodeLoad, args: {}}]",
         "no pluginConfig entry named MigrationController"),
        ("profiles: [{name: a, pluginConfig: [{name: MigrationController}]},"
         " {name: b, pluginConfig: [{name: MigrationController}]}]",
         "MigrationController is configured 2 times (profiles[0].pluginConfig[0], "
         "profiles[1].pluginConfig[0]); Berth runs one"),
        ("profiles: {name: a}", "profiles: expected a list of descheduler profiles"),
        ("pluginConfig: [MigrationController]", "pluginConfig: expected a list of {name, args}"),
        ("pluginConfig: {name: MigrationController}",
         "pluginConfig: expected a list of {name, args}"),
        ("pluginConfig: [{name: MigrationController, args: [dryRun]}]",
         "pluginConfig[0].args: expected a mapping of MigrationControllerArgs keys, got list"),
        ("profiles: [{pluginConfig: [{name: MigrationController, args: {evictQps: 1}}]}]",
         "(profiles[0].pluginConfig[0].args): evictQps: unknown key (did you mean evictQPS?)"),
    ],
)  # fmt: skip
def test_a_descheduler_configuration_berth_cannot_use_says_why(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_args(path)
    assert str(raised.value).startswith(f"{path}")
    assert message in str(raised.value)
