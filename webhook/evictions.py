"""What to answer to an eviction (`pods/eviction` CREATE): pure decisions.

Tools that only know the Eviction API (kubectl drain, the descheduler, autoscalers) evict
first and leave the replacement to find a place. Berth answers such an eviction the way a
PodDisruptionBudget does when it cannot allow one yet, HTTP 429, and migrates the pod with
a PodMigrationJob in the meantime; the tool retries, finds the pod gone, and moves on.

The API server authorises `pods/eviction` for the requester before any admission webhook
runs, so the job the webhook creates on the requester's behalf ends in an eviction the
requester was already allowed to make: Berth's rights lend it nothing.

The checks, in order:
- `screen`: the request alone. Berth's own evictions (the controller's, known by the
  identity the API server authenticated, never by anything in the body), dry runs, a
  controller in dryRun (its jobs would never start), an `evictionPolicy` other than
  Eviction (the job would then delete or only annotate the pod, not what was asked),
  namespaces not opted in, namespaces `namespaces` excludes, requesters not listed.
- `already_migrated`: the pod is the replacement a job made from this requester's
  eviction put in place. A StatefulSet's replacement has the original's name, and kubectl
  drain re-reads the pod by name after each 429 and evicts whatever pod has it now, with
  no UID precondition: without this, it would evict the replacement in turn, gated and
  not yet scheduled (a pod Berth never migrates, below), or bound to its reserved node.
  It is answered 404 (the pod it meant is gone), which drain counts as done. Not when the
  replacement's node is being drained (`berth.scheduling.being_drained`: cordoned,
  tainted against it, or marked for removal by Cluster Autoscaler or Karpenter): that is a
  drain of that node, and the replacement is migrated off it as any pod is.
- `screen_pod`: the pod. A pod Berth never migrates (`berth.eviction.forbidden`: no
  controller, DaemonSet, static, not scheduled, terminating, ...) is evicted as asked.
- `verdict`: the job for the pod (named after the pod's UID, so every replica and every
  retry finds the same one). Not ended: 429, naming the job. Ended while the pod is still
  there (the job failed or was aborted): the eviction goes through, so a drain is never
  blocked for good; but 429 still when arbitration failed it because another job is
  migrating the pod (that job moves it). Paused, or not ended a minute after its TTL
  (at most `defaultJobTTL`: the controller is not running, or someone wrote the job to
  hold drains off): the eviction goes through.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from berth import eviction as evictability
from berth.api import (
    ALREADY_MIGRATING,
    SUCCEEDED_PHASES,
    TERMINAL_PHASES,
    PodMigrationJobConditionType,
    PodMigrationJobReason,
    format_duration,
    is_zero,
    keys,
    migrating_job,
    parse_duration,
)
from berth.protocol import Object, claim_of, controller_of, owner_uids, pod_claim
from berth.settings import REPLACEMENT_GRACE, EvictionPolicy, MigrationControllerArgs

JOB_PREFIX = "eviction-"
"""Name of a job made from an intercepted eviction: this prefix and the pod's UID."""


@dataclass(frozen=True)
class Eviction:
    """An eviction as the admission review gives it."""

    uid: str
    """The review's UID."""
    namespace: str
    pod: str
    """Name of the pod to evict."""
    user: str
    """The requester, as the API server authenticated it."""
    groups: tuple[str, ...]
    dry_run: bool
    """Asked by the request or by the Eviction's deleteOptions."""
    uid_precondition: str | None = None
    """The UID the eviction's deleteOptions require the pod to have."""
    grace_period_seconds: int | None = None
    """The grace period the eviction's deleteOptions ask for (`kubectl drain
    --grace-period`): the job evicts the pod with it."""


@dataclass(frozen=True)
class Pass:
    """Let the eviction go ahead."""

    reason: str
    message: str


@dataclass(frozen=True)
class Deny:
    """Answer 429: the pod is being migrated by `job`; retry later."""

    reason: str
    job: str
    message: str


@dataclass(frozen=True)
class Gone:
    """Answer 404: the pod the requester meant is gone, replaced through a migration."""

    reason: str
    message: str


Answer = Pass | Deny | Gone


