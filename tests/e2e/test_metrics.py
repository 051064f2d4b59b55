"""The session's webhook and extender count the requests of a migration, on `/metrics`.

Both serve it over HTTPS with the certificate the cluster's CA signed, on the port they
serve the API server and kube-scheduler from, so a scrape here is the one Prometheus
makes. A migration's replacement passes the webhook on creation, and it and the
placeholder pass the extender on scheduling (in the default scope, only they do: see
test_scope.py).
"""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client.samples import Sample

from devtools.render import Scope
from tests.e2e.kube import Cluster
from tests.e2e.migrate import deployment, job_manifest, phase_is, ready_pods
from tests.e2e.scrape import scrape, total

pytestmark = pytest.mark.e2e


MOVED = [
    ("berth-webhook", "berth_webhook_requests_total", {"result": "claimed"}),
    ("berth-webhook", "berth_webhook_request_duration_seconds_count", {}),
    ("berth-extender", "berth_extender_requests_total", {"verb": "filter", "result": "ok"}),
    ("berth-extender", "berth_extender_request_duration_seconds_count", {"verb": "filter"}),
]
"""What a migration moves, by component: the webhook binds the replacement, the extender
filters nodes for the placeholder and the replacement."""

MOVED_IN_STRICT_SCOPE = [
    ("berth-webhook", "berth_webhook_requests_total", {"result": "skipped"}),
]
"""In the strict scope, the first pod (no Reservation) also passes the webhook."""


async def test_webhook_and_extender_count_the_requests_of_a_migration(
    cluster: Cluster, namespace: str, scope: Scope
) -> None:
    moved = MOVED + (MOVED_IN_STRICT_SCOPE if scope == Scope.STRICT else [])
    components = {component for component, _, _ in moved}
    before = {component: await scrape(cluster, component) for component in components}
    await cluster.aapply(deployment("web"), namespace)
    pod = (await cluster.await_(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod"))[
        0
    ]
    name, manifest = job_manifest(pod)
    await cluster.aapply(manifest)
    await cluster.await_(lambda: phase_is(cluster, name, "Succeed"), what="the migration")
    after = {component: await scrape(cluster, component) for component in components}
    for component, metric, labels in moved:
        assert total(after[component], metric, **labels) > total(
            before[component], metric, **labels
        ), f"{component}: {metric}{labels}"


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
    depth = [s.value for s in after if s.name == "berth_workqueue_depth"]
    assert len(depth) == 1
    assert depth[0] >= 0
    assert depth[0] == int(depth[0])

    async def reservations_as_the_api_server_has_them() -> bool:
        """`berth_reservations` by phase is what the API server holds (both read anew:
        the migration's Reservation may still be changing)."""
        held = Counter(
            (r.get("status") or {}).get("phase") or "Pending"
            for r in (await cluster.aget("reservations"))["items"]
        )
        gauge = {
            s.labels["phase"]: s.value
            for s in await scrape_controller(cluster)
            if s.name == "berth_reservations"
        }
        phases = ("Pending", "Available", "Succeeded", "Failed")
        return set(gauge) == set(phases) and all(gauge[p] == held[p] for p in phases)

    await cluster.await_(
        reservations_as_the_api_server_has_them,
        what="berth_reservations to count the API server's Reservations by phase",
    )
