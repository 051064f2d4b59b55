"""Flow control: evictQPS and flowControlQPS token buckets, objectLimiters windows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from controller.arbitration import (
    LimiterState,
    TokenBucket,
)
from tests.unit.arbitration.helpers import (
    LOOSE,
    Object,
    decide,
    of,
    pending,
    pods_of,
    verdicts,
)
from tests.unit.builders import T0, later, workload

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
    *,
    qps: float,
    burst: int,
    state: TokenBucket | None,
    now: Any,
    admitted: int,
    tokens: float | None,
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
        limiter=LimiterState(workload_admissions={"default/uid-web": before}),
        objectLimiters={"workload": {"duration": "5m", "maxMigrating": 1}},
        **LOOSE,
    )
    assert [n for n, v in verdicts(result).items() if v == "admit"] == admitted
    assert of(result, "job-1").reason == "ObjectLimiters"
    assert len(result.limiter.workload_admissions["default/uid-web"]) == kept
