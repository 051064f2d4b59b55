"""The admission mark (controller.jobs.marker) and what the state machine does with a
Running job that carries none: a phase written by a user through the status subresource
starts nothing."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from berth.api import keys
from controller import jobs
from controller.actions import Evict, Patch
from controller.jobs import marker
from tests.unit.builders import ADMISSION_KEY, job, pod
from tests.unit.controller_cases import kinds, status_of, view


def test_a_mark_verifies_only_for_its_job_pod_mode_and_key() -> None:
    signed = job(mode="EvictDirectly")
    assert marker.admitted(ADMISSION_KEY, signed)
    assert not marker.admitted(b"x" * 32, signed)
    assert not marker.admitted(b"", signed)
    other_job = job("job-2", mode="EvictDirectly")
    copied = {**other_job, "metadata": {**other_job["metadata"]}}
    copied["metadata"]["annotations"] = dict(signed["metadata"]["annotations"])
    assert not marker.admitted(ADMISSION_KEY, copied)
    other_pod = job(mode="EvictDirectly")
    other_pod["metadata"]["annotations"][keys.POD_UID] = "uid-other"
    assert not marker.admitted(ADMISSION_KEY, other_pod)
    other_mode = job(mode="EvictDirectly")
    other_mode["spec"]["mode"] = "ReservationFirst"
    assert not marker.admitted(ADMISSION_KEY, other_mode)


def admitted_on(node: str, workload: str) -> dict[str, Any]:
    found = job()
    annotations = found["metadata"]["annotations"]
    annotations.update({keys.SOURCE_NODE: node, keys.WORKLOAD: workload})
    annotations[keys.ADMISSION] = marker.sign(
        ADMISSION_KEY,
        job_uid="uid-job-1",
        pod_uid="uid-web-1",
        mode="ReservationFirst",
        source_node=node,
        workload=workload,
    )
    return found


@pytest.mark.parametrize(
    ("key", "value"), [(keys.SOURCE_NODE, "node-9"), (keys.WORKLOAD, "uid-other")]
)
def test_what_the_limits_count_a_job_against_is_signed_too(key: str, value: str) -> None:
    """A user who may patch jobs rewrote a Running job's source node or workload: its
    count would move off the node or workload, and the next job there be admitted past
    the limit. The rewrite voids the mark instead."""
    signed = admitted_on("node-0", "uid-web")
    assert marker.admitted(ADMISSION_KEY, signed)
    signed["metadata"]["annotations"][key] = value
    assert not marker.admitted(ADMISSION_KEY, signed)


def test_a_mark_of_the_first_version_still_counts_after_an_upgrade() -> None:
    legacy = job()
    message = "\x00".join(("v1", "uid-job-1", "uid-web-1", "ReservationFirst")).encode()
    digest = hmac.new(ADMISSION_KEY, message, hashlib.sha256).hexdigest()
    legacy["metadata"]["annotations"][keys.ADMISSION] = f"v1:{digest}"
    legacy["metadata"]["annotations"][keys.SOURCE_NODE] = "anything"
    assert marker.admitted(ADMISSION_KEY, legacy)


@pytest.mark.parametrize("mode", ["EvictDirectly", "ReservationFirst"])
@pytest.mark.parametrize("mark", [None, "v1:" + "0" * 64])
def test_a_running_job_without_a_valid_mark_goes_back_to_pending(
    mode: str, mark: str | None
) -> None:
    forged = job(mode=mode, conditions=[{"type": "Eviction", "status": "False"}])
    del forged["metadata"]["annotations"][keys.ADMISSION]
    if mark:
        forged["metadata"]["annotations"][keys.ADMISSION] = mark
    plan = jobs.decide(view(job_obj=forged, pod_obj=pod()))
    assert kinds(plan) == ["UpdateStatus:podmigrationjobs", "Event:NotAdmitted"]
    assert not any(isinstance(a, Evict) for a in plan.actions)
    status = status_of(plan)
    assert (status["phase"], status["reason"]) == ("Pending", "NotAdmitted")
    assert "not written by Berth" in status["message"]
    assert "conditions" not in status


def test_a_finished_job_loses_its_mark() -> None:
    done = job(mode="EvictDirectly")
    done["status"]["phase"] = "Failed"
    plan = jobs.decide(view(job_obj=done, pod_obj=pod()))
    patches = [a for a in plan.actions if isinstance(a, Patch)]
    assert patches[0].patch == {"metadata": {"annotations": {keys.ADMISSION: None}}}
