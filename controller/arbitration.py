"""Arbitration: which Pending PodMigrationJobs may start now, and why the others may not.

Each migration is a risk to the workload whose pod it moves, so jobs do not start as they
arrive. Every round the controller weighs all Pending jobs together, as the PodMigrationJob
design describes:

1. **Forbid.** A job whose pod is gone fails (MissingPod); a job for a pod Berth must
   never move fails (ForbiddenMigratePod, the message names the rule): eviction cost
   MaxInt32, DaemonSet, static, bare, terminating, local storage, and the other
   evictability checks of the MigrationController. Waiting would not change them.
2. **Sort** the others: QoS, pod priority, eviction cost, past failures of the pod, past
   migrations of its workload, replicas of its workload migrating now; then the oldest.
3. **Limit.** In that order a job is admitted if every limit still holds (rollouts,
   expected replicas, PodDisruptionBudgets, per workload, per node, per namespace, in the
   cluster, object limiters, rate limits); if one does not, the job waits and its status
   says which.
   An admitted job counts at once against the jobs after it. A Pending job never counts
   against anything: only Running jobs and jobs admitted earlier in the round do, so
   N jobs for a node that has room for two admit exactly two, never none.

`arbitrate` is pure: it reads a `Snapshot` of what the informers hold and returns
decisions, which the controller writes. All counts come from the API objects (a Running
job carries the source node, pod UID and workload written when it was admitted), so a new
leader arbitrates exactly like the old one. Only the rate limiters have no place in the
API: their state goes in and out as `LimiterState`, and a new leader starts them full.

A round looks at every Pending job, so it touches each job's pod once, builds its indexes
(counts per node, namespace and workload, PDBs by label) once, and sorts once: its cost
grows with the jobs, not with jobs times pods or PDBs. Most of what it reads does not
change from one round to the next, so a round hands a `Memo` to the next: what it read
from each job, pod, workload, PDB and finished job, reused only for the very same objects
(the informers replace an object whenever it changes). See bench/README.md.
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from operator import attrgetter
from typing import Any, Literal, NamedTuple

from berth.api import PodMigrationJobMode, PodMigrationJobPhase, PodMigrationJobReason, keys
from berth.eviction import eviction_cost, forbidden, is_healthy
from berth.resources import Resources, fits, format_quantity, pod_requests
from berth.scheduling import (
    node_affinity_matches,
    node_schedulable,
    parse_selector,
    qos_class,
    selector_matches,
    taints_tolerated,
)
from berth.settings import MigrationControllerArgs, ObjectLimiterKind

Object = Mapping[str, Any]
Verdict = Literal["admit", "wait", "fail"]

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""Priority of the built-in system-cluster-critical class; at or above it a pod is critical."""
KOORDINATOR_QOS = "koordinator.sh/qosClass"


class WaitReason(StrEnum):
    """Why a job stays Pending this round: each names its rule, mostly by its config key."""

    NODE_FIT = "NodeFit"
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    EXPECTED_REPLICAS = "ExpectedReplicas"
    BLOCKED_BY_PDB = PodMigrationJobReason.BLOCKED_BY_PDB.value
    MAX_MIGRATING_PER_WORKLOAD = "MaxMigratingPerWorkload"
    MAX_UNAVAILABLE_PER_WORKLOAD = "MaxUnavailablePerWorkload"
    MAX_MIGRATING_PER_NODE = "MaxMigratingPerNode"
    MAX_MIGRATING_PER_NAMESPACE = "MaxMigratingPerNamespace"
    MAX_MIGRATING_GLOBALLY = "MaxMigratingGlobally"
    OBJECT_LIMITERS = "ObjectLimiters"
    EVICT_QPS = "EvictQPS"
    FLOW_CONTROL_QPS = "FlowControlQPS"


class Decision(NamedTuple):
    """What becomes of one Pending job this round."""

    job: Object
    verdict: Verdict
    reason: str = ""
    message: str = ""
    pod: Object | None = None


@dataclass(frozen=True)
class TokenBucket:
    """A token bucket as of `updated`; a new bucket is full."""

    tokens: float = math.inf
    updated: datetime | None = None

    def refilled(self, *, qps: float, burst: int, now: datetime) -> float:
        """Tokens at `now`: one more every 1/qps seconds, never more than `burst`."""
        elapsed = 0.0 if self.updated is None else max(0.0, (now - self.updated).total_seconds())
        return min(float(burst), self.tokens + elapsed * qps)


@dataclass(frozen=True)
class LimiterState:
    """The rate limiters, carried from one round to the next by the caller."""

    evictions: TokenBucket = TokenBucket()
    """evictQPS/evictBurst."""
    admissions: TokenBucket = TokenBucket()
    """flowControlQPS/flowControlBurst."""
    workload_admissions: Mapping[str, tuple[datetime, ...]] = field(default_factory=dict)
    """objectLimiters.workload: when jobs of each workload (by UID) were admitted, within
    the window."""


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """Everything one round looks at: API objects as the API server sends them."""

    pending: Sequence[Object]
    """PodMigrationJobs in phase Pending (paused ones are skipped)."""
    in_flight: Sequence[Object]
    """PodMigrationJobs in phase Running."""
    history: Sequence[Object] = ()
    """Finished PodMigrationJobs (Succeeded, Failed, Aborted), for sorting."""
    pods: Mapping[str, Object]
    """Pods by "namespace/name"."""
    workload_of: Mapping[str, str]
    """Controller UID → UID of the workload above it (a ReplicaSet's Deployment); any
    other controller is its own workload, and a pod's workload is its controller's."""
    workloads: Mapping[str, Object] = field(default_factory=dict)
    """Workload UID → the workload object; its spec.replicas is the expected replicas."""
    pods_of_workload: Mapping[str, Sequence[Object]] = field(default_factory=dict)
    """Workload UID → its pods; read only for owners whose status reports no
    availableReplicas."""
    pdbs: Sequence[Object] = ()
    """PodDisruptionBudgets (policy/v1)."""
    nodes: Mapping[str, Object] = field(default_factory=dict)
    """Nodes by name; only nodeFit reads them."""
    free: Mapping[str, Resources] = field(default_factory=dict)
    """Node name → allocatable minus the requests of its pods; only nodeFit reads it."""
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    """PriorityClass name → value; only priorityThreshold.name reads it."""
    args: MigrationControllerArgs
    limiter: LimiterState = LimiterState()
    memo: Memo | None = None
    """What the last round worked out (`Arbitration.memo`), to reuse what has not
    changed; None works everything out afresh, to the same decisions."""
    now: datetime


