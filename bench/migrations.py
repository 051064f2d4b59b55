"""Concurrent migrations end to end, under a flood of competing pods.

The cluster is made nearly full first: on every node a filler pod (bound directly) leaves
room for exactly one workload pod. Deployments of 2 replicas take some of those places.
Then, at the same moment, the bench creates one PodMigrationJob for a pod of each of
2J Deployments (J ReservationFirst, J EvictDirectly, alternating) and starts a flood of
ordinary pods of the same size that brings the cluster to 90% of its places. A watch
notes when each job ends.

For each job: the time from its creation to Succeed. For each ReservationFirst job
that succeeded: whether the replacement pod runs on the node its Reservation held
(`status.nodeName` against the new pod's `spec.nodeName`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.api import REPORT_EVERY, Api, Object, create_all, pods_path
from bench.cluster import NODE_CPU, Bench, pod, wait_for
from bench.progress import say
from bench.stats import percentile, ratio
from bench.table import NONE, Row, Table, number
from berth.api import SUCCEEDED_PHASES

NAMESPACE = "bench-migrate"
FILL_NAMESPACE = "bench-fill"
FLOOD_NAMESPACE = "bench-flood"
SLOT_CPU = 1
"""The CPU of a workload pod, and what a filler leaves free on its node."""
FULL = 0.9
"""The share of places taken once the flood has landed."""
TTL = "3m"
WAIT = 240.0
"""Seconds the bench waits for every job to end: past the TTL, each has."""
JOBS = "/apis/scheduling.koordinator.sh/v1alpha1/podmigrationjobs"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
TERMINAL = (*SUCCEEDED_PHASES, "Failed", "Aborted")

METHOD = (
    f"At the cluster's size, a filler pod bound to every node leaves room for one "
    f"{SLOT_CPU}-CPU pod per node. Deployments of 2 replicas ({SLOT_CPU} CPU each) run in "
    "those places. Then, at once, the bench creates one PodMigrationJob per Deployment "
    f"(alternately ReservationFirst and EvictDirectly, ttl {TTL}, the controller's default "
    "configuration: evictQPS 10) and a flood of ordinary pods of the same size, in a "
    f"namespace of their own, that takes the cluster to {FULL:.0%} of its places. Times "
    "run from a job's creation to the watch seeing it Succeed; a job that fails counts "
    "in n but not in the times. 'On its reserved node': the replacement pod's node is the "
    "job's `status.nodeName`."
)


def deployment(name: str) -> Object:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "bench": "workload"}},
                "spec": pod("x", cpu=str(SLOT_CPU), memory="64Mi")["spec"],
            },
        },
    }


def job(name: str, target: Object, mode: str) -> Object:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "PodMigrationJob",
        "metadata": {"name": name},
        "spec": {
            "mode": mode,
            "ttl": TTL,
            "podRef": {"namespace": NAMESPACE, "name": target["metadata"]["name"]},
        },
    }


async def fill(bench: Bench) -> None:
    """A filler on every node, leaving SLOT_CPU free there."""
    await bench.namespace(FILL_NAMESPACE)
    filler_cpu = f"{int(NODE_CPU) - SLOT_CPU}"
    await create_all(
        bench.api,
        pods_path(FILL_NAMESPACE),
        (
            pod(f"filler-{index}", node=f"node-{index}", cpu=filler_cpu, memory="64Mi")
            for index in range(bench.nodes)
        ),
        workers=8,
    )


async def workloads(bench: Bench, count: int) -> list[Object]:
    """`count` Deployments of 2 ready replicas; one pod of each."""
    await create_all(
        bench.api, DEPLOYMENTS, (deployment(f"app-{i}") for i in range(count)), workers=8
    )

    async def ready() -> bool:
        items = await bench.api.list_all(DEPLOYMENTS)
        return sum(1 for d in items if d.get("status", {}).get("readyReplicas") == 2) == count

    await wait_for(ready, what=f"{count} Deployments to be ready", timeout=600)
    pods = await bench.api.list_all(pods_path(NAMESPACE), {"labelSelector": "bench=workload"})
    first: dict[str, Object] = {}
    for item in pods:
        first.setdefault(item["metadata"]["labels"]["app"], item)
    return [first[f"app-{i}"] for i in range(count)]


async def watch_jobs(api: Api, names: set[str], ended: dict[str, tuple[float, Object]]) -> None:
    """Record when each job of `names` is first seen in a terminal phase."""
    listed = await api.request("GET", JOBS, params={"limit": "1"})
    version = listed["metadata"]["resourceVersion"]
    while len(ended) < len(names):
        async for event in api.watch(JOBS, resource_version=version):
            obj = event["object"]
            version = obj["metadata"].get("resourceVersion", version)
            name = obj["metadata"].get("name")
            phase = (obj.get("status") or {}).get("phase")
            if name in names and name not in ended and phase in TERMINAL:
                ended[name] = (time.monotonic(), obj)
                if len(ended) == len(names):
                    return


async def run(
    bench: Bench, jobs_per_mode: int
) -> tuple[dict[str, float], dict[str, tuple[float, Object]], dict[str, str], int]:
    """Set up, migrate, and return creation times, ends, each job's mode, and the flood."""
    for namespace in (NAMESPACE, FLOOD_NAMESPACE):
        await bench.namespace(namespace)
    say(f"migrations: filling {bench.nodes:,} nodes")
    await fill(bench)
    targets = await workloads(bench, 2 * jobs_per_mode)
    flood = max(int(FULL * bench.nodes) - 2 * len(targets), 0)
    modes = {
        f"bench-{index}": "ReservationFirst" if index % 2 == 0 else "EvictDirectly"
        for index in range(len(targets))
    }
    ended: dict[str, tuple[float, Object]] = {}
    watcher = asyncio.create_task(watch_jobs(bench.api, set(modes), ended))
    await asyncio.sleep(1)  # the watch is open before the first job exists
    say(f"migrations: {len(targets)} jobs and a flood of {flood:,} pods, at once")
    created: dict[str, float] = {}

    async def create_jobs() -> None:
        async def one(name: str, target: Object) -> None:
            await bench.api.create(JOBS, job(name, target, modes[name]))
            created[name] = time.monotonic()

        await asyncio.gather(*(one(name, t) for name, t in zip(modes, targets, strict=True)))

    flooding = create_all(
        bench.api,
        pods_path(FLOOD_NAMESPACE),
        (
            pod(f"flood-{i}", cpu=str(SLOT_CPU), memory="64Mi", labels={"bench": "flood"})
            for i in range(flood)
        ),
        workers=8,
        what="flood",
    )
    await asyncio.gather(create_jobs(), flooding)
    deadline = time.monotonic() + WAIT
    while not watcher.done() and time.monotonic() < deadline:
        await asyncio.wait({watcher}, timeout=REPORT_EVERY)
        say(f"migrations: {len(ended)} of {len(modes)} jobs ended")
    if watcher.done():
        watcher.result()  # a watch that failed fails the row
    else:
        watcher.cancel()
        say(f"migrations: {len(modes) - len(ended)} jobs did not end within {WAIT:.0f}s")
    return created, ended, modes, flood


