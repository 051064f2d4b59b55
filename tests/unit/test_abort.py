"""`kubectl migrate abort`: which jobs it aborts, and what it still waits for."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from cli import migrate
from cli.abort import abort_patch, holding, to_abort

Object = dict[str, Any]


def job(name: str, phase: str | None = None) -> Object:
    return {
        "metadata": {"name": name, "resourceVersion": "7"},
        "spec": {"podRef": {"namespace": "ns", "name": "web"}},
        **({"status": {"phase": phase}} if phase else {}),
    }


def reservation(name: str, *, job: str | None, phase: str | None, placeholder: str = "") -> Object:
    annotations = {}
    if job:
        annotations["berth.sh/job"] = job
    if placeholder:
        annotations["berth.sh/placeholder"] = json.dumps(
            {"name": f"{name}-pause", "namespace": "ns", "uid": placeholder}
        )
    return {
        "metadata": {"name": name, "uid": f"{name}-uid", "annotations": annotations},
        "status": {"phase": phase} if phase else {},
    }


def pod(
    name: str, *, uid: str, gated_on: str | None = None, labels: Object | None = None
) -> Object:
    body: Object = {
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": labels or {}},
        "spec": {},
    }
    if gated_on:
        body["metadata"]["annotations"] = {
            "scheduling.koordinator.sh/reservation-allocated": json.dumps(
                {"name": gated_on, "uid": f"{gated_on}-uid"}
            ),
            "berth.sh/claim": "token",
        }
        body["spec"]["schedulingGates"] = [{"name": "berth.sh/reservation"}]
    return body


def test_only_jobs_in_scope_that_have_not_ended_are_aborted() -> None:
    jobs = [job("a"), job("b", "Running"), job("c", "Succeed"), job("d", "Aborted")]
    jobs += [job("e", "Succeeded"), job("f", "Failed")]
    assert [j["metadata"]["name"] for j in to_abort(jobs, None)] == ["a", "b"]
    assert [j["metadata"]["name"] for j in to_abort(jobs, frozenset({"b", "c"}))] == ["b"]


def test_the_abort_is_conditional_on_the_job_as_read() -> None:
    # A job that ended meanwhile is not turned into an aborted one: 409.
    assert abort_patch(job("a", "Running")) == {
        "metadata": {"resourceVersion": "7"},
        "status": {"phase": "Aborted"},
    }


def test_nothing_is_held_once_jobs_reservations_and_pods_are_let_go() -> None:
    jobs = [job("a", "Aborted")]
    reservations = [reservation("r", job="a", phase="Failed", placeholder="p-uid")]
    assert holding(jobs, reservations, [], None) == []


def test_what_is_held_is_named() -> None:
    jobs = [job("a", "Aborted"), job("b", "Running")]
    reservations = [
        reservation("r1", job="a", phase="Available", placeholder="p1"),
        reservation("r2", job="b", phase="Failed", placeholder="p2"),
        reservation("hand-made", job=None, phase="Available", placeholder="p3"),
    ]
    pods = [
        pod("r1-pause", uid="p1", labels={"berth.sh/reservation": "r1"}),
        pod("r2-pause", uid="p2", labels={"berth.sh/reservation": "r2"}),
        pod("hand-pause", uid="p3", labels={"berth.sh/reservation": "hand-made"}),
        pod("web-new", uid="n1", gated_on="r2"),
        # A label copied onto another pod makes no placeholder.
        pod("impostor", uid="x", labels={"berth.sh/reservation": "r1"}),
    ]
    assert holding(jobs, reservations, pods, None) == [
        "podmigrationjob/b is Running",
        "reservation/r1 is Available",
        "placeholder ns/r1-pause of reservation/r1",
        "placeholder ns/r2-pause of reservation/r2",
        "pod ns/web-new is gated by Berth",
    ]
    # Job a alone: job b, its Reservation, placeholder and gated pod are not its own.
    assert holding(jobs, reservations, pods, frozenset({"a"})) == [
        "reservation/r1 is Available",
        "placeholder ns/r1-pause of reservation/r1",
    ]


def test_an_ended_job_the_controller_has_not_acted_on_yet_is_held() -> None:
    """The abort is the command's own write: until the controller takes the job's
    admission mark off (the first thing it does for a finished job), it has not let go
    of anything yet (a soft eviction, a Reservation being made)."""
    aborted = job("a", "Aborted")
    aborted["metadata"]["annotations"] = {"berth.sh/admission": "v2:mark"}
    assert holding([aborted], [], [], None) == [
        "podmigrationjob/a is Aborted, not yet let go of by the controller"
    ]
    del aborted["metadata"]["annotations"]["berth.sh/admission"]
    assert holding([aborted], [], [], None) == []


def test_pods_that_could_not_be_read_leave_jobs_and_reservations_judged() -> None:
    jobs = [job("a", "Aborted")]
    reservations = [reservation("r", job="a", phase="Pending")]
    assert holding(jobs, reservations, None, None) == ["reservation/r is Pending"]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    migrate.configure(parser)
    return parser.parse_args(["abort", *argv])


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        ((), "name the jobs to abort, or give --all"),
        (("a", "--all"), "name the jobs to abort, or give --all"),
        (("Not_A_Name",), "'Not_A_Name' is not a job name"),
        (("--all", "--timeout", "5s"), "--timeout bounds --wait: give --wait too"),
        (("--all", "--wait", "--timeout", "soon"), "--timeout: "),
        (("--all", "--wait", "--timeout=-1s"), "--timeout: '-1s' is negative"),
    ],
)
def test_bad_arguments_are_named(
    argv: tuple[str, ...], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse(*argv)
    assert args.handler(args) == 2
    assert f"kubectl-migrate: {problem}" in capsys.readouterr().err
