"""Prometheus metrics of the session's processes, as a scrape reads them."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.e2e.kube import Cluster


def parse(text: str) -> list[Sample]:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


async def scrape(cluster: Cluster, component: str) -> list[Sample]:
    """A Berth component's `/metrics`, over HTTPS, verified with the CA of its serving
    certificate (cert-manager's Berth CA in the session's cluster)."""
    port = next(c.port for c in cluster.local.components if c.name == component)
    context = ssl.create_default_context(cafile=cluster.local.serving_ca)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://127.0.0.1:{port}/metrics", ssl=context) as response,
    ):
        assert response.status == 200
        assert response.content_type == "text/plain"
        return parse(await response.text())


async def scrape_scheduler(cluster: Cluster) -> list[Sample]:
    """kube-scheduler's `/metrics`: its serving certificate is the self-signed one it made
    in its --cert-dir; it authorizes the admin's client certificate."""
    component = next(c for c in cluster.local.components if c.name == "kube-scheduler")
    pki = cluster.local.pki
    context = ssl.create_default_context(cafile=pki / "kube-scheduler" / "kube-scheduler.crt")
    context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://127.0.0.1:{component.port}/metrics", ssl=context) as response,
    ):
        assert response.status == 200, await response.text()
        return parse(await response.text())


async def scrape_apiserver(cluster: Cluster) -> list[Sample]:
    result = await asyncio.to_thread(cluster.kubectl, "get", "--raw", "/metrics")
    return parse(result.stdout)


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of the samples `name` that carry `labels` (and any others)."""
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())
