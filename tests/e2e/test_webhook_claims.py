"""The webhook claims a Reservation only for the pod it was made for, and never leaves a
claim that no pod carries.

A real `python -m webhook` process gets AdmissionReviews posted the way an attacker who
reaches its port would post them: pods naming an owner UID that is not theirs, fields of
the wrong type, a connection closed before the answer. Its API server is the session's,
or a relay in front of it that stops passing requests on (an API server that hangs).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from berth.api import keys
from berth.protocol import claim_of
from tests.e2e.kube import Cluster
from tests.e2e.serving import Certs, Server, connect, make_certs, request_head, start
from tests.e2e.webhook_world import (
    TEST_LABEL,
    make_reservations,
    post,
    reservation,
    review,
    until_fresh,
    web_replicaset,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("claims-certs"))


@pytest.fixture(scope="module")
async def webhook(cluster: Cluster, certs: Certs) -> AsyncIterator[Server]:
    server = await start(cluster, certs, "webhook")
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def delete_reservations(cluster: Cluster, namespace: str) -> Iterator[None]:
    """Reservations are cluster-scoped: they outlive the test's namespace unless deleted."""
    yield
    cluster.kubectl(
        "delete", "reservations", "-l", f"{TEST_LABEL}={namespace}", "--wait=false", check=False
    )


async def claimable(
    cluster: Cluster, namespace: str, webhook: Server
) -> tuple[dict[str, Any], str]:
    """A ReplicaSet (as an owner reference) and a consumable Reservation made for its
    pods, in the webhook's cache when this returns. The Deployment has no replicas: no
    pod of it is ever created through the API server."""
    owner, deployment_uid = await web_replicaset(cluster, namespace, replicas=0)
    [name] = await make_reservations(
        cluster, namespace, owner=owner, nodes=["node-1"], workload=deployment_uid
    )
    await until_fresh(cluster, namespace, webhook, webhook.context, "probe")
    return owner, name


async def post_raw(webhook: Server, body: Any) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            webhook.url + webhook.path, json=body, ssl=webhook.context or False
        ) as response,
    ):
        return response.status, await response.text()


# ----- forged owners ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(
            lambda owner: {**owner, "kind": "StatefulSet", "name": "web"}, id="another kind"
        ),
        pytest.param(lambda owner: {**owner, "name": "web-imposter"}, id="another name"),
    ],
)
async def test_a_pod_naming_an_owner_uid_not_its_own_claims_nothing(
    cluster: Cluster,
    namespace: str,
    webhook: Server,
    forge: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    """The pod names the ReplicaSet's UID, but no such owner of that kind and name has it
    in the namespace: the pod gets nothing (another name: the API server is asked;
    another kind: the review says the ReplicaSet controller, not that kind's, made it)."""
    owner, name = await claimable(cluster, namespace, webhook)
    async with aiohttp.ClientSession() as session:
        forged = await post(session, webhook, review(namespace, forge(owner)), webhook.context)
        assert forged == []
        assert claim_of(await reservation(cluster, name)) is None
        # The ReplicaSet's own pod still gets it.
        genuine = await post(session, webhook, review(namespace, owner), webhook.context)
    assert genuine
    assert claim_of(await reservation(cluster, name)) is not None


# ----- forged types -----------------------------------------------------------------------


def set_field(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    target = body["request"]["object"]
    *parents, last = path.split(".")
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    return body


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param("spec.schedulingGates", ["berth.sh/other"], id="gates of strings"),
        pytest.param("spec.affinity", "node-1", id="affinity a string"),
        pytest.param(
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            {"nodeSelectorTerms": ["node-1"]},
            id="terms of strings",
        ),
        pytest.param("metadata.annotations", ["a"], id="annotations a list"),
        pytest.param("metadata.labels", {"app": 1}, id="a label value a number"),
    ],
)
async def test_a_review_of_the_wrong_shape_is_refused_and_claims_nothing(
    cluster: Cluster, namespace: str, webhook: Server, path: str, value: Any
) -> None:
    owner, name = await claimable(cluster, namespace, webhook)
    status, text = await post_raw(webhook, set_field(review(namespace, owner), path, value))
    assert status == 400, text
    assert claim_of(await reservation(cluster, name)) is None


