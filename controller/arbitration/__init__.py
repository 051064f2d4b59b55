"""Arbitration: which Pending PodMigrationJobs may start now, and why the others may not.

Each migration is a risk to the workload whose pod it moves, so jobs do not start as they
arrive. Every round the controller weighs all Pending jobs together, as the PodMigrationJob
design describes:

1. **Forbid.** A job whose pod is gone fails (MissingPod); a job for a pod Berth must
   never move fails (ForbiddenMigratePod, the message names the rule): the rules of
   berth.eviction (placeholder, static, DaemonSet, no controller, terminating or
   finished, eviction cost MaxInt32) and the evictability checks the configuration sets
   (`forbid`). Waiting would not change them.
2. **Sort** the others (`order`): QoS, pod priority, eviction cost, past failures of the
   pod, past migrations of its workload, replicas of its workload migrating now; then
   the oldest.
3. **Limit.** In that order a job is admitted if every limit still holds (rollouts,
   expected replicas, PodDisruptionBudgets, per workload, per node, per namespace, in the
   cluster, object limiters, rate limits: `limits`, `rates`); if one does not, the job
   waits and its status says which.
   An admitted job counts at once against the jobs after it. A Pending job never counts
   against anything: only Running jobs and jobs admitted earlier in the round do, so
   N jobs for a node that has room for two admit exactly two, never none.

`arbitrate` is pure: it reads a `Snapshot` of what the informers hold and returns
decisions, which the controller writes (it runs a round on a thread of its own, over a
frozen copy of the caches: `controller.admission`). All counts come from the API objects (a Running
job carries the source node, pod UID and workload written when it was admitted), so a new
leader arbitrates exactly like the old one. Only the rate limiters have no place in the
API: their state goes in and out as `LimiterState`, and a new leader starts them full.

A round looks at every Pending job, so it touches each job's pod once, builds its indexes
(counts per node, namespace and workload, PDBs by label) once, and sorts once: its cost
grows with the jobs, not with jobs times pods or PDBs. Most of what it reads does not
change from one round to the next, so a round hands a `Memo` to the next: what it read
from each job, pod, workload, PDB and finished job, reused only for the very same objects
(the informers replace an object whenever it changes). See bench/README.md.

Where each part lives:

- `round`: `arbitrate`, `Snapshot`, `Arbitration`, `Decision`, `Memo`, and the `Round`
  that holds one round's counts;
- `candidates`: what a round reads of a Pending job and its pod (`PodFacts`);
- `forbid`: the rules that forbid a pod to migrate (the job fails), the configuration's
  and berth.eviction's, run by `forbidden_to_migrate` here and again by a job right
  before its eviction;
- `limits`: the checks that keep a job waiting, and their `WaitReason`;
- `rates`: evictQPS, flowControlQPS and objectLimiters (`LimiterState`, `TokenBucket`);
- `order`: the sort keys;
- `workloads`: expected replicas, availability, per-workload limits, rollouts;
- `pdbs`: which PodDisruptionBudgets cover a pod and what each has left;
- `nodefit`: whether another node could take a pod;
- `objects`: how a round names and recognises the API objects it reads.
"""

from controller.arbitration.limits import WaitReason
from controller.arbitration.rates import LimiterState, TokenBucket
from controller.arbitration.round import (
    Arbitration,
    Decision,
    Memo,
    Snapshot,
    Verdict,
    arbitrate,
)
from controller.arbitration.workloads import max_per_workload

__all__ = [
    "Arbitration",
    "Decision",
    "LimiterState",
    "Memo",
    "Snapshot",
    "TokenBucket",
    "Verdict",
    "WaitReason",
    "arbitrate",
    "max_per_workload",
]
