"""Every Prometheus metric Berth exports, and the few helpers that derive their values.

Defining them all here keeps the names, labels and help texts in one list an operator can
read, and keeps label values (the `Literal` types) checked where they are set. Each
process runs one component and serves the default registry on `/metrics`
(`berth.server.add_metrics`), so a component exports only the metrics it sets (plus the
client's process metrics); the others have no samples there.

Names take the `berth_` prefix and base units (`_seconds`, `_total`), as Prometheus asks.
The gauges of jobs and Reservations by phase are recomputed from the controller's caches
rather than counted up and down, so they cannot drift from what the API server holds.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from prometheus_client import Counter, Gauge, Histogram

from berth import protocol
from berth.api import SUCCEEDED_PHASES, TERMINAL_PHASES, PodMigrationJobPhase, ReservationPhase
from berth.api.times import read_time
from berth.protocol import Object

LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)
"""Seconds, for the webhook's and the extender's answers: most take well under a
millisecond, and the API server and the scheduler give up after a few seconds. The
client's default buckets start at 5 ms, too coarse to tell a 0.2 ms answer from a 4 ms one."""

# ----- webhook ----------------------------------------------------------------------------

WebhookResult = Literal[
    "claimed", "taken_over", "reasserted", "lost", "skipped", "error", "malformed"
]

WEBHOOK_REQUESTS = Counter(
    "berth_webhook_requests_total",
    "Pod admission reviews answered, by result: claimed (bound to a Reservation it "
    "claimed), taken_over (bound to a Reservation whose claim no pod carried), reasserted "
    "(called again for a pod that already claimed one), lost (every matching Reservation "
    "went to other pods, or a claim to take over was carried), skipped (nothing to bind "
    "the pod to), "
    "error (the API server failed; the pod was let through unbound), malformed (refused).",
    ["result"],
)

WEBHOOK_REQUEST_DURATION = Histogram(
    "berth_webhook_request_duration_seconds",
    "Time to answer a pod admission review, claim included.",
    buckets=LATENCY_BUCKETS,
)

EvictionResult = Literal["intercepted", "passed", "gone", "error", "malformed"]

EVICTION_REVIEWS = Counter(
    "berth_eviction_reviews_total",
    "Eviction admission reviews answered, by result and reason: intercepted (429: the pod "
    "is migrated by a PodMigrationJob; reason JobCreated or JobInProgress), passed (the "
    "eviction goes ahead; reason BerthEviction, DryRun, ControllerDryRun, EvictionPolicy, "
    "NotOptedIn, NamespaceExcluded, RequesterNotListed, PodNotFound, OtherPod, "
    "NotMigratable, JobEnded, JobMismatch or JobRefused), gone (404: a retry on the "
    "replacement of a migrated pod; AlreadyMigrated), error (the API server failed; the "
    "eviction goes ahead), malformed (refused).",
    ["result", "reason"],
)

# ----- extender ---------------------------------------------------------------------------

ExtenderResult = Literal["ok", "bad_request", "not_ready"]

EXTENDER_REQUESTS = Counter(
    "berth_extender_requests_total",
    "kube-scheduler extender requests answered, by verb and result: ok, bad_request (not "
    "the extender/v1 type), not_ready (caches not synced yet).",
    ["verb", "result"],
)

EXTENDER_REQUEST_DURATION = Histogram(
    "berth_extender_request_duration_seconds",
    "Time to answer a kube-scheduler extender request, by verb.",
    ["verb"],
    buckets=LATENCY_BUCKETS,
)

# ----- controller -------------------------------------------------------------------------

JOBS = Gauge("berth_jobs", "PodMigrationJobs in the leader's cache, by phase.", ["phase"])

JOBS_FINISHED = Counter(
    "berth_jobs_finished_total",
    "PodMigrationJobs the controller ended, by phase and status.reason.",
    ["phase", "reason"],
)

JOB_PHASE_DURATION = Histogram(
    "berth_job_phase_duration_seconds",
    "Time a PodMigrationJob spent in a phase, observed when it left it: Pending until "
    "arbitration admitted or failed it, Running from its first step until it ended.",
    ["phase"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 21600),
)

EVICTIONS = Counter(
    "berth_evictions_total",
    "Evictions the controller attempted, by policy and result: evicted, blocked_by_pdb "
    "(429 for a PodDisruptionBudget), failed.",
    ["policy", "result"],
)

