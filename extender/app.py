"""The extender process: three informers feeding the ledger, and the HTTP endpoints.

`extender.decide` answers every request from the ledger; this module only keeps the
ledger up to date and moves bytes. Replicas are stateless and share nothing: each one
watches nodes, pods and Reservations itself, and reports ready once all three caches
have synced, so kube-scheduler never gets an answer from a half-filled ledger.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from berth import metrics, web
from berth.kube.client import NODES, PODS, RESERVATIONS, Kube
from berth.kube.informer import Informer, identity_only
from berth.ledger import Ledger
from berth.server import Limits, Readiness, Tls, add_health, add_metrics, cancel_on_signals, serve
from extender.decide import VERBS, Placement, answer

log = logging.getLogger(__name__)

POD_GATHER = 0.05
"""Seconds the events of a burst of pod changes may wait, to be taken in one read (the
pods' watch, `Kube.watch`): taken one by one, they cost the extender several times the
CPU it spends answering kube-scheduler, on the cores kube-scheduler needs (bench/
PROFILE.md). The ledger may see a pod bound moments ago up to this much later; where
that pod and a handover's replacement would not both fit, the replacement's nomination
keeps the place (`controller.reservations`, the scheduler counts nominated pods)."""


def make_app(ledger: Ledger, *, placement: Placement, ready: Readiness) -> web.App:
    def verb(name: str) -> web.Handler:
        def handle(request: web.Request) -> web.Response:
            synced = ready()
            with metrics.EXTENDER_REQUEST_DURATION.labels(verb=name).time():
                status, result = answer(
                    ledger, name, request.body, placement=placement, ready=synced
                )
            outcome = _outcome(status, result, ready=synced)
            metrics.EXTENDER_REQUESTS.labels(verb=name, result=outcome).inc()
            return web.json(result, status=status)

        return handle

    # kube-scheduler sends the whole pod: a pod refused for its size would be scheduled
    # without the extender (it is ignorable), past the capacity a handover holds
    # (`berth.web.MAX_BODY` is well above any pod).
    app = web.App()
    for name in VERBS:
        app.post(f"/{name}", verb(name))
    add_health(app, ready)
    add_metrics(app)
    return app


def _scheme(tls: Tls | None) -> str:
    if tls is None:
        return "plain HTTP, as --insecure asks"
    return "HTTPS, client certificates " + ("required" if tls.client_ca_file else "not required")


def _outcome(status: int, result: Any, *, ready: bool) -> metrics.ExtenderResult:
    """How `answer` judged a request: a refusal is an HTTP error, or for filter (whose
    result has a field for it) an `Error` message."""
    if not ready:
        return "not_ready"
    if status != 200 or (isinstance(result, dict) and result.get("Error")):
        return "bad_request"
    return "ok"


def run(
    *,
    kubeconfig: Path | None,
    host: str,
    port: int,
    tls: Tls | None,
    limits: Limits,
    placement: Placement,
) -> None:
    """Serve until SIGTERM or SIGINT; requests in flight are answered before exiting.
    Plain HTTP without `tls`: the caller has checked that this was asked for."""
    asyncio.run(
        _serve(
            kubeconfig=kubeconfig,
            host=host,
            port=port,
            tls=tls,
            limits=limits,
            placement=placement,
        )
    )


async def _serve(
    *,
    kubeconfig: Path | None,
    host: str,
    port: int,
    tls: Tls | None,
    limits: Limits,
    placement: Placement,
) -> None:
    cancel_on_signals()
    kube = await Kube.connect(kubeconfig)
    ledger = Ledger()
    # The ledger keeps what it needs of nodes and pods; the caches only who they are.
    pods = Informer(kube, PODS, handler=ledger.on_pod, keep=identity_only)
    # Pods change in bursts (a scheduler binding hundreds a second, then the kubelets
    # starting them), taken a burst at a time.
    pods.gather = POD_GATHER
    informers = [
        Informer(kube, NODES, handler=ledger.on_node, keep=identity_only),
        pods,
        Informer(kube, RESERVATIONS, handler=ledger.on_reservation),
    ]
    tasks = [asyncio.create_task(informer.run()) for informer in informers]
    app = make_app(
        ledger,
        placement=placement,
        ready=lambda: all(informer.synced.is_set() for informer in informers),
    )
    log.info(
        "serving %s on %s:%d (%s, placement %s)",
        ", ".join(f"/{v}" for v in VERBS),
        host,
        port,
        _scheme(tls),
        placement,
    )
    try:
        await serve(app, host=host, port=port, tls=tls, limits=limits)
    except asyncio.CancelledError:
        log.info("stopped")
    finally:
        for task in tasks:
            task.cancel()
        await kube.close()
