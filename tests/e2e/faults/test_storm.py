"""Fifty ReservationFirst migrations at once while everything that can fail does.

Deployments and a StatefulSet, each with a PodDisruptionBudget, migrate while, at moments
drawn from a seeded random generator (printed; `BERTH_FAULTS_SEED=<seed>` replays the
same schedule), the controller leader and each webhook and extender replica are killed
with SIGKILL and started again, the API server restarts over a compacted etcd (every
watch resuming from before gets a real 410), both extenders are down while a Reservation
is in handover (`ignorable: true`), a node holding a placeholder is deleted, a user
deletes a pod being migrated, a workload is scaled to zero mid-migration, and TTLs
expire while a job is paused, held by arbitration, waiting for an unschedulable
Reservation and after an eviction.

The invariants are judged on a watch recorder started before the first fault
(`recorder.py`, `invariants.py`); the summary table is printed, then asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from berth.kube.client import Kube
from tests.e2e.faults.inject import REVIVED, Injector, delete_node
from tests.e2e.faults.invariants import (
    UserFaults,
    Verdict,
    condition,
    is_placeholder,
    judge,
    phase,
)
from tests.e2e.faults.recorder import Recorder
from tests.e2e.faults.world import (
    STEPS,
    apply_all,
    job,
    job_state,
    pdb,
    ready,
    released,
    terminal,
    until,
    workload,
)
from tests.e2e.kube import Cluster, WaitTimeout

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("BERTH_FAULTS_SEED") or random.SystemRandom().randrange(2**31))
SKIPPED = "skipped"
"""The log's kind for a fault that waited in vain for the step it strikes at."""
WINDOW = 60.0
"""Faults strike within this many seconds of the jobs' creation."""
JOBS_END = 480.0
"""How long every job may take to end (the longest TTL below is 6 minutes)."""

WEB, WEB_REPLICAS = 7, 6
DB_REPLICAS = 3


def workloads() -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The objects to create, and each workload's PDB minAvailable by app name."""
    floors = {f"web-{i}": WEB_REPLICAS - 1 for i in range(WEB)}
    floors.update({"db": DB_REPLICAS - 1, "shrink": 1, "locked": 2})
    objects = [workload("Deployment", f"web-{i}", replicas=WEB_REPLICAS) for i in range(WEB)]
    objects += [
        workload("StatefulSet", "db", replicas=DB_REPLICAS),
        workload("Deployment", "shrink", replicas=2),
        workload("Deployment", "locked", replicas=2),
        # Only node-0 is allowed: its Reservation can never be placed elsewhere.
        workload("Deployment", "pinned", replicas=1, node="node-0"),
        workload("Deployment", "paused", replicas=1),
    ]
    objects += [pdb(app, floor) for app, floor in floors.items()]
    return objects, floors


