"""The webhook process: a Reservation cache, the claim, and the HTTPS endpoint.

`webhook.decide` says what to do with a pod; this module does the I/O around it. Replicas
share nothing but the API server, so the claim is the one step that must be atomic: a
merge patch of the Reservation carrying the resourceVersion of the copy the decision was
made on. If another replica (or another pod) got there first, the API server answers 409
and this replica moves on. Every failure lets the pod through unpatched: the pod is then
scheduled as if there were no Reservation, which is what `failurePolicy: Ignore` promises,
instead of a pod creation that fails because a migration is in progress.

A claim must never outlive an answer that does not bind a pod to it: the Reservation
would wait, claimed by no pod, until its job's TTL. So the API server's own timeout
(`timeoutSeconds`, after which it creates the pod as if the webhook had not answered) is
matched by a shorter deadline around each review's work, API calls included; the pod's
patch is built before the claim is written, so nothing is left to fail between the claim
and the answer; and when the work fails or the answer cannot be delivered after a claim
was (or may have been) written, the claim is taken back before answering.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import aiohttp

from berth import metrics, web
from berth.api import ReservationPhase, keys
from berth.kube.client import PODS, RESERVATIONS, Kube, KubeError
from berth.kube.informer import Informer
from berth.protocol import (
    Object,
    claim_of,
    claimed_at,
    controller_of,
    created_by_controller,
    fingerprint,
    has_expired,
    is_consumable,
    is_replicaset,
    matches_owner,
    node_of,
    phase,
    placeholder_namespace,
    pod_claim,
    top_level_workload,
)
from berth.server import Limits, Tls, add_health, add_metrics, cancel_on_signals, serve
from webhook import review
from webhook.decide import (
    Claim,
    Patch,
    Reassert,
    Skip,
    TakeOver,
    bind_patch,
    contested,
    creator_of,
    decide,
    opening,
    pod_of,
    worth_a_fresh_look,
)
from webhook.intercept import Interception, Interceptor
from webhook.owners import Owners

log = logging.getLogger(__name__)

API_ERRORS = (KubeError, aiohttp.ClientError, TimeoutError)
"""What a call to the API server may raise: an answer other than 2xx, or no answer (the
deadline passed)."""

LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
"""What a label's value may be: a claim that is not one (written by hand on the
Reservation) cannot be looked for, and is not taken over."""

TAKE_OVER_AFTER = 1.0
"""Seconds since this replica first knew of a claim (wrote it, or its cache showed it)
before a pod may take it over when no pod carries it: the claim is written while its
pod is being admitted, and two pods of one workload admitted together must not take the
place from each other; a pod refused after its claim (a quota, a policy) leaves its
admission within moments, and the workload's next pod comes later."""

DEADLINE = 2.0
"""Seconds a review's work may take: below the 3 s `timeoutSeconds` of
manifests/webhook/mutating-webhook.yaml, with room for the answer to travel."""


@dataclass
class Attempt:
    """What one review may write: a claim with `token`, on `reservation` once a claim
    has been sent there."""

    reservation: str | None = None

    @cached_property
    def token(self) -> str:
        """Drawn when first needed: most reviews claim nothing."""
        return secrets.token_hex(16)


