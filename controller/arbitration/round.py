"""One arbitration round: what it looks at, what it decides, and what it hands on.

`arbitrate` reads a `Snapshot` and returns an `Arbitration`: a `Decision` per Pending
job, the rate limiters' state and a `Memo` for the next round. The `Round` holds what
the round builds once (counts of Running jobs per node, namespace and workload, the PDB
budgets, the candidates) and grows those counts as it admits jobs, so that an admitted
job counts at once against the jobs after it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Literal, NamedTuple

from berth.api import PodMigrationJobReason, already_migrating, keys
from berth.protocol import annotations_of, controlled_key
from berth.resources import Resources
from berth.settings import MigrationControllerArgs
from controller.arbitration.candidates import Candidate, PodFacts
from controller.arbitration.forbid import Rules, forbidden_to_migrate
from controller.arbitration.limits import BYPASSED, limit_checks
from controller.arbitration.nodefit import NodeFit
from controller.arbitration.objects import Object, missing_pod, pod_key
from controller.arbitration.order import History, sort_key, sorted_in_steps
from controller.arbitration.pdbs import Disruptions, PdbIndex
from controller.arbitration.rates import LimiterState, Rates
from controller.arbitration.workloads import Workload, Workloads

Verdict = Literal["admit", "wait", "fail"]


class Decision(NamedTuple):
    """What becomes of one Pending job this round."""

    job: Object
    verdict: Verdict
    reason: str = ""
    message: str = ""
    pod: Object | None = None


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
    """`controlled_key` of a controller → UID of the workload above it in its namespace
    (a ReplicaSet's Deployment); any other controller is its own workload, and a pod's
    workload is its controller's."""
    workloads: Mapping[str, Object] = field(default_factory=dict)
    """`controlled_key` of a workload → the workload object; its spec.replicas is the
    expected replicas."""
    pods_of_workload: Mapping[str, Sequence[Object]] = field(default_factory=dict)
    """`controlled_key` of a workload → its pods; read only for owners whose status
    reports no availableReplicas."""
    pdbs: Sequence[Object] = ()
    """PodDisruptionBudgets (policy/v1)."""
    nodes: Mapping[str, Object] = field(default_factory=dict)
    """Nodes by name; only nodeFit reads them."""
    free: Mapping[str, Resources] = field(default_factory=dict)
    """Node name → allocatable minus the requests of its pods; only nodeFit reads it."""
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    """PriorityClass name → value; only priorityThreshold.name reads it."""
    args: MigrationControllerArgs
    limiter: LimiterState = field(default_factory=LimiterState)
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
    jobs: Mapping[int, Candidate] = field(default_factory=dict)
    """The id of a job object → what was read of it and its pod."""
    facts: Mapping[str, tuple[Object, PodFacts]] = field(default_factory=dict)
    """Pod UID → (pod object, its facts), for pods of Running jobs."""
    workloads: Mapping[str, tuple[Object, Workload]] = field(default_factory=dict)
    """Workload UID → (workload object, its limits before this round's counts)."""
    pdbs: PdbIndex | None = None
    """The PDBs by label, and which ones cover the pods seen."""
    history: History = field(default_factory=lambda: History(()))
    """Past failures of each pod and past migrations of each workload."""


def arbitrate(snapshot: Snapshot) -> Arbitration:
    """Decide for every Pending, unpaused job: admit, wait (with the reason), or fail.

    With `arbitrationArgs.enabled: false` every job is admitted with no limit, order or
    rate, except that a missing pod or a pod Berth must never move still fails the job:
    those checks say what Berth may touch, not how fast.
    """
    round_ = Round(snapshot)
    decisions: list[Decision] = []
    candidates = round_.candidates(snapshot.pending, failed=decisions)
    if not snapshot.args.arbitration_args.enabled:
        round_.decide(candidates, limited=False, into=decisions)
        return Arbitration(decisions, snapshot.limiter, round_.memo())
    candidates = sorted_in_steps(candidates, attrgetter("order"))
    round_.decide(candidates, limited=True, into=decisions)
    return Arbitration(decisions, round_.rates.state(), round_.memo())


class Round:
    """Indexes built once per round, and the counts that grow as jobs are admitted."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.args = args = snapshot.args
        self.rules = Rules.of(args, snapshot.priority_classes)
        """The rules that forbid a pod to migrate (`forbid`)."""
        self.priority_threshold = self.rules.priority_threshold
        last = snapshot.memo
        if (
            last is None
            or last.args is not args
            or last.priority_threshold != self.priority_threshold
        ):
            last = Memo()
        self.last = last
        """What the last round read; only the parts read from the same objects are used."""
        self.known: dict[int, Candidate] = {}
        self.facts: dict[str, tuple[Object, PodFacts]] = {}
        """What this round read, for the next."""
        self.migrating: dict[str, str] = {}
        """Pods (namespace/name) of Running jobs and of jobs admitted this round, and the
        name of the job that migrates each."""
        self.total = 0
        """Running jobs and jobs admitted this round."""
        self.per_node: defaultdict[str, int] = defaultdict(int)
        self.per_namespace: defaultdict[str, int] = defaultdict(int)
        self.per_workload: defaultdict[str, int] = defaultdict(int)
        self.workloads = Workloads(snapshot, last=last.workloads, migrating=self.migrating)
        self.disruptions = Disruptions(
            last.pdbs
            if last.pdbs is not None and last.pdbs.holds(snapshot.pdbs)
            else PdbIndex(snapshot.pdbs)
        )
        for job in snapshot.in_flight:
            self._count_in_flight(job)
        self.history = (
            last.history if last.history.holds(snapshot.history) else History(snapshot.history)
        )
        self.node_fit = NodeFit(snapshot) if args.node_fit else None
        self.rates = Rates(args, snapshot.limiter, snapshot.now)
        checks = limit_checks(args)
        self.checks = (checks, tuple(check for check in checks if check not in BYPASSED))
        """The checks for a job, by `Candidate.bypass`."""

    def _count_in_flight(self, job: Object) -> None:
        """Count a Running job against its node, namespace, workload and PDBs."""
        key = pod_key(job)
        annotations = annotations_of(job)
        pod = self.snapshot.pods.get(key)
        if (
            pod is not None
            and annotations.get(keys.POD_UID, pod["metadata"]["uid"]) != pod["metadata"]["uid"]
        ):
            pod = None  # a new pod of the same name: the job's pod is gone
        facts = self.facts_of(pod) if pod is not None else None
        node = annotations.get(keys.SOURCE_NODE) or (facts.node if facts else None)
        namespace = key.partition("/")[0]
        uid = annotations.get(keys.WORKLOAD) or (
            self.workload_uid(facts.controller, namespace) if facts else None
        )
        workload = controlled_key(namespace, uid) if uid else None
        self.migrating[key] = job["metadata"]["name"]
        self.total += 1
        if node:
            self.per_node[node] += 1
        self.per_namespace[namespace] += 1
        if workload:
            self.per_workload[workload] += 1
            self.workloads.in_flight[workload] += 1
        if pod is None or facts is None:
            return
        self.disruptions.count_running(facts, pod["metadata"]["name"])
        if workload and facts.healthy:
            self.workloads.healthy_in_flight[workload] += 1

    def candidates(self, pending: Sequence[Object], *, failed: list[Decision]) -> list[Candidate]:
        """The unpaused jobs as candidates, each with its workload and its place in the
        order (`order.sort_key`). The jobs that fail at once go to `failed`.

        A round reads every Pending job, so this loop keeps to local names and reuses
        what the last round read from the same job and pod objects (found by identity:
        the memo holds them, so no other object can take their id).
        """
        last, known_now, pods = self.last.jobs, self.known, self.snapshot.pods
        workload_uid, workload = self.workload_uid, self.workloads.get
        history, per_workload = self.history, self.per_workload
        candidates: list[Candidate] = []
        for job in pending:
            c = last.get(id(job))
            if c is None or c.job is not job or pods.get(c.key) is not c.pod:
                if (job.get("spec") or {}).get("paused"):
                    continue
                key = pod_key(job)
                pod = pods.get(key)
                missing = missing_pod(job, pod, key)
                if missing is not None:
                    failed.append(Decision(job, "fail", PodMigrationJobReason.MISSING_POD, missing))
                    continue
                assert pod is not None
                c = self._read(job, pod)
            known_now[id(job)] = c
            if c.failure is not None:
                failed.append(c.failure)
                continue
            uid = workload_uid(c.controller, c.namespace)
            c.workload_key = controlled_key(c.namespace, uid) if uid else None
            c.workload = workload(c.workload_key) if c.workload_key else None
            c.order = sort_key(c, history, per_workload)
            candidates.append(c)
        return candidates

    def _read(self, job: Object, pod: Object) -> Candidate:
        """The job as a candidate, and whether its pod is forbidden to migrate."""
        c = Candidate(job, pod=pod)
        message = forbidden_to_migrate(c, self.rules)
        if message is not None:
            c.failure = Decision(
                job, "fail", PodMigrationJobReason.FORBIDDEN_MIGRATE_POD, message, pod
            )
        return c

    def workload_uid(self, controller: str | None, namespace: str) -> str | None:
        """The workload of a pod of `namespace` with this controller: the one above the
        controller, or the controller itself."""
        if not controller:
            return None
        return self.snapshot.workload_of.get(controlled_key(namespace, controller), controller)

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
            workloads=self.workloads.read,
            pdbs=self.disruptions.index,
            history=self.history,
        )

    def decide(
        self, candidates: Sequence[Candidate], *, limited: bool, into: list[Decision]
    ) -> None:
        """In turn, admit each candidate whose checks all pass (`limited`; else every
        one), counting it at once; the others wait with the first check that failed."""
        checks = self.checks if limited else ((), ())
        migrating = self.migrating
        for c in candidates:
            if c.key in migrating:
                into.append(
                    Decision(
                        c.job,
                        "fail",
                        PodMigrationJobReason.FORBIDDEN_MIGRATE_POD,
                        already_migrating(c.key, migrating[c.key]),
                        c.pod,
                    )
                )
                continue
            for check in checks[c.bypass]:
                found = check(c, self)
                if found is not None:
                    into.append(Decision(c.job, "wait", found[0], found[1], c.pod))
                    break
            else:
                self._count(c)
                into.append(Decision(c.job, "admit", pod=c.pod))

    def _count(self, c: Candidate) -> None:
        """An admitted job counts at once against every limit for the rest of the round."""
        self.migrating[c.key] = c.job["metadata"]["name"]
        self.total += 1
        self.per_node[c.node] += 1
        self.per_namespace[c.namespace] += 1
        if c.workload_key and c.workload:
            self.per_workload[c.workload_key] += 1
            c.workload.available -= c.healthy
        if self.disruptions.takes_one(c):
            self.disruptions.take(c)
        self.rates.admitted(c.workload_key if c.workload else None)
