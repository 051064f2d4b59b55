"""The webhook's HTTPS endpoint under hostile AdmissionReviews: every body gets the
review's answer (allowed, with a patch that is a JSONPatch) or a 4xx that names the
problem; never a 5xx, a traceback or a hang.

The webhook's cache holds a Reservation the recorded pod has claimed (the reinvocation
path builds the whole patch from the pod) and a consumable one for a StatefulSet's pods
(the claim path builds the patch, then calls the API server, here a closed port).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import orjson
import pytest
from hypothesis import given

from berth import web
from berth.api import keys
from tests.fuzz.bodies import Request, requests
from tests.fuzz.harness import REFUSED_EARLY, Client, Crashes, crash_log, running, unreachable_kube
from tests.fuzz.settings import CASES, FUZZ
from tests.unit.webhook_cases import REVIEW, TOKEN, allocated, reservation
from webhook.app import Webhook, make_app

STATEFULSET = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "name": "db",
    "uid": "uid-statefulset-db",
    "controller": True,
}


def _claimed() -> dict[str, Any]:
    review = copy.deepcopy(REVIEW)
    review["request"]["object"]["metadata"]["annotations"] = {
        keys.CLAIM: TOKEN,
        keys.RESERVATION_ALLOCATED: allocated("claimed"),
    }
    return review


def _statefulset_pod() -> dict[str, Any]:
    review = copy.deepcopy(REVIEW)
    review["request"]["object"]["metadata"]["ownerReferences"] = [STATEFULSET]
    return review


BASES = [REVIEW, _claimed(), _statefulset_pod()]


def _statefulset_reservation() -> dict[str, Any]:
    found = reservation("db")
    found["spec"]["owners"] = [{"controller": STATEFULSET}]
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Crashes]]:
    async def make(stack: AsyncExitStack) -> web.App:
        kube = unreachable_kube(stack)
        webhook = Webhook(kube)
        webhook.reservations.put(reservation("claimed", claim=TOKEN))
        webhook.reservations.put(_statefulset_reservation())
        return make_app(webhook)

    with crash_log() as crashes, running(make, tmp_path_factory.mktemp("tls")) as http:
        yield http, crashes


def check(request: Request, status: int, body: bytes) -> None:
    assert status < 500, f"{status}: {body[:500]!r}"
    if status == 200:
        answer = orjson.loads(body)
        sent = orjson.loads(request.sent)  # a 200 only answers a body that was JSON
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == sent["request"]["uid"]
        assert answer["response"]["allowed"] is True
        if "patch" in answer["response"]:
            assert answer["response"]["patchType"] == "JSONPatch"
            patch = orjson.loads(base64.b64decode(answer["response"]["patch"]))
            assert isinstance(patch, list)
            assert patch
            assert all(op["op"] == "add" and op["path"].startswith("/") for op in patch)
    else:
        assert 400 <= status < 500
        assert body.strip(), "a refusal names its problem"
        assert b"Traceback" not in body


def test_admission_reviews(server: tuple[Client, Crashes]) -> None:
    http, crashes = server
    cases = 0

    @FUZZ
    @given(request=requests(BASES))
    def case(request: Request) -> None:
        nonlocal cases
        cases += 1
        answer = http.post("/mutate-pod", request.body, request.headers)
        assert not crashes.take(), "the server logged a traceback"
        if answer is None:
            assert len(request.body) > REFUSED_EARLY, "the server closed the connection"
            return
        check(request, answer.status, answer.body)

    case()
    assert cases >= CASES
