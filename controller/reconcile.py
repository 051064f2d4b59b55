"""Reconcile: one pass over the object a key names, and the workers that run the passes.

A pass reads the object and what it depends on from the caches, asks the pure decision
(`controller.jobs`, `controller.reservations` or `controller.namespaces`) for a plan, runs
the plan, and says when to look again. Nothing is kept between passes: a restarted
controller picks up every object where the API server shows it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import aiohttp

from berth import metrics
from berth.api import PodMigrationJobReason
from berth.kube.client import PODMIGRATIONJOBS
from controller import jobs, namespaces, reservations
from controller.actions import Event, Plan, UpdateStatus
from controller.caches import Caches
from controller.executor import Executor, Outcome
from controller.queue import NAMESPACE, RESERVATION, WorkQueue, split

log = logging.getLogger(__name__)

RETRY_AFTER_ERROR = 2.0
"""When to try again after a plan failed on an API error, doubled with each failure of
the key's passes in a row..."""
RETRY_AFTER_ERROR_MAX = 30.0
"""...up to this: an API server that throttles or fails is not asked ever faster."""


class ApiFailure(Exception):
    """A pass's plan stopped on an API error (not a lost race, not a refused eviction,
    which its plan handles): the key is tried again with back-off."""


RETRY_AFTER_CONFLICT = 0.2
"""When to try again after a write lost a race: the cache is about to show the winner."""


class Reconciler:
    def __init__(self, caches: Caches, executor: Executor) -> None:
        self.caches = caches
        self.executor = executor

    async def reconcile(self, key: str) -> float | None:
        """One pass over the object `key` names. Returns the seconds after which to look
        again if nothing else happens, or None to wait for the next event about it."""
        kind, name = split(key)
        if kind == NAMESPACE:
            ran = await self._namespace(name)
        else:
            ran = await (self._reservation(name) if kind == RESERVATION else self._job(name))
        if ran is None:  # the object is gone
            return None
        plan, outcome = ran
        if outcome.done:
            return plan.requeue_after
        if outcome.conflict:
            return RETRY_AFTER_CONFLICT
        if outcome.held_back:
            # Not an error: the caches are about to show why (`Executor._place_still_there`).
            return RETRY_AFTER_ERROR
        metrics.RECONCILE_ERRORS.labels(kind=kind).inc()
        raise ApiFailure(key)

    async def _reservation(self, name: str) -> tuple[Plan, Outcome] | None:
        reservation = self.caches.reservations.get(name)
        if reservation is None:
            return None
        view = self.caches.reservation_view(reservation)
        plan = reservations.decide(view)
        outcome = await self.executor.run(plan)
        refused = outcome.create_refused
        if refused is not None:
            # Said on the Reservation as the plan left it; the key still backs off as
            # after any API error, and the create is tried again then.
            current = self.caches.reservations.get(name) or reservation
            await self.executor.run(
                reservations.placeholder_refused(
                    replace(view, reservation=current),
                    status_code=refused.status,
                    message=refused.message,
                    resource=outcome.refused_resource,
                )
            )
        return plan, outcome

    async def _namespace(self, name: str) -> tuple[Plan, Outcome] | None:
        if self.caches.namespaces.get(name) is None:
            self.caches.label_refused(name, None)
            return None
        plan = self.caches.namespace_plan(name)
        outcome = await self.executor.run(plan)
        error = outcome.error
        if (
            namespaces.adds_label(plan)
            and error is not None
            and error.status in jobs.REFUSED_FOR_GOOD
        ):
            self.caches.label_refused(name, f"{error.status}: {error.message}")
        else:  # taken, not asked (labelled, or no Reservation waits), or to be asked again
            self.caches.label_refused(name, None)
        return plan, outcome

    async def _job(self, name: str) -> tuple[Plan, Outcome] | None:
        job = self.caches.jobs.get(name)
        if job is None:
            return None
        view = self.caches.job_view(job)
        plan = jobs.decide(view)
        outcome = await self.executor.run(plan)
        if outcome.done:
            record_job_writes(job, plan)
        refused_for_good = outcome.error
        if refused_for_good is not None and refused_for_good.status in jobs.REFUSED_FOR_GOOD:
            # Tried again with back-off (`ApiFailure`): said where `kubectl describe` shows it.
            await self.executor.run(
                Plan().then(
                    Event(
                        job,
                        PodMigrationJobReason.WRITE_REFUSED,
                        f"{outcome.failed} was refused (HTTP {refused_for_good.status}: "
                        f"{refused_for_good.message}); it is tried again with back-off",
                        type="Warning",
                    )
                )
            )
        create_refused = outcome.create_refused
        if create_refused is not None:
            ended = jobs.reservation_refused(
                self.caches.job_view(self.caches.jobs.get(name) or job),
                status_code=create_refused.status,
                message=create_refused.message,
            )
            if ended is not None:
                return ended, await self.executor.run(ended)
        refused = outcome.eviction_refused
        if refused is None:
            return plan, outcome
        # Said on the job as the plan left it: the plan wrote Evicting before the eviction
        # (its write is in the cache), and a status built on the copy read before that
        # write would conflict. The refusal's plan says when to try again.
        current = self.caches.jobs.get(name) or job
        refusal = jobs.eviction_refused(
            self.caches.job_view(current),
            status_code=refused.status,
            message=refused.message,
            by_budget=refused.disruption_budget,
        )
        said = await self.executor.run(refusal)
        if not said.done:
            # A status write lost a race, or the Reservation was claimed before it could
            # be closed (its claim stays); the next pass does the rest.
            log.warning("job %s: the refused eviction (%s) was not handled in full", name, refused)
        return refusal, said


async def work(queue: WorkQueue, reconcile: Callable[[str], Awaitable[float | None]]) -> None:
    """A worker: take a key, reconcile it, put it back for when it is due; forever."""
    while True:
        key = await queue.get()
        try:
            again = await reconcile(key)
        except ApiFailure:
            # Said by the executor; tried again ever later, as long as it fails.
            queue.retry(key, first=RETRY_AFTER_ERROR, limit=RETRY_AFTER_ERROR_MAX)
        except (aiohttp.ClientError, TimeoutError) as error:
            # The API server out of reach (restarting, a network fault): not a bug, and
            # tried again as soon as any API failure, not after the back-off of a bug.
            metrics.RECONCILE_ERRORS.labels(kind=split(key)[0]).inc()
            delay = queue.retry(key, first=RETRY_AFTER_ERROR, limit=RETRY_AFTER_ERROR_MAX)
            log.warning(
                "reconcile %s: the API server failed: %s (retry in %.0fs)",
                key,
                str(error) or type(error).__name__,
                delay,
            )
        except Exception:
            # A bug or an object we cannot handle: say so, and back off so that one bad
            # object never floods the log or starves the others.
            metrics.RECONCILE_ERRORS.labels(kind=split(key)[0]).inc()
            delay = queue.retry(key)
            log.exception("reconcile %s failed (retry in %.0fs)", key, delay)
        else:
            queue.forget(key)
            if again is not None:
                queue.add_after(key, again)
        finally:
            queue.done(key)


def record_job_writes(before: Mapping[str, Any], plan: Plan) -> None:
    """Feed the job status writes of a plan that ran to the end into the metrics."""
    now = datetime.now(UTC)
    for action in plan.actions:
        if isinstance(action, UpdateStatus) and action.resource == PODMIGRATIONJOBS:
            metrics.record_job_status(before, action.obj, now=now)
