"""The order: which of two jobs a scarce limit lets through."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.api import keys
from controller.arbitration.order import KOORDINATOR_QOS, RUN, sorted_in_steps
from tests.unit.arbitration.helpers import (
    Object,
    Tweak,
    annotate,
    decide,
    pending,
    pods_of,
    running,
    tweak,
    tweaked,
    verdicts,
)
from tests.unit.builders import workload

# ----- sorting ----------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 3 * RUN + 7), st.randoms(use_true_random=False))
def test_sorting_in_steps_sorts_as_one_sort_does(length: int, rng: random.Random) -> None:
    # Few distinct keys, so that many are equal: they keep their order, as in one sort.
    items = [(rng.randrange(4), rng.choice("ab"), index) for index in range(length)]
    assert sorted_in_steps(items, lambda item: item[:2]) == sorted(items, key=lambda i: i[:2])


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
        history.append(running("old-2", others[0], phase="Succeed"))
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