# ----- answers that do not arrive -----------------------------------------------------------


async def test_a_claim_is_released_when_the_answer_cannot_be_delivered(
    cluster: Cluster, namespace: str, webhook: Server
) -> None:
    """The caller (an API server whose timeout passed) is gone before the answer: no pod
    will carry the claim, so the webhook takes it back."""
    owner, name = await claimable(cluster, namespace, webhook)
    body = json.dumps(review(namespace, owner)).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    _, writer = await connect(webhook)
    writer.write(request_head(webhook, headers=headers) + body)
    await writer.drain()
    writer.close()

    async def released() -> bool:
        return claim_of(await reservation(cluster, name)) is None and "released" in (
            webhook.logged()
        )

    await cluster.await_(released, what=f"the claim on {name} to be released", timeout=15)


class Relay:
    """A TCP relay in front of the API server. After `stall()` it drops what clients
    send: their requests never arrive, as with an API server that hangs."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.stalled = False
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.relay, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    def stall(self) -> None:
        self.stalled = True

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        await asyncio.gather(
            self.pipe(reader, up_writer, upward=True),
            self.pipe(up_reader, writer, upward=False),
            return_exceptions=True,
        )

    async def pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, upward: bool
    ) -> None:
        try:
            while data := await source.read(65536):
                if upward and self.stalled:
                    continue
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
async def relayed(cluster: Cluster, tmp_path: Path) -> AsyncIterator[tuple[Relay, Path]]:
    """A relay to the session's API server, and a kubeconfig that goes through it."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    relay = Relay((host, int(port)))
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{await relay.start()}"
    kubeconfig = tmp_path / "relayed.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    yield relay, kubeconfig
    await relay.stop()


async def test_the_answer_comes_within_the_deadline_when_the_api_server_hangs(
    cluster: Cluster, namespace: str, certs: Certs, relayed: tuple[Relay, Path]
) -> None:
    """The API server gives the webhook 3 s (timeoutSeconds) and then creates the pod as
    if it had not been called; an answer after that binds nothing. The webhook answers
    within its deadline, unpatched, and writes no claim."""
    relay, kubeconfig = relayed
    webhook = await start(
        cluster, certs, "webhook", "--request-deadline=0.5", kubeconfig=kubeconfig
    )
    try:
        owner, name = await claimable(cluster, namespace, webhook)
        relay.stall()
        began = time.monotonic()
        async with aiohttp.ClientSession() as session:
            try:
                patch = await asyncio.wait_for(
                    post(session, webhook, review(namespace, owner), webhook.context), 3
                )
            except TimeoutError:
                raise AssertionError("no answer within the API server's 3 s") from None
        assert time.monotonic() - began < 2
        assert patch == []
        assert claim_of(await reservation(cluster, name)) is None
    finally:
        webhook.stop()


# ----- tokens -------------------------------------------------------------------------------


async def test_claim_tokens_are_never_logged(
    cluster: Cluster, namespace: str, webhook: Server
) -> None:
    """A claim token is what entitles a pod to a Reservation's capacity: it must not be
    readable by whoever reads the logs."""
    owner, _ = await claimable(cluster, namespace, webhook)
    token = secrets.token_hex(16)
    body = review(namespace, owner)
    body["request"]["object"]["metadata"]["annotations"] = {
        keys.CLAIM: token,
        keys.RESERVATION_ALLOCATED: json.dumps({"name": f"{namespace}-gone", "uid": "0"}),
    }
    async with aiohttp.ClientSession() as session:
        assert await post(session, webhook, body, webhook.context) == []
    logged = webhook.logged()
    assert f"{namespace}-gone, which is not in the cache" in logged
    assert token not in logged
