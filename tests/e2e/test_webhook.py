"""The webhook binds replacement pods to Reservations on the real control plane.

Two real `python -m webhook` processes serve over TLS with a certificate from
`berth certs`; the API server calls them through a MutatingWebhookConfiguration scoped to
the test's namespace, configured as in production (failurePolicy Ignore, NoneOnDryRun,
reinvocation IfNeeded). Berth's controller runs in the local cluster: it holds each
Reservation with a placeholder and lifts the gate of the pod that claimed it, so pods are
checked as the API server first stored them, right after admission.

The API server's dry-run probe of test_wire cannot tell when the configuration is in
effect here, since this webhook rightly changes nothing on dry run. Instead a probe pod,
owned by a ConfigMap with a Reservation of its own, is created until it comes back bound.
The probe Reservation is made after the test's own, and a watch delivers events in order,
so a bound probe also proves the replica's cache holds the test's Reservations.
"""

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
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import pytest

from berth.api import keys
from berth.kube.client import PODS, Kube
from berth.kube.informer import Informer
from berth.protocol import claim_of, is_gated, node_of, phase, pod_claim
from devtools.processes import free_port
from tests.e2e.kube import Cluster, pods

pytestmark = pytest.mark.e2e

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


@pytest.fixture(scope="module", autouse=True)
def without_session_webhook(cluster: Cluster) -> Iterator[None]:
    """These tests run webhook replicas of their own; the session's webhook would bind
    their pods too and blur what each replica did, so it pauses for this module."""
    session = next(c for c in cluster.local.components if c.name == "berth-webhook")
    cluster.local.stop(session)
    yield
    cluster.local.start_webhook(name="berth-webhook")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("webhook-certs")
    subprocess.run(
        [sys.executable, "-m", "cli.berth", "certs", f"--out={out}", "--ip=127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="module")
def tls(certs: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certs / "ca.crt")


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


@pytest.fixture(scope="module")
async def replicas(
    cluster: Cluster, certs: Path, tls: ssl.SSLContext
) -> AsyncIterator[list[Replica]]:
    async with webhook_replicas(cluster, certs, tls, count=2) as started:
        yield started


@pytest.fixture(autouse=True)
def delete_reservations(cluster: Cluster, namespace: str) -> Iterator[None]:
    """Reservations are cluster-scoped: they outlive the test's namespace unless deleted."""
    yield
    cluster.kubectl(
        "delete", "reservations", "-l", f"{TEST_LABEL}={namespace}", "--wait=false", check=False
    )


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
) -> list[str]:
    """Consumable Reservations for the pods of `owner`, one on each of `nodes`, made as a
    migration makes them: created, held on their node by the controller's placeholder
    (the template pins it there), then opened to claims."""
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
                                "containers": [{"name": "app", "image": PAUSE}],
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


async def probe_owner(cluster: Cluster, namespace: str, tag: str) -> dict[str, Any]:
    """A ConfigMap that controls probe pods, and a Reservation for them."""
    configmap = json.loads(
        (await cluster.akubectl("create", "configmap", tag, "-n", namespace, "-o", "json")).stdout
    )
    owner = reference(configmap)
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


def owned_pod(owner: dict[str, Any], *, name: str | None = None) -> str:
    metadata: dict[str, Any] = {"ownerReferences": [owner]}
    metadata.update({"name": name} if name else {"generateName": "probe-"})
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"containers": [{"name": "app", "image": PAUSE}]},
        }
    )


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
                "create", "-n", namespace, "-o", "json", "-f", "-", input=owned_pod(owner)
            )
            return is_gated(json.loads(created.stdout))

        await cluster.await_(bound, what="the API server to call the webhook")
        yield
    finally:
        await cluster.akubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")


