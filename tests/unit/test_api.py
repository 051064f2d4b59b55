"""The API models: the quick-start YAML round-trips, Go durations, the API's vocabulary.

tests/e2e/seed_quickstart holds the YAML of the PodMigrationJob documentation's quick
start, verbatim; every job there must read into the models and come back out unchanged,
except that a Go duration prints in Go's canonical form (`5m` -> `5m0s`).
"""

from __future__ import annotations

import copy
import re
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from berth.api import (
    API_VERSION,
    SUCCEEDED_PHASES,
    TERMINAL_PHASES,
    ConditionStatus,
    ObjectReference,
    PodMigrationJob,
    PodMigrationJobConditionType,
    PodMigrationJobMode,
    PodMigrationJobPhase,
    PodMigrationJobReason,
    PodMigrationJobSpec,
    Reservation,
    ReservationConditionType,
    ReservationPhase,
    ReservationReason,
    format_duration,
    go_form,
    keys,
    parse_duration,
)
from berth.api.duration import DURATION_PATTERN

SEEDS = Path(__file__).resolve().parents[1] / "e2e" / "seed_quickstart"
JOBS = sorted(SEEDS.glob("migrationjob-*.yaml"))
MAX_GO_DURATION = timedelta(microseconds=(2**63 - 1) // 1000)


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def test_all_quick_start_jobs_are_here() -> None:
    assert len(JOBS) == 5


@pytest.mark.parametrize("path", JOBS, ids=lambda path: path.stem)
def test_quick_start_job_round_trips(path: Path) -> None:
    document = load(path)
    job = PodMigrationJob.model_validate(document)
    expected = copy.deepcopy(document)
    expected["spec"]["ttl"] = "5m0s"
    assert job.to_wire() == expected
    assert PodMigrationJob.model_validate(job.to_wire()) == job


@pytest.mark.parametrize(
    ("stem", "paused", "mode"),
    [
        ("migrationjob-demo", False, PodMigrationJobMode.RESERVATION_FIRST),
        ("migrationjob-paused", True, PodMigrationJobMode.RESERVATION_FIRST),
        ("migrationjob-evict-directly", False, PodMigrationJobMode.EVICT_DIRECTLY),
        ("migrationjob-reservation-ref", False, PodMigrationJobMode.RESERVATION_FIRST),
        ("migrationjob-graceful", True, PodMigrationJobMode.RESERVATION_FIRST),
    ],
)
def test_quick_start_job_reads_as_typed_values(
    stem: str, paused: bool, mode: PodMigrationJobMode
) -> None:
    job = PodMigrationJob.model_validate(load(SEEDS / f"{stem}.yaml"))
    assert job.spec.paused is paused
    assert job.spec.mode is mode
    assert job.spec.ttl == timedelta(minutes=5)
    assert job.spec.pod_ref == ObjectReference(
        namespace="default", name="pod-demo-5f9b977566-c7lvk"
    )
    assert job.status.phase is PodMigrationJobPhase.PENDING


@pytest.mark.parametrize("written", ["Succeed", "Succeeded"])
def test_succeeded_reads_as_succeed(written: str) -> None:
    """`Succeed` is the design's spelling; jobs stored by earlier Berth releases say
    `Succeeded` and still read as succeeded."""
    job = PodMigrationJob.model_validate(
        {"spec": {"podRef": {"namespace": "a", "name": "b"}}, "status": {"phase": written}}
    )
    assert job.status.phase is PodMigrationJobPhase.SUCCEED
    assert job.to_wire()["status"]["phase"] == "Succeed"
    assert written in SUCCEEDED_PHASES
    assert written in TERMINAL_PHASES


def test_reservation_ref_and_delete_options() -> None:
    by_ref = PodMigrationJob.model_validate(load(SEEDS / "migrationjob-reservation-ref.yaml"))
    graceful = PodMigrationJob.model_validate(load(SEEDS / "migrationjob-graceful.yaml"))
    assert by_ref.spec.reservation_options is not None
    assert by_ref.spec.reservation_options.reservation_ref == ObjectReference(name="reservation-0")
    assert graceful.spec.delete_options == {"gracePeriodSeconds": 60}


def test_defaults_of_a_minimal_job() -> None:
    job = PodMigrationJob.model_validate({"spec": {"podRef": {"namespace": "a", "name": "b"}}})
    assert job.api_version == API_VERSION
    assert job.spec.mode is None  # the controller's defaultJobMode applies
    assert job.spec.paused is False
    assert job.spec.ttl is None
    assert job.status.phase is PodMigrationJobPhase.PENDING
    assert job.to_wire() == {
        "apiVersion": API_VERSION,
        "kind": "PodMigrationJob",
        "metadata": {},
        "spec": {"paused": False, "podRef": {"namespace": "a", "name": "b"}},
        "status": {"phase": "Pending"},
    }  # fmt: skip


def test_python_names_build_camel_case_objects() -> None:
    spec = PodMigrationJobSpec(
        pod_ref=ObjectReference(namespace="a", name="b"), ttl=timedelta(hours=1, minutes=30)
    )
    assert PodMigrationJob(metadata={"name": "m"}, spec=spec).to_wire()["spec"] == {
        "paused": False,
        "ttl": "1h30m0s",
        "podRef": {"namespace": "a", "name": "b"},
    }


RESERVATION = {
    "apiVersion": API_VERSION,
    "kind": "Reservation",
    "metadata": {"name": "d56659ab-ba16-47a2-821d-22d6ba49258e"},
    "spec": {
        "template": {"spec": {"containers": [{"name": "pause", "image": "pause"}]}},
        "owners": [
            {"controller": {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": "pod-demo-5f9b977566", "uid": "u-1", "namespace": "default"}},
            {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}},
        ],
        "ttl": "5m0s",
        "allocateOnce": True,
    },
    "status": {
        "phase": "Available",
        "nodeName": "node-1",
        "conditions": [{"type": "Scheduled", "status": "True",
                        "lastTransitionTime": "2024-05-01T10:00:00Z"}],
        "currentOwners": [{"namespace": "default", "name": "pod-demo-5f9b977566-nxjdf"}],
        "allocatable": {"cpu": "200m", "memory": "400Mi"},
    },
}  # fmt: skip


def test_reservation_round_trips() -> None:
    reservation = Reservation.model_validate(RESERVATION)
    assert reservation.to_wire() == RESERVATION
    assert reservation.spec.allocate_once is True
    assert reservation.status.phase is ReservationPhase.AVAILABLE


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"podRef": {"name": "p"}, "ttl": "-5m"}, "must not be negative"),
        ({"podRef": {"name": "p"}, "ttl": "soon"}, "is not a Go duration"),
        ({"podRef": {"name": "p"}, "ttl": 300}, "is not a Go duration string"),
        ({"podRef": {"name": "p"}, "mode": "Fast"}, "'ReservationFirst' or 'EvictDirectly'"),
        ({"podRef": {"name": "p"}, "podref": {}}, "Extra inputs are not permitted"),
        ({}, "Field required"),
    ],
)
def test_invalid_job_spec_is_rejected(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PodMigrationJobSpec.model_validate(spec)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("90s", timedelta(seconds=90)),
        ("1.5h", timedelta(minutes=90)),
        ("300ms", timedelta(milliseconds=300)),
        (".5s", timedelta(milliseconds=500)),
        ("5.s", timedelta(seconds=5)),
        ("2us", timedelta(microseconds=2)),
        ("2µs", timedelta(microseconds=2)),
        ("2μs", timedelta(microseconds=2)),
        ("1h1m1s1ms1us", timedelta(hours=1, minutes=1, seconds=1, milliseconds=1, microseconds=1)),
        ("1s500ms", timedelta(milliseconds=1500)),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("+5m", timedelta(minutes=5)),
        ("-1m30s", -timedelta(seconds=90)),
        ("1ns", timedelta(0)),
        ("1.0000019s", timedelta(seconds=1, microseconds=1)),
        ("2562047h", timedelta(hours=2562047)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "5", "m", "5d", "1w", "5M", "1h 30m", " 5m", "5m\n", "five minutes", "1.2.3s", ".s",
     "-", "+", "00", "5m-3s", "9223372036854775808ns", "2562048h"],
)  # fmt: skip
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="Go duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(minutes=5), "5m0s"),
        (timedelta(hours=1), "1h0m0s"),
        (timedelta(hours=1, minutes=30), "1h30m0s"),
        (timedelta(hours=26), "26h0m0s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(milliseconds=1500), "1.5s"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(microseconds=1500), "1.5ms"),
        (timedelta(microseconds=1), "1µs"),
        (timedelta(seconds=1, microseconds=1), "1.000001s"),
        (-timedelta(seconds=90), "-1m30s"),
    ],
)
def test_format_duration(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("5m", "5m0s"),
        ("5m0s", "5m0s"),
        ("1.5h", "1h30m0s"),
        ("0", "0s"),
        ("1500ns", "1.5µs"),  # exact: no rounding to microseconds
        ("7ns", "7ns"),
        ("-90s", "-1m30s"),
    ],
)
def test_go_form_prints_a_duration_as_go_writes_it_back(text: str, printed: str) -> None:
    assert go_form(text) == printed


