"""The evictability checks the configuration sets: a job whose pod fails one fails.

Berth's own rules, those that read only the pod (placeholder, static, DaemonSet, no
controller, terminating, eviction cost MaxInt32, ...), are in berth.eviction, shared with
`kubectl migrate node`. These are the MigrationController's checks that its
configuration turns on or off: namespaces, labelSelector, system-critical pods,
priorityThreshold, local storage, PVCs and schedulerNames. Waiting would not change
their answer, so the job fails (ForbiddenMigratePod) with a message naming the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from berth.scheduling import selector_matches
from berth.settings import SYSTEM_NAMESPACES, MigrationControllerArgs

if TYPE_CHECKING:
    from controller.arbitration.candidates import Candidate
    from controller.arbitration.round import Round

    Forbid = Callable[[Candidate, Round], str | None]
    """A check: why the candidate's pod may not migrate, or None."""

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""Priority of the built-in system-cluster-critical class; at or above it a pod is critical."""


def _namespace(c: Candidate, r: Round) -> str | None:
    """namespaces.include is checked before namespaces.exclude."""
    namespaces = r.args.namespaces
    namespace = c.namespace
    if namespaces and namespaces.include and namespace not in namespaces.include:
        return f"namespace {namespace} is not in namespaces.include"
    if namespaces and namespaces.exclude and namespace in namespaces.exclude:
        return f"namespace {namespace} is in namespaces.exclude"
    return None


def _label_selector(c: Candidate, r: Round) -> str | None:
    """Only pods matching labelSelector migrate."""
    return (
        None if selector_matches(r.label_selector, c.labels) else "pod does not match labelSelector"
    )


def _system_critical(c: Candidate, _r: Round) -> str | None:
    """System-critical pods (priority 2000000000 and above, or a system-* PriorityClass)
    stay unless evictSystemCriticalPods."""
    if c.priority >= SYSTEM_CRITICAL_PRIORITY or c.priority_class.startswith("system-"):
        return "pod is system-critical (evictSystemCriticalPods allows it)"
    return None


def _priority_threshold(c: Candidate, r: Round) -> str | None:
    """Only pods with a priority below priorityThreshold migrate. A threshold naming a
    PriorityClass that does not exist lets no pod through, and says so."""
    threshold = r.priority_threshold
    if threshold is None:
        name = r.args.priority_threshold.name if r.args.priority_threshold else None
        return f"PriorityClass {name} of priorityThreshold.name does not exist"
    if c.priority >= threshold:
        return f"pod priority {c.priority} is not below priorityThreshold {threshold}"
    return None


def _local_storage(c: Candidate, _r: Round) -> str | None:
    """emptyDir and hostPath data stay behind on the node, unless evictLocalStoragePods."""
    if c.local_storage is None:
        return None
    return f"pod uses local storage ({c.local_storage}; evictLocalStoragePods allows it)"


def _pvc(c: Candidate, _r: Round) -> str | None:
    """ignorePvcPods keeps pods with PersistentVolumeClaims (generic ephemeral volumes are
    claims too) where they are."""
    if c.pvc is None:
        return None
    return f"pod uses a PersistentVolumeClaim ({c.pvc}; ignorePvcPods)"


def _scheduler_name(c: Candidate, r: Round) -> str | None:
    """A ReservationFirst job reserves through the pod's own scheduler, which must be one
    of schedulerNames; an EvictDirectly job reserves nothing."""
    name = c.scheduler
    if not c.reservation_first or name in r.args.scheduler_names:
        return None
    return (
        f"pod's scheduler {name} is not in schedulerNames "
        f"({', '.join(r.args.scheduler_names)}); use EvictDirectly or add it"
    )


def _unbindable(c: Candidate, _r: Round) -> str | None:
    """A ReservationFirst job only helps if the replacement pod binds its Reservation, and
    Berth's webhook does not see kube-system or berth-system: refused before anything is
    evicted, whatever namespaces.include says."""
    if not c.reservation_first or c.namespace not in SYSTEM_NAMESPACES:
        return None
    return (
        f"namespace {c.namespace} is not seen by Berth's webhook, so a replacement pod "
        "could never bind the Reservation; use EvictDirectly"
    )


def forbid_checks(args: MigrationControllerArgs) -> tuple[Forbid, ...]:
    """The evictability checks, less those the configuration turns off.

    evictSystemCriticalPods lifts priorityThreshold too: it allows "pods of any priority".
    """
    checks: list[Forbid] = []
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
    checks.append(_unbindable)
    return tuple(checks)
