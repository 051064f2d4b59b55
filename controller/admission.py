"""Admission: every arbitration interval, decide which Pending jobs start, and write it.

`controller.arbitration` decides over a snapshot of the caches; each decision becomes a
job status write (`controller.jobs.admission`), and an admitted job's key goes to the work
queue so that its first step follows at once. The same loop lets go of pods gated by
Berth that no live Reservation waits for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from berth import metrics, protocol
from berth.api import TERMINAL_PHASES, PodMigrationJobPhase, ReservationPhase
from berth.kube.informer import object_key
from berth.settings import MigrationControllerArgs
from controller import arbitration, jobs, reservations
from controller.actions import Plan
from controller.caches import Caches
from controller.executor import Executor
from controller.queue import job_key
from controller.reconcile import record_job_writes

log = logging.getLogger(__name__)

Object = dict[str, Any]

ADMISSION_WRITES = 16
"""Status writes of one arbitration round that may be in flight at once."""


class Admission:
    def __init__(
        self,
        caches: Caches,
        executor: Executor,
        args: MigrationControllerArgs,
        *,
        admitted: Callable[[str], None],
    ) -> None:
        self.caches = caches
        self.executor = executor
        self.args = args
        self.admitted = admitted
        """Told the key of each job admitted, to take its first step at once."""
        self.limiter = arbitration.LimiterState()
        self.memo: arbitration.Memo | None = None
        """What the last arbitration round read, for the next (see arbitration.Memo)."""

    async def loop(self) -> None:
        """Every arbitration interval: start pending jobs, and let stray gates go.

        Each part runs on its own: a round that raises (a bug, an object or a setting it
        cannot handle) must not keep a pod gated, nor the gauges from being updated."""
        interval = self.args.arbitration_args.interval.total_seconds()
        while True:
            try:
                metrics.observe_jobs(self.caches.jobs.values())
                metrics.observe_reservations(self.caches.reservations.values())
            except Exception:
                log.exception("updating the job and Reservation gauges failed")
            try:
                await self.admit_once()
            except Exception:
                log.exception("arbitration round failed")
            try:
                await self.release_stray_gates()
            except Exception:
                log.exception("releasing stray scheduling gates failed")
            await asyncio.sleep(interval)

    async def release_stray_gates(self) -> None:
        """No pod stays gated by Berth unless a live Reservation holds its claim. Each pod
        on its own: one that cannot be handled keeps no other gated."""
        now = datetime.now(UTC)
        for pod in self.caches.pods.by_index("gated", "yes"):
            try:
                plan = reservations.stray_gate(pod, claimed=self._live_claim(pod), now=now)
                if plan.actions:
                    await self.executor.run(plan)
            except Exception:
                log.exception("releasing the gate of pod %s failed", object_key(pod))

    def _live_claim(self, pod: Object) -> Object | None:
        """The Reservation, not yet Succeeded or Failed, whose claim the pod carries."""
        token = protocol.pod_claim(pod)
        if not token:
            return None
        terminal = (ReservationPhase.SUCCEEDED, ReservationPhase.FAILED)
        return next(
            (
                r
                for r in self.caches.reservations.by_index("claim", token)
                if protocol.phase(r) not in terminal
            ),
            None,
        )

    async def admit_once(self) -> None:
        by_phase = _by_phase(self.caches.jobs.values())
        # A job without a mode waits for its first reconcile to record defaultJobMode, so
        # that arbitration judges it by the mode it will run in.
        pending = [
            j for j in by_phase.get(PodMigrationJobPhase.PENDING, []) if j["spec"].get("mode")
        ]
        if not pending:
            return
        with metrics.ARBITRATION_ROUND_DURATION.time():
            result = arbitration.arbitrate(self._snapshot(pending, by_phase))
        self.memo = result.memo
        if not self.args.dry_run:  # a dry run starts no job, so it takes no token
            self.limiter = result.limiter
        await self._write(result.decisions)

    def _snapshot(
        self, pending: list[Object], by_phase: dict[str, list[Object]]
    ) -> arbitration.Snapshot:
        caches = self.caches
        return arbitration.Snapshot(
            pending=pending,
            in_flight=by_phase.get(PodMigrationJobPhase.RUNNING, []),
            history=[job for phase in TERMINAL_PHASES for job in by_phase.get(phase, [])],
            pods=caches.pods.store,
            workload_of=caches.workload_of(),
            workloads=caches.workloads(),
            pods_of_workload=caches.pods_of_workload(),
            pdbs=caches.pdbs.values(),
            args=self.args,
            limiter=self.limiter,
            nodes=caches.nodes.store if self.args.node_fit else {},
            free=caches.free(),
            priority_classes=caches.priority_values(),
            memo=self.memo,
            now=datetime.now(UTC),
        )

    async def _write(self, decisions: list[arbitration.Decision]) -> None:
        """Write the decisions on the jobs; most waiting jobs' statuses already say why, so
        only the changed ones are written."""
        plans = []
        for decision in decisions:
            pod = decision.pod
            workload = (
                self.caches.workload_uid(pod)
                if pod is not None and decision.verdict == "admit"
                else None
            )
            plan = jobs.admission(
                decision,
                workload_uid=workload,
                dry_run=self.args.dry_run,
                key=self.caches.admission_key,
            )
            if plan.actions:
                plans.append((decision, plan))
        writes = asyncio.Semaphore(ADMISSION_WRITES)

        async def write(decision: arbitration.Decision, plan: Plan) -> None:
            async with writes:
                outcome = await self.executor.run(plan)
            if not outcome.done:
                return
            record_job_writes(decision.job, plan)
            if decision.verdict == "admit" and not self.args.dry_run:
                self.admitted(job_key(decision.job["metadata"]["name"]))

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


def _by_phase(all_jobs: list[Object]) -> dict[str, list[Object]]:
    grouped: dict[str, list[Object]] = {}
    for job in all_jobs:
        phase = (job.get("status") or {}).get("phase") or PodMigrationJobPhase.PENDING
        grouped.setdefault(phase, []).append(job)
    return grouped
