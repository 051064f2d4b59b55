"""Serving an aiohttp app: HTTPS when given a certificate, with health and metrics.

The webhook and the extender are both thin aiohttp apps; this is the one place that
decides how they listen, so TLS, readiness and `/metrics` behave the same for both (and
for the controller's health port).
"""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

Readiness = Callable[[], bool]


def tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


def add_health(app: web.Application, ready: Readiness) -> None:
    """`/healthz` answers while the process serves; `/readyz` once `ready()` says so."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="not ready: caches not synced or no leader known")

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def add_metrics(app: web.Application) -> None:
    """`/metrics`: the process's metrics (`berth.metrics`) in the Prometheus text format,
    or OpenMetrics when the scraper asks for it."""
    app.router.add_get("/metrics", make_aiohttp_handler())


def cancel_on_signals() -> None:
    """SIGTERM or SIGINT cancel the running main task, so `finally` blocks run and requests
    in flight are answered before the process exits (a pod's graceful stop)."""
    main = asyncio.current_task()
    assert main is not None, "call from the main task"
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, main.cancel)


async def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    cert_file: Path | None = None,
    key_file: Path | None = None,
) -> None:
    """Serve until cancelled."""
    context = tls_context(cert_file, key_file) if cert_file and key_file else None
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=context).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
