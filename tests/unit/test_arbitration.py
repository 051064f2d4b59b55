"""Arbitration as tables: every evictability check, every limit, every sort key, the
rate limiters, and the rule that a Pending job never blocks itself."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from berth import protocol
from berth.api import keys
from berth.settings import MigrationControllerArgs
from controller.arbitration import (
    Arbitration,
    Decision,
    LimiterState,
    Memo,
    Snapshot,
    TokenBucket,
    arbitrate,
    max_per_workload,
)
from controller.arbitration.order import KOORDINATOR_QOS
from tests.unit.builders import T0, job, later, node, pdb, pod, ts, workload

Object = dict[str, Any]
Tweak = Callable[[Object], object]

LOOSE: dict[str, Any] = {
    "maxMigratingPerNode": 0,
    "maxMigratingPerWorkload": "100%",
    "maxUnavailablePerWorkload": "100%",
}
"""Limits out of the way, for tests about something else."""


# ----- builders ---------------------------------------------------------------------------


def pods_of(
    name: str = "web",
    count: int = 3,
    *,
    nodes: Sequence[str] | None = None,
    ready: bool = True,
    namespace: str = "default",
) -> list[Object]:
    """`count` pods of Deployment `name` (ReplicaSet `<name>-rs`), one per node unless told."""
    return [
        pod(
            f"{name}-{i}",
            node=nodes[i] if nodes else f"node-{i}",
            rs=f"{name}-rs",
            ready=ready,
            labels={"app": name},
            namespace=namespace,
        )
        for i in range(count)
    ]


def workload_uid(target: Object) -> str | None:
    """Pods of ReplicaSet `<name>-rs` belong to Deployment `<name>` (`uid-<name>`); other
    controllers are their own workload."""
    for owner in target["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            if owner["kind"] == "ReplicaSet":
                return f"uid-{owner['name'].removesuffix('-rs')}"
            return str(owner["uid"])
    return None


def workload_of(pods: Sequence[Object]) -> dict[str, str]:
    """Controller UID → workload UID, as the controller's caches answer it."""
    return {
        controller["uid"]: uid
        for p in pods
        if (uid := workload_uid(p)) and (controller := protocol.controller_of(p))
    }


def pending(name: str, target: Object, *, mode: str = "ReservationFirst", age: int = 0) -> Object:
    """A Pending job for `target`, created `age` seconds before T0."""
    obj = job(name, pod_name=target["metadata"]["name"], mode=mode, phase="Pending", pod_uid=None)
    obj["spec"]["podRef"]["namespace"] = target["metadata"]["namespace"]
    obj["metadata"]["creationTimestamp"] = ts(T0 - timedelta(seconds=age))
    return obj


def running(name: str, target: Object, *, phase: str = "Running", annotated: bool = True) -> Object:
    """A job for `target` as admission left it: Running, with source node, pod UID and
    workload annotations (or, `annotated=False`, as an older controller left it)."""
    obj = job(
        name,
        pod_name=target["metadata"]["name"],
        phase=phase,
        pod_uid=target["metadata"]["uid"] if annotated else None,
    )
    obj["spec"]["podRef"]["namespace"] = target["metadata"]["namespace"]
    if annotated:
        obj["metadata"]["annotations"][keys.SOURCE_NODE] = target["spec"].get("nodeName", "")
        uid = workload_uid(target)
        if uid:
            obj["metadata"]["annotations"][keys.WORKLOAD] = uid
    return obj


def decide(
    jobs: Sequence[Object],
    *,
    pods: Sequence[Object],
    workloads: Sequence[Object] = (),
    in_flight: Sequence[Object] = (),
    history: Sequence[Object] = (),
    pdbs: Sequence[Object] = (),
    nodes: Sequence[Object] = (),
    free: dict[str, str] | None = None,
    priority_classes: dict[str, int] | None = None,
    limiter: LimiterState | None = None,
    now: Any = T0,
    **args: Any,
) -> Arbitration:
    """Arbitrate one round; `args` are MigrationControllerArgs keys. evictQPS is 0 (no rate
    limit) unless a test sets it, so that rounds can admit more than one job."""
    args.setdefault("evictQPS", 0)
    pods_by_workload: dict[str, list[Object]] = {}
    for member in pods:
        uid = workload_uid(member)
        if uid:
            pods_by_workload.setdefault(uid, []).append(member)
    snapshot = Snapshot(
        pending=jobs,
        in_flight=in_flight,
        history=history,
        pods={f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods},
        workload_of=workload_of(pods),
        workloads={w["metadata"]["uid"]: w for w in workloads},
        pods_of_workload=pods_by_workload,
        pdbs=pdbs,
        nodes={n["metadata"]["name"]: n for n in nodes},
        free={name: {"cpu": Decimal(cpu) / 1000} for name, cpu in (free or {}).items()},
        priority_classes=priority_classes or {},
        args=MigrationControllerArgs.model_validate(args),
        limiter=limiter or LimiterState(),
        now=now,
    )
    result = arbitrate(snapshot)
    again = arbitrate(replace(snapshot, memo=result.memo))
    assert again.decisions == result.decisions, "a round reusing the memo decided otherwise"
    assert again.limiter == result.limiter
    return result


def of(result: Arbitration, name: str = "job-1") -> Decision:
    return next(d for d in result.decisions if d.job["metadata"]["name"] == name)


def verdicts(result: Arbitration) -> dict[str, str]:
    return {d.job["metadata"]["name"]: d.verdict for d in result.decisions}


def one(
    target: Object | None = None,
    *,
    mode: str = "ReservationFirst",
    pods: Sequence[Object] | None = None,
    workloads: Sequence[Object] | None = None,
    **kwargs: Any,
) -> Decision:
    """The decision on job-1 for `target` (default: web-0 of a healthy 3-replica web)."""
    members = list(pods) if pods is not None else pods_of()
    target = target or members[0]
    if target not in members:
        members.append(target)
    result = decide(
        [pending("job-1", target, mode=mode)],
        pods=members,
        workloads=[workload()] if workloads is None else workloads,
        **kwargs,
    )
    return of(result)


def tweak(**changes: Any) -> Tweak:
    """Set fields of a pod: `spec__volumes=[...]` sets pod["spec"]["volumes"]."""

    def apply(target: Object) -> None:
        for path, value in changes.items():
            *parents, leaf = path.split("__")
            place = target
            for part in parents:
                place = place.setdefault(part, {})
            if value is None:
                place.pop(leaf, None)
            else:
                place[leaf] = value

    return apply