@dataclass(frozen=True)
class Arbitration:
    decisions: list[Decision]
    """One per Pending job that is not paused."""
    limiter: LimiterState
    """The rate limiters after this round, for the next."""
    memo: Memo
    """What this round worked out, for the next round's `Snapshot.memo`."""


@dataclass(frozen=True)
class Memo:
    """What a round read from objects that may not change before the next round.

    The informers replace an object whenever it changes, so a reading is reused only
    while the very same objects (and the very same configuration) come back: the pod's
    facts, and for each Pending job whether its pod is forbidden to migrate and its place
    in the order. A round with a memo decides exactly as one without; it only reads less.
    """

    args: MigrationControllerArgs | None = None
    priority_threshold: int | None = None
    jobs: Mapping[int, _Candidate] = field(default_factory=dict)
    """The id of a job object → what was read of it and its pod."""
    facts: Mapping[str, tuple[Object, PodFacts]] = field(default_factory=dict)
    """Pod UID → (pod object, its facts), for pods of Running jobs."""
    workloads: Mapping[str, tuple[Object, _Workload]] = field(default_factory=dict)
    """Workload UID → (workload object, its limits before this round's counts)."""
    pdbs: _PdbIndex | None = None
    """The PDBs by label, and which ones cover the pods seen."""
    history: _History = field(default_factory=lambda: _History(()))
    """Past failures of each pod and past migrations of each workload."""


def arbitrate(snapshot: Snapshot) -> Arbitration:
    """Decide for every Pending, unpaused job: admit, wait (with the reason), or fail.

    With `arbitrationArgs.enabled: false` every job is admitted with no limit, order or
    rate, except that a missing pod or a pod Berth must never move still fails the job:
    those checks say what Berth may touch, not how fast.
    """
    round_ = _Round(snapshot)
    decisions: list[Decision] = []
    candidates = round_.candidates(snapshot.pending, failed=decisions)
    if not snapshot.args.arbitration_args.enabled:
        round_.decide(candidates, limited=False, into=decisions)
        return Arbitration(decisions, snapshot.limiter, round_.memo())
    candidates.sort(key=attrgetter("order"))
    round_.decide(candidates, limited=True, into=decisions)
    return Arbitration(decisions, round_.limiter(), round_.memo())


# ----- candidates, workloads and the round ------------------------------------------------


@dataclass(slots=True)
class _Workload:
    """A workload as the limits see it; `available` drops as its pods are admitted."""

    title: str
    expected: int
    available: int
    max_migrating: int
    max_unavailable: int
    rollout: str | None
    """Why it is rolling out, or None."""


class PodFacts:
    """What the checks and the order read of one pod, worked out once per version of it.

    The informers replace a pod's object whenever it changes, so these are kept from one
    round to the next beside the very object they were read from (`Memo`) and read again
    only for a new object. Nothing here depends on the configuration.
    """

    __slots__ = (
        "bypass",
        "controller",
        "cost",
        "healthy",
        "key",
        "label_set",
        "labels",
        "local_storage",
        "namespace",
        "node",
        "priority",
        "priority_class",
        "pvc",
        "qos",
        "scheduler",
        "spec",
        "uid",
    )

    def __init__(self, pod: Object) -> None:
        metadata: Object = pod["metadata"]
        self.spec: Object = (spec := pod.get("spec") or {})
        self.namespace: str = metadata["namespace"]
        self.key = f"{self.namespace}/{metadata['name']}"
        self.uid: str = metadata["uid"]
        self.labels: Mapping[str, str] = (labels := metadata.get("labels") or {})
        self.label_set = frozenset(labels.items())
        annotations: Mapping[str, str] = metadata.get("annotations") or {}
        owners: Sequence[Object] = metadata.get("ownerReferences") or ()
        self.controller: str | None = next(
            (ref["uid"] for ref in owners if ref.get("controller")), None
        )
        """The UID of the pod's controller, if it has one."""
        self.node: str = spec.get("nodeName") or ""
        self.cost = eviction_cost(annotations)
        self.priority: int = spec.get("priority") or 0
        self.priority_class: str = spec.get("priorityClassName") or ""
        self.scheduler: str = spec.get("schedulerName") or "default-scheduler"
        self.healthy = is_healthy(pod)
        self.bypass = keys.DESCHEDULER_EVICT in annotations
        self.qos = _qos_rank(labels, pod)
        self.local_storage: str | None = None
        """Why the pod's data would stay behind (emptyDir, hostPath), or None."""
        self.pvc: str | None = None
        """Which volume is a PersistentVolumeClaim (generic ephemeral ones are too), or None."""
        for volume in spec.get("volumes") or ():
            for kind in ("emptyDir", "hostPath"):
                if kind in volume and self.local_storage is None:
                    self.local_storage = f"{kind} volume {volume.get('name')}"
            if ("persistentVolumeClaim" in volume or "ephemeral" in volume) and self.pvc is None:
                self.pvc = f"volume {volume.get('name')}"


