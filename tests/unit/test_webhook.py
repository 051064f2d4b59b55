"""The webhook's decision, its pod patch, and how its handler reads a review.

Every case starts from the AdmissionReview the real kube-apiserver sent for a
ReplicaSet's pod (tests/data), changed only where the case says.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from berth.api import keys
from berth.protocol import top_level_workload
from webhook.app import Webhook, make_app
from webhook.decide import Claim, Reassert, Skip, bind_patch, decide

DATA = Path(__file__).resolve().parents[1] / "data"
REVIEW: dict[str, Any] = json.loads((DATA / "admission_review_pod_create.json").read_text())
NAMESPACE = REVIEW["request"]["namespace"]
REPLICASET_UID = REVIEW["request"]["object"]["metadata"]["ownerReferences"][0]["uid"]
DEPLOYMENT_UID = "0d5c1e36-0000-4000-8000-00000000d0d0"
TOKEN = "5f1c0ffee"

Change = Callable[[dict[str, Any]], object]


def request(*changes: Change) -> dict[str, Any]:
    """The recorded request, with each change applied to a copy of it."""
    result: dict[str, Any] = copy.deepcopy(REVIEW["request"])
    for change in changes:
        change(result)
    return result


def pod(*changes: Change) -> dict[str, Any]:
    result: dict[str, Any] = request()["object"]
    for change in changes:
        change(result)
    return result


def reservation(
    name: str,
    *,
    owner_uid: str = REPLICASET_UID,
    workload: str | None = None,
    consumable: bool = True,
    claim: str | None = None,
    phase: str = "Available",
    node: str = "node-1",
    namespace: str = NAMESPACE,
    created: str = "2026-11-21T23:50:00Z",
) -> dict[str, Any]:
    annotations = {keys.CONSUMABLE: "true"} if consumable else {}
    if workload:
        annotations[keys.WORKLOAD] = workload
    if claim:
        annotations[keys.CLAIM] = claim
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "creationTimestamp": created,
            "annotations": annotations,
        },
        "spec": {
            "template": {"metadata": {"namespace": namespace}, "spec": {}},
            "owners": [
                {
                    "controller": {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": "web-old",
                        "uid": owner_uid,
                        "controller": True,
                    }
                }
            ],
        },
        "status": {"phase": phase, "nodeName": node},
    }


def handed_over(reservation: dict[str, Any]) -> dict[str, Any]:
    reservation["status"]["currentOwners"] = [
        {"namespace": NAMESPACE, "name": "web-x", "uid": "pod-uid"}
    ]
    return reservation


def by_name(*reservations: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in reservations}


def allocated(name: str) -> str:
    return json.dumps({"name": name, "uid": f"uid-{name}"}, separators=(",", ":"))


# ----- changes to the recorded request ---------------------------------------------------


def claimed_by(name: str, token: str = TOKEN) -> Change:
    def change(req: dict[str, Any]) -> None:
        req["object"]["metadata"]["annotations"] = {
            keys.CLAIM: token,
            keys.RESERVATION_ALLOCATED: allocated(name),
        }

    return change


def set_in(path: str, value: Any) -> Change:
    """Set request[path] where path is dotted, e.g. `object.spec.nodeName`."""

    def change(req: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = req
        for key in parents:
            target = target[key]
        target[last] = value

    return change


# ----- the decision ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "reservations", "workload_uid", "expected"),
    [
        pytest.param([], [reservation("r1")], REPLICASET_UID, ["r1"], id="same controller"),
        pytest.param(
            [],
            [reservation("r1", owner_uid="old-rs", workload=DEPLOYMENT_UID)],
            DEPLOYMENT_UID,
            ["r1"],
            id="same workload, new ReplicaSet of a rollout",
        ),
        pytest.param(
            [],
            [reservation("r1", owner_uid="old-rs", workload="other")],
            DEPLOYMENT_UID,
            "no consumable reservation",
            id="other workload",
        ),
        pytest.param(
            [],
            [
                reservation("young", created="2026-11-21T23:55:00Z"),
                reservation("b-old"),
                reservation("a-old"),
            ],
            REPLICASET_UID,
            ["a-old", "b-old", "young"],
            id="oldest first, then by name",
        ),
        pytest.param(
            [],
            [reservation("r1", consumable=False)],
            REPLICASET_UID,
            "no consumable reservation",
            id="not yet consumable",
        ),
        pytest.param(
            [],
            [reservation("r1", claim="other")],
            REPLICASET_UID,
            "no consumable reservation",
            id="claimed by another pod",
        ),
        pytest.param(
            [],
            [reservation("r1", phase="Pending")],
            REPLICASET_UID,
            "no consumable reservation",
            id="not available",
        ),
        pytest.param(
            [],
            [reservation("r1", namespace="elsewhere")],
            REPLICASET_UID,
            "no consumable reservation",
            id="made for another namespace",
        ),
        pytest.param(
            [],
            [],
            REPLICASET_UID,
            "no consumable reservation for ReplicaSet web-",
            id="no reservation at all",
        ),
        pytest.param(
            [set_in("operation", "UPDATE")],
            [reservation("r1")],
            REPLICASET_UID,
            "not a pod CREATE",
            id="update",
        ),
        pytest.param(
            [set_in("dryRun", True)], [reservation("r1")], REPLICASET_UID, "dry run", id="dry run"
        ),
        pytest.param(
            [set_in("object.metadata.ownerReferences", [])],
            [reservation("r1")],
            None,
            "no controller",
            id="bare pod",
        ),
        pytest.param(
            [set_in("object.metadata.labels", {keys.RESERVATION_LABEL: "r0"})],
            [reservation("r1")],
            REPLICASET_UID,
            "placeholder",
            id="placeholder pod",
        ),
        pytest.param(
            [set_in("object.spec.nodeName", "node-2")],
            [reservation("r1")],
            REPLICASET_UID,
            "already assigned to node node-2",
            id="pod with nodeName",
        ),
        pytest.param(
            [set_in("object.metadata.annotations", {keys.RESERVATION_ALLOCATED: allocated("r0")})],
            [reservation("r1")],
            REPLICASET_UID,
            "already bound to reservation",
            id="bound by someone else",
        ),
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1", claim=TOKEN)],
            REPLICASET_UID,
            ("r1", TOKEN),
            id="reinvoked",
        ),
        # A token the cache does not see on the Reservation buys nothing: a reinvoked pod
        # already carries its whole patch, and a forged token must not get the gate.
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1")],
            REPLICASET_UID,
            "no longer waits for it",
            id="token not (yet) on the reservation",
        ),
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1", claim="other")],
            REPLICASET_UID,
            "no longer waits for it",
            id="reinvoked, claim lost",
        ),
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1", consumable=False)],
            REPLICASET_UID,
            "no longer waits for it",
            id="reinvoked, reservation closed",
        ),
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1", claim=TOKEN, phase="Succeeded")],
            REPLICASET_UID,
            "no longer waits for it",
            id="made from the manifest of a pod bound earlier",
        ),
        pytest.param(
            [claimed_by("r1")],
            [handed_over(reservation("r1", claim=TOKEN))],
            REPLICASET_UID,
            "no longer waits for it",
            id="claimed, already handed over",
        ),
        pytest.param(
            [claimed_by("r1")],
            [],
            REPLICASET_UID,
            "not in the cache",
            id="reinvoked, reservation unknown",
        ),
        pytest.param(
            [set_in("object.metadata.annotations", {keys.CLAIM: TOKEN})],
            [reservation("r1", claim=TOKEN)],
            REPLICASET_UID,
            f"without a readable {keys.RESERVATION_ALLOCATED}",
            id="claim without reservation-allocated",
        ),
    ],
)
def test_decide(
    changes: list[Change],
    reservations: list[dict[str, Any]],
    workload_uid: str | None,
    expected: list[str] | str | tuple[str, str],
) -> None:
    decision = decide(
        request(*changes), reservations=by_name(*reservations), workload_uid=workload_uid
    )
    if isinstance(expected, str):
        assert isinstance(decision, Skip)
        assert expected in decision.reason
    elif isinstance(expected, tuple):
        assert isinstance(decision, Reassert)
        assert (decision.reservation["metadata"]["name"], decision.token) == expected
    else:
        assert isinstance(decision, Claim)
        assert [r["metadata"]["name"] for r in decision.candidates] == expected


def test_decide_uses_the_request_namespace_when_the_pod_has_none() -> None:
    decision = decide(
        request(lambda req: req["object"]["metadata"].pop("namespace")),
        reservations=by_name(reservation("r1")),
        workload_uid=None,
    )
    assert isinstance(decision, Claim)


@pytest.mark.parametrize(
    ("replicaset", "expected"),
    [
        pytest.param(
            {
                "metadata": {
                    "uid": REPLICASET_UID,
                    "ownerReferences": [
                        {
                            "kind": "Deployment",
                            "name": "web",
                            "uid": DEPLOYMENT_UID,
                            "controller": True,
                        }
                    ],
                }
            },
            DEPLOYMENT_UID,
            id="ReplicaSet of a Deployment",
        ),
        pytest.param(
            {"metadata": {"uid": REPLICASET_UID}}, REPLICASET_UID, id="ReplicaSet on its own"
        ),
        pytest.param(
            {
                "metadata": {
                    "uid": "recreated",
                    "ownerReferences": [
                        {
                            "kind": "Deployment",
                            "name": "web",
                            "uid": DEPLOYMENT_UID,
                            "controller": True,
                        }
                    ],
                }
            },
            REPLICASET_UID,
            id="a different ReplicaSet of the same name",
        ),
        pytest.param(None, REPLICASET_UID, id="ReplicaSet gone"),
    ],
)
def test_top_level_workload(replicaset: dict[str, Any] | None, expected: str) -> None:
    controller = REVIEW["request"]["object"]["metadata"]["ownerReferences"][0]
    assert top_level_workload(controller, replicaset) == expected


# ----- the patch -------------------------------------------------------------------------


def apply_patch(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add` (the only operation the webhook emits), strict about parents."""
    result = copy.deepcopy(document)
    for operation in patch:
        assert operation["op"] == "add", operation
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]
        ]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), operation["value"])
        else:
            assert isinstance(target, dict), f"no object at the parent of {operation['path']}"
            target[last] = operation["value"]
    return result


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