def annotate(annotations: dict[str, str]) -> Tweak:
    return lambda target: target["metadata"]["annotations"].update(annotations)


def tweaked(target: Object, *tweaks: Tweak) -> Object:
    for change in tweaks:
        change(target)
    return target


# ----- GetMaxUnavailable ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "replicas", "expected"),
    [
        # 0 means the size table: 10% above 10 replicas, 2 from 4 to 10, else 1
        (0, 0, 1),
        (0, 1, 1),
        (0, 3, 1),
        (0, 4, 2),
        (0, 10, 2),
        (0, 11, 2),
        (0, 20, 2),
        (0, 21, 3),
        (0, 100, 10),
        (0, 101, 11),
        ("0%", 5, 2),
        # a count is a count, a percentage rounds up
        (3, 5, 3),
        (1, 100, 1),
        ("50%", 5, 3),
        ("10%", 11, 2),
        ("25%", 4, 1),
        ("1%", 1, 1),
        ("100%", 3, 3),
        ("30%", 10, 3),
        ("50%", 0, 0),
    ],
)
def test_max_per_workload(value: int | str, replicas: int, expected: int) -> None:
    assert max_per_workload(value, replicas) == expected


# ----- forbidden pods fail ----------------------------------------------------------------

NEVER = str(keys.EVICTION_COST_NEVER)


@pytest.mark.parametrize(
    ("change", "args", "message"),
    [
        pytest.param(
            annotate({keys.EVICTION_COST: NEVER}),
            {},
            "eviction cost is MaxInt32",
            id="eviction cost MaxInt32",
        ),
        pytest.param(
            annotate({"kubernetes.io/config.mirror": "x", "kubernetes.io/config.source": "file"}),
            {},
            "static pod",
            id="mirror pod",
        ),
        pytest.param(
            annotate({"kubernetes.io/config.source": "http"}), {}, "static pod", id="static pod"
        ),
        pytest.param(
            lambda p: p["metadata"]["ownerReferences"][0].update(kind="DaemonSet"),
            {},
            "pod is a DaemonSet pod",
            id="daemonset",
        ),
        pytest.param(
            tweak(metadata__deletionTimestamp=ts(T0)), {}, "pod is terminating", id="terminating"
        ),
        pytest.param(tweak(status__phase="Succeeded"), {}, "pod has completed", id="completed"),
        pytest.param(tweak(spec__nodeName=None), {}, "not scheduled to a node", id="unscheduled"),
        pytest.param(tweak(metadata__ownerReferences=None), {}, "no owner", id="bare"),
        pytest.param(
            tweak(metadata__ownerReferences=None, status__phase="Failed"),
            {},
            "no owner",
            id="failed bare without evictFailedBarePods",
        ),
        pytest.param(
            tweak(spec__volumes=[{"name": "cache", "emptyDir": {}}]),
            {},
            "local storage (emptyDir volume cache",
            id="emptyDir",
        ),
        pytest.param(
            tweak(spec__volumes=[{"name": "logs", "hostPath": {"path": "/var/log"}}]),
            {},
            "local storage (hostPath volume logs",
            id="hostPath",
        ),
        pytest.param(
            tweak(spec__volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "x"}}]),
            {"ignorePvcPods": True},
            "PersistentVolumeClaim",
            id="pvc with ignorePvcPods",
        ),
        pytest.param(
            tweak(spec__volumes=[{"name": "d", "ephemeral": {}}]),
            {"ignorePvcPods": True},
            "PersistentVolumeClaim",
            id="ephemeral volume",
        ),
        pytest.param(
            tweak(spec__priority=2_000_000_000),
            {},
            "system-critical",
            id="system-critical priority",
        ),
        pytest.param(
            tweak(spec__priorityClassName="system-node-critical"),
            {},
            "system-critical",
            id="system-critical class",
        ),
        pytest.param(
            tweak(spec__priority=100),
            {"priorityThreshold": {"value": 100}},
            "pod priority 100 is not below priorityThreshold 100",
            id="priorityThreshold",
        ),
        pytest.param(
            tweak(spec__priority=100),
            {"priorityThreshold": {"name": "high"}},
            "pod priority 100 is not below priorityThreshold 50",
            id="priorityThreshold by class",
        ),
        pytest.param(
            tweak(),
            {"priorityThreshold": {"name": "missing"}},
            "PriorityClass missing of priorityThreshold.name does not exist",
            id="priorityThreshold class missing",
        ),
        pytest.param(
            tweak(),
            {"labelSelector": {"matchLabels": {"tier": "batch"}}},
            "does not match labelSelector",
            id="labelSelector",
        ),
        pytest.param(
            tweak(),
            {"namespaces": {"include": ["prod"]}},
            "namespace default is not in namespaces.include",
            id="namespaces.include",
        ),
        pytest.param(
            tweak(),
            {"namespaces": {"include": ["default"], "exclude": ["default"]}},
            "namespace default is in namespaces.exclude",
            id="namespaces.exclude",
        ),
        pytest.param(
            tweak(spec__schedulerName="koord-scheduler"),
            {},
            "pod's scheduler koord-scheduler is not in schedulerNames (default-scheduler)",
            id="schedulerNames",
        ),
    ],
)
def test_forbidden_pods_fail(change: Tweak, args: dict[str, Any], message: str) -> None:
    target = tweaked(pods_of()[0], change)
    decision = one(target, priority_classes={"high": 50}, **args)
    assert (decision.verdict, decision.reason) == ("fail", "ForbiddenMigratePod")
    assert message in decision.message


@pytest.mark.parametrize(
    ("change", "args"),
    [
        pytest.param(
            tweak(spec__volumes=[{"name": "cache", "emptyDir": {}}]),
            {"evictLocalStoragePods": True},
            id="evictLocalStoragePods",
        ),
        pytest.param(
            tweak(spec__volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "x"}}]),
            {},
            id="pvc without ignorePvcPods",
        ),
        pytest.param(
            tweak(spec__priorityClassName="system-cluster-critical", spec__priority=2_000_000_000),
            {"evictSystemCriticalPods": True},
            id="evictSystemCriticalPods",
        ),
        pytest.param(
            tweak(spec__priority=500),
            {"evictSystemCriticalPods": True, "priorityThreshold": {"value": 100}},
            id="evictSystemCriticalPods lifts priorityThreshold",
        ),
        pytest.param(
            tweak(spec__priority=99),
            {"priorityThreshold": {"value": 100}},
            id="priority below threshold",
        ),
        pytest.param(
            tweak(metadata__ownerReferences=None, status__phase="Failed"),
            {"evictFailedBarePods": True},
            id="failed bare with evictFailedBarePods",
        ),
        pytest.param(
            tweak(),
            {
                "labelSelector": {
                    "matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]
                }
            },
            id="labelSelector",
        ),
        pytest.param(tweak(), {"namespaces": {"include": ["default"]}}, id="namespaces.include"),
        pytest.param(
            tweak(spec__schedulerName="koord-scheduler"),
            {"schedulerNames": ["default-scheduler", "koord-scheduler"]},
            id="schedulerNames lists it",
        ),
        pytest.param(annotate({keys.EVICTION_COST: "100"}), {}, id="finite eviction cost"),
        pytest.param(annotate({keys.EVICTION_COST: "cheap"}), {}, id="unreadable eviction cost"),
        pytest.param(annotate({"kubernetes.io/config.source": "api"}), {}, id="api source"),
    ],
)
def test_pods_the_configuration_allows_are_admitted(change: Tweak, args: dict[str, Any]) -> None:
    decision = one(tweaked(pods_of()[0], change), **args)
    assert decision.verdict == "admit", decision.message


