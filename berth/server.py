"""Serving an aiohttp app: HTTPS, health and metrics, and limits that hold against
clients that are slow, many or anonymous on purpose.

The webhook and the extender are both thin aiohttp apps; this is the one place that
decides how they listen, so TLS, client authentication, limits, readiness and `/metrics`
behave the same for both (and for the controller's health port).

aiohttp closes a connection that stays idle between requests (its keep-alive timer) and
caps a body's size (`client_max_size`). Nothing bounds how long a client may take to send
a request's headers or its body, nor how many connections it holds, and asyncio gives a
TLS handshake 60 s. So every accepted socket gets a `_Connection` first: an asyncio
protocol that stays between the transport and aiohttp's `RequestHandler` for the whole
connection and passes every callback on to it.

- It counts itself among the open connections from accept to close. A socket past
  `max_connections` is aborted at once, before any TLS work.
- It runs the TLS handshake itself (`loop.start_tls`). With `create_server(ssl=...)` the
  app protocol only exists once a handshake succeeds, so connections still in (or stuck
  in, or failing) their handshake could be neither counted nor timed out.
- The header deadline: armed when the connection opens, and again when bytes arrive while
  no request is in progress; disarmed by a middleware when aiohttp hands it a request,
  which it does once the request line and headers are parsed. When it passes, the socket
  is aborted. An idle or half-finished TLS connection, a partial request line or header,
  all end there. The deadline lives on the connection, not in aiohttp's parser, because
  the parser's state is private.
- The same middleware reads a request's body under the body deadline (and aborts the
  connection when it passes), decodes it (gzip or deflate: `decoded`; a body that is not
  what its Content-Encoding says is a 400 naming the problem), requires `application/json` on
  POST (415), and with a client CA requires a verified client certificate on everything
  but the probes. aiohttp's own refusals of requests it cannot parse are logged as one
  warning line, not as the traceback of a crash.

A connection between requests is left to aiohttp's keep-alive timer (the idle timeout).

The serving certificate is renewed in place: cert-manager writes a new one into the
Secret and the kubelet swaps the mounted files (a new directory behind the `..data`
symlink). `ServingCertificate` looks at the files every `RELOAD_INTERVAL` and, when they
changed, builds a new `SSLContext` that every connection accepted afterwards uses;
connections already open keep theirs, so no request in flight is dropped and nothing
restarts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler
from cryptography import x509
from prometheus_client.aiohttp import make_aiohttp_handler

from berth import metrics

log = logging.getLogger(__name__)

Readiness = Callable[[], bool]

MAX_BODY = 8 * 1024 * 1024
"""The largest request body the apps read. etcd stores a pod of up to 1.5 MiB (protobuf);
its JSON is larger, and an AdmissionReview or the scheduler's ExtenderArgs carry it with
more around it (node names, user info). A pod refused for its size would pass the webhook
unbound and skip the (ignorable) extender, so the limit must sit well above any pod."""

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Served without a client certificate: kubelet probes and metrics scrapers present none."""


@dataclass(frozen=True)
class Limits:
    """How long a client may take, and how many connections all clients may hold."""

    header_timeout: float = 10.0
    """From the first byte of a request (or the connection's start, TLS handshake
    included) until its headers are in."""
    body_timeout: float = 10.0
    """From the headers until the whole body is in."""
    idle_timeout: float = 60.0
    """Between requests on a kept-alive connection."""
    max_connections: int = 256


