"""Which pods Berth never migrates, whatever the controller's configuration says.

Two places decide whether a pod may move: arbitration, which fails a job for such a pod
as ForbiddenMigratePod, and `kubectl migrate node`, which creates no job for it. Both ask
`forbidden`, so a drain never creates a job that arbitration refuses for a fact of the
pod, nor skips one it would allow. These rules read only the pod; the evictability checks
that depend on the configuration (namespaces, labelSelector, priority, local storage,
PVCs, schedulerNames) are arbitration's, which only the controller knows.

Objects are the API server's dicts; these functions are pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson

from berth import protocol
from berth.api import keys
from berth.protocol import Object

MIRROR_POD = "kubernetes.io/config.mirror"
"""Annotation of the mirror pod the kubelet shows for a static pod."""
CONFIG_SOURCE = "kubernetes.io/config.source"
"""Annotation saying where the kubelet got a pod from: "api" for all but static pods."""


def forbidden(pod: Object, *, evict_failed_bare_pods: bool = False) -> str | None:
    """Why the pod must not be migrated, or None; the first rule that holds, in this order.

    A placeholder is Berth's own (it holds a Reservation's capacity). A pod on no node has
    no place to be moved from. A terminating or completed pod is leaving anyway, and a
    failed pod's controller replaces it without Berth. Eviction cost MaxInt32 says whoever
    runs the pod forbids it. A static pod belongs to its kubelet (deleting its mirror pod
    moves nothing); a DaemonSet puts its pod back on the same node. Nothing recreates a
    pod without a controller, so only a failed one may go, as cleanup, and only with
    evictFailedBarePods (`evict_failed_bare_pods`; kubectl migrate takes its default).
    """
    metadata = pod["metadata"]
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    phase = (pod.get("status") or {}).get("phase")
    failed = phase == "Failed"
    controlled = protocol.controller_of(pod) is not None
    reservation = protocol.placeholder_reservation(pod)
    rules = (
        (reservation, f"pod is a Berth placeholder (it holds Reservation {reservation})"),
        (not (pod.get("spec") or {}).get("nodeName"), "pod is not scheduled to a node"),
        (metadata.get("deletionTimestamp"), "pod is terminating"),
        (phase == "Succeeded", "pod has completed"),
        (failed and controlled, "pod has failed (its controller replaces it)"),
        (
            eviction_cost(annotations) >= keys.EVICTION_COST_NEVER,
            f"eviction cost is MaxInt32 ({keys.EVICTION_COST})",
        ),
        (
            MIRROR_POD in annotations or annotations.get(CONFIG_SOURCE, "api") != "api",
            "pod is a static pod (its kubelet runs it from a manifest)",
        ),
        (
            any(
                owner.get("kind") == "DaemonSet" for owner in metadata.get("ownerReferences") or ()
            ),
            "pod is a DaemonSet pod",
        ),
        (
            not controlled and not (failed and evict_failed_bare_pods),
            "pod has no owner to recreate it (evictFailedBarePods allows failed ones)",
        ),
    )
    return next((reason for holds, reason in rules if holds), None)


def eviction_cost(annotations: Mapping[str, str]) -> int:
    """scheduling.koordinator.sh/eviction-cost, an int32 (MaxInt32 and above: never
    migrate); unset, not an integer, or below the least int32 is 0 (whoever may label
    a pod writes it: no number jumps the order further than an int32 can)."""
    try:
        cost = int(annotations.get(keys.EVICTION_COST, 0))
    except ValueError:
        return 0
    return cost if cost >= -(2**31) else 0


def is_healthy(pod: Object) -> bool:
    """Running, Ready and not terminating: what a PodDisruptionBudget counts as healthy,
    so evicting the pod takes one of its disruptions."""
    return protocol.is_ready(pod) and not pod["metadata"].get("deletionTimestamp")


def guarded_by_budgets(pod: Object) -> bool:
    """Whether the Eviction API looks at the pod's PodDisruptionBudgets at all: not for a
    pod Pending, finished or terminating, which it deletes as asked (`canIgnorePDB`)."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Pending", "Succeeded", "Failed") and not pod["metadata"].get(
        "deletionTimestamp"
    )


PROPAGATION_POLICIES = ("Orphan", "Background", "Foreground")


def delete_options_problem(options: object) -> str | None:
    """What in DeleteOptions (a job's, or defaultDeleteOptions; free-form, as the seeds'
    metav1.DeleteOptions) Berth cannot pass on, as the rest of a sentence after the
    field's name (` is not an object`, `.gracePeriodSeconds '60' is ...`); None: nothing.
    Only the fields Berth uses are read: gracePeriodSeconds and propagationPolicy."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        return " is not an object"
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (
        isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace < 2**63
    ):
        return f".gracePeriodSeconds {grace!r} is not a number of seconds"
    policy = options.get("propagationPolicy")
    if policy is not None and policy not in PROPAGATION_POLICIES:
        return f".propagationPolicy {policy!r} is not one of {', '.join(PROPAGATION_POLICIES)}"
    return None


SOFT_EVICTION_INITIATOR = "PodMigrationJob/"
"""How the soft-eviction annotation Berth writes names who triggered it: the job, after
this prefix."""


def soft_eviction(job: str, delete_options: Mapping[str, Any], now: datetime) -> str:
    """The value of `keys.SOFT_EVICTION` that the SoftEviction policy writes on the pod of
    job `job`: when, why, who triggered it, and the delete options to use."""
    return json.dumps(
        {
            "timestamp": now.isoformat(),
            "reason": "PodMigrationJob",
            "initiator": f"{SOFT_EVICTION_INITIATOR}{job}",
            "deleteOptions": dict(delete_options),
        }
    )


def soft_evicted(pod: Object) -> bool:
    """Whether the pod carries a soft eviction, whoever wrote it: whatever acts on it is
    to remove the pod."""
    return keys.SOFT_EVICTION in ((pod.get("metadata") or {}).get("annotations") or {})


def _soft_eviction_of(pod: Object) -> dict[str, Any]:
    """The pod's soft eviction as an object ({}: none, or not one)."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.SOFT_EVICTION)
    try:
        # orjson: nesting however deep is a ValueError, never a RecursionError.
        found = orjson.loads(value) if isinstance(value, str) else None
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def soft_eviction_job(pod: Object) -> str | None:
    """The job whose soft eviction the pod carries (`soft_eviction`: its initiator), or
    None: none, one someone else wrote, or one an earlier version wrote (naming none)."""
    initiator = _soft_eviction_of(pod).get("initiator")
    if not isinstance(initiator, str) or not initiator.startswith(SOFT_EVICTION_INITIATOR):
        return None
    return initiator.removeprefix(SOFT_EVICTION_INITIATOR) or None


def soft_evicted_by(pod: Object, job: str) -> bool:
    """Whether the pod's soft eviction is the one job `job` wrote (`soft_eviction`), or
    one an earlier version of Berth wrote, naming no job (only one job migrates a pod at
    a time); not one someone else wrote."""
    found = _soft_eviction_of(pod)
    if "initiator" not in found:
        return bool(found.get("reason") == "PodMigrationJob")
    return soft_eviction_job(pod) == job