def screen(
    eviction: Eviction,
    *,
    settings: MigrationControllerArgs,
    controller_user: str,
    labelled: bool,
) -> Pass | None:
    """Why the eviction goes ahead without looking at the pod, or None to go on.

    `labelled`: the namespace carries `berth.sh/intercept-evictions: "true"` (the webhook
    configuration sends evictions of labelled and unlabelled namespaces to two paths).
    """
    config = settings.eviction_interception
    if eviction.user == controller_user:
        return Pass("BerthEviction", "the eviction is Berth's own")
    if eviction.dry_run:
        return Pass("DryRun", "a dry run creates no job")
    if settings.dry_run:
        # Its jobs would wait, Pending, until their TTL: the eviction would only be late.
        return Pass("ControllerDryRun", "the controller runs with dryRun: it starts no job")
    if settings.eviction_policy != EvictionPolicy.EVICTION:
        # A job would remove the pod another way (a delete ignores PodDisruptionBudgets):
        # more than the requester asked for and was authorised to do.
        return Pass(
            "EvictionPolicy",
            f"evictionPolicy is {settings.eviction_policy}: a job would not evict through "
            "the Eviction API as asked",
        )
    if not labelled and not config.all_namespaces:
        return Pass(
            "NotOptedIn",
            f"namespace {eviction.namespace} is not labelled {keys.INTERCEPT_EVICTIONS}=true",
        )
    refused = settings.namespaces.refuses(eviction.namespace) if settings.namespaces else None
    if refused:
        return Pass("NamespaceExcluded", refused)
    listed = config.requesters
    if listed is not None and (
        eviction.user not in listed.users and not set(eviction.groups) & set(listed.groups)
    ):
        return Pass(
            "RequesterNotListed",
            f"{eviction.user} is not among evictionInterception.requesters",
        )
    return None


def not_opted_in(namespace: Object | None, eviction: Eviction) -> Pass | None:
    """Why an eviction that came on the labelled path goes ahead as asked, or None: its
    namespace (as read now; None: gone) carries `berth.sh/intercept-evictions: "true"`.
    The API server chose the path by that label; a review posted to the path by anyone
    else, or a label taken off since, makes no job."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(keys.INTERCEPT_EVICTIONS) == "true":
        return None
    return Pass(
        "NotOptedIn",
        f"namespace {eviction.namespace} is not labelled {keys.INTERCEPT_EVICTIONS}=true "
        "(any more), although the review came to the path of labelled namespaces",
    )


def screen_pod(pod: Object, eviction: Eviction) -> Pass | None:
    """Why the eviction goes ahead as asked for this pod, or None: Berth never migrates
    the pod, or the eviction is for another pod of that name (its UID precondition,
    which the API server then refuses)."""
    uid = pod["metadata"].get("uid")
    if eviction.uid_precondition is not None and eviction.uid_precondition != uid:
        return Pass("OtherPod", f"the eviction requires UID {eviction.uid_precondition}")
    reason = evictability.forbidden(pod)
    return Pass("NotMigratable", reason) if reason else None


ATTEMPTS = 5
"""Jobs made for one pod at most: after the first (`eviction-<pod UID>`), each later
eviction whose job ended long ago gets a new one (`eviction-<pod UID>-2`, ...)."""


def job_name(pod: Object, attempt: int = 1) -> str:
    """The name of the `attempt`th job made for the pod's evictions: every webhook replica
    and every retry of an eviction finds the same one."""
    suffix = f"-{attempt}" if attempt > 1 else ""
    return f"{JOB_PREFIX}{pod['metadata']['uid']}{suffix}"


def stale(job: Object, *, now: datetime, default_ttl: timedelta) -> bool:
    """Whether the job ended long ago (a minute past its TTL): a later eviction of its pod
    (a drain days later, the descheduler's next run) is no retry of the one it was made
    for, and gets a new job rather than going through on the old one's end."""
    phase = (job.get("status") or {}).get("phase")
    return phase in TERMINAL_PHASES and _overdue(job, now=now, default_ttl=default_ttl) is not None


def requester_label(user: str) -> str:
    """`user` as a label value: characters a label may not hold become dots, and a name
    too long for a label keeps its start and a hash of the whole."""
    value = re.sub(r"[^A-Za-z0-9_.-]", ".", user).strip("._-")
    if len(value) > 63:
        digest = hashlib.sha256(user.encode()).hexdigest()[:10]
        value = f"{value[:52].rstrip('._-')}-{digest}"
    return value or "unknown"


def pod_label(namespace: str, name: str) -> str:
    """The value of a job's `berth.sh/eviction-of` label for the pod `namespace/name`.
    Two pods may share one (a dot in a name, a long name's hash): a job found by it is
    checked against its podRef all the same."""
    return requester_label(f"{namespace}.{name}")


def job_for(
    pod: Object, *, eviction: Eviction, settings: MigrationControllerArgs, attempt: int = 1
) -> dict[str, Any]:
    """The PodMigrationJob that carries out the eviction: the configuration's
    `defaultJobMode` and `defaultJobTTL`, labelled with the requester, and the grace
    period the eviction asked for, if any."""
    metadata = pod["metadata"]
    options = (
        {
            "deleteOptions": {
                **(settings.default_delete_options or {}),
                "gracePeriodSeconds": eviction.grace_period_seconds,
            }
        }
        if eviction.grace_period_seconds is not None
        else {}
    )
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "PodMigrationJob",
        "metadata": {
            "name": job_name(pod, attempt),
            "labels": {
                keys.REQUESTER: requester_label(eviction.user),
                keys.EVICTION_OF: pod_label(metadata["namespace"], metadata["name"]),
            },
            "annotations": {keys.REQUESTER: eviction.user},
        },
        "spec": {
            "mode": str(settings.default_job_mode),
            "ttl": format_duration(settings.default_job_ttl),
            "podRef": {
                "namespace": metadata["namespace"],
                "name": metadata["name"],
                "uid": metadata["uid"],
            },
            **options,
        },
    }