class _Candidate(PodFacts):
    """A Pending job whose pod exists: the job, its pod and the pod's facts, whether the
    pod is forbidden to migrate (`failure`), and (set each round) its workload and place
    in the order. What is read of the job and pod holds while they are these very objects
    (and the configuration the same).

    `healthy` means Running, Ready and not terminating (its eviction takes a replica away);
    `bypass` means the pod carries descheduler.alpha.kubernetes.io/evict, which lifts the
    limits.
    """

    __slots__ = (
        "age",
        "failure",
        "job",
        "order",
        "pdbs",
        "pod",
        "rank",
        "reservation_first",
        "rules",
        "workload",
        "workload_uid",
    )

    def __init__(self, job: Object, *, pod: Object) -> None:
        super().__init__(pod)
        self.job, self.pod = job, pod
        self.reservation_first = (job.get("spec") or {}).get("mode") != _EVICT_DIRECTLY
        self.rules = 2 * self.bypass + self.reservation_first
        """Which checks apply (`_Round.checks`): the pod lifts the retryable limits, the job
        reserves first."""
        self.rank = (self.qos, -self.priority, self.cost)
        """The first keys of the order: higher QoS, then priority, then lower cost first."""
        self.age = (job["metadata"].get("creationTimestamp") or "", job["metadata"]["name"])
        """The last keys: the older job first, then the name."""
        self.failure: Decision | None = None
        self.workload_uid: str | None = None
        self.workload: _Workload | None = None
        self.order: tuple[Any, ...] = ()
        self.pdbs: tuple[_PdbIndex, list[tuple[str, Object]]] | None = None
        """The PDB index last asked, and the PDBs it said cover the pod."""


_EVICT_DIRECTLY = PodMigrationJobMode.EVICT_DIRECTLY.value


