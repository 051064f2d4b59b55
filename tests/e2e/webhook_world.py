"""The world the webhook e2e tests build: webhook processes of their own, workloads,
Reservations, a MutatingWebhookConfiguration scoped to the test's namespace, and
AdmissionReviews sent straight to a replica."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import signal
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from berth.api import keys
from berth.kube.client import PODS, Kube
from berth.kube.informer import Informer
from berth.protocol import CONTROLLER_IDENTITIES, is_gated, node_of, phase
from devtools.processes import free_port
from tests.e2e.kube import Cluster

REPO = Path(__file__).resolve().parents[2]
REVIEW: dict[str, Any] = json.loads(
    (REPO / "tests" / "data" / "admission_review_pod_create.json").read_text()
)
PAUSE = "registry.k8s.io/pause:3.10"
TEST_LABEL = "webhook-test/namespace"


@dataclass
class Replica:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> int:
        """SIGTERM, as the kubelet sends it; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=15)


def spawn(cluster: Cluster, certs: Path) -> Replica:
    """`python -m webhook` on a free port, logging to a file beside the certificates."""
    port = free_port()
    log = certs / f"webhook-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook",
                f"--kubeconfig={cluster.local.component_kubeconfig('webhook')}",
                "--host=127.0.0.1",
                f"--port={port}",
                f"--tls-cert-file={certs / 'tls.crt'}",
                f"--tls-private-key-file={certs / 'tls.key'}",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Replica(f"https://127.0.0.1:{port}", process, log)


@asynccontextmanager
async def webhook_replicas(
    cluster: Cluster, certs: Path, tls: ssl.SSLContext, count: int
) -> AsyncIterator[list[Replica]]:
    replicas: list[Replica] = []
    try:
        for _ in range(count):
            replicas.append(spawn(cluster, certs))
        async with aiohttp.ClientSession() as session:
            for replica in replicas:

                async def ready(replica: Replica = replica) -> bool:
                    assert replica.process.poll() is None, replica.log.read_text()
                    try:
                        async with session.get(f"{replica.url}/readyz", ssl=tls) as response:
                            return response.status == 200
                    except aiohttp.ClientError:
                        return False

                await cluster.await_(ready, what=f"webhook {replica.url} to be ready")
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()


# ----- the world: workloads, Reservations, the webhook configuration ---------------------


def deployment(replicas: int) -> str:
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": PAUSE}]},
                },
            },
        }
    )


async def web_replicaset(
    cluster: Cluster, namespace: str, *, replicas: int
) -> tuple[dict[str, Any], str]:
    """Deploy `web`; its ReplicaSet as a controller reference, and the Deployment's UID."""
    await cluster.aapply(deployment(replicas), namespace)

    def replicaset() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = cluster.get("rs", "-n", namespace, "-l", "app=web")["items"]
        return items

    found = (await cluster.await_(replicaset, what="the Deployment's ReplicaSet"))[0]
    return reference(found), found["metadata"]["ownerReferences"][0]["uid"]


def reference(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
    }


async def make_reservations(
    cluster: Cluster,
    namespace: str,
    *,
    owner: dict[str, Any],
    nodes: list[str],
    workload: str | None = None,
    prefix: str = "r",
    cpu: str | None = None,
) -> list[str]:
    """Consumable Reservations for the pods of `owner`, one on each of `nodes`, made as a
    migration makes them: created, held on their node by the controller's placeholder
    (the template pins it there), then opened to claims. Each holds `cpu`, if given."""
    names = [f"{namespace}-{prefix}{index}" for index in range(len(nodes))]
    annotations = {keys.WORKLOAD: workload} if workload else {}
    for name, node in zip(names, nodes, strict=True):
        pin = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
        await cluster.akubectl(
            "create",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
                    "kind": "Reservation",
                    "metadata": {
                        "name": name,
                        "labels": {TEST_LABEL: namespace},
                        "annotations": annotations,
                    },
                    "spec": {
                        "template": {
                            "metadata": {"namespace": namespace},
                            "spec": {
                                "containers": [container(cpu)],
                                "affinity": {"nodeAffinity": pin},
                            },
                        },
                        "owners": [{"controller": {**owner, "namespace": namespace}}],
                    },
                }
            ),
        )

    def available() -> bool:
        found = {
            r["metadata"]["name"]: r
            for r in cluster.get("reservations", "-l", f"{TEST_LABEL}={namespace}")["items"]
        }
        return all(
            name in found and phase(found[name]) == "Available" and node_of(found[name]) == node
            for name, node in zip(names, nodes, strict=True)
        )

    await cluster.await_(available, what=f"reservations {names} to be available")
    await cluster.akubectl("annotate", "reservation", *names, f"{keys.CONSUMABLE}=true")
    return names


async def reservation(cluster: Cluster, name: str) -> dict[str, Any]:
    return await cluster.aget("reservation", name)


AS_REPLICASET_CONTROLLER = "--as=" + CONTROLLER_IDENTITIES[("apps/v1", "ReplicaSet")]
"""kubectl's flag to create a pod as the ReplicaSet controller does: the webhook binds a
pod only when the API server says its controller created it (the test's admin
credentials may impersonate)."""


async def probe_owner(cluster: Cluster, namespace: str, tag: str) -> dict[str, Any]:
    """A ReplicaSet of no replicas that controls probe pods (created as its controller
    would create them), and a Reservation for them."""
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": tag},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"probe": tag}},
            "template": {
                "metadata": {"labels": {"probe": tag}},
                "spec": {"containers": [{"name": "app", "image": PAUSE}]},
            },
        },
    }
    await cluster.aapply(json.dumps(replicaset), namespace)
    owner = reference(await cluster.aget("rs", tag, "-n", namespace))
    await make_reservations(cluster, namespace, owner=owner, nodes=["node-0"], prefix=tag)
    return owner


