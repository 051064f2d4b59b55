"""The fake nodes of the local control plane: create them, wait until pods can land on them.

A node is created through the API with a few connections in parallel (one `kubectl apply`
of thousands of nodes is throttled by kubectl's own rate limit). It is *schedulable* once
kwok has made it Ready and it carries no not-ready taint (the node lifecycle controller of
kube-controller-manager taints a node whose Ready condition is False or Unknown, and lifts
the taint once it is Ready): kube-scheduler places pods there. The wait follows the nodes
with a watch (an informer), reports progress now and then, and gives up after a time that
grows with the number of nodes, naming the nodes still missing and what they miss.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from berth.kube.client import NODES, Kube, KubeError, Object
from berth.kube.informer import Informer
from devtools.processes import ClusterError

# Taints the control plane puts on a node that is not (or no longer) Ready.
NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})

CONNECTIONS = 8
"""Creates in flight at once: enough to keep the API server busy on two cores."""

BASE_WAIT = 60.0
PER_NODE_WAIT = 0.1
"""Seconds allowed per node, beyond the base. On two cores shared with other work, nodes
became schedulable at 25 to 80 a second (0.01 to 0.04 s each): the wait allows several
times that before it calls the start a failure."""

PROGRESS_EVERY = 2.0
"""At most one progress line per this many seconds; a wait shorter than this prints none."""

POLL_INTERVAL = 0.2
"""How often the informer's cache is counted (a local read, no API call)."""

Report = Callable[[str], None]


def wait_budget(nodes: int) -> float:
    """How long `up` waits for `nodes` fake nodes to be created and schedulable."""
    return BASE_WAIT + PER_NODE_WAIT * nodes


def is_ready(node: Object) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_schedulable(node: Object) -> bool:
    """Ready, and no longer tainted as not ready: kube-scheduler places pods on it."""
    taints = (node.get("spec") or {}).get("taints") or ()
    return is_ready(node) and not any(t.get("key") in NOT_READY_TAINTS for t in taints)


@dataclass(frozen=True)
class Tally:
    """How far the wanted nodes have come."""

    wanted: int
    created: int
    ready: int
    schedulable: int

    @property
    def done(self) -> bool:
        return self.schedulable == self.wanted

    def line(self, elapsed: float) -> str:
        return (
            f"nodes: {self.created}/{self.wanted} created, {self.ready}/{self.wanted} Ready, "
            f"{self.schedulable}/{self.wanted} schedulable ({elapsed:.0f}s)"
        )


def tally(names: Sequence[str], nodes: Mapping[str, Object]) -> Tally:
    """Count the nodes of `names` that exist in `nodes` (name -> Node), are Ready and are
    schedulable."""
    found = [nodes[name] for name in names if name in nodes]
    return Tally(
        wanted=len(names),
        created=len(found),
        ready=sum(is_ready(node) for node in found),
        schedulable=sum(is_schedulable(node) for node in found),
    )


def sample(names: Iterable[str], shown: int = 5) -> str:
    """`a, b, c and 12 more`: a few names of a possibly long list."""
    names = list(names)
    head = ", ".join(names[:shown])
    return f"{head} and {len(names) - shown} more" if len(names) > shown else head


def missing(names: Sequence[str], nodes: Mapping[str, Object]) -> str:
    """What the wanted nodes that are not schedulable still lack, by stage."""
    absent = [name for name in names if name not in nodes]
    not_ready = [name for name in names if name in nodes and not is_ready(nodes[name])]
    tainted = [
        name
        for name in names
        if name in nodes and is_ready(nodes[name]) and not is_schedulable(nodes[name])
    ]
    parts = []
    if absent:
        parts.append(f"{len(absent)} not created ({sample(absent)})")
    if not_ready:
        parts.append(f"{len(not_ready)} not Ready, which kwok makes them ({sample(not_ready)})")
    if tainted:
        parts.append(
            f"{len(tainted)} Ready but still tainted not-ready, a taint kube-controller-manager "
            f"lifts ({sample(tainted)})"
        )
    return "; ".join(parts)


class Throttle:
    """Says when a progress line is due: at most once per `every` seconds."""

    def __init__(self, every: float, start: float) -> None:
        self.every = every
        self.last = start

    def due(self, now: float) -> bool:
        if now - self.last < self.every:
            return False
        self.last = now
        return True


async def create_and_wait(
    kubeconfig: Path, manifests: Sequence[Object], *, timeout: float, report: Report
) -> None:
    """Create the nodes and wait until every one is schedulable; fail after `timeout`
    seconds, saying which nodes are missing what."""
    names = [node["metadata"]["name"] for node in manifests]
    kube = await Kube.connect(kubeconfig)
    # Cluster-scoped: the informer's keys are the node names.
    informer = Informer(kube, NODES)
    watching = asyncio.create_task(informer.run())
    creating = asyncio.create_task(_create_all(kube, manifests))
    try:
        await _wait(names, informer, creating, timeout=timeout, report=report)
    finally:
        for task in (watching, creating):
            task.cancel()
        await asyncio.gather(watching, creating, return_exceptions=True)
        await kube.close()


async def _create_all(kube: Kube, manifests: Sequence[Object]) -> None:
    pending = iter(manifests)

    async def worker() -> None:
        for node in pending:  # shared: each worker takes the next node not yet taken
            try:
                await kube.create(NODES, node)
            except KubeError as error:
                raise ClusterError(
                    f"creating node {node['metadata']['name']} failed: {error}"
                ) from error

    await asyncio.gather(*(worker() for _ in range(CONNECTIONS)))


async def _wait(
    names: Sequence[str],
    informer: Informer,
    creating: asyncio.Task[None],
    *,
    timeout: float,
    report: Report,
) -> None:
    started = time.monotonic()
    throttle = Throttle(PROGRESS_EVERY, start=started)
    while True:
        if creating.done():
            creating.result()  # a failed create ends the wait with its error
        now = time.monotonic()
        count = tally(names, informer.store)
        if informer.synced.is_set() and count.done:
            break
        if now - started > timeout:
            raise ClusterError(
                f"{len(names) - count.schedulable} of {len(names)} nodes were not schedulable "
                f"after {timeout:.0f}s: {missing(names, informer.store)}"
            )
        if throttle.due(now):
            report(count.line(now - started))
        await asyncio.sleep(POLL_INTERVAL)
    if now - started >= PROGRESS_EVERY:
        report(count.line(now - started))
