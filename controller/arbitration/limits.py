"""The limits: a job that would break one waits, and its status says which.

A limit is about now (what is migrating, what is available, how fast jobs start), so a
job that breaks one stays Pending with the reason, and a later round may admit it. The
checks run in the order their reasons are reported: first what keeps the pod's
workload safe (nodeFit, a rollout in progress, expected replicas, PodDisruptionBudgets),
then the counts (per workload, node, namespace and cluster) and the rates. Only Running
jobs and jobs admitted earlier in the round count, never Pending ones, so a limit of two
admits two of N jobs, never none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from berth.api import PodMigrationJobReason
from berth.resources import format_quantity, pod_requests
from berth.settings import EvictionPolicy, MigrationControllerArgs, ObjectLimiterKind
from controller.arbitration.workloads import max_per_workload

Wait = tuple[str, str]
"""(reason, message) of a job kept waiting."""

if TYPE_CHECKING:
    from controller.arbitration.candidates import Candidate
    from controller.arbitration.round import Round

    Check = Callable[[Candidate, Round], Wait | None]
    """A limit: why the candidate's job waits this round, or None."""


WaitReason = PodMigrationJobReason
"""Why a job stays Pending this round: the API's reasons, each naming its rule (one
vocabulary: the reason a round gives is the reason the job's status shows)."""


def _node_fit(c: Candidate, r: Round) -> Wait | None:
    """nodeFit: some other node must be able to take the pod now (see `NodeFit`)."""
    if r.node_fit is None or r.node_fit.fits_elsewhere(c):
        return None
    requests = ", ".join(
        f"{name} {format_quantity(name, value)}"
        for name, value in sorted(pod_requests(c.spec).items())
    )
    return WaitReason.NODE_FIT, (
        "no other node fits the pod (nodeFit): none is Ready and schedulable, matches "
        "nodeSelector and the pod's node selector and affinity, tolerates its taints and "
        f"has {requests or 'its requests'} and a pod slot free"
    )


def _rollout_in_progress(c: Candidate, _r: Round) -> Wait | None:
    """A workload in the middle of a rollout is already replacing pods; wait for it."""
    w = c.workload
    if w is None or w.rollout is None:
        return None
    return WaitReason.ROLLOUT_IN_PROGRESS, f"{w.title} is rolling out: {w.rollout}"


def _too_few_replicas(c: Candidate, _r: Round) -> Wait | None:
    """Unless skipCheckExpectedReplicas, an EvictDirectly job waits while its workload's
    limits are not below its expected replicas (a 1-replica workload above all): evicting
    the pod could leave it none. A ReservationFirst job is exempt: its replacement has a
    place before the pod goes, and maxUnavailablePerWorkload still applies to it."""
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


def _pdb(c: Candidate, r: Round) -> Wait | None:
    """Every PodDisruptionBudget covering the pod must have a disruption left, when its
    eviction takes one (`Disruptions.takes_one`: a healthy pod's; an unhealthy one's
    unless the budgets spare it): status.disruptionsAllowed less the migrations whose pods
    it still counts healthy and has not recorded in status.disruptedPods. With the
    Eviction API, a pod more than one PDB covers waits whatever they allow: the API
    evicts no such pod (it answers 500)."""
    covering = r.disruptions.covering(c)
    if not covering or not c.guarded:  # the Eviction API deletes such a pod as asked
        return None
    if len(covering) > 1 and r.args.eviction_policy == EvictionPolicy.EVICTION:
        names = ", ".join(sorted(key for key, _ in covering))
        return WaitReason.BLOCKED_BY_PDB, (
            f"the pod is covered by more than one PodDisruptionBudget ({names}), and the "
            "Eviction API evicts no such pod (it answers 500); leave one budget selecting "
            "it"
        )
    if not r.disruptions.takes_one(c):
        return None
    found = r.disruptions.exhausted(c)
    if found is None:
        return None
    key, allowed, taken = found
    return WaitReason.BLOCKED_BY_PDB, (
        f"PodDisruptionBudget {key} allows no more disruptions (disruptionsAllowed "
        f"{allowed}, {taken} taken by migrations)"
    )


def _workload_migrating(c: Candidate, r: Round) -> Wait | None:
    """maxMigratingPerWorkload: Running and admitted jobs of the workload."""
    w = c.workload
    if w is None or c.workload_key is None:
        return None
    migrating = r.per_workload.get(c.workload_key, 0)
    if migrating < w.max_migrating:
        return None
    return WaitReason.MAX_MIGRATING_PER_WORKLOAD, (
        f"{migrating} pods of {w.title} are already migrating "
        f"(maxMigratingPerWorkload {w.max_migrating} of {w.expected} replicas)"
    )


