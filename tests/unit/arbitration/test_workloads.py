"""Workloads as the limits see them: GetMaxUnavailable's size table, rollouts in
progress and expected replicas."""

from __future__ import annotations

from typing import Any

import pytest

from controller.arbitration import (
    max_per_workload,
)
from tests.unit.arbitration.helpers import (
    LOOSE,
    Object,
    one,
    pods_of,
)
from tests.unit.builders import workload

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


# ----- rollouts and expected replicas -----------------------------------------------------


def old_replicas(deployment: Object) -> Object:
    deployment["status"]["replicas"] = 4
    return deployment


def strategy(statefulset: Object, **update: Any) -> Object:
    statefulset["spec"]["updateStrategy"] = update
    return statefulset


@pytest.mark.parametrize(
    ("owner", "verdict", "message"),
    [
        pytest.param(workload(), "admit", "", id="settled"),
        pytest.param(
            strategy(
                workload(kind="StatefulSet", updated=1),
                type="RollingUpdate",
                rollingUpdate={"partition": 2},
            ),
            "admit",
            "",
            id="statefulset updated from its partition up",
        ),
        pytest.param(
            strategy(
                workload(kind="StatefulSet", updated=0),
                type="RollingUpdate",
                rollingUpdate={"partition": 2},
            ),
            "wait",
            "0 of 1 replicas updated",
            id="statefulset partitioned, not updated",
        ),
        pytest.param(
            strategy(workload(kind="StatefulSet", updated=0), type="OnDelete"),
            "admit",
            "",
            id="statefulset updated on delete: never rolls out by itself",
        ),
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


def test_finished_pods_of_an_owner_berth_does_not_cache_are_no_replicas() -> None:
    """A batch Job's Succeeded pods stay until the Job is deleted: counted as replicas,
    they read as unavailable ones, and the running pods waited for ever."""
    web = pods_of(count=4)
    for done in web[2:]:
        done["status"]["phase"] = "Succeeded"
    decision = one(web[0], pods=web, workloads=[], mode="EvictDirectly")
    assert decision.verdict == "admit", decision.message