class _Round:
    """Indexes built once per round, and the counts that grow as jobs are admitted."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.args = args = snapshot.args
        threshold = args.priority_threshold
        self.priority_threshold: int | None = None
        """priorityThreshold's value; None when it names a PriorityClass that is missing."""
        if threshold is not None:
            self.priority_threshold = (
                threshold.value
                if threshold.name is None
                else snapshot.priority_classes.get(threshold.name)
            )
        last = snapshot.memo
        if (
            last is None
            or last.args is not args
            or last.priority_threshold != self.priority_threshold
        ):
            last = Memo()
        self.last = last
        """What the last round read; only the parts read from the same objects are used."""
        self.known: dict[int, _Candidate] = {}
        self.facts: dict[str, tuple[Object, PodFacts]] = {}
        self.workload_limits: dict[str, tuple[Object, _Workload]] = {}
        """What this round read, for the next."""
        self.migrating: set[str] = set()
        """Pods (namespace/name) of Running jobs and of jobs admitted this round."""
        self.total = 0
        """Running jobs and jobs admitted this round."""
        self.per_node: defaultdict[str, int] = defaultdict(int)
        self.per_namespace: defaultdict[str, int] = defaultdict(int)
        self.per_workload: defaultdict[str, int] = defaultdict(int)
        self.healthy_in_flight: defaultdict[str, int] = defaultdict(int)
        """Per workload, Running jobs' pods that its status still counts as available."""
        self.workloads: dict[str, _Workload] = {}
        self.pdbs = (
            last.pdbs
            if last.pdbs is not None and last.pdbs.holds(snapshot.pdbs)
            else _PdbIndex(snapshot.pdbs)
        )
        self.left = dict(self.pdbs.allowed)
        """PDB namespace/name → disruptions still to be had this round."""
        for job in snapshot.in_flight:
            self._count_in_flight(job)
        self.history = (
            last.history if last.history.holds(snapshot.history) else _History(snapshot.history)
        )
        self.failures, self.migrations = self.history.failures, self.history.migrations
        self.label_selector = (
            args.label_selector.model_dump(mode="json", exclude_none=True)
            if args.label_selector
            else {}
        )
        self.node_fit = _NodeFit(snapshot) if args.node_fit else None
        self.object_limiter = (args.object_limiters or {}).get(ObjectLimiterKind.WORKLOAD)
        self.window = _recent(
            snapshot.limiter.workload_admissions,
            now=snapshot.now,
            duration=self.object_limiter.duration if self.object_limiter else None,
        )
        """objectLimiters.workload: admissions of each workload within the window."""
        self.evict_tokens = snapshot.limiter.evictions.refilled(
            qps=args.evict_qps, burst=args.evict_burst, now=snapshot.now
        )
        self.flow_tokens = snapshot.limiter.admissions.refilled(
            qps=args.flow_control_qps or 0.0, burst=args.flow_control_burst or 1, now=snapshot.now
        )
        self.evict_qps_wait: _Wait = (
            WaitReason.EVICT_QPS,
            (
                f"eviction rate limit reached (evictQPS {args.evict_qps:g}, "
                f"evictBurst {args.evict_burst})"
            ),
        )
        self.flow_control_wait: _Wait = (
            WaitReason.FLOW_CONTROL_QPS,
            (
                f"arbitration rate limit reached (flowControlQPS {args.flow_control_qps or 0:g}, "
                f"flowControlBurst {args.flow_control_burst or 1})"
            ),
        )
        self.forbid = _forbid_checks(args)
        safety, limits = _limit_checks(args)
        self.checks = [
            tuple(
                check
                for check in safety + limits
                if not (bypass and check in _BYPASSED)
                and not (reservation_first and check is _too_few_replicas)
            )
            for bypass in (False, True)
            for reservation_first in (False, True)
        ]
        """The checks for a job, by `_Candidate.rules`."""

    def _count_in_flight(self, job: Object) -> None:
        """Count a Running job against its node, namespace, workload and PDBs."""
        key = _pod_key(job)
        annotations = _annotations(job)
        pod = self.snapshot.pods.get(key)
        if (
            pod is not None
            and annotations.get(keys.POD_UID, pod["metadata"]["uid"]) != pod["metadata"]["uid"]
        ):
            pod = None  # a new pod of the same name: the job's pod is gone
        facts = self.facts_of(pod) if pod is not None else None
        node = annotations.get(keys.SOURCE_NODE) or (facts.node if facts else None)
        workload = annotations.get(keys.WORKLOAD) or (
            self.workload_uid(facts.controller) if facts else None
        )
        self.migrating.add(key)
        self.total += 1
        if node:
            self.per_node[node] += 1
        self.per_namespace[key.partition("/")[0]] += 1
        if workload:
            self.per_workload[workload] += 1
        if pod is None or facts is None or not facts.healthy:
            return
        if workload:
            self.healthy_in_flight[workload] += 1
        name = pod["metadata"]["name"]
        for key, pdb in self.pdbs.covering(facts.namespace, facts.labels, facts.label_set):
            if name not in ((pdb.get("status") or {}).get("disruptedPods") or {}):
                self.left[key] -= 1

    def candidates(self, pending: Sequence[Object], *, failed: list[Decision]) -> list[_Candidate]:
        """The unpaused jobs as candidates, each with its workload and its place in the
        design's order: QoS, priority, eviction cost, past failures of the pod, past
        migrations of the workload, replicas migrating now; then the older job, the name.
        The jobs that fail at once go to `failed`.

        A round reads every Pending job, so this loop keeps to local names and reuses
        what the last round read from the same job and pod objects (found by identity:
        the memo holds them, so no other object can take their id).
        """
        last, known_now, pods = self.last.jobs, self.known, self.snapshot.pods
        workload_uid, workloads, workload = self.workload_uid, self.workloads, self.workload
        failures, migrations, per_workload = self.failures, self.migrations, self.per_workload
        candidates: list[_Candidate] = []
        for job in pending:
            c = last.get(id(job))
            if c is None or c.job is not job or pods.get(c.key) is not c.pod:
                if (job.get("spec") or {}).get("paused"):
                    continue
                key = _pod_key(job)
                pod = pods.get(key)
                if pod is None:
                    failed.append(
                        Decision(
                            job, "fail", PodMigrationJobReason.MISSING_POD, f"pod {key} not found"
                        )
                    )
                    continue
                c = self._read(job, pod)
            known_now[id(job)] = c
            if c.failure is not None:
                failed.append(c.failure)
                continue
            c.workload_uid = uid = workload_uid(c.controller)
            if uid:
                c.workload = workloads.get(uid) or workload(uid)
                c.order = (
                    *c.rank,
                    failures.get(c.key, 0),
                    migrations.get(uid, 0),
                    per_workload.get(uid, 0),
                    *c.age,
                )
            else:
                c.workload = None
                c.order = (*c.rank, failures.get(c.key, 0), 0, 0, *c.age)
            candidates.append(c)
        return candidates

    def _read(self, job: Object, pod: Object) -> _Candidate:
        """The job as a candidate, and whether its pod is forbidden to migrate."""
        c = _Candidate(job, pod=pod)
        message = forbidden(pod, evict_failed_bare_pods=self.args.evict_failed_bare_pods)
        for check in self.forbid:
            if message is not None:
                break
            message = check(c, self)
        if message is not None:
            c.failure = Decision(
                job, "fail", PodMigrationJobReason.FORBIDDEN_MIGRATE_POD, message, pod
            )
        return c

    def workload_uid(self, controller: str | None) -> str | None:
        """The workload of a pod with this controller: the one above the controller, or
        the controller itself."""
        return self.snapshot.workload_of.get(controller, controller) if controller else None

    def facts_of(self, pod: Object) -> PodFacts:
        """The pod's facts, read again only from an object the last round did not see."""
        uid = pod["metadata"]["uid"]
        known = self.last.facts.get(uid)
        if known is None or known[0] is not pod:
            known = (pod, PodFacts(pod))
        self.facts[uid] = known
        return known[1]

    def memo(self) -> Memo:
        return Memo(
            args=self.args,
            priority_threshold=self.priority_threshold,
            jobs=self.known,
            facts=self.facts,
            workloads=self.workload_limits,
            pdbs=self.pdbs,
            history=self.history,
        )

    def workload(self, uid: str) -> _Workload:
        """The workload's limits and availability, worked out on first use in the round."""
        found = self.workloads.get(uid)
        if found is None:
            found = self.workloads[uid] = self._build_workload(uid)
        return found

    def _build_workload(self, uid: str) -> _Workload:
        """Expected replicas, limits, rollout and available replicas.

        Available replicas come from the workload's status (availableReplicas of a
        Deployment, StatefulSet, ReplicaSet or ReplicationController, which leaves out
        pods not ready and terminating) less its Running jobs' pods, which are on their way
        out; this costs nothing per pod. For other owners they are counted from the pods.
        """
        obj = self.snapshot.workloads.get(uid)
        if obj is None or obj.get("kind") not in _REPORTS_AVAILABLE:
            pods = self.snapshot.pods_of_workload.get(uid, ())
            return self._limits(
                uid,
                obj,
                pods,
                available=sum(
                    1 for pod in pods if is_healthy(pod) and _object_key(pod) not in self.migrating
                ),
            )
        known = self.last.workloads.get(uid)
        if known is None or known[0] is not obj:
            available = (obj.get("status") or {}).get("availableReplicas") or 0
            replicas = (obj.get("spec") or {}).get("replicas")
            pods = () if isinstance(replicas, int) else self.snapshot.pods_of_workload.get(uid, ())
            known = (obj, self._limits(uid, obj, pods, available=available))
        self.workload_limits[uid] = known
        w = known[1]
        return _Workload(
            w.title,
            w.expected,
            w.available - self.healthy_in_flight.get(uid, 0),
            w.max_migrating,
            w.max_unavailable,
            w.rollout,
        )

    def _limits(
        self, uid: str, obj: Object | None, pods: Sequence[Object], *, available: int
    ) -> _Workload:
        expected = _replicas_of(obj, pods)
        title = f"workload {uid}" if obj is None else f"{obj.get('kind')} {_object_key(obj)}"
        args = self.args
        return _Workload(
            title=title,
            expected=expected,
            available=available,
            max_migrating=max_per_workload(args.max_migrating_per_workload, expected),
            max_unavailable=max_per_workload(args.max_unavailable_per_workload, expected),
            rollout=_rollout_of(obj),
        )

    def covering(self, c: _Candidate) -> list[tuple[str, Object]]:
        """The PDBs covering the candidate's pod, kept on it while the index is the same."""
        known = c.pdbs
        if known is None or known[0] is not self.pdbs:
            known = c.pdbs = (self.pdbs, self.pdbs.covering(c.namespace, c.labels, c.label_set))
        return known[1]

    def decide(
        self, candidates: Sequence[_Candidate], *, limited: bool, into: list[Decision]
    ) -> None:
        """In turn, admit each candidate whose checks all pass (`limited`; else every
        one), counting it at once; the others wait with the first check that failed."""
        checks = self.checks if limited else [()] * len(self.checks)
        migrating = self.migrating
        for c in candidates:
            if c.key in migrating:
                into.append(
                    Decision(
                        c.job,
                        "fail",
                        PodMigrationJobReason.FORBIDDEN_MIGRATE_POD,
                        f"pod {c.key} is already being migrated by another job",
                        c.pod,
                    )
                )
                continue
            for check in checks[c.rules]:
                found = check(c, self)
                if found is not None:
                    into.append(Decision(c.job, "wait", found[0], found[1], c.pod))
                    break
            else:
                self._count(c)
                into.append(Decision(c.job, "admit", pod=c.pod))

    def _count(self, c: _Candidate) -> None:
        """An admitted job counts at once against every limit for the rest of the round."""
        self.migrating.add(c.key)
        self.total += 1
        self.per_node[c.node] += 1
        self.per_namespace[c.namespace] += 1
        if c.workload_uid and c.workload:
            self.per_workload[c.workload_uid] += 1
            c.workload.available -= c.healthy
            if self.object_limiter is not None:
                self.window.setdefault(c.workload_uid, []).append(self.snapshot.now)
        if c.healthy:
            for key, _ in self.covering(c):
                self.left[key] -= 1
        self.evict_tokens -= 1
        self.flow_tokens -= 1

    def limiter(self) -> LimiterState:
        """The rate limiters' state to hand to the next round."""
        now, args = self.snapshot.now, self.args
        return LimiterState(
            evictions=TokenBucket(self.evict_tokens, now) if args.evict_qps else TokenBucket(),
            admissions=(
                TokenBucket(self.flow_tokens, now) if args.flow_control_qps else TokenBucket()
            ),
            workload_admissions={uid: tuple(times) for uid, times in self.window.items()},
        )


