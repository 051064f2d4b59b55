"""PodDisruptionBudgets: a healthy pod needs a disruption left in every PDB covering it,
less those taken by migrations."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.unit.arbitration.helpers import (
    LOOSE,
    Object,
    decide,
    one,
    pending,
    pods_of,
    running,
    tweak,
    tweaked,
    verdicts,
)
from tests.unit.builders import T0, pdb, pod, ts, workload

# ----- PodDisruptionBudgets ---------------------------------------------------------------


def no_selector() -> Object:
    budget = pdb(allowed=0)
    budget["spec"]["selector"] = None
    return budget


def sparing(
    budget: Object,
    *,
    policy: str | None = None,
    current: int | None = None,
    desired: int | None = None,
    generation: int | None = None,
    observed: int | None = None,
) -> Object:
    """`budget` with its unhealthy pod eviction policy, healthy counts and generations."""
    if policy is not None:
        budget["spec"]["unhealthyPodEvictionPolicy"] = policy
    if current is not None:
        budget["status"] |= {"currentHealthy": current, "desiredHealthy": desired}
    if generation is not None:
        budget["metadata"]["generation"] = generation
        budget["status"]["observedGeneration"] = observed
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
            [sparing(pdb(allowed=1), current=3, desired=2)],
            "not ready",
            True,
            "admit",
            "",
            id="migrating pod not ready, its budget sparing it: takes none",
        ),
        pytest.param(
            [sparing(pdb(allowed=1), current=1, desired=0)],
            "not ready",
            True,
            "wait",
            "(disruptionsAllowed 1, 1 taken by migrations)",
            id="migrating pod not ready, a budget asking for none healthy: takes one",
        ),
        pytest.param([pdb(allowed=1)], "gone", True, "admit", "", id="migrating pod gone"),
        pytest.param(
            [pdb(allowed=0)],
            None,
            False,
            "wait",
            "allows no more disruptions",
            id="unhealthy pod, its workload short of the budget: takes one",
        ),
        pytest.param(
            [sparing(pdb(allowed=0), policy="AlwaysAllow")],
            None,
            False,
            "admit",
            "",
            id="unhealthy pod, AlwaysAllow: takes none",
        ),
        pytest.param(
            [sparing(pdb(allowed=0), current=3, desired=3)],
            None,
            False,
            "admit",
            "",
            id="unhealthy pod, its workload as healthy as the budget asks: takes none",
        ),
        pytest.param(
            [sparing(pdb(allowed=0), current=0, desired=0)],
            None,
            False,
            "wait",
            "allows no more disruptions",
            id="unhealthy pod, a budget asking for none healthy: takes one",
        ),
        pytest.param(
            [sparing(pdb(allowed=3), generation=2, observed=1)],
            None,
            True,
            "wait",
            "(disruptionsAllowed 0, 0 taken by migrations)",
            id="a budget changed since the disruption controller last saw it",
        ),
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


@pytest.mark.parametrize(
    ("policy", "budgets", "verdict", "message"),
    [
        pytest.param(
            "Eviction",
            [pdb(allowed=3), pdb("all", allowed=3, selector={})],
            "wait",
            "covered by more than one PodDisruptionBudget (default/all, default/web-pdb)",
            id="the Eviction API: more than one budget, whatever they allow",
        ),
        pytest.param(
            "Delete",
            [pdb(allowed=3), pdb("all", allowed=0, selector={})],
            "wait",
            "PodDisruptionBudget default/all allows no more disruptions",
            id="a delete: every covering budget counts",
        ),
        pytest.param(
            "Delete",
            [pdb(allowed=3), pdb("all", allowed=1, selector={})],
            "admit",
            "",
            id="a delete: each covering budget has one left",
        ),
    ],
)
def test_a_pod_several_budgets_cover(
    policy: str, budgets: list[Object], verdict: str, message: str
) -> None:
    """The Eviction API refuses (500) a pod more than one budget selects: such a job waits
    rather than reserve a place for an eviction that cannot happen."""
    web = pods_of(count=4)
    decision = one(
        web[0],
        pods=web,
        workloads=[workload(replicas=4)],
        pdbs=budgets,
        evictionPolicy=policy,
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


def test_a_pod_the_eviction_api_deletes_as_asked_meets_no_budget() -> None:
    """A pod still Pending (bound, its containers not started) is deleted by the Eviction
    API without looking at budgets, however many select it."""
    web = pods_of(count=4)
    web[0] = tweaked(web[0], tweak(status__phase="Pending"))
    decision = one(
        web[0],
        pods=web,
        workloads=[workload(replicas=4)],
        pdbs=[pdb(allowed=0), pdb("all", allowed=0, selector={})],
        **LOOSE,
    )
    assert decision.verdict == "admit", decision.message