def _workload_unavailable(c: Candidate, _r: Round) -> Wait | None:
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


def _node(c: Candidate, r: Round) -> Wait | None:
    """maxMigratingPerNode: Running and admitted jobs whose pod is on the node."""
    limit = r.args.max_migrating_per_node
    count = r.per_node.get(c.node, 0)
    if count < limit:
        return None
    return WaitReason.MAX_MIGRATING_PER_NODE, (
        f"{count} migrations already run on node {c.node} (maxMigratingPerNode {limit})"
    )


def _namespace_limit(c: Candidate, r: Round) -> Wait | None:
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


def _global_limit(_c: Candidate, r: Round) -> Wait | None:
    """maxMigratingGlobally: Running and admitted jobs in the whole cluster. It guards the
    cluster as the rate limits do, so descheduler.alpha.kubernetes.io/evict does not lift it."""
    limit = r.args.max_migrating_globally
    if r.total < limit:
        return None
    return WaitReason.MAX_MIGRATING_GLOBALLY, (
        f"{r.total} migrations already run in the cluster (maxMigratingGlobally {limit})"
    )


def _object_limiter(c: Candidate, r: Round) -> Wait | None:
    """objectLimiters.workload: at most maxMigrating of a workload's pods admitted within
    any window of `duration`; maxMigrating reads as maxMigratingPerWorkload does (a count,
    a percentage of the replicas, or 0 for the size table)."""
    limiter, w = r.rates.object_limiter, c.workload
    if limiter is None or w is None or c.workload_key is None:
        return None
    limit = max_per_workload(limiter.max_migrating, w.expected)
    count = len(r.rates.window.get(c.workload_key, ()))
    if count < limit:
        return None
    return WaitReason.OBJECT_LIMITERS, (
        f"{count} pods of {w.title} started migrating in the last "
        f"{limiter.duration.total_seconds():g}s (objectLimiters.workload.maxMigrating {limit})"
    )


def _rates(_c: Candidate, r: Round) -> Wait | None:
    """evictQPS/evictBurst and flowControlQPS/flowControlBurst (see `Rates`)."""
    return r.rates.exhausted()


BYPASSED = frozenset(
    {_workload_migrating, _workload_unavailable, _node, _namespace_limit, _object_limiter}
)
"""The retryable limits that descheduler.alpha.kubernetes.io/evict lifts, as the
MigrationController lists them. Rollouts, expected replicas, PDBs, nodeFit and the rate
limits still hold for such a pod."""


def _threshold_unknown(_c: Candidate, r: Round) -> Wait | None:
    """priorityThreshold.name names no PriorityClass now: no pod can be judged against it,
    so every job waits (rather than failing them all for a typo, or for a class deleted
    and made again) until it exists."""
    if r.rules.priority_threshold is not None:
        return None
    name = r.rules.args.priority_threshold.name if r.rules.args.priority_threshold else None
    return WaitReason.PRIORITY_THRESHOLD, (
        f"PriorityClass {name} of priorityThreshold.name does not exist: no pod migrates "
        "until it does"
    )


def limit_checks(args: MigrationControllerArgs) -> tuple[Check, ...]:
    """The checks that keep a job waiting, less those the configuration turns off, in the
    order their reasons are reported: the configuration's own readiness, the pod's and its
    workload's safety, then the counts and the rates."""
    checks: list[Check] = []
    if (
        args.priority_threshold is not None
        and args.priority_threshold.name is not None
        and not args.evict_system_critical_pods  # which lifts the threshold (`forbid`)
    ):
        checks.append(_threshold_unknown)
    if args.node_fit:
        checks.append(_node_fit)
    checks.append(_rollout_in_progress)
    if not args.skip_check_expected_replicas:
        checks.append(_too_few_replicas)
    checks += [_pdb, _workload_migrating, _workload_unavailable]
    if args.max_migrating_per_node:
        checks.append(_node)
    if args.max_migrating_per_namespace:
        checks.append(_namespace_limit)
    if args.max_migrating_globally:
        checks.append(_global_limit)
    if (args.object_limiters or {}).get(ObjectLimiterKind.WORKLOAD):
        checks.append(_object_limiter)
    if args.evict_qps or args.flow_control_qps:
        checks.append(_rates)
    return tuple(checks)
