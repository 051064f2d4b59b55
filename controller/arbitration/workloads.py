"""A workload as the per-workload limits see it: expected replicas, limits, rollout.

A migration takes a pod away from its workload for a while, so the limits that guard a
workload (maxMigratingPerWorkload, maxUnavailablePerWorkload, expected replicas, a
rollout in progress) read it once per round: how many replicas it should have, how many
are available, what the limits come to for its size, and whether it is rolling out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from berth.eviction import is_healthy
from berth.protocol import is_terminal_pod
from berth.settings import MigrationControllerArgs
from controller.arbitration.objects import Object, object_key

if TYPE_CHECKING:
    from controller.arbitration.round import Snapshot

REPORTS_AVAILABLE = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"})
"""Kinds whose status.availableReplicas Berth reads; for other owners it counts pods."""


@dataclass(slots=True)
class Workload:
    """A workload as the limits see it; `available` drops as its pods are admitted."""

    title: str
    expected: int
    available: int
    max_migrating: int
    max_unavailable: int
    rollout: str | None
    """Why it is rolling out, or None."""


class Workloads:
    """The workloads of one round, each worked out on first use.

    Available replicas come from the workload's status (availableReplicas of a
    Deployment, StatefulSet, ReplicaSet or ReplicationController, which leaves out pods
    not ready and terminating) less its Running jobs' pods, which are on their way out,
    and never more than its replicas less its Running jobs (the status is written a
    moment after a pod starts terminating); this costs nothing per pod. For other owners
    they are counted from the pods.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        last: Mapping[str, tuple[Object, Workload]],
        migrating: Container[str],
    ) -> None:
        self.snapshot, self.last, self.migrating = snapshot, last, migrating
        self.healthy_in_flight: defaultdict[str, int] = defaultdict(int)
        """Per workload (`protocol.controlled_key`, as every count here), Running jobs'
        pods that its status still counts as available."""
        self.in_flight: defaultdict[str, int] = defaultdict(int)
        """Per workload, its Running jobs: each pod is leaving, or its replacement not yet
        running, so at most `expected` less these are available, whatever a status that
        lags behind a pod's deletion still says."""
        self.read: dict[str, tuple[Object, Workload]] = {}
        """Workload → (object, its limits before this round's counts), for the next
        round's memo; only kinds whose status reports availability."""
        self.built: dict[str, Workload] = {}

    def get(self, key: str) -> Workload:
        """The limits and availability in this round of the workload `key`
        (`protocol.controlled_key`: its UID within the namespace of its pods, which are
        found there only, as its object is)."""
        found = self.built.get(key)
        if found is None:
            found = self.built[key] = self._build(key)
        return found

    def _build(self, key: str) -> Workload:
        snapshot, args = self.snapshot, self.snapshot.args
        uid = key.partition("/")[2]
        obj = snapshot.workloads.get(key)
        if obj is None or obj.get("kind") not in REPORTS_AVAILABLE:
            # A finished pod (a Job's, Succeeded) is no replica the workload runs.
            running = [p for p in snapshot.pods_of_workload.get(key, ()) if not is_terminal_pod(p)]
            available = sum(
                1 for pod in running if is_healthy(pod) and object_key(pod) not in self.migrating
            )
            return workload_limits(uid, obj, running, available=available, args=args)
        known = self.last.get(key)
        if known is None or known[0] is not obj:
            available = (obj.get("status") or {}).get("availableReplicas") or 0
            replicas = (obj.get("spec") or {}).get("replicas")
            pods = () if isinstance(replicas, int) else snapshot.pods_of_workload.get(key, ())
            known = (obj, workload_limits(uid, obj, pods, available=available, args=args))
        self.read[key] = known
        w = known[1]
        available = min(
            w.available - self.healthy_in_flight.get(key, 0),
            w.expected - self.in_flight.get(key, 0),
        )
        return replace(w, available=available)


def workload_limits(
    uid: str,
    obj: Object | None,
    pods: Sequence[Object],
    *,
    available: int,
    args: MigrationControllerArgs,
) -> Workload:
    """The workload `uid` (its object, if Berth knows it, and its pods) with `available`
    replicas, and the limits the configuration gives a workload of its size."""
    expected = replicas_of(obj, pods)
    title = f"workload {uid}" if obj is None else f"{obj.get('kind')} {object_key(obj)}"
    return Workload(
        title=title,
        expected=expected,
        available=available,
        max_migrating=max_per_workload(args.max_migrating_per_workload, expected),
        max_unavailable=max_per_workload(args.max_unavailable_per_workload, expected),
        rollout=rollout_of(obj),
    )


def max_per_workload(value: int | str, replicas: int) -> int:
    """maxMigratingPerWorkload / maxUnavailablePerWorkload for a workload of `replicas`.

    A count is taken as it is; a percentage of the replicas is rounded up, as intstr does
    for maxUnavailable. 0 (or 0%) means by size, as GetMaxUnavailable: 10% above 10
    replicas, 2 from 4 to 10, else 1.
    """
    if value in (0, "0%"):
        value = "10%" if replicas > 10 else 2 if replicas >= 4 else 1
    if isinstance(value, str):
        return -(-int(value[:-1]) * replicas // 100)
    return value


def replicas_of(workload: Object | None, pods: Sequence[Object]) -> int:
    """spec.replicas (a Job's spec.parallelism); for an owner Berth does not know, the
    number of its pods."""
    spec = (workload or {}).get("spec") or {}
    for key in ("replicas", "parallelism"):
        if isinstance(spec.get(key), int):
            return int(spec[key])
    return len(pods)


def rollout_of(workload: Object | None) -> str | None:
    """Why the workload is rolling out, or None.

    As `kubectl rollout status` reads it, less its wait for availability (that is
    maxUnavailablePerWorkload's business): the controller has not yet observed the latest
    spec, or (Deployment, StatefulSet) fewer replicas are updated than wanted, or
    (Deployment) old replicas are still there. A StatefulSet's rolling update wants the
    replicas from its partition up updated; one updated OnDelete never rolls out by
    itself (deleting its pods is how its update happens), so it is never waited for.
    """
    if workload is None:
        return None
    metadata, spec = workload["metadata"], workload.get("spec") or {}
    status = workload.get("status") or {}
    generation = metadata.get("generation") or 0
    if (status.get("observedGeneration") or 0) < generation:
        return f"generation {generation} is not observed yet"
    if workload.get("kind") not in ("Deployment", "StatefulSet"):
        return None
    wanted = spec.get("replicas", 1)
    if workload["kind"] == "StatefulSet":
        strategy = spec.get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return None
        partition = (strategy.get("rollingUpdate") or {}).get("partition") or 0
        if isinstance(partition, int) and isinstance(wanted, int):
            wanted = max(wanted - partition, 0)
    updated = status.get("updatedReplicas") or 0
    if updated < wanted:
        return f"{updated} of {wanted} replicas updated"
    old = (status.get("replicas") or 0) - updated
    if workload["kind"] == "Deployment" and old > 0:
        return f"{old} old replicas pending termination"
    return None