def test_evict_directly_needs_no_reservation_scheduler() -> None:
    target = tweaked(pods_of()[0], tweak(spec__schedulerName="koord-scheduler"))
    assert one(target, mode="EvictDirectly").verdict == "admit"


def test_missing_pod_fails() -> None:
    result = decide([pending("job-1", pod("gone-0"))], pods=pods_of(), workloads=[workload()])
    assert of(result) == Decision(
        of(result).job, "fail", "MissingPod", "pod default/gone-0 not found"
    )


def test_a_pod_already_migrating_fails_the_second_job() -> None:
    web = pods_of()
    result = decide(
        [pending("job-1", web[0]), pending("job-2", web[1]), pending("job-3", web[1], age=5)],
        pods=web,
        workloads=[workload()],
        in_flight=[running("job-0", web[0])],
        **LOOSE,
    )
    assert verdicts(result) == {"job-1": "fail", "job-2": "fail", "job-3": "admit"}
    assert (
        of(result, "job-2").message == "pod default/web-1 is already being migrated by another job"
    )


def test_paused_jobs_get_no_decision() -> None:
    web = pods_of()
    paused = pending("job-1", web[0])
    paused["spec"]["paused"] = True
    assert decide([paused], pods=web, workloads=[workload()]).decisions == []


# ----- limits: the job waits --------------------------------------------------------------

API = pods_of("api", 5, nodes=["node-0"] * 5)
"""Pods of another workload on web-0's node, to put in flight."""


@pytest.mark.parametrize(
    ("running_here", "limit", "annotated", "verdict"),
    [
        (0, 2, True, "admit"),
        (1, 2, True, "admit"),
        (2, 2, True, "wait"),
        (3, 2, True, "wait"),
        (2, 2, False, "wait"),
        (5, 0, True, "admit"),
        (1, 1, True, "wait"),
    ],
)
def test_max_migrating_per_node(
    running_here: int, limit: int, annotated: bool, verdict: str
) -> None:
    in_flight = [running(f"run-{i}", API[i], annotated=annotated) for i in range(running_here)]
    decision = one(
        pods=[*pods_of(), *API],
        workloads=[workload(), workload("api", replicas=5)],
        in_flight=in_flight,
        maxMigratingPerNode=limit,
    )
    assert decision.verdict == verdict
    if verdict == "wait":
        assert decision.reason == "MaxMigratingPerNode"
        assert decision.message == (
            f"{running_here} migrations already run on node node-0 (maxMigratingPerNode {limit})"
        )


@pytest.mark.parametrize(
    ("running_here", "running_elsewhere", "limit", "verdict"),
    [
        (0, 3, 1, "admit"),
        (1, 0, 1, "wait"),
        (1, 0, 2, "admit"),
        (2, 0, 2, "wait"),
        (4, 0, 0, "admit"),
    ],
)
def test_max_migrating_per_namespace(
    running_here: int, running_elsewhere: int, limit: int, verdict: str
) -> None:
    api = pods_of("api", 5, nodes=[f"node-{i + 5}" for i in range(5)])
    other = pods_of("api", 3, namespace="other", nodes=["node-9"] * 3)
    in_flight = [running(f"run-{i}", api[i]) for i in range(running_here)] + [
        running(f"far-{i}", other[i]) for i in range(running_elsewhere)
    ]
    decision = one(
        pods=[*pods_of(), *api, *other],
        workloads=[workload(), workload("api", replicas=5)],
        in_flight=in_flight,
        maxMigratingPerNamespace=limit,
        maxMigratingPerNode=0,
    )
    assert decision.verdict == verdict
    if verdict == "wait":
        assert (decision.reason, decision.message) == (
            "MaxMigratingPerNamespace",
            f"{running_here} migrations already run in namespace "
            f"default (maxMigratingPerNamespace {limit})",
        )


@pytest.mark.parametrize(
    ("running_jobs", "limit", "verdict"),
    [
        (0, 1, "admit"),
        (1, 1, "wait"),
        (2, 3, "admit"),
        (3, 3, "wait"),
        (5, 0, "admit"),
    ],
)
def test_max_migrating_globally(running_jobs: int, limit: int, verdict: str) -> None:
    others = [
        pod(f"other-{i}", node=f"node-{i + 5}", rs=f"other-{i}-rs", namespace=f"team-{i}")
        for i in range(running_jobs)
    ]
    decision = one(
        pods=[*pods_of(), *others],
        in_flight=[running(f"run-{i}", p) for i, p in enumerate(others)],
        maxMigratingGlobally=limit,
        maxMigratingPerNode=0,
    )
    assert decision.verdict == verdict
    if verdict == "wait":
        assert (decision.reason, decision.message) == (
            "MaxMigratingGlobally",
            f"{running_jobs} migrations already run in the cluster (maxMigratingGlobally {limit})",
        )


def test_max_migrating_globally_counts_admissions_within_the_round() -> None:
    members = pods_of(count=6, nodes=[f"node-{i}" for i in range(6)])
    result = decide(
        [pending(f"job-{i}", p) for i, p in enumerate(members)],
        pods=members,
        workloads=[workload(replicas=6)],
        maxMigratingGlobally=2,
        maxMigratingPerWorkload="100%",
        maxUnavailablePerWorkload="100%",
    )
    assert sorted(verdicts(result).values()) == ["admit"] * 2 + ["wait"] * 4


