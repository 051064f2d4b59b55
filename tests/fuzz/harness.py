"""A server of Berth's in a thread of its own, and a client that posts any bytes to it.

The fuzz tests drive the real HTTP stack: `berth.server.serve` with its guard and TLS,
`berth.web`'s parser, the app's handler, the decision behind it. The server runs on its
own event loop in a background thread on a free localhost port, so that hypothesis (which
calls its tests synchronously) can post to it over one kept-alive HTTPS connection.

A crash is whatever Berth logs with a traceback, or any 5xx: both are recorded
by `Crashes` and checked after every case.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio import client

from berth import tls as berth_tls
from berth import web
from berth.kube.client import Kube
from berth.server import Limits, Tls, serve
from berth.web import MAX_BODY
from devtools.processes import free_port

REFUSED_EARLY = MAX_BODY
"""A body above this size may meet a closed connection instead of an answer: the server
refuses a body past the limit from its Content-Length, answers 413 and closes the
connection without reading all of the rest (the client's send may fail before it reads
the 413)."""

MakeApp = Callable[[AsyncExitStack], Awaitable[web.App]]

TIMEOUT = 30.0
"""Seconds a client waits for an answer: far beyond any answer, short of a hang."""


class Crashes(logging.Handler):
    """Log records that carry a traceback (the server's "error handling", an unexpected
    exception in a handler)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is not None:
            self.records.append(record)

    def take(self) -> list[str]:
        found = [self.format(record) for record in self.records]
        self.records.clear()
        return found


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes


class Client:
    """Posts to one server over a kept-alive HTTPS connection (a new one after the server
    closed it)."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        self.port, self.context = port, context
        self.connection: http.client.HTTPSConnection | None = None

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> Answer | None:
        """The server's answer; None when it closed the connection while the body was
        still being sent, twice in a row (it refuses a body past its limit that way)."""
        for retry in (False, True):
            if self.connection is None:
                self.connection = http.client.HTTPSConnection(
                    "127.0.0.1", self.port, context=self.context, timeout=TIMEOUT
                )
            try:
                self.connection.request("POST", path, body=body, headers=headers)
            except OSError:
                # Closed under us: a kept-alive connection the server ended between
                # requests, or a body it stopped reading. Once more on a fresh one.
                self.close()
                if retry:
                    return None
                continue
            try:
                response = self.connection.getresponse()
                answer = Answer(
                    response.status, response.getheader("Content-Type") or "", response.read()
                )
            except (OSError, http.client.HTTPException):
                self.close()
                if retry:
                    raise
                continue
            if response.getheader("Connection", "").lower() == "close" or response.will_close:
                self.close()
            return answer
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def unreachable_kube(stack: AsyncExitStack) -> Kube:
    """A Kube client whose API server is a closed port: every call it makes fails. Closed
    with `stack`."""
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    kube = Kube(client.ApiClient(configuration))
    stack.push_async_callback(kube.close)
    return kube


@contextmanager
def running(make: MakeApp, directory: Path) -> Iterator[Client]:
    """Serve the app `make` builds (on the server's loop, where it may open what it
    needs on `stack`, closed when the server stops) over HTTPS (`berth.server.serve`) in
    a background thread; a client for it."""
    ca = berth_tls.make_ca("fuzz-ca")
    serving = berth_tls.issue(ca, common_name="127.0.0.1", ip_addresses=("127.0.0.1",))
    cert, key, ca_path = directory / "tls.crt", directory / "tls.key", directory / "ca.crt"
    serving.write(cert_path=cert, key_path=key)
    ca.write(cert_path=ca_path, key_path=directory / "ca.key")
    port = free_port()
    loop = asyncio.new_event_loop()
    started: Future[asyncio.Task[None]] = Future()

    def run() -> None:
        asyncio.set_event_loop(loop)
        task = loop.create_task(_serve(make, port=port, tls=Tls(cert, key)))
        started.set_result(task)
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="fuzz-server", daemon=True)
    thread.start()
    task = started.result(timeout=TIMEOUT)
    client = Client(port, ssl.create_default_context(cafile=ca_path))
    try:
        _wait_listening(port)
        yield client
    finally:
        client.close()
        loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout=TIMEOUT)


async def _serve(make: MakeApp, *, port: int, tls: Tls) -> None:
    async with AsyncExitStack() as stack:
        app = await make(stack)
        await serve(app, host="127.0.0.1", port=port, tls=tls, limits=Limits())


def _wait_listening(port: int) -> None:
    until = time.monotonic() + TIMEOUT
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > until:
                raise
            time.sleep(0.05)


@contextmanager
def crash_log() -> Iterator[Crashes]:
    """Records what every logger logs with a traceback while the block runs."""
    handler = Crashes()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
