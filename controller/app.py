"""The controller process: leader election, and the loops that run while this replica leads.

Wiring only. The caches (`controller.caches`) feed the work queue (`controller.queue`);
workers reconcile its keys (`controller.reconcile`); the admission loop
(`controller.admission`) starts pending jobs. Nothing is kept only in memory: a new
leader rebuilds everything from the API server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from berth import metrics, web
from berth.kube.client import Kube
from berth.kube.events import Recorder
from berth.kube.lease import LeaderElector
from berth.protocol import Object
from berth.server import Tls, add_health, add_metrics, cancel_on_signals, serve
from berth.settings import MigrationControllerArgs
from controller.admission import SWITCH_INTERVAL, Admission
from controller.caches import Caches
from controller.executor import Executor
from controller.queue import WorkQueue, job_key, namespace_key, reservation_key
from controller.reconcile import Reconciler, work
from controller.signing import admission_key

log = logging.getLogger(__name__)

COMPONENT = "berth-controller"


class Controller:
    def __init__(self, kube: Kube, args: MigrationControllerArgs, *, identity: str) -> None:
        self.args = args
        self.queue = WorkQueue()
        self.leading = False
        """Whether this replica leads: a standby's handlers queue nothing (no worker would
        take it, and the queue would keep every name met for months); `lead` adopts
        everything at once."""
        metrics.WORKQUEUE_DEPTH.set_function(lambda: len(self.queue))
        metrics.LEADER.set(0)
        self.caches = Caches(kube, args, enqueue=self._enqueue, enqueue_after=self._enqueue_after)
        metrics.GATED_PODS.set_function(lambda: len(self._gated()))
        metrics.OLDEST_GATE.set_function(
            lambda: metrics.oldest_age(self._gated(), datetime.now(UTC))
        )
        self.executor = Executor(
            kube,
            Recorder(kube, component=COMPONENT, instance=identity),
            written=self.caches.assume,
        )
        self.reconciler = Reconciler(self.caches, self.executor)
        self.admission = Admission(self.caches, self.executor, args, admitted=self.queue.add)

    def _gated(self) -> Sequence[Object]:
        return self.caches.pods.by_index("gated", "yes")

    def _enqueue(self, key: str) -> None:
        if self.leading:
            self.queue.add(key)

    def _enqueue_after(self, key: str, seconds: float) -> None:
        if self.leading:
            self.queue.add_after(key, seconds)

    def lead(self) -> None:
        """From now on events are queued; and every job, Reservation and namespace the
        caches hold is, once: a new leader adopts whatever is in flight."""
        self.leading = True
        metrics.LEADER.set(1)
        for job in self.caches.jobs.values():
            self.queue.add(job_key(job["metadata"]["name"]))
        for reservation in self.caches.reservations.values():
            self.queue.add(reservation_key(reservation["metadata"]["name"]))
        # Which namespaces must carry berth.sh/migrating, from what the API server holds:
        # those with Reservations, and those labelled (by an earlier leader).
        for name in {
            *self.caches.reservations.indexes["namespace"],
            *self.caches.labelled_namespaces(),
        }:
            self.queue.add(namespace_key(name))

    async def run(self, elector: LeaderElector) -> None:
        # Each action first asks whether this replica still holds the lease: a loop that
        # stalled past the renew deadline writes nothing more, even before `lost` is set.
        self.executor.may_act = elector.still_leading
        informers = self.caches.informers
        tasks = [asyncio.create_task(informer.run()) for informer in informers]
        try:
            await asyncio.gather(*(informer.synced.wait() for informer in informers))
            log.info("caches synced; waiting for leadership")
            await elector.leading.wait()
            self.lead()
            tasks += [
                asyncio.create_task(work(self.queue, self.reconciler.reconcile))
                for _ in range(self.args.max_concurrent_reconciles)
            ]
            tasks.append(asyncio.create_task(self.admission.loop()))
            await elector.lost.wait()
            raise SystemExit("lost leadership; exiting so that only the new leader acts")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def run(
    *,
    kubeconfig: Path | None,
    settings: MigrationControllerArgs | None,
    lease_namespace: str,
    health_port: int,
    tls: Tls | None,
    identity: str | None = None,
) -> None:
    cancel_on_signals()
    sys.setswitchinterval(SWITCH_INTERVAL)
    args = settings or MigrationControllerArgs()
    identity = identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    kube = await Kube.connect(kubeconfig)
    controller = Controller(kube, args, identity=identity)
    controller.caches.admission_key = await admission_key(kube, namespace=lease_namespace)
    elector = LeaderElector(kube, namespace=lease_namespace, name=COMPONENT, identity=identity)
    app = web.App()
    # Ready once the caches are synced and the leader is known: this replica leads, or
    # stands by behind a live holder of the Lease.
    add_health(app, lambda: controller.caches.synced() and elector.holder is not None)
    add_metrics(app)
    server = asyncio.create_task(serve(app, host="0.0.0.0", port=health_port, tls=tls))
    election = asyncio.create_task(elector.run())
    running = asyncio.create_task(controller.run(elector))
    try:
        # The health server failing (its port taken, its certificate unreadable) ends the
        # controller too, saying why: probes would otherwise fail with nothing logged.
        done, _ = await asyncio.wait({running, server}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in (running, server, election):
            task.cancel()
        # Nothing acts any more once the loops have ended: give the Lease to a standby.
        await asyncio.gather(running, election, return_exceptions=True)
        await elector.release()
        await kube.close()