@given(st.from_regex(DURATION_PATTERN, fullmatch=True))
def test_go_form_keeps_the_duration(text: str) -> None:
    if _parse_error(text) is None:
        assert parse_duration(go_form(text)) == parse_duration(text)
        assert go_form(go_form(text)) == go_form(text)


@given(st.timedeltas(min_value=-MAX_GO_DURATION, max_value=MAX_GO_DURATION))
def test_durations_round_trip(value: timedelta) -> None:
    text = format_duration(value)
    assert parse_duration(text) == value
    assert re.fullmatch(DURATION_PATTERN, text)


@given(st.from_regex(DURATION_PATTERN, fullmatch=True))
def test_everything_the_pattern_accepts_parses(text: str) -> None:
    assert _parse_error(text) in (None, "longer than a Go duration can be")


def _parse_error(text: str) -> str | None:
    """None if `text` parses; else the part of the error that says why."""
    try:
        parse_duration(text)
    except ValueError as error:
        return "longer than a Go duration can be" if "longer than" in str(error) else str(error)
    return None


@pytest.mark.parametrize(
    ("enum", "values"),
    [
        (PodMigrationJobMode, ["ReservationFirst", "EvictDirectly"]),
        (PodMigrationJobPhase, ["Pending", "Running", "Succeed", "Failed", "Aborted"]),
        (
            PodMigrationJobConditionType,
            ["ReservationCreated", "ReservationScheduled", "Preemption", "Eviction",
             "PodScheduled", "PodBoundReservation", "ReservationBound", "BoundPodReady"],
        ),
        (
            PodMigrationJobReason,
            ["Timeout", "FailedCreateReservation", "Unschedulable", "MissingPod",
             "MissingReservation", "Preempting", "PreemptComplete", "Evicting", "FailedEvict",
             "EvictComplete", "WaitForPodBindReservation", "WaitForBoundPodReady",
             "ReservationExpired", "ReservationNotUsed", "ReservationLost",
             "ReservationOwnerGone", "NamespaceNotLabelled", "WorkloadScaledDown",
             "ForbiddenMigratePod", "NotAdmitted",
             "ForbiddenTemplate", "InvalidSpec", "ForbiddenPreemption", "Complete",
             "Created", "Scheduled", "Bound", "Ready", "BlockedByPDB", "DryRun", "NodeFit",
             "RolloutInProgress", "ExpectedReplicas", "MaxMigratingPerWorkload",
             "MaxUnavailablePerWorkload", "MaxMigratingPerNode", "MaxMigratingPerNamespace",
             "MaxMigratingGlobally", "ObjectLimiters", "EvictQPS", "FlowControlQPS",
             "PriorityThreshold", "WriteRefused"],
        ),
        (ConditionStatus, ["True", "False", "Unknown"]),
        (ReservationPhase, ["Pending", "Available", "Succeeded", "Failed"]),
        (ReservationConditionType, ["Scheduled", "Ready"]),
        (
            ReservationReason,
            ["Scheduled", "Unschedulable", "Lost", "FailedCreate", "PriorityClassMismatch",
             "Available", "Allocated", "Expired",
             "OwnerGone", "Released", "Invalid", "ReservationExpired", "ReservationClaimed",
                "ReservationClaimRefused",
                "ReservationClaimReleased",
             "ReservationHandover", "ReservationReleased", "ReservationGateRemoved",
             "StrandedPodDeleted", "PinnedPodDeleted", "StrayPlaceholderDeleted"],
        ),
    ],
)  # fmt: skip
def test_enum_values(enum: type[StrEnum], values: list[str]) -> None:
    assert [member.value for member in enum] == values


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (keys.EVICTION_COST, "scheduling.koordinator.sh/eviction-cost"),
        (keys.EVICTION_COST_NEVER, 2147483647),
        (keys.SOFT_EVICTION, "scheduling.koordinator.sh/soft-eviction"),
        (keys.RESERVATION_ALLOCATED, "scheduling.koordinator.sh/reservation-allocated"),
        (keys.DESCHEDULER_EVICT, "descheduler.alpha.kubernetes.io/evict"),
        (keys.RESERVATION_GATE, "berth.sh/reservation"),
        (keys.RESERVATION_LABEL, "berth.sh/reservation"),
        (keys.CLAIM, "berth.sh/claim"),
    ],
)
def test_keys(key: object, value: object) -> None:
    assert key == value
