"""How long an arbitration round keeps the controller's event loop from anything else.

The controller renews its Lease, answers probes and applies watch events on one event
loop, so a round must never hold that loop for long. This runs the controller's own
admission path (`controller.admission.Admission.admit_once`: the snapshot of the caches,
`arbitrate`, the decisions written) on caches filled with the synthetic cluster of
bench/arbitration.py, while two more coroutines share the loop: a ticker that asks to
wake every millisecond and records how late it wakes (the stall it saw), and a watch
that replaces pods in the caches at a steady rate, as the informers do.

Writes go to an executor that answers at once, as an API server would after one round
trip: each status write or patch is taken into the caches as the real executor's
answer is (`Caches.assume`).

Run: python bench/loop.py [--rounds 6] [--jobs 10000] [--nodes 5000] [--pods 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar, cast

from bench.arbitration import ADMISSION_KEY, build
from berth.kube.client import PODMIGRATIONJOBS, Kube, Resource
from berth.kube.events import Recorder
from berth.settings import MigrationControllerArgs
from controller.actions import Patch, Plan, UpdateStatus
from controller.admission import SWITCH_INTERVAL, Admission
from controller.caches import Caches
from controller.executor import Executor, Outcome

Object = dict[str, Any]
T = TypeVar("T")

TICK = 0.001
"""How often the ticker asks to wake, in seconds."""


def renewed(obj: Mapping[str, Any], **changes: Any) -> Object:
    """The object as the API server returns it after a write: a new resourceVersion."""
    metadata = obj["metadata"]
    version = str(int(metadata.get("resourceVersion") or "1") + 1)
    return {**obj, **changes, "metadata": {**metadata, "resourceVersion": version}}


def replicaset(deployment: Mapping[str, Any]) -> Object:
    """The ReplicaSet of a synthetic Deployment, as its pods name it."""
    metadata = deployment["metadata"]
    namespace, app = metadata["namespace"], metadata["name"]
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{app}-7d9f",
            "namespace": namespace,
            "uid": f"uid-rs-{namespace}-{app}",
            "resourceVersion": "1",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": app,
                    "uid": metadata["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"replicas": deployment["spec"]["replicas"]},
        "status": {"availableReplicas": deployment["status"]["availableReplicas"]},
    }


def versioned(obj: Mapping[str, Any]) -> Object:
    return {**obj, "metadata": {"resourceVersion": "1", **obj["metadata"]}}


async def filled(caches: Caches, *, jobs: int, nodes: int, pods: int) -> tuple[Caches, list[str]]:
    """The caches holding the synthetic cluster, as the watches would fill them; and the
    keys of its pods."""
    snapshot = build(jobs=jobs, nodes=nodes, pods=pods)
    objects: list[tuple[str, Mapping[str, Any]]] = [
        ("nodes", node) for node in snapshot.nodes.values()
    ]
    for workload in snapshot.workloads.values():
        plural = "deployments" if workload["kind"] == "Deployment" else "statefulsets"
        objects.append((plural, workload))
        if workload["kind"] == "Deployment":
            objects.append(("replicasets", replicaset(workload)))
    objects += [("pods", pod) for pod in snapshot.pods.values()]
    objects += [("poddisruptionbudgets", pdb) for pdb in snapshot.pdbs]
    every_job = [*snapshot.pending, *snapshot.in_flight, *snapshot.history]
    objects += [("podmigrationjobs", job) for job in every_job]
    informers = {informer.resource.plural: informer for informer in caches.informers}
    for plural, obj in objects:
        await informers[plural]._apply("ADDED", versioned(obj))
    for informer in caches.informers:
        informer.synced.set()
    gc.collect()
    return caches, list(snapshot.pods)


class Answering(Executor):
    """Carries out a plan as an API server that answers at once would: one round trip per
    action, and every write taken into the caches as the real executor takes it."""

    def __init__(self, caches: Caches) -> None:
        super().__init__(cast(Kube, None), cast(Recorder, None), written=caches.assume)
        self.caches = caches
        self.plans = 0

    async def run(self, plan: Plan) -> Outcome:
        self.plans += 1
        for action in plan.actions:
            await asyncio.sleep(0)
            if isinstance(action, UpdateStatus):
                self._status(action.resource, action)
            elif isinstance(action, Patch) and action.resource is PODMIGRATIONJOBS:
                self._patched(action.resource, action)
        return Outcome()

    def _status(self, resource: Resource, action: UpdateStatus) -> None:
        """The job as it is now (after the plan's own patch), with the status written."""
        cached = self.caches.jobs.get(action.obj["metadata"]["name"]) or action.obj
        self._written(resource, renewed(cached, status=action.obj["status"]))

    def _patched(self, resource: Resource, action: Patch) -> None:
        cached = self.caches.jobs.get(action.name)
        if cached is None:
            return
        metadata = cached["metadata"]
        annotations = {**(metadata.get("annotations") or {})}
        annotations.update(action.patch["metadata"]["annotations"])
        obj = {**cached, "metadata": {**metadata, "annotations": annotations}}
        self._written(resource, renewed(obj))


class Inline(Admission):
    """The round on the event loop itself, as the controller ran it before it had an
    admission thread (the old memo and the frozen copy freed on the loop too): for
    comparison."""

    async def off_loop(self, work: Callable[[], T]) -> T:
        return work()


class Queued:
    """How long some threads of this process have waited for a core, all told: the
    second field of Linux's /proc schedstat of each (zero where there is none)."""

    def __init__(self, native_ids: Sequence[int]) -> None:
        self.files: list[int] = []
        for native_id in native_ids:
            with contextlib.suppress(OSError):
                self.files.append(os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY))

    def seconds(self) -> float:
        return sum(int(os.pread(fd, 128, 0).split()[1]) for fd in self.files) / 1e9

    def close(self) -> None:
        for fd in self.files:
            os.close(fd)