@pytest.mark.parametrize(
    ("replicas", "limit", "migrating", "verdict"),
    [
        (3, 0, 0, "admit"),
        (3, 0, 1, "wait"),
        (10, 0, 1, "admit"),
        (10, 0, 2, "wait"),
        (20, 0, 2, "wait"),
        (21, 0, 2, "admit"),
        (10, 3, 2, "admit"),
        (10, "20%", 2, "wait"),
        (10, "25%", 2, "admit"),
        (5, 1, 1, "wait"),
    ],
)
def test_max_migrating_per_workload(
    replicas: int, limit: int | str, migrating: int, verdict: str
) -> None:
    web = pods_of(count=replicas)
    in_flight = [running(f"run-{i}", web[i + 1]) for i in range(migrating)]
    decision = one(
        web[0],
        pods=web,
        workloads=[workload(replicas=replicas)],
        in_flight=in_flight,
        maxMigratingPerWorkload=limit,
        maxUnavailablePerWorkload="100%",
    )
    assert decision.verdict == verdict
    if verdict == "wait":
        assert decision.reason == "MaxMigratingPerWorkload"
        assert decision.message.startswith(
            f"{migrating} pods of Deployment default/web are "
            "already migrating (maxMigratingPerWorkload"
        )


@pytest.mark.parametrize(
    ("replicas", "available", "limit", "migrating", "ready", "verdict"),
    [
        (3, 3, 0, 0, True, "admit"),
        (3, 2, 0, 0, True, "wait"),  # one replica down already, the table allows one
        (3, 2, 0, 0, False, "admit"),  # moving the pod that is down makes nothing worse
        (10, 8, 0, 0, True, "wait"),
        (10, 9, 0, 0, True, "admit"),
        (10, 9, 0, 1, True, "wait"),  # the migrating pod counts as unavailable too
        (10, 9, "30%", 1, True, "admit"),
        (5, 5, 1, 0, True, "admit"),
        (5, 5, 1, 1, True, "wait"),
    ],
)
def test_max_unavailable_per_workload(
    replicas: int, available: int, limit: int | str, migrating: int, ready: bool, verdict: str
) -> None:
    web = pods_of(count=replicas)
    web[0] = pods_of(count=1, ready=ready)[0]
    in_flight = [running(f"run-{i}", web[i + 1]) for i in range(migrating)]
    decision = one(
        web[0],
        pods=web,
        workloads=[workload(replicas=replicas, available=available)],
        in_flight=in_flight,
        maxUnavailablePerWorkload=limit,
        maxMigratingPerWorkload="100%",
    )
    assert decision.verdict == verdict
    if verdict == "wait":
        assert decision.reason == "MaxUnavailablePerWorkload"
        assert "replicas of Deployment default/web are unavailable or migrating" in decision.message


@pytest.mark.parametrize(
    ("ready", "verdict"), [((True, True, True), "admit"), ((True, True, False), "wait")]
)
def test_unavailable_counted_from_pods_for_owners_without_status(
    ready: tuple[bool, ...], verdict: str
) -> None:
    clones = [pods_of("clone", 1, ready=up, nodes=[f"node-{i}"])[0] for i, up in enumerate(ready)]
    for i, member in enumerate(clones):
        member["metadata"]["name"] = f"clone-{i}"
        member["metadata"]["ownerReferences"] = [
            {"kind": "CloneSet", "name": "clone", "uid": "uid-clone", "controller": True}
        ]
    clone_set = {
        "kind": "CloneSet",
        "metadata": {"name": "clone", "namespace": "default", "uid": "uid-clone"},
        "spec": {"replicas": 3},
    }
    decision = one(clones[0], pods=clones, workloads=[clone_set], maxMigratingPerWorkload=3)
    assert (decision.verdict, decision.reason) == (
        verdict,
        "" if verdict == "admit" else "MaxUnavailablePerWorkload",
    )


def test_an_owner_berth_does_not_know_counts_its_pods_as_replicas() -> None:
    lonely = pods_of("job", 1)
    decision = one(lonely[0], pods=lonely, workloads=[], mode="EvictDirectly")
    assert (decision.verdict, decision.reason) == ("wait", "ExpectedReplicas")


# ----- PodDisruptionBudgets ---------------------------------------------------------------


def no_selector() -> Object:
    budget = pdb(allowed=0)
    budget["spec"]["selector"] = None
    return budget


@pytest.mark.parametrize(
    ("budgets", "migrating", "ready", "verdict", "message"),
    [
        pytest.param([pdb(allowed=1)], None, True, "admit", "", id="a disruption left"),
        pytest.param(
            [pdb(allowed=0)],
            None,
            True,
            "wait",
            "PodDisruptionBudget default/web-pdb allows no more disruptions "
            "(disruptionsAllowed 0, 0 taken by migrations)",
            id="none left",
        ),
        pytest.param(
            [pdb(allowed=1)],
            "healthy",
            True,
            "wait",
            "(disruptionsAllowed 1, 1 taken by migrations)",
            id="taken by a migration",
        ),
        pytest.param([pdb(allowed=2)], "healthy", True, "admit", "", id="two allowed"),
        pytest.param(
            [pdb(allowed=1, disrupted=("web-1",))],
            "healthy",
            True,
            "admit",
            "",
            id="already in disruptedPods",
        ),
        pytest.param(
            [pdb(allowed=1)], "terminating", True, "admit", "", id="migrating pod terminating"
        ),
        pytest.param(
            [pdb(allowed=1)], "not ready", True, "admit", "", id="migrating pod not ready"
        ),
        pytest.param([pdb(allowed=1)], "gone", True, "admit", "", id="migrating pod gone"),
        pytest.param([pdb(allowed=0)], None, False, "admit", "", id="unhealthy pod takes none"),
        pytest.param(
            [pdb(allowed=0, namespace="other")], None, True, "admit", "", id="other namespace"
        ),
        pytest.param(
            [pdb(allowed=0, selector={"matchLabels": {"app": "api"}})],
            None,
            True,
            "admit",
            "",
            id="selector does not match",
        ),
        pytest.param([pdb(allowed=0, selector={})], None, True, "wait", "", id="empty selector"),
        pytest.param([no_selector()], None, True, "admit", "", id="null selector"),
        pytest.param(
            [
                pdb(
                    allowed=0,
                    selector={
                        "matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]
                    },
                )
            ],
            None,
            True,
            "wait",
            "",
            id="matchExpressions",
        ),
        pytest.param(
            [pdb(allowed=3), pdb("all", allowed=0, selector={})],
            None,
            True,
            "wait",
            "default/all",
            id="every covering PDB counts",
        ),
    ],
)
def test_pdb(
    budgets: list[Object], migrating: str | None, ready: bool, verdict: str, message: str
) -> None:
    web = pods_of(count=4)
    web[0] = pods_of(count=1, ready=ready)[0]
    in_flight = []
    if migrating:
        makers: dict[str, Callable[[], Object]] = {
            "healthy": lambda: web[1],
            "gone": lambda: pod("web-9", rs="web-rs", labels={"app": "web"}),
            "terminating": lambda: tweaked(web[1], tweak(metadata__deletionTimestamp=ts(T0))),
            "not ready": lambda: pods_of(count=2, ready=False)[1],
        }
        target = makers[migrating]()
        in_flight = [running("run-1", target)]
        if migrating != "gone":
            web[1] = target
    decision = one(
        web[0],
        pods=web,
        workloads=[workload(replicas=4)],
        in_flight=in_flight,
        pdbs=budgets,
        **LOOSE,
    )
    assert decision.verdict == verdict
    if verdict == "wait":
        assert decision.reason == "BlockedByPDB"
        assert message in decision.message


