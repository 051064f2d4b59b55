"""What the fuzz tests found in the HTTP layer, kept as plain cases: a body that cannot be
decoded as its Content-Encoding says gets a 4xx naming the problem (it got a 500 and a
logged traceback, or, split across reads, no answer until the body deadline)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import orjson
import pytest

from berth import web
from berth.ledger import Ledger
from berth.settings import MigrationControllerArgs
from berth.web import MAX_BODY
from extender.app import make_app
from extender.decide import Placement
from tests.fuzz.harness import Client, Crashes, crash_log, running, unreachable_kube
from tests.unit.webhook_cases import REVIEW
from webhook.app import EVICTION_PATH, Webhook
from webhook.app import make_app as webhook_app
from webhook.intercept import CONTROLLER_USER, Interception, Interceptor


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Crashes]]:
    async def make(_: AsyncExitStack) -> web.App:
        return make_app(Ledger(), placement=Placement.SPREAD, ready=lambda: True)

    with crash_log() as crashes, running(make, tmp_path_factory.mktemp("tls")) as http:
        yield http, crashes


@pytest.mark.parametrize(
    ("encoding", "body", "status", "problem"),
    [
        pytest.param("gzip", b"{}", 400, "the body is not gzip", id="gzip, not gzipped"),
        pytest.param(
            "deflate", b"\x01", 400, "the body is not deflate", id="deflate, not deflated"
        ),
        pytest.param(
            "gzip",
            gzip.compress(b"{}")[:10] + b"\xff" * 64,
            400,
            "the body is not gzip",
            id="gzip, corrupt",
        ),
        pytest.param(
            "gzip", gzip.compress(b"{}" * 100)[:-12], 400, "it is cut short", id="gzip, cut short"
        ),
        pytest.param(
            "gzip",
            gzip.compress(b" " * (MAX_BODY + 1)),
            413,
            "over 8388608 bytes once decoded",
            id="a small body that decodes past the limit",
        ),
        pytest.param("br", b"{}", 415, "Content-Encoding br is not read", id="brotli"),
        pytest.param("x-bad", b"{}", 415, "Content-Encoding x-bad is not read", id="unknown"),
    ],
)
def test_an_undecodable_body_is_refused_with_the_problem(
    server: tuple[Client, Crashes], encoding: str, body: bytes, status: int, problem: str
) -> None:
    http, crashes = server
    answer = http.post(
        "/prioritize",
        body,
        {"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    assert answer is not None
    assert answer.status == status
    assert problem in answer.body.decode()
    assert crashes.take() == []


def test_a_compressed_body_is_read(server: tuple[Client, Crashes]) -> None:
    http, crashes = server
    body = b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["node-0"]}'
    for encoding, compressed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        answer = http.post(
            "/prioritize",
            compressed,
            {"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert answer is not None, encoding
        assert answer.status == 200, encoding
        assert answer.body == b'[{"Host":"node-0","Score":10}]'
    assert crashes.take() == []


EVICTION = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "u1",
        "name": "web-1",
        "namespace": "ns",
        "subResource": "eviction",
        "operation": "CREATE",
        "userInfo": {"username": CONTROLLER_USER},
        "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1"}},
    },
}


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Crashes]]:
    async def make(stack: AsyncExitStack) -> web.App:
        kube = unreachable_kube(stack)
        interception = Interception(MigrationControllerArgs())
        interceptor = Interceptor(kube, interception=interception, reservations={}, deadline=2)
        return webhook_app(Webhook(kube), interceptor)

    with crash_log() as crashes, running(make, tmp_path_factory.mktemp("tls")) as http:
        yield http, crashes


@pytest.mark.parametrize(
    ("path", "review"),
    [
        pytest.param("/mutate-pod", REVIEW, id="a pod's review"),
        pytest.param(EVICTION_PATH, EVICTION, id="an eviction's review"),
    ],
)
def test_a_compressed_review_is_read(
    webhook: tuple[Client, Crashes], path: str, review: dict[str, Any]
) -> None:
    http, crashes = webhook
    body = orjson.dumps(review)
    for encoding, compressed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        answer = http.post(
            path, compressed, {"Content-Type": "application/json", "Content-Encoding": encoding}
        )
        assert answer is not None, encoding
        assert answer.status == 200, (encoding, answer.body)
        assert orjson.loads(answer.body)["response"] == {
            "uid": review["request"]["uid"],
            "allowed": True,
        }
    assert crashes.take() == []
