"""Which pods may never migrate: a job whose pod fails one of these rules fails.

Berth's own rules, those that read only the pod (placeholder, static, DaemonSet, no
controller, terminating, eviction cost MaxInt32, ...), are in berth.eviction, shared with
`kubectl migrate node`. Here are the MigrationController's checks that its
configuration turns on or off: namespaces, labelSelector, system-critical pods,
priorityThreshold, local storage, PVCs and schedulerNames. Waiting would not change
their answer, so the job fails (ForbiddenMigratePod) with a message naming the rule.

`forbidden_to_migrate` runs all of them, in one order, for arbitration before it admits
a job and for the job itself again right before its eviction: a pod that became
forbidden in between (a new label, an eviction cost of MaxInt32) is never evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from berth.eviction import forbidden
from berth.protocol import controller_of, is_bindable
from berth.scheduling import selector_matches
from berth.settings import SYSTEM_NAMESPACES, MigrationControllerArgs

if TYPE_CHECKING:
    from controller.arbitration.candidates import Candidate

    Forbid = Callable[[Candidate, "Rules"], str | None]
    """A check: why the candidate's pod may not migrate, or None."""

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""Priority of the built-in system-cluster-critical class; at or above it a pod is critical."""


def _namespace(c: Candidate, r: Rules) -> str | None:
    """namespaces.include is checked before namespaces.exclude."""
    return r.args.namespaces.refuses(c.namespace) if r.args.namespaces else None


def _label_selector(c: Candidate, r: Rules) -> str | None:
    """Only pods matching labelSelector migrate."""
    return (
        None if selector_matches(r.label_selector, c.labels) else "pod does not match labelSelector"
    )


def _system_critical(c: Candidate, _r: Rules) -> str | None:
    """System-critical pods (priority 2000000000 and above, or a system-* PriorityClass)
    stay unless evictSystemCriticalPods."""
    if c.priority >= SYSTEM_CRITICAL_PRIORITY or c.priority_class.startswith("system-"):
        return "pod is system-critical (evictSystemCriticalPods allows it)"
    return None


def _priority_threshold(c: Candidate, r: Rules) -> str | None:
    """Only pods with a priority below priorityThreshold migrate. A threshold naming a
    PriorityClass that does not exist fails nothing: jobs wait for it (`limits`)."""
    threshold = r.priority_threshold
    if threshold is None:
        return None
    if c.priority >= threshold:
        return f"pod priority {c.priority} is not below priorityThreshold {threshold}"
    return None


def _local_storage(c: Candidate, _r: Rules) -> str | None:
    """emptyDir and hostPath data stay behind on the node, unless evictLocalStoragePods."""
    if c.local_storage is None:
        return None
    return f"pod uses local storage ({c.local_storage}; evictLocalStoragePods allows it)"


def _pvc(c: Candidate, _r: Rules) -> str | None:
    """ignorePvcPods keeps pods with PersistentVolumeClaims (generic ephemeral volumes are
    claims too) where they are."""
    if c.pvc is None:
        return None
    return f"pod uses a PersistentVolumeClaim ({c.pvc}; ignorePvcPods)"


def _scheduler_name(c: Candidate, r: Rules) -> str | None:
    """A ReservationFirst job reserves through the pod's own scheduler, which must be one
    of schedulerNames; an EvictDirectly job reserves nothing."""
    name = c.scheduler
    if not c.reservation_first or name in r.args.scheduler_names:
        return None
    return (
        f"pod's scheduler {name} is not in schedulerNames "
        f"({', '.join(r.args.scheduler_names)}); use EvictDirectly or add it"
    )


def _unbindable(c: Candidate, _r: Rules) -> str | None:
    """A ReservationFirst job only helps if the replacement pod binds its Reservation:
    refused before anything is evicted, whatever namespaces.include says, where it never
    could. Berth's webhook does not see kube-system or berth-system, and binds only pods
    it knows were created by their controller (`berth.protocol.CONTROLLER_IDENTITIES`).
    A pod without a controller has no replacement; the rules on bare pods decide."""
    if not c.reservation_first:
        return None
    if c.namespace in SYSTEM_NAMESPACES:
        return (
            f"namespace {c.namespace} is not seen by Berth's webhook, so a replacement pod "
            "could never bind the Reservation; use EvictDirectly"
        )
    controller = controller_of(c.pod)
    if controller is not None and not is_bindable(controller):
        return (
            f"pod's controller is a {controller.get('apiVersion')} {controller.get('kind')}; "
            "Berth binds a Reservation only to a replacement made by a ReplicaSet, "
            "StatefulSet or Job, so this one could never bind it; use EvictDirectly"
        )
    return None


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


@dataclass(frozen=True)
class Rules:
    """The rules for one configuration, and what they read besides the pod."""

    args: MigrationControllerArgs
    label_selector: Mapping[str, Any]
    """labelSelector as a plain selector ({}: matches every pod)."""
    priority_threshold: int | None
    """priorityThreshold's value; None when it names a PriorityClass that is missing."""
    checks: tuple[Forbid, ...]

    @classmethod
    def of(cls, args: MigrationControllerArgs, priority_classes: Mapping[str, int]) -> Rules:
        """The rules of `args`; `priority_classes` (name → value) resolves a
        priorityThreshold given by name."""
        threshold = args.priority_threshold
        value: int | None = None
        if threshold is not None:
            value = (
                threshold.value if threshold.name is None else priority_classes.get(threshold.name)
            )
        selector = (
            args.label_selector.model_dump(mode="json", exclude_none=True)
            if args.label_selector
            else {}
        )
        return cls(args, selector, value, forbid_checks(args))


def forbidden_to_migrate(c: Candidate, rules: Rules) -> str | None:
    """Why the candidate's pod may never migrate, or None: Berth's own rules
    (berth.eviction) first, then the configuration's, the first that holds."""
    message = forbidden(c.pod, evict_failed_bare_pods=rules.args.evict_failed_bare_pods)
    for check in rules.checks:
        if message is not None:
            break
        message = check(c, rules)
    return message
