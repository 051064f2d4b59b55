"""Serving an app (`berth.web`): HTTPS, health and metrics, and limits that hold against
clients that are slow, many or anonymous on purpose.

The webhook and the extender are both thin apps; this is the one place that decides how
they listen, so TLS, client authentication, limits, readiness and `/metrics` behave the
same for both (and for the controller's health port).

Every accepted socket is a `_Connection`, an asyncio protocol that does all of it, from
accept to close, with nothing between the socket and the app but asyncio's TLS: a
review is one read, one handler call and one write. A handler that answers at once (the
extender's verbs, a review with nothing to claim, the probes) is called from the
protocol's callback as the request's last bytes come, with no task and no turn of the
loop; one that must wait (an API call) runs in a task. (An HTTP library's server cost a
review three times the CPU of the handler's own work: bench/PROFILE.md.)

- It counts itself among the open connections from accept to close. A socket past
  `max_connections` is aborted at once, before any TLS work. The bytes of large bodies
  still arriving (over `SMALL_BODY`) count against `max_pending_bytes` for all
  connections; a request that would pass it is answered 503 with `Retry-After` and its
  connection closed, so clients that send large bodies slowly hold at most that much of
  the server's memory between them. Small bodies (kube-apiserver's reviews) are never
  refused for it: the connection cap bounds them.
- It runs the TLS handshake itself (`loop.start_tls`), so a connection still in (or
  stuck in, or failing) its handshake is counted and timed out like any other.
- One deadline at a time (looked at every `SWEEP_INTERVAL`): the header deadline, from
  the connection's start (TLS handshake included) or a request's first byte until its
  head is in; the body deadline, until its body is in; the idle timeout between
  requests. When one passes, the socket is aborted.
- Requests are read (`berth.web.parse_head`) and answered one at a time. A request that
  cannot be read is answered with the problem (400, 411, 413, 431), logged as one
  warning line, and the connection closed. The guard looks at a request's head before
  its body is read: with a client CA, a verified client certificate on everything but
  the probes (401); a route (404, 405); no body on GET or HEAD (400); `application/json`
  on POST (415); no `Expect` but 100-continue (417). A request it refuses whose body is
  not all there yet closes the connection. The body is then decoded (gzip or deflate,
  `web.decoded`).
- A client that does not read its answers is not read from (and dropped once it has
  read nothing of them for the body deadline), so nothing piles up. Requests sent
  together are served `AT_ONCE` per turn of the loop, so that a pipeline of requests
  answered at once holds up no other connection. One that is done sending (even a
  half-close) is taken as gone, as kube-apiserver closes a review it gave up on. What
  a client sends after a refusal that closes is read and dropped until it is done, so
  that it reads the answer rather than a reset.
- On shutdown the idle connections are closed at once, the requests in flight answered
  (for up to `SHUTDOWN_GRACE`, saying `Connection: close`), then every connection closed.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.exposition import choose_encoder

from berth import metrics, web

log = logging.getLogger(__name__)

Readiness = Callable[[], bool]

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
    max_pending_bytes: int = 32 * 1024 * 1024
    """Bytes of large request bodies (over `SMALL_BODY`) all connections may hold while
    they arrive: without it, clients that send each a large body slowly could hold the
    connection cap times `berth.web.MAX_BODY` of the server's memory. A request that
    would pass it is answered 503 with `Retry-After` and its connection closed. At least
    `berth.web.MAX_BODY` (the flag says so), so that a body alone always fits.
    kube-apiserver's reviews take a few KiB each; kube-scheduler sends one request at a
    time."""


SMALL_BODY = web.MAX_HEAD
"""A body of at most this many bytes is not counted against `max_pending_bytes`: the
connection cap bounds what such bodies hold (256 of 64 KiB), and an anonymous client
filling the budget with large bodies cannot turn away kube-apiserver's reviews."""


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

    def problem(self) -> str | None:
        """Why the files do not make a context, naming the file, if they do not: each is
        loaded on its own first (a garbled file, a key that is not the certificate's, a
        client CA file without a certificate)."""
        try:
            x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        except (OSError, ValueError) as error:
            return f"{self.cert_file}: not a PEM certificate ({error})"
        try:
            serialization.load_pem_private_key(self.key_file.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as error:
            return f"{self.key_file}: not an unencrypted PEM private key ({error})"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            return f"{self.key_file} is not the key of {self.cert_file} ({_reason(error)})"
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as error:
                return f"{self.client_ca_file}: no PEM CA certificate in it ({_reason(error)})"
        return None


def _reason(error: OSError) -> str:
    """An SSL error's reason (`KEY_VALUES_MISMATCH`), without its library noise."""
    return str(getattr(error, "reason", None) or error)


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


def _at_least(least: int) -> Callable[[str], int]:
    """A flag's type: a whole number of at least `least`."""

    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {text}")
        return value

    parse.__name__ = "int"
    return parse


def port(text: str) -> int:
    """A flag's type: a TCP port, 0 (any free one) to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, not {text}")
    return value


def add_listen_arguments(parser: argparse.ArgumentParser, *, default_port: int) -> None:
    """Where a server listens: `--host` and `--port`."""
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument(
        "--port", type=port, default=default_port, help=f"port (default {default_port})"
    )


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
    parser.add_argument(
        "--max-pending-bytes",
        type=_at_least(web.MAX_BODY),
        default=defaults.max_pending_bytes,
        metavar="BYTES",
        help=f"bytes of large request bodies (over {SMALL_BODY}) all clients may hold while "
        f"they arrive, at least {web.MAX_BODY}; a request past it is answered 503 "
        f"(default {defaults.max_pending_bytes})",
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
    return Tls(args.tls_cert_file, args.tls_private_key_file, client_ca).problem()


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
        max_pending_bytes=int(args.max_pending_bytes),
    )


# ----- the app's common routes --------------------------------------------------------------


def add_health(app: web.App, ready: Readiness) -> None:
    """`/healthz` answers while the process serves; `/readyz` once `ready()` says so."""

    def healthz(_: web.Request) -> web.Response:
        return web.text("ok")

    def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.text("ok")
        return web.text("not ready: caches not synced or no leader known", status=503)

    app.get("/healthz", healthz)
    app.get("/readyz", readyz)


def add_metrics(app: web.App) -> None:
    """`/metrics`: the process's metrics (`berth.metrics`) in the Prometheus text format,
    or OpenMetrics when the scraper asks for it."""

    def scrape(request: web.Request) -> web.Response:
        try:
            encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        except (TypeError, ValueError):  # an Accept prometheus_client cannot read
            encoder, content_type = generate_latest, CONTENT_TYPE_LATEST
        return web.Response(body=encoder(REGISTRY), content_type=content_type)

    app.get("/metrics", scrape)


def cancel_on_signals() -> None:
    """SIGTERM or SIGINT cancel the running main task, so `finally` blocks run and requests
    in flight are answered before the process exits (a pod's graceful stop)."""
    main = asyncio.current_task()
    assert main is not None, "call from the main task"
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, main.cancel)


# ----- connections ------------------------------------------------------------------------


def _content_type(head: web.Head) -> str:
    return head.headers.get("content-type", "").partition(";")[0].strip().lower()


class _Connection(asyncio.Protocol):
    """One accepted socket, from accept to close: counted, TLS, the deadlines, and the
    HTTP/1.1 exchange (see the module docstring). Requests are read and answered one at
    a time; bytes of a next request wait in the buffer while one is served."""

    def __init__(self, site: _Site) -> None:
        self.site = site
        self.loop = asyncio.get_running_loop()
        self.raw: asyncio.Transport | None = None
        """The socket's transport, under any TLS: what a deadline aborts."""
        self.transport: asyncio.Transport | None = None
        """Where requests are read and answers written, once TLS is up."""
        self.certified = False
        self.buffer = bytearray()
        self.scanned = 0
        """How much of the buffer is known to hold no end of a head."""
        self.head: web.Head | None = None
        self.handler: web.Handler | None = None
        """The request whose body is being read, and the handler the guard found for it."""
        self.pending = 0
        """Bytes of that body (if large) counted in the site's `pending` while it arrives."""
        self.serving: asyncio.Task[None] | None = None
        self.closing = False
        """Answered for the last time: what the client still sends is dropped."""
        self.paused = False
        self.yielding = False
        """Paused for a turn of the loop after `AT_ONCE` requests (`advance`)."""
        self.writable = asyncio.Event()
        self.writable.set()
        self.backlog: int | None = None
        """Bytes waiting for the client at the sweeper's last look, while it is slow to
        read them (`reading_on`)."""
        self.deadline: float | None = None
        """When the connection is aborted (the loop's clock), unless something comes:
        `_Site.sweep` looks."""

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.raw = transport
        if not self.site.admit(self):
            transport.abort()
            return
        self.arm(self.site.limits.header_timeout)
        context = self.site.context
        if context is None:
            self.transport = transport
            return
        # No byte reaches this protocol before start_tls takes the transport over.
        transport.pause_reading()
        task = self.loop.create_task(self.start_tls(transport, context))
        self.site.handshakes.add(task)
        task.add_done_callback(self.site.handshakes.discard)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if not self.buffer and self.head is None and self.serving is None:
            self.arm(self.site.limits.header_timeout)  # the first bytes of a request
        self.buffer += data
        if self.head is not None and not self.count(self.head, len(data)):
            self.refuse(TOO_MANY_BODIES, self.head)
            return
        if self.serving is not None and len(self.buffer) > web.MAX_HEAD:
            self.pause()  # a client that sends on while it is being answered
        self.advance()

    def eof_received(self) -> None:
        # Returning None closes the transport. A client that is done sending is taken as
        # gone, even one that only half-closed: kube-apiserver closes the connection of
        # a review it gave up on, and the webhook must then learn that its answer cannot
        # be delivered (`Request.deliver` raises; a claim is released).
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.debug("connection lost: %s", exc)
        self.transport = None
        self.writable.set()  # nothing is waiting to be sent any more
        self.forget()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    # -- TLS

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
        except asyncio.CancelledError:  # the server stops
            raw.abort()
            self.forget()
            raise
        if transport is None or transport.is_closing():
            self.forget()  # aborted (the header deadline) while shaking hands
            return
        self.transport = transport
        self.certified = bool(transport.get_extra_info("peercert"))
        self.advance()

    # -- reading requests

    def advance(self) -> None:
        """Read the requests the buffer holds, one at a time: start serving the next one
        that is whole. At most `AT_ONCE` in one turn of the loop: a client that sends
        thousands of requests answered at once (a pipeline of `HEAD /metrics`) is not
        read from meanwhile, and the loop serves the other connections in between."""
        served = 0
        while self.serving is None and not self.closing and self.transport is not None:
            if self.site.stopping:
                return
            if served == AT_ONCE:
                self.pause()
                self.yielding = True
                self.loop.call_soon(self.go_on)
                return
            if self.head is None:
                if not self.read_head():
                    return
                if self.head is None:
                    served += 1
                    continue  # refused and answered: the next one
            length = self.head.length
            if len(self.buffer) < length:
                return
            head, handler, body = self.head, self.handler, bytes(self.buffer[:length])
            assert handler is not None
            del self.buffer[:length]
            self.head = self.handler = None
            self.settle_pending()
            self.disarm()
            self.start(head, handler, body)
            served += 1

    def go_on(self) -> None:
        """Serve on after a turn of the loop (`advance`), and read again once the
        requests already here are served."""
        self.yielding = False
        self.advance()
        # An answer that could not be sent at once has a task (`serving`) that pauses
        # the connection itself until it is.
        if not self.yielding and self.serving is None:
            self.resume()

    def read_head(self) -> bool:
        """Take a request's head off the buffer if it is there whole, and look at it
        before its body is read. False: more is needed, or the connection closes."""
        end = self.buffer.find(web.HEAD_END, max(0, self.scanned - len(web.HEAD_END) + 1))
        if end < 0:
            self.scanned = len(self.buffer)
            if self.scanned > web.MAX_HEAD:
                self.refuse(web.Refused(431, f"the request's head is over {web.MAX_HEAD} bytes"))
            return False
        self.scanned = 0
        raw = bytes(self.buffer[:end]).lstrip(b"\r\n")  # RFC 9112: empty lines before
        del self.buffer[: end + len(web.HEAD_END)]
        try:
            head = web.parse_head(raw)
        except web.Refused as refused:
            log.warning("refused a request that cannot be parsed: %s", refused.message)
            self.refuse(refused)
            return False
        try:
            handler = self.guard(head)
        except web.Refused as refused:
            return self.turn_away(head, refused)
        if len(self.buffer) >= head.length:
            self.head, self.handler = head, handler
            return True
        if not self.count(head, len(self.buffer)):
            self.refuse(TOO_MANY_BODIES, head)
            return False
        self.head, self.handler = head, handler
        self.arm(self.site.limits.body_timeout)
        if head.expects_continue and head.version == "HTTP/1.1":
            self.write(web.CONTINUE)
        return True

    def guard(self, head: web.Head) -> web.Handler:
        """The handler of a request, or Refused: looked at before its body is read."""
        if self.site.client_auth and head.path not in OPEN_PATHS and not self.certified:
            raise web.Refused(401, "a client certificate is required", close=False)
        handler = self.site.app.handler(head)
        if head.method in ("GET", "HEAD") and head.length:
            raise web.Refused(400, f"a {head.method} request carries no body")
        if head.method == "POST" and _content_type(head) != "application/json":
            raise web.Refused(415, "the body must be application/json", close=False)
        expect = head.headers.get("expect")
        if expect is not None and expect.lower() != "100-continue":
            raise web.Refused(417, f"Expect {expect[:40]!r} is not met", close=False)
        return handler

    def turn_away(self, head: web.Head, refused: web.Refused) -> bool:
        """Answer a request the guard refused. Its body is not read: the connection goes
        on if the body is already here whole (and the refusal allows), else it closes."""
        if not refused.close and len(self.buffer) >= head.length and not self.closes(head):
            del self.buffer[: head.length]
            self.write(
                web.encode(
                    refused.response(),
                    close=False,
                    body=head.method != "HEAD",
                    version=head.version,
                )
            )
            if not self.writable.is_set():
                self.serving = self.loop.create_task(self.unread(head))
                return True
            limits = self.site.limits
            self.arm(limits.header_timeout if self.buffer else limits.idle_timeout)
            return True
        self.refuse(refused, head)
        return False

    def refuse(self, refused: web.Refused, head: web.Head | None = None) -> None:
        """Answer a request that is not read (whose head is `head`, if it could be read),
        and close."""
        body = head is None or head.method != "HEAD"
        self.write(web.encode(refused.response(), close=True, body=body))
        self.close(linger=True)

    # -- serving

    def start(self, head: web.Head, handler: web.Handler, body: bytes) -> None:
        """Serve a request read whole. A handler that answers at once (no `await`) is
        answered here, with no task and no turn of the loop; one that must wait (an API
        call) is awaited by a task (`serving`)."""
        exchange = _Exchange(self, head)
        result: web.Response | Awaitable[web.Response]
        try:
            decoded = web.decoded(body, head.headers.get("content-encoding"))
            result = handler(web.Request(head, decoded, exchange.deliver))
        except web.Refused as refused:
            result = refused.response()
        except Exception:
            result = _failed(head)
        if not isinstance(result, web.Response):
            self.serving = self.loop.create_task(self.finish(exchange, result))
            return
        exchange.answer(result)
        if not self.writable.is_set():
            self.serving = self.loop.create_task(self.finish(exchange, None))
            return
        self.settle(head)

    async def finish(self, exchange: _Exchange, pending: Awaitable[web.Response] | None) -> None:
        """Await a handler's answer (if `pending`) and its sending, then go on."""
        if pending is not None:
            try:
                exchange.answer(await pending)
            except Exception:
                exchange.answer(_failed(exchange.head))
        if not self.writable.is_set():
            # A client that does not read what it was sent is not read from meanwhile;
            # past the body deadline it is dropped.
            self.pause()
            self.arm(self.site.limits.body_timeout)
            await self.writable.wait()
        self.serving = None
        if self.settle(exchange.head):
            self.advance()

    async def unread(self, head: web.Head) -> None:
        """A refusal the client has not read yet: as after an answer (`finish`), nothing
        more is read from it meanwhile, and past the body deadline it is dropped."""
        self.pause()
        self.arm(self.site.limits.body_timeout)
        await self.writable.wait()
        self.serving = None
        if self.settle(head):
            self.advance()

    def closes(self, head: web.Head) -> bool:
        """Whether the connection ends with the answer to `head`."""
        return not head.keep_alive or self.site.stopping

    def settle(self, head: web.Head) -> bool:
        """After an answer: close, or wait for the next request (True)."""
        if self.closes(head):
            self.close()
            return False
        if not self.yielding:
            self.resume()
        self.arm(self.site.limits.header_timeout if self.buffer else self.site.limits.idle_timeout)
        return True

    # -- writing, closing, deadlines

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self, *, linger: bool = False) -> None:
        """Close once what was written is sent; a client that does not read it within
        the body deadline is dropped. `linger`: the client may still be sending (a body
        not read), so what it sends is read and dropped until it is done, and it reads
        the answer rather than a reset."""
        if self.closing:
            return
        self.closing = True
        self.buffer.clear()
        self.settle_pending()
        self.arm(self.site.limits.body_timeout)
        if self.transport is None:
            self.abort()  # still in its TLS handshake
        elif self.transport.is_closing():
            pass  # the client closed first (a TLS close_notify): on its way out already
        elif linger:
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.resume()  # closed at the client's end of input (`eof_received`)
        else:
            self.transport.close()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = False
            self.transport.resume_reading()

    def arm(self, seconds: float) -> None:
        self.deadline = self.loop.time() + seconds

    def unsent(self) -> int:
        """Bytes written and not yet taken by the client: those of the TLS layer and those
        of the socket's transport, which may hold a whole large answer at once (asyncio's
        TLS hands a write's records on to it before they are sent)."""
        if self.transport is None:
            return 0
        if self.raw is None or self.raw is self.transport:
            return self.transport.get_write_buffer_size()
        size = self.raw.get_write_buffer_size()
        if not self.transport.is_closing():  # a TLS layer closed has let go of its buffer
            size += self.transport.get_write_buffer_size()
        return size

    def reading_on(self) -> bool:
        """Whether a client whose answers wait to be sent has read `MIN_PROGRESS` bytes
        of them (or all) since the last look that said so: its deadline is then at least
        the body deadline from now. A client reading a large answer slowly is not a
        stalled one; one that reads nothing, or a trickle, is dropped at the deadline, as
        is one holding part of a next request meanwhile."""
        size = self.unsent()
        if not size or self.backlog is None or self.buffer:
            self.backlog = size or None
            return False
        if self.backlog - size < MIN_PROGRESS:
            return False
        self.backlog = size
        if self.deadline is not None:
            self.deadline = max(self.deadline, self.loop.time() + self.site.limits.body_timeout)
        return True

    def disarm(self) -> None:
        self.deadline = None

    def abort(self) -> None:
        """Drop the connection: the socket itself, under any TLS."""
        self.deadline = None
        if self.raw is not None:
            self.raw.abort()

    def count(self, head: web.Head, received: int) -> bool:
        """Count `received` bytes of the body of `head`, if large, against what all
        connections may hold; False if that would pass it (a small body is not counted)."""
        if head.length <= SMALL_BODY:
            return True
        if not self.site.hold(received):
            return False
        self.pending += received
        return True

    def settle_pending(self) -> None:
        """The body counted in the site's `pending` is in (or will never be)."""
        self.site.pending -= self.pending
        self.pending = 0

    def forget(self) -> None:
        self.disarm()
        self.settle_pending()
        self.site.connections.discard(self)