def test_admissions_take_pdb_disruptions_within_the_round() -> None:
    web = pods_of(count=4)
    result = decide(
        [pending(f"job-{i}", web[i], age=10 - i) for i in range(4)],
        pods=web,
        workloads=[workload(replicas=4)],
        pdbs=[pdb(allowed=2)],
        **LOOSE,
    )
    assert list(verdicts(result).values()).count("admit") == 2


# ----- rollouts and expected replicas -----------------------------------------------------


def old_replicas(deployment: Object) -> Object:
    deployment["status"]["replicas"] = 4
    return deployment


@pytest.mark.parametrize(
    ("owner", "verdict", "message"),
    [
        pytest.param(workload(), "admit", "", id="settled"),
        pytest.param(
            workload(generation=2, observed=1),
            "wait",
            "Deployment default/web is rolling out: generation 2 is not observed yet",
            id="generation not observed",
        ),
        pytest.param(workload(updated=2), "wait", "2 of 3 replicas updated", id="not updated"),
        pytest.param(
            old_replicas(workload()),
            "wait",
            "1 old replicas pending termination",
            id="old replicas",
        ),
        pytest.param(
            workload(kind="StatefulSet", updated=1),
            "wait",
            "1 of 3 replicas updated",
            id="statefulset",
        ),
        pytest.param(
            workload(kind="ReplicaSet", updated=0), "admit", "", id="replicaset has no rollout"
        ),
        pytest.param(
            workload(kind="ReplicaSet", generation=3, observed=2),
            "wait",
            "generation 3 is not observed yet",
            id="replicaset spec not observed",
        ),
    ],
)
def test_rollout_in_progress(owner: Object, verdict: str, message: str) -> None:
    decision = one(workloads=[owner], **LOOSE)
    assert decision.verdict == verdict
    if verdict == "wait":
        assert decision.reason == "RolloutInProgress"
        assert message in decision.message


@pytest.mark.parametrize(
    ("replicas", "mode", "args", "verdict"),
    [
        (1, "EvictDirectly", {}, "wait"),
        (1, "ReservationFirst", {}, "admit"),  # Berth's default: the quick start works
        (1, "EvictDirectly", {"skipCheckExpectedReplicas": True}, "admit"),
        (2, "EvictDirectly", {}, "admit"),
        (3, "EvictDirectly", {"maxUnavailablePerWorkload": "100%"}, "wait"),
        (3, "EvictDirectly", {"maxMigratingPerWorkload": 3}, "wait"),
        (4, "EvictDirectly", {}, "admit"),
    ],
)
def test_expected_replicas(replicas: int, mode: str, args: dict[str, Any], verdict: str) -> None:
    web = pods_of(count=replicas)
    decision = one(web[0], pods=web, workloads=[workload(replicas=replicas)], mode=mode, **args)
    assert decision.verdict == verdict
    if verdict == "wait":
        assert decision.reason == "ExpectedReplicas"
        assert "skipCheckExpectedReplicas" in decision.message


# ----- descheduler.alpha.kubernetes.io/evict ----------------------------------------------

BYPASS = {keys.DESCHEDULER_EVICT: "true"}


@pytest.mark.parametrize(
    ("setting", "reason_without", "bypassed"),
    [
        pytest.param({"in_flight": "node"}, "MaxMigratingPerNode", True, id="maxMigratingPerNode"),
        pytest.param(
            {"in_flight": "namespace", "maxMigratingPerNamespace": 1},
            "MaxMigratingPerNamespace",
            True,
            id="maxMigratingPerNamespace",
        ),
        pytest.param(
            {"in_flight": "workload", "maxMigratingPerNode": 0},
            "MaxMigratingPerWorkload",
            True,
            id="maxMigratingPerWorkload",
        ),
        pytest.param(
            {"available": 2, "maxMigratingPerWorkload": 3},
            "MaxUnavailablePerWorkload",
            True,
            id="maxUnavailablePerWorkload",
        ),
        pytest.param(
            {
                "objectLimiters": {"workload": {"duration": "5m", "maxMigrating": 1}},
                "admitted": True,
            },
            "ObjectLimiters",
            True,
            id="objectLimiters",
        ),
        pytest.param({"pdbs": [pdb(allowed=0)]}, "BlockedByPDB", False, id="PDB"),
        pytest.param({"updated": 2}, "RolloutInProgress", False, id="rollout"),
        pytest.param(
            {"mode": "EvictDirectly", "replicas": 1},
            "ExpectedReplicas",
            False,
            id="expected replicas",
        ),
        pytest.param(
            {"evictQPS": 1, "limiter": LimiterState(TokenBucket(0.0, T0))},
            "EvictQPS",
            False,
            id="evictQPS",
        ),
        pytest.param(
            {"in_flight": "namespace", "maxMigratingGlobally": 1},
            "MaxMigratingGlobally",
            False,
            id="maxMigratingGlobally",
        ),
        pytest.param({"emptyDir": True}, "ForbiddenMigratePod", False, id="local storage"),
    ],
)
def test_descheduler_evict_annotation_lifts_only_the_retryable_limits(
    setting: dict[str, Any], reason_without: str, bypassed: bool
) -> None:
    setting = dict(setting)
    replicas = setting.pop("replicas", 3)
    api = pods_of("api", 3, nodes=["node-0", "node-5", "node-6"])

    def decision(annotated: bool) -> Decision:
        web = pods_of(count=replicas)
        if annotated:
            web[0]["metadata"]["annotations"].update(BYPASS)
        if setting.get("emptyDir"):
            web[0]["spec"]["volumes"] = [{"name": "cache", "emptyDir": {}}]
        in_flight = {
            "node": [
                running("run-0", api[0]),
                running("run-1", api[0] | {"metadata": api[0]["metadata"] | {"name": "api-x"}}),
            ],
            "namespace": [running("run-0", api[1])],
            "workload": [running("run-0", web[1])] if replicas > 1 else [],
            None: [],
        }[setting.get("in_flight")]
        args = {
            k: v
            for k, v in setting.items()
            if k
            not in (
                "in_flight",
                "available",
                "updated",
                "admitted",
                "emptyDir",
                "pdbs",
                "mode",
                "limiter",
            )
        }
        admitted = {"uid-web": (T0 - timedelta(minutes=1),)} if setting.get("admitted") else {}
        limiter = setting.get("limiter") or LimiterState(workload_admissions=admitted)
        result = decide(
            [pending("job-1", web[0], mode=setting.get("mode", "ReservationFirst"))],
            pods=[*web, *api],
            in_flight=in_flight,
            pdbs=setting.get("pdbs", ()),
            workloads=[
                workload(
                    replicas=replicas,
                    available=setting.get("available"),
                    updated=setting.get("updated"),
                ),
                workload("api"),
            ],
            limiter=limiter,
            **args,
        )
        return of(result)

    assert decision(annotated=False).reason == reason_without
    assert decision(annotated=True).verdict == (
        "admit" if bypassed else decision(annotated=False).verdict
    )