_REPORTS_AVAILABLE = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"})


def _recent(
    admissions: Mapping[str, tuple[datetime, ...]], *, now: datetime, duration: timedelta | None
) -> dict[str, list[datetime]]:
    """The admissions within the last `duration`; none without an object limiter."""
    if duration is None:
        return {}
    recent = {
        uid: [moment for moment in times if moment > now - duration]
        for uid, times in admissions.items()
    }
    return {uid: times for uid, times in recent.items() if times}


# ----- forbidden pods: the job fails ------------------------------------------------------

_Forbid = Callable[[_Candidate, _Round], str | None]


def _namespace(c: _Candidate, r: _Round) -> str | None:
    """namespaces.include is checked before namespaces.exclude."""
    namespaces = r.args.namespaces
    namespace = c.namespace
    if namespaces and namespaces.include and namespace not in namespaces.include:
        return f"namespace {namespace} is not in namespaces.include"
    if namespaces and namespaces.exclude and namespace in namespaces.exclude:
        return f"namespace {namespace} is in namespaces.exclude"
    return None


def _label_selector(c: _Candidate, r: _Round) -> str | None:
    """Only pods matching labelSelector migrate."""
    return (
        None if selector_matches(r.label_selector, c.labels) else "pod does not match labelSelector"
    )


def _system_critical(c: _Candidate, r: _Round) -> str | None:
    """System-critical pods (priority 2000000000 and above, or a system-* PriorityClass)
    stay unless evictSystemCriticalPods."""
    if c.priority >= SYSTEM_CRITICAL_PRIORITY or c.priority_class.startswith("system-"):
        return "pod is system-critical (evictSystemCriticalPods allows it)"
    return None


def _priority_threshold(c: _Candidate, r: _Round) -> str | None:
    """Only pods with a priority below priorityThreshold migrate. A threshold naming a
    PriorityClass that does not exist lets no pod through, and says so."""
    threshold = r.priority_threshold
    if threshold is None:
        name = r.args.priority_threshold.name if r.args.priority_threshold else None
        return f"PriorityClass {name} of priorityThreshold.name does not exist"
    if c.priority >= threshold:
        return f"pod priority {c.priority} is not below priorityThreshold {threshold}"
    return None


def _local_storage(c: _Candidate, r: _Round) -> str | None:
    """emptyDir and hostPath data stay behind on the node, unless evictLocalStoragePods."""
    if c.local_storage is None:
        return None
    return f"pod uses local storage ({c.local_storage}; evictLocalStoragePods allows it)"


