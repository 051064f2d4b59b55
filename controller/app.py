"""The controller process: caches, a work queue, leader election, and the reconcile loops.

Thin wiring around the pure decisions in `controller.jobs`, `controller.reservations` and
`controller.arbitration`: read the caches into a view, decide, run the plan, requeue.
Nothing is kept only in memory; a new leader rebuilds everything from the API server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from berth import metrics, protocol
from berth.api import TERMINAL_PHASES, PodMigrationJobPhase, keys
from berth.kube.client import (
    DEPLOYMENTS,
    NODES,
    PDBS,
    PODMIGRATIONJOBS,
    PODS,
    PRIORITYCLASSES,
    REPLICASETS,
    RESERVATIONS,
    STATEFULSETS,
    Kube,
    Resource,
)
from berth.kube.events import Recorder
from berth.kube.informer import IndexFunc, Informer, object_key
from berth.kube.lease import LeaderElector
from berth.ledger import Ledger
from berth.resources import Resources
from berth.server import add_health, add_metrics, cancel_on_signals, serve
from berth.settings import MigrationControllerArgs
from controller import arbitration, jobs, reservations
from controller.actions import Plan, UpdateStatus
from controller.executor import Executor

log = logging.getLogger(__name__)

COMPONENT = "berth-controller"
RETRY_AFTER_ERROR = 2.0
MAX_BACKOFF = 300.0
ADMISSION_WRITES = 16
"""Status writes of one arbitration round that may be in flight at once."""


def _pod_ref_key(job: Mapping[str, Any]) -> list[str]:
    ref = job.get("spec", {}).get("podRef") or {}
    return [f"{ref.get('namespace')}/{ref.get('name')}"]


def _single(value: str | None) -> list[str]:
    return [value] if value else []


class WorkQueue:
    """Keys to reconcile; a key is never processed twice at once, and re-adding a key
    that waits changes nothing (level-triggered: the reconcile reads the latest state)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._waiting: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def add(self, key: str) -> None:
        if key not in self._waiting:
            self._waiting.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: str, seconds: float) -> None:
        timer = self._timers.get(key)
        due = asyncio.get_running_loop().time() + seconds
        if timer is not None and timer.when() <= due:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = asyncio.get_running_loop().call_at(due, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> str:
        key = await self._queue.get()
        self._waiting.discard(key)
        return key

    def __len__(self) -> int:
        return self._queue.qsize()


class Controller:
    def __init__(self, kube: Kube, args: MigrationControllerArgs, *, identity: str) -> None:
        self.kube = kube
        self.args = args
        self.queue = WorkQueue()
        metrics.WORKQUEUE_DEPTH.set_function(lambda: len(self.queue))
        self.jobs = Informer(
            kube, PODMIGRATIONJOBS, indexes={"pod": _pod_ref_key}, handler=self._on_job
        )
        self.reservations = Informer(
            kube,
            RESERVATIONS,
            indexes={
                "claim": lambda r: _single(protocol.claim_of(r)),
                "job": lambda r: _single(protocol.annotations_of(r).get(keys.JOB)),
            },
            handler=self._on_reservation,
        )
        self.pods = Informer(
            kube,
            PODS,
            indexes={
                "reservation": lambda p: _single(protocol.placeholder_reservation(p)),
                "claim": lambda p: _single(protocol.pod_claim(p)),
                "uid": lambda p: _single(p["metadata"].get("uid")),
                "gated": lambda p: ["yes"] if protocol.is_gated(p) else [],
                "controller": lambda p: _single((protocol.controller_of(p) or {}).get("uid")),
            },
            handler=self._on_pod,
        )
        by_uid: dict[str, IndexFunc] = {"uid": lambda o: _single(o["metadata"].get("uid"))}
        self.replicasets = Informer(kube, REPLICASETS, indexes=by_uid)
        self.deployments = Informer(kube, DEPLOYMENTS, indexes=by_uid)
        self.statefulsets = Informer(kube, STATEFULSETS, indexes=by_uid)
        self.pdbs = Informer(kube, PDBS)
        self.nodes = Informer(kube, NODES, handler=self._on_node)
        self.ledger = Ledger() if args.node_fit else None
        """Free capacity per node, kept up to date by the watches; only nodeFit reads it."""
        self.priority_classes = Informer(kube, PRIORITYCLASSES)
        self.informers = [
            self.jobs,
            self.reservations,
            self.pods,
            self.replicasets,
            self.deployments,
            self.statefulsets,
            self.pdbs,
            self.nodes,
            self.priority_classes,
        ]
        self.limiter = arbitration.LimiterState()
        self.memo: arbitration.Memo | None = None
        """What the last arbitration round read, for the next (see arbitration.Memo)."""
        self.caches = {informer.resource.plural: informer for informer in self.informers}
        self.executor = Executor(
            kube, Recorder(kube, component=COMPONENT, instance=identity), written=self._written
        )

    def _written(self, resource: Resource, obj: dict[str, Any]) -> None:
        """The caches take this process's own writes at once: the next arbitration round
        must count a job it admitted as Running even if the watch is slow to show it."""
        cache = self.caches.get(resource.plural)
        if cache is not None:
            cache.assume(obj)

    # ----- events -> keys -------------------------------------------------------------

    def _on_job(self, kind: str, job: dict[str, Any]) -> None:
        self.queue.add(f"job/{job['metadata']['name']}")

    def _on_node(self, kind: str, node: dict[str, Any]) -> None:
        if self.ledger is not None:
            self.ledger.on_node(kind, node)

    def _on_reservation(self, kind: str, reservation: dict[str, Any]) -> None:
        if self.ledger is not None:
            self.ledger.on_reservation(kind, reservation)
        self.queue.add(f"rsv/{reservation['metadata']['name']}")
        job = protocol.annotations_of(reservation).get(keys.JOB)
        if job:
            self.queue.add(f"job/{job}")

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        if self.ledger is not None:
            self.ledger.on_pod(kind, pod)
        reservation = protocol.placeholder_reservation(pod)
        if reservation:
            self.queue.add(f"rsv/{reservation}")
        claim = protocol.pod_claim(pod)
        if claim:
            for rsv in self.reservations.by_index("claim", claim):
                self.queue.add(f"rsv/{rsv['metadata']['name']}")
                self._on_reservation(kind, rsv)
        for job in self.jobs.by_index("pod", object_key(pod)):
            self.queue.add(f"job/{job['metadata']['name']}")

    # ----- views ----------------------------------------------------------------------

    def _pod_by_uid(self, uid: str) -> dict[str, Any] | None:
        found = self.pods.by_index("uid", uid)
        return found[0] if found else None

    def _owner(self, reservation: Mapping[str, Any] | None) -> dict[str, Any] | None:
        for uid in protocol.owner_uids(reservation or {}):
            pod = self._pod_by_uid(uid)
            if pod is not None:
                return pod
        return None

    def _workload_uid(self, pod: Mapping[str, Any] | None) -> str | None:
        controller = protocol.controller_of(pod or {})
        if controller is None or pod is None:
            return None
        replicaset = (
            self.replicasets.get(f"{pod['metadata']['namespace']}/{controller['name']}")
            if controller.get("kind") == "ReplicaSet"
            else None
        )
        return protocol.top_level_workload(controller, replicaset)

    def _reservation_view(self, reservation: dict[str, Any]) -> reservations.ReservationView:
        name = reservation["metadata"]["name"]
        placeholders = self.pods.by_index("reservation", name)
        claim = protocol.claim_of(reservation)
        claimers = self.pods.by_index("claim", claim) if claim else []
        return reservations.ReservationView(
            reservation=reservation,
            placeholder=placeholders[0] if placeholders else None,
            claimer=claimers[0] if claimers else None,
            owner=self._owner(reservation),
            now=datetime.now(UTC),
            image=self.args.placeholder_image,
        )

    def _job_view(self, job: dict[str, Any]) -> jobs.JobView:
        ref = job["spec"]["podRef"]
        pod = self.pods.get(f"{ref.get('namespace')}/{ref.get('name')}")
        reservation = self.reservations.get(jobs.reservation_name(job))
        siblings: list[dict[str, Any]] = []
        for owner in (reservation or {}).get("spec", {}).get("owners") or []:
            uid = (owner.get("controller") or {}).get("uid")
            if uid:
                siblings += self.pods.by_index("controller", uid)
        return jobs.JobView(
            job=job,
            pod=pod,
            reservation=reservation,
            owner=self._owner(reservation),
            workload_uid=self._workload_uid(pod),
            now=datetime.now(UTC),
            args=self.args,
            siblings=tuple(siblings),
        )

    # ----- reconcile ------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        kind, name = key.split("/", 1)
        if kind == "rsv":
            reservation = self.reservations.get(name)
            if reservation is None:
                return
            plan = reservations.decide(self._reservation_view(reservation))
            outcome = await self.executor.run(plan)
        else:
            job = self.jobs.get(name)
            if job is None:
                return
            view = self._job_view(job)
            plan = jobs.decide(view)
            outcome = await self.executor.run(plan)
            if outcome.done:
                _record_job_writes(job, plan)
            if outcome.eviction_refused is not None:
                refused = outcome.eviction_refused
                plan = jobs.eviction_refused(
                    view, status_code=refused.status, message=refused.message
                )
                await self.executor.run(plan)
        if not outcome.done:
            if not outcome.conflict and outcome.eviction_refused is None:
                metrics.RECONCILE_ERRORS.labels(kind=kind).inc()
            self.queue.add_after(key, RETRY_AFTER_ERROR if not outcome.conflict else 0.2)
        elif plan.requeue_after is not None:
            self.queue.add_after(key, plan.requeue_after)

    async def work(self) -> None:
        failures: dict[str, int] = {}
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile(key)
                failures.pop(key, None)
            except Exception:
                # A bug or an object we cannot handle: say so, and back off so that one bad
                # object never floods the log or starves the others.
                metrics.RECONCILE_ERRORS.labels(kind=key.split("/", 1)[0]).inc()
                failures[key] = failures.get(key, 0) + 1
                delay = min(RETRY_AFTER_ERROR * 2 ** failures[key], MAX_BACKOFF)
                log.exception("reconcile %s failed (retry in %.0fs)", key, delay)
                self.queue.add_after(key, delay)

    async def admit_loop(self) -> None:
        """Start pending jobs, every arbitration interval."""
        interval = self.args.arbitration_args.interval.total_seconds()
        while True:
            try:
                metrics.observe_jobs(self.jobs.values())
                metrics.observe_reservations(self.reservations.values())
                await self.admit_once()
                await self.release_stray_gates()
            except Exception:
                log.exception("arbitration round failed")
            await asyncio.sleep(interval)

    async def release_stray_gates(self) -> None:
        """No pod stays gated by Berth unless a live Reservation holds its claim."""
        now = datetime.now(UTC)
        for pod in self.pods.by_index("gated", "yes"):
            token = protocol.pod_claim(pod)
            claimed = (
                next(
                    (
                        r
                        for r in self.reservations.by_index("claim", token)
                        if protocol.phase(r) not in ("Succeeded", "Failed")
                    ),
                    None,
                )
                if token
                else None
            )
            plan = reservations.stray_gate(pod, claimed=claimed, now=now)
            if plan.actions:
                await self.executor.run(plan)

    async def admit_once(self) -> None:
        by_phase: dict[str, list[dict[str, Any]]] = {}
        for job in self.jobs.values():
            phase = (job.get("status") or {}).get("phase") or PodMigrationJobPhase.PENDING
            by_phase.setdefault(phase, []).append(job)
        pending = by_phase.get(PodMigrationJobPhase.PENDING, [])
        if not pending:
            return
        with metrics.ARBITRATION_ROUND_DURATION.time():
            result = arbitration.arbitrate(
                arbitration.Snapshot(
                    pending=pending,
                    in_flight=by_phase.get(PodMigrationJobPhase.RUNNING, []),
                    history=[job for phase in TERMINAL_PHASES for job in by_phase.get(phase, [])],
                    pods=self.pods.store,
                    workload_of=_WorkloadOf(self),
                    workloads=_Workloads(self),
                    pods_of_workload=_PodsOfWorkload(self),
                    pdbs=self.pdbs.values(),
                    args=self.args,
                    limiter=self.limiter,
                    nodes=self.nodes.store if self.args.node_fit else {},
                    free=_Free(self.ledger) if self.ledger is not None else {},
                    priority_classes={
                        name: int(obj.get("value") or 0)
                        for name, obj in self.priority_classes.store.items()
                    },
                    memo=self.memo,
                    now=datetime.now(UTC),
                )
            )
        self.memo = result.memo
        if not self.args.dry_run:  # a dry run starts no job, so it takes no token
            self.limiter = result.limiter
        # Most waiting jobs' statuses already say why: only the changed ones are written.
        plans = []
        for decision in result.decisions:
            pod = decision.pod
            workload = (
                self._workload_uid(pod) if pod is not None and decision.verdict == "admit" else None
            )
            plan = jobs.admission(decision, workload_uid=workload, dry_run=self.args.dry_run)
            if plan.actions:
                plans.append((decision, plan))
        writes = asyncio.Semaphore(ADMISSION_WRITES)

        async def write(decision: arbitration.Decision, plan: Plan) -> None:
            async with writes:
                outcome = await self.executor.run(plan)
            if not outcome.done:
                return
            _record_job_writes(decision.job, plan)
            if decision.verdict == "admit" and not self.args.dry_run:
                self.queue.add(f"job/{decision.job['metadata']['name']}")

        results = await asyncio.gather(*(write(*item) for item in plans), return_exceptions=True)
        for (decision, _), error in zip(plans, results, strict=True):
            if isinstance(error, Exception):
                name = decision.job["metadata"]["name"]
                log.error(
                    "writing arbitration's decision on job %s failed: %s",
                    name,
                    error,
                    extra={"job": name},
                )

    async def run(self, elector: LeaderElector) -> None:
        tasks = [asyncio.create_task(informer.run()) for informer in self.informers]
        try:
            await asyncio.gather(*(informer.synced.wait() for informer in self.informers))
            log.info("caches synced; waiting for leadership")
            await elector.leading.wait()
            for job in self.jobs.values():  # adopt every job in flight
                self.queue.add(f"job/{job['metadata']['name']}")
            for reservation in self.reservations.values():
                self.queue.add(f"rsv/{reservation['metadata']['name']}")
            workers = [
                asyncio.create_task(self.work()) for _ in range(self.args.max_concurrent_reconciles)
            ]
            workers.append(asyncio.create_task(self.admit_loop()))
            tasks += workers
            await elector.lost.wait()
            raise SystemExit("lost leadership; exiting so that only the new leader acts")
        finally:
            for task in tasks:
                task.cancel()


class _WorkloadOf(Mapping[str, str]):
    """Controller UID → the workload above it: a ReplicaSet's Deployment, from the caches."""

    def __init__(self, controller: Controller) -> None:
        self.replicasets = controller.replicasets

    def __getitem__(self, uid: str) -> str:
        for replicaset in self.replicasets.by_index("uid", uid):
            above = protocol.controller_of(replicaset)
            if above is not None:
                return str(above["uid"])
        raise KeyError(uid)

    def __iter__(self) -> Iterator[str]:
        return (
            o["metadata"]["uid"]
            for o in self.replicasets.store.values()
            if protocol.controller_of(o) is not None
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _Free(Mapping[str, Resources]):
    """Node name → its free capacity, from the ledger (for nodeFit)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def __getitem__(self, node: str) -> Resources:
        free = self.ledger.free(node)
        if free is None:
            raise KeyError(node)
        return free

    def __iter__(self) -> Iterator[str]:
        return iter(self.ledger.nodes())

    def __len__(self) -> int:
        return len(self.ledger.nodes())


class _Workloads(Mapping[str, dict[str, Any]]):
    """Workload UID → Deployment, StatefulSet or ReplicaSet, from the caches."""

    def __init__(self, controller: Controller) -> None:
        self.informers = [controller.deployments, controller.statefulsets, controller.replicasets]

    def __getitem__(self, uid: str) -> dict[str, Any]:
        for informer in self.informers:
            found = informer.by_index("uid", uid)
            if found:
                return found[0]
        raise KeyError(uid)

    def __iter__(self) -> Iterator[str]:
        return (o["metadata"]["uid"] for i in self.informers for o in i.store.values())

    def __len__(self) -> int:
        return sum(len(i.store) for i in self.informers)


class _PodsOfWorkload(Mapping[str, list[dict[str, Any]]]):
    """Workload UID → the pods it directly controls."""

    def __init__(self, controller: Controller) -> None:
        self.pods = controller.pods

    def __getitem__(self, uid: str) -> list[dict[str, Any]]:
        return self.pods.by_index("controller", uid)

    def __iter__(self) -> Iterator[str]:
        return iter(self.pods.indexes["controller"])

    def __len__(self) -> int:
        return len(self.pods.indexes["controller"])


def _record_job_writes(before: Mapping[str, Any], plan: Plan) -> None:
    """Feed the job status writes of a plan that ran to the end into the metrics."""
    now = datetime.now(UTC)
    for action in plan.actions:
        if isinstance(action, UpdateStatus) and action.resource == PODMIGRATIONJOBS:
            metrics.record_job_status(before, action.obj, now=now)


async def run(
    *,
    kubeconfig: Path | None,
    settings: MigrationControllerArgs | None,
    lease_namespace: str,
    health_port: int,
    identity: str | None = None,
) -> None:
    cancel_on_signals()
    args = settings or MigrationControllerArgs()
    identity = identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    kube = await Kube.connect(kubeconfig)
    controller = Controller(kube, args, identity=identity)
    elector = LeaderElector(kube, namespace=lease_namespace, name=COMPONENT, identity=identity)
    app = web.Application()
    # Ready once the caches are synced and the leader is known: this replica leads, or
    # stands by behind a live holder of the Lease.
    add_health(
        app,
        lambda: all(i.synced.is_set() for i in controller.informers) and elector.holder is not None,
    )
    add_metrics(app)
    server = asyncio.create_task(serve(app, host="0.0.0.0", port=health_port))
    election = asyncio.create_task(elector.run())
    try:
        await controller.run(elector)
    finally:
        server.cancel()
        election.cancel()
        await kube.close()
