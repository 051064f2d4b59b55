"""Quantity parsing and effective pod requests, as kube-scheduler counts them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth.api import keys
from berth.resources import fits, format_quantity, parse_quantity, pod_requests


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", "1"),
        ("100m", "0.1"),
        ("1.5", "1.5"),
        ("2", "2"),
        ("0", "0"),
        ("4Gi", str(4 * 2**30)),
        ("400Mi", str(400 * 2**20)),
        ("1Ki", "1024"),
        ("1k", "1000"),
        ("1M", "1000000"),
        ("1e3", "1000"),
        ("1E3", "1000"),
        ("2e-3", "0.002"),
        ("500u", "0.0005"),
        ("10n", "1E-8"),
        (".5", "0.5"),
        ("+1", "1"),
    ],
)
def test_parse_quantity(text: str, expected: str) -> None:
    assert parse_quantity(text) == Decimal(expected)


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1Gb", "Mi", "--1", "1 Gi"])
def test_parse_quantity_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("1" * 100_000 + "x", "longer than 128 characters", id="a long run of digits"),
        pytest.param("0." + "1" * 126 + "x", "invalid quantity", id="long, not a quantity"),
        pytest.param("\u0661\u0662", "invalid quantity", id="digits of another script"),
    ],
)
def test_a_quantity_is_read_in_one_pass_or_refused(text: str, problem: str) -> None:
    """Each character of a quantity is matched one way only, so that no string a pod or an
    extender request carries costs more than its length to refuse."""
    with pytest.raises(ValueError, match=problem):
        parse_quantity(text)
    assert parse_quantity("1" * 20 + ".5") == Decimal("11111111111111111111.5")


@given(st.integers(min_value=0, max_value=10**6))
def test_millicores_round_trip(millis: int) -> None:
    value = parse_quantity(f"{millis}m")
    assert parse_quantity(format_quantity("cpu", value)) == value


def container(cpu: str, memory: str = "0", **extra: Any) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}, **extra}


@pytest.mark.parametrize(
    ("spec", "cpu"),
    [
        ({"containers": [container("100m"), container("200m")]}, "0.3"),
        # A plain init container runs alone: the peak of init and app wins.
        ({"containers": [container("100m")], "initContainers": [container("500m")]}, "0.5"),
        ({"containers": [container("800m")], "initContainers": [container("500m")]}, "0.8"),
        # A sidecar keeps running: it adds to the app, and to every later init container.
        (
            {
                "containers": [container("100m")],
                "initContainers": [container("200m", restartPolicy="Always"), container("250m")],
            },
            "0.45",
        ),
        (
            {
                "containers": [container("100m")],
                "initContainers": [container("200m", restartPolicy="Always")],
            },
            "0.3",
        ),
        # Overhead of the runtime class is charged on top.
        ({"containers": [container("100m")], "overhead": {"cpu": "50m"}}, "0.15"),
        # Pod-level requests replace the container sum.
        ({"containers": [container("100m")], "resources": {"requests": {"cpu": "2"}}}, "2"),
        ({"containers": [{"name": "c"}]}, None),
    ],
)
def test_pod_requests(spec: dict[str, Any], cpu: str | None) -> None:
    requests = pod_requests(spec)
    assert requests.get("cpu") == (Decimal(cpu) if cpu is not None else None)


def test_fits_names_what_is_short() -> None:
    free = {"cpu": Decimal("1"), "memory": Decimal(100)}
    assert fits({"cpu": Decimal("0.5"), "memory": Decimal(100)}, free) == []
    assert fits({"cpu": Decimal("2"), "memory": Decimal(101)}, free) == ["cpu", "memory"]
    assert fits({"nvidia.com/gpu": Decimal(1)}, free) == ["nvidia.com/gpu"]
    assert fits({"nvidia.com/gpu": Decimal(0)}, free) == []


def test_berths_marker_is_no_capacity() -> None:
    spec = {
        "containers": [
            {
                "name": "app",
                "resources": {
                    "requests": {"cpu": "1", keys.RESERVATION_RESOURCE: "1"},
                    "limits": {keys.RESERVATION_RESOURCE: "1"},
                },
            }
        ]
    }
    assert pod_requests(spec) == {"cpu": Decimal(1)}


def resized(spec_cpu: str, actuated: str, allocated: str, **status: Any) -> tuple[Any, Any]:
    spec = {"containers": [{"name": "app", "resources": {"requests": {"cpu": spec_cpu}}}]}
    reported = {
        "name": "app",
        "resources": {"requests": {"cpu": actuated}},
        "allocatedResources": {"cpu": allocated},
    }
    return spec, {"containerStatuses": [reported], **status}


INFEASIBLE = {
    "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]
}
DEFERRED = {"conditions": [{"type": "PodResizePending", "status": "True", "reason": "Deferred"}]}


@pytest.mark.parametrize(
    ("spec_cpu", "actuated", "allocated", "status", "cpu"),
    [
        # A resize down not yet actuated: the node still runs the larger requests.
        ("500m", "1", "1", {}, "1"),
        # Allocated, not yet actuated.
        ("500m", "500m", "1", {}, "1"),
        # A resize up waiting for room (deferred): the larger spec.
        ("2", "1", "1", DEFERRED, "2"),
        # A resize up the node can never take: what runs, not what was asked.
        ("4", "1", "1", INFEASIBLE, "1"),
        ("4", "1", "2", INFEASIBLE, "2"),
        # Done: all three agree.
        ("1", "1", "1", {}, "1"),
    ],
)
def test_a_pod_resized_in_place_is_charged_as_the_scheduler_does(
    spec_cpu: str, actuated: str, allocated: str, status: dict[str, Any], cpu: str
) -> None:
    """k8s.io/component-helpers resource.PodRequests with UseStatusResources (on in
    kube-scheduler v1.36): the largest of spec, actuated and allocated, or of the last two
    when the kubelet found the resize infeasible."""
    spec, reported = resized(spec_cpu, actuated, allocated, **status)
    assert pod_requests(spec, reported) == {"cpu": Decimal(cpu)}
    assert pod_requests(spec) == {"cpu": parse_quantity(spec_cpu)}


def test_only_reported_containers_and_sidecars_take_their_status() -> None:
    spec = {
        "initContainers": [
            {"name": "init", "resources": {"requests": {"cpu": "3"}}},
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
        ],
        "containers": [
            {"name": "app", "resources": {"requests": {"cpu": "1"}}},
            {"name": "unreported", "resources": {"requests": {"cpu": "1"}}},
        ],
    }
    status = {
        "initContainerStatuses": [
            # A finished init container's status is not read.
            {"name": "init", "resources": {"requests": {"cpu": "5"}}},
            {"name": "proxy", "resources": {"requests": {"cpu": "2"}}},
        ],
        "containerStatuses": [
            {"name": "app", "resources": {"requests": {"cpu": "2"}}},
            {"name": "unreported"},  # no resources reported: the spec
        ],
    }
    # Sum of app 2, unreported 1, proxy 2 = 5; the init peak is 3 (init) + 2 (proxy).
    assert pod_requests(spec, status) == {"cpu": Decimal(5)}


def test_pod_level_resources_resized_in_place() -> None:
    spec = {
        "containers": [{"name": "app"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
    }
    status = {"resources": {"requests": {"cpu": "2"}}, "allocatedResources": {"cpu": "2"}}
    # The larger cpu; memory the status leaves out counts as its spec (max with spec).
    assert pod_requests(spec, status) == {"cpu": Decimal(2), "memory": Decimal(2**30)}
    infeasible = {**status, **INFEASIBLE}
    # Infeasible: the status alone; a name it leaves out counts 0, as the scheduler does.
    assert pod_requests(spec, infeasible) == {"cpu": Decimal(2), "memory": Decimal(0)}


def test_a_malformed_status_is_read_as_no_resize() -> None:
    spec, _ = resized("1", "1", "1")
    malformed: list[Any] = [
        {"containerStatuses": "x"},
        {"containerStatuses": [5, {"name": 3}]},
        {"conditions": 5},
        {"containerStatuses": 5},
        [],
    ]
    for status in malformed:
        assert pod_requests(spec, status) == {"cpu": Decimal(1)}
    unnamed = {"containers": [{"name": [], "resources": {"requests": {"cpu": "1"}}}]}
    assert pod_requests(unnamed, {"containerStatuses": [{"name": "x"}]}) == {"cpu": Decimal(1)}