def _pvc(c: _Candidate, r: _Round) -> str | None:
    """ignorePvcPods keeps pods with PersistentVolumeClaims (generic ephemeral volumes are
    claims too) where they are."""
    if c.pvc is None:
        return None
    return f"pod uses a PersistentVolumeClaim ({c.pvc}; ignorePvcPods)"


def _scheduler_name(c: _Candidate, r: _Round) -> str | None:
    """A ReservationFirst job reserves through the pod's own scheduler, which must be one
    of schedulerNames; an EvictDirectly job reserves nothing."""
    name = c.scheduler
    if not c.reservation_first or name in r.args.scheduler_names:
        return None
    return (
        f"pod's scheduler {name} is not in schedulerNames "
        f"({', '.join(r.args.scheduler_names)}); use EvictDirectly or add it"
    )


def _forbid_checks(args: MigrationControllerArgs) -> tuple[_Forbid, ...]:
    """The evictability checks, less those the configuration turns off.

    evictSystemCriticalPods lifts priorityThreshold too: it allows "pods of any priority".
    """
    checks: list[_Forbid] = []
    if args.namespaces and (args.namespaces.include or args.namespaces.exclude):
        checks.append(_namespace)
    if args.label_selector is not None:
        checks.append(_label_selector)
    threshold = args.priority_threshold
    if not args.evict_system_critical_pods:
        checks.append(_system_critical)
        if threshold is not None and (threshold.value is not None or threshold.name):
            checks.append(_priority_threshold)
    if not args.evict_local_storage_pods:
        checks.append(_local_storage)
    if args.ignore_pvc_pods:
        checks.append(_pvc)
    checks.append(_scheduler_name)
    return tuple(checks)


# ----- limits: the job waits --------------------------------------------------------------

_Wait = tuple[str, str]
_Check = Callable[[_Candidate, _Round], _Wait | None]


def _node_fit(c: _Candidate, r: _Round) -> _Wait | None:
    """nodeFit: some other node must be able to take the pod now (see `_NodeFit`)."""
    if r.node_fit is None or r.node_fit.fits_elsewhere(c):
        return None
    requests = ", ".join(
        f"{name} {format_quantity(name, value)}"
        for name, value in sorted(pod_requests(c.spec).items())
    )
    return WaitReason.NODE_FIT, (
        "no other node fits the pod (nodeFit): none is Ready and schedulable, matches "
        "nodeSelector and the pod's node selector and affinity, tolerates its taints and "
        f"has {requests or 'its requests'} free"
    )


def _rollout_in_progress(c: _Candidate, r: _Round) -> _Wait | None:
    """A workload in the middle of a rollout is already replacing pods; wait for it."""
    w = c.workload
    if w is None or w.rollout is None:
        return None
    return WaitReason.ROLLOUT_IN_PROGRESS, f"{w.title} is rolling out: {w.rollout}"


def _too_few_replicas(c: _Candidate, r: _Round) -> _Wait | None:
    """Unless skipCheckExpectedReplicas, an EvictDirectly job waits while its workload's
    limits are not below its expected replicas (a 1-replica workload above all): evicting
    the pod could leave it none. A ReservationFirst job is exempt: its replacement has a
    place before the pod goes, and maxUnavailablePerWorkload still applies to it (the
    round leaves this check out for it)."""
    w = c.workload
    if (
        c.reservation_first
        or w is None
        or (w.expected > 1 and w.max_migrating < w.expected and w.max_unavailable < w.expected)
    ):
        return None
    return WaitReason.EXPECTED_REPLICAS, (
        f"{w.title} has {w.expected} expected replicas, not more than its limits "
        f"(maxMigrating {w.max_migrating}, maxUnavailable {w.max_unavailable}): evicting "
        "directly could leave it no pod; scale it up, use ReservationFirst or set "
        "skipCheckExpectedReplicas"
    )


def _pdb(c: _Candidate, r: _Round) -> _Wait | None:
    """Every PodDisruptionBudget covering a healthy pod must have a disruption left:
    status.disruptionsAllowed less the migrations whose pods it still counts healthy and
    has not recorded in status.disruptedPods. An unhealthy pod takes no disruption."""
    if not c.healthy:
        return None
    for key, _ in r.covering(c):
        left = r.left[key]
        if left < 1:
            allowed = r.pdbs.allowed[key]
            return WaitReason.BLOCKED_BY_PDB, (
                f"PodDisruptionBudget {key} allows no more disruptions (disruptionsAllowed "
                f"{allowed}, {allowed - left} taken by migrations)"
            )
    return None


def _workload_migrating(c: _Candidate, r: _Round) -> _Wait | None:
    """maxMigratingPerWorkload: Running and admitted jobs of the workload."""
    w = c.workload
    if w is None or c.workload_uid is None:
        return None
    migrating = r.per_workload.get(c.workload_uid, 0)
    if migrating < w.max_migrating:
        return None
    return WaitReason.MAX_MIGRATING_PER_WORKLOAD, (
        f"{migrating} pods of {w.title} are already migrating "
        f"(maxMigratingPerWorkload {w.max_migrating} of {w.expected} replicas)"
    )


def _workload_unavailable(c: _Candidate, r: _Round) -> _Wait | None:
    """maxUnavailablePerWorkload: unavailable replicas are the expected ones that are not
    available (missing, not running, not ready, terminating) or migrating. Moving a pod
    that is already unavailable makes nothing worse, so only a healthy pod needs room."""
    w = c.workload
    if w is None or not c.healthy:
        return None
    unavailable = w.expected - w.available if w.expected > w.available else 0
    if unavailable < w.max_unavailable:
        return None
    return WaitReason.MAX_UNAVAILABLE_PER_WORKLOAD, (
        f"{unavailable} of {w.expected} replicas of {w.title} are unavailable or migrating "
        f"(maxUnavailablePerWorkload {w.max_unavailable})"
    )