def replaces_by_name(pod: Object, eviction: Eviction) -> bool:
    """Whether `pod` may be the replacement of a pod its workload's controller made again
    under the same name (a StatefulSet's), reached by a retry by name: only then are the
    requester's jobs for that name looked up (`already_migrated` decides)."""
    controller = controller_of(pod) or {}
    return eviction.uid_precondition is None and controller.get("kind") == "StatefulSet"


def replaced_in(pod: Object, reservations: Mapping[str, Object]) -> str | None:
    """The job whose Reservation `pod` took (the pod is the replacement that job put in
    place), or None: the pod is recorded as the Reservation's owner, or carries its
    current claim (between the webhook's claim and the controller's record of it).
    Reservations are written by Berth alone; a claim copied onto a pod by its author
    counts only as far as `already_migrated` lets it."""
    uid = pod["metadata"].get("uid")
    token = pod_claim(pod)
    for reservation in reservations.values():
        if uid in owner_uids(reservation) or (token and claim_of(reservation) == token):
            job = (reservation["metadata"].get("annotations") or {}).get(keys.JOB)
            return str(job) if job else None
    return None


def waited_for(own: Object | None, job: Object, eviction: Eviction) -> bool:
    """Whether `own`, the job the webhook made for this requester's eviction of the pod
    `job` migrated (`job_name` of that pod), ended because `job` was migrating the pod:
    the requester was told to retry until `job` moved it (`verdict`,
    MigratedByAnotherJob). Jobs are written by whoever may create them; this only ever
    answers a retry 404, never evicts anything."""
    if own is None:
        return False
    mine = (own.get("metadata", {}).get("annotations") or {}).get(keys.REQUESTER)
    moved = (job.get("spec", {}).get("podRef") or {}).get("uid")
    status = own.get("status") or {}
    return (
        mine == eviction.user
        and bool(moved)
        and (own.get("spec", {}).get("podRef") or {}).get("uid") == moved
        and status.get("reason") == PodMigrationJobReason.FORBIDDEN_MIGRATE_POD
        and ALREADY_MIGRATING in str(status.get("message") or "")
    )