class _Exchange:
    """One request's answer: sent once, by `Request.deliver` or when the handler returns."""

    def __init__(self, connection: _Connection, head: web.Head) -> None:
        self.connection, self.head = connection, head
        self.sent = False

    async def deliver(self, response: web.Response) -> None:
        transport = self.connection.transport
        if not self.sent and (transport is None or transport.is_closing()):
            self.sent = True
            raise ConnectionResetError("the client closed the connection")
        self.answer(response)

    def answer(self, response: web.Response) -> None:
        if self.sent:
            return
        self.sent = True
        head = self.head
        self.connection.write(
            web.encode(
                response,
                close=self.connection.closes(head),
                body=head.method != "HEAD",
                version=head.version,
            )
        )


def _failed(head: web.Head) -> web.Response:
    """The answer when a handler raised: logged with its traceback (a bug)."""
    log.exception("error handling %s %s", head.method, head.path)
    return web.text("internal error", status=500)


TOO_MANY_BODIES = web.Refused(
    503,
    "the server is reading too many request bodies at once; try again",
    headers=(("Retry-After", "1"),),
)

SHUTDOWN_GRACE = 10.0
"""Seconds the requests in flight get to be answered when a server stops."""

MIN_PROGRESS = 64 * 1024
"""Bytes of its answers a slow client must take to have its deadline pushed back
(`_Connection.reading_on`): some 6 KiB/s at the default body deadline."""

