"""Two controller replicas: the standby takes over a migration when the leader dies."""

from __future__ import annotations

import functools
import json
import os
import signal
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.kube import Cluster
from tests.e2e.migrate import (
    condition,
    deployment,
    events,
    job_manifest,
    job_of,
    leftovers,
    phase_is,
    ready_pods,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def standby(cluster: Cluster) -> Iterator[None]:
    cluster.local.start_controller(name="berth-controller-standby")
    yield
    names = {c.name for c in cluster.local.components if cluster.local.owns(c)}
    for component in list(cluster.local.components):
        if component.name == "berth-controller-standby":
            cluster.local.stop(component)
    if "berth-controller" not in names:
        cluster.local.start_controller(name="berth-controller")


def ready(cluster: Cluster, port: int) -> bool:
    context = ssl.create_default_context(cafile=cluster.local.serving_ca)
    url = f"https://127.0.0.1:{port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def leader_pid_or_none(cluster: Cluster) -> int | None:
    try:
        return leader_pid(cluster)
    except StopIteration:
        return None


def leader_pid(cluster: Cluster) -> int:
    lease = cluster.get("lease", "berth-controller", "-n", "berth-system")
    holder = lease["spec"].get("holderIdentity") or ""  # empty once given up
    return next(
        c.pid
        for c in cluster.local.components
        if c.name.startswith("berth-controller") and f"-{c.pid}-" in holder
    )


@pytest.mark.usefixtures("standby")
def test_standby_takes_over_mid_migration_without_repeating_steps(
    cluster: Cluster, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    # After a test that restarted the controller, the Lease names the stopped process
    # until it expires: wait for one of the running replicas to hold it.
    first = cluster.wait(lambda: leader_pid_or_none(cluster), what="a running leader")
    # Both replicas are ready: one leads, the other knows who does.
    for component in cluster.local.components:
        if component.name.startswith("berth-controller"):
            cluster.wait(
                functools.partial(ready, cluster, component.port), what=f"{component.name} ready"
            )
    name, manifest = job_manifest(pod)
    cluster.apply(manifest)
    cluster.wait(
        lambda: condition(job_of(cluster, name), "ReservationCreated"),
        what="the migration to start",
    )
    os.killpg(first, signal.SIGKILL)
    killed = time.monotonic()
    cluster.wait(
        lambda: leader_pid_or_none(cluster) not in (None, first),
        what="the standby to take the lease",
        timeout=30,
    )
    with capsys.disabled():
        print(f"\nleader killed; standby leading after {time.monotonic() - killed:.1f}s")
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"),
        what="the standby to finish the migration",
        timeout=60,
    )
    assert job["status"]["phase"] == "Succeed", job["status"]
    assert leader_pid(cluster) != first
    repeated = [reason for reason, count in Counter(events(cluster, name)).items() if count > 1]
    assert not repeated, f"steps recorded twice: {repeated}"
    assert not any(leftovers(cluster, namespace).values())
    for component in list(cluster.local.components):
        if component.pid == first:
            cluster.local.stop(component)


INTRUDER = "intruder-of-test-ha"


@pytest.fixture
def lease_taken_from_the_leader(cluster: Cluster) -> Iterator[int]:
    """The pid of the leader whose Lease is then given to another holder; afterwards the
    session's controller runs again (it takes the Lease once it has seen it unchanged
    for its duration)."""
    leader = cluster.wait(lambda: leader_pid_or_none(cluster), what="a running leader")
    yield leader
    for component in list(cluster.local.components):
        if component.name.startswith("berth-controller") and component.pid == leader:
            cluster.local.stop(component)
    if not any(c.name == "berth-controller" for c in cluster.local.running()):
        cluster.local.start_controller(name="berth-controller")


def test_a_leader_that_sees_another_holder_steps_down(
    cluster: Cluster, lease_taken_from_the_leader: int
) -> None:
    """Another holder appears in the Lease, renewed (by its own clock) long ago. The
    leader judges expiry on its own clock, so it does not take the Lease back; seeing
    another holder, it stops acting and exits."""
    leader = lease_taken_from_the_leader
    component = next(c for c in cluster.local.components if c.pid == leader)
    cluster.kubectl(
        "patch", "lease", "berth-controller", "-n", "berth-system", "--type=merge", "-p",
        json.dumps({"spec": {
            "holderIdentity": INTRUDER,
            "renewTime": "2000-01-01T00:00:00.000000Z",
            "leaseDurationSeconds": 10,
        }}),
    )  # fmt: skip
    cluster.wait(
        lambda: not cluster.local.owns(component), what="the leader to step down", timeout=60
    )
    lease = cluster.get("lease", "berth-controller", "-n", "berth-system")
    assert lease["spec"]["holderIdentity"] == INTRUDER, "the old leader took the Lease back"
    assert "stepping down" in Path(component.log).read_text()


@pytest.mark.usefixtures("standby")
def test_a_leader_stopped_gracefully_gives_the_lease_up(cluster: Cluster) -> None:
    """SIGTERM (a rollout, a node drain): the leader stops acting, then empties the Lease's
    holder, so the standby takes over at its next try, not a lease duration later."""
    first = cluster.wait(lambda: leader_pid_or_none(cluster), what="a running leader")
    component = next(c for c in cluster.local.components if c.pid == first)
    cluster.local.stop(component)  # SIGTERM, returns once the process has exited
    holder = cluster.get("lease", "berth-controller", "-n", "berth-system")["spec"].get(
        "holderIdentity"
    )
    assert not holder or f"-{first}-" not in holder, "the stopped leader still holds the Lease"
    assert "released the lease" in Path(component.log).read_text()
    cluster.wait(
        lambda: leader_pid_or_none(cluster) not in (None, first),
        what="the standby to take the lease",
        timeout=30,
    )


@pytest.mark.usefixtures("standby")
def test_a_leader_that_stalled_past_its_lease_acts_no_more(
    cluster: Cluster, namespace: str
) -> None:
    """The leader freezes mid-migration (SIGSTOP: a long GC pause, a starved container)
    until the standby has taken the Lease, then runs again while the standby carries the
    migration on. Its loops wake with work in hand, but it renewed the Lease too long ago
    to act: it steps down, and no step of the migration is done twice."""
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    first = cluster.wait(lambda: leader_pid_or_none(cluster), what="a running leader")
    component = next(c for c in cluster.local.components if c.pid == first)
    name, manifest = job_manifest(pod)
    cluster.apply(manifest)
    cluster.wait(
        lambda: condition(job_of(cluster, name), "ReservationCreated"),
        what="the migration to start",
    )
    os.killpg(first, signal.SIGSTOP)
    try:
        cluster.wait(
            lambda: leader_pid_or_none(cluster) not in (None, first),
            what="the standby to take the lease",
            timeout=30,
        )
    finally:
        os.killpg(first, signal.SIGCONT)
    cluster.wait(lambda: not cluster.local.owns(component), what="the stalled leader to step down")
    assert "lost leadership" in Path(component.log).read_text()
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"),
        what="the standby to finish the migration",
        timeout=60,
    )
    assert job["status"]["phase"] == "Succeed", job["status"]
    repeated = [reason for reason, count in Counter(events(cluster, name)).items() if count > 1]
    assert not repeated, f"steps recorded twice: {repeated}"
    assert not any(leftovers(cluster, namespace).values())
    cluster.local.stop(component)