def already_migrated(
    job: Object,
    pod: Object,
    *,
    eviction: Eviction,
    now: datetime,
    draining: bool,
    waited: bool = False,
) -> Gone | None:
    """404 when this eviction is the requester retrying, on the replacement, the eviction
    `job` carried out: the job is that requester's (or the requester was told to wait
    for it: `waited`, see `waited_for`), its TTL (with `REPLACEMENT_GRACE`) has not run
    out, and `pod` took the name of the pod the job migrated (a retry by name reaches a
    replacement no other way) without being that pod. Not when the eviction names a UID
    (it means this pod), nor when the replacement's node is being drained (`draining`: a
    drain of that node is evicting it)."""
    metadata = job["metadata"]
    if (metadata.get("annotations") or {}).get(keys.REQUESTER) != eviction.user and not waited:
        return None
    ref = job.get("spec", {}).get("podRef") or {}
    if (
        eviction.uid_precondition is not None
        or draining
        or (ref.get("namespace"), ref.get("name")) != (eviction.namespace, eviction.pod)
        or not ref.get("uid")
        or ref.get("uid") == pod["metadata"].get("uid")
    ):
        return None
    times = _created_and_ttl(job)
    if times is None or now > times[0] + times[1] + REPLACEMENT_GRACE:
        return None
    return Gone(
        "AlreadyMigrated",
        f"pod {eviction.namespace}/{eviction.pod} is the replacement PodMigrationJob "
        f"{metadata['name']} put in place of the pod evicted by {eviction.user}; "
        "that pod is gone",
    )


class Other(NamedTuple):
    """The job another job of the pod was failed for (`migrating_job`): its name, and the
    job as the API server has it (None: gone)."""

    name: str
    job: Object | None


def moved_on(other: Other | None) -> bool:
    """Whether the job a job waited behind (`behind`) has ended, or is gone: that wait is
    over, and the pod, still here, gets a new attempt, which migrates it."""
    if other is None:
        return False
    return other.job is None or (other.job.get("status") or {}).get("phase") in TERMINAL_PHASES


def moved(job: Object) -> bool:
    """Whether the job went for its pod: it succeeded, or it recorded an eviction (a
    StatefulSet makes the replacement as soon as the pod is gone, before the job records
    the eviction complete). Not a job that ended before evicting (MissingPod, say)."""
    status = job.get("status") or {}
    if status.get("phase") in SUCCEEDED_PHASES:
        return True
    return any(
        isinstance(c, dict) and c.get("type") == PodMigrationJobConditionType.EVICTION
        for c in status.get("conditions") or []
    )


def behind(job: Object) -> str | None:
    """The job arbitration failed `job` for, as migrating its pod already (None: it was
    not, or an earlier version wrote the message without naming it)."""
    status = job.get("status") or {}
    if status.get("reason") != PodMigrationJobReason.FORBIDDEN_MIGRATE_POD:
        return None
    return migrating_job(str(status.get("message") or ""))


def verdict(
    job: Object,
    pod: Object,
    *,
    now: datetime,
    default_ttl: timedelta,
    other: Other | None = None,
) -> Pass | Deny:
    """The answer once the pod's job exists: 429 while it runs; through once it ended
    and the pod is still there. A job of that name for another pod (made by hand to
    hold the pod's evictions off), a paused one (it waits for a person), and one not
    ended `REPLACEMENT_GRACE` after its TTL (no more than `default_ttl`, what the webhook
    gives its jobs: the controller is down, or the job was written to hold drains off)
    never block the eviction. A job arbitration failed because another job migrates the
    pod keeps the requester waiting while that job (`other`, `behind`) would be waited
    for on its own account: it moves the pod."""
    name = job["metadata"]["name"]
    ref = job.get("spec", {}).get("podRef") or {}
    metadata = pod["metadata"]
    if (ref.get("namespace"), ref.get("name"), ref.get("uid")) != (
        metadata["namespace"],
        metadata["name"],
        metadata["uid"],
    ):
        return Pass("JobMismatch", f"PodMigrationJob {name} is not about this pod")
    status = job.get("status") or {}
    phase = status.get("phase") or "Pending"
    overdue = _overdue(job, now=now, default_ttl=default_ttl)
    if overdue:
        return Pass(
            "JobOverdue",
            f"PodMigrationJob {name} is still {phase} {int(overdue.total_seconds())}s past "
            "its TTL and a minute's grace (is the controller running?): letting the "
            "eviction through",
        )
    where = f"pod {metadata['namespace']}/{metadata['name']}"
    if phase in TERMINAL_PHASES:
        message = str(status.get("message") or "")
        if status.get("reason") == PodMigrationJobReason.FORBIDDEN_MIGRATE_POD and (
            ALREADY_MIGRATING in message
        ):
            return _behind(other, name, where, now=now, default_ttl=default_ttl)
        why = status.get("reason") or message or "no reason given"
        return Pass(
            "JobEnded",
            f"PodMigrationJob {name} ended {phase} ({why}) and the pod is still here: "
            "letting the eviction through",
        )
    if job.get("spec", {}).get("paused"):
        return Pass(
            "JobPaused",
            f"PodMigrationJob {name} is paused (it waits for a person): letting the "
            "eviction through",
        )
    waiting = f"; {status['message']}" if status.get("message") else ""
    return Deny(
        "JobInProgress",
        name,
        f"{where} is being migrated by PodMigrationJob {name} (phase {phase}{waiting}); "
        "retry the eviction later",
    )


