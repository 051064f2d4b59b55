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

import orjson
from aiohttp import web

from berth.kube.client import NODES, PODS, RESERVATIONS, Kube
from berth.kube.informer import Informer
from berth.ledger import Ledger
from berth.server import Readiness, add_health, cancel_on_signals, serve
from extender.decide import VERBS, Placement, answer

log = logging.getLogger(__name__)


def make_app(ledger: Ledger, *, placement: Placement, ready: Readiness) -> web.Application:
    async def verb(request: web.Request) -> web.Response:
        status, result = answer(ledger, request.match_info["verb"], await request.read(),
                                placement=placement, ready=ready())
        return web.Response(status=status, body=orjson.dumps(result),
                            content_type="application/json")

    app = web.Application()
    app.router.add_post(f"/{{verb:{'|'.join(VERBS)}}}", verb)
    add_health(app, ready)
    return app


def run(*, kubeconfig: Path | None, host: str, port: int, cert_file: Path | None,
        key_file: Path | None, placement: Placement) -> None:
    """Serve until SIGTERM or SIGINT; requests in flight are answered before exiting."""
    asyncio.run(_serve(kubeconfig=kubeconfig, host=host, port=port, cert_file=cert_file,
                       key_file=key_file, placement=placement))


async def _serve(*, kubeconfig: Path | None, host: str, port: int, cert_file: Path | None,
                 key_file: Path | None, placement: Placement) -> None:
    cancel_on_signals()
    kube = await Kube.connect(kubeconfig)
    ledger = Ledger()
    informers = [Informer(kube, NODES, handler=ledger.on_node),
                 Informer(kube, PODS, handler=ledger.on_pod),
                 Informer(kube, RESERVATIONS, handler=ledger.on_reservation)]
    tasks = [asyncio.create_task(informer.run()) for informer in informers]
    app = make_app(ledger, placement=placement,
                   ready=lambda: all(informer.synced.is_set() for informer in informers))
    log.info("serving %s on %s:%d (%s, placement %s)", ", ".join(f"/{v}" for v in VERBS),
             host, port, "HTTPS" if cert_file else "HTTP", placement)
    try:
        await serve(app, host=host, port=port, cert_file=cert_file, key_file=key_file)
    except asyncio.CancelledError:
        log.info("stopped")
    finally:
        for task in tasks:
            task.cancel()
        await kube.close()
