"""Helpers for migration tests: workloads, jobs, and what they left behind."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from berth.protocol import is_ready
from tests.e2e.kube import Cluster, pods

PAUSE = "registry.k8s.io/pause:3.10"
CLUSTER_EVENTS = "kube-system"
"""Where Berth writes its Events about jobs and Reservations (cluster-scoped)."""


def _workload(
    kind: str,
    name: str,
    *,
    replicas: int,
    cpu: str,
    controller: dict[str, Any],
    pod: dict[str, Any],
) -> str:
    """A `kind` of `replicas` pause pods labelled app=`name`, asking `cpu`; `controller`
    and `pod` add to its spec and its pods' spec."""
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                **controller,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "containers": [
                            {"name": "app", "image": PAUSE, "resources": {"requests": {"cpu": cpu}}}
                        ],
                        **pod,
                    },
                },
            },
        }
    )


def deployment(
    name: str, *, replicas: int = 1, cpu: str = "200m", spec_extra: dict[str, Any] | None = None
) -> str:
    return _workload(
        "Deployment", name, replicas=replicas, cpu=cpu, controller={}, pod=spec_extra or {}
    )


def statefulset(
    name: str, *, replicas: int = 1, cpu: str = "200m", spec_extra: dict[str, Any] | None = None
) -> str:
    """A StatefulSet of `replicas` pods labelled app=`name`, started in parallel."""
    return _workload(
        "StatefulSet",
        name,
        replicas=replicas,
        cpu=cpu,
        controller={"serviceName": name, "podManagementPolicy": "Parallel"},
        pod={"terminationGracePeriodSeconds": 0, **(spec_extra or {})},
    )


def ready_pods(cluster: Cluster, namespace: str, app: str, count: int) -> list[dict[str, Any]]:
    found = [
        pod
        for pod in pods(cluster, namespace, f"app={app}")
        if is_ready(pod) and not pod["metadata"].get("deletionTimestamp")
    ]
    return found if len(found) == count else []


LONG_TTL = "10m"
"""A TTL no step of a test waits out: a test that wants the TTL to pass says so with
`expire`, once what it waits for before has been seen. A short TTL would be a hidden
timing assertion (a slow machine would expire the job before the state under test)."""


def expire(cluster: Cluster, name: str) -> None:
    """End job `name`'s TTL now: it counts from the job's creation, so a second has passed."""
    cluster.kubectl("patch", "pmj", name, "--type=merge", "-p", '{"spec":{"ttl":"1s"}}')


async def aexpire(cluster: Cluster, name: str) -> None:
    await asyncio.to_thread(expire, cluster, name)


def job_manifest(
    pod: dict[str, Any],
    *,
    name: str | None = None,
    ttl: str | None = "2m",
    mode: str | None = "ReservationFirst",
    **spec: Any,
) -> tuple[str, str]:
    """A job for `pod`; `mode=None` leaves spec.mode unset (the controller's default),
    `ttl=None` spec.ttl (the job never times out)."""
    name = name or f"mig-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "PodMigrationJob",
        "metadata": {"name": name},
        "spec": {
            **({"ttl": ttl} if ttl else {}),
            **({"mode": mode} if mode else {}),
            "podRef": {"namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"]},
            **spec,
        },
    }
    return name, json.dumps(body)


def admit_paused(cluster: Cluster, name: str, manifest: str) -> None:
    """Create job `name` and pause it once arbitration admits it and its Reservation is
    created (a job paused before that creates none until resumed), before its placeholder
    can be placed: every node is cordoned meanwhile, so nothing is evicted before."""
    nodes = [n["metadata"]["name"] for n in cluster.get("nodes")["items"]]
    cluster.kubectl("cordon", *nodes)
    try:
        cluster.apply(manifest)
        cluster.wait(
            lambda: condition(job_of(cluster, name), "ReservationCreated").get("status") == "True",
            what="the job admitted and its Reservation created",
        )
        cluster.kubectl("patch", "pmj", name, "--type=merge", "-p", '{"spec":{"paused":true}}')
    finally:
        cluster.kubectl("uncordon", *nodes)


def job_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.get("pmj", name)


def phase_is(cluster: Cluster, name: str, *phases: str) -> dict[str, Any] | None:
    job = job_of(cluster, name)
    return job if job.get("status", {}).get("phase") in phases else None


def pending_with(cluster: Cluster, name: str, reason: str) -> dict[str, Any] | None:
    """The job, once it is still Pending and its status gives `reason` (why it waits)."""
    job = job_of(cluster, name)
    status = job.get("status", {})
    return (
        job
        if (status.get("phase") or "Pending", status.get("reason")) == ("Pending", reason)
        else None
    )


def condition(job: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in job.get("status", {}).get("conditions") or [] if c["type"] == kind), {})


def events(cluster: Cluster, name: str) -> list[str]:
    """The reasons of the job's events, in the order they happened: all in kube-system,
    none in `default`, which many may read."""
    about = f"--field-selector=involvedObject.name={name},involvedObject.kind=PodMigrationJob"
    assert cluster.get("events", "-n", "default", about)["items"] == []
    items = cluster.get("events", "-n", CLUSTER_EVENTS, about)["items"]
    items.sort(key=lambda e: e.get("eventTime") or e.get("lastTimestamp") or "")
    return [e["reason"] for e in items]


def leftovers(cluster: Cluster, namespace: str) -> dict[str, list[str]]:
    """Placeholders and gated pods still in the namespace: both must be empty at the end."""
    result: dict[str, list[str]] = {"placeholders": [], "gated": []}
    for pod in pods(cluster, namespace):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        if "berth.sh/reservation" in (pod["metadata"].get("labels") or {}):
            result["placeholders"].append(pod["metadata"]["name"])
        gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
        if "berth.sh/reservation" in gates:
            result["gated"].append(pod["metadata"]["name"])
    return result
