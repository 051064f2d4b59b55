"""Which step a job is at: the dispatch of the state machine."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from berth import protocol
from berth.api import (
    TERMINAL_PHASES,
    PodMigrationJobConditionType,
    PodMigrationJobMode,
    PodMigrationJobPhase,
    PodMigrationJobReason,
    go_form,
    keys,
    parse_duration,
)
from berth.api.times import read_time
from berth.eviction import delete_options_problem, soft_evicted, soft_evicted_by
from berth.kube.client import PODMIGRATIONJOBS, PODS
from berth.settings import REPLACEMENT_GRACE
from controller.actions import Delete, Event, Patch, Plan
from controller.arbitration.candidates import Candidate
from controller.arbitration.forbid import Rules, forbidden_to_migrate
from controller.jobs.bind import after_eviction
from controller.jobs.evict import evict_directly
from controller.jobs.marker import admitted
from controller.jobs.release import release
from controller.jobs.reserve import before_eviction
from controller.jobs.view import (
    JobView,
    Object,
    fail,
    job_name,
    pod_gone,
    source_uid,
    write_status,
)
from controller.status import condition, created_at, job_deadline, micro_timestamp

Phase = PodMigrationJobPhase
Reason = PodMigrationJobReason


def decide(view: JobView) -> Plan:
    """The next step for one job: a job without a mode first gets the configured one, then
    Pending ones only wait for their TTL (arbitration starts them), Running ones move on,
    finished ones release what they held (`_finished`). A Running job that arbitration
    did not admit (no valid admission mark) goes back to Pending, untouched."""
    status: Object = dict(view.job.get("status") or {})
    phase = status.get("phase") or Phase.PENDING
    if phase in TERMINAL_PHASES:
        return _finished(view, status)
    spec_step = _spec_step(view, status)
    if spec_step is not None:
        return spec_step
    due = job_deadline(view.job)
    if phase != Phase.RUNNING:
        return _pending(view, status, due=due)
    if not admitted(view.admission_key, view.job):
        return _not_admitted(view)
    expired = due is not None and view.now >= due
    eviction = condition(status, PodMigrationJobConditionType.EVICTION)
    evicting = eviction is not None
    if view.pod is not None and not pod_gone(view) and not (evicting and _eviction_sent(view)):
        # Arbitration's rules, run again on the pod as it is now, before any eviction
        # and before each further attempt: one refused (a PDB), or held back before it
        # was sent (its place's node cordoned moments before, a restart).
        rules = Rules.of(view.args, view.priority_classes)
        why = forbidden_to_migrate(Candidate(view.job, pod=view.pod), rules)
        if why is not None:
            return fail(view, status, reason=Reason.FORBIDDEN_MIGRATE_POD, message=why)
    if view.job["spec"].get("mode") == PodMigrationJobMode.EVICT_DIRECTLY:
        return evict_directly(view, status, expired=expired, evicting=evicting)
    if not evicting:
        return before_eviction(view, status, expired=expired)
    return after_eviction(view, status, expired=expired)


def _eviction_sent(view: JobView) -> bool:
    """Whether an eviction reached the job's pod: it is terminating, or carries a soft
    eviction (`berth.eviction.soft_evicted`)."""
    assert view.pod is not None
    return bool(view.pod["metadata"].get("deletionTimestamp")) or soft_evicted(view.pod)


def _spec_step(view: JobView, status: Object) -> Plan | None:
    """The job's end when its spec cannot be carried out (`spec_problem`), or what the
    controller records in it first (`_spec_to_record`); None when neither."""
    invalid = spec_problem(view.job["spec"])
    if invalid is not None:
        return fail(view, status, reason=PodMigrationJobReason.INVALID_SPEC, message=invalid)
    recorded = _spec_to_record(view)
    if recorded:
        return Plan().then(Patch(PODMIGRATIONJOBS, job_name(view), {"spec": recorded}))
    return None


def spec_problem(spec: Mapping[str, Any]) -> str | None:
    """What in a job's spec, which its schema lets in, cannot be carried out (None:
    nothing): a ttl that is no Go duration, deleteOptions (free-form in the schema, as
    the seeds' metav1.DeleteOptions) whose fields Berth passes on are of the wrong type.
    Said at once, before anything is created or evicted."""
    template = ((spec.get("reservationOptions") or {}).get("template") or {}).get("spec")
    for field, ttl in (
        ("spec.ttl", spec.get("ttl")),
        (
            "spec.reservationOptions.template.spec.ttl",
            template.get("ttl") if isinstance(template, Mapping) else None,
        ),
    ):
        if ttl:
            try:
                parse_duration(ttl)
            except (ValueError, TypeError) as error:
                return f"{field}: {error}"
    problem = delete_options_problem(spec.get("deleteOptions"))
    return f"spec.deleteOptions{problem}" if problem else None


def _pending(view: JobView, status: Object, *, due: datetime | None) -> Plan:
    """Not started yet: look again at the TTL, and fail then, saying why it waited."""
    if due is None:
        return Plan()
    if view.now < due:
        return Plan().again_in(max(0.5, (due - view.now).total_seconds()))
    waited = f": {status['reason']}: {status.get('message', '')}" if status.get("reason") else ""
    paused = " (paused)" if view.job["spec"].get("paused") else ""
    return fail(
        view,
        status,
        reason=PodMigrationJobReason.TIMEOUT,
        message=f"TTL expired before the job started{paused}{waited}",
    )


def _spec_to_record(view: JobView) -> Object:
    """What the controller writes into a job's spec before anything else (nothing, once
    written). defaultJobMode as the mode of a job that sets none: arbitration then judges
    the job by the mode it runs in, and a later change of the configuration never switches
    a job's mode halfway. The ttl in the form Go prints it (`5m` becomes `5m0s`, the same
    duration), as a Go controller writes the job back, so `kubectl get pmj` shows the TTL
    as the PodMigrationJob documentation does."""
    spec = view.job["spec"]
    recorded: Object = {}
    if not spec.get("mode"):
        recorded["mode"] = PodMigrationJobMode(view.args.default_job_mode).value
    ttl = spec.get("ttl")
    if ttl and go_form(ttl) != ttl:
        recorded["ttl"] = go_form(ttl)
    return recorded


NOT_ADMITTED_MESSAGE = (
    "status.phase Running was not written by Berth's arbitration (the job carries no "
    "valid admission mark); nothing was done, the job is Pending again and arbitration "
    "decides whether it starts"
)


def _not_admitted(view: JobView) -> Plan:
    """Running, but not admitted by arbitration: someone wrote the phase through the status
    subresource (which users may write to abort a job), or the job was admitted by a
    Berth that wrote no mark. Act on nothing it says: back to Pending with a clean status
    (conditions written with the phase are dropped too), so that arbitration judges the
    job like any other. Pending rather than Failed: a forger gains nothing over creating
    the job, and a job admitted before marks existed is simply judged again."""
    status: Object = {
        "phase": Phase.PENDING,
        "reason": PodMigrationJobReason.NOT_ADMITTED,
        "message": NOT_ADMITTED_MESSAGE,
    }
    return Plan().then(
        write_status(view, status),
        Event(view.job, PodMigrationJobReason.NOT_ADMITTED, NOT_ADMITTED_MESSAGE, type="Warning"),
    )


def _finished(view: JobView, status: Object) -> Plan:
    """A finished job: its admission mark goes (written back to Running, since its status
    is the user's to write, it goes through arbitration again instead of resuming), its
    Reservation is released, and one made from an eviction is deleted in time
    (`_collect`). One patch of its annotations, first: the actions stop at a failure, so
    nothing is deleted before the release went through."""
    marks: dict[str, str | None] = {}
    if keys.ADMISSION in protocol.annotations_of(view.job):
        marks[keys.ADMISSION] = None
    collected = _collect(view, marks)
    plan = Plan()
    if marks:
        patch = {"metadata": {"annotations": marks}}
        plan.then(Patch(PODMIGRATIONJOBS, job_name(view), patch))
    plan.then(*release(view, status).actions, *_soft_eviction_withdrawn(view), *collected.actions)
    if collected.requeue_after is not None:
        plan.again_in(collected.requeue_after)
    return plan


def _soft_eviction_withdrawn(view: JobView) -> tuple[Patch, ...]:
    """A pod this job annotated for soft eviction, still there once the job has ended
    (its TTL, an abort): the annotation goes. Whatever acts on it would otherwise evict
    the pod later, with no Reservation holding a place for it. UID-guarded: a new pod of
    the same name fails the patch untouched."""
    pod = view.pod
    if pod is None or not soft_evicted_by(pod, job_name(view)):
        return ()
    metadata = pod["metadata"]
    patch = {"metadata": {"uid": metadata["uid"], "annotations": {keys.SOFT_EVICTION: None}}}
    return (Patch(PODS, metadata["name"], patch, namespace=metadata.get("namespace")),)


def _collect(view: JobView, marks: dict[str, str | None]) -> Plan:
    """A finished job made from an eviction the webhook intercepted
    (`protocol.made_from_eviction`) is deleted `evictionInterception.keepFinished` after
    the controller first saw it finished (`keys.FINISHED_AT`, added to `marks` then),
    once its pod is gone: drains make one per pod they move, and nobody else deletes
    them. Not while the pod lives: the webhook numbers a pod's jobs (`eviction-<pod
    UID>`, then `-2`...) by the names taken, and a first one deleted beside a later one
    still running would be made again. Any other job is its creator's to delete."""
    keep = view.args.eviction_interception.keep_finished
    if not keep or not protocol.made_from_eviction(view.job):
        return Plan()
    finished = read_time(protocol.annotations_of(view.job).get(keys.FINISHED_AT))
    if finished is None:  # not marked yet, or the mark cannot be read: marked now
        marks[keys.FINISHED_AT] = micro_timestamp(view.now)
        return Plan().again_in(keep.total_seconds())
    # Not before the webhook stops reading it to answer a retried eviction of the
    # replacement (`webhook.evictions.already_migrated`, which goes by the job's own ttl:
    # `defaultJobTTL` may have been lowered since the job was made).
    created = created_at(view.job)
    try:
        ttl_end = max(job_deadline(view.job) or created, created + view.args.default_job_ttl)
        read_until = ttl_end + REPLACEMENT_GRACE
        left = (max(finished + keep, read_until) - view.now).total_seconds()
    except (OverflowError, ValueError):  # kept past year 9999, or a ttl no Go duration holds
        return Plan()
    if left > 0:
        return Plan().again_in(left)
    # The pod by the UID the job was made for (the webhook writes it in podRef; a job
    # never admitted has no other record of it): its deletion brings the job back
    # (`Caches._on_pod`).
    uid = source_uid(view.job) or view.job["spec"]["podRef"].get("uid")
    if view.pod is not None and (uid is None or view.pod["metadata"]["uid"] == uid):
        return Plan()
    return Plan().then(
        Delete(PODMIGRATIONJOBS, job_name(view), uid=view.job["metadata"].get("uid"))
    )
