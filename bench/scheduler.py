"""Scheduler throughput with and without Berth's extender.

For each scope, batches of pending pods are scheduled by kube-scheduler processes the
bench starts from the cluster's own binary: with Berth's extender configured as `berth
dev up` configures it (`bench.modes.extender_entry`), or with no extender. Batches
alternate with, without, without, with, ... so that whatever else the machine does
weighs on both alike.

A batch's pods are created first, for a scheduler name no process serves yet; then the
batch's scheduler starts and binds them all, so the rate is the scheduler's own and not
how fast the bench can create pods. A watch notes when each pod is seen bound; the rate
runs from the first bind to the last.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.api import Api, create_all, pods_path
from bench.cluster import Bench, pod
from bench.modes import MODES, Mode, extender_entry
from bench.progress import say
from bench.stats import rate, ratio, span_rate
from bench.table import Row, Table, number
from devtools import render

NAMESPACE = "bench-scheduler"
CLIENT_QPS = 5000

METHOD = (
    "Two kube-scheduler processes of the cluster's own binary per batch, one at a time "
    f"(client qps/burst {CLIENT_QPS}, no leader election, a scheduler name of their own): "
    "with Berth's extender entry as `berth dev up` writes it for the scope (default: "
    "`managedResources: berth.sh/reservation`, so pods that do not request it never reach "
    "the extender; strict: every pod does), or without any extender. Each batch's pods "
    "(10m CPU, 16Mi) are created first and stay Pending until their scheduler starts; "
    "pods/s runs from the first bind to the last, seen by a watch. Batches alternate "
    "with/without (ABBA order); the figure pools every batch of a side."
)


def order(batches: int) -> list[bool]:
    """Which batches run with Berth: with, without, without, with, with, without, ..."""
    return [index % 4 in (0, 3) for index in range(batches)]


def scheduler_config(bench: Bench, *, name: str, extender: dict[str, Any] | None) -> dict[str, Any]:
    config = render.scheduler_config(
        kubeconfig_path=bench.cluster.kubeconfig,
        scheduler_name=name,
        extenders=[extender] if extender else None,
    )
    config["clientConnection"].update({"qps": CLIENT_QPS, "burst": CLIENT_QPS})
    return config


async def bind_times(
    api: Api, selector: str, count: int, *, version: str, out: list[float]
) -> None:
    """Append the moment each pod of `selector` is first seen bound, until `count` are."""
    seen: set[str] = set()
    while len(seen) < count:
        async for event in api.watch(
            pods_path(NAMESPACE), resource_version=version, params={"labelSelector": selector}
        ):
            obj = event["object"]
            version = obj["metadata"].get("resourceVersion", version)
            name = obj["metadata"].get("name", "")
            if event["type"] != "DELETED" and obj["spec"].get("nodeName") and name not in seen:
                seen.add(name)
                out.append(time.monotonic())
                if len(seen) == count:
                    return


async def batch(
    bench: Bench, *, name: str, extender: dict[str, Any] | None, pods: int
) -> tuple[int, float]:
    """Schedule one batch; (pods counted, seconds) from first bind to last."""
    selector = f"bench-batch={name}"
    await create_all(
        bench.api,
        pods_path(NAMESPACE),
        (pod(f"{name}-{i}", scheduler=name, labels={"bench-batch": name}) for i in range(pods)),
        workers=8,
    )
    listed = await bench.api.request(
        "GET", pods_path(NAMESPACE), params={"labelSelector": selector, "limit": "1"}
    )
    times: list[float] = []
    watch = asyncio.create_task(
        bind_times(
            bench.api, selector, pods, version=listed["metadata"]["resourceVersion"], out=times
        )
    )
    scheduler = await asyncio.to_thread(
        bench.cluster.run_scheduler,
        name=name,
        config=scheduler_config(bench, name=name, extender=extender),
    )
    try:
        await asyncio.wait_for(watch, timeout=600)
    finally:
        watch.cancel()
        await asyncio.to_thread(bench.cluster.stop, scheduler)
    await bench.clear_pods(NAMESPACE, selector)
    return span_rate(times)


async def rows(bench: Bench, *, batches: int, pods: int) -> list[Row]:
    """One row per scope at the cluster's current size."""
    await bench.namespace(NAMESPACE)
    result = []
    for mode in MODES:
        result.append(await mode_row(bench, mode, batches=batches, pods=pods))
    return result


async def mode_row(bench: Bench, mode: Mode, *, batches: int, pods: int) -> Row:
    totals = {True: [0, 0.0], False: [0, 0.0]}
    for index, with_berth in enumerate(order(batches)):
        side = "with" if with_berth else "without"
        name = f"bench-{bench.nodes}-{mode}-{index}-{side}"
        extender = extender_entry(bench.cluster, mode) if with_berth else None
        count, seconds = await batch(bench, name=name, extender=extender, pods=pods)
        totals[with_berth][0] += count
        totals[with_berth][1] += seconds
        say(
            f"scheduler {bench.nodes} nodes {mode}: batch {index + 1}/{batches} {side} "
            f"Berth: {number(rate(count, seconds))} pods/s"
        )
    with_rate = rate(int(totals[True][0]), totals[True][1])
    without_rate = rate(int(totals[False][0]), totals[False][1])
    return Row(
        measure=f"{bench.nodes:,} nodes, {mode}",
        figure=number(with_rate, "pods/s"),
        baseline=number(without_rate, "pods/s"),
        ratio=ratio(with_rate, without_rate),
        n=f"{batches // 2} batches of {pods:,} pods a side",
        what="pods kube-scheduler binds per second, Berth's extender configured vs none",
    )


def table(rows_: list[Row]) -> Table:
    return Table(title="Scheduler throughput", method=METHOD, rows=rows_)
