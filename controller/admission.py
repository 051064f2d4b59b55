"""Admission: every arbitration interval, decide which Pending jobs start, and write it.

`controller.arbitration` decides over a snapshot of the caches; each decision becomes a
job status write (`controller.jobs.admission`), and an admitted job's key goes to the work
queue so that its first step follows at once. The same loop lets go of pods gated by
Berth that no live Reservation waits for.

A round reads every Pending job and much of the cluster: at 10,000 jobs it takes tens of
milliseconds, hundreds for a new leader's first round. The event loop that renews the
Lease, answers probes and applies watch events must not wait for it, so a round runs in
three parts:

1. on the loop, the caches are frozen (`Caches.frozen`: a few dicts copied, no object);
2. on the admission thread, `decide` arbitrates over that frozen copy and works out the
   writes; the loop goes on meanwhile, and its watches change the caches, not the copy;
3. on the loop, the writes go out, a few at a time. Each is conditional on the
   resourceVersion of the job the round read, so a job that changed since the copy was
   taken is not written over: the write fails and the next round decides again.

Python runs one thread at a time: while the admission thread works, the loop's thread
waits, each time it wakes, for the switch interval (`SWITCH_INTERVAL`) or for the end of
the single step the other thread is in, whichever comes later. So no step of a round is
long: the sort goes in runs, and what a round lets go of is freed piece by piece.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from berth import metrics, protocol
from berth.api import TERMINAL_PHASES, PodMigrationJobPhase, keys
from berth.kube.client import PODS
from berth.kube.informer import object_key
from berth.settings import MigrationControllerArgs
from controller import arbitration, jobs, reservations
from controller.actions import Patch, Plan
from controller.caches import Caches, Frozen
from controller.executor import Executor
from controller.jobs import marker
from controller.queue import job_key
from controller.reconcile import record_job_writes

log = logging.getLogger(__name__)

Object = dict[str, Any]
T = TypeVar("T")

ADMISSION_WRITES = 16
"""Status writes of one arbitration round that may be in flight at once."""

SWITCH_INTERVAL = 0.001
"""The interpreter's switch interval for the controller (`sys.setswitchinterval`), in
seconds: while a round runs on the admission thread, the event loop's thread waits up to
this long for the interpreter each time it wakes (Python's default is 5 ms)."""


Write = tuple[arbitration.Decision, Plan]


@dataclass(frozen=True)
class Decided:
    """What a round decided, ready to write."""

    writes: list[Write]
    """The decisions that change a job, each with its plan."""
    limiter: arbitration.LimiterState
    memo: arbitration.Memo


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
        """What the last arbitration round read, for the next (see arbitration.Memo).
        Like `limiter`, read and replaced only on the admission thread (`_decide`)."""
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arbitration")
        """The admission thread: one round at a time, off the event loop."""

    async def loop(self) -> None:
        """Every arbitration interval: start pending jobs, and let stray pods go.

        Each part runs on its own: a round that raises (a bug, an object or a setting it
        cannot handle) must not keep a pod gated, nor the gauges from being updated."""
        interval = self.args.arbitration_args.interval.total_seconds()
        try:
            while True:
                try:
                    await self.off_loop(
                        partial(
                            _observe, self.caches.jobs.values(), self.caches.reservations.values()
                        )
                    )
                except Exception:
                    log.exception("updating the job and Reservation gauges failed")
                try:
                    await self.admit_once()
                except Exception:
                    log.exception("arbitration round failed")
                try:
                    await self.release_strays()
                except Exception:
                    log.exception("releasing stray pods failed")
                try:
                    await self.withdraw_orphan_soft_evictions()
                except Exception:
                    log.exception("withdrawing soft evictions failed")
                await asyncio.sleep(interval)
        finally:
            self.worker.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, work: Callable[[], T]) -> T:
        """Run `work` on the admission thread; the event loop goes on meanwhile. `work`
        must read nothing the loop changes: a `Frozen` copy of the caches, not the caches.
        What `work` holds is let go of on that thread too: freeing a round's worth of
        objects takes milliseconds."""
        done = asyncio.get_running_loop().run_in_executor(self.worker, work)
        del work
        return await done

    async def release_strays(self) -> None:
        """No pod stays gated by Berth unless a live Reservation holds its claim, and none
        stays tied to a deleted node, or to a node that keeps refusing it, once no live
        Reservation holds its claim (`reservations.stray`). Each pod on its own: one that
        cannot be handled keeps no other waiting."""
        now = datetime.now(UTC)
        stranded = {pod["metadata"].get("uid"): pod for pod in self.caches.stranded_claimers()}
        tied = {pod["metadata"].get("uid"): pod for pod in self.caches.tied_claimers()}
        gated = {
            pod["metadata"].get("uid"): pod for pod in self.caches.pods.by_index("gated", "yes")
        }
        for uid, listed in (gated | tied | stranded).items():
            # As the cache holds it now: the plans of the pods before it were awaited,
            # and meanwhile the scheduler may have bound it, or its gate come off.
            pod = self.caches.pods.get(object_key(listed))
            if pod is None or pod["metadata"].get("uid") != uid:
                continue
            token = protocol.pod_claim(pod)
            try:
                plan = reservations.stray(
                    pod,
                    holders=self.caches.reservations.by_index("claim", token) if token else [],
                    node_gone=uid in stranded,
                    now=now,
                )
                if plan.actions:
                    await self.executor.run(plan)
            except Exception:
                log.exception("releasing pod %s failed", object_key(pod))

    async def withdraw_orphan_soft_evictions(self) -> None:
        """A pod carrying the soft eviction of a job that no longer exists (deleted while
        it waited) loses it: whatever acts on it would evict the pod with no place held.
        The job's own end takes it off otherwise (`controller.jobs.machine`)."""
        for job, pods in list(self.caches.pods.indexes["soft-evicted"].items()):
            if self.caches.jobs.get(job) is not None:
                continue
            for key in list(pods):
                pod = self.caches.pods.get(key)
                if pod is None:
                    continue
                metadata = pod["metadata"]
                patch = {
                    "metadata": {"uid": metadata["uid"], "annotations": {keys.SOFT_EVICTION: None}}
                }
                log.info(
                    "pod %s: its soft eviction by PodMigrationJob %s, which no longer exists, "
                    "is taken off",
                    object_key(pod),
                    job,
                )
                try:
                    await self.executor.run(
                        Plan().then(
                            Patch(
                                PODS, metadata["name"], patch, namespace=metadata.get("namespace")
                            )
                        )
                    )
                except Exception:
                    log.exception("withdrawing the soft eviction of pod %s failed", object_key(pod))

    async def admit_once(self) -> None:
        """One arbitration round: freeze the caches, decide off the loop, write."""
        writes = await self.off_loop(partial(self._decide, self.caches.frozen(), datetime.now(UTC)))
        await self._write(writes)

    def _decide(self, frozen: Frozen, now: datetime) -> deque[Write]:
        """On the admission thread: a round, and what it hands on to the next. The memo a
        round replaces is freed here (`_let_go`), and so are the round's decisions but
        for those that are written."""
        decided = decide(frozen, args=self.args, limiter=self.limiter, memo=self.memo, now=now)
        if decided is None:
            return deque()
        replaced, self.memo = self.memo, decided.memo
        _let_go(replaced)
        if not self.args.dry_run:  # a dry run starts no job, so it takes no token
            self.limiter = decided.limiter
        return deque(decided.writes)

    async def _write(self, writes: deque[Write]) -> None:
        """Write the decisions, `ADMISSION_WRITES` at a time: as many writers, each taking
        the next decision left when it is done with one, and letting go of it once
        written, so that no step of the loop frees them all at once."""
        writers = min(ADMISSION_WRITES, len(writes))
        await asyncio.gather(*(self._writer(writes) for _ in range(writers)))

    async def _writer(self, left: deque[Write]) -> None:
        while left:
            decision, plan = left.popleft()
            try:
                outcome = await self.executor.run(plan)
            except Exception as error:
                name = decision.job["metadata"]["name"]
                log.error(
                    "writing arbitration's decision on job %s failed: %s",
                    name,
                    error,
                    extra={"job": name},
                )
                continue
            if not outcome.done:
                continue
            record_job_writes(decision.job, plan)
            if decision.verdict == "admit" and not self.args.dry_run:
                self.admitted(job_key(decision.job["metadata"]["name"]))