class Ticker:
    """Asks to wake every `TICK` seconds and records how late each wake-up is.

    On a machine shared with other work, a wake-up is also late when the event loop's
    thread, or the admission thread holding the interpreter, waits for a core: that says
    nothing of the controller. So each wake-up also records how long those threads waited
    for a core meanwhile (`Queued`), and what is left of the lateness without it is what
    the process itself kept the loop waiting."""

    def __init__(self, queued: Queued) -> None:
        self.queued = queued
        self.samples: list[tuple[float, float, float]] = []
        """(when it woke, how late, how long the threads waited for a core), seconds."""

    async def run(self) -> None:
        while True:
            asked, queued = time.perf_counter(), self.queued.seconds()
            await asyncio.sleep(TICK)
            woke, queued_end = time.perf_counter(), self.queued.seconds()
            self.samples.append((woke, woke - asked - TICK, queued_end - queued))

    def between(self, start: float, end: float) -> list[tuple[float, float]]:
        """The wake-ups whose wait overlaps [start, end]: how late each was, and how late
        but for the time the threads waited for a core, in milliseconds."""
        return [
            (late * 1000, max(0.0, late - queued) * 1000)
            for woke, late, queued in self.samples
            if woke >= start and woke - late <= end
        ]


async def watch(caches: Caches, keys: list[str], *, per_second: float) -> None:
    """Replace pods in the caches at a steady rate, as watch events do."""
    if per_second <= 0:
        return
    rng = random.Random(3)
    due = 0.0
    last = time.perf_counter()
    while True:
        await asyncio.sleep(TICK)
        now = time.perf_counter()
        due += (now - last) * per_second
        last = now
        while due >= 1:
            due -= 1
            pod = caches.pods.get(rng.choice(keys))
            if pod is not None:
                await caches.pods._apply("MODIFIED", renewed(pod))
            if due % 10 < 1:
                await asyncio.sleep(0)  # a watch stream hands over events a chunk at a time


class Collections:
    """The garbage collector's full collections, and how long each stopped every thread."""

    def __init__(self) -> None:
        self.full: list[tuple[float, float]] = []
        """(when it ended, how long it took), in seconds."""
        self._started = 0.0
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        elif info["generation"] == 2:
            self.full.append((now, now - self._started))

    def between(self, start: float, end: float) -> list[float]:
        """How long, in milliseconds, each full collection that ended in [start, end] took."""
        return [took * 1000 for ended, took in self.full if start <= ended <= end]

    def close(self) -> None:
        gc.callbacks.remove(self._seen)