class Webhook:
    """Binds replacement pods to Reservations. Run `reservations.run()` as a task."""

    def __init__(self, kube: Kube, *, deadline: float = DEADLINE) -> None:
        self.kube = kube
        self.deadline = deadline
        self.reservations = Informer(
            kube, RESERVATIONS, indexes={LIVE: live_namespace}, handler=self._on_reservation
        )
        self.owners = Owners(kube)
        self.claims: dict[str, tuple[str, float]] = {}
        """Reservation name → its claim token, and when (monotonic) this replica first
        knew of it: wrote it, or saw it in its cache."""

    def _on_reservation(self, kind: str, reservation: Object) -> None:
        name = reservation["metadata"]["name"]
        token = claim_of(reservation) if kind != "DELETED" else None
        if token is None:
            self.claims.pop(name, None)
        elif self.claims.get(name, ("", 0.0))[0] != token:
            self.claims[name] = (token, time.monotonic())

    def claim_age(self, reservation: Object) -> float:
        """Seconds since this replica first knew of the Reservation's claim (0: none)."""
        token = claim_of(reservation)
        known = self.claims.get(reservation["metadata"]["name"])
        if token is None or known is None or known[0] != token:
            return 0.0
        return time.monotonic() - known[1]

    def ready(self) -> bool:
        return self.reservations.synced.is_set()

    def mutate(self, request: web.Request) -> web.Response | Awaitable[web.Response]:
        """The answer to one admission review: at once when there is nothing to claim
        (almost every pod), else once the claim is decided (API calls)."""
        started = time.perf_counter()
        try:
            admission = review.parse(request.body)
        except review.MalformedReview as error:
            log.warning("refused an admission review: %s", error)
            return _counted(started, "malformed", web.text(str(error), status=400))
        pod = pod_of(admission)
        reservations = self.live(pod["metadata"].get("namespace") or "")
        if not reservations:
            # Nothing to claim, and no API call to make.
            if log.isEnabledFor(logging.DEBUG):
                log.debug("pod %s: no live reservation in its namespace", describe(pod))
            return _counted(started, "skipped", _allowed(admission["uid"], []))
        return self.mutate_later(started, request, admission, reservations)

    async def mutate_later(
        self,
        started: float,
        request: web.Request,
        admission: dict[str, Any],
        reservations: dict[str, Object],
    ) -> web.Response:
        result, response = await self.answer(request, admission, reservations)
        return _counted(started, result, response)

    async def answer(
        self, request: web.Request, admission: dict[str, Any], reservations: dict[str, Object]
    ) -> tuple[metrics.WebhookResult, web.Response]:
        """The response to one admission review, and what became of the pod."""
        pod = pod_of(admission)
        attempt = Attempt()
        try:
            async with asyncio.timeout(self.deadline):
                result, patch = await self.patch_for(admission, reservations, attempt)
        except BaseException as error:
            # Whatever failed, a claim this review sent may stand: take it back.
            await self.release(attempt, pod)
            if not isinstance(error, API_ERRORS):
                raise
            log.warning("pod %s: left unbound, %s", describe(pod), self.failure(error))
            return "error", _allowed(admission["uid"], [])
        response = _allowed(admission["uid"], patch)
        if result in ("claimed", "taken_over"):
            try:
                # Sent now rather than on return, to know whether it went out.
                await request.deliver(response)
            except ConnectionError as error:
                log.warning(
                    "pod %s: the answer could not be delivered (%s); the caller is gone",
                    describe(pod),
                    error,
                )
                await self.release(attempt, pod)
                return "error", response
        return result, response

    def failure(self, error: BaseException) -> str:
        if isinstance(error, TimeoutError):
            return f"no answer from the API server within the {self.deadline:g}s deadline"
        return f"the API server failed: {error}"

    async def patch_for(
        self, request: Mapping[str, Any], reservations: dict[str, Object], attempt: Attempt
    ) -> tuple[metrics.WebhookResult, Patch]:
        """What became of the pod (for `berth_webhook_requests_total`) and its patch, given
        the live Reservations of its namespace (`live`)."""
        pod = pod_of(request)
        # Confirming the pod's controller costs a GET (or two): only worth it while some
        # Reservation of its namespace can be claimed at all, which is rare.
        # A Reservation whose claim no pod may carry is one, for a pod that carries none.
        unclaimed = pod_claim(pod) is None
        in_flight = any(
            is_consumable(r) or opening(r) or (unclaimed and contested(r))
            for r in reservations.values()
        )
        # A pod its controller did not create is refused without asking anything.
        looked_up = in_flight and created_by_controller(controller_of(pod), creator_of(request))
        workload_uid = await self.workload_uid(pod) if looked_up else None
        decision = decide(request, reservations=reservations, workload_uid=workload_uid)
        if isinstance(decision, Skip) and decision.unconfirmed and not looked_up:
            # A pod reinvoked with its claim, matching its Reservation only through the
            # Deployment above its ReplicaSet (a rollout's): that ReplicaSet, confirmed
            # when it claimed, is remembered (`webhook.owners`).
            looked_up = created_by_controller(controller_of(pod), creator_of(request))
            workload_uid = await self.workload_uid(pod) if looked_up else None
            decision = decide(request, reservations=reservations, workload_uid=workload_uid)
        if isinstance(decision, Skip) and decision.recheck is not None:
            reread = await self.reread(decision.recheck)
            if reread is not None:
                decision = decide(
                    request,
                    reservations={**reservations, decision.recheck: reread},
                    workload_uid=workload_uid,
                )
        stale = worth_a_fresh_look(decision, pod, reservations, looked_up, workload_uid)
        if stale:
            opened = await self.refresh(stale)
            if opened:
                decision = decide(
                    request, reservations={**reservations, **opened}, workload_uid=workload_uid
                )
        if isinstance(decision, Skip) and unclaimed:
            take_over = self.contest(request, reservations, workload_uid)
            if take_over is not None:
                return await self.take_over(pod, take_over, attempt)
        if isinstance(decision, Skip):
            # Why a pod was not bound is worth an INFO line only for a pod that some
            # Reservation about to take a replacement here was made for; the namespace's
            # other pods are said at DEBUG.
            concerned = in_flight and any(
                matches_owner(r, pod, workload_uid=workload_uid) for r in reservations.values()
            )
            log.log(
                logging.INFO if concerned else logging.DEBUG,
                "pod %s: %s",
                describe(pod),
                decision.reason,
            )
            return "skipped", []
        if isinstance(decision, Reassert):
            patch = bind_patch(pod, reservation=decision.reservation, token=decision.token)
            log.info(
                "pod %s: already claimed reservation %s; %s",
                describe(pod),
                decision.reservation["metadata"]["name"],
                "re-adding what a later webhook removed" if patch else "nothing to add",
            )
            return "reasserted", patch
        assert isinstance(decision, Claim)
        return await self.claim(pod, decision, attempt)

    def contest(
        self, request: Mapping[str, Any], reservations: dict[str, Object], workload_uid: str | None
    ) -> TakeOver | None:
        """For a pod skipped even on a fresh look: the Reservations whose claim no pod
        may carry that it could take over, those this replica has known claimed for
        `TAKE_OVER_AFTER` (its pod's admission is over by then)."""
        old_enough = {
            name: r for name, r in reservations.items() if self.claim_age(r) >= TAKE_OVER_AFTER
        }
        if not old_enough:
            return None
        decision = decide(request, reservations=old_enough, workload_uid=workload_uid, contest=True)
        return decision if isinstance(decision, TakeOver) else None

    def live(self, namespace: str) -> dict[str, Object]:
        """The Reservations by name that a pod of `namespace` could take, in this cache:
        those not yet ended whose replacement is made there. Terminal ones, and those of
        other namespaces, are never read per review. Nor one whose time is up
        (`protocol.has_expired`): the controller ends it, and while no controller leads
        (it is down, or being replaced), a pod bound to it would stay gated."""
        found = self.reservations.by_index(LIVE, namespace)
        if not found:  # almost every review
            return {}
        now = datetime.now(UTC)
        return {r["metadata"]["name"]: r for r in found if not has_expired(r, now)}

    async def refresh(self, names: list[str]) -> dict[str, Object]:
        """Fresh copies of the Reservations `names`, keeping those the API server says are
        open now. Read all at once: the review's deadline covers them together."""
        found = await asyncio.gather(
            *(self.kube.get(RESERVATIONS, name) for name in names), return_exceptions=True
        )
        opened: dict[str, Object] = {}
        for name, fresh in zip(names, found, strict=True):
            if isinstance(fresh, KubeError):
                log.warning("could not re-read reservation %s: %s", name, fresh)
            elif isinstance(fresh, BaseException):
                raise fresh
            elif is_consumable(fresh):
                opened[name] = fresh
        return opened

    async def reread(self, name: str) -> Object | None:
        """The Reservation `name` as the API server has it now (None: not found, or not
        read)."""
        try:
            return await self.kube.get(RESERVATIONS, name)
        except KubeError as error:
            log.warning("could not re-read reservation %s: %s", name, error)
            return None

    async def workload_uid(self, pod: Object) -> str | None:
        """The top-level workload of a pod whose controller is a ReplicaSet the API server
        confirms (`webhook.owners`); None otherwise: a pod of another controller (which
        created it, `decide` checks) matches a Reservation by that controller's kind, name
        and UID alone."""
        controller = controller_of(pod)
        if controller is None or not is_replicaset(controller):
            return None
        owner = await self.owners.confirmed(controller, pod["metadata"].get("namespace") or "")
        return top_level_workload(controller, owner) if owner is not None else None

    async def claim(
        self, pod: Object, decision: Claim, attempt: Attempt
    ) -> tuple[metrics.WebhookResult, Patch]:
        """Claim the first candidate no one else wins; the patch that binds the pod to it,
        or none when every candidate went to other pods."""
        for candidate in decision.candidates:
            patch = await self.claim_one(pod, candidate, attempt)
            if patch is not None:
                log.info(
                    "pod %s → claimed reservation %s on node %s (claim %s)",
                    describe(pod),
                    candidate["metadata"]["name"],
                    node_of(candidate),
                    fingerprint(attempt.token),
                )
                return "claimed", patch
        log.info(
            "pod %s: lost every matching reservation to other pods (%s)",
            describe(pod),
            ", ".join(c["metadata"]["name"] for c in decision.candidates),
        )
        return "lost", []

    async def take_over(
        self, pod: Object, decision: TakeOver, attempt: Attempt
    ) -> tuple[metrics.WebhookResult, Patch]:
        """Claim anew the first candidate whose claim no pod carries, as the API server
        has the pods now (a pod that carries it is found by the label of its claim); the
        claim is conditional on the copy that showed the old claim, so a Reservation that
        moved on meanwhile (its owner recorded, released, claimed again) is left alone."""
        namespace = pod["metadata"].get("namespace") or ""
        for candidate in decision.candidates:
            old = claim_of(candidate) or ""
            if not LABEL_VALUE.fullmatch(old) or await self.carried(old, namespace):
                continue
            patch = await self.claim_one(pod, candidate, attempt, replacing=old)
            if patch is not None:
                since = claimed_at(candidate)
                now = datetime.now(UTC)
                log.info(
                    "pod %s → claimed reservation %s on node %s (claim %s), taken over from "
                    "claim %s, which no pod carries %ss after it was written (its pod was not "
                    "stored: refused after the claim, by a quota, a policy or a webhook)",
                    describe(pod),
                    candidate["metadata"]["name"],
                    node_of(candidate),
                    fingerprint(attempt.token),
                    fingerprint(old),
                    f"{(now - since).total_seconds():.0f}" if since else "?",
                )
                return "taken_over", patch
        log.info(
            "pod %s: not bound; reservation %s: claimed by a pod that exists, or changed since",
            describe(pod),
            ", ".join(c["metadata"]["name"] for c in decision.candidates),
        )
        return "lost", []

    async def carried(self, token: str, namespace: str) -> bool:
        """Whether a pod of `namespace` carries the claim `token`, as the API server has
        the pods now: a consistent read (served from its watch cache once that has caught
        up with etcd, ConsistentListFromCache, GA since v1.34), not "any version", which
        an API server's cache may answer however far behind it is."""
        found = await self.kube.list(
            PODS, namespace=namespace, label_selector=f"{keys.CLAIM}={token}"
        )
        return any(pod_claim(pod) == token for pod in found.get("items") or [])

    async def claim_one(
        self, pod: Object, reservation: Object, attempt: Attempt, *, replacing: str | None = None
    ) -> Patch | None:
        """The patch that binds `pod` to `reservation`, now claimed with the attempt's
        token; None when it is no longer to be had.

        The patch is built from the copy the claim is conditional on (its resourceVersion),
        before the claim is written. A conflict means the Reservation changed since that
        copy: re-read it, and if it is still consumable (a status update, say, not another
        claim) try once more.
        """
        name = reservation["metadata"]["name"]
        for retry in (False, True):
            try:
                if retry:
                    reservation = await self.kube.get(RESERVATIONS, name)
                    # Open to a claim now (released meanwhile), or still holding the
                    # claim no pod carried (another change): once more.
                    still = replacing is not None and claim_of(reservation) == replacing
                    if not (is_consumable(reservation) or (still and contested(reservation))):
                        return None
                patch = bind_patch(pod, reservation=reservation, token=attempt.token)
                attempt.reservation = name
                await self.kube.patch(
                    RESERVATIONS,
                    name,
                    {
                        "metadata": {
                            "resourceVersion": reservation["metadata"]["resourceVersion"],
                            "annotations": {keys.CLAIM: attempt.token},
                        }
                    },
                )
                self.claims[name] = (attempt.token, time.monotonic())
                return patch
            except KubeError as error:
                if error.not_found:
                    return None
                if not error.conflict:
                    raise
                log.info(
                    "reservation %s changed while claiming it; %s",
                    name,
                    "giving up on it" if retry else "re-reading it",
                )
        return None

    async def release(self, attempt: Attempt, pod: Object) -> None:
        """Take back the claim `attempt` may have written, which no pod will carry. Only
        while the Reservation still holds this token, and conditional on the
        resourceVersion read, so that a claim made since by another pod stays. The release
        has a deadline of its own, as long as a review's."""
        name = attempt.reservation
        if name is None:
            return
        try:
            async with asyncio.timeout(self.deadline):
                released = await self._release(name, attempt.token)
        except API_ERRORS as error:
            log.error(
                "pod %s: could not release claim %s on reservation %s, which no pod carries: %s",
                describe(pod),
                fingerprint(attempt.token),
                name,
                self.failure(error),
            )
            return
        if released:
            log.info(
                "pod %s: released claim %s on reservation %s",
                describe(pod),
                fingerprint(attempt.token),
                name,
            )

    async def _release(self, name: str, token: str) -> bool:
        """Whether the claim `token` was removed from `name` (False: it was not there)."""
        while True:
            try:
                current = await self.kube.get(RESERVATIONS, name)
                if claim_of(current) != token:
                    return False
                await self.kube.patch(
                    RESERVATIONS,
                    name,
                    {
                        "metadata": {
                            "resourceVersion": current["metadata"]["resourceVersion"],
                            "annotations": {keys.CLAIM: None},
                        }
                    },
                )
                return True
            except KubeError as error:
                if error.not_found:
                    return False
                if not error.conflict:
                    raise


