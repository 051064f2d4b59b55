"""The pods kube-scheduler preempted to place a job's placeholder, as the job records them.

A placeholder that may preempt (`build.may_preempt`) is scheduled like any pod of its
priority: when no node fits, kube-scheduler (v1.36, framework/preemption/executor.go,
`PreemptPod`) picks a node, writes the placeholder's `status.nominatedNodeName`, and for
each victim first adds the pod condition `DisruptionTarget` (status True, reason
`PreemptionByScheduler`, message "<schedulerName>: preempting to accommodate a higher
priority pod") through the status subresource, then deletes it; the placeholder binds
once the victims are gone. The victim's "Preempted" event names the preemptor's UID, but
anyone who may create events in the victim's namespace can write one, so it is not read.

A victim is attributed to the placeholder by what the scheduler wrote: the condition
above, on a pod bound to the node the placeholder is nominated to or bound on, with a
priority below the placeholder's, its scheduler's name in the message, and the
condition's transition between the placeholder's creation and its binding. Pod status is
writable only by those granted `pods/status` (the scheduler, kubelets, node and
controller-manager components), so a user without that right cannot make a pod appear
here. What remains possible: another preemptor of higher priority, on the same node at
the same moment, whose victims then appear here too; the record says what the scheduler
did on that node meanwhile, never more.

Victims are deleted before the placeholder binds, often before the job's next pass, so
the caches keep the last state of every pod seen with that condition for a while
(`controller.caches`). A controller restarted between a preemption and its record has
no such memory; the job then goes on without the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from berth.api import PodMigrationJobConditionType, PodMigrationJobReason
from controller.actions import Event
from controller.jobs.view import JobView, Object
from controller.status import condition, parse_time, reference, with_condition

Type = PodMigrationJobConditionType
Reason = PodMigrationJobReason

DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"


def preemption_mark(pod: Mapping[str, Any]) -> Object | None:
    """The pod's DisruptionTarget condition, when the scheduler set it for a preemption."""
    found = condition(pod.get("status") or {}, DISRUPTION_TARGET)
    if found and found.get("status") == "True" and found.get("reason") == PREEMPTION_BY_SCHEDULER:
        return found
    return None


def placeholder_node(placeholder: Mapping[str, Any]) -> str | None:
    """The node the placeholder is bound on, else the one the scheduler nominated it to."""
    return (placeholder.get("spec") or {}).get("nodeName") or (placeholder.get("status") or {}).get(
        "nominatedNodeName"
    )


def victims(
    placeholder: Mapping[str, Any], candidates: Iterable[Mapping[str, Any]]
) -> list[Object]:
    """The pods of `candidates` the scheduler preempted to place `placeholder`, by name."""
    node = placeholder_node(placeholder)
    spec = placeholder.get("spec") or {}
    if node is None or spec.get("preemptionPolicy") == "Never":
        # A placeholder under the non-preempting twin made no room: pods preempted on
        # its node meanwhile were another pod's doing.
        return []
    priority = int(spec.get("priority") or 0)
    scheduler = str(spec.get("schedulerName") or "default-scheduler")
    created = parse_time(placeholder["metadata"]["creationTimestamp"])
    scheduled = condition(placeholder.get("status") or {}, "PodScheduled") or {}
    bound_at = (
        parse_time(scheduled["lastTransitionTime"])
        if scheduled.get("status") == "True" and scheduled.get("lastTransitionTime")
        else None
    )
    found: list[Object] = []
    for pod in candidates:
        mark = preemption_mark(pod)
        if mark is None or not mark.get("lastTransitionTime"):
            continue
        marked = parse_time(mark["lastTransitionTime"])
        if (
            (pod.get("spec") or {}).get("nodeName") == node
            and int((pod.get("spec") or {}).get("priority") or 0) < priority
            and str(mark.get("message") or "").startswith(f"{scheduler}:")
            and marked >= created
            and (bound_at is None or marked <= bound_at)
        ):
            found.append(dict(pod))
    return sorted(found, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))


def _names(refs: Iterable[Mapping[str, Any]]) -> str:
    return ", ".join(f"{ref.get('namespace')}/{ref.get('name')}" for ref in refs)


def record(view: JobView, status: Object, *, placed: bool) -> tuple[Object, tuple[Event, ...]]:
    """The status with the pods preempted for the job's placeholder added to
    `preemptedPodsRef` and the Preemption condition (Preempting while the placeholder
    waits for its victims to go, PreemptComplete once `placed`), and the news to tell.
    Unchanged, with no news, when the scheduler preempted nothing for it."""
    recorded: list[Object] = list(status.get("preemptedPodsRef") or [])
    known = {ref.get("uid") for ref in recorded}
    placeholder = view.placeholder
    new = [
        reference(pod)
        for pod in (victims(placeholder, view.preempted) if placeholder is not None else [])
        if pod["metadata"].get("uid") not in known
    ]
    if not recorded and not new:
        return status, ()
    refs = [*recorded, *new]
    node = placeholder_node(placeholder) if placeholder is not None else None
    where = f" on {node}" if node else ""
    current = condition(status, Type.PREEMPTION) or {}
    if placed:
        if not new and current.get("reason") == Reason.PREEMPT_COMPLETE:
            return status, ()
        message = f"preempted{where}: {_names(refs)}"
        state, reason = "True", Reason.PREEMPT_COMPLETE
    else:
        if not new:
            return status, ()
        message = f"preempting{where}: {_names(refs)}"
        state, reason = "False", Reason.PREEMPTING
    status = with_condition(
        {**status, "preemptedPodsRef": refs},
        kind=Type.PREEMPTION,
        state=state,
        reason=reason,
        message=message,
        now=view.now,
    )
    verb = "Preempted" if placed else "Preempting"
    event = Event(
        view.job,
        reason,
        f"{verb} {_names(new or refs)}{where} to place the Reservation's placeholder",
    )
    return status, (event,)