@dataclass(frozen=True)
class RoundFigures:
    """One round, as the event loop saw it."""

    round_ms: float
    """From the start of `admit_once` to the end of its writes."""
    cpu_ms: float
    """CPU time the process spent meanwhile, on every thread (the ticker and the watch
    included): unlike the wall clock, it does not grow when the machine is busy."""
    longest_stall_ms: float
    """The longest the loop kept the ticker waiting past its time."""
    p99_stall_ms: float
    """The 99th percentile of the ticker's lateness during the round."""
    longest_own_ms: float
    """The longest stall less the time the loop's and the admission thread waited for a
    core meanwhile (`Ticker`): how long the process itself blocked the loop."""
    writes: int
    """Plans the round carried out (status writes; an admitted job's patch with it)."""
    full_collections_ms: list[float]
    """How long each full garbage collection during the round took: it stops every
    thread, the loop's included, whatever triggered it."""


async def measure(
    work: Callable[[], Awaitable[None]],
    ticker: Ticker,
    executor: Answering,
    collections: Collections,
) -> RoundFigures:
    await asyncio.sleep(0.05)
    plans = executor.plans
    cpu, start = time.process_time(), time.perf_counter()
    await work()
    end, cpu_end = time.perf_counter(), time.process_time()
    await asyncio.sleep(3 * TICK)  # the wake-up due at the end has come
    wakes = ticker.between(start, end) or [(0.0, 0.0)]
    stalls = sorted(late for late, _ in wakes)
    return RoundFigures(
        round_ms=(end - start) * 1000,
        cpu_ms=(cpu_end - cpu) * 1000,
        longest_stall_ms=stalls[-1],
        p99_stall_ms=stalls[min(len(stalls) - 1, int(len(stalls) * 0.99))],
        longest_own_ms=max(own for _, own in wakes),
        writes=executor.plans - plans,
        full_collections_ms=collections.between(start, end + 3 * TICK),
    )


@dataclass(frozen=True)
class LoopFigures:
    """Cold and steady rounds of one configuration."""

    cold: RoundFigures
    """The first round of a new leader: nothing read before, every job's status written."""
    steady: list[RoundFigures]
    """The rounds after the first two (the second reads again every job the first
    wrote)."""
    idle: RoundFigures
    """No round, for as long as a steady round: what the ticker sees of the watch and of
    the machine alone (on a busy machine, the process waits for a core too)."""


async def rounds(
    *,
    jobs: int,
    nodes: int,
    pods: int,
    count: int,
    args: MigrationControllerArgs,
    churn: float,
    inline: bool = False,
) -> LoopFigures:
    """`count` rounds (at least 3) of a new leader on the synthetic cluster: on the
    admission thread as the controller runs them, or `inline` on the event loop."""
    sys.setswitchinterval(SWITCH_INTERVAL)  # as the controller sets it
    caches = Caches(cast(Kube, None), args, enqueue=lambda _key: None)
    caches.admission_key = ADMISSION_KEY  # the key the jobs in flight are marked with
    caches, keys = await filled(caches, jobs=jobs, nodes=nodes, pods=pods)
    executor = Answering(caches)
    admission = (Inline if inline else Admission)(
        caches, executor, args, admitted=lambda _key: None
    )
    threads = [threading.get_native_id(), admission.worker.submit(threading.get_native_id).result()]
    queued = Queued(threads)
    ticker, collections = Ticker(queued), Collections()
    tasks = [
        asyncio.create_task(ticker.run()),
        asyncio.create_task(watch(caches, keys, per_second=churn)),
    ]
    try:
        figures = [
            await measure(admission.admit_once, ticker, executor, collections)
            for _ in range(max(count, 3))
        ]
        pause = statistics.median(f.round_ms for f in figures[2:]) / 1000
        idle = await measure(partial(asyncio.sleep, pause), ticker, executor, collections)
    finally:
        for task in tasks:
            task.cancel()
        collections.close()
        queued.close()
        admission.worker.shutdown()
    return LoopFigures(cold=figures[0], steady=figures[2:], idle=idle)


