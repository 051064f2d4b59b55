"""kube-scheduler calls an HTTP extender, and kube-apiserver calls a TLS mutating webhook.

Both peers are tiny aiohttp apps inside the test; what the real components send them
is recorded under tests/data/ (when missing, or with BERTH_RECORD_WIRE=1) so the
extender's and webhook's unit tests work from the real wire format.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from berth.protocol import CONTROLLER_IDENTITIES
from devtools.processes import free_port
from tests.e2e.kube import Cluster

pytestmark = pytest.mark.e2e

DATA = Path(__file__).resolve().parents[1] / "data"
REJECT_LABEL = "extender-test/reject"
REJECT_REASON = "rejected by the test extender"


def record(name: str, body: dict[str, Any]) -> None:
    path = DATA / name
    if os.environ.get("BERTH_RECORD_WIRE") == "1" or not path.exists():
        path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


@asynccontextmanager
async def serve(
    app: web.Application, port: int, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[None]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
    try:
        yield
    finally:
        await runner.cleanup()


def extender_app(seen: dict[str, list[dict[str, Any]]]) -> web.Application:
    async def filter_(request: web.Request) -> web.Response:
        args = await request.json()
        seen["filter"].append(args)
        names = args["NodeNames"] or []
        labels = args["Pod"]["metadata"].get("labels") or {}
        result: dict[str, Any]
        if labels.get(REJECT_LABEL) == "true":
            result = {
                "NodeNames": [],
                "FailedNodes": {n: REJECT_REASON for n in names},
                "FailedAndUnresolvableNodes": None,
                "Error": "",
            }
        else:
            result = {
                "NodeNames": names,
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": None,
                "Error": "",
            }
        return web.json_response(result)

    async def prioritize(request: web.Request) -> web.Response:
        args = await request.json()
        seen["prioritize"].append(args)
        return web.json_response([{"Host": n, "Score": 1} for n in args["NodeNames"] or []])

    app = web.Application()
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    return app


def pod_manifest(name: str, *, scheduler: str, labels: dict[str, str]) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "schedulerName": scheduler,
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
    )


async def test_scheduler_calls_extender_filter(cluster: Cluster, namespace: str) -> None:
    port = free_port()
    seen: dict[str, list[dict[str, Any]]] = {"filter": [], "prioritize": []}
    scheduler_name = f"extender-test-{uuid.uuid4().hex[:5]}"
    extender = {
        "urlPrefix": f"http://127.0.0.1:{port}",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": 1,
        "nodeCacheCapable": True,
        "ignorable": False,
        "httpTimeout": "5s",
    }
    async with serve(extender_app(seen), port):
        scheduler = await asyncio.to_thread(
            cluster.local.start_scheduler,
            name=scheduler_name,
            scheduler_name=scheduler_name,
            extenders=[extender],
        )
        try:
            await cluster.aapply(
                pod_manifest("accepted", scheduler=scheduler_name, labels={}), namespace
            )
            await cluster.aapply(
                pod_manifest("rejected", scheduler=scheduler_name, labels={REJECT_LABEL: "true"}),
                namespace,
            )
            await cluster.await_(
                lambda: cluster.get("pod", "accepted", "-n", namespace)["spec"].get("nodeName"),
                what="the accepted pod to be scheduled",
            )

            def rejection_event() -> list[dict[str, Any]]:
                events = cluster.get(
                    "events", "-n", namespace, "--field-selector=involvedObject.name=rejected"
                )["items"]
                return [
                    e
                    for e in events
                    if e["reason"] == "FailedScheduling" and REJECT_REASON in e["message"]
                ]

            await cluster.await_(rejection_event, what="a FailedScheduling event for the pod")
            rejected = await cluster.aget("pod", "rejected", "-n", namespace)
            assert "nodeName" not in rejected["spec"]
        finally:
            await asyncio.to_thread(cluster.local.stop, scheduler)

    sample = next(args for args in seen["filter"] if args["Pod"]["metadata"]["name"] == "accepted")
    # nodeCacheCapable: node names only, no full Node objects, and Go's exact field names.
    assert set(sample) == {"Pod", "Nodes", "NodeNames"}
    assert sample["Nodes"] is None
    assert sorted(sample["NodeNames"]) == ["node-0", "node-1", "node-2"]
    assert sample["Pod"]["spec"]["schedulerName"] == scheduler_name
    record("extender_filter_args.json", sample)
    assert seen["prioritize"], "the scheduler never called prioritize"
    record("extender_prioritize_args.json", seen["prioritize"][0])


async def test_apiserver_calls_tls_webhook_on_pod_create(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    certs = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cli.berth", "certs", f"--out={tmp_path}", "--ip=127.0.0.1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tls.crt" in certs.stdout
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    reviews: list[dict[str, Any]] = []

    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        reviews.append(review)
        patch = [
            {
                "op": "add",
                "path": "/metadata/annotations",
                "value": {"berth.sh/webhook-test": "seen"},
            }
        ]
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        )

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    port = free_port()
    name = f"webhook-test-{namespace}"
    configuration = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "pods.webhook-test.berth.sh",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/mutate",
                    "caBundle": base64.b64encode((tmp_path / "ca.crt").read_bytes()).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            }
        ],
    }
    async with serve(app, port, context):
        await cluster.aapply(json.dumps(configuration))
        try:
            probe = pod_manifest("probe", scheduler="default-scheduler", labels={})

            def mutated_on_dry_run() -> bool:
                result = cluster.kubectl(
                    "create",
                    "-n",
                    namespace,
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                    input=probe,
                    check=False,
                )
                return result.returncode == 0 and "berth.sh/webhook-test" in result.stdout

            # The API server picks the configuration up asynchronously.
            await cluster.await_(mutated_on_dry_run, what="the webhook to be in effect")
            # A replacement-like pod: made by a ReplicaSet, with generateName and an owner.
            await cluster.aapply(
                json.dumps(
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "metadata": {"name": "web"},
                        "spec": {
                            "replicas": 1,
                            "selector": {"matchLabels": {"app": "web"}},
                            "template": {
                                "metadata": {"labels": {"app": "web"}},
                                "spec": {
                                    "containers": [
                                        {"name": "app", "image": "registry.k8s.io/pause:3.10"}
                                    ]
                                },
                            },
                        },
                    }
                ),
                namespace,
            )

            async def created() -> list[dict[str, Any]]:
                items = (await cluster.aget("pods", "-n", namespace, "-l", "app=web"))["items"]
                return [pod for pod in items if pod["metadata"].get("annotations")]

            pod = (await cluster.await_(created, what="the Deployment's pod"))[0]
            assert pod["metadata"]["annotations"]["berth.sh/webhook-test"] == "seen"
        finally:
            await cluster.akubectl("delete", "mutatingwebhookconfiguration", name, check=False)

    review = next(r for r in reviews if not r["request"].get("dryRun"))
    request = review["request"]
    owner = request["object"]["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "ReplicaSet"
    assert owner["controller"] is True
    # Who created the pod, as the API server authenticated it: the ReplicaSet controller's
    # own identity (kube-controller-manager --use-service-account-credentials), which the
    # webhook requires of a replacement (berth.protocol.created_by_controller).
    assert request["userInfo"]["username"] == CONTROLLER_IDENTITIES[("apps/v1", "ReplicaSet")]
    assert request["object"]["metadata"]["generateName"].startswith("web-")
    assert review["apiVersion"] == "admission.k8s.io/v1"
    assert request["operation"] == "CREATE"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["namespace"] == namespace
    # On CREATE a generated pod has no name yet, and no pod has a UID.
    assert "uid" not in request["object"]["metadata"]
    assert not request["object"]["metadata"].get("name")
    assert not request.get("name")
    record("admission_review_pod_create.json", review)