# ----- no deadlock ------------------------------------------------------------------------


@pytest.mark.parametrize(("jobs", "limit"), [(2, 2), (3, 2), (10, 2), (5, 1), (4, 3)])
def test_pending_jobs_never_block_themselves(jobs: int, limit: int) -> None:
    """N jobs on one node and nothing in flight: exactly `limit` start, never none."""
    web = pods_of(count=jobs, nodes=["node-0"] * jobs)
    result = decide(
        [pending(f"job-{i}", web[i], age=100 - i) for i in range(jobs)],
        pods=web,
        workloads=[workload(replicas=jobs)],
        maxMigratingPerNode=limit,
        maxMigratingPerWorkload="100%",
        maxUnavailablePerWorkload="100%",
    )
    admitted = [name for name, verdict in verdicts(result).items() if verdict == "admit"]
    assert admitted == [f"job-{i}" for i in range(min(jobs, limit))]
    for decision in result.decisions:
        if decision.verdict == "wait":
            assert decision.message == (
                f"{limit} migrations already run on node node-0 (maxMigratingPerNode {limit})"
            )


def test_workload_limits_never_block_themselves() -> None:
    web = pods_of(count=10)
    result = decide(
        [pending(f"job-{i}", web[i], age=100 - i) for i in range(10)],
        pods=web,
        workloads=[workload(replicas=10)],
    )
    assert list(verdicts(result).values()).count("admit") == 2  # the size table's 2 for 10


# ----- sorting ----------------------------------------------------------------------------


def qos(kube: str | None = None, koordinator: str | None = None) -> Tweak:
    def apply(target: Object) -> None:
        if kube:
            target["status"]["qosClass"] = kube
        if koordinator:
            target["metadata"]["labels"][KOORDINATOR_QOS] = koordinator

    return apply


GUARANTEED = tweak(
    spec__containers=[
        {
            "name": "app",
            "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"},
                "limits": {"cpu": "1000m", "memory": "1Gi"},
            },
        }
    ]
)
BURSTABLE = tweak(spec__containers=[{"name": "app", "resources": {"requests": {"cpu": "1"}}}])
BEST_EFFORT = tweak(spec__containers=[{"name": "app"}])


@pytest.mark.parametrize(
    ("first", "second", "setting"),
    [
        pytest.param(qos(koordinator="LSE"), qos(koordinator="LSR"), {}, id="LSE before LSR"),
        pytest.param(qos(koordinator="LSR"), qos(koordinator="LS"), {}, id="LSR before LS"),
        pytest.param(qos(koordinator="LS"), qos(koordinator="BE"), {}, id="LS before BE"),
        pytest.param(
            qos(kube="Burstable"),
            qos(kube="BestEffort"),
            {},
            id="unlabelled Burstable counts as LS, before BestEffort",
        ),
        pytest.param(
            qos(kube="Guaranteed"), qos(kube="Burstable"), {}, id="Guaranteed before Burstable"
        ),
        pytest.param(
            qos(kube="Burstable", koordinator="LSR"),
            qos(kube="Guaranteed"),
            {},
            id="koordinator class before Kubernetes class",
        ),
        pytest.param(GUARANTEED, BURSTABLE, {}, id="Guaranteed from requests and limits"),
        pytest.param(BURSTABLE, BEST_EFFORT, {}, id="BestEffort from no resources"),
        pytest.param(
            tweak(spec__priority=100), tweak(spec__priority=10), {}, id="higher priority first"
        ),
        pytest.param(
            annotate({keys.EVICTION_COST: "-5"}),
            annotate({keys.EVICTION_COST: "7"}),
            {},
            id="lower eviction cost first",
        ),
        pytest.param(tweak(), tweak(), {"failed": "a-0"}, id="fewer past failures first"),
        pytest.param(tweak(), tweak(), {"migrated": "uid-a"}, id="fewer workload migrations first"),
        pytest.param(tweak(), tweak(), {"migrating": "a"}, id="fewer replicas migrating first"),
    ],
)
def test_sort_order(first: Tweak, second: Tweak, setting: dict[str, str]) -> None:
    """Two jobs on one node that takes one more migration: the one that sorts first goes,
    although it is the younger job."""
    a = tweaked(pods_of("a", 1, nodes=["node-0"])[0], second)
    b = tweaked(pods_of("b", 1, nodes=["node-0"])[0], first)
    others = [
        *pods_of("a", 3, nodes=["node-0", "node-7", "node-8"])[1:],
        *pods_of("b", 3, nodes=["node-0", "node-7", "node-8"])[1:],
    ]
    history, in_flight = [], []
    if "failed" in setting:
        history.append(running("old-1", a, phase="Failed"))
    if "migrated" in setting:
        history.append(running("old-2", others[0], phase="Succeeded"))
    if "migrating" in setting:
        in_flight.append(running("run-1", others[1]))
        in_flight[0]["metadata"]["annotations"][keys.SOURCE_NODE] = "node-9"
    result = decide(
        [pending("job-a", a, age=60), pending("job-b", b, age=0)],
        pods=[a, b, *others],
        workloads=[workload("a"), workload("b")],
        history=history,
        in_flight=in_flight,
        maxMigratingPerNode=1,
        maxMigratingPerWorkload="100%",
        maxUnavailablePerWorkload="100%",
    )
    assert verdicts(result) == {"job-a": "wait", "job-b": "admit"}


