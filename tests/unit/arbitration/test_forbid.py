"""Forbidden pods: a job whose pod fails an evictability check the configuration sets
fails, with the rule named; a pod the configuration allows is admitted."""

from __future__ import annotations

from typing import Any

import pytest

from berth.api import keys
from tests.unit.arbitration.helpers import (
    Tweak,
    annotate,
    one,
    pods_of,
    tweak,
    tweaked,
)
from tests.unit.builders import T0, ts

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
            tweak(spec__schedulerName="volcano"),
            {},
            "pod's scheduler volcano is not in schedulerNames (default-scheduler, koord-scheduler)",
            id="schedulerNames",
        ),
        pytest.param(
            lambda p: p["metadata"]["ownerReferences"][0].update(
                apiVersion="apps.kruise.io/v1alpha1", kind="CloneSet"
            ),
            {},
            "pod's controller is a apps.kruise.io/v1alpha1 CloneSet; Berth binds a Reservation "
            "only to a replacement made by a ReplicaSet, StatefulSet or Job",
            id="a controller kind whose replacement Berth cannot bind",
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
            tweak(spec__schedulerName="koord-scheduler"), {}, id="koord-scheduler by default"
        ),
        pytest.param(
            tweak(spec__schedulerName="volcano"),
            {"schedulerNames": ["default-scheduler", "volcano"]},
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
    target = tweaked(pods_of()[0], tweak(spec__schedulerName="volcano"))
    assert one(target, mode="EvictDirectly").verdict == "admit"


@pytest.mark.parametrize(
    ("api_version", "kind", "mode", "verdict"),
    [
        pytest.param("apps/v1", "StatefulSet", "ReservationFirst", "admit", id="StatefulSet"),
        pytest.param("batch/v1", "Job", "ReservationFirst", "admit", id="Job"),
        pytest.param("example.com/v1", "Game", "ReservationFirst", "fail", id="custom kind"),
        pytest.param("example.com/v1", "Game", "EvictDirectly", "admit", id="custom, direct"),
    ],
)
def test_reservation_first_needs_a_controller_berth_binds(
    api_version: str, kind: str, mode: str, verdict: str
) -> None:
    target = tweaked(
        pods_of()[0],
        lambda p: p["metadata"]["ownerReferences"][0].update(apiVersion=api_version, kind=kind),
    )
    # One replica: EvictDirectly would otherwise wait for the expected-replicas rule.
    decision = one(target, mode=mode, skipCheckExpectedReplicas=True)
    assert decision.verdict == verdict, decision.message


def test_a_threshold_naming_no_priority_class_keeps_jobs_waiting_not_failed() -> None:
    """A typo, or a class deleted and made again in an upgrade: failing every job would
    lose them all for good; they wait, saying why, and go on once the class exists."""
    decision = one(priorityThreshold={"name": "missing"})
    assert (decision.verdict, decision.reason) == ("wait", "PriorityThreshold")
    assert "PriorityClass missing of priorityThreshold.name does not exist" in decision.message
    found = one(priorityThreshold={"name": "batch"}, priority_classes={"batch": 1000})
    assert found.verdict == "admit"


def test_a_threshold_naming_no_priority_class_holds_nothing_back_when_lifted() -> None:
    """evictSystemCriticalPods allows pods of any priority: the threshold, lifted, keeps
    no job waiting for its class."""
    decision = one(priorityThreshold={"name": "missing"}, evictSystemCriticalPods=True)
    assert decision.verdict == "admit", decision.message