def review(namespace: str, owner: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """The recorded AdmissionReview, for a new pod of `owner` in `namespace`."""
    body = copy.deepcopy(REVIEW)
    request = body["request"]
    request.update(uid=str(uuid.uuid4()), namespace=namespace, dryRun=dry_run)
    metadata = request["object"]["metadata"]
    metadata.pop("managedFields")
    metadata.update(namespace=namespace, ownerReferences=[owner], generateName=f"{owner['name']}-")
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


# ----- the tests ----------------------------------------------------------------------------


async def test_replacement_pod_is_bound_to_its_reservation(
    cluster: Cluster, namespace: str, replicas: list[Replica], certs: Path
) -> None:
    owner, deployment_uid = await web_replicaset(cluster, namespace, replicas=1)
    await cluster.await_(lambda: pods(cluster, namespace, "app=web"), what="the first pod")
    [name] = await make_reservations(
        cluster, namespace, owner=owner, nodes=["node-1"], workload=deployment_uid
    )
    async with (
        pods_as_admitted(cluster, namespace, "app=web") as admitted,
        registered(cluster, namespace, replicas, certs),
    ):
        await cluster.akubectl("scale", "deployment", "web", "-n", namespace, "--replicas=2")

        async def bound() -> list[dict[str, Any]]:
            return [pod for pod in admitted.values() if pod_claim(pod)]

        [new] = await cluster.await_(bound, what="the new pod to be bound")

    assert new["spec"]["schedulingGates"] == [{"name": keys.RESERVATION_GATE}]
    assert new["spec"]["affinity"] == {
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
    claimed = await reservation(cluster, name)
    assert json.loads(new["metadata"]["annotations"][keys.RESERVATION_ALLOCATED]) == {
        "name": name,
        "uid": claimed["metadata"]["uid"],
    }
    # One claim, though the pod passed both replicas: the second saw the first's.
    assert claim_of(claimed) == pod_claim(new)


async def test_pods_created_together_get_different_reservations(
    cluster: Cluster, namespace: str, replicas: list[Replica], certs: Path
) -> None:
    owner, deployment_uid = await web_replicaset(cluster, namespace, replicas=0)
    names = await make_reservations(
        cluster,
        namespace,
        owner=owner,
        workload=deployment_uid,
        nodes=["node-0", "node-1", "node-2"],
    )
    async with (
        pods_as_admitted(cluster, namespace, "app=web") as admitted,
        registered(cluster, namespace, replicas, certs),
    ):
        # The ReplicaSet controller creates the 2nd and 3rd pods in one concurrent batch.
        await cluster.akubectl("scale", "deployment", "web", "-n", namespace, "--replicas=3")

        async def all_created() -> list[dict[str, Any]]:
            return list(admitted.values()) if len(admitted) == 3 else []

        created = await cluster.await_(all_created, what="three pods")

    assert all(is_gated(pod) for pod in created)
    assert sorted(allocated_name(pod) for pod in created) == sorted(names)
    for pod in created:
        assert claim_of(await reservation(cluster, allocated_name(pod))) == pod_claim(pod)


async def test_replicas_racing_for_reservations_never_share_one(
    cluster: Cluster, namespace: str, replicas: list[Replica], tls: ssl.SSLContext
) -> None:
    """Both replicas get claim requests at the same instant, all made from caches that show
    the same Reservations unclaimed: only the resourceVersion precondition keeps two pods
    from taking the same one."""
    owner, deployment_uid = await web_replicaset(cluster, namespace, replicas=0)
    names = await make_reservations(
        cluster,
        namespace,
        owner=owner,
        workload=deployment_uid,
        nodes=["node-0", "node-1", "node-2"] * 2,
    )
    for index, replica in enumerate(replicas):
        await until_fresh(cluster, namespace, replica, tls, f"probe-{index}")

    async with aiohttp.ClientSession() as session:
        patches = await asyncio.gather(
            *(
                post(session, replicas[i % 2], review(namespace, owner), tls)
                for i in range(len(names))
            )
        )

    bindings: dict[str, str] = {}
    for patch in patches:
        annotations = next(op["value"] for op in patch if op["path"] == "/metadata/annotations")
        bindings[json.loads(annotations[keys.RESERVATION_ALLOCATED])["name"]] = annotations[
            keys.CLAIM
        ]
    assert sorted(bindings) == sorted(names), "a reservation went to two pods"
    for name, token in bindings.items():
        assert claim_of(await reservation(cluster, name)) == token
    logs = "".join(replica.log.read_text() for replica in replicas)
    assert "changed while claiming it" in logs, "no claim ever lost a race"


async def test_dry_run_claims_nothing(
    cluster: Cluster, namespace: str, replicas: list[Replica], certs: Path
) -> None:
    owner, deployment_uid = await web_replicaset(cluster, namespace, replicas=0)
    [name] = await make_reservations(
        cluster, namespace, owner=owner, nodes=["node-1"], workload=deployment_uid
    )
    async with registered(cluster, namespace, replicas, certs):
        dry = json.loads(
            (
                await cluster.akubectl(
                    "create",
                    "-n",
                    namespace,
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                    input=owned_pod(owner, name="dry"),
                )
            ).stdout
        )
        assert not is_gated(dry)
        assert pod_claim(dry) is None
        assert claim_of(await reservation(cluster, name)) is None
        assert f"pod {namespace}/dry: dry run" in replicas[0].log.read_text()
        # The same pod, created for real, is bound.
        real = json.loads(
            (
                await cluster.akubectl(
                    "create",
                    "-n",
                    namespace,
                    "-o",
                    "json",
                    "-f",
                    "-",
                    input=owned_pod(owner, name="real"),
                )
            ).stdout
        )
        assert is_gated(real)
        assert allocated_name(real) == name


async def test_pod_creation_goes_on_while_the_webhook_is_down(
    cluster: Cluster, namespace: str, certs: Path, tls: ssl.SSLContext
) -> None:
    owner, deployment_uid = await web_replicaset(cluster, namespace, replicas=0)
    [name] = await make_reservations(
        cluster, namespace, owner=owner, nodes=["node-1"], workload=deployment_uid
    )
    async with (
        webhook_replicas(cluster, certs, tls, count=1) as (replica,),
        registered(cluster, namespace, [replica], certs),
    ):
        assert replica.stop() == 0, replica.log.read_text()
        await cluster.akubectl("scale", "deployment", "web", "-n", namespace, "--replicas=1")
        [created] = await cluster.await_(
            lambda: pods(cluster, namespace, "app=web"), what="the pod, created without the webhook"
        )

    assert not is_gated(created)
    assert pod_claim(created) is None
    assert claim_of(await reservation(cluster, name)) is None