@dataclass(frozen=True)
class Tls:
    """The serving certificate, and the CA that signs the clients' certificates when
    clients must authenticate."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file is not None:
            # Optional at the TLS layer so that probes get in; a certificate that is
            # presented must verify, and the middleware refuses requests without one.
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_OPTIONAL
        return context

    def files(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


# ----- the serving certificate, reloaded when its files change ---------------------------

RELOAD_INTERVAL = 1.0
"""Seconds between two looks at the certificate files (a `stat` of each)."""

Signature = tuple[tuple[int, int, int, int], ...]


def signature(paths: tuple[Path, ...]) -> Signature:
    """What tells one version of the files from the next: device, inode, mtime and size of
    each, symlinks followed (a kubelet swap gives every file a new inode)."""
    stats = [os.stat(path) for path in paths]
    return tuple((s.st_dev, s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)


class ServingCertificate:
    """The `SSLContext` a server hands each new connection, made again from `tls`'s files
    whenever they change. Files that change into something that does not load (a
    certificate without its key, say) leave the previous context in use: a warning says
    so once, and the next change is tried again."""

    def __init__(self, tls: Tls) -> None:
        self.tls = tls
        self.loaded: Signature = signature(tls.files())
        self.refused: Signature | None = None
        # At start, files that do not load are fatal.
        self.context, certificate = self._load()
        self._announce(certificate)

    def reload(self) -> bool:
        """Load the files again if they changed since the last load; True when a new
        context took over."""
        try:
            current = signature(self.tls.files())
        except OSError as error:  # between a delete and its replacement
            log.debug("serving certificate files not readable: %s", error)
            return False
        if current in (self.loaded, self.refused):
            return False
        try:
            context, certificate = self._load()
        except (OSError, ssl.SSLError, ValueError) as error:
            self.refused = current
            log.warning(
                "serving certificate files changed but do not load (%s); "
                "still serving the previous certificate",
                error,
            )
            return False
        self.context, self.loaded, self.refused = context, current, None
        self._announce(certificate)
        return True

    def _load(self) -> tuple[ssl.SSLContext, x509.Certificate]:
        """A context of the files, and the certificate it serves (read first: should the
        files change in between, their signature changed too and they are loaded again)."""
        certificate = x509.load_pem_x509_certificate(self.tls.cert_file.read_bytes())
        return self.tls.context(), certificate

    def _announce(self, cert: x509.Certificate) -> None:
        """The log line and the metrics of a load: which certificate, until when."""
        not_after = cert.not_valid_after_utc
        metrics.SERVING_CERTIFICATE_NOT_AFTER.set(not_after.timestamp())
        metrics.SERVING_CERTIFICATE_LOADED.set(time.time())
        log.info(
            "serving certificate loaded from %s: serial %x, expires %s",
            self.tls.cert_file,
            cert.serial_number,
            not_after.isoformat(),
        )

    async def watch(self, interval: float = RELOAD_INTERVAL) -> None:
        """Reload on change until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.reload()


# ----- flags --------------------------------------------------------------------------------


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


positive_seconds = _positive(float)
"""A flag's type: a finite number of seconds above zero."""


def port(text: str) -> int:
    """A flag's type: a TCP port, 0 (any free one) to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, not {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a server: client authentication and the limits."""
    parser.add_argument(
        "--client-ca-file",
        type=Path,
        default=None,
        help="require a client certificate signed by this CA (PEM) on every request but "
        "/healthz, /readyz and /metrics (default: no client authentication)",
    )
    defaults = Limits()
    for flag, default, text in (
        ("--header-timeout", defaults.header_timeout, "to send a request's headers"),
        ("--body-timeout", defaults.body_timeout, "to send a request's body"),
        ("--idle-timeout", defaults.idle_timeout, "to send a next request on a connection"),
    ):
        parser.add_argument(
            flag,
            type=positive_seconds,
            default=default,
            metavar="SECONDS",
            help=f"time a client gets {text}, else the connection is dropped (default {default:g})",
        )
    parser.add_argument(
        "--max-connections",
        type=_positive(int),
        default=defaults.max_connections,
        help="connections held at once; more are closed at once "
        f"(default {defaults.max_connections})",
    )


def add_tls_arguments(parser: argparse.ArgumentParser, *, plain: str) -> None:
    """The serving certificate, or `--insecure` for plain HTTP; `plain` says what a
    reader of that plain HTTP could learn or forge."""
    parser.add_argument(
        "--tls-cert-file",
        type=Path,
        default=None,
        help="serving certificate (PEM); required unless --insecure",
    )
    parser.add_argument(
        "--tls-private-key-file", type=Path, default=None, help="its private key (PEM)"
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help=f"serve plain HTTP, without a certificate: {plain}",
    )


