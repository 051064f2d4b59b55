"""The counting limits: per node, namespace, cluster and workload, unavailability, and
the rule that a Pending job never blocks itself."""

from __future__ import annotations

import pytest

from tests.unit.arbitration.helpers import (
    decide,
    one,
    pending,
    pods_of,
    running,
    verdicts,
)
from tests.unit.builders import pod, workload

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


def test_a_workload_uid_named_in_another_namespace_is_another_workload() -> None:
    """Pods may name any UID as their controller: pods of namespace `other` whose
    controller names web's UID (a ReplicaSet of `default` and the Deployment above it)
    count neither against web's limits nor read web's status; the garbage collector
    deletes them, and until then they are a workload of their own namespace."""
    web, forged = pods_of(count=3), pods_of(count=2, namespace="other", nodes=["node-8"] * 2)
    in_flight = [running(f"far-{i}", forged[i]) for i in range(2)]
    decision = one(
        web[0],
        pods=[*web, *forged],
        workloads=[workload(replicas=3)],
        in_flight=in_flight,
        maxMigratingPerWorkload=1,
        maxUnavailablePerWorkload=1,
        maxMigratingPerNode=0,
    )
    assert decision.verdict == "admit"
    mine = one(
        web[0],
        pods=web,
        workloads=[workload(replicas=3)],
        in_flight=[running("near-0", web[1])],
        maxMigratingPerWorkload=1,
        maxUnavailablePerWorkload=1,
    )
    assert (mine.verdict, mine.reason) == ("wait", "MaxMigratingPerWorkload")


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
    *, replicas: int, available: int, limit: int | str, migrating: int, ready: bool, verdict: str
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


def test_a_terminating_pod_counts_as_unavailable_before_the_status_says_so() -> None:
    """4 replicas, maxUnavailable 1: job 1's pod has started terminating, and the
    Deployment's status, written a moment later, still counts 4 available. Job 2 waits:
    the seed counts migrating pods as unavailable, whatever the status says."""
    web = pods_of(count=4)
    web[1]["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    decision = one(
        web[0],
        pods=web,
        workloads=[workload(replicas=4, available=4)],
        in_flight=[running("run-1", web[1])],
        maxUnavailablePerWorkload=1,
        maxMigratingPerWorkload=2,
    )
    assert (decision.verdict, decision.reason) == ("wait", "MaxUnavailablePerWorkload")


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
    # EvictDirectly: Berth binds no Reservation to a CloneSet's replacement.
    decision = one(
        clones[0],
        pods=clones,
        workloads=[clone_set],
        maxMigratingPerWorkload=3,
        mode="EvictDirectly",
        skipCheckExpectedReplicas=True,
    )
    assert (decision.verdict, decision.reason) == (
        verdict,
        "" if verdict == "admit" else "MaxUnavailablePerWorkload",
    )


def test_an_owner_berth_does_not_know_counts_its_pods_as_replicas() -> None:
    lonely = pods_of("job", 1)
    decision = one(lonely[0], pods=lonely, workloads=[], mode="EvictDirectly")
    assert (decision.verdict, decision.reason) == ("wait", "ExpectedReplicas")


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