@pytest.mark.parametrize(
    ("ages", "names", "admitted"),
    [
        ((60, 0), ("job-a", "job-b"), "job-a"),  # the older job first
        ((0, 60), ("job-a", "job-b"), "job-b"),
        ((0, 0), ("job-b", "job-a"), "job-a"),  # then by name
    ],
)
def test_ties_go_to_the_older_job_then_the_name(
    ages: tuple[int, int], names: tuple[str, str], admitted: str
) -> None:
    web = pods_of(count=2, nodes=["node-0", "node-0"])
    result = decide(
        [pending(names[0], web[0], age=ages[0]), pending(names[1], web[1], age=ages[1])],
        pods=web,
        workloads=[workload()],
        maxMigratingPerNode=1,
    )
    assert [n for n, v in verdicts(result).items() if v == "admit"] == [admitted]


def test_admitted_jobs_count_at_once_across_limits() -> None:
    """Per node, per namespace and per workload counts all grow with each admission."""
    web = pods_of(count=6, nodes=["node-0", "node-0", "node-1", "node-2", "node-3", "node-4"])
    result = decide(
        [pending(f"job-{i}", web[i], age=100 - i) for i in range(6)],
        pods=web,
        workloads=[workload(replicas=6)],
        maxMigratingPerNode=1,
        maxMigratingPerNamespace=3,
        maxMigratingPerWorkload="100%",
        maxUnavailablePerWorkload="100%",
    )
    assert [(d.job["metadata"]["name"], d.verdict, d.reason) for d in result.decisions] == [
        ("job-0", "admit", ""),
        ("job-1", "wait", "MaxMigratingPerNode"),
        ("job-2", "admit", ""),
        ("job-3", "admit", ""),
        ("job-4", "wait", "MaxMigratingPerNamespace"),
        ("job-5", "wait", "MaxMigratingPerNamespace"),
    ]


# ----- flow control -----------------------------------------------------------------------


def spread(count: int) -> tuple[list[Object], list[Object]]:
    """`count` pending jobs, each for a pod of its own workload on its own node."""
    members = [pods_of(f"app{i}", 1, nodes=[f"node-{i}"])[0] for i in range(count)]
    return [pending(f"job-{i}", member, age=100 - i) for i, member in enumerate(members)], members


def spread_workloads(count: int) -> list[Object]:
    return [workload(f"app{i}", replicas=1) for i in range(count)]


@pytest.mark.parametrize(
    ("qps", "burst", "state", "now", "admitted", "tokens"),
    [
        (10, 2, None, T0, 2, 0.0),  # a new bucket is full
        (10, 2, TokenBucket(0.0, T0), later(0.1), 1, 0.0),  # one token per 100ms
        (10, 2, TokenBucket(0.0, T0), later(0.05), 0, 0.5),
        (10, 2, TokenBucket(0.0, T0), later(100), 2, 0.0),  # never more than the burst
        (1, 3, TokenBucket(1.5, T0), T0, 1, 0.5),
        (0, 1, TokenBucket(0.0, T0), T0, 3, None),  # 0 is no limit
    ],
)
def test_evict_qps_token_bucket(
    qps: float, burst: int, state: TokenBucket | None, now: Any, admitted: int, tokens: float | None
) -> None:
    jobs, members = spread(3)
    result = decide(
        jobs,
        pods=members,
        workloads=spread_workloads(3),
        now=now,
        limiter=LimiterState(evictions=state or TokenBucket()),
        evictQPS=qps,
        evictBurst=burst,
        maxMigratingPerNode=0,
    )
    assert list(verdicts(result).values()).count("admit") == admitted
    waiting = [d for d in result.decisions if d.verdict == "wait"]
    assert all(d.reason == "EvictQPS" for d in waiting)
    if tokens is None:
        assert result.limiter.evictions == TokenBucket()
    else:
        assert result.limiter.evictions.tokens == pytest.approx(tokens)
        assert result.limiter.evictions.updated == now


def test_flow_control_qps() -> None:
    jobs, members = spread(3)
    result = decide(
        jobs, pods=members, workloads=spread_workloads(3), flowControlQPS=2, flowControlBurst=2
    )
    assert [d.reason for d in result.decisions] == ["", "", "FlowControlQPS"]
    assert result.limiter.admissions == TokenBucket(0.0, T0)


@pytest.mark.parametrize(
    ("before", "admitted", "kept"),
    [
        ((), ["job-0"], 1),  # then the second waits
        ((T0 - timedelta(minutes=1),), [], 1),
        ((T0 - timedelta(minutes=6),), ["job-0"], 1),  # outside the window: pruned
    ],
)
def test_object_limiters(before: tuple[Any, ...], admitted: list[str], kept: int) -> None:
    web = pods_of(count=3)
    result = decide(
        [pending("job-0", web[0], age=10), pending("job-1", web[1])],
        pods=web,
        workloads=[workload()],
        limiter=LimiterState(workload_admissions={"uid-web": before}),
        objectLimiters={"workload": {"duration": "5m", "maxMigrating": 1}},
        **LOOSE,
    )
    assert [n for n, v in verdicts(result).items() if v == "admit"] == admitted
    assert of(result, "job-1").reason == "ObjectLimiters"
    assert len(result.limiter.workload_admissions["uid-web"]) == kept


