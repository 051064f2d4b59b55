"""The kernel's reading of selectors, node constraints and QoS, as the API server and
kube-scheduler read them."""

from __future__ import annotations

from typing import Any

import pytest

from berth.scheduling import (
    host_ports,
    node_affinity_matches,
    node_gates,
    node_refusal,
    node_schedulable,
    parse_selector,
    ports_conflict,
    qos_class,
    selector_matches,
    spread_refusal,
    taints_tolerated,
)
from tests.unit.builders import node, pod

Object = dict[str, Any]


# ----- label selectors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ("", {}, True),
        ("pool=general", {"pool": "general"}, True),
        ("pool==general", {"pool": "mem"}, False),
        ("pool!=general", {}, True),
        ("pool!=general", {"pool": "general"}, False),
        ("pool in (general, batch)", {"pool": "batch"}, True),
        ("pool notin (general,batch),zone", {"pool": "mem", "zone": "a"}, True),
        ("pool notin (general,batch),zone", {"pool": "mem"}, False),
        ("!spot", {"spot": "true"}, False),
        ("a=1, b=2", {"a": "1", "b": "2"}, True),
    ],
)
def test_parse_selector(text: str, labels: dict[str, str], matches: bool) -> None:
    assert selector_matches(parse_selector(text), labels) is matches


@pytest.mark.parametrize("text", ["pool=a=b", "in (a)", "pool in a", "!pool=a"])
def test_parse_selector_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="is not a label selector requirement"):
        parse_selector(text)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {"app": "web"}, True),
        ({"matchLabels": {"app": "web"}}, {"app": "web", "x": "y"}, True),
        ({"matchLabels": {"app": "web"}}, {}, False),
        ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, {"app": ""}, True),
        ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {"app": ""}, False),
        ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}, {}, True),
    ],
)
def test_selector_matches(selector: Object, labels: dict[str, str], matches: bool) -> None:
    assert selector_matches(selector, labels) is matches


# ----- nodes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "schedulable"),
    [
        (node(), True),
        (node(ready=False), False),
        (node(unschedulable=True), False),
    ],
)
def test_node_schedulable(target: Object, schedulable: bool) -> None:
    assert node_schedulable(target) is schedulable


def required(*terms: Object) -> Object:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


ZONE_A = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}


@pytest.mark.parametrize(
    ("spec", "labels", "matches"),
    [
        ({}, {}, True),
        ({"nodeSelector": {"disk": "ssd"}}, {"disk": "ssd", "zone": "a"}, True),
        ({"nodeSelector": {"disk": "ssd"}}, {"disk": "hdd"}, False),
        (required(ZONE_A), {"zone": "a"}, True),
        (required(ZONE_A), {"zone": "b"}, False),
        (required(ZONE_A, {"matchFields": [{"key": "metadata.name", "operator": "In",
                                            "values": ["node-1"]}]}), {}, True),
        (required({}), {"zone": "a"}, False),  # an empty term matches no node
        ({**required(ZONE_A), "nodeSelector": {"disk": "ssd"}}, {"zone": "a"}, False),
    ],
)  # fmt: skip
def test_node_affinity_matches(spec: Object, labels: dict[str, str], matches: bool) -> None:
    assert node_affinity_matches(spec, "node-1", labels) is matches


@pytest.mark.parametrize(
    ("taints", "tolerations", "tolerated"),
    [
        ([], [], True),
        ([{"key": "gpu", "effect": "NoSchedule"}], [], False),
        ([{"key": "gpu", "effect": "PreferNoSchedule"}], [], True),
        ([{"key": "gpu", "effect": "NoExecute"}], [{"operator": "Exists"}], True),
        ([{"key": "gpu", "effect": "NoSchedule"}], [{"key": "gpu", "operator": "Exists"}], True),
        ([{"key": "gpu", "value": "a", "effect": "NoSchedule"}], [{"key": "gpu", "value": "a"}],
         True),
        ([{"key": "gpu", "value": "a", "effect": "NoSchedule"}], [{"key": "gpu", "value": "b"}],
         False),
        ([{"key": "gpu", "effect": "NoSchedule"}],
         [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}], False),
        ([{"key": "slots", "value": "4", "effect": "NoSchedule"}],
         [{"key": "slots", "operator": "Gt", "value": "2"}], True),
        ([{"key": "slots", "value": "4", "effect": "NoSchedule"}],
         [{"key": "other", "operator": "Gt", "value": "2"}], False),
    ],
)  # fmt: skip
def test_taints_tolerated(taints: list[Object], tolerations: list[Object], tolerated: bool) -> None:
    assert taints_tolerated({"tolerations": tolerations}, node(taints=taints)) is tolerated


