"""The NetworkPolicies under manifests/: each Berth pod accepts connections on its
serving port and nowhere else, in both overlays.

Policies add up, so the checks are on the whole set: one that selects every Berth pod
and allows nothing, and one per component that opens exactly the port its
container serves (the one its probes and Service use).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.manifests import (
    COMPONENTS,
    MANIFESTS,
    NAMESPACE,
    PORTS,
    Object,
    container_port,
    deployment,
    objects,
    the_container,
)

OVERLAYS = [MANIFESTS, MANIFESTS / "without-cert-manager"]


def policies(overlay: Path) -> dict[str, Object]:
    return {o["metadata"]["name"]: o for o in objects(overlay) if o["kind"] == "NetworkPolicy"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_has_a_default_deny_and_one_policy_per_component(overlay: Path) -> None:
    assert set(policies(overlay)) == {
        "berth-default-deny-ingress",
        *(f"berth-{component}" for component in COMPONENTS),
    }


def test_a_berth_pod_accepts_no_connection_that_no_policy_of_its_component_lets_in() -> None:
    """Berth's pods only: in a namespace shared with other workloads, theirs are not cut
    off."""
    deny = policies(MANIFESTS)["berth-default-deny-ingress"]
    assert deny["metadata"]["namespace"] == NAMESPACE
    assert deny["spec"] == {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "berth"}},
        "policyTypes": ["Ingress"],
    }
    for component in COMPONENTS:
        labels = deployment(component)["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "berth"


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_component_accepts_connections_on_its_serving_port_only(component: str) -> None:
    policy = policies(MANIFESTS)[f"berth-{component}"]
    spec = policy["spec"]
    pod_labels = deployment(component)["spec"]["template"]["metadata"]["labels"]
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert spec["podSelector"] == {"matchLabels": pod_labels}
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    port, _ = PORTS[component]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    # The port the container serves on, its probes included.
    container = the_container(component)
    assert [p["containerPort"] for p in container["ports"]] == [port]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container_port(container, container[probe]["httpGet"]["port"]) == port
