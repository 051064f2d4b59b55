"""The eviction: announce it, evict, try again while the pod stays, see it gone.

Also the whole of an EvictDirectly job, which is the eviction alone.
"""

from __future__ import annotations

from berth.api import (
    PodMigrationJobConditionType,
    PodMigrationJobPhase,
    PodMigrationJobReason,
    keys,
)
from berth.api.times import read_time
from berth.eviction import soft_evicted, soft_evicted_by
from berth.settings import EvictionPolicy
from controller.actions import Action, Event, Plan
from controller.jobs.consumable import closing
from controller.jobs.view import (
    EVICTION_RETRY,
    OVERDUE,
    REOPEN_AFTER,
    WAIT_POLL,
    JobView,
    Object,
    evict,
    fail,
    job_name,
    pod_gone,
    pod_key,
    released,
    step,
    why_pod_gone,
    write_status,
)
from controller.status import condition, same_condition, with_condition

Type = PodMigrationJobConditionType
Reason = PodMigrationJobReason


def start_eviction(view: JobView, status: Object) -> tuple[Object, tuple[Action, ...]]:
    """The status that records Evicting, and what follows its write: the Evicting event,
    then the eviction. Recorded first, so that a pod found missing later is known to
    have been evicted, never mistaken for a pod that vanished on its own."""
    assert view.pod is not None
    pod = view.pod["metadata"]
    status = with_condition(
        status,
        kind=Type.EVICTION,
        state="False",
        reason=Reason.EVICTING,
        message=f"evicting {pod['namespace']}/{pod['name']}",
        now=view.now,
    )
    status.update(status=Reason.EVICTING, reason="", message="")
    event = Event(view.job, Reason.EVICTING, f'Try to evict Pod "{pod["namespace"]}/{pod["name"]}"')
    eviction = evict(view)
    if eviction.policy == EvictionPolicy.SOFT_EVICTION and soft_evicted(view.pod):
        # Annotated already (by someone else): whatever acts on it removes the pod, and
        # that writer's request is not overwritten.
        return status, (event,)
    return status, (event, eviction)


def still_evicting(view: JobView, status: Object, *, expired: bool) -> Plan:
    """The pod is still there: wait for its termination, or evict again; until the TTL."""
    assert view.pod is not None
    deleted = view.pod["metadata"].get("deletionTimestamp")
    if deleted and expired:
        return fail(
            view,
            status,
            reason=Reason.TIMEOUT,
            message=f"TTL expired while pod {pod_key(view)} was still terminating (due to be "
            f"gone at {deleted}: a finalizer, an unreachable node or a long grace period "
            f"keeps it); {released(view)}",
        )
    soft = soft_evicted(view.pod)
    if soft and expired:
        removed = "removed" if soft_evicted_by(view.pod, job_name(view)) else "left to its writer"
        return fail(
            view,
            status,
            reason=Reason.TIMEOUT,
            message=f"TTL expired while pod {pod_key(view)}, annotated for soft eviction "
            f"({keys.SOFT_EVICTION}), was still there: nothing acting on that annotation "
            f"evicted it; the annotation is {removed} and {released(view)}",
        )
    if deleted or soft or (view.job["spec"].get("paused") and not expired):
        # Terminating, or annotated: whatever acts on the annotation removes the pod.
        return Plan().again_in(WAIT_POLL)
    if expired:
        return fail(
            view,
            status,
            reason=Reason.TIMEOUT,
            message=f"TTL expired while pod {pod_key(view)} could not be evicted "
            f"({(condition(status, Type.EVICTION) or {}).get('message')}); "
            f"nothing was evicted and {released(view)}",
        )
    # The status as it is, written back first: a write conditional on the job as read,
    # which the API server refuses if the job changed since (aborted, paused), so that a
    # pass working from an older copy sends no eviction. It changes nothing: no event.
    return Plan().then(write_status(view, status), evict(view)).again_in(EVICTION_RETRY)