@asynccontextmanager
async def pods_as_admitted(
    cluster: Cluster, namespace: str, selector: str
) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """Each pod of `selector`, by name, as the API server first stored it: right after
    admission, before the controller lifts the gate of a pod that claimed a Reservation."""
    kube = await Kube.connect(cluster.kubeconfig)
    admitted: dict[str, dict[str, Any]] = {}

    def first_seen(_kind: str, pod: dict[str, Any]) -> None:
        admitted.setdefault(pod["metadata"]["name"], pod)

    informer = Informer(
        kube, PODS, namespace=namespace, label_selector=selector, handler=first_seen
    )
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        yield admitted
    finally:
        task.cancel()
        await kube.close()


def owned_pod(owner: dict[str, Any], *, name: str | None = None, cpu: str | None = None) -> str:
    metadata: dict[str, Any] = {"ownerReferences": [owner]}
    metadata.update({"name": name} if name else {"generateName": "probe-"})
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"containers": [container(cpu)]},
        }
    )


def container(cpu: str | None) -> dict[str, Any]:
    """The pause container, asking `cpu` if given."""
    asks = {"resources": {"requests": {"cpu": cpu}}} if cpu else {}
    return {"name": "app", "image": PAUSE, **asks}


def configuration(name: str, namespace: str, *, urls: list[str], ca: bytes) -> str:
    """One webhook entry per replica: every pod passes each in turn, so the later ones
    must see the first one's claim and add nothing."""
    return json.dumps(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": f"replica-{index}.reservation-binding.berth.sh",
                    "clientConfig": {
                        "url": f"{url}/mutate-pod",
                        "caBundle": base64.b64encode(ca).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "NoneOnDryRun",
                    "failurePolicy": "Ignore",
                    "reinvocationPolicy": "IfNeeded",
                    "timeoutSeconds": 5,
                }
                for index, url in enumerate(urls)
            ],
        }
    )


@asynccontextmanager
async def registered(
    cluster: Cluster, namespace: str, replicas: list[Replica], certs: Path
) -> AsyncIterator[None]:
    """The webhook configuration, in effect for `namespace` until the block ends."""
    name = f"berth-test-{namespace}"
    await cluster.aapply(
        configuration(
            name, namespace, urls=[r.url for r in replicas], ca=(certs / "ca.crt").read_bytes()
        )
    )
    try:
        owner = await probe_owner(cluster, namespace, "probe-api")

        def bound() -> bool:
            created = cluster.kubectl(
                "create",
                AS_REPLICASET_CONTROLLER,
                "-n",
                namespace,
                "-o",
                "json",
                "-f",
                "-",
                input=owned_pod(owner),
            )
            return is_gated(json.loads(created.stdout))

        await cluster.await_(bound, what="the API server to call the webhook")
        yield
    finally:
        await cluster.akubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")


def review(namespace: str, owner: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """The recorded AdmissionReview, for a new pod of `owner` in `namespace`, created (as
    recorded) by the ReplicaSet controller."""
    body = copy.deepcopy(REVIEW)
    request = body["request"]
    request.update(uid=str(uuid.uuid4()), namespace=namespace, dryRun=dry_run)
    metadata = request["object"]["metadata"]
    metadata.pop("managedFields")
    metadata.update(namespace=namespace, ownerReferences=[owner], generateName=f"{owner['name']}-")
    return body


def review_of(pod: dict[str, Any], *, user: str) -> dict[str, Any]:
    """The AdmissionReview the API server would send for creating `pod` as `user`."""
    body = copy.deepcopy(REVIEW)
    request = body["request"]
    request.update(
        uid=str(uuid.uuid4()),
        namespace=pod["metadata"]["namespace"],
        name=pod["metadata"]["name"],
        object=pod,
        userInfo={"username": user, "groups": ["system:authenticated"]},
    )
    return body


class Endpoint(Protocol):
    """A webhook process as these helpers reach it."""

    @property
    def url(self) -> str: ...


async def post(
    session: aiohttp.ClientSession,
    replica: Endpoint,
    body: dict[str, Any],
    tls: ssl.SSLContext | None,
) -> list[dict[str, Any]]:
    """POST a review to a replica; the JSONPatch of its answer ([] when none)."""
    async with session.post(f"{replica.url}/mutate-pod", json=body, ssl=tls or False) as response:
        assert response.status == 200, await response.text()
        answer = (await response.json())["response"]
    assert answer["uid"] == body["request"]["uid"]
    assert answer["allowed"] is True
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(answer.get("patch", "")) or "[]")
    return patch


async def until_fresh(
    cluster: Cluster, namespace: str, replica: Endpoint, tls: ssl.SSLContext | None, tag: str
) -> None:
    """Until the replica's cache holds every Reservation made so far (see the docstring)."""
    owner = await probe_owner(cluster, namespace, tag)
    async with aiohttp.ClientSession() as session:

        async def bound() -> bool:
            return bool(await post(session, replica, review(namespace, owner), tls))

        await cluster.await_(bound, what=f"webhook {replica.url} to see reservation {tag}")


def allocated_name(pod: dict[str, Any]) -> str:
    name: str = json.loads(pod["metadata"]["annotations"][keys.RESERVATION_ALLOCATED])["name"]
    return name