class Storm:
    """The run's faults, each a task started at its moment; process changes one at a time."""

    def __init__(self, cluster: Cluster, recorder: Recorder, namespace: str, seed: int) -> None:
        self.cluster = cluster
        self.recorder = recorder
        self.namespace = namespace
        self.rng = random.Random(seed)
        self.injector = Injector(cluster)
        self.user = UserFaults()
        self.lock = asyncio.Lock()
        self.jobs: dict[str, str] = {}
        """job name → app of its pod."""

    def schedule(self) -> list[tuple[float, str, Callable[[], Awaitable[None]]]]:
        at = self.rng.uniform
        plan: list[tuple[float, str, Callable[[], Awaitable[None]]]] = [
            (at(3, WINDOW), "leader", self.kill_leader) for _ in range(3)
        ]
        for name in ("berth-webhook", "berth-webhook-2", "berth-extender"):
            plan.append((at(3, WINDOW), name, functools.partial(self.bounce, name)))
        plan += [
            (at(10, WINDOW), "apiserver", self.apiserver),
            (at(5, WINDOW), "node", self.delete_node),
            (at(5, WINDOW / 2), "user delete", self.user_delete),
            (at(5, WINDOW / 2), "scale to zero", self.scale_to_zero),
            (at(5, WINDOW), "extenders in handover", self.extenders_in_handover),
        ]
        return sorted(plan, key=lambda entry: entry[0])

    async def run(self) -> None:
        async def later(delay: float, kind: str, fault: Callable[[], Awaitable[None]]) -> None:
            await asyncio.sleep(delay)
            try:
                await fault()
            except WaitTimeout as error:
                # Its moment never came (every job was past that step): the table says so.
                self.injector.note(SKIPPED, f"{kind}: {error}")

        await asyncio.gather(*(later(*entry) for entry in self.schedule()))

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart what exits on its own, as a kubelet restarts a container, until `stop`."""
        while not stop.is_set():
            async with self.lock:
                await self.injector.revive()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1)

    def downtime(self) -> float:
        return self.rng.uniform(1, 5)

    async def bounce(self, name: str) -> None:
        """Kill one component, leave it down a while, start it again."""
        down_for = self.downtime()
        async with self.lock:
            if name in self.injector.down:
                return
            await self.injector.kill(name)
        await asyncio.sleep(down_for)
        async with self.lock:
            await self.injector.restart(name)

    async def kill_leader(self) -> None:
        """Kill whichever replica leads now (after a kill, the Lease names the dead one until
        it expires: wait for a running leader), and start it again a while later."""
        down_for = self.downtime()
        deadline = time.monotonic() + 60
        while True:
            async with self.lock:
                leader = await asyncio.to_thread(self.injector.leader)
                if leader is not None and leader.name not in self.injector.down:
                    await self.injector.kill(leader.name, why="(the leader)")
                    break
            if time.monotonic() > deadline:
                raise WaitTimeout("no running leader to kill within 60s")
            await asyncio.sleep(1)
        await asyncio.sleep(down_for)
        async with self.lock:
            await self.injector.restart(leader.name)

    async def apiserver(self) -> None:
        async with self.lock:
            await self.injector.restart_apiserver_over_compacted_etcd()

    async def delete_node(self) -> None:
        """Delete a node while a placeholder runs on it."""
        pod = await until(self._bound_placeholder, what="a bound placeholder", timeout=90)
        node = pod["spec"]["nodeName"]
        async with self.lock:
            self.user.deleted_nodes[node] = await delete_node(self.recorder.kube, node)
            self.injector.note("node deleted", f"{node} (holds {pod['metadata']['name']})")

    def _bound_placeholder(self) -> dict[str, Any] | None:
        return next(
            (
                pod
                for pod in sorted(
                    self.recorder.objects("pods"), key=lambda p: p["metadata"]["name"]
                )
                if is_placeholder(pod)
                and pod["metadata"].get("namespace") == self.namespace
                and pod["spec"].get("nodeName") not in (None, "node-0")
            ),
            None,
        )

    async def user_delete(self) -> None:
        """Delete a pod whose Reservation is made but which is not evicted yet."""

        def candidate() -> str | None:
            for name in sorted(self.jobs):
                state = job_state(self.recorder, name) or {}
                if (
                    self.jobs[name].startswith("web-")
                    and phase(state) == "Running"
                    and STEPS["reservation created"](self.recorder, name)
                    and not condition(state, "Eviction")
                ):
                    return name
            return None

        while True:  # the chosen pod may be evicted meanwhile: then choose again
            name = await until(candidate, what="a job before its eviction", timeout=90)
            ref = (job_state(self.recorder, name) or {})["spec"]["podRef"]
            pod = self.recorder.state["pods"].get(f"{ref['namespace']}/{ref['name']}")
            if pod is None:
                continue
            async with self.lock:
                self.user.deleted_pods.add(pod["metadata"]["uid"])
                deleted = await self.cluster.akubectl(
                    "delete",
                    "pod",
                    ref["name"],
                    "-n",
                    ref["namespace"],
                    "--wait=false",
                    check=False,
                )
                if deleted.returncode == 0:
                    self.injector.note("user deleted pod", f"{ref['name']} of job {name}")
                    return
                self.user.deleted_pods.discard(pod["metadata"]["uid"])
            await asyncio.sleep(0.5)

    async def scale_to_zero(self) -> None:
        """Scale `shrink` to zero as one of its jobs evicts: no replacement ever comes, so
        that job's TTL expires after its eviction; the other job's pod is gone."""
        await until(
            lambda: any(
                STEPS["evicting"](self.recorder, name)
                for name, app in self.jobs.items()
                if app == "shrink"
            ),
            what="a job of shrink evicting",
            timeout=120,
        )
        async with self.lock:
            self.user.scaled_to_zero[f"{self.namespace}/shrink"] = await asyncio.to_thread(
                self.injector.revision
            )
            await self.cluster.akubectl(
                "scale", "deployment", "shrink", "-n", self.namespace, "--replicas=0"
            )
            self.injector.note("scaled to zero", "shrink")

    async def extenders_in_handover(self) -> None:
        """The extender down while a Reservation hands over to its pod."""
        await until(
            lambda: any(
                (r.get("status") or {}).get("currentOwners") and phase(r) == "Available"
                for r in self.recorder.objects("reservations")
            ),
            what="a Reservation in handover",
            timeout=120,
        )
        names = [n for n in ("berth-extender",) if n not in self.injector.down]
        async with self.lock:
            for name in names:
                await self.injector.kill(name, why="(in handover)")
        await asyncio.sleep(5)
        async with self.lock:
            for name in names:
                await self.injector.restart(name)


def all_ready(recorder: Recorder, namespace: str, app: str, replicas: int) -> bool:
    return len(ready(recorder, namespace, app)) == replicas


def pdb_counts(cluster: Cluster, namespace: str, app: str, replicas: int) -> bool:
    status = cluster.get("pdb", app, "-n", namespace).get("status", {})
    return bool(status.get("currentHealthy") == replicas)


def create_jobs(storm: Storm, namespace: str) -> list[dict[str, Any]]:
    """A job for every pod of the workloads, with the TTL each one's fate calls for."""
    manifests = []
    pods = sorted(
        (p for p in storm.recorder.objects("pods") if p["metadata"].get("namespace") == namespace),
        key=lambda p: p["metadata"]["name"],
    )
    ttls = {"shrink": "90s", "locked": "40s", "pinned": "40s", "paused": "30s"}
    for pod in pods:
        app = pod["metadata"]["labels"]["app"]
        if app == "locked" and "locked" in storm.jobs.values():
            continue  # one job is held by its PDB; the other pod keeps it so
        extra = {"paused": True} if app == "paused" else {}
        name, body = job(pod, ttl=ttls.get(app, "6m"), **extra)
        storm.jobs[name] = app
        manifests.append(body)
    return manifests


