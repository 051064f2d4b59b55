"""The order in which a round weighs Pending jobs: who goes first when limits are scarce.

An admitted job counts at once against the jobs after it, so the order decides which
jobs a limit lets through. It is the PodMigrationJob design's: higher QoS first, then
higher pod priority, lower eviction cost, fewer past failures of the pod, fewer past
migrations of its workload, fewer of its workload's replicas migrating now; then the
older job, then the name, so that a round is deterministic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from berth.api import PodMigrationJobPhase, keys
from berth.protocol import annotations_of, controlled_key
from berth.scheduling import qos_class
from controller.arbitration.objects import Object, pod_key, same_objects

if TYPE_CHECKING:
    from controller.arbitration.candidates import Candidate, PodFacts

KOORDINATOR_QOS = "koordinator.sh/qosClass"
"""Koordinator's QoS label on a pod: LSE, LSR, LS or BE."""

T = TypeVar("T")

RUN = 1024
"""How many items `sorted_in_steps` sorts in one step."""

_KOORDINATOR_QOS_RANK = {"LSE": 0, "LSR": 1, "LS": 2, "BE": 3}
_KUBE_QOS_RANK = {"Guaranteed": 0, "Burstable": 1, "BestEffort": 2}


def qos_rank(labels: Mapping[str, str], pod: Object) -> int:
    """Higher QoS first: the koordinator.sh/qosClass label (LSE > LSR > LS > BE), where a
    pod without it counts as LS, or BE when it is BestEffort; then the Kubernetes QoS class
    (Guaranteed > Burstable > BestEffort)."""
    kube = qos_class(pod)
    koordinator = _KOORDINATOR_QOS_RANK.get(
        labels.get(KOORDINATOR_QOS, ""), 3 if kube == "BestEffort" else 2
    )
    return 3 * koordinator + _KUBE_QOS_RANK.get(kube, 1)


def first_keys(facts: PodFacts) -> tuple[int, int, int]:
    """The keys read off the pod alone: higher QoS, then priority, then lower cost first."""
    return (facts.qos, -facts.priority, facts.cost)


def last_keys(job: Object) -> tuple[str, str]:
    """The tie breakers: the older job first, then the name."""
    return (job["metadata"].get("creationTimestamp") or "", job["metadata"]["name"])


def sort_key(c: Candidate, history: History, migrating: Mapping[str, int]) -> tuple[Any, ...]:
    """The candidate's place in the order; `migrating` counts Running jobs per workload."""
    workload = c.workload_key
    if workload is None:
        return (*c.rank, history.failures.get(c.key, 0), 0, 0, *c.age)
    return (
        *c.rank,
        history.failures.get(c.key, 0),
        history.migrations.get(workload, 0),
        migrating.get(workload, 0),
        *c.age,
    )


def sorted_in_steps(items: Sequence[T], key: Callable[[T], Any]) -> list[T]:
    """`sorted(items, key=key)`, in steps of at most about `RUN` items each.

    One call of `sorted` is one step of the interpreter: no other thread runs until it
    ends (about 10 ms for 10,000 jobs' sort keys), and a round runs beside the
    controller's event loop. So runs of `RUN` items are sorted, then merged two by two;
    each merge is one step too, and the last one compares about as many keys as there
    are items. The result is the same, and costs about as much in all.
    """
    runs = [sorted(items[start : start + RUN], key=key) for start in range(0, len(items), RUN)]
    while len(runs) > 1:
        pairs = [runs[index : index + 2] for index in range(0, len(runs), 2)]
        runs = [
            sorted([*pair[0], *pair[-1]], key=key) if len(pair) == 2 else pair[0] for pair in pairs
        ]
    return runs[0] if runs else []


class History:
    """What the finished jobs say: failed jobs per pod (namespace/name) and migrations
    per workload (`protocol.controlled_key`), for the order."""

    def __init__(self, jobs: Sequence[Object]) -> None:
        self.jobs = tuple(jobs)
        self.failures: dict[str, int] = defaultdict(int)
        self.migrations: dict[str, int] = defaultdict(int)
        for job in jobs:
            if (job.get("status") or {}).get("phase") == PodMigrationJobPhase.FAILED:
                self.failures[pod_key(job)] += 1
            workload = annotations_of(job).get(keys.WORKLOAD)
            if workload:
                self.migrations[controlled_key(pod_key(job).partition("/")[0], workload)] += 1

    def holds(self, jobs: Sequence[Object]) -> bool:
        """Whether these counts were made from these very objects."""
        return same_objects(jobs, self.jobs)