# ----- nodeFit ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "free", "change", "args", "verdict"),
    [
        pytest.param(node(), 1000, tweak(), {}, "admit", id="fits"),
        pytest.param(node(), 100, tweak(), {}, "wait", id="no room"),
        pytest.param(node(ready=False), 1000, tweak(), {}, "wait", id="not ready"),
        pytest.param(node(unschedulable=True), 1000, tweak(), {}, "wait", id="cordoned"),
        pytest.param(
            node(taints=[{"key": "gpu", "effect": "NoSchedule"}]),
            1000,
            tweak(),
            {},
            "wait",
            id="taint",
        ),
        pytest.param(
            node(taints=[{"key": "gpu", "effect": "NoSchedule"}]),
            1000,
            tweak(spec__tolerations=[{"key": "gpu", "operator": "Exists"}]),
            {},
            "admit",
            id="tolerated taint",
        ),
        pytest.param(
            node(taints=[{"key": "gpu", "value": "a", "effect": "NoExecute"}]),
            1000,
            tweak(spec__tolerations=[{"key": "gpu", "value": "b"}]),
            {},
            "wait",
            id="toleration of another value",
        ),
        pytest.param(
            node(taints=[{"key": "gpu", "effect": "PreferNoSchedule"}]),
            1000,
            tweak(),
            {},
            "admit",
            id="soft taint",
        ),
        pytest.param(
            node(),
            1000,
            tweak(spec__nodeSelector={"disk": "ssd"}),
            {},
            "wait",
            id="pod nodeSelector",
        ),
        pytest.param(
            node(labels={"disk": "ssd"}),
            1000,
            tweak(spec__nodeSelector={"disk": "ssd"}),
            {},
            "admit",
            id="pod nodeSelector matches",
        ),
        pytest.param(
            node(labels={"zone": "b"}),
            1000,
            tweak(
                spec__affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "zone", "operator": "In", "values": ["a"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            ),
            {},
            "wait",
            id="required affinity",
        ),
        pytest.param(
            node(labels={"cores": "8"}),
            1000,
            tweak(
                spec__affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "zone", "operator": "In", "values": ["a"]}
                                    ]
                                },
                                {
                                    "matchExpressions": [
                                        {"key": "cores", "operator": "Gt", "values": ["4"]}
                                    ]
                                },
                            ]
                        }
                    }
                }
            ),
            {},
            "admit",
            id="any affinity term",
        ),
        pytest.param(
            node(labels={"pool": "mem"}),
            1000,
            tweak(),
            {"nodeSelector": "pool=general"},
            "wait",
            id="nodeSelector of the config",
        ),
        pytest.param(
            node(labels={"pool": "general"}),
            1000,
            tweak(),
            {"nodeSelector": "pool in (general, batch), !spot"},
            "admit",
            id="nodeSelector of the config matches",
        ),
        pytest.param(node(), None, tweak(), {}, "wait", id="node without free capacity known"),
    ],
)
def test_node_fit(
    target: Object, free: int | None, change: Tweak, args: dict[str, Any], verdict: str
) -> None:
    source = node("node-0")
    capacity = {"node-0": 4000, **({"node-1": free} if free is not None else {})}
    decision = one(
        tweaked(pods_of()[0], change), nodes=[source, target], free=capacity, nodeFit=True, **args
    )
    assert decision.verdict == verdict
    if verdict == "wait":
        assert decision.reason == "NodeFit"
        assert "cpu 200m" in decision.message


def test_node_fit_off_by_default() -> None:
    assert one(nodes=[node("node-0")], free={"node-0": 4000}).verdict == "admit"


# ----- arbitration disabled ---------------------------------------------------------------


def test_disabled_arbitration_admits_all_but_still_forbids() -> None:
    web = pods_of(count=4, nodes=["node-0"] * 4)
    web[3]["spec"]["volumes"] = [{"name": "cache", "emptyDir": {}}]
    state = LimiterState(TokenBucket(0.0, T0))
    result = decide(
        [pending(f"job-{i}", web[i]) for i in range(4)] + [pending("job-9", pod("gone"))],
        pods=web,
        workloads=[workload(updated=1)],
        pdbs=[pdb(allowed=0)],
        limiter=state,
        evictQPS=1,
        arbitrationArgs={"enabled": False},
    )
    assert verdicts(result) == {
        "job-0": "admit",
        "job-1": "admit",
        "job-2": "admit",
        "job-3": "fail",
        "job-9": "fail",
    }
    assert result.limiter is state


# ----- the memo: a round reuses only what it read from the very same objects ---------------


def round_with(
    memo: Memo | None,
    *,
    jobs: Sequence[Object],
    pods: Sequence[Object],
    workloads: Sequence[Object],
    args: MigrationControllerArgs,
) -> Arbitration:
    return arbitrate(
        Snapshot(
            pending=jobs,
            in_flight=(),
            pods={f"default/{p['metadata']['name']}": p for p in pods},
            workload_of=workload_of(pods),
            workloads={w["metadata"]["uid"]: w for w in workloads},
            args=args,
            memo=memo,
            now=T0,
        )
    )


def test_memo_rereads_a_replaced_pod() -> None:
    members, args = pods_of(), MigrationControllerArgs.model_validate(LOOSE)
    jobs = [pending("job-1", members[0])]
    first = round_with(None, jobs=jobs, pods=members, workloads=[workload()], args=args)
    assert of(first).verdict == "admit"
    changed = tweaked(
        copy.deepcopy(members[0]), annotate({keys.EVICTION_COST: str(keys.EVICTION_COST_NEVER)})
    )
    second = round_with(
        first.memo, jobs=jobs, pods=[changed, *members[1:]], workloads=[workload()], args=args
    )
    assert (of(second).verdict, of(second).reason) == ("fail", "ForbiddenMigratePod")


def test_memo_rereads_a_replaced_workload() -> None:
    members, args = pods_of(), MigrationControllerArgs.model_validate(LOOSE)
    jobs = [pending("job-1", members[0])]
    first = round_with(None, jobs=jobs, pods=members, workloads=[workload()], args=args)
    second = round_with(
        first.memo, jobs=jobs, pods=members, workloads=[workload(updated=2)], args=args
    )
    assert (of(first).verdict, of(second).reason) == ("admit", "RolloutInProgress")


def test_memo_is_dropped_with_another_configuration() -> None:
    members = pods_of()
    target = tweaked(members[0], tweak(spec__volumes=[{"name": "scratch", "emptyDir": {}}]))
    jobs = [pending("job-1", target)]
    allowing = MigrationControllerArgs.model_validate({**LOOSE, "evictLocalStoragePods": True})
    first = round_with(None, jobs=jobs, pods=members, workloads=[workload()], args=allowing)
    second = round_with(
        first.memo,
        jobs=jobs,
        pods=members,
        workloads=[workload()],
        args=MigrationControllerArgs.model_validate(LOOSE),
    )
    assert (of(first).verdict, of(second).reason) == ("admit", "ForbiddenMigratePod")
    assert "emptyDir volume scratch" in of(second).message


def test_memo_keeps_only_what_the_round_read() -> None:
    members, args = pods_of(), MigrationControllerArgs.model_validate(LOOSE)
    jobs = [pending("job-1", members[0]), pending("job-2", members[1])]
    first = round_with(None, jobs=jobs, pods=members, workloads=[workload()], args=args)
    second = round_with(first.memo, jobs=jobs[1:], pods=members, workloads=[workload()], args=args)
    assert [c.job for c in first.memo.jobs.values()] == jobs
    assert [c.job for c in second.memo.jobs.values()] == jobs[1:]