LIVE = "live-namespace"
"""The Reservations index of those not ended, by the namespace of the pods they are for."""


def live_namespace(reservation: Object) -> list[str]:
    """The `LIVE` index: where a Pending or Available Reservation's replacement is made."""
    if phase(reservation) not in (ReservationPhase.PENDING, ReservationPhase.AVAILABLE):
        return []
    return [placeholder_namespace(reservation)]


def describe(pod: Object) -> str:
    """`namespace/name`, or `namespace/generateName…` for a pod not yet named."""
    metadata = pod["metadata"]
    name = metadata.get("name") or f"{metadata.get('generateName', '')}…"
    return f"{metadata.get('namespace')}/{name}"


def _counted(started: float, result: metrics.WebhookResult, response: web.Response) -> web.Response:
    """`response`, counted and timed (`berth_webhook_requests_total`, its histogram)."""
    metrics.WEBHOOK_REQUEST_DURATION.observe(time.perf_counter() - started)
    metrics.WEBHOOK_REQUESTS.labels(result=result).inc()
    return response


def _allowed(uid: str, patch: Patch) -> web.Response:
    return web.json(review.response(uid, patch))


EVICTION_PATH = "/validate-eviction"
"""Evictions in namespaces labelled `berth.sh/intercept-evictions: "true"`."""
UNLABELLED_EVICTION_PATH = "/validate-eviction/unlabelled"
"""Evictions in the other namespaces (intercepted only with `allNamespaces`)."""