def evicted(
    view: JobView, status: Object, *, terminating_since: str | None = None
) -> tuple[Object, tuple[Event, ...]]:
    """The pod is gone (or, `terminating_since`, still terminating with that deletion
    timestamp, and counted as gone: `bind.overdue`): the status that records
    EvictComplete, and the news to tell (none when it was recorded before; a pod seen
    terminating, then gone, only has the condition's message brought up to date)."""
    gone = _gone(view, terminating_since)
    eviction = condition(status, Type.EVICTION) or {}
    recorded = eviction.get("status") == "True"
    if recorded and (terminating_since is not None or eviction.get("message") == gone):
        return status, ()
    updated = with_condition(
        status,
        kind=Type.EVICTION,
        state="True",
        reason=Reason.EVICT_COMPLETE,
        message=gone,
        now=view.now,
    )
    if recorded:
        return updated, ()
    updated.update(status=Reason.EVICT_COMPLETE, reason="", message="")
    return updated, (
        Event(view.job, Reason.EVICT_COMPLETE, f'Pod "{pod_key(view)}" has been evicted'),
    )


def _gone(view: JobView, terminating_since: str | None) -> str:
    """What the Eviction condition says of the pod: gone, or still terminating and why."""
    if terminating_since is None:
        return f"pod {pod_key(view)} is gone"
    due = read_time(terminating_since)
    if due is not None and view.now < due:
        keeps = "its grace period has not ended"
    elif due is not None and view.now < due + OVERDUE:
        keeps = "its grace period has just ended"
    else:
        keeps = "a finalizer or an unreachable node keeps it"
    return (
        f"pod {pod_key(view)} is still terminating, due to be gone at {terminating_since} ({keeps})"
    )


def evict_directly(view: JobView, status: Object, *, expired: bool, evicting: bool) -> Plan:
    """An EvictDirectly job: evict at once; Succeed when the pod is gone."""
    if not evicting:
        if pod_gone(view) or view.pod is None:
            return fail(
                view,
                status,
                reason=Reason.MISSING_POD,
                message=why_pod_gone(view),
            )
        if expired:
            return fail(
                view,
                status,
                reason=Reason.TIMEOUT,
                message="TTL expired before the pod was evicted",
            )
        if view.job["spec"].get("paused"):
            return Plan().again_in(WAIT_POLL)
        status, effects = start_eviction(view, status)
        return step(view, status, *effects).again_in(WAIT_POLL)
    if not pod_gone(view):
        return still_evicting(view, status, expired=expired)
    status, news = evicted(view, status)
    status.update(phase=PodMigrationJobPhase.SUCCEED, status=Reason.COMPLETE, reason="", message="")
    return step(
        view,
        status,
        *news,
        Event(view.job, Reason.COMPLETE, f'Pod "{pod_key(view)}" evicted directly'),
    )


def eviction_refused(view: JobView, *, status_code: int, message: str, by_budget: bool) -> Plan:
    """The API server refused the eviction: say why on the job (condition, status and a
    Warning event) and try again in `EVICTION_RETRY` seconds, until the TTL.

    Refused `by_budget` (429 with a DisruptionBudget cause): a PodDisruptionBudget allows
    no disruption now, BlockedByPDB. Any other refusal (403, a 429 of API Priority and
    Fairness or of a webhook, 500, 503...) is FailedEvict, with the status code in the
    message.
    """
    status: Object = dict(view.job.get("status") or {})
    close_patch = closing(view)
    close = (close_patch,) if close_patch else ()
    # A closed Reservation is reopened before the next attempt, which waits the settle time.
    retry = REOPEN_AFTER.total_seconds() if close else EVICTION_RETRY
    if by_budget:
        reason = Reason.BLOCKED_BY_PDB
    else:
        reason = Reason.FAILED_EVICT
        message = f"the Eviction API answered {status_code}: {message}"
    if same_condition(status, kind=Type.EVICTION, state="False", reason=reason, message=message):
        return Plan().then(*close).again_in(retry)
    status = with_condition(
        status, kind=Type.EVICTION, state="False", reason=reason, message=message, now=view.now
    )
    status.update(status=reason, reason=reason, message=message)
    return (
        Plan()
        .then(write_status(view, status))
        .then(Event(view.job, reason, message, type="Warning"))
        # Last: a close that conflicts with a claim made since leaves the rest said.
        .then(*close)
        .again_in(retry)
    )
