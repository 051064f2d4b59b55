"""The eviction endpoints: read the pod, create or find its job, answer (`webhook.evictions`
decides each step).

The job is named after the pod's UID, so replicas answering retries of the same eviction
create it once between them: a create that finds it already there reads it instead. A
failure to reach the API server lets the eviction through, as `failurePolicy: Ignore`
does when the webhook itself cannot be reached: interception must never block a drain.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp

from berth import metrics, web
from berth.api import keys
from berth.kube.client import NAMESPACES, NODES, PODMIGRATIONJOBS, PODS, Kube, KubeError
from berth.kube.events import Recorder
from berth.protocol import Object
from berth.scheduling import being_drained
from berth.settings import MigrationControllerArgs
from webhook import evictions, review
from webhook.evictions import Answer, Deny, Eviction, Gone, Pass

log = logging.getLogger(__name__)

CONTROLLER_USER = "system:serviceaccount:berth-system:berth-controller"
"""The controller's identity as manifests/rbac installs it: its evictions always pass."""


@dataclass(frozen=True)
class Interception:
    """What the eviction endpoints need to know: the controller's configuration (the one
    file both read) and the controller's user name."""

    settings: MigrationControllerArgs
    controller_user: str = CONTROLLER_USER


class Interceptor:
    """Answers `pods/eviction` reviews. `reservations` is the webhook's Reservation cache."""

    def __init__(
        self,
        kube: Kube,
        *,
        interception: Interception,
        reservations: Mapping[str, Object],
        deadline: float,
    ) -> None:
        self.kube = kube
        self.settings = interception.settings
        self.controller_user = interception.controller_user
        self.reservations = reservations
        self.deadline = deadline
        self.recorder = Recorder(kube, component="berth-webhook", instance=socket.gethostname())
        self._events: set[asyncio.Task[None]] = set()

    async def labelled(self, request: web.Request) -> web.Response:
        """Evictions in namespaces labelled `berth.sh/intercept-evictions: "true"`."""
        return await self.review(request, labelled=True)

    async def unlabelled(self, request: web.Request) -> web.Response:
        """Evictions anywhere else: intercepted only with `allNamespaces`."""
        return await self.review(request, labelled=False)

    async def review(self, request: web.Request, *, labelled: bool) -> web.Response:
        try:
            eviction = review.parse_eviction(request.body)
        except review.MalformedReview as error:
            log.warning("refused an eviction review: %s", error)
            _count("malformed", "")
            return web.text(str(error), status=400)
        made: list[str] = []
        try:
            async with asyncio.timeout(self.deadline):
                answer = await self.answer(eviction, labelled=labelled, made=made)
        except Exception as error:
            failed = str(error) or type(error).__name__
            if isinstance(error, TimeoutError):
                failed = "no answer within the deadline"
            if not isinstance(error, (KubeError, aiohttp.ClientError, TimeoutError)):
                # Not the API server's failure: a defect. Said with its traceback, and
                # answered as one (the job, if made, still holds the eviction back).
                log.exception("eviction of %s/%s: failed", eviction.namespace, eviction.pod)
            if made:
                # The job may exist and run: letting the eviction through now would evict
                # the pod under it, before its Reservation holds a place. The retry finds
                # the job (or, the API server down, fails open at its first read).
                log.warning(
                    "eviction of %s/%s: retry later, job %s exists (the API server failed "
                    "after it was made: %s)", eviction.namespace, eviction.pod, made[0], failed,
                )  # fmt: skip
                return self.respond(eviction, evictions.in_progress(made[0], eviction))
            log.warning(
                "eviction of %s/%s: let through, the API server failed: %s",
                eviction.namespace,
                eviction.pod,
                failed,
            )
            _count("error", "")
            return web.json(review.response(eviction.uid, []))
        return self.respond(eviction, answer)

    def respond(self, eviction: Eviction, answer: Answer) -> web.Response:
        where = f"{eviction.namespace}/{eviction.pod} by {eviction.user}"
        if isinstance(answer, Pass):
            log.log(
                logging.DEBUG if answer.reason == "NotOptedIn" else logging.INFO,
                "eviction of %s: let through (%s: %s)",
                where,
                answer.reason,
                answer.message,
            )
            _count("passed", answer.reason)
            return web.json(review.response(eviction.uid, []))
        if isinstance(answer, Gone):
            log.info("eviction of %s: answered not found (%s)", where, answer.message)
            _count("gone", answer.reason)
            return web.json(
                review.refusal(eviction.uid, code=404, reason="NotFound", message=answer.message)
            )
        log.info("eviction of %s: retry later, job %s (%s)", where, answer.job, answer.reason)
        _count("intercepted", answer.reason)
        return web.json(
            review.refusal(eviction.uid, code=429, reason="TooManyRequests", message=answer.message)
        )

    async def answer(
        self, eviction: Eviction, *, labelled: bool, made: list[str] | None = None
    ) -> Answer:
        """The answer to the eviction; `made` gets the name of the job for it once its
        create is sent, should the answer fail after that (the job may exist then)."""
        passed = await self._screen(eviction, labelled=labelled)
        if passed:
            return passed
        try:
            pod = await self.kube.get(PODS, eviction.pod, eviction.namespace)
        except KubeError as error:
            if error.not_found:
                return Pass("PodNotFound", "no such pod")
            raise
        # Before `screen_pod`: a replacement still gated is a pod Berth never migrates.
        gone = await self.replaced(pod, eviction)
        if gone:
            return gone
        passed = evictions.screen_pod(pod, eviction)
        if passed:
            return passed
        now, default_ttl = datetime.now(UTC), self.settings.default_job_ttl
        try:
            job, created, other = await self._current_job(pod, eviction, now=now, made=made)
        except CreateRefused as refusal:
            return self.refused(pod, refusal.error, made=made)
        name = job["metadata"]["name"]
        answer = evictions.verdict(job, pod, now=now, default_ttl=default_ttl, other=other)
        if isinstance(answer, Deny) and created:
            self.event(
                pod,
                "EvictionIntercepted",
                f"eviction requested by {eviction.user} is carried out by PodMigrationJob "
                f"{name} ({job['spec']['mode']}); the requester is told to retry until then",
            )
            return Deny("JobCreated", answer.job, answer.message)
        if isinstance(answer, Pass):
            self.event(pod, "EvictionAllowed", answer.message, event_type="Warning")
        return answer

    async def _other(self, job: Object) -> evictions.Other | None:
        """The job arbitration failed `job` for, as migrating its pod already, as the API
        server has it now (`evictions.behind`): one GET, only for such a job. None when
        it cannot be read: the requester then waits as for a job not named."""
        name = evictions.behind(job)
        if name is None:
            return None
        try:
            return evictions.Other(name, await self.kube.find(PODMIGRATIONJOBS, name))
        except (KubeError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("PodMigrationJob %s could not be read: %s", name, error)
            return None

    async def _screen(self, eviction: Eviction, *, labelled: bool) -> Pass | None:
        """Why the eviction goes ahead as asked, before its pod is read (None: it may
        become a job): `evictions.screen`, then, unless every namespace is intercepted,
        the namespace's label as the API server has it now."""
        passed = evictions.screen(
            eviction,
            settings=self.settings,
            controller_user=self.controller_user,
            labelled=labelled,
        )
        if passed or self.settings.eviction_interception.all_namespaces:
            return passed
        passed = evictions.not_opted_in(await self._namespace(eviction), eviction)
        if passed:
            log.warning("eviction of %s/%s: %s", eviction.namespace, eviction.pod, passed.message)
        return passed

    async def _namespace(self, eviction: Eviction) -> Object | None:
        """The eviction's namespace as the API server has it now (None: not found)."""
        return await self.kube.find(NAMESPACES, eviction.namespace)

    def refused(self, pod: Object, error: KubeError, *, made: list[str] | None) -> Pass:
        """The job's create was refused outright: no job was made, and a retry would be
        refused the same way, so holding the eviction back would block the drain for
        good."""
        if made is not None:
            made.clear()
        passed = Pass(
            "JobRefused",
            f"the API server refused to create its PodMigrationJob ({error}); the eviction "
            "goes ahead as asked",
        )
        self.event(pod, "EvictionAllowed", passed.message, event_type="Warning")
        return passed

    async def _current_job(
        self, pod: Object, eviction: Eviction, *, now: datetime, made: list[str] | None
    ) -> tuple[Object, bool, evictions.Other | None]:
        """The pod's job for this eviction, made now (True) or found: the first of its
        `evictions.ATTEMPTS` names not taken by a stale job, nor by one that waited
        behind another job that has ended since (that attempt is over: the next one
        migrates the pod). With it, the job it waits behind, if any (`_other`)."""
        default_ttl = self.settings.default_job_ttl
        for attempt in range(1, evictions.ATTEMPTS + 1):
            job, created = await self._job(pod, eviction, attempt, made=made)
            other = None
            if created:
                break
            if evictions.stale(job, now=now, default_ttl=default_ttl):
                continue
            other = await self._other(job)
            if not evictions.moved_on(other):
                break
        return job, created, other

    async def _job(
        self, pod: Object, eviction: Eviction, attempt: int, *, made: list[str] | None
    ) -> tuple[Object, bool]:
        """The `attempt`th job for the pod's evictions, made now (True) or found. Its name
        goes to `made` once its create is sent: from then on it may exist."""
        body = evictions.job_for(pod, eviction=eviction, settings=self.settings, attempt=attempt)
        if made is not None:
            made[:] = [body["metadata"]["name"]]
        name = body["metadata"]["name"]
        try:
            return await self.kube.create(PODMIGRATIONJOBS, body), True
        except KubeError as error:
            if refused_outright(error):
                raise CreateRefused(error) from error
            if error.status != 409:  # AlreadyExists: another replica, or an earlier retry
                if error.status >= 500 and made is not None and await self._absent(name):
                    # The create failed and made nothing (a webhook on jobs down, say):
                    # failing open as for any failure of the API server, rather than
                    # holding the eviction back, on every retry, for a job never made.
                    # A throttled create (429) is retried.
                    made.clear()
                raise
        return await self.kube.get(PODMIGRATIONJOBS, name), False

    async def _absent(self, name: str) -> bool:
        """Whether the API server says job `name` does not exist (not when it cannot say)."""
        try:
            return await self.kube.find(PODMIGRATIONJOBS, name) is None
        except (KubeError, aiohttp.ClientError, TimeoutError):
            return False

    async def replaced(self, pod: Object, eviction: Eviction) -> Gone | None:
        """`Gone` when the pod is the replacement of a pod this requester's eviction had
        migrated (`evictions.already_migrated`). The job is found by the Reservation the
        pod took (one GET), or, for a StatefulSet's pod that took none (an EvictDirectly
        job), among the requester's jobs for the pod's name (one list, by label); then,
        when the job says so, the replacement's node is read to see it is not being
        drained."""
        gone = await self._by_reservation(pod, eviction) or await self._by_name(pod, eviction)
        if gone is None:
            return None
        # The node is read only for an eviction that would be answered 404 otherwise.
        node = (pod.get("spec") or {}).get("nodeName")
        if isinstance(node, str) and node and await self.draining(node, pod):
            return None
        return gone

    async def _by_reservation(self, pod: Object, eviction: Eviction) -> Gone | None:
        name = evictions.replaced_in(pod, self.reservations)
        if name is None:
            return None
        job = await self.kube.find(PODMIGRATIONJOBS, name)
        if job is None:
            return None
        waited = await self._waited_for(job, eviction)
        return evictions.already_migrated(
            job, pod, eviction=eviction, now=datetime.now(UTC), draining=False, waited=waited
        )

    async def _by_name(self, pod: Object, eviction: Eviction) -> Gone | None:
        """Among the requester's jobs for a StatefulSet pod's name, one that moved the pod
        this one replaces. A list that fails finds none: the eviction is then judged as
        any (a job, the requester told to retry), never let through for it."""
        if not evictions.replaces_by_name(pod, eviction):
            return None
        metadata = pod["metadata"]
        selector = (
            f"{keys.EVICTION_OF}={evictions.pod_label(metadata['namespace'], metadata['name'])},"
            f"{keys.REQUESTER}={evictions.requester_label(eviction.user)}"
        )
        try:
            listed = await self.kube.list(PODMIGRATIONJOBS, label_selector=selector)
        except (KubeError, aiohttp.ClientError, TimeoutError) as error:
            log.warning(
                "the jobs of %s/%s could not be listed: %s",
                metadata["namespace"],
                metadata["name"],
                error,
            )
            return None
        now = datetime.now(UTC)
        for job in listed.get("items") or []:
            if not evictions.moved(job):
                continue
            gone = evictions.already_migrated(job, pod, eviction=eviction, now=now, draining=False)
            if gone is not None:
                return gone
        return None

    async def _waited_for(self, job: Object, eviction: Eviction) -> bool:
        """Whether this requester's eviction of the pod `job` migrated was told to wait
        for `job` (`evictions.waited_for`): `kubectl migrate node`, then a drain of the
        node. One GET of the requester's first job for that pod, and only for a job not
        made from this requester's eviction."""
        requester = (job["metadata"].get("annotations") or {}).get(keys.REQUESTER)
        moved = (job.get("spec", {}).get("podRef") or {}).get("uid")
        if requester == eviction.user or not isinstance(moved, str) or not moved:
            return False
        name = f"{evictions.JOB_PREFIX}{moved}"
        try:
            own = await self.kube.find(PODMIGRATIONJOBS, name)
        except (KubeError, aiohttp.ClientError, TimeoutError) as error:
            log.warning("PodMigrationJob %s could not be read: %s", name, error)
            return False
        return evictions.waited_for(own, job, eviction)

    async def draining(self, node: str, pod: Object) -> bool:
        """Whether `node`, as the API server has it now, is being drained
        (`scheduling.being_drained`); not when it is gone."""
        found = await self.kube.find(NODES, node)
        return found is not None and being_drained(found, pod.get("spec") or {})

    def event(self, pod: Object, reason: str, message: str, event_type: str = "Normal") -> None:
        """Record an event on the pod without holding the answer up for it."""
        task = asyncio.create_task(self.recorder.record(pod, reason, message, event_type))
        self._events.add(task)
        task.add_done_callback(self._events.discard)


class CreateRefused(Exception):
    """The job's create was refused outright (`refused_outright`): no job was made."""

    def __init__(self, error: KubeError) -> None:
        super().__init__(str(error))
        self.error = error


def refused_outright(error: KubeError) -> bool:
    """Whether the API server refused a create without making anything: a client error
    (bad request, no right, no such resource, an admission policy or a validation rule
    said no), not a conflict, a timeout or throttling, whose retry may fare otherwise."""
    return 400 <= error.status < 500 and error.status not in (408, 409, 429)


def _count(result: metrics.EvictionResult, reason: str) -> None:
    metrics.EVICTION_REVIEWS.labels(result=result, reason=reason).inc()
