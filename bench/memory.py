"""Peak memory of Berth's three components on a large cluster.

The cluster grows to the full node count, then pods bound directly to its nodes (kwok
runs them) bring it to the full pod count. Once kwok has made every pod Running, and the
components' watches have had time to bring them in, each component's peak resident set
(`VmHWM` in /proc/<pid>/status: the most it ever held, this run included) is read,
beside its resident set when the cluster had just started.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.api import create_all, pods_path
from bench.cluster import Bench, pod, wait_for
from bench.progress import say
from bench.table import Row, Table

NAMESPACE = "bench-memory"
COMPONENTS = ("berth-controller", "berth-webhook", "berth-extender")
SETTLE = 10.0
"""Seconds for the components' watches to catch up once the pods are Running."""

METHOD = (
    "`VmHWM` (peak resident set) of each component process `berth dev up` started, read "
    "from /proc/<pid>/status once the cluster holds the node and pod counts shown (pods "
    "bound directly to nodes, 10m CPU each, Running under kwok) and the watches have had "
    f"{SETTLE:.0f} s to bring them in; beside it the resident set (`VmRSS`) read right "
    "after the cluster started, with its first nodes and no pods. The ratio is peak over start."
)


def status_kib(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(f"{field} not in /proc/{pid}/status")


def resident(bench: Bench, field: str) -> dict[str, int]:
    """Each component's `field` in KiB."""
    return {name: status_kib(bench.component(name).pid, field) for name in COMPONENTS}


async def populate(bench: Bench, pods: int) -> int:
    """Bound pods, spread over the nodes, until the cluster holds about `pods`; how many
    the bench created."""
    await bench.namespace(NAMESPACE)
    existing = await bench.api.count("/api/v1/pods")
    missing = max(pods - existing, 0)
    say(f"memory: creating {missing:,} pods on {bench.nodes:,} nodes")
    await create_all(
        bench.api,
        pods_path(NAMESPACE),
        (
            pod(f"p-{i}", node=f"node-{i % bench.nodes}", labels={"bench": "memory"})
            for i in range(missing)
        ),
        workers=8,
        what="memory pods",
    )

    async def running() -> bool:
        page = await bench.api.request(
            "GET",
            pods_path(NAMESPACE),
            params={"fieldSelector": "status.phase!=Running", "limit": "1"},
        )
        return not page.get("items")

    await wait_for(running, what="kwok to run every pod", timeout=900, interval=2)
    await asyncio.sleep(SETTLE)
    return missing


def rows(bench: Bench, *, start: dict[str, int], pods: int) -> list[Row]:
    peak = resident(bench, "VmHWM")
    return [
        Row(
            measure=name,
            figure=f"{peak[name] / 1024:,.0f} MiB",
            baseline=f"{start[name] / 1024:,.0f} MiB",
            ratio=peak[name] / start[name] if start[name] else None,
            n=f"{bench.nodes:,} nodes, {pods:,} pods",
            what=f"the most memory {name} held during the run",
        )
        for name in COMPONENTS
    ]


def table(rows_: list[Row]) -> Table:
    return Table(
        title="Memory",
        method=METHOD,
        rows=rows_,
        figure_header="peak RSS",
        baseline_header="RSS at start",
        ratio_header="peak/start",
    )
