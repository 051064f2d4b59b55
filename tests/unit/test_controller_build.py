"""The objects the controller creates (controller.build): a Reservation for a pod, a
placeholder for a Reservation."""

from __future__ import annotations

from typing import Any

import pytest

from berth.api import keys
from berth.resources import parse_quantity, pod_requests
from controller import build
from tests.unit.builders import job, pod


def test_reservation_excludes_the_source_node_and_keeps_constraints() -> None:
    source = pod(node="node-0")
    source["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    source["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    body = build.reservation_for(job=job(), pod=source, workload_uid="uid-deploy", ttl="5m")
    spec = body["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 2
    for term in terms:
        assert {"key": "metadata.name", "operator": "NotIn", "values": ["node-0"]} in term[
            "matchFields"
        ]
    assert spec["tolerations"] == source["spec"]["tolerations"]
    assert body["spec"]["owners"][0]["controller"]["uid"] == "uid-web-rs"
    assert body["metadata"]["annotations"][keys.WORKLOAD] == "uid-deploy"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-job-1"


def test_a_pod_bound_by_berth_before_is_not_pinned_to_its_node_again() -> None:
    moved = pod(node="node-1", annotations={keys.RESERVATION_ALLOCATED: '{"name":"r"}'})
    moved["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
                        ]
                    }
                ]
            }
        }
    }
    body = build.reservation_for(job=job(), pod=moved, workload_uid=None, ttl="5m")
    terms = body["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}
    ]