CORDON_TOLERATED = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
ELSEWHERE = "node node-1 does not match the pod's node selector or required node affinity"


def pool(*values: str) -> Object:
    return {"matchExpressions": [{"key": "pool", "operator": "In", "values": list(values)}]}


@pytest.mark.parametrize(
    ("target", "spec", "refusal"),
    [
        (node(), {}, None),
        (node(unschedulable=True), {}, "node node-1 is cordoned"),
        (node(unschedulable=True), {"tolerations": [CORDON_TOLERATED]}, None),
        (node(taints=[{"key": "gpu", "value": "a", "effect": "NoSchedule"}]), {},
         "node node-1 has the taint gpu=a:NoSchedule, which the pod does not tolerate"),
        (node(taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]), {},
         "node node-1 has the taint node.kubernetes.io/not-ready:NoExecute, which the pod "
         "does not tolerate"),
        (node(taints=[{"key": "gpu", "effect": "NoSchedule"}]),
         {"tolerations": [{"operator": "Exists"}]}, None),
        (node(taints=[{"key": "gpu", "effect": "PreferNoSchedule"}]), {}, None),
        # Where the pod may run: its node selector and required node affinity.
        (node(labels={"pool": "a"}), {"nodeSelector": {"pool": "a"}}, None),
        (node(labels={"pool": "a"}), {"nodeSelector": {"pool": "b"}}, ELSEWHERE),
        (node(), {"nodeSelector": {"pool": "a"}}, ELSEWHERE),
        (node(labels={"pool": "a"}), required(pool("b"), pool("a", "c")), None),
        (node(labels={"pool": "a"}), required(pool("b")), ELSEWHERE),
        # The term Berth's webhook ANDs in, tying a replacement to its reserved node.
        (node(labels={"pool": "a"}),
         required({**pool("a"), "matchFields": [
             {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}), None),
        (node("node-2", labels={"pool": "a"}),
         required({**pool("a"), "matchFields": [
             {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}),
         "node node-2 does not match the pod's node selector or required node affinity"),
        # A cordon is named before where the pod may run.
        (node(unschedulable=True), {"nodeSelector": {"pool": "a"}}, "node node-1 is cordoned"),
    ],
)  # fmt: skip
def test_node_refusal_names_the_cordon_the_taint_or_the_placement_that_keeps_the_pod_away(
    target: Object, spec: Object, refusal: str | None
) -> None:
    assert node_refusal(target, spec) == refusal


def test_node_gates_change_with_what_node_refusal_reads_only() -> None:
    plain = node_gates(node())
    assert node_gates(node(taints=[{"key": "k", "effect": "PreferNoSchedule"}])) == plain
    assert node_gates({**node(), "status": {"allocatable": {"cpu": "8"}}}) == plain
    assert node_gates(node(unschedulable=True)) != plain
    assert node_gates(node(taints=[{"key": "k", "effect": "NoSchedule"}])) != plain
    assert node_gates(node(labels={"zone": "b"})) != plain


# ----- QoS --------------------------------------------------------------------------------


def resources(requests: dict[str, str], limits: dict[str, str]) -> Object:
    return {"name": "app", "resources": {"requests": requests, "limits": limits}}


@pytest.mark.parametrize(
    ("containers", "status", "expected"),
    [
        ([{"name": "app"}], None, "BestEffort"),
        ([resources({"cpu": "1"}, {})], None, "Burstable"),
        ([resources({"cpu": "1", "memory": "1Gi"}, {"cpu": "1000m", "memory": "1Gi"})], None,
         "Guaranteed"),
        ([resources({}, {"cpu": "1", "memory": "1Gi"})], None, "Guaranteed"),
        ([resources({"cpu": "1", "memory": "1Gi"}, {"cpu": "2", "memory": "1Gi"})], None,
         "Burstable"),
        ([{"name": "app"}], "Guaranteed", "Guaranteed"),  # the status says so
    ],
)  # fmt: skip
def test_qos_class(containers: list[Object], status: str | None, expected: str) -> None:
    target = pod()
    target["spec"]["containers"] = containers
    if status:
        target["status"]["qosClass"] = status
    assert qos_class(target) == expected


def test_host_ports_default_as_the_scheduler_reads_them() -> None:
    spec = {
        "initContainers": [
            {
                "restartPolicy": "Always",
                "ports": [{"containerPort": 53, "hostPort": 53, "protocol": "UDP"}],
            },
            # An ordinary init container has ended before the pod runs: the scheduler
            # does not count its ports (util.GetHostPorts).
            {"ports": [{"containerPort": 54, "hostPort": 54}]},
        ],
        "containers": [
            {"ports": [{"containerPort": 80}, {"containerPort": 80, "hostPort": 8080}]},
            {"ports": [{"containerPort": 9, "hostPort": 9, "hostIP": "10.0.0.1"}]},
        ],
    }
    assert host_ports(spec) == {
        (53, "UDP", "0.0.0.0"),
        (8080, "TCP", "0.0.0.0"),
        (9, "TCP", "10.0.0.1"),
    }


@pytest.mark.parametrize(
    ("first", "second", "conflict"),
    [
        ((80, "TCP", "0.0.0.0"), (80, "TCP", "10.0.0.1"), True),
        ((80, "TCP", "10.0.0.1"), (80, "TCP", "10.0.0.1"), True),
        ((80, "TCP", "10.0.0.1"), (80, "TCP", "10.0.0.2"), False),
        ((80, "TCP", "0.0.0.0"), (80, "UDP", "0.0.0.0"), False),
        ((80, "TCP", "0.0.0.0"), (81, "TCP", "0.0.0.0"), False),
    ],
)
def test_host_ports_conflict_on_one_address_or_every_address(
    first: tuple[int, str, str], second: tuple[int, str, str], conflict: bool
) -> None:
    assert ports_conflict(first, second) is conflict
    assert ports_conflict(second, first) is conflict


ZONES = {"node-a": "a", "node-a2": "a", "node-b": "b", "node-c": "c"}


def zoned() -> list[dict[str, Any]]:
    return [node(name, labels={"zone": zone}) for name, zone in ZONES.items()]


def spread(**constraint: Any) -> dict[str, Any]:
    """A pod of app=web, on node-b, spread over zones with maxSkew 1, counting every node
    whatever the replacement's required affinity (`nodeAffinityPolicy: Ignore`)."""
    moving = pod("web-b", node="node-b", labels={"app": "web"})
    moving["spec"]["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
            "nodeAffinityPolicy": "Ignore",
            **constraint,
        }
    ]
    return moving


def placed(**where: str) -> list[dict[str, Any]]:
    return [pod(name, node=at, labels={"app": "web"}) for name, at in where.items()]


def test_a_place_where_the_replacement_would_break_the_spread_is_refused() -> None:
    """Zones a=2, b=1 (the pod moving), c=1: the placeholder, which matches no selector,
    may land in a (2 - 1 = 1) or c; once the pod has left b, a replacement fits only in b
    (a: 2 + 1 - 0, c: 1 + 1 - 0)."""
    moving = spread()
    others = [moving, *placed(**{"web-a1": "node-a", "web-a2": "node-a2", "web-c": "node-c"})]
    nodes = {n["metadata"]["name"]: n for n in zoned()}
    for target in ("node-a", "node-c"):
        refusal = spread_refusal(moving, nodes[target], nodes=nodes.values(), pods=others)
        assert refusal is not None
        assert "topology spread on zone (maxSkew 1)" in refusal
    assert spread_refusal(moving, nodes["node-b"], nodes=nodes.values(), pods=others) is None


def test_a_spread_that_holds_refuses_nothing() -> None:
    moving = spread(maxSkew=2)
    others = [moving, *placed(**{"web-a1": "node-a", "web-a2": "node-a2", "web-c": "node-c"})]
    nodes = zoned()
    assert spread_refusal(moving, nodes[3], nodes=nodes, pods=others) is None  # c: 1 + 1 - 0


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        pytest.param({"whenUnsatisfiable": "ScheduleAnyway"}, False, id="ScheduleAnyway"),
        pytest.param({"labelSelector": {}}, False, id="an empty selector counts none"),
        pytest.param({"labelSelector": None}, False, id="no selector"),
        pytest.param({"matchLabelKeys": ["app"]}, True, id="matchLabelKeys"),
    ],
)
def test_what_the_spread_counts(change: dict[str, Any], refused: bool) -> None:
    moving = spread(**change)
    others = [moving, *placed(**{"web-a1": "node-a", "web-c": "node-c"})]
    nodes = zoned()
    # a=1, b=0 once the pod left, c=1: the c node (1 + 1 - 0 = 2) breaks maxSkew 1.
    found = spread_refusal(moving, nodes[3], nodes=nodes, pods=others)
    assert (found is not None) is refused


