"""Which Pending jobs may start now: first come, first served, within maxMigratingPerNode.

This is the simple admission the job state machine needs to run; full arbitration
(per-workload and PDB limits, sorting, flow control) replaces it behind the same shape:
pending jobs and the world in, one decision per job out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from berth.api import PodMigrationJobPhase, PodMigrationJobReason, keys
from berth.settings import MigrationControllerArgs

Object = dict[str, Any]


@dataclass(frozen=True)
class Decision:
    job: Object
    verdict: str
    """"admit", "wait" or "fail"."""
    reason: str = ""
    message: str = ""
    pod: Object | None = None


def source_node(job: Object) -> str | None:
    return (job["metadata"].get("annotations") or {}).get(keys.SOURCE_NODE)


def admit(*, pending: Iterable[Object], running: Iterable[Object],
          pod_of: Callable[[Object], Object | None],
          args: MigrationControllerArgs) -> list[Decision]:
    """Decide for every pending job, oldest first; admitted jobs count at once."""
    per_node = Counter(node for job in running if (node := source_node(job)))
    decisions = []
    order = sorted(pending, key=lambda job: (job["metadata"].get("creationTimestamp", ""),
                                             job["metadata"]["name"]))
    for job in order:
        if job["spec"].get("paused"):
            continue
        pod = pod_of(job)
        ref = job["spec"]["podRef"]
        if pod is None:
            decisions.append(Decision(job, "fail", PodMigrationJobReason.MISSING_POD,
                                      f"pod {ref.get('namespace')}/{ref.get('name')} not found"))
            continue
        if pod["metadata"].get("deletionTimestamp"):
            decisions.append(Decision(job, "fail", PodMigrationJobReason.FORBIDDEN_MIGRATE_POD,
                                      "the pod is already terminating"))
            continue
        node = pod["spec"].get("nodeName")
        limit = args.max_migrating_per_node
        if node and limit and per_node[node] >= limit:
            decisions.append(Decision(
                job, "wait", "MaxMigratingPerNode",
                f"{per_node[node]} migrations already run on node {node} "
                f"(maxMigratingPerNode {limit})"))
            continue
        if node:
            per_node[node] += 1
        decisions.append(Decision(job, "admit", pod=pod))
    return decisions


def is_pending(job: Object) -> bool:
    phase = (job.get("status") or {}).get("phase") or PodMigrationJobPhase.PENDING
    return bool(phase == PodMigrationJobPhase.PENDING)
