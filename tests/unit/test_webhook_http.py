"""How the webhook's handler reads an AdmissionReview and answers it."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from math import inf
from typing import Any

import aiohttp
import pytest

from berth import server
from berth.api import keys
from berth.kube.client import RESERVATIONS
from tests.served import served
from tests.unit.webhook_cases import (
    DEPLOYMENT_UID,
    NAMESPACE,
    REPLICASET_NAME,
    REPLICASET_UID,
    REVIEW,
    TOKEN,
    apply_patch,
    claimed_by,
    request,
    reservation,
    review_body,
)
from webhook.app import Webhook, make_app


@pytest.fixture
async def http(webhook: Webhook) -> AsyncIterator[aiohttp.ClientSession]:
    async with served(make_app(webhook)) as test_client:
        yield test_client


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
        pytest.param(
            review_body(
                request={
                    **REVIEW["request"],
                    "object": {
                        **REVIEW["request"]["object"],
                        "spec": {**REVIEW["request"]["object"]["spec"], "containers": [None]},
                    },
                }
            ),
            "object.spec.containers.0: Input should be",
            id="a container null",
        ),
    ],
)
async def test_malformed_review_is_refused_with_the_problem(
    http: aiohttp.ClientSession, body: bytes, problem: str
) -> None:
    response = await http.post(
        "/mutate-pod", data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status == 400
    text = await response.text()
    assert problem in text
    assert "Traceback" not in text


async def test_pod_without_reservation_is_allowed_unpatched(http: aiohttp.ClientSession) -> None:
    response = await http.post("/mutate-pod", data=review_body())
    assert response.status == 200
    assert await response.json() == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": REVIEW["request"]["uid"], "allowed": True},
    }


async def test_api_server_failure_lets_the_pod_through(
    http: aiohttp.ClientSession, webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    webhook.reservations.put(reservation("r1"))
    response = await http.post("/mutate-pod", data=review_body())
    assert response.status == 200
    answer = (await response.json())["response"]
    assert answer == {"uid": REVIEW["request"]["uid"], "allowed": True}
    assert "left unbound, the API server failed" in caplog.text


@pytest.mark.parametrize(
    "cached",
    [
        pytest.param(reservation("r1", namespace="elsewhere"), id="another namespace"),
        pytest.param(reservation("r1", consumable=False, namespace="elsewhere"), id="opening"),
        pytest.param(reservation("r1", phase="Succeeded"), id="ended"),
        pytest.param(reservation("r1", phase="Failed", consumable=False), id="failed"),
        # Its time is up: no controller has ended it (it is down, or being replaced), and
        # a pod bound to it now would stay gated until one does.
        pytest.param(reservation("r1", ttl="5m"), id="expired"),
    ],
)
async def test_a_reservation_no_pod_here_can_take_costs_no_api_call(
    http: aiohttp.ClientSession,
    webhook: Webhook,
    caplog: pytest.LogCaptureFixture,
    cached: dict[str, Any],
) -> None:
    """Only the Reservations not ended, for the pod's namespace, are read: any other
    leaves the pod's controller unconfirmed (a GET, here to a closed port)."""
    webhook.reservations.put(cached)
    response = await http.post("/mutate-pod", data=review_body())
    assert (await response.json())["response"] == {
        "uid": REVIEW["request"]["uid"],
        "allowed": True,
    }
    assert "the API server failed" not in caplog.text


async def test_reinvocation_answers_from_the_cache_alone(
    http: aiohttp.ClientSession, webhook: Webhook
) -> None:
    """A reinvocation claims nothing: the API server (a closed port) is never needed."""
    webhook.reservations.put(reservation("r1", claim=TOKEN))
    partly_bound = request(claimed_by("r1"))
    response = await http.post("/mutate-pod", data=review_body(request=partly_bound))
    answer = (await response.json())["response"]
    assert answer["patchType"] == "JSONPatch"
    patched = apply_patch(partly_bound["object"], json.loads(base64.b64decode(answer["patch"])))
    assert patched["spec"]["schedulingGates"] == [{"name": keys.RESERVATION_GATE}]