def make_app(webhook: Webhook, interceptor: Interceptor | None = None) -> web.App:
    app = web.App()
    app.post("/mutate-pod", webhook.mutate)
    if interceptor is not None:
        app.post(EVICTION_PATH, interceptor.labelled)
        app.post(UNLABELLED_EVICTION_PATH, interceptor.unlabelled)
    add_health(app, webhook.ready)
    add_metrics(app)
    return app


def run(
    *,
    kubeconfig: Path | None,
    host: str,
    port: int,
    tls: Tls,
    limits: Limits,
    deadline: float,
    interception: Interception,
) -> None:
    """Serve until SIGTERM or SIGINT; requests in flight are answered before exiting."""
    asyncio.run(
        _serve(
            kubeconfig=kubeconfig,
            host=host,
            port=port,
            tls=tls,
            limits=limits,
            deadline=deadline,
            interception=interception,
        )
    )


async def _serve(
    *,
    kubeconfig: Path | None,
    host: str,
    port: int,
    tls: Tls,
    limits: Limits,
    deadline: float,
    interception: Interception,
) -> None:
    cancel_on_signals()
    kube = await Kube.connect(kubeconfig)
    webhook = Webhook(kube, deadline=deadline)
    interceptor = Interceptor(
        kube,
        interception=interception,
        reservations=webhook.reservations.store,
        deadline=deadline,
    )
    informer = asyncio.create_task(webhook.reservations.run())
    log.info(
        "starting: POST https://%s:%d/mutate-pod and %s (client certificates %s)",
        host,
        port,
        EVICTION_PATH,
        "required" if tls.client_ca_file else "not required",
    )
    if tls.client_ca_file is None:
        log.warning(
            "no --client-ca-file: whoever reaches port %d can post reviews, naming any user "
            "and pod; an eviction review makes this webhook create that pod's "
            "PodMigrationJob where its rights allow. Require the API server's admission "
            "client certificate (--client-ca-file), or open the port to the API server "
            "only (README, 'What Berth trusts')",
            port,
        )
    try:
        app = make_app(webhook, interceptor)
        await serve(app, host=host, port=port, tls=tls, limits=limits)
    except asyncio.CancelledError:
        log.info("stopped")
    finally:
        informer.cancel()
        await kube.close()