AT_ONCE = 16
"""Requests of one connection served in one turn of the loop (`_Connection.advance`)."""

SWEEP_INTERVAL = 0.25
"""Seconds between two looks at the connections' deadlines. One look for all of them,
rather than a timer per connection set and cancelled at every request."""


class _Site:
    """What the connections of one listening socket share."""

    def __init__(
        self,
        app: web.App,
        *,
        certificate: ServingCertificate | None,
        limits: Limits,
    ) -> None:
        self.app, self.certificate, self.limits = app, certificate, limits
        self.client_auth = certificate is not None and certificate.tls.client_ca_file is not None
        self.connections: set[_Connection] = set()
        self.handshakes: set[asyncio.Task[None]] = set()
        self.full = False
        self.swamped = False
        self.pending = 0
        """Bytes of large request bodies the connections hold while they arrive
        (`Limits.max_pending_bytes`)."""
        self.stopping = False
        """No new request is started: the server stops."""
        self.port = 0

    @property
    def context(self) -> ssl.SSLContext | None:
        """The TLS context for a connection accepted now: the latest certificate."""
        return self.certificate.context if self.certificate else None

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

    def hold(self, received: int) -> bool:
        """Count `received` bytes of a large body in, unless that would pass the limit
        (said once each time it is reached)."""
        if self.pending + received > self.limits.max_pending_bytes:
            if not self.swamped:
                log.warning(
                    "%d bytes of large request bodies arriving (--max-pending-bytes): "
                    "answering 503 to requests that would add more",
                    self.pending,
                )
            self.swamped = True
            return False
        self.swamped = False
        self.pending += received
        return True

    async def sweep(self) -> None:
        """Abort the connections whose deadline has passed, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            for connection in list(self.connections):
                try:
                    connection.reading_on()
                except Exception:  # one connection's failure must not end the sweeps
                    log.exception("could not look at a connection's answers")
            now = loop.time()
            for connection in [c for c in self.connections if (c.deadline or now) < now]:
                try:
                    connection.abort()
                except Exception:  # one connection's failure must not end the sweeps
                    log.exception("could not abort a connection past its deadline")

    async def stop(self) -> None:
        """Close the idle connections, answer the requests in flight (for up to
        `SHUTDOWN_GRACE`, with `Connection: close`), start no other, then close the rest."""
        self.stopping = True
        for task in self.handshakes:
            task.cancel()
        for connection in [c for c in self.connections if c.serving is None]:
            connection.close()
        serving = {c.serving for c in self.connections if c.serving is not None}
        if serving:
            await asyncio.wait(serving, timeout=SHUTDOWN_GRACE)
        for connection in list(self.connections):
            connection.close()


@asynccontextmanager
async def listening(
    app: web.App,
    *,
    host: str,
    port: int,
    tls: Tls | None = None,
    limits: Limits | None = None,
) -> AsyncIterator[_Site]:
    """`app` served on `host:port` (port 0: a free one, `site.port`) while in the block:
    HTTPS with `tls`, else plain HTTP."""
    certificate = ServingCertificate(tls) if tls is not None else None
    site = _Site(app, certificate=certificate, limits=limits or Limits())
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(site), host, port, reuse_address=True)
    site.port = server.sockets[0].getsockname()[1]
    tasks = [asyncio.create_task(site.sweep())]
    if certificate is not None:
        tasks.append(asyncio.create_task(certificate.watch()))
    try:
        yield site
    finally:
        server.close()
        try:
            await site.stop()
        finally:
            for task in tasks:
                task.cancel()


async def serve(
    app: web.App,
    *,
    host: str,
    port: int,
    tls: Tls | None = None,
    limits: Limits | None = None,
) -> None:
    """Serve until cancelled: HTTPS with `tls`, else plain HTTP."""
    async with listening(app, host=host, port=port, tls=tls, limits=limits):
        await asyncio.Event().wait()