def _node(c: _Candidate, r: _Round) -> _Wait | None:
    """maxMigratingPerNode: Running and admitted jobs whose pod is on the node."""
    limit = r.args.max_migrating_per_node
    count = r.per_node.get(c.node, 0)
    if count < limit:
        return None
    return WaitReason.MAX_MIGRATING_PER_NODE, (
        f"{count} migrations already run on node {c.node} (maxMigratingPerNode {limit})"
    )


def _namespace_limit(c: _Candidate, r: _Round) -> _Wait | None:
    """maxMigratingPerNamespace: Running and admitted jobs in the pod's namespace."""
    limit = r.args.max_migrating_per_namespace
    namespace = c.namespace
    count = r.per_namespace.get(namespace, 0)
    if count < limit:
        return None
    return WaitReason.MAX_MIGRATING_PER_NAMESPACE, (
        f"{count} migrations already run in namespace {namespace} "
        f"(maxMigratingPerNamespace {limit})"
    )


def _global_limit(c: _Candidate, r: _Round) -> _Wait | None:
    """maxMigratingGlobally: Running and admitted jobs in the whole cluster. It guards the
    cluster as the rate limits do, so descheduler.alpha.kubernetes.io/evict does not lift it."""
    limit = r.args.max_migrating_globally
    if r.total < limit:
        return None
    return WaitReason.MAX_MIGRATING_GLOBALLY, (
        f"{r.total} migrations already run in the cluster (maxMigratingGlobally {limit})"
    )


def _object_limiter(c: _Candidate, r: _Round) -> _Wait | None:
    """objectLimiters.workload: at most maxMigrating of a workload's pods admitted within
    any window of `duration`; maxMigrating reads as maxMigratingPerWorkload does (a count,
    a percentage of the replicas, or 0 for the size table)."""
    limiter, w = r.object_limiter, c.workload
    if limiter is None or w is None or c.workload_uid is None:
        return None
    limit = max_per_workload(limiter.max_migrating, w.expected)
    count = len(r.window.get(c.workload_uid, ()))
    if count < limit:
        return None
    return WaitReason.OBJECT_LIMITERS, (
        f"{count} pods of {w.title} started migrating in the last "
        f"{limiter.duration.total_seconds():g}s (objectLimiters.workload.maxMigrating {limit})"
    )


def _rates(c: _Candidate, r: _Round) -> _Wait | None:
    """evictQPS/evictBurst and flowControlQPS/flowControlBurst as token buckets: one token
    per admitted job, since each leads to at most one eviction. 0 or unset is no limit."""
    if r.args.evict_qps and r.evict_tokens < 1:
        return r.evict_qps_wait
    if r.args.flow_control_qps and r.flow_tokens < 1:
        return r.flow_control_wait
    return None


_BYPASSED = frozenset(
    {_workload_migrating, _workload_unavailable, _node, _namespace_limit, _object_limiter}
)
"""The retryable limits that descheduler.alpha.kubernetes.io/evict lifts, as the
MigrationController lists them. Rollouts, expected replicas, PDBs, nodeFit and the rate
limits still hold for such a pod."""


def _limit_checks(args: MigrationControllerArgs) -> tuple[tuple[_Check, ...], tuple[_Check, ...]]:
    """The checks that keep a job waiting, in the order their reasons are reported:
    (those about the pod and its workload's safety, the limits and rates)."""
    safety: list[_Check] = [_node_fit] if args.node_fit else []
    safety.append(_rollout_in_progress)
    if not args.skip_check_expected_replicas:
        safety.append(_too_few_replicas)
    safety.append(_pdb)
    limits: list[_Check] = [_workload_migrating, _workload_unavailable]
    if args.max_migrating_per_node:
        limits.append(_node)
    if args.max_migrating_per_namespace:
        limits.append(_namespace_limit)
    if args.max_migrating_globally:
        limits.append(_global_limit)
    if (args.object_limiters or {}).get(ObjectLimiterKind.WORKLOAD):
        limits.append(_object_limiter)
    if args.evict_qps or args.flow_control_qps:
        limits.append(_rates)
    return tuple(safety), tuple(limits)


# ----- workloads --------------------------------------------------------------------------


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


def _replicas_of(workload: Object | None, pods: Sequence[Object]) -> int:
    """spec.replicas (a Job's spec.parallelism); for an owner Berth does not know, the
    number of its pods."""
    spec = (workload or {}).get("spec") or {}
    for key in ("replicas", "parallelism"):
        if isinstance(spec.get(key), int):
            return int(spec[key])
    return len(pods)


