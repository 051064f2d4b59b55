"""The session's webhook and extender count the requests a new pod makes, on `/metrics`.

Both serve it over HTTPS with the certificate the cluster's CA signed, on the port they
serve the API server and kube-scheduler from, so a scrape here is the one Prometheus
makes. A Deployment's pod passes the webhook on creation and the extender on scheduling.
"""

from __future__ import annotations

import ssl

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import deployment, job_manifest, phase_is, ready_pods

pytestmark = pytest.mark.e2e


async def scrape(cluster: Cluster, component: str) -> list[Sample]:
    port = next(c.port for c in cluster.local.components if c.name == component)
    context = ssl.create_default_context(cafile=cluster.local.pki / "ca.crt")
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://127.0.0.1:{port}/metrics", ssl=context) as response,
    ):
        assert response.status == 200
        assert response.content_type == "text/plain"
        text = await response.text()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of the samples `name` that carry `labels` (and any others)."""
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


MOVED = [
    ("berth-webhook", "berth_webhook_requests_total", {"result": "skipped"}),
    ("berth-webhook", "berth_webhook_request_duration_seconds_count", {}),
    ("berth-extender", "berth_extender_requests_total", {"verb": "filter", "result": "ok"}),
    ("berth-extender", "berth_extender_request_duration_seconds_count", {"verb": "filter"}),
]
"""What a pod with no Reservation moves, by component: the webhook lets it through
untouched, the extender passes it a node."""


async def test_webhook_and_extender_count_the_requests_of_a_new_pod(
    cluster: Cluster, namespace: str
) -> None:
    components = {component for component, _, _ in MOVED}
    before = {component: await scrape(cluster, component) for component in components}
    await cluster.aapply(deployment("web"), namespace)
    await cluster.await_(
        lambda: any(pod["spec"].get("nodeName") for pod in pods(cluster, namespace, "app=web")),
        what="the pod of Deployment web to be scheduled",
    )
    after = {component: await scrape(cluster, component) for component in components}
    for component, name, labels in MOVED:
        assert total(after[component], name, **labels) > total(before[component], name, **labels), (
            f"{component}: {name}{labels}"
        )


async def scrape_controller(cluster: Cluster) -> list[Sample]:
    """The leader's metrics: HTTPS beside /healthz (the controller serves no API)."""
    return await scrape(cluster, "berth-controller")


async def test_a_migration_moves_the_controllers_counters(cluster: Cluster, namespace: str) -> None:
    await cluster.aapply(deployment("web"), namespace)
    pod = (await cluster.await_(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod"))[
        0
    ]
    before = await scrape_controller(cluster)
    name, manifest = job_manifest(pod)
    await cluster.aapply(manifest)
    await cluster.await_(lambda: phase_is(cluster, name, "Succeed"), what="the migration")
    after = await scrape_controller(cluster)
    for metric, labels in [
        ("berth_evictions_total", {"policy": "Eviction", "result": "evicted"}),
        ("berth_jobs_finished_total", {"phase": "Succeed"}),
        ("berth_job_phase_duration_seconds_count", {"phase": "Running"}),
        ("berth_job_phase_duration_seconds_count", {"phase": "Pending"}),
    ]:
        assert total(after, metric, **labels) > total(before, metric, **labels), metric
    assert any(s.name == "berth_workqueue_depth" for s in after)
    assert any(s.name == "berth_reservations" for s in after)
