"""Arbitration's decision on a Pending job, written on the job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from berth.api import PodMigrationJobPhase, PodMigrationJobReason, keys
from berth.kube.client import PODMIGRATIONJOBS
from controller.actions import Event, Patch, Plan, UpdateStatus
from controller.arbitration import Decision
from controller.jobs import marker
from controller.jobs.view import Object, as_read

DRY_RUN_MESSAGE = (
    "dryRun: arbitration would start this job now; nothing is reserved or "
    "evicted while dryRun is set"
)


def admission(decision: Decision, *, workload_uid: str | None, dry_run: bool, key: bytes) -> Plan:
    """Write arbitration's decision on a Pending job.

    Admitted: phase Running, with the pod's UID, source node and workload recorded (what
    the limits count from then on) and the admission mark (`controller.jobs.marker`)
    without which the state machine acts on nothing. Failed: phase Failed with the rule,
    and a Warning event. Waiting: the reason and message in the status, written only when
    they change. With dryRun an admitted job stays Pending and says so (reason DryRun):
    nothing starts.
    """
    job = dict(decision.job)
    status: Object = dict(job.get("status") or {})
    if decision.verdict == "admit" and not dry_run:
        assert decision.pod is not None
        return _admitted(job, decision.pod, workload_uid=workload_uid, key=key)
    if decision.verdict == "fail":
        status.update(
            phase=PodMigrationJobPhase.FAILED,
            reason=decision.reason,
            message=decision.message,
            status=decision.reason,
        )
        return Plan().then(
            UpdateStatus(PODMIGRATIONJOBS, {**job, "status": status}),
            Event(job, decision.reason, decision.message, type="Warning"),
        )
    reason, message = (
        (PodMigrationJobReason.DRY_RUN.value, DRY_RUN_MESSAGE)
        if decision.verdict == "admit"
        else (decision.reason, decision.message)
    )
    if (status.get("reason"), status.get("message")) == (reason, message):
        return Plan()
    status.update(reason=reason, message=message)
    plan = Plan().then(UpdateStatus(PODMIGRATIONJOBS, {**job, "status": status}))
    if reason == PodMigrationJobReason.DRY_RUN:
        plan.then(Event(job, reason, message))
    return plan


def _admitted(job: Object, pod: Mapping[str, Any], *, workload_uid: str | None, key: bytes) -> Plan:
    """Record what the limits count from now on (the pod's UID, source node, workload) and
    the admission mark, then start the job. The status starts afresh: conditions a user
    wrote on the Pending job (an Eviction condition would skip the Reservation) are not
    carried into the Running one.

    The patch carries the resourceVersion of the job arbitration read, so the API server
    refuses it (a conflict) if the job changed since (paused, edited, or deleted and
    created again): the next round decides on the job as it is. The status write that
    follows builds on the patch's own version."""
    status: Object = {"phase": PodMigrationJobPhase.RUNNING}
    pod_uid = pod["metadata"]["uid"]
    source_node, workload = pod["spec"].get("nodeName") or "", workload_uid or ""
    mark = marker.sign(
        key,
        job_uid=job["metadata"]["uid"],
        pod_uid=pod_uid,
        mode=job["spec"]["mode"],
        source_node=source_node,
        workload=workload,
    )
    metadata: Object = {
        "annotations": {
            keys.POD_UID: pod_uid,
            keys.ADMISSION: mark,
            keys.SOURCE_NODE: source_node,
            keys.WORKLOAD: workload,
        }
    }
    return Plan().then(
        Patch(
            PODMIGRATIONJOBS, job["metadata"]["name"], {"metadata": {**metadata, **as_read(job)}}
        ),
        UpdateStatus(PODMIGRATIONJOBS, {**job, "status": status}),
    )