def _rollout_of(workload: Object | None) -> str | None:
    """Why the workload is rolling out, or None.

    As `kubectl rollout status` reads it, less its wait for availability (that is
    maxUnavailablePerWorkload's business): the controller has not yet observed the latest
    spec, or (Deployment, StatefulSet) fewer replicas are updated than wanted, or
    (Deployment) old replicas are still there.
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
    updated = status.get("updatedReplicas") or 0
    if updated < wanted:
        return f"{updated} of {wanted} replicas updated"
    old = (status.get("replicas") or 0) - updated
    if workload["kind"] == "Deployment" and old > 0:
        return f"{old} old replicas pending termination"
    return None


class _History:
    """What the finished jobs say: failed jobs per pod (namespace/name) and migrations
    per workload (UID), for the order."""

    def __init__(self, jobs: Sequence[Object]) -> None:
        self.jobs = tuple(jobs)
        self.failures: dict[str, int] = defaultdict(int)
        self.migrations: dict[str, int] = defaultdict(int)
        for job in jobs:
            if (job.get("status") or {}).get("phase") == PodMigrationJobPhase.FAILED:
                self.failures[_pod_key(job)] += 1
            workload = _annotations(job).get(keys.WORKLOAD)
            if workload:
                self.migrations[workload] += 1

    def holds(self, jobs: Sequence[Object]) -> bool:
        """Whether these counts were made from these very objects."""
        return _same(jobs, self.jobs)


def _same(objects: Sequence[Object], known: tuple[Object, ...]) -> bool:
    return len(objects) == len(known) and all(map(operator.is_, objects, known))


# ----- PodDisruptionBudgets ---------------------------------------------------------------


class _PdbIndex:
    """PDBs by namespace and one of their matchLabels, so a pod meets only the few PDBs
    that may select it. It holds nothing of a round, so a round reuses the last round's
    index (and the answers it gave) while the PDBs are the very same objects."""

    def __init__(self, pdbs: Sequence[Object]) -> None:
        self.pdbs = tuple(pdbs)
        self.by_label: dict[str, dict[tuple[str, str], list[tuple[str, Object]]]] = {}
        """namespace → (label, value) → (namespace/name, PDB); ("", "") holds those without
        matchLabels."""
        self.allowed: dict[str, int] = {}
        """namespace/name → status.disruptionsAllowed."""
        self.answers: dict[tuple[str, frozenset[tuple[str, str]]], list[tuple[str, Object]]] = {}
        for pdb in pdbs:
            selector = (pdb.get("spec") or {}).get("selector")
            if selector is None:  # a null selector selects no pod
                continue
            labels = selector.get("matchLabels") or {"": ""}
            index = self.by_label.setdefault(pdb["metadata"]["namespace"], {})
            key = _object_key(pdb)
            index.setdefault(next(iter(labels.items())), []).append((key, pdb))
            self.allowed[key] = int((pdb.get("status") or {}).get("disruptionsAllowed") or 0)

    def holds(self, pdbs: Sequence[Object]) -> bool:
        """Whether the index was built from these very objects."""
        return _same(pdbs, self.pdbs)

    def covering(
        self, namespace: str, labels: Mapping[str, str], label_set: frozenset[tuple[str, str]]
    ) -> list[tuple[str, Object]]:
        """The PDBs selecting a pod with these labels, with their namespace/name
        (`label_set` is the same labels, hashable: pods with equal labels share the
        answer)."""
        index = self.by_label.get(namespace)
        if not index:
            return []
        key = (namespace, label_set)
        found = self.answers.get(key)
        if found is None:
            found = self.answers[key] = [
                (name, pdb)
                for item in (*labels.items(), ("", ""))
                for name, pdb in index.get(item, ())
                if selector_matches(pdb["spec"]["selector"], labels)
            ]
        return found


# ----- nodeFit ----------------------------------------------------------------------------


class _NodeFit:
    """Whether another node could take a pod now: Ready, not cordoned, matching
    `nodeSelector` of the config and the pod's nodeSelector and required node affinity,
    its NoSchedule/NoExecute taints tolerated, and `free` covering the pod's requests.
    Preferences, inter-pod affinity, spreading and ports are left to the scheduler, and
    admissions within the round do not use up `free`. Pods of one controller share a
    template, so the answer is worked out once per controller."""

    def __init__(self, snapshot: Snapshot) -> None:
        selector = parse_selector(snapshot.args.node_selector or "")
        self.free = snapshot.free
        self.nodes = [
            (name, node)
            for name, node in snapshot.nodes.items()
            if node_schedulable(node) and selector_matches(selector, _labels(node))
        ]
        self.fitting: dict[str, tuple[str, ...]] = {}

    def fits_elsewhere(self, c: _Candidate) -> bool:
        key = c.controller or c.uid
        if key not in self.fitting:
            self.fitting[key] = self._first_two(c.spec)
        return any(name != c.node for name in self.fitting[key])

    def _first_two(self, spec: Object) -> tuple[str, ...]:
        """Up to two nodes that fit: one of them is not the pod's own."""
        requests = pod_requests(spec)
        found: list[str] = []
        for name, node in self.nodes:
            if (
                name in self.free
                and not fits(requests, self.free[name])
                and node_affinity_matches(spec, name, _labels(node))
                and taints_tolerated(spec, node)
            ):
                found.append(name)
                if len(found) == 2:
                    break
        return tuple(found)


# ----- pods -------------------------------------------------------------------------------

_KOORDINATOR_QOS_RANK = {"LSE": 0, "LSR": 1, "LS": 2, "BE": 3}
_KUBE_QOS_RANK = {"Guaranteed": 0, "Burstable": 1, "BestEffort": 2}


def _qos_rank(labels: Mapping[str, str], pod: Object) -> int:
    """Higher QoS first: the koordinator.sh/qosClass label (LSE > LSR > LS > BE), where a
    pod without it counts as LS, or BE when it is BestEffort; then the Kubernetes QoS class
    (Guaranteed > Burstable > BestEffort)."""
    kube = qos_class(pod)
    koordinator = _KOORDINATOR_QOS_RANK.get(
        labels.get(KOORDINATOR_QOS, ""), 3 if kube == "BestEffort" else 2
    )
    return 3 * koordinator + _KUBE_QOS_RANK.get(kube, 1)


def _annotations(obj: Object) -> Mapping[str, str]:
    return obj["metadata"].get("annotations") or {}


def _labels(obj: Object) -> Mapping[str, str]:
    return obj["metadata"].get("labels") or {}


def _object_key(obj: Object) -> str:
    return f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"


def _pod_key(job: Object) -> str:
    ref = (job.get("spec") or {}).get("podRef") or {}
    return f"{ref.get('namespace')}/{ref.get('name')}"
