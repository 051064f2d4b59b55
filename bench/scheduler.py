"""Scheduler throughput with and without Berth's extender.

For each scope, batches of pending pods are scheduled by kube-scheduler processes the
bench starts from the cluster's own binary: with Berth's extender configured as `berth
dev up` configures it (`bench.modes.extender_entries`), or with no extender. Batches
alternate with, without, without, with, ... so that whatever else the machine does
weighs on both alike.

A batch's pods are created first, for a scheduler name no process serves yet; then the
batch's scheduler starts and binds them all, so the rate is the scheduler's own and not
how fast the bench can create pods. A watch notes when each pod is seen bound; the rate
runs from the first bind to the last.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench import nullhook
from bench.api import Api, create_all, pods_path
from bench.cluster import Bench, pod
from bench.modes import MODES, Mode, extender_entries, ignored_resources
from bench.progress import say
from bench.stats import added_per_event, paired_ratios, rate, span_rate, spread
from bench.table import Row, Table, added, number
from devtools import render

NAMESPACE = "bench-scheduler"
CLIENT_QPS = 5000
EXTENDER_REQUESTS = "berth_extender_requests_total"

METHOD = (
    "Each batch gets a kube-scheduler process of its own, from the cluster's own binary "
    f"(client qps/burst {CLIENT_QPS}, no leader election, a scheduler name of its own), "
    "either with Berth's extender entry as `berth dev up` writes it for the scope "
    "(default: `managedResources: berth.sh/reservation`, so pods that do not request it "
    "never reach the extender; strict: every pod does) or with no extender; both sides "
    "share the scope's profile (strict: NodeResourcesFit ignores berth.sh/reservation, as "
    "`berth dev up --scope strict` configures it). A batch's "
    "pods (10m CPU, 16Mi) are created first and stay Pending until its scheduler starts; "
    "pods/s runs from the first bind to the last, as a watch sees them. Not timed from "
    "creation, because the bench creates pods more slowly than a scheduler binds them: "
    "both sides would measure pod creation. Batches alternate with/without (ABBA): "
    "each pair of batches (one with, one without, moments apart) is a trial with a ratio "
    "of its own; the ratio column is the median trial, n gives the lowest and highest, "
    "and the pods/s pool the batches of a side. n counts the requests Berth's extender answered "
    "during the scope's batches: none in the default scope, whose rows are therefore a "
    "control, and how far their ratio strays from 1 is the noise of the run. Before a "
    "batch's scheduler starts, the bench waits until the cluster's processes are back "
    "near their idle CPU (every pod watcher has taken the new pods in). 'An extender that "
    "answers at once': the strict entries pointed at `bench/nullhook.py`, which passes "
    "every node sent from bare asyncio with no work: what kube-scheduler pays for calling "
    "any extender on this machine, whoever answers (at the larger size only, where the "
    "targets are set). '+x ms a pod': the time each pod takes more with the extender than "
    "without (1 / pods/s with, less 1 / pods/s without): the same added time reads as a "
    "lower ratio against a faster baseline, so this compares Berth with the floor when "
    "their baselines differ."
)


def order(batches: int) -> list[bool]:
    """Which batches run with Berth: with, without, without, with, with, without, ..."""
    return [index % 4 in (0, 3) for index in range(batches)]


def scheduler_config(
    bench: Bench, mode: Mode, *, name: str, extenders: list[dict[str, Any]]
) -> dict[str, Any]:
    """The scope's profile, with or without Berth's extender: nothing else differs."""
    return render.scheduler_config(
        kubeconfig_path=bench.cluster.kubeconfig,
        scheduler_names=[name],
        extenders=extenders or None,
        ignored_resources=ignored_resources(mode),
        qps=CLIENT_QPS,
        burst=CLIENT_QPS,
    )


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


async def batch(bench: Bench, *, name: str, config: dict[str, Any], pods: int) -> tuple[int, float]:
    """Schedule one batch with a scheduler of this config (whose profile is `name`);
    (pods counted, seconds) from the first bind to the last."""
    selector = f"bench-batch={name}"
    await create_all(
        bench.api,
        pods_path(NAMESPACE),
        (pod(f"{name}-{i}", scheduler=name, labels={"bench-batch": name}) for i in range(pods)),
        workers=8,
    )
    # Every watcher of pods (Berth's controller and extender among them) takes the new
    # pods in before the scheduler starts: the batch's span then holds scheduling only.
    await bench.settle()
    listed = await bench.api.request(
        "GET", pods_path(NAMESPACE), params={"labelSelector": selector, "limit": "1"}
    )
    times: list[float] = []
    watch = asyncio.create_task(
        bind_times(
            bench.api, selector, pods, version=listed["metadata"]["resourceVersion"], out=times
        )
    )
    scheduler = await asyncio.to_thread(bench.cluster.run_scheduler, name=name, config=config)
    try:
        await asyncio.wait_for(watch, timeout=600)
    finally:
        watch.cancel()
        await asyncio.to_thread(bench.cluster.stop, scheduler)
        (bench.cluster.state_dir / f"{name}.yaml").unlink(missing_ok=True)
    await bench.clear_pods(NAMESPACE, selector)
    return span_rate(times)


async def rows(bench: Bench, *, batches: int, pods: int, floor: bool) -> list[Row]:
    """One row per scope at the cluster's current size and, with `floor`, the strict
    scope's entries pointed at an extender that answers at once."""
    await bench.namespace(NAMESPACE)
    result = []
    for mode in MODES:
        result.append(await mode_row(bench, mode, batches=batches, pods=pods))
    if not floor:
        return result
    async with nullhook.running(bench) as null:
        entries = [{**e, "urlPrefix": null.url} for e in extender_entries(bench.cluster, "strict")]
        result.append(
            await mode_row(
                bench,
                "strict",
                batches=batches,
                pods=pods,
                entries=entries,
                calls=null.count,
                label="an extender that answers at once, strict entries",
            )
        )
    return result