@dataclass(frozen=True)
class LoopRow:
    """The row of `make bench` for the event loop during arbitration rounds."""

    name: str
    """"arbitration round at 10,000 jobs / 5,000 nodes / 50,000 pods"."""
    round_ms: float
    """Median steady round, wall clock, from freezing the caches to the last write."""
    cold_round_ms: float
    """A new leader's first round, wall clock, writing every job's status."""
    longest_block_ms: float
    """The longest the event loop was kept from a timer due, over the cold and the
    steady rounds."""
    p99_block_ms: float
    """The worst round's 99th percentile of it."""
    longest_own_ms: float
    """`longest_block_ms` less the time the loop's and the admission thread waited for a
    core meanwhile: what the process itself kept the loop waiting, on a shared machine."""


def arbitration_loop_row(*, rounds_run: int = 6, churn: float = 1000) -> LoopRow:
    """Run the defaults on 10,000 jobs, 5,000 nodes and 50,000 pods (cold, then steady
    rounds, with `churn` pod updates a second) and sum them up for `make bench`."""
    figures = asyncio.run(
        rounds(
            jobs=10_000,
            nodes=5_000,
            pods=50_000,
            count=rounds_run,
            args=MigrationControllerArgs(),
            churn=churn,
        )
    )
    every = [figures.cold, *figures.steady]
    return LoopRow(
        name="arbitration round at 10,000 jobs / 5,000 nodes / 50,000 pods",
        round_ms=statistics.median(r.round_ms for r in figures.steady),
        cold_round_ms=figures.cold.round_ms,
        longest_block_ms=max(r.longest_stall_ms for r in every),
        p99_block_ms=max(r.p99_stall_ms for r in every),
        longest_own_ms=max(r.longest_own_ms for r in every),
    )


def row(name: str, figures: RoundFigures | list[RoundFigures]) -> str:
    many = figures if isinstance(figures, list) else [figures]
    full = [ms for r in many for ms in r.full_collections_ms]
    return (
        f"{name:<48}{len(many):>4}"
        f"{statistics.median(r.round_ms for r in many):>10.1f}"
        f"{statistics.median(r.cpu_ms for r in many):>8.1f}"
        f"{max(r.longest_stall_ms for r in many):>10.1f}"
        f"{max(r.p99_stall_ms for r in many):>8.1f}"
        f"{max(r.longest_own_ms for r in many):>8.1f}"
        f"{statistics.median(r.writes for r in many):>8.0f}"
        f"{len(full):>5}{max(full, default=0.0):>8.1f}"
    )


HEADER = (
    f"{'rounds':<48}{'n':>4}{'round ms':>10}{'cpu ms':>8}{'stall ms':>10}{'p99 ms':>8}"
    f"{'own ms':>8}"
    f"{'writes':>8}{'gc2':>5}{'gc2 ms':>8}"
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--churn", type=float, default=1000, help="pod updates a second")
    parser.add_argument(
        "--thread-only", action="store_true", help="leave out the rounds run on the loop"
    )
    options = parser.parse_args(argv)
    print(
        f"{options.jobs} jobs, {options.nodes} nodes, {options.pods} pods, "
        f"{options.churn:g} pod updates a second"
    )
    print(HEADER)
    print("-" * len(HEADER))
    configs = [
        ("defaults", MigrationControllerArgs()),
        (
            "no rate limit, nodeFit",
            MigrationControllerArgs.model_validate({"evictQPS": 0, "nodeFit": True}),
        ),
    ]
    for name, args in configs:
        for inline in (False,) if options.thread_only else (False, True):
            figures = asyncio.run(
                rounds(
                    jobs=options.jobs,
                    nodes=options.nodes,
                    pods=options.pods,
                    count=options.rounds,
                    args=args,
                    churn=options.churn,
                    inline=inline,
                )
            )
            mode = "on the loop" if inline else "thread"
            print(row(f"{name}, {mode}, cold", figures.cold))
            print(row(f"{name}, {mode}, steady", figures.steady))
            print(row(f"{name}, {mode}, no round", figures.idle))


if __name__ == "__main__":
    main()