RESERVATIONS = Gauge(
    "berth_reservations", "Reservations in the leader's cache, by phase.", ["phase"]
)

WORKQUEUE_DEPTH = Gauge(
    "berth_workqueue_depth", "Jobs and Reservations waiting in the controller's work queue."
)

LEADER = Gauge(
    "berth_leader",
    "1 while this controller replica leads (acts on jobs), 0 while it stands by. A sum of "
    "0 over the replicas means no controller acts: gated pods wait.",
)

GATED_PODS = Gauge(
    "berth_gated_pods",
    "Pods held by Berth's scheduling gate, as the controller's cache shows them: "
    "replacements waiting for their Reservation's handover, which takes moments.",
)

OLDEST_GATE = Gauge(
    "berth_gated_pod_oldest_seconds",
    "Age of the oldest pod held by Berth's scheduling gate (0: none). Minutes mean a "
    "handover that does not happen: worth an alert.",
)

ARBITRATION_ROUND_DURATION = Histogram(
    "berth_arbitration_round_duration_seconds",
    "Time of one admission round: arbitrating the pending jobs and writing the decisions.",
)

RECONCILE_ERRORS = Counter(
    "berth_reconcile_errors_total",
    "Reconcile passes that failed, by the kind of object: job (PodMigrationJob), rsv "
    "(Reservation) or ns (a namespace's berth.sh/migrating label).",
    ["kind"],
)


def observe_jobs(jobs: Iterable[Object]) -> None:
    """Set `berth_jobs` from every job in the cache; phases without jobs read 0."""
    counts = collections.Counter(_job_phase(job) for job in jobs)
    for phase in PodMigrationJobPhase:
        JOBS.labels(phase=phase).set(counts[phase])


def observe_reservations(reservations: Iterable[Object]) -> None:
    """Set `berth_reservations` from every Reservation in the cache."""
    counts = collections.Counter(protocol.phase(r) for r in reservations)
    for phase in ReservationPhase:
        RESERVATIONS.labels(phase=phase).set(counts[phase])


def record_job_status(before: Object, after: Object, *, now: datetime) -> None:
    """Account for a status write the controller made: `before` is the job it read, `after`
    the job it wrote. A change of phase observes the time spent in the phase left, and an
    end counts in `berth_jobs_finished_total`."""
    left, entered = _job_phase(before), _job_phase(after)
    if left == entered:
        return
    since = _created(before) if left == PodMigrationJobPhase.PENDING else _first_step(before)
    if since is not None:
        JOB_PHASE_DURATION.labels(phase=left).observe(max((now - since).total_seconds(), 0))
    if entered in TERMINAL_PHASES:
        reason = (after.get("status") or {}).get("reason") or ""
        JOBS_FINISHED.labels(phase=entered, reason=reason).inc()


def _job_phase(job: Object) -> str:
    phase = str((job.get("status") or {}).get("phase") or PodMigrationJobPhase.PENDING)
    return PodMigrationJobPhase.SUCCEED if phase in SUCCEEDED_PHASES else phase


def _created(job: Object) -> datetime:
    return datetime.fromisoformat(job["metadata"]["creationTimestamp"])


def _first_step(job: Object) -> datetime | None:
    """When a Running job took its first step, which is right after its admission.

    Every first step writes a condition (ReservationCreated, ReservationScheduled or
    Eviction), and a condition's time moves only when its status does, so the earliest
    one tells; a job that ends before any step has none.
    """
    conditions = (job.get("status") or {}).get("conditions") or []
    times = (read_time(c.get("lastTransitionTime")) for c in conditions)
    return min((t for t in times if t is not None), default=None)


# ----- serving (webhook, extender, the controller's health port) -------------------------

SERVING_CERTIFICATE_NOT_AFTER = Gauge(
    "berth_serving_certificate_not_after_timestamp_seconds",
    "When the serving certificate in use expires (Unix time).",
)

SERVING_CERTIFICATE_LOADED = Gauge(
    "berth_serving_certificate_last_load_timestamp_seconds",
    "When the serving certificate in use was loaded from its files (Unix time): at start, "
    "and again each time the files change (a renewal).",
)


def oldest_age(pods: Iterable[Object], now: datetime) -> float:
    """Seconds since the oldest of `pods` was created (0 for none)."""
    created = [read_time(pod["metadata"].get("creationTimestamp")) for pod in pods]
    ages = [(now - when).total_seconds() for when in created if when is not None]
    return max(ages, default=0.0)
