"""The webhook process: a Reservation cache, the claim, and the HTTPS endpoint.

`webhook.decide` says what to do with a pod; this module does the I/O around it. Replicas
share nothing but the API server, so the claim is the one step that must be atomic: a
merge patch of the Reservation carrying the resourceVersion of the copy the decision was
made on. If another replica (or another pod) got there first, the API server answers 409
and this replica moves on. Every failure lets the pod through unpatched: the pod is then
scheduled as if there were no Reservation, which is what `failurePolicy: Ignore` promises,
instead of a pod creation that fails because a migration is in progress.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from berth import metrics
from berth.api import ReservationPhase, keys
from berth.kube.client import REPLICASETS, RESERVATIONS, Kube, KubeError
from berth.kube.informer import Informer
from berth.protocol import (
    Object,
    claim_of,
    controller_of,
    is_consumable,
    matches_owner,
    node_of,
    owner_uids,
    phase,
    top_level_workload,
)
from berth.server import MAX_BODY, Limits, Tls, add_health, add_metrics, cancel_on_signals, serve
from webhook import review
from webhook.decide import (
    Claim,
    Patch,
    Reassert,
    Skip,
    bind_patch,
    decide,
    pod_of,
)

log = logging.getLogger(__name__)

API_ERRORS = (KubeError, aiohttp.ClientError, TimeoutError)
"""What a call to the API server may raise: an answer other than 2xx, or no answer."""


class Webhook:
    """Binds replacement pods to Reservations. Run `reservations.run()` as a task."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.reservations = Informer(kube, RESERVATIONS)

    def ready(self) -> bool:
        return self.reservations.synced.is_set()

    async def mutate(self, request: web.Request) -> web.Response:
        with metrics.WEBHOOK_REQUEST_DURATION.time():
            result, response = await self.answer(request)
        metrics.WEBHOOK_REQUESTS.labels(result=result).inc()
        return response

    async def answer(self, request: web.Request) -> tuple[metrics.WebhookResult, web.Response]:
        """The response to one admission review, and what became of the pod."""
        try:
            admission = review.parse(await request.read())
        except review.MalformedReview as error:
            log.warning("refused an admission review: %s", error)
            return "malformed", web.Response(status=400, text=str(error))
        try:
            result, patch = await self.patch_for(admission)
        except API_ERRORS as error:
            log.warning(
                "pod %s: left unbound, the API server failed: %s",
                describe(pod_of(admission)),
                error,
            )
            result, patch = "error", []
        return result, web.Response(
            body=orjson.dumps(review.response(admission["uid"], patch)),
            content_type="application/json",
        )

    async def patch_for(self, request: Mapping[str, Any]) -> tuple[metrics.WebhookResult, Patch]:
        """What became of the pod (for `berth_webhook_requests_total`) and its patch."""
        pod = pod_of(request)
        reservations = self.reservations.store
        # Resolving a ReplicaSet's workload costs a GET: only worth it while some
        # Reservation can be claimed at all, which is rare.
        in_flight = any(is_consumable(r) or _opening(r) for r in reservations.values())
        workload_uid = await self.workload_uid(pod) if in_flight else None
        decision = decide(request, reservations=reservations, workload_uid=workload_uid)
        if isinstance(decision, Skip) and in_flight:
            # The controller opens a Reservation just before evicting; the replacement
            # may come before this cache has seen that. Ask the API server for the ones
            # about to open that this pod would match.
            opened = await self.refresh_opening(pod, reservations, workload_uid=workload_uid)
            if opened:
                decision = decide(
                    request, reservations={**reservations, **opened}, workload_uid=workload_uid
                )
        if isinstance(decision, Skip):
            log.log(
                logging.INFO if in_flight else logging.DEBUG,
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
        return await self.claim(pod, decision)

    async def refresh_opening(
        self, pod: Object, reservations: Mapping[str, Object], *, workload_uid: str | None
    ) -> dict[str, Object]:
        """Fresh copies of the matching Reservations that this cache shows as not yet
        open, keeping those the API server says are open now."""
        opened: dict[str, Object] = {}
        for name, cached in reservations.items():
            if not _opening(cached) or not matches_owner(cached, pod, workload_uid=workload_uid):
                continue
            try:
                fresh = await self.kube.get(RESERVATIONS, name)
            except KubeError as error:
                log.warning("could not re-read reservation %s: %s", name, error)
                continue
            if is_consumable(fresh):
                opened[name] = fresh
        return opened

    async def workload_uid(self, pod: Object) -> str | None:
        controller = controller_of(pod)
        if controller is None:
            return None
        if controller.get("kind") != "ReplicaSet" or controller.get("apiVersion") != "apps/v1":
            return str(controller["uid"])
        try:
            replicaset: Object | None = await self.kube.get(
                REPLICASETS, controller["name"], pod["metadata"]["namespace"]
            )
        except KubeError as error:
            if not error.not_found:
                raise
            replicaset = None
        return top_level_workload(controller, replicaset)

    async def claim(self, pod: Object, decision: Claim) -> tuple[metrics.WebhookResult, Patch]:
        """Claim the first candidate no one else wins; the patch that binds the pod to it,
        or none when every candidate went to other pods."""
        token = secrets.token_hex(16)
        for candidate in decision.candidates:
            reservation = await self.claim_one(candidate, token=token)
            if reservation is not None:
                log.info(
                    "pod %s → claimed reservation %s on node %s",
                    describe(pod),
                    reservation["metadata"]["name"],
                    node_of(reservation),
                )
                return "claimed", bind_patch(pod, reservation=reservation, token=token)
        log.info(
            "pod %s: lost every matching reservation to other pods (%s)",
            describe(pod),
            ", ".join(c["metadata"]["name"] for c in decision.candidates),
        )
        return "lost", []

    async def claim_one(self, reservation: Object, *, token: str) -> Object | None:
        """`reservation` as claimed with `token`, or None when it is no longer to be had.

        A conflict means the Reservation changed since the cached copy: re-read it, and if
        it is still consumable (a status update, say, not another claim) try once more.
        """
        name = reservation["metadata"]["name"]
        for retry in (False, True):
            try:
                if retry:
                    reservation = await self.kube.get(RESERVATIONS, name)
                    if not is_consumable(reservation):
                        return None
                return await self.kube.patch(
                    RESERVATIONS,
                    name,
                    {
                        "metadata": {
                            "resourceVersion": reservation["metadata"]["resourceVersion"],
                            "annotations": {keys.CLAIM: token},
                        }
                    },
                )
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


def _opening(reservation: Object) -> bool:
    """Live and untouched, but not (yet, in this cache) open to a replacement: this cache
    may lag behind the Reservation becoming Available and being opened."""
    return (
        phase(reservation) in (ReservationPhase.PENDING, ReservationPhase.AVAILABLE)
        and not is_consumable(reservation)
        and claim_of(reservation) is None
        and not owner_uids(reservation)
    )


def describe(pod: Object) -> str:
    """`namespace/name`, or `namespace/generateName…` for a pod not yet named."""
    metadata = pod["metadata"]
    name = metadata.get("name") or f"{metadata.get('generateName', '')}…"
    return f"{metadata.get('namespace')}/{name}"


def make_app(webhook: Webhook) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/mutate-pod", webhook.mutate)
    add_health(app, webhook.ready)
    add_metrics(app)
    return app


def run(*, kubeconfig: Path | None, host: str, port: int, tls: Tls, limits: Limits) -> None:
    """Serve until SIGTERM or SIGINT; requests in flight are answered before exiting."""
    asyncio.run(_serve(kubeconfig=kubeconfig, host=host, port=port, tls=tls, limits=limits))


async def _serve(
    *, kubeconfig: Path | None, host: str, port: int, tls: Tls, limits: Limits
) -> None:
    cancel_on_signals()
    kube = await Kube.connect(kubeconfig)
    webhook = Webhook(kube)
    informer = asyncio.create_task(webhook.reservations.run())
    log.info(
        "starting: POST https://%s:%d/mutate-pod (client certificates %s)",
        host,
        port,
        "required" if tls.client_ca_file else "not required",
    )
    try:
        await serve(make_app(webhook), host=host, port=port, tls=tls, limits=limits)
    except asyncio.CancelledError:
        log.info("stopped")
    finally:
        informer.cancel()
        await kube.close()