# ----- the handler -----------------------------------------------------------------------


@pytest.fixture
async def http(webhook: Webhook) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(make_app(webhook))) as test_client:
        yield test_client


def review_body(**changes: Any) -> bytes:
    body = copy.deepcopy(REVIEW)
    body.update(changes)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        pytest.param(b"{not json", "the body is not JSON", id="not JSON"),
        pytest.param(b"[]", "not an admission.k8s.io/v1 AdmissionReview", id="a list"),
        pytest.param(
            review_body(apiVersion="admission.k8s.io/v1beta1"),
            "not an admission.k8s.io/v1 AdmissionReview",
            id="v1beta1",
        ),
        pytest.param(
            review_body(kind="TokenReview"),
            "not an admission.k8s.io/v1 AdmissionReview",
            id="another kind",
        ),
        pytest.param(review_body(request=None), "has no request", id="no request"),
        pytest.param(
            review_body(request={**REVIEW["request"], "uid": ""}), "has no uid", id="no uid"
        ),
        pytest.param(
            review_body(request={**REVIEW["request"], "object": None}),
            "object is not a Pod",
            id="no object",
        ),
        pytest.param(
            review_body(
                request={
                    **REVIEW["request"],
                    "object": {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "metadata": {},
                        "spec": {},
                    },
                }
            ),
            "object is not a Pod",
            id="a Deployment",
        ),
        pytest.param(
            review_body(
                request={
                    **REVIEW["request"],
                    "object": {**REVIEW["request"]["object"], "metadata": "web"},
                }
            ),
            "object is not a Pod",
            id="metadata not an object",
        ),
    ],
)
async def test_malformed_review_is_refused_with_the_problem(
    http: TestClient[Any, Any], body: bytes, problem: str
) -> None:
    response = await http.post(
        "/mutate-pod", data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status == 400
    text = await response.text()
    assert problem in text
    assert "Traceback" not in text


async def test_pod_without_reservation_is_allowed_unpatched(http: TestClient[Any, Any]) -> None:
    response = await http.post("/mutate-pod", data=review_body())
    assert response.status == 200
    assert await response.json() == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": REVIEW["request"]["uid"], "allowed": True},
    }


