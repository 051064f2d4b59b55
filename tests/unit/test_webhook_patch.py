"""The webhook's pod patch: the gate, the pin to the reserved node, the annotations."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from berth import protocol
from berth.api import keys
from tests.unit.webhook_cases import (
    REPLICASET_UID,
    TOKEN,
    apply_patch,
    by_name,
    pod,
    request,
    reservation,
    set_in,
)
from webhook.decide import Reassert, bind_patch, decide

PIN = {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
OTHER_FIELD = {"key": "metadata.name", "operator": "NotIn", "values": ["node-0"]}
PREFERRED = [{"weight": 1, "preference": {"matchExpressions": [ZONE]}}]
ANTI: dict[str, Any] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}


@pytest.mark.parametrize(
    ("affinity", "expected"),
    [
        pytest.param(None, {"nodeAffinity": required({"matchFields": [PIN]})}, id="none"),
        pytest.param(
            ANTI,
            {**ANTI, "nodeAffinity": required({"matchFields": [PIN]})},
            id="pod anti-affinity only",
        ),
        pytest.param(
            {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": PREFERRED}},
            {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": PREFERRED,
                    **required({"matchFields": [PIN]}),
                }
            },
            id="preferred only",
        ),
        pytest.param(
            {"nodeAffinity": required()},
            {"nodeAffinity": required({"matchFields": [PIN]})},
            id="no terms",
        ),
        pytest.param(
            {
                "nodeAffinity": required(
                    {"matchExpressions": [ZONE]},
                    {"matchFields": [OTHER_FIELD]},
                    {"matchExpressions": [ZONE], "matchFields": [OTHER_FIELD]},
                )
            },
            {
                "nodeAffinity": required(
                    {"matchExpressions": [ZONE], "matchFields": [PIN]},
                    {"matchFields": [OTHER_FIELD, PIN]},
                    {"matchExpressions": [ZONE], "matchFields": [OTHER_FIELD, PIN]},
                )
            },
            id="ANDed into every term",
        ),
        pytest.param(
            {"nodeAffinity": required({}, {"matchExpressions": [ZONE]})},
            {"nodeAffinity": required({}, {"matchExpressions": [ZONE], "matchFields": [PIN]})},
            id="an empty term still matches no node",
        ),
    ],
)
def test_patch_pins_the_pod_to_the_reserved_node(
    affinity: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    original = pod(
        lambda p: (
            p["spec"].update(affinity=copy.deepcopy(affinity)) if affinity is not None else None
        )
    )
    patched = apply_patch(
        original, bind_patch(original, reservation=reservation("r1"), token=TOKEN)
    )
    assert patched["spec"]["affinity"] == expected
    assert protocol.tied_node(patched) == "node-1"  # what the controller reads back


@pytest.mark.parametrize(
    "affinity",
    [
        pytest.param(None, id="none"),
        pytest.param({"nodeAffinity": required({"matchExpressions": [ZONE]})}, id="a zone"),
        pytest.param(
            {"nodeAffinity": required({"matchFields": [PIN]}, {"matchExpressions": [ZONE]})},
            id="one term of two",
        ),
        pytest.param(
            {"nodeAffinity": required({"matchFields": [{**PIN, "values": ["node-1", "node-2"]}]})},
            id="two nodes",
        ),
        pytest.param(
            {"nodeAffinity": required({"matchFields": [{**PIN, "operator": "NotIn"}]})},
            id="NotIn",
        ),
    ],
)
def test_a_pod_not_pinned_to_one_node_is_tied_to_none(affinity: dict[str, Any] | None) -> None:
    free = pod(lambda p: p["spec"].update(affinity=affinity) if affinity is not None else None)
    assert protocol.tied_node(free) is None
    pinned = pod(
        lambda p: p["spec"].update(affinity={"nodeAffinity": required({"matchFields": [PIN]})})
    )
    assert protocol.tied_node(pinned) == "node-1"
    pinned["spec"]["nodeName"] = "node-1"
    assert protocol.tied_node(pinned) is None  # bound: nothing is left to tie


@pytest.mark.parametrize(
    ("annotations", "gates"),
    [
        pytest.param(None, None, id="bare pod"),
        pytest.param(
            {"team": "a", "example.com/owner": "x"},
            [{"name": "example.com/quota"}],
            id="existing annotations and gate are kept",
        ),
        pytest.param({}, [], id="empty maps"),
    ],
)
def test_patch_gates_and_annotates(
    annotations: dict[str, str] | None, gates: list[dict[str, str]] | None
) -> None:
    def setup(p: dict[str, Any]) -> None:
        if annotations is not None:
            p["metadata"]["annotations"] = dict(annotations)
        if gates is not None:
            p["spec"]["schedulingGates"] = list(gates)

    original = pod(setup)
    patched = apply_patch(
        original, bind_patch(original, reservation=reservation("r1"), token=TOKEN)
    )
    assert patched["spec"]["schedulingGates"] == [*(gates or []), {"name": keys.RESERVATION_GATE}]
    assert patched["metadata"]["annotations"] == {
        **(annotations or {}),
        keys.CLAIM: TOKEN,
        keys.RESERVATION_ALLOCATED: '{"name":"r1","uid":"uid-r1"}',
    }
    assert json.loads(patched["metadata"]["annotations"][keys.RESERVATION_ALLOCATED]) == {
        "name": "r1",
        "uid": "uid-r1",
    }


def test_patch_escapes_slashes_in_annotation_keys() -> None:
    original = pod(lambda p: p["metadata"].update(annotations={"team": "a"}))
    paths = [op["path"] for op in bind_patch(original, reservation=reservation("r1"), token=TOKEN)]
    assert "/metadata/annotations/berth.sh~1claim" in paths
    assert "/metadata/annotations/scheduling.koordinator.sh~1reservation-allocated" in paths


@pytest.mark.parametrize(
    "affinity",
    [
        None,
        ANTI,
        {"nodeAffinity": required({"matchExpressions": [ZONE]}, {"matchFields": [OTHER_FIELD]})},
    ],
)
def test_patch_is_idempotent_on_reinvocation(affinity: dict[str, Any] | None) -> None:
    original = pod(lambda p: p["spec"].update(affinity=affinity) if affinity else None)
    once = apply_patch(original, bind_patch(original, reservation=reservation("r1"), token=TOKEN))
    # Reinvoked with the pod it patched: the same Reservation, no claim, nothing to add.
    decision = decide(
        request(set_in("object", once)),
        reservations=by_name(reservation("r1", claim=TOKEN)),
        workload_uid=REPLICASET_UID,
    )
    assert isinstance(decision, Reassert)
    assert bind_patch(once, reservation=decision.reservation, token=decision.token) == []


def test_reinvocation_after_another_webhook_adds_a_term_pins_it_too() -> None:
    original = pod()
    once = apply_patch(original, bind_patch(original, reservation=reservation("r1"), token=TOKEN))
    terms = once["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    terms.append({"matchExpressions": [ZONE]})
    again = apply_patch(
        once, bind_patch(once, reservation=reservation("r1", claim=TOKEN), token=TOKEN)
    )
    assert [
        term.get("matchFields")
        for term in again["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
    ] == [[PIN], [PIN]]
    assert again["spec"]["schedulingGates"] == [{"name": keys.RESERVATION_GATE}]


MARKER = {keys.RESERVATION_RESOURCE: "1"}


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        pytest.param(None, {"requests": MARKER, "limits": MARKER}, id="no resources"),
        pytest.param({}, {"requests": MARKER, "limits": MARKER}, id="empty resources"),
        pytest.param(
            {"requests": {"cpu": "200m"}},
            {"requests": {"cpu": "200m", **MARKER}, "limits": MARKER},
            id="requests only",
        ),
        pytest.param(
            {"requests": {"cpu": "200m"}, "limits": {"memory": "1Gi"}},
            {"requests": {"cpu": "200m", **MARKER}, "limits": {"memory": "1Gi", **MARKER}},
            id="requests and limits",
        ),
        pytest.param(
            {"requests": {keys.RESERVATION_RESOURCE: "3"}, "limits": {}},
            {"requests": MARKER, "limits": MARKER},
            id="another amount is set to one, in both",
        ),
    ],
)
def test_patch_requests_berths_marker_in_the_first_container(
    resources: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    def setup(p: dict[str, Any]) -> None:
        p["spec"]["containers"].append({"name": "sidecar", "image": "x"})
        if resources is None:
            p["spec"]["containers"][0].pop("resources", None)
        else:
            p["spec"]["containers"][0]["resources"] = copy.deepcopy(resources)

    original = pod(setup)
    patched = apply_patch(
        original, bind_patch(original, reservation=reservation("r1"), token=TOKEN)
    )
    first, second = patched["spec"]["containers"]
    assert first["resources"] == expected
    assert "resources" not in second
    assert bind_patch(patched, reservation=reservation("r1"), token=TOKEN) == []