async def settle(storm: Storm, namespace: str) -> None:
    """Wait, with every component running again, until every job has ended and released
    what it held; what does not end in time is left for the verdict (lost, stranded,
    orphans) to report."""
    recorder = storm.recorder
    async with storm.lock:
        await storm.injector.restart_all()
    with contextlib.suppress(WaitTimeout):
        await until(
            lambda: all(terminal(recorder, name) for name in storm.jobs),
            what="every job to end",
            timeout=JOBS_END,
            interval=1,
        )
    # A terminal job releases what it held in the passes after its last status write.
    with contextlib.suppress(WaitTimeout):
        await until(
            lambda: released(recorder, namespace, storm.jobs),
            what="everything released",
            timeout=90,
            interval=1,
        )


def table(verdict: Verdict, storm: Storm, recorder: Recorder, expired: int) -> str:
    injected: dict[str, int] = {}
    for entry in storm.injector.log:
        injected[entry.kind] = injected.get(entry.kind, 0) + 1
    revived = injected.pop(REVIVED, 0)
    skipped = injected.pop(SKIPPED, 0)
    rows = [
        ("seed", str(SEED)),
        ("faults injected", str(sum(injected.values()))),
        *((f"  {kind}", str(count)) for kind, count in sorted(injected.items())),
        ("faults whose moment never came", str(skipped)),
        ("components that exited and were restarted", str(revived)),
        ("watches ended by 410 (Berth / recorder)", f"{expired} / {recorder.expired}"),
        ("jobs", str(verdict.jobs)),
        *((f"  {outcome}", str(n)) for outcome, n in sorted(verdict.outcomes.items())),
        ("evictions", str(verdict.evictions)),
        ("lost jobs", str(len(verdict.lost))),
        ("stranded pods", str(len(verdict.stranded))),
        ("orphans", str(len(verdict.orphans))),
        ("PDB violations", str(len(verdict.pdb_violations))),
        ("double evictions", str(len(verdict.double_evictions))),
        ("evictions without an Available Reservation", str(len(verdict.unreserved_evictions))),
        ("untruthful reasons", str(len(verdict.untruthful))),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value:>6}" for label, value in rows]
    rule = "-" * (width + 8)
    return "\n".join(["", "fault suite summary", rule, *lines, rule])


async def test_fifty_migrations_under_faults(
    cluster: Cluster, namespace: str, kube: Kube, capsys: pytest.CaptureFixture[str]
) -> None:
    with capsys.disabled():
        print(f"\nfault suite seed {SEED} (replay: BERTH_FAULTS_SEED={SEED})", flush=True)
    objects, floors = workloads()
    async with Recorder(kube) as recorder:
        storm = Storm(cluster, recorder, namespace, SEED)
        await asyncio.to_thread(apply_all, cluster, objects, namespace)
        expected = {
            o["metadata"]["name"]: o["spec"]["replicas"] for o in objects if "replicas" in o["spec"]
        }
        for app, replicas in expected.items():
            await until(
                functools.partial(all_ready, recorder, namespace, app, replicas),
                what=f"{app}'s {replicas} pods ready",
                timeout=180,
            )
        for app in floors:
            await cluster.await_(
                functools.partial(pdb_counts, cluster, namespace, app, expected[app]),
                what=f"the PDB of {app} to count its pods",
                timeout=120,
            )
        jobs = create_jobs(storm, namespace)
        assert len(jobs) == 50
        await asyncio.to_thread(apply_all, cluster, jobs)
        storm.injector.started = time.monotonic()
        stop = asyncio.Event()
        supervisor = asyncio.create_task(storm.supervise(stop))
        try:
            with capsys.disabled():
                await storm.run()
            await settle(storm, namespace)
        finally:
            async with storm.lock:
                await storm.injector.restart_all()
            stop.set()
            await supervisor
        expired = await asyncio.to_thread(storm.injector.expired_watches)
    verdict = judge(
        recorder.ordered(),
        jobs=list(storm.jobs),
        namespaces={namespace},
        min_available={f"{namespace}/{app}": floor for app, floor in floors.items()},
        faults=storm.user,
    )
    with capsys.disabled():
        print(table(verdict, storm, recorder, expired), flush=True)
        for outcome, messages in sorted(verdict.messages.items()):
            if outcome != "Succeed":
                print(f"{outcome}:", *messages, sep="\n  ", flush=True)
        for name, items in verdict.failures().items():
            print(f"{name}:", *items, sep="\n  ", flush=True)
    assert not verdict.failures(), verdict.failures()
    assert verdict.jobs == 50
    assert expired > 0, "the API server restart over a compacted etcd caused no 410 in Berth"