async def extender_calls(bench: Bench) -> float:
    """Requests Berth's extender has answered so far, every verb."""
    return await bench.counter("berth-extender", EXTENDER_REQUESTS)


async def mode_row(
    bench: Bench,
    mode: Mode,
    *,
    batches: int,
    pods: int,
    entries: list[dict[str, Any]] | None = None,
    calls: Callable[[], Awaitable[float]] | None = None,
    label: str | None = None,
) -> Row:
    """Batches with the scope's extender entries (or `entries`, whose server counts its
    requests with `calls`) against none."""
    entries = extender_entries(bench.cluster, mode) if entries is None else entries
    count_calls = calls or (lambda: extender_calls(bench))
    label = label or mode
    runs: list[tuple[bool, float]] = []
    bound = {True: 0, False: 0}
    seconds = {True: 0.0, False: 0.0}
    calls_before = await count_calls()
    for index, with_berth in enumerate(order(batches)):
        side = "with" if with_berth else "without"
        name = f"bench-{bench.nodes}-{mode}-{index}-{side}-{len(label)}"
        extenders = entries if with_berth else []
        config = scheduler_config(bench, mode, name=name, extenders=extenders)
        count, took = await batch(bench, name=name, config=config, pods=pods)
        bound[with_berth] += count
        seconds[with_berth] += took
        runs.append((with_berth, rate(count, took)))
        say(
            f"scheduler {bench.nodes} nodes, {label}: batch {index + 1}/{batches} {side} "
            f"Berth: {number(runs[-1][1])} pods/s"
        )
    called = await count_calls() - calls_before
    ratios = paired_ratios(runs)
    with_rate, without_rate = (rate(bound[side], seconds[side]) for side in (True, False))
    return Row(
        measure=f"{bench.nodes:,} nodes, {label}",
        figure=number(with_rate, "pods/s") + added(added_per_event(with_rate, without_rate), "pod"),
        baseline=number(without_rate, "pods/s"),
        ratio=statistics.median(ratios) if ratios else None,
        n=f"{spread(ratios)}, {pods:,} pods a batch; {called:,.0f} extender calls",
        what="pods kube-scheduler binds per second, Berth's extender configured vs none",
    )


def table(rows_: list[Row]) -> Table:
    return Table(title="Scheduler throughput", method=METHOD, rows=rows_)
