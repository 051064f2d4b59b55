"""Exploration: a namespace at its ResourceQuota's pod limit."""

from __future__ import annotations

import json

import pytest

from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import deployment, job_manifest, phase_is, ready_pods

pytestmark = pytest.mark.e2e


def test_quota_at_its_limit(cluster: Cluster, namespace: str) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "pods"},
        "spec": {"hard": {"pods": "2"}},
    }
    cluster.apply(json.dumps(quota), namespace)
    cluster.apply(deployment("q", replicas=2), namespace)
    olds = cluster.wait(lambda: ready_pods(cluster, namespace, "q", 2), what="pods")
    name, manifest = job_manifest(olds[0], ttl="3m")
    cluster.apply(manifest)
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end", timeout=200
    )
    print(json.dumps(job["status"], indent=1))
    print(
        [
            (p["metadata"]["name"], p["spec"].get("nodeName"))
            for p in pods(cluster, namespace, "app=q")
        ]
    )
    print(cluster.kubectl("get", "events", "-n", namespace).stdout[-4000:])
    assert job["status"]["phase"] == "Succeed", job["status"]
