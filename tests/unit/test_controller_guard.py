"""What a job may lend itself of the controller's rights: the template allow-list
(controller.template) and the deleteOptions allow-list (controller.jobs.view)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.jobs.view import delete_options
from controller.template import refused, without_berth_keys
from tests.unit.builders import pod


def template(**spec: Any) -> dict[str, Any]:
    return {"spec": {"template": {"spec": spec}}}


SAME_REQUESTS = {"name": "c", "resources": {"requests": {"cpu": "200m"}}}
"""A container asking what `pod()` asks."""

PIN = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
            ]
        }
    }
}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"priorityClassName": "system-node-critical"}, "priorityClassName"),
        ({"priority": 2_000_001_000}, "priority"),
        pytest.param(
            {"priority": -987654},
            "priority -987654 is not the pod's own",
            id="below the pod's: a PriorityClass of the controller's for each value",
        ),
        ({"tolerations": [{"operator": "Exists"}]}, "tolerations"),
        ({"nodeName": "node-0"}, "nodeName"),
        ({"schedulerName": "other"}, "schedulerName"),
        ({"containers": [{"name": "x", "resources": {"requests": {"cpu": "64"}}}]}, "resources"),
        pytest.param(
            {"containers": [{"name": "x", "resources": {"requests": {"cpu": "100m"}}}]},
            "resources: requests of cpu are below the pod's",
            id="less than the pod: its replacement would not take the place",
        ),
        pytest.param(
            {"containers": [{"name": "x"}]},
            "resources: requests of cpu are below the pod's",
            id="nothing at all",
        ),
        ({"affinity": {"podAntiAffinity": {}}}, "affinity"),
    ],
)
def test_a_template_that_asks_for_more_than_the_pod_is_refused(
    spec: dict[str, Any], field: str
) -> None:
    why = refused(template(**spec), pod())
    assert why is not None
    assert field in why


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"nodeSelector": ["zone"]}, "nodeSelector: cannot be read"),
        ({"priority": "9"}, "priority: cannot be read"),
        ({"affinity": "x"}, "affinity: cannot be read"),
        ({"containers": [{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}, "resources"),
        (
            {"containers": [{**SAME_REQUESTS, "ports": [{"containerPort": 22, "hostPort": 22}]}]},
            "containers: hostPort 22/TCP is not one of the pod's",
        ),
    ],
)
def test_a_template_berth_cannot_read_or_that_takes_a_host_port_is_refused(
    spec: dict[str, Any], problem: str
) -> None:
    """The template is free-form in the schema: a field of the wrong type is refused,
    naming it, rather than raising on every pass; a host port the pod does not use would
    be held by the placeholder on its node for the job's creator."""
    why = refused(template(**spec), pod())
    assert why is not None
    assert problem in why


@pytest.mark.parametrize(
    "outer",
    [
        "a template",
        {"spec": "a spec"},
        {"spec": {"template": {"spec": ["containers"]}}},
        {"spec": {"owners": "web"}},
    ],
)
def test_a_template_of_the_wrong_shape_is_refused(outer: Any) -> None:
    why = refused(outer, pod())
    assert why is not None
    assert why.startswith("reservationOptions.template")


def test_a_template_emptying_a_field_of_requests_asks_less() -> None:
    """`initContainers: []` replaces the pod's (the Reservation is made so): an init
    container that asks more than the app's takes its requests away."""
    own = pod()
    own["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "1"}}}]
    why = refused(template(initContainers=[]), own)
    assert why is not None
    assert "resources: requests of cpu are below the pod's" in why


def test_the_pods_own_host_ports_are_kept() -> None:
    own = pod()
    own["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    spec = {"containers": [{**SAME_REQUESTS, "ports": [{"containerPort": 80, "hostPort": 8080}]}]}
    assert refused(template(**spec), own) is None


@pytest.mark.parametrize(
    "spec",
    [{}, {"affinity": PIN}, {"priorityClassName": ""}, {"containers": [SAME_REQUESTS]}],
)
def test_a_template_that_only_narrows_is_accepted(spec: dict[str, Any]) -> None:
    assert refused(template(**spec), pod()) is None


def test_berth_keys_are_stripped_from_template_metadata() -> None:
    assert without_berth_keys({"berth.sh/consumable": "true", "team": "a"}) == {"team": "a"}


def test_delete_options_keep_the_pod_uid_and_never_shorten_the_grace_period() -> None:
    target = pod()
    target["spec"]["terminationGracePeriodSeconds"] = 30
    asked = {
        "preconditions": {},
        "gracePeriodSeconds": 0,
        "dryRun": ["All"],
        "propagationPolicy": "Foreground",
    }
    assert delete_options({"gracePeriodSeconds": 60}, target)["gracePeriodSeconds"] == 60
    assert delete_options(asked, target) == {
        "gracePeriodSeconds": 30,
        "propagationPolicy": "Foreground",
        "preconditions": {"uid": target["metadata"]["uid"]},
    }


def required(*terms: Any) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def expression(key: Any = "zone", operator: Any = "In", values: Any = ("a",)) -> dict[str, Any]:
    found = {"key": key, "operator": operator}
    if values is not None:
        found["values"] = list(values) if isinstance(values, tuple) else values
    return {"matchExpressions": [found]}


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"nodeSelector": {"zone": 1}}, "nodeSelector zone: a node selector maps label names"),
        ({"affinity": required()}, "at least one term is required"),
        ({"affinity": required({"labelSelector": {}})}, "only matchExpressions and matchFields"),
        ({"affinity": required(expression(operator="Is"))}, "operator 'Is' is not one of"),
        ({"affinity": required(expression(values=None))}, "zone: In needs values"),
        ({"affinity": required(expression(values=[1]))}, "values must be a list of strings"),
        ({"affinity": required(expression(operator="Exists"))}, "Exists takes no values"),
        ({"affinity": required(expression(operator="Gt", values=("x",)))}, "one integer value"),
        ({"affinity": required(expression(key=""))}, "key '' is not a label name"),
        (
            {"affinity": required({"matchFields": expression(key="spec.x")["matchExpressions"]})},
            "matchFields: only metadata.name",
        ),
    ],
)
def test_a_template_the_api_server_would_refuse_is_refused_now(
    spec: dict[str, Any], problem: str
) -> None:
    """A node selector or affinity term every placeholder create would be refused for:
    the job fails at once, naming it, rather than retrying creates until its TTL."""
    why = refused(template(**spec), pod())
    assert why is not None
    assert problem in why


@pytest.mark.parametrize(
    "affinity",
    [
        required(expression()),
        required(
            expression(operator="Exists", values=None), expression(operator="Gt", values=("3",))
        ),
    ],
)
def test_a_template_with_valid_terms_is_accepted(affinity: dict[str, Any]) -> None:
    assert refused(template(affinity=affinity), pod()) is None