async def test_a_reinvocation_before_the_cache_shows_the_claim_reads_the_reservation(
    http: aiohttp.ClientSession, webhook: Webhook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reinvoked moments after its claim, the pod may reach a replica whose cache still
    shows the Reservation open, unclaimed; a later webhook may have replaced its affinity
    or gates. The Reservation is read again, and the pod gets its patch back."""
    webhook.reservations.put(reservation("r1"))
    reads: list[str] = []

    async def get(resource: Any, name: str, _namespace: str | None = None) -> Any:
        if resource != RESERVATIONS:  # the pod's ReplicaSet, confirmed
            return {"metadata": {"name": name, "namespace": NAMESPACE, "uid": REPLICASET_UID}}
        reads.append(name)
        return reservation("r1", claim=TOKEN)

    monkeypatch.setattr(webhook.kube, "get", get)
    partly_bound = request(claimed_by("r1"))
    response = await http.post("/mutate-pod", data=review_body(request=partly_bound))
    answer = (await response.json())["response"]
    assert reads == ["r1"]
    patched = apply_patch(partly_bound["object"], json.loads(base64.b64decode(answer["patch"])))
    assert patched["spec"]["schedulingGates"] == [{"name": keys.RESERVATION_GATE}]
    # A token of its own making buys nothing more for being read again.
    forged = request(claimed_by("r1", token="forged"))
    response = await http.post("/mutate-pod", data=review_body(request=forged))
    assert "patch" not in (await response.json())["response"]


@pytest.mark.parametrize(("carried", "age"), [(False, 5.0), (True, 5.0), (False, 0.2)])
async def test_a_claim_no_pod_carries_is_taken_over_by_the_workloads_next_pod(
    http: aiohttp.ClientSession,
    webhook: Webhook,
    monkeypatch: pytest.MonkeyPatch,
    carried: bool,
    age: float,
) -> None:
    """The pod the webhook claimed for was refused after it (a ResourceQuota): the claim
    binds nothing until the controller releases it. The workload's next pod asks the API
    server for the pods carrying that claim (by its label); none: it claims the
    Reservation anew, conditional on the copy that showed the old claim. A pod that
    carries it keeps it; a claim this replica has known for less than a second (its pod
    may still be being admitted, beside this one) is not contested."""
    webhook.reservations.put(reservation("r1", claim="0ld"))
    webhook.claims["r1"] = ("0ld", time.monotonic() - age)
    listed: list[str | None] = []
    patched: list[Any] = []
    holder = {"metadata": {"name": "web-1", "annotations": {keys.CLAIM: "0ld"}}}

    async def get(_resource: Any, name: str, _namespace: str | None = None) -> Any:
        return {"metadata": {"name": name, "namespace": NAMESPACE, "uid": REPLICASET_UID}}

    async def list_(_resource: Any, **query: Any) -> Any:
        listed.append(query.get("label_selector"))
        return {"items": [holder] if carried else []}

    async def patch(_resource: Any, _name: str, body: Any, **_: Any) -> Any:
        patched.append(body)
        return body

    monkeypatch.setattr(webhook.kube, "get", get)
    monkeypatch.setattr(webhook.kube, "list", list_)
    monkeypatch.setattr(webhook.kube, "patch", patch)
    response = await http.post("/mutate-pod", data=review_body())
    answer = (await response.json())["response"]
    if age < 1:
        assert (listed, patched) == ([], [])
        assert "patch" not in answer
        return
    assert listed == [f"{keys.CLAIM}=0ld"]
    if carried:
        assert patched == []
        assert "patch" not in answer
        return
    [claim] = patched
    assert claim["metadata"]["resourceVersion"] == "7"
    token = claim["metadata"]["annotations"][keys.CLAIM]
    assert token != "0ld"
    pod = apply_patch(REVIEW["request"]["object"], json.loads(base64.b64decode(answer["patch"])))
    assert pod["spec"]["schedulingGates"] == [{"name": keys.RESERVATION_GATE}]
    assert pod["metadata"]["labels"][keys.CLAIM] == token


async def test_a_takeover_whose_answer_cannot_be_delivered_is_taken_back(
    http: aiohttp.ClientSession, webhook: Webhook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim taken over binds no pod if its answer never reaches the API server (the
    caller gone): like a fresh claim, it is taken back, or the Reservation would wait,
    claimed by no pod, until the controller releases it."""
    webhook.reservations.put(reservation("r1", claim="0ld"))
    webhook.claims["r1"] = ("0ld", time.monotonic() - 5)
    patched: list[Any] = []

    async def get(resource: Any, name: str, _namespace: str | None = None) -> Any:
        if resource == RESERVATIONS:
            return reservation("r1", claim=patched[0]["metadata"]["annotations"][keys.CLAIM])
        return {"metadata": {"name": name, "namespace": NAMESPACE, "uid": REPLICASET_UID}}

    async def list_(_resource: Any, **_: Any) -> Any:
        return {"items": []}

    async def patch(_resource: Any, _name: str, body: Any, **_: Any) -> Any:
        patched.append(body)
        return body

    async def gone(_exchange: Any, _response: Any) -> None:
        raise ConnectionResetError("the client closed the connection")

    monkeypatch.setattr(webhook.kube, "get", get)
    monkeypatch.setattr(webhook.kube, "list", list_)
    monkeypatch.setattr(webhook.kube, "patch", patch)
    monkeypatch.setattr(server._Exchange, "deliver", gone)
    await http.post("/mutate-pod", data=review_body())
    claim, release = patched
    assert claim["metadata"]["annotations"][keys.CLAIM] != "0ld"
    assert release["metadata"]["annotations"] == {keys.CLAIM: None}


async def test_a_rollouts_pod_reinvoked_is_judged_by_its_deployment_as_when_it_claimed(
    http: aiohttp.ClientSession, webhook: Webhook
) -> None:
    """Its Reservation was made for the Deployment's old ReplicaSet: the pod matches it
    through the Deployment above its own, which the webhook confirmed when it claimed and
    remembers (`webhook.owners`); the API server (a closed port) is not asked again."""
    old = "00000000-0000-4000-8000-0000000000aa"
    webhook.reservations.put(reservation("r1", claim=TOKEN, owner_uid=old, workload=DEPLOYMENT_UID))
    above = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "uid": DEPLOYMENT_UID,
        "controller": True,
    }
    replicaset = {"metadata": {"uid": REPLICASET_UID, "ownerReferences": [above]}}
    webhook.owners.found[(NAMESPACE, REPLICASET_NAME, REPLICASET_UID)] = (inf, replicaset)
    partly_bound = request(claimed_by("r1"))
    response = await http.post("/mutate-pod", data=review_body(request=partly_bound))
    answer = (await response.json())["response"]
    patched = apply_patch(partly_bound["object"], json.loads(base64.b64decode(answer["patch"])))
    assert patched["spec"]["schedulingGates"] == [{"name": keys.RESERVATION_GATE}]


