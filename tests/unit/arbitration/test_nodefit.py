"""nodeFit: a job waits while no other node could take its pod."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.arbitration.helpers import (
    Object,
    Tweak,
    one,
    pods_of,
    tweak,
    tweaked,
)
from tests.unit.builders import node

# ----- nodeFit ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "free", "change", "args", "verdict"),
    [
        pytest.param(node(), 1000, tweak(), {}, "admit", id="fits"),
        pytest.param(node(), 100, tweak(), {}, "wait", id="no room"),
        pytest.param(node(), (1000, 0), tweak(), {}, "wait", id="no pod slot left"),
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
    target: Object,
    free: int | tuple[int, int] | None,
    change: Tweak,
    args: dict[str, Any],
    verdict: str,
) -> None:
    source = node("node-0")
    capacity: dict[str, int | tuple[int, int]] = {
        "node-0": 4000,
        **({"node-1": free} if free is not None else {}),
    }
    decision = one(
        tweaked(pods_of()[0], change), nodes=[source, target], free=capacity, nodeFit=True, **args
    )
    assert decision.verdict == verdict
    if verdict == "wait":
        assert decision.reason == "NodeFit"
        assert "cpu 200m" in decision.message


def test_node_fit_off_by_default() -> None:
    assert one(nodes=[node("node-0")], free={"node-0": 4000}).verdict == "admit"