PIN = {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
ZONE = {"key": "zone", "operator": "In", "values": ["a"]}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


@pytest.mark.parametrize(
    ("affinity", "unpinned"),
    [
        (None, None),
        # The webhook's own term, for a pod without one: no required affinity is left.
        (required({"matchFields": [PIN]}), {}),
        ({**required({"matchFields": [PIN]}), "podAffinity": {"x": 1}}, {"podAffinity": {"x": 1}}),
        # ANDed into the pod's own terms: those are left as they were.
        (required({"matchExpressions": [ZONE], "matchFields": [PIN]}),
         required({"matchExpressions": [ZONE]})),
        # A term of the pod's own that was empty already stays (it matches no node).
        (required({}, {"matchFields": [PIN]}), required({})),
        # Another node's term is the pod's own.
        (required({"matchFields": [{**PIN, "values": ["node-2"]}]}),
         required({"matchFields": [{**PIN, "values": ["node-2"]}]})),
    ],
)  # fmt: skip
def test_without_pin_leaves_the_pods_own_affinity(
    affinity: dict[str, Any] | None, unpinned: dict[str, Any] | None
) -> None:
    assert build.without_pin(affinity, "node-1") == unpinned


def test_a_replacements_placement_is_the_pods_without_berths_pin() -> None:
    toleration = {"key": "gpu", "operator": "Exists"}
    moved = pod(node="node-1", annotations={keys.RESERVATION_ALLOCATED: '{"name":"r"}'})
    moved["spec"] |= {
        "tolerations": [toleration],
        "nodeSelector": {"pool": "a"},
        "affinity": required({"matchExpressions": [ZONE], "matchFields": [PIN]}),
        "priorityClassName": "high",
    }
    assert build.replacement_placement(moved) == {
        "tolerations": [toleration],
        "nodeSelector": {"pool": "a"},
        "affinity": required({"matchExpressions": [ZONE]}),
    }
    # Not bound by Berth: a term naming its node is the pod's own.
    own = {**moved, "metadata": {**moved["metadata"], "annotations": {}}}
    assert build.replacement_placement(own)["affinity"] == moved["spec"]["affinity"]


def test_job_template_narrows_the_pods_placement() -> None:
    source = pod(node="node-0")
    source["spec"]["nodeSelector"] = {"disk": "ssd"}
    source["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    to_node_2 = {
        "spec": {
            "template": {
                "spec": {
                    "nodeSelector": {"pool": "big"},
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchFields": [
                                            {
                                                "key": "metadata.name",
                                                "operator": "In",
                                                "values": ["node-2"],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                }
            }
        }
    }
    body = build.reservation_for(
        job=job(), pod=source, workload_uid=None, ttl="5m", template=to_node_2
    )
    spec = body["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"disk": "ssd", "pool": "big"}
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [{"key": "zone", "operator": "In", "values": ["a"]}]
    assert {"key": "metadata.name", "operator": "In", "values": ["node-2"]} in term["matchFields"]
    assert {"key": "metadata.name", "operator": "NotIn", "values": ["node-0"]} in term[
        "matchFields"
    ]


def test_placeholder_requests_berths_marker_so_the_scheduler_calls_the_extender() -> None:
    rsv = build.reservation_for(job=job(), pod=pod(), workload_uid=None, ttl="5m")
    rsv["metadata"]["uid"] = "uid-rsv"
    [container] = build.placeholder_for(rsv, image="pause")["spec"]["containers"]
    marker = {keys.RESERVATION_RESOURCE: "1"}
    assert container["resources"]["limits"] == marker
    assert container["resources"]["requests"].items() >= marker.items()
    # The marker holds no capacity: the Reservation's allocatable leaves it out.
    assert keys.RESERVATION_RESOURCE not in build.allocatable_of(rsv)


def test_a_hand_made_reservation_for_one_node_gets_a_placeholder_scheduled_there() -> None:
    """Koordinator's template.spec.nodeName: the placeholder is scheduled to that node
    (required affinity, ANDed with the template's own), never bound past the scheduler."""
    rsv = build.reservation_for(job=job(), pod=pod(), workload_uid=None, ttl="5m")
    rsv["metadata"]["uid"] = "uid-rsv"
    rsv["spec"]["template"]["spec"]["nodeName"] = "node-7"
    spec = build.placeholder_for(rsv, image="pause")["spec"]
    assert "nodeName" not in spec
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    pin = {"key": "metadata.name", "operator": "In", "values": ["node-7"]}
    assert terms
    assert all(pin in term["matchFields"] for term in terms)


def test_a_pod_bound_before_leaves_its_marker_out_of_the_new_reservation() -> None:
    source = pod()
    source["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "500m", keys.RESERVATION_RESOURCE: "1"},
        "limits": {keys.RESERVATION_RESOURCE: "1"},
    }
    rsv = build.reservation_for(job=job(), pod=source, workload_uid=None, ttl="5m")
    [container] = rsv["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "500m"}}
    assert build.allocatable_of(rsv) == {"cpu": "500m"}


def test_placeholder_holds_the_effective_requests_and_matches_no_selector() -> None:
    source = pod()
    source["spec"]["initContainers"] = [
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
        {
            "name": "init",
            "resources": {"requests": {"cpu": "1"}},
            # Ended before the pod runs: kube-scheduler counts no port of it.
            "ports": [{"containerPort": 9000, "hostPort": 9000}],
        },
    ]
    source["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    rsv = build.reservation_for(job=job(), pod=source, workload_uid=None, ttl="5m")
    rsv["metadata"]["uid"] = "uid-rsv"
    ph = build.placeholder_for(rsv, image="pause")
    assert pod_requests(ph["spec"]) == {"cpu": parse_quantity("1.1")}
    assert pod_requests(ph["spec"]) == pod_requests(source["spec"])
    assert ph["metadata"]["labels"] == {keys.RESERVATION_LABEL: rsv["metadata"]["name"]}
    assert ph["metadata"]["ownerReferences"][0]["kind"] == "Reservation"
    assert ph["spec"]["terminationGracePeriodSeconds"] == 0
    assert ph["spec"]["containers"][0]["ports"] == [{"containerPort": 80, "hostPort": 8080}]
    assert ph["spec"]["securityContext"]["runAsNonRoot"] is True


def test_placeholder_under_a_non_preempting_class_drops_its_own_preemption_policy() -> None:
    source = pod(node="node-0")
    source["spec"].update(
        priorityClassName="high", priority=1000, preemptionPolicy="PreemptLowerPriority"
    )
    rsv = build.reservation_for(job=job(), pod=source, workload_uid=None, ttl="5m")
    rsv["metadata"]["uid"] = "uid-rsv"
    assert build.placeholder_for(rsv, image="pause")["spec"]["priorityClassName"] == "high"
    never = build.non_preempting_class(build.placeholder_priority(rsv, {}, 0))
    spec = build.placeholder_for(rsv, image="pause", priority_class=never)["spec"]
    # The class's value and policy, stated so that admission refuses the pod under a
    # class of that name made otherwise.
    assert spec["priorityClassName"] == "berth-non-preempting-1000"
    assert (spec["priority"], spec["preemptionPolicy"]) == (1000, "Never")
    assert (never["value"], never["preemptionPolicy"], never["globalDefault"]) == (
        1000,
        "Never",
        False,
    )


@pytest.mark.parametrize(
    ("priority", "name", "value"),
    [
        (0, "berth-non-preempting-0", 0),
        (-5, "berth-non-preempting-minus5", -5),
        # System-critical pods: a class outside the system ones may go no higher.
        (2_000_001_000, "berth-non-preempting-1000000000", 1_000_000_000),
    ],
)
def test_non_preempting_class_names_its_value(priority: int, name: str, value: int) -> None:
    never = build.non_preempting_class(priority)
    assert (never["metadata"]["name"], never["value"]) == (name, value)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ({"priority": 7, "priorityClassName": "high"}, 7),
        ({"priorityClassName": "high"}, 1000),
        ({"priorityClassName": "gone"}, 0),
        ({}, 50),  # the global default class's value
    ],
)
def test_placeholder_priority(template: dict[str, object], expected: int) -> None:
    rsv = {"spec": {"template": {"spec": template}}}
    assert build.placeholder_priority(rsv, {"high": 1000}, 50) == expected


@pytest.mark.parametrize(
    ("template_ttl", "job_ttl", "expected"),
    [
        pytest.param("1h", "5m", "1h", id="the template's, positive"),
        pytest.param("0s", "5m", "5m", id="never expiring: the job's"),
        pytest.param("0s", None, None, id="never expiring, no job ttl: the default (24h)"),
        pytest.param("-1m", None, None, id="negative: the default"),
        pytest.param(None, "5m", "5m", id="none: the job's"),
    ],
)
def test_a_reservation_never_lasts_for_ever(
    template_ttl: str | None, job_ttl: str | None, expected: str | None
) -> None:
    """A template's ttl of 0 (Koordinator's "never expires") is not taken: a job that
    waits for ever would hold the place for ever."""
    template = {"spec": {"ttl": template_ttl}} if template_ttl else None
    rsv = build.reservation_for(
        job=job(), pod=pod(), workload_uid=None, ttl=job_ttl, template=template
    )
    assert rsv["spec"].get("ttl") == expected


def zone(*values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "zone", "operator": "In", "values": list(values)}]}


def test_a_reservation_is_made_where_the_pods_volumes_may_be_used() -> None:
    """Each bound volume's terms are ANDed in (terms ORed within a volume): the pod's own
    zones a or b, its disk in zone a or c, another volume on racks r1: a and r1 only, off
    the pod's node."""
    source = pod()
    source["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [zone("a"), zone("b")]
            }
        }
    }
    rack = {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
    body = build.reservation_for(
        job=job(),
        pod=source,
        workload_uid=None,
        ttl="5m",
        volume_terms=((zone("a"), zone("c")), (rack,)),
    )
    spec = body["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    not_here = {"key": "metadata.name", "operator": "NotIn", "values": ["node-0"]}
    expressions = [[e["values"][0] for e in term["matchExpressions"]] for term in terms]
    assert expressions == [["a", "a", "r1"], ["a", "c", "r1"], ["b", "a", "r1"], ["b", "c", "r1"]]
    assert all(term["matchFields"] == [not_here] for term in terms)
    # A pod with no affinity of its own: the volume's terms, off its node.
    plain = build.reservation_for(
        job=job(), pod=pod(), workload_uid=None, ttl="5m", volume_terms=((zone("a"),),)
    )
    required = plain["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required == {"nodeSelectorTerms": [{**zone("a"), "matchFields": [not_here]}]}
