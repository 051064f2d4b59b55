"""The webhook binds replacement pods to Reservations on the real control plane.

Two real `python -m webhook` processes serve over TLS with a certificate from
`berth certs`; the API server calls them through a MutatingWebhookConfiguration scoped to
the test's namespace, configured as in production (failurePolicy Ignore, NoneOnDryRun,
reinvocation IfNeeded). Berth's controller runs in the local cluster: it holds each
Reservation with a placeholder and lifts the gate of the pod that claimed it, so pods are
checked as the API server first stored them, right after admission.

The API server's dry-run probe of test_wire cannot tell when the configuration is in
effect here, since this webhook rightly changes nothing on dry run. Instead a probe pod,
owned by a ReplicaSet of no replicas with a Reservation of its own and created as the
ReplicaSet controller (impersonated), is created until it comes back bound.
The probe Reservation is made after the test's own, and a watch delivers events in order,
so a bound probe also proves the replica's cache holds the test's Reservations.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from berth.api import keys
from berth.protocol import claim_of, is_gated, pod_claim
from tests.e2e.kube import Cluster, pods
from tests.e2e.webhook_world import (
    AS_REPLICASET_CONTROLLER,
    TEST_LABEL,
    Replica,
    allocated_name,
    make_reservations,
    owned_pod,
    pods_as_admitted,
    post,
    registered,
    reservation,
    review,
    until_fresh,
    web_replicaset,
    webhook_replicas,
)

pytestmark = pytest.mark.e2e


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
                    AS_REPLICASET_CONTROLLER,
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
                    AS_REPLICASET_CONTROLLER,
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


async def test_a_pod_asking_more_than_the_reservation_holds_is_not_bound(
    cluster: Cluster, namespace: str, replicas: list[Replica], certs: Path
) -> None:
    """A rollout's pod of a larger template, bound to a place made for the old one, might
    never fit that node, and its affinity there could never be lifted: it is left to the
    scheduler, and the Reservation waits for a pod it holds enough for."""
    owner, deployment_uid = await web_replicaset(cluster, namespace, replicas=0)
    [name] = await make_reservations(
        cluster, namespace, owner=owner, nodes=["node-1"], workload=deployment_uid, cpu="100m"
    )

    async def create(pod: str) -> dict[str, Any]:
        created = await cluster.akubectl(
            "create", AS_REPLICASET_CONTROLLER, "-n", namespace, "-o", "json", "-f", "-", input=pod
        )
        found: dict[str, Any] = json.loads(created.stdout)
        return found

    async with registered(cluster, namespace, replicas, certs):
        larger = await create(owned_pod(owner, name="larger", cpu="150m"))
        assert not is_gated(larger)
        assert pod_claim(larger) is None
        assert "affinity" not in larger["spec"]
        assert claim_of(await reservation(cluster, name)) is None
        logs = "".join(replica.log.read_text() for replica in replicas)
        assert (
            f"pod {namespace}/larger: requests more than reservation {name} holds: "
            "cpu 150m (it holds 100m)"
        ) in logs
        fits = await create(owned_pod(owner, name="fits", cpu="100m"))
        assert is_gated(fits)
        assert allocated_name(fits) == name


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