async def test_health_and_readiness(http: aiohttp.ClientSession, webhook: Webhook) -> None:
    assert (await http.get("/healthz")).status == 200
    assert (await http.get("/readyz")).status == 503
    webhook.reservations.synced.set()
    assert (await http.get("/readyz")).status == 200


@pytest.mark.parametrize(
    ("owner_uid", "level"),
    [
        pytest.param(REPLICASET_UID, logging.INFO, id="made for its controller"),
        pytest.param("00000000-0000-4000-8000-0000000000aa", logging.DEBUG, id="for another"),
    ],
)
async def test_why_a_pod_was_not_bound_is_said_at_info_only_when_the_reservation_was_its(
    http: aiohttp.ClientSession,
    webhook: Webhook,
    caplog: pytest.LogCaptureFixture,
    owner_uid: str,
    level: int,
) -> None:
    """A Reservation about to open in the namespace: a pod it was made for, not bound
    (here: made by someone else than its controller), is worth an INFO line; any other
    pod of the namespace only a DEBUG one."""
    webhook.reservations.put(reservation("r1", owner_uid=owner_uid, consumable=False))
    by_someone = request(lambda r: r["userInfo"].update(username="alice"))
    with caplog.at_level(logging.DEBUG, logger="webhook.app"):
        response = await http.post("/mutate-pod", data=review_body(request=by_someone))
    assert (await response.json())["response"] == {"uid": by_someone["uid"], "allowed": True}
    [said] = [r for r in caplog.records if "pod " in r.getMessage() and "alice" in r.getMessage()]
    assert said.levelno == level