async def rows(bench: Bench, *, jobs_per_mode: int) -> list[Row]:
    created, ended, modes, flood = await run(bench, jobs_per_mode)
    durations: dict[str, list[float]] = {"ReservationFirst": [], "EvictDirectly": []}
    on_node = 0
    for name, (moment, obj) in ended.items():
        status = obj.get("status") or {}
        if status.get("phase") not in SUCCEEDED_PHASES:
            continue
        durations[modes[name]].append(moment - created[name])
        if modes[name] == "ReservationFirst" and await replaced_on(bench.api, status):
            on_node += 1
    await cleanup(bench, set(modes))
    rf, ed = durations["ReservationFirst"], durations["EvictDirectly"]
    n_rf = f"{len(rf)} of {jobs_per_mode} jobs succeeded"
    n_ed = f"{len(ed)} of {jobs_per_mode}"
    what = (
        f"{jobs_per_mode}+{jobs_per_mode} jobs at once, {bench.nodes:,} nodes, {flood:,} flood pods"
    )
    result = []
    for label, share in (("median", 0.5), ("p95", 0.95)):
        first = percentile(rf, share) if rf else None
        second = percentile(ed, share) if ed else None
        result.append(
            Row(
                measure=f"creation → Succeed, {label}",
                figure=_seconds(first),
                baseline=_seconds(second),
                ratio=ratio(first, second) if first and second else None,
                n=f"{n_rf}; {n_ed}",
                what=what,
            )
        )
    result.append(
        Row(
            measure="replacement on its reserved node",
            figure=f"{on_node} of {len(rf)} ({on_node / len(rf):.0%})" if rf else NONE,
            n=n_rf,
            what="ReservationFirst jobs whose new pod runs where the Reservation was",
        )
    )
    return result


def _seconds(value: float | None) -> str:
    return NONE if value is None else number(value, "s")


async def replaced_on(api: Api, status: dict[str, Any]) -> bool:
    """Whether the job's new pod is bound to the node its Reservation held."""
    new = status.get("podRef") or {}
    if not new.get("name"):
        return False
    found = await api.request(
        "GET", f"{pods_path(new.get('namespace') or NAMESPACE)}/{new['name']}"
    )
    return bool(status.get("nodeName")) and found["spec"].get("nodeName") == status["nodeName"]


async def cleanup(bench: Bench, jobs: set[str]) -> None:
    for name in jobs:
        await bench.api.delete(f"{JOBS}/{name}")
    for kind in ("deployments", "replicasets"):
        await bench.api.request(
            "DELETE", f"/apis/apps/v1/namespaces/{NAMESPACE}/{kind}", body={"gracePeriodSeconds": 0}
        )
    for namespace in (NAMESPACE, FLOOD_NAMESPACE, FILL_NAMESPACE):
        await bench.clear_pods(namespace)


def table(rows_: list[Row]) -> Table:
    return Table(
        title="Migrations end to end",
        method=METHOD,
        rows=rows_,
        figure_header="ReservationFirst",
        baseline_header="EvictDirectly",
        ratio_header="RF/ED",
    )