def serving_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with how a server is asked to serve, if anything: HTTPS, or plain
    HTTP only when asked for by name."""
    certificate = (args.tls_cert_file, args.tls_private_key_file)
    client_ca = getattr(args, "client_ca_file", None)
    if args.insecure:
        if any(certificate) or client_ca:
            return "--insecure serves plain HTTP: give it no certificate and no client CA"
        return None
    if None in certificate:
        return "give --tls-cert-file and --tls-private-key-file, or --insecure to serve plain HTTP"
    for path in (*certificate, client_ca):
        if path is not None and not path.is_file():
            return f"{path}: no such file"
    return None


def tls_from(args: argparse.Namespace) -> Tls | None:
    """The TLS settings of flags that `serving_problem` accepted (None: --insecure)."""
    if args.insecure:
        return None
    return Tls(args.tls_cert_file, args.tls_private_key_file, getattr(args, "client_ca_file", None))


def limits_from(args: argparse.Namespace) -> Limits:
    return Limits(
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        idle_timeout=args.idle_timeout,
        max_connections=int(args.max_connections),
    )


# ----- the app's common routes --------------------------------------------------------------


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


# ----- connections ------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One accepted socket, from accept to close: counted, TLS, the header deadline, and
    aiohttp's handler behind it (see the module docstring)."""

    def __init__(self, site: _Site) -> None:
        self.site = site
        self.loop = asyncio.get_running_loop()
        self.raw: asyncio.Transport | None = None
        self.handler: RequestHandler | None = None
        self.early = bytearray()
        """Bytes that came between the TLS handshake and the handler taking over."""
        self.deadline: asyncio.TimerHandle | None = None
        self.in_request = False

    # -- asyncio callbacks, passed on to aiohttp's handler once it has the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.raw = transport
        if not self.site.admit(self):
            transport.abort()
            return
        self.arm()
        context = self.site.context
        if context is None:
            self.hand_over(transport)
            return
        # No byte reaches this protocol before start_tls takes the transport over.
        transport.pause_reading()
        task = self.loop.create_task(self.start_tls(transport, context))
        self.site.handshakes.add(task)
        task.add_done_callback(self.site.handshakes.discard)

    def data_received(self, data: bytes) -> None:
        if self.handler is None:
            self.early += data
            return
        if not self.in_request and self.deadline is None:
            self.arm()  # the first bytes of a next request
        self.handler.data_received(data)

    def eof_received(self) -> None:
        # Returning None lets the transport close once the peer is done sending, as
        # aiohttp's handler would have it.
        if self.handler is not None:
            self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.forget()
        if self.handler is not None:
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    # -- TLS and the hand-over

    async def start_tls(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        timeout = self.site.limits.header_timeout
        try:
            transport = await self.loop.start_tls(
                raw,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=timeout,
                ssl_shutdown_timeout=timeout,
            )
        except OSError as error:  # the handshake failed, or took too long
            log.debug("TLS handshake failed: %s", error)
            raw.abort()
            self.forget()
            return
        if transport is None or transport.is_closing():
            self.forget()  # aborted (the header deadline) while shaking hands
            return
        self.hand_over(transport)

    def hand_over(self, transport: asyncio.Transport) -> None:
        self.handler = self.site.handler()
        self.handler.connection_made(transport)
        if self.early:
            data, self.early = bytes(self.early), bytearray()
            self.data_received(data)

    # -- deadlines and the count

    def arm(self) -> None:
        self.disarm()
        self.deadline = self.loop.call_later(self.site.limits.header_timeout, self.abort)

    def disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def abort(self) -> None:
        """Drop the connection: the socket itself, under any TLS."""
        self.deadline = None
        if self.raw is not None:
            self.raw.abort()

    def forget(self) -> None:
        self.disarm()
        self.site.connections.discard(self)

    def request_started(self) -> None:
        self.in_request = True
        self.disarm()

    def request_finished(self) -> None:
        self.in_request = False


class _Site(web.BaseSite):
    """A TCP site whose sockets go through `_Connection` first."""

    def __init__(
        self,
        runner: web.AppRunner,
        *,
        host: str,
        port: int,
        certificate: ServingCertificate | None,
        limits: Limits,
    ) -> None:
        super().__init__(runner, ssl_context=certificate.context if certificate else None)
        self.host, self.port, self.certificate, self.limits = host, port, certificate, limits
        self.connections: set[_Connection] = set()
        self.handshakes: set[asyncio.Task[None]] = set()
        self.full = False

    @property
    def context(self) -> ssl.SSLContext | None:
        """The TLS context for a connection accepted now: the latest certificate."""
        return self.certificate.context if self.certificate else None

    @property
    def name(self) -> str:
        return f"{'https' if self.certificate else 'http'}://{self.host}:{self.port}"

    def handler(self) -> RequestHandler:
        server = self._runner.server
        assert server is not None
        return server()

    def admit(self, connection: _Connection) -> bool:
        """Count `connection` in, unless the cap is reached (said once each time)."""
        if len(self.connections) >= self.limits.max_connections:
            if not self.full:
                log.warning(
                    "%d connections open (--max-connections): closing new ones at once",
                    len(self.connections),
                )
            self.full = True
            return False
        self.full = False
        self.connections.add(connection)
        return True

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self.host, self.port, reuse_address=True
        )

    async def stop(self) -> None:
        await super().stop()
        for task in self.handshakes:
            task.cancel()


# ----- the middleware -----------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _connection_of(request: web.Request) -> _Connection | None:
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, _Connection) else None