def _behind(
    other: Other | None, name: str, where: str, *, now: datetime, default_ttl: timedelta
) -> Pass | Deny:
    """The answer while the pod's job waits behind `other`, the job migrating the pod:
    429 as long as that job would hold the eviction back itself (running, not paused,
    not overdue), through otherwise. Unnamed (a message of an earlier version): 429,
    until the pod's own job is overdue."""
    if other is None:
        return Deny(
            "MigratedByAnotherJob", name, f"{where} {ALREADY_MIGRATING}; retry the eviction later"
        )
    if other.job is None:
        return Pass(
            "MigratingJobGone",
            f"PodMigrationJob {other.name}, which was migrating {where}, is gone and the pod "
            "is still here: letting the eviction through",
        )
    status = other.job.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase in TERMINAL_PHASES:
        return Pass(
            "MigratingJobEnded",
            f"PodMigrationJob {other.name}, which was migrating {where}, ended {phase} and "
            "the pod is still here: letting the eviction through",
        )
    if other.job.get("spec", {}).get("paused"):
        return Pass(
            "MigratingJobPaused",
            f"PodMigrationJob {other.name}, which migrates {where}, is paused (it waits for "
            "a person): letting the eviction through",
        )
    overdue = _overdue(other.job, now=now, default_ttl=default_ttl)
    if overdue:
        return Pass(
            "MigratingJobOverdue",
            f"PodMigrationJob {other.name}, which migrates {where}, is still {phase} "
            f"{int(overdue.total_seconds())}s past its TTL (no longer than defaultJobTTL) and "
            "a minute's grace: letting the eviction through",
        )
    return Deny(
        "MigratedByAnotherJob",
        name,
        f"{where} is being migrated by PodMigrationJob {other.name} (phase {phase}); retry "
        "the eviction later",
    )


def in_progress(job: str, eviction: Eviction) -> Deny:
    """429 naming the job, when no more can be said of it (the API server failed after the
    job was made)."""
    return Deny(
        "JobInProgress",
        job,
        f"pod {eviction.namespace}/{eviction.pod} is being migrated by PodMigrationJob {job}; "
        "retry the eviction later",
    )


def _created_and_ttl(job: Object) -> tuple[datetime, timedelta] | None:
    """When the job was created and its TTL (0 when unset); None when either cannot be
    read."""
    try:
        created = datetime.fromisoformat(job["metadata"]["creationTimestamp"])
        text = job.get("spec", {}).get("ttl") or "0s"
        ttl = parse_duration(text)
        if not ttl and not is_zero(text):  # under a microsecond: run out, not unset
            ttl = timedelta(microseconds=1)
    except (KeyError, TypeError, ValueError):
        return None
    return created, ttl


def _overdue(job: Object, *, now: datetime, default_ttl: timedelta) -> timedelta | None:
    """How long past its TTL (no more than `default_ttl`) and `REPLACEMENT_GRACE` the job
    is, if it is (None: not, or its times cannot be read)."""
    times = _created_and_ttl(job)
    if times is None:
        return None
    created, ttl = times
    late = now - (created + min(ttl or default_ttl, default_ttl) + REPLACEMENT_GRACE)
    return late if late > timedelta(0) else None
