"""The one local cluster the bench grows: start it, add fake nodes, make pods, stop it.

The cluster is `berth dev up`'s (`devtools.cluster.LocalCluster`), in a state directory
of the bench's own (`BERTH_BENCH_STATE_DIR`, default `$XDG_STATE_HOME/berth/bench`), on
free loopback ports: it runs beside any other local cluster of the machine.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.api import REPORT_EVERY, Api, ApiError, Object, create_all
from bench.progress import say
from devtools import render
from devtools.cluster import ClusterSpec, LocalCluster
from devtools.processes import Component, default_state_dir

PAUSE = "registry.k8s.io/pause:3.10"
NODE_CPU = "8"
NODE_MEMORY = "32Gi"
NODE_PODS = 110


def state_dir() -> Path:
    configured = os.environ.get("BERTH_BENCH_STATE_DIR")
    return Path(configured) if configured else default_state_dir().parent / "bench"


def start(nodes: int, *, profiling: bool = False) -> LocalCluster:
    """`berth dev up --nodes N` in the bench's state directory (stopping a cluster a
    crashed bench left there first)."""
    cluster = LocalCluster(state_dir())
    cluster.down()
    cluster = LocalCluster(state_dir())
    cluster.up(
        ClusterSpec(
            nodes=nodes,
            node_cpu=NODE_CPU,
            node_memory=NODE_MEMORY,
            node_pods=NODE_PODS,
            profiling=profiling,
        )
    )
    return cluster


@dataclass
class Bench:
    """The running cluster and an API client, for every row family."""

    cluster: LocalCluster
    api: Api
    nodes: int
    idle: float | None = None
    """Cores the cluster's processes use when nothing is asked of them (`settle`)."""

    def component(self, name: str) -> Component:
        return next(c for c in self.cluster.running() if c.name == name)

    async def metrics(self, name: str) -> str:
        """The /metrics page of one of Berth's components (served without a client
        certificate, with a certificate of the cluster's CA)."""
        port = self.component(name).port
        context = ssl.create_default_context(cafile=str(self.cluster.serving_ca))
        async with self.api.session.get(
            f"https://127.0.0.1:{port}/metrics", ssl=context
        ) as response:
            return await response.text()

    async def counter(self, name: str, metric: str) -> float:
        """The sum of a counter's samples, all labels together, on a component."""
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in (await self.metrics(name)).splitlines()
            if line.startswith((f"{metric}{{", f"{metric} "))
        )

    def cpu_seconds(self) -> float:
        """CPU time used so far by the cluster's processes, Berth's included."""
        return sum(cpu_seconds(c.pid) for c in self.cluster.running())

    async def cores_in_use(self, window: float = 0.25) -> float:
        """Cores the cluster's processes use over the next `window` seconds."""
        before, started = self.cpu_seconds(), time.monotonic()
        await asyncio.sleep(window)
        return (self.cpu_seconds() - before) / (time.monotonic() - started)

    async def measure_idle(self) -> float:
        """The cores the cluster's processes use when nothing is asked of them. Measured
        once, right after the cluster started: not just after it grew, when kwok still
        works on the new nodes for some seconds (a baseline taken then lets every batch
        start at once)."""
        samples = sorted([await self.cores_in_use() for _ in range(8)])
        self.idle = samples[len(samples) // 2]
        say(f"the cluster idles at {self.idle:.2f} cores")
        return self.idle

    async def settle(self, *, timeout: float = 15.0) -> None:
        """Wait until the work the last batch left behind (watchers digesting its pods,
        their deletion) is done: the cluster back near the cores it uses idle. A batch
        that starts while the previous one's aftermath still runs is slowed by it,
        whichever side it measures."""
        idle = self.idle if self.idle is not None else await self.measure_idle()
        started = time.monotonic()
        while time.monotonic() < started + timeout:
            if await self.cores_in_use() <= idle * 1.5 + 0.05:
                return
        say(f"the cluster did not settle within {timeout:.0f}s; going on")

    async def grow(self, nodes: int) -> None:
        """Add fake nodes (as `berth dev up` creates them) until there are `nodes`, and
        wait until kwok has made every one Ready and its not-ready taint is lifted."""
        if nodes <= self.nodes:
            return
        started = time.monotonic()
        say(f"adding nodes {self.nodes} → {nodes}")
        await create_all(
            self.api,
            "/api/v1/nodes",
            (
                render.fake_node(
                    name=f"node-{index}", cpu=NODE_CPU, memory=NODE_MEMORY, pods=NODE_PODS
                )
                for index in range(self.nodes, nodes)
            ),
            workers=8,
            what="nodes",
        )
        await wait_for(lambda: self.ready_nodes(nodes), what=f"{nodes} Ready nodes", timeout=600)
        self.nodes = nodes
        say(f"{nodes} nodes Ready after {time.monotonic() - started:.0f}s")

    async def ready_nodes(self, expected: int) -> bool:
        """Whether `expected` nodes are Ready and the not-ready taint is off them."""
        nodes = await self.api.list_all("/api/v1/nodes")
        return sum(1 for node in nodes if schedulable(node)) >= expected

    async def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """Create the namespace (with these labels) and wait until pods can be created in
        it (its default ServiceAccount exists)."""
        metadata: dict[str, Any] = {"name": name, "labels": labels or {}}
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
        await self.api.apply("/api/v1/namespaces", body)

        async def account() -> bool:
            try:
                await self.api.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")
            except ApiError:
                return False
            return True

        await wait_for(account, what=f"the default ServiceAccount of {name}")
        return name

    async def clear_pods(self, namespace: str, selector: str | None = None) -> None:
        """Delete the pods at once (no grace) and wait until they are gone."""
        await self.api.delete_pods(namespace, selector=selector)
        params = {"labelSelector": selector} if selector else None

        async def gone() -> bool:
            return not await self.api.list_all(f"/api/v1/namespaces/{namespace}/pods", params)

        await wait_for(gone, what=f"the pods of {namespace} to be deleted", timeout=300)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def schedulable(node: Object) -> bool:
    """Ready, and no longer tainted for not having been Ready."""
    ready = any(
        condition["type"] == "Ready" and condition["status"] == "True"
        for condition in node.get("status", {}).get("conditions") or []
    )
    taints = {taint["key"] for taint in node.get("spec", {}).get("taints") or []}
    return ready and not taints & NOT_READY_TAINTS


def pod(
    name: str,
    *,
    scheduler: str = "default-scheduler",
    node: str | None = None,
    cpu: str = "10m",
    memory: str = "16Mi",
    labels: dict[str, str] | None = None,
) -> Object:
    """A small pod of one pause container: kwok runs it once it is bound."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "app",
                "image": PAUSE,
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            }
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


async def wait_for(
    predicate: Callable[[], Awaitable[bool]],
    *,
    what: str,
    timeout: float = 120.0,
    interval: float = 0.5,
) -> None:
    started = time.monotonic()
    reported = started
    while not await predicate():
        now = time.monotonic()
        if now > started + timeout:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if now > reported + REPORT_EVERY:
            say(f"still waiting for {what} ({now - started:.0f}s)")
            reported = now
        await asyncio.sleep(interval)