def _refusal(request: web.Request, *, client_auth: bool) -> web.Response | None:
    """Why `request` is not served, as the answer to give; None when it is."""
    if client_auth and request.path not in OPEN_PATHS:
        transport = request.transport
        if transport is None or not transport.get_extra_info("peercert"):
            return web.Response(status=401, text="a client certificate is required")
    if request.method == "POST" and request.content_type != "application/json":
        return web.Response(status=415, text="the body must be application/json")
    return None


def _problem(error: BadHttpMessage | web.RequestPayloadError) -> str:
    """aiohttp's words for what it could not parse, on one line."""
    problem = error.message if isinstance(error, BadHttpMessage) else str(error)
    return " ".join(str(problem).split()).removeprefix("400, message: ")


_BODY = web.RequestKey("berth.body", bytes)
"""Where the guard keeps a request's body, decoded."""

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The Content-Encodings the servers read (zlib's window bits for each)."""


def decoded(raw: bytes, encoding: str | None) -> bytes | web.Response:
    """The body as its sender wrote it, before its Content-Encoding; or the answer that
    refuses it, naming the problem. Decoded here rather than by aiohttp, whose parser,
    meeting a body that is not in its encoding, can leave the request waiting for the
    rest of a body it will never deliver."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return raw
    if name not in _WBITS:
        return web.Response(
            status=415,
            text=f"Content-Encoding {encoding} is not read: send gzip, deflate or none",
        )
    decompressor = zlib.decompressobj(_WBITS[name])
    try:
        body = decompressor.decompress(raw, MAX_BODY + 1)
    except zlib.error as error:
        return web.Response(status=400, text=f"the body is not {name}: {error}")
    if len(body) > MAX_BODY:
        return web.Response(status=413, text=f"the body is over {MAX_BODY} bytes once decoded")
    if not decompressor.eof:
        return web.Response(status=400, text=f"the body is not {name}: it is cut short")
    return body


async def body(request: web.Request) -> bytes:
    """A request's body before its Content-Encoding: as the guard of `serve` decoded it,
    or aiohttp's own reading for an app served otherwise (a test's server)."""
    kept = request.get(_BODY)
    return kept if kept is not None else await request.read()


def _guard(limits: Limits, *, client_auth: bool) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = _connection_of(request)
        if connection is not None:
            connection.request_started()
        try:
            refusal = _refusal(request, client_auth=client_auth)
            if refusal is not None:
                return refusal
            if request.can_read_body:
                try:
                    async with asyncio.timeout(limits.body_timeout):
                        raw = await request.read()
                except TimeoutError:
                    if connection is not None:
                        connection.abort()
                    return web.Response(status=408)  # not delivered: the socket is gone
                found = decoded(raw, request.headers.get("Content-Encoding"))
                if isinstance(found, web.Response):
                    return found
                request[_BODY] = found
            return await handler(request)
        finally:
            if connection is not None:
                connection.request_finished()

    return guard


class _RefusedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (a header it refuses, a Content-Encoding
    it cannot decode) with a traceback, though it answers the client a 400 and nothing
    on the server failed; and so it logs the same problem found while it drains the body
    of a request answered without reading it (a 415). Such a record becomes one warning
    line naming the problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, BadHttpMessage | web.RequestPayloadError):
            record.msg = "refused a request that cannot be parsed: %s"
            record.args = (_problem(error),)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def _log_refusals_in_one_line() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _RefusedRequests) for f in server_log.filters):
        server_log.addFilter(_RefusedRequests())


async def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    tls: Tls | None = None,
    limits: Limits | None = None,
) -> None:
    """Serve until cancelled: HTTPS with `tls`, else plain HTTP."""
    limits = limits or Limits()
    _log_refusals_in_one_line()
    client_auth = tls is not None and tls.client_ca_file is not None
    app.middlewares.append(_guard(limits, client_auth=client_auth))
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=limits.idle_timeout,
        # A body left unread (a refused request) is drained for at most this long.
        lingering_time=limits.body_timeout,
        auto_decompress=False,  # the guard decodes (`decoded`)
    )
    await runner.setup()
    watch: asyncio.Task[None] | None = None
    try:
        certificate = ServingCertificate(tls) if tls is not None else None
        if certificate is not None:
            watch = asyncio.create_task(certificate.watch())
        await _Site(runner, host=host, port=port, certificate=certificate, limits=limits).start()
        await asyncio.Event().wait()
    finally:
        if watch is not None:
            watch.cancel()
        await runner.cleanup()