def test_terminating_pods_and_nodes_without_the_key_count_for_nothing() -> None:
    moving = spread()
    leaving = placed(**{"web-a1": "node-a"})[0]
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    keyless = node("node-x")
    nodes = [*zoned(), keyless]
    assert spread_refusal(moving, nodes[0], nodes=nodes, pods=[moving, leaving]) is None
    refusal = spread_refusal(moving, keyless, nodes=nodes, pods=[moving])
    assert refusal == "node node-x has no label zone, the pod's topology spread key"


@pytest.mark.parametrize(("min_domains", "refused"), [(None, False), (3, False), (4, True)])
def test_fewer_domains_than_min_domains_count_the_least_as_none(
    min_domains: int | None, refused: bool
) -> None:
    moving = spread(minDomains=min_domains)
    others = [moving, *placed(**{"web-a1": "node-a", "web-b2": "node-b", "web-c": "node-c"})]
    nodes = zoned()
    # a=1, b=1, c=1 once the pod left: c takes one more (1 + 1 - 1), unless three zones
    # are fewer than minDomains (1 + 1 - 0).
    found = spread_refusal(moving, nodes[3], nodes=nodes, pods=others)
    assert (found is not None) is refused


def test_with_the_default_policy_the_pin_leaves_one_node_counted() -> None:
    """The webhook pins the replacement to the Reservation's node (a required affinity):
    with `nodeAffinityPolicy: Honor`, the default, the plugin counts that node alone, and
    the spread holds there whatever the other zones hold, unless `minDomains` asks for
    more domains than that one."""
    others = placed(**{"web-a1": "node-a", "web-a2": "node-a2", "web-c": "node-c"})
    nodes = zoned()
    honoured = spread(nodeAffinityPolicy="Honor")
    assert spread_refusal(honoured, nodes[0], nodes=nodes, pods=[honoured, *others]) is None
    default = spread()
    del default["spec"]["topologySpreadConstraints"][0]["nodeAffinityPolicy"]
    assert spread_refusal(default, nodes[0], nodes=nodes, pods=[default, *others]) is None
    wide = spread(nodeAffinityPolicy="Honor", minDomains=2)
    # node-a holds one of them (web-a1): 1 + 1 - 0 against maxSkew 1.
    assert spread_refusal(wide, nodes[0], nodes=nodes, pods=[wide, *others]) is not None


def test_finished_pods_count_for_nothing() -> None:
    moving = spread()
    others = placed(**{"web-a1": "node-a", "web-c": "node-c"})
    nodes = zoned()
    assert spread_refusal(moving, nodes[3], nodes=nodes, pods=[moving, *others]) is not None
    for other in others:
        other["status"]["phase"] = "Failed"  # evicted by the kubelet, say
    assert spread_refusal(moving, nodes[3], nodes=nodes, pods=[moving, *others]) is None
