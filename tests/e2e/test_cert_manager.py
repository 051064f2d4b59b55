"""cert-manager for real: the session's cluster runs cert-manager (`berth dev up
--cert-manager`), built from its Go module. It issues Berth's serving certificate from
manifests/cert-manager, its CA injector fills the webhook's caBundle, and the webhook and
extender serve the certificate from the mounted Secret; a renewal reaches new
connections without a restart while pods keep being admitted."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from berth.api import keys
from devtools.cluster import TLS_SECRET
from tests.e2e.capacity import pod, reserve
from tests.e2e.kube import Cluster
from tests.e2e.migrate import deployment, job_manifest, phase_is, ready_pods
from tests.e2e.scrape import scrape, total
from tests.e2e.webhook_world import AS_REPLICASET_CONTROLLER

pytestmark = pytest.mark.e2e

NAMESPACE = "berth-system"
RENEWAL_TIMEOUT = 180.0


def secret(cluster: Cluster, name: str) -> dict[str, bytes]:
    data = cluster.get("secret", name, "-n", NAMESPACE)["data"]
    return {key: base64.b64decode(value) for key, value in data.items()}


def served(cluster: Cluster, component: str) -> x509.Certificate:
    """The certificate a Berth component presents on a new TLS connection, verified
    against the CA cert-manager issued it from."""
    port = next(c.port for c in cluster.local.running() if c.name == component)
    context = ssl.create_default_context(cafile=cluster.local.serving_ca)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def certificate(cluster: Cluster) -> dict[str, Any]:
    return cluster.get("certificate", TLS_SECRET, "-n", NAMESPACE)


def is_true(obj: dict[str, Any], kind: str) -> bool:
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def test_the_certificate_is_issued_injected_and_served(cluster: Cluster, namespace: str) -> None:
    assert cluster.local.cert_manager, "the session's cluster runs with --cert-manager"
    assert is_true(certificate(cluster), "Ready")
    issued = secret(cluster, TLS_SECRET)
    ca = secret(cluster, "berth-ca")["tls.crt"]  # the CA Certificate's own Secret
    assert issued["ca.crt"] == ca

    # The CA injector, and nothing else, wrote every entry's caBundle.
    webhooks = cluster.get("mutatingwebhookconfiguration", "berth")
    assert webhooks["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{TLS_SECRET}"
    )
    bundles = {base64.b64decode(w["clientConfig"]["caBundle"]) for w in webhooks["webhooks"]}
    assert bundles == {ca}

    leaf = x509.load_pem_x509_certificate(issued["tls.crt"])
    issuer = x509.load_pem_x509_certificate(ca).subject
    for component in ("berth-webhook", "berth-extender"):
        cert = served(cluster, component)
        assert cert.serial_number == leaf.serial_number, component
        assert cert.issuer == issuer, component

    # A reservation-first migration through the webhook serving that certificate.
    cluster.apply(deployment("issued"), namespace)
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "issued", 1), what="the pod")[0]
    name, manifest = job_manifest(old)
    cluster.apply(manifest)
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"),
        what="the migration to end",
        timeout=120,
    )
    assert job["status"]["phase"] == "Succeed", job["status"]
    new = cluster.get("pod", job["status"]["podRef"]["name"], "-n", namespace)
    assert keys.RESERVATION_ALLOCATED in new["metadata"]["annotations"]  # the webhook bound it
    assert new["spec"]["nodeName"] == job["status"]["nodeName"] != old["spec"]["nodeName"]


async def reviews(cluster: Cluster) -> float:
    return total(await scrape(cluster, "berth-webhook"), "berth_webhook_requests_total")


async def test_a_renewal_is_served_while_pods_are_admitted(
    cluster: Cluster, namespace: str
) -> None:
    # A Reservation waiting for its replacement keeps the namespace labelled, so that
    # every pod the ReplicaSet controller creates here is reviewed by the webhook (the
    # default scope; the test creates them as that controller).
    await reserve(
        cluster,
        namespace,
        f"hold-{namespace}"[:60],
        node="node-0",
        cpu="100m",
        scheduler="default-scheduler",
    )
    try:
        await cluster.await_(
            lambda: (cluster.get("namespace", namespace)["metadata"].get("labels") or {}).get(
                keys.MIGRATING_LABEL
            ),
            what="the namespace to be labelled for the webhook",
        )
        before = await asyncio.to_thread(served, cluster, "berth-webhook")
        revision = certificate(cluster)["status"].get("revision", 0)
        reviewed = await reviews(cluster)

        created: list[int] = []  # kubectl's exit status for each pod of the stream
        stop = asyncio.Event()

        async def stream() -> None:
            while not stop.is_set():
                item = pod(f"stream-{len(created)}", cpu="1m")
                result = await cluster.akubectl(
                    "create",
                    AS_REPLICASET_CONTROLLER,
                    "-n",
                    namespace,
                    "-f",
                    "-",
                    input=json.dumps(item),
                    check=False,
                )
                created.append(result.returncode)

        streaming = asyncio.create_task(stream())
        await cluster.await_(lambda: len(created) >= 3, what="the stream to start")
        await asyncio.to_thread(
            cluster.local.renew_certificate,
            TLS_SECRET,
            "Certificate re-issuance manually triggered",
        )

        def renewed(component: str) -> Callable[[], Awaitable[x509.Certificate | None]]:
            async def check() -> x509.Certificate | None:
                cert = await asyncio.to_thread(served, cluster, component)
                return cert if cert.serial_number != before.serial_number else None

            return check

        after = await cluster.await_(
            renewed("berth-webhook"),
            what="the webhook to serve the renewed certificate",
            timeout=RENEWAL_TIMEOUT,
        )
        # The extender watches the same files on its own clock: it reloads within its
        # polling interval of the webhook, not at the same instant.
        extender = await cluster.await_(
            renewed("berth-extender"),
            what="the extender to serve the renewed certificate",
            timeout=RENEWAL_TIMEOUT,
        )
        seen = len(created)
        await cluster.await_(lambda: len(created) >= seen + 3, what="pods after the reload")
        stop.set()
        await streaming

        assert certificate(cluster)["status"]["revision"] > revision
        leaf = x509.load_pem_x509_certificate(secret(cluster, TLS_SECRET)["tls.crt"])
        assert after.serial_number == leaf.serial_number
        assert extender.serial_number == leaf.serial_number
        # Every pod was created, and every creation was reviewed by the webhook.
        assert created
        assert set(created) == {0}, created
        assert await reviews(cluster) - reviewed == len(created)
        samples = await scrape(cluster, "berth-webhook")
        assert total(samples, "berth_serving_certificate_not_after_timestamp_seconds") == (
            leaf.not_valid_after_utc.timestamp()
        )
        log = next(c for c in cluster.local.running() if c.name == "berth-webhook").log
        assert f"serial {leaf.serial_number:x}" in await asyncio.to_thread(Path(log).read_text)
    finally:
        await cluster.akubectl("delete", "reservation", f"hold-{namespace}"[:60], check=False)
