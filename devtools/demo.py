"""The demo: defragment a cluster with reservation-first migrations.

Three nodes of 4 CPU each run six 1-CPU pods, two per node: half the cluster is free,
yet a 3-CPU pod fits nowhere. Two migrations, each pinned to a chosen node (`--to`),
empty one node without ever leaving a pod without a place; the large pod then runs.
Then `kubectl drain` empties another node: the drain only knows the Eviction API, yet
each pod it evicts moves reservation-first, through a job Berth's webhook creates.
Everything happens on the local control plane through the real API.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from berth import protocol
from berth.api import keys
from berth.kube.client import DEPLOYMENTS, NAMESPACES, NODES, PODMIGRATIONJOBS, PODS, Kube
from berth.resources import parse_quantity, pod_requests
from cli.migrate import follow, job_for, rows, table
from devtools.binaries import ensure_binaries

NAMESPACE = "default"
APPS = {"alpha": "node-0", "beta": "node-1", "gamma": "node-2"}
BIG_CPU = "3"
PAUSE = "registry.k8s.io/pause:3.10"


def deployment(name: str, *, replicas: int, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {"name": name, "image": PAUSE, "resources": {"requests": {"cpu": cpu}}}
                    ]
                },
            },
        },
    }


async def wait(predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}")


async def app_pods(kube: Kube, app: str) -> list[dict[str, Any]]:
    listed = await kube.list(PODS, namespace=NAMESPACE, label_selector=f"app={app}")
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


async def usage(kube: Kube) -> str:
    """CPU requested on each node, as a bar, and the pods there."""
    nodes = (await kube.list(NODES))["items"]
    pods = [
        p
        for p in (await kube.list(PODS))["items"]
        if p["spec"].get("nodeName") and not protocol.is_terminal_pod(p)
    ]
    lines = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        allocatable = parse_quantity(node["status"]["allocatable"]["cpu"])
        here = [p for p in pods if p["spec"]["nodeName"] == name]
        used = sum((pod_requests(p["spec"]).get("cpu", Decimal(0)) for p in here), Decimal(0))
        bar = "#" * int(used) + "." * int(allocatable - used)
        apps = ", ".join(
            sorted(
                (p["metadata"].get("labels") or {}).get("app", "") or p["metadata"]["name"]
                for p in here
            )
        )
        lines.append(f"  {name}  [{bar}]  {used}/{allocatable} CPU  {apps}")
    return "\n".join(lines)


async def set_cordon(kube: Kube, nodes: list[str], *, cordoned: bool) -> None:
    for name in nodes:
        await kube.patch(NODES, name, {"spec": {"unschedulable": cordoned or None}})


async def run(kubeconfig: Path | None) -> int:
    kube = await Kube.connect(kubeconfig)
    try:
        return await _demo(kube, kubeconfig)
    finally:
        await kube.close()


async def _demo(kube: Kube, kubeconfig: Path | None) -> int:
    say = print
    say("== 1. A fragmented cluster: two 1-CPU pods on each 4-CPU node ==")
    for app, node in APPS.items():
        others = [n for n in APPS.values() if n != node]
        await set_cordon(kube, others, cordoned=True)  # steer the app onto its node
        await kube.create(DEPLOYMENTS, deployment(app, replicas=2, cpu="1"), namespace=NAMESPACE)
        await wait(functools.partial(_ready, kube, app, 2), f"{app} to run")
        await set_cordon(kube, others, cordoned=False)
    say(await usage(kube))
    say(f"\n== 2. A {BIG_CPU}-CPU pod: 6 CPU are free, but no node has {BIG_CPU} ==")
    await kube.create(DEPLOYMENTS, deployment("big", replicas=1, cpu=BIG_CPU), namespace=NAMESPACE)
    pending = await wait(lambda: _unschedulable(kube, "big"), "the scheduler to refuse it")
    say(f"  big is Pending: {_message(pending)}")
    say("\n== 3. Defragment: move gamma's pods onto node-0 and node-1, reservation first ==")
    names = []
    for pod, target in zip(await app_pods(kube, "gamma"), ("node-0", "node-1"), strict=True):
        job = job_for(pod, to=target, mode="ReservationFirst", ttl="2m", paused=False)
        await kube.create(PODMIGRATIONJOBS, job)
        names.append(job["metadata"]["name"])
        say(f"  podmigrationjob/{job['metadata']['name']}: {pod['metadata']['name']} -> {target}")
    say("")
    ok = await follow(kube, names, out=sys.stdout)
    if not ok:
        say("a migration failed: see `kubectl describe pmj`")
        return 1
    big = await wait(lambda: _ready(kube, "big", 1), "the large pod to run")
    say("\n== 4. After: node-2 is free, and the large pod runs there ==")
    say(await usage(kube))
    say(f"  big: Running on {big[0]['spec']['nodeName']}")
    return await _drain(kube, kubeconfig)


async def _drain(kube: Kube, kubeconfig: Path | None) -> int:
    say = print
    say("\n== 5. kubectl drain node-1, reservation first ==")
    await kube.delete(DEPLOYMENTS, "big", namespace=NAMESPACE)
    await kube.patch(
        NAMESPACES, NAMESPACE, {"metadata": {"labels": {keys.INTERCEPT_EVICTIONS: "true"}}}
    )
    say(f"  big removed; namespace {NAMESPACE} labelled {keys.INTERCEPT_EVICTIONS}=true")
    kubectl = str(ensure_binaries().kubectl)
    config = [f"--kubeconfig={kubeconfig}"] if kubeconfig else []
    drain = await asyncio.create_subprocess_exec(
        kubectl, *config, "drain", "node-1", "--ignore-daemonsets", "--delete-emptydir-data",
        "--timeout=300s",
    )  # fmt: skip
    if await drain.wait() != 0:
        say("kubectl drain failed")
        return 1
    jobs = [
        job
        for job in (await kube.list(PODMIGRATIONJOBS))["items"]
        if job["metadata"]["name"].startswith("eviction-")
    ]
    say("\n  the jobs Berth made of the drain's evictions:")
    say(table(rows(jobs)))
    say(await usage(kube))
    await set_cordon(kube, ["node-1"], cordoned=False)
    return 0


async def _ready(kube: Kube, app: str, count: int) -> list[dict[str, Any]] | None:
    pods = [p for p in await app_pods(kube, app) if protocol.is_ready(p)]
    return pods if len(pods) == count else None


async def _unschedulable(kube: Kube, app: str) -> dict[str, Any] | None:
    for pod in await app_pods(kube, app):
        if _message(pod):
            return pod
    return None


def _message(pod: dict[str, Any]) -> str:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message", ""))
    return ""
