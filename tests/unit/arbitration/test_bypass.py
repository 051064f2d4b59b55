"""descheduler.alpha.kubernetes.io/evict lifts the retryable limits, and only those."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from berth.api import keys
from controller.arbitration import (
    Decision,
    LimiterState,
    TokenBucket,
)
from tests.unit.arbitration.helpers import (
    decide,
    of,
    pending,
    pods_of,
    running,
)
from tests.unit.builders import T0, pdb, workload

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
        admitted = (
            {"default/uid-web": (T0 - timedelta(minutes=1),)} if setting.get("admitted") else {}
        )
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


def test_a_job_made_from_an_eviction_lifts_no_limit_with_the_annotation() -> None:
    """Whoever may evict a pod may annotate it too: for a job the webhook made from their
    eviction, the annotation lifts none of the cluster's limits."""
    api = pods_of("api", 3, nodes=["node-0", "node-5", "node-6"])
    web = pods_of(count=3)
    web[0]["metadata"]["annotations"].update(BYPASS)
    busy = api[0] | {"metadata": api[0]["metadata"] | {"name": "api-x"}}
    verdicts = {}
    for requested in (False, True):
        job = pending("job-1", web[0])
        if requested:
            job["metadata"].setdefault("annotations", {})[keys.REQUESTER] = "tenant"
        result = decide(
            [job],
            pods=[*web, *api],
            in_flight=[running("run-0", api[0]), running("run-1", busy)],
            workloads=[workload(replicas=3), workload("api")],
        )
        verdicts[requested] = of(result)
    assert verdicts[False].verdict == "admit"
    assert verdicts[True].reason == "MaxMigratingPerNode"