def decide(
    frozen: Frozen,
    *,
    args: MigrationControllerArgs,
    limiter: arbitration.LimiterState,
    memo: arbitration.Memo | None,
    now: datetime,
) -> Decided | None:
    """A round over a frozen copy of the caches: arbitrate, and the plan that writes each
    decision that changes its job (most waiting jobs' statuses already say why). None
    when no job is Pending. Reads only `frozen` and its arguments, and changes nothing
    but what `memo` keeps of the candidates, so it runs on any thread, one round at a
    time."""
    by_phase = _by_phase(frozen.jobs)
    # A job without a mode waits for its first reconcile to record defaultJobMode, so
    # that arbitration judges it by the mode it will run in.
    pending = [j for j in by_phase.get(PodMigrationJobPhase.PENDING, []) if j["spec"].get("mode")]
    if not pending:
        return None
    snapshot = arbitration.Snapshot(
        pending=pending,
        # Running as Berth admitted it: a job's status is written by whoever may abort
        # it, and one set Running by hand would take up the limits' room (its mark is
        # checked by the state machine, which sets it back to Pending).
        in_flight=[
            job
            for job in by_phase.get(PodMigrationJobPhase.RUNNING, [])
            if marker.admitted(frozen.admission_key, job)
        ],
        history=[job for phase in TERMINAL_PHASES for job in by_phase.get(phase, [])],
        pods=frozen.pods.store,
        workload_of=frozen.workload_of(),
        workloads=frozen.workloads(),
        pods_of_workload=frozen.pods_of_workload(),
        pdbs=frozen.pdbs,
        args=args,
        limiter=limiter,
        nodes=frozen.nodes,
        free=frozen.free,
        priority_classes=frozen.priority_values(),
        memo=memo,
        now=now,
    )
    with metrics.ARBITRATION_ROUND_DURATION.time():
        result = arbitration.arbitrate(snapshot)
    writes = []
    for decision in result.decisions:
        pod = decision.pod
        admitted = pod is not None and decision.verdict == "admit"
        plan = jobs.admission(
            decision,
            workload_uid=frozen.workload_uid(pod) if admitted else None,
            dry_run=args.dry_run,
            key=frozen.admission_key,
        )
        if plan.actions:
            writes.append((decision, plan))
    return Decided(writes, result.limiter, result.memo)


def _let_go(memo: arbitration.Memo | None) -> None:
    """Free a memo no round reads any more one entry at a time. Freed at once, the
    memo of 10,000 jobs read afresh is one step of the interpreter of some 10 ms, which
    holds every thread, the event loop's included; entry by entry, the loop gets its
    turn in between."""
    for part in (memo.jobs, memo.facts, memo.workloads) if memo is not None else ():
        if isinstance(part, dict):
            while part:
                part.popitem()


def _observe(all_jobs: list[Object], all_reservations: list[Object]) -> None:
    metrics.observe_jobs(all_jobs)
    metrics.observe_reservations(all_reservations)


def _by_phase(all_jobs: list[Object]) -> dict[str, list[Object]]:
    grouped: dict[str, list[Object]] = {}
    for job in all_jobs:
        phase = (job.get("status") or {}).get("phase") or PodMigrationJobPhase.PENDING
        grouped.setdefault(phase, []).append(job)
    return grouped
