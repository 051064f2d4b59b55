"""Workloads with PodDisruptionBudgets, their jobs, and waits on the recorder's view."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from berth.api import keys
from tests.e2e.faults.invariants import (
    TERMINAL,
    available,
    condition,
    gated,
    is_placeholder,
    phase,
)
from tests.e2e.faults.recorder import Recorder
from tests.e2e.kube import Cluster, WaitTimeout
from tests.e2e.migrate import PAUSE, job_manifest

Object = dict[str, Any]


def workload(
    kind: str, name: str, *, replicas: int, cpu: str = "100m", node: str | None = None
) -> Object:
    """A Deployment or StatefulSet of pause pods labelled app=<name>."""
    pod_spec: Object = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "app", "image": PAUSE, "resources": {"requests": {"cpu": cpu}}}],
    }
    if node:
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    spec: Object = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
    }
    if kind == "StatefulSet":
        spec.update(serviceName=name, podManagementPolicy="Parallel")
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def pdb(name: str, min_available: int) -> Object:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": name}}},
    }


def apply_all(cluster: Cluster, objects: list[Object], namespace: str | None = None) -> None:
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}), namespace)


def ready(recorder: Recorder, namespace: str, app: str) -> list[Object]:
    return [
        pod
        for pod in recorder.objects("pods")
        if pod["metadata"].get("namespace") == namespace
        and (pod["metadata"].get("labels") or {}).get("app") == app
        and available(pod)
    ]


def job(pod: Object, *, ttl: str, **spec: Any) -> tuple[str, Object]:
    name, manifest = job_manifest(pod, ttl=ttl, **spec)
    return name, json.loads(manifest)


def job_state(recorder: Recorder, name: str) -> Object | None:
    return recorder.state["podmigrationjobs"].get(name)


def terminal(recorder: Recorder, name: str) -> bool:
    state = job_state(recorder, name)
    return state is not None and phase(state) in TERMINAL


def reservation_of(recorder: Recorder, name: str) -> Object | None:
    state = job_state(recorder, name)
    if state is None:
        return None
    return recorder.state["reservations"].get(state["metadata"]["uid"])


def reached(recorder: Recorder, name: str, step: Callable[[Object], bool]) -> bool:
    """Whether any version of the job seen so far shows `step` (however briefly)."""
    return any(step(seen.obj) for seen in recorder.seen("podmigrationjobs", name))


def in_handover(recorder: Recorder, name: str) -> bool:
    """Whether the job's Reservation has been seen with an owner recorded."""
    job = job_state(recorder, name)
    if job is None:
        return False
    versions = recorder.seen("reservations", job["metadata"]["uid"])
    return any((seen.obj.get("status") or {}).get("currentOwners") for seen in versions)


def eviction_reason(job: Object) -> str | None:
    reason = condition(job, "Eviction").get("reason")
    return str(reason) if reason else None


STEPS: dict[str, Callable[[Recorder, str], bool]] = {
    "admitted": lambda r, n: reached(r, n, lambda j: phase(j) == "Running"),
    "reservation created": lambda r, n: reached(
        r, n, lambda j: bool(condition(j, "ReservationCreated"))
    ),
    "reservation available": lambda r, n: reached(
        r, n, lambda j: condition(j, "ReservationScheduled").get("status") == "True"
    ),
    "evicting": lambda r, n: reached(r, n, lambda j: eviction_reason(j) is not None),
    "blocked by PDB": lambda r, n: reached(r, n, lambda j: eviction_reason(j) == "BlockedByPDB"),
    "handover": in_handover,
    "ended": terminal,
}
"""How the recorder shows that a job reached each step."""


async def until(
    predicate: Callable[[], Any], *, what: str, timeout: float, interval: float = 0.05
) -> Any:
    """Wait on the recorder's state (no API call): checked every `interval` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


def released(recorder: Recorder, namespace: str, jobs: Iterable[str]) -> bool:
    """Whether the jobs hold nothing any more: no placeholder or gated pod in the
    namespace, no Reservation of theirs Pending or Available. A job's status is written
    before the passes that release what it held (and a Reservation turns Succeeded in its
    own pass), so the end of a job is not yet the end of its Reservation."""
    names = set(jobs)
    pods = [p for p in recorder.objects("pods") if p["metadata"].get("namespace") == namespace]
    live = [
        r
        for r in recorder.objects("reservations")
        if phase(r) in ("Pending", "Available")
        and (r["metadata"].get("annotations") or {}).get(keys.JOB) in names
    ]
    return not live and not any(gated(p) or is_placeholder(p) for p in pods)