async def test_api_server_failure_lets_the_pod_through(
    http: TestClient[Any, Any], webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    webhook.reservations.store["r1"] = reservation("r1")
    response = await http.post("/mutate-pod", data=review_body())
    assert response.status == 200
    answer = (await response.json())["response"]
    assert answer == {"uid": REVIEW["request"]["uid"], "allowed": True}
    assert "left unbound, the API server failed" in caplog.text


async def test_reinvocation_answers_from_the_cache_alone(
    http: TestClient[Any, Any], webhook: Webhook
) -> None:
    """A reinvocation claims nothing: the API server (a closed port) is never needed."""
    webhook.reservations.store["r1"] = reservation("r1", claim=TOKEN)
    partly_bound = request(claimed_by("r1"))
    response = await http.post("/mutate-pod", data=review_body(request=partly_bound))
    answer = (await response.json())["response"]
    assert answer["patchType"] == "JSONPatch"
    patched = apply_patch(partly_bound["object"], json.loads(base64.b64decode(answer["patch"])))
    assert patched["spec"]["schedulingGates"] == [{"name": keys.RESERVATION_GATE}]


async def test_health_and_readiness(http: TestClient[Any, Any], webhook: Webhook) -> None:
    assert (await http.get("/healthz")).status == 200
    assert (await http.get("/readyz")).status == 503
    webhook.reservations.synced.set()
    assert (await http.get("/readyz")).status == 200
