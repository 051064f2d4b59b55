"""Berth's servers as real processes, and raw clients that misbehave on purpose.

`start` runs `python -m webhook` or `python -m extender` against the session's cluster
with the flags a test gives (small timeouts, a connection cap, a client CA), and waits
until it is ready. The raw helpers speak to it below HTTP: half a request, a body that
never ends, a TLS connection that says nothing. A test waits for the server to close such
a connection (EOF or a reset), never for a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from berth import tls
from devtools.processes import free_port
from tests.e2e.kube import Cluster

REPO = Path(__file__).resolve().parents[2]

CLOSED = (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)
"""How a client sees a connection the server dropped."""


@dataclass
class Certs:
    """A CA from `berth certs` with its serving certificate, a client certificate it
    signed, and one signed by another CA."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def client(self, *, trusted: bool = True) -> ssl.SSLContext:
        """A client context that trusts the server, presenting a client certificate."""
        context = ssl.create_default_context(cafile=self.ca)
        name = "client" if trusted else "stranger"
        context.load_cert_chain(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        return context

    def anonymous(self) -> ssl.SSLContext:
        """A client context that trusts the server and presents no certificate."""
        return ssl.create_default_context(cafile=self.ca)


def make_certs(directory: Path) -> Certs:
    subprocess.run(
        [sys.executable, "-m", "cli.berth", "certs", f"--out={directory}", "--ip=127.0.0.1"],
        check=True,
        capture_output=True,
    )
    ca = tls.KeyPair((directory / "ca.crt").read_bytes(), (directory / "ca.key").read_bytes())
    tls.issue(ca, common_name="kube-apiserver", client=True).write(
        cert_path=directory / "client.crt", key_path=directory / "client.key"
    )
    tls.issue(tls.make_ca("another-ca"), common_name="stranger", client=True).write(
        cert_path=directory / "stranger.crt", key_path=directory / "stranger.key"
    )
    return Certs(directory)


@dataclass
class Server:
    """A running webhook or extender process."""

    component: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    context: ssl.SSLContext | None
    """What a client uses to reach it: None for plain HTTP."""

    @property
    def url(self) -> str:
        return f"{'https' if self.context else 'http'}://127.0.0.1:{self.port}"

    @property
    def path(self) -> str:
        """The endpoint that does the work: where POSTs go."""
        return "/mutate-pod" if self.component == "webhook" else "/filter"

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def logged(self) -> str:
        return self.log.read_text()


def spawn(
    certs: Certs, component: str, *args: str, kubeconfig: Path, insecure: bool = False
) -> Server:
    """`python -m <component>` on a free loopback port, logging beside the certificates."""
    port = free_port()
    log = certs.directory / f"{component}-{port}.log"
    serving = (
        ["--insecure"]
        if insecure
        else [
            f"--tls-cert-file={certs.directory / 'tls.crt'}",
            f"--tls-private-key-file={certs.directory / 'tls.key'}",
        ]
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                component,
                f"--kubeconfig={kubeconfig}",
                "--host=127.0.0.1",
                f"--port={port}",
                *serving,
                *args,
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Server(component, port, process, log, None if insecure else certs.anonymous())


async def start(
    cluster: Cluster,
    certs: Certs,
    component: str,
    *flags: str,
    kubeconfig: Path | None = None,
    insecure: bool = False,
) -> Server:
    """`spawn`, and wait until the server is ready."""
    server = spawn(
        certs, component, *flags, kubeconfig=kubeconfig or cluster.kubeconfig, insecure=insecure
    )
    process = server.process

    async def ready() -> bool:
        assert process.poll() is None, f"{component} exited:\n{server.logged()}"
        try:
            # A connection of its own each time, closed at once, so that no probe
            # connection lingers to count against a connection cap.
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s,
                s.get(f"{server.url}/readyz", ssl=server.context or False) as response,
            ):
                return response.status == 200
        except aiohttp.ClientError:
            return False

    try:
        await cluster.await_(ready, what=f"{component} on port {server.port} to be ready")
    except BaseException:
        server.stop()
        raise
    return server


# ----- raw connections --------------------------------------------------------------------

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(server: Server, *, handshake: bool = True) -> Stream:
    """A connection to `server`: over TLS when it serves TLS, unless `handshake` is off
    (then a bare TCP connection that never starts the handshake)."""
    context = server.context if handshake else None
    return await asyncio.open_connection("127.0.0.1", server.port, ssl=context)


async def closed_by_server(stream: Stream, *, within: float) -> float:
    """Wait until the server ends the connection (EOF or reset); how long that took.
    Fails when it is still open after `within` seconds."""
    reader, writer = stream
    began = time.monotonic()

    async def until_eof() -> None:
        with contextlib.suppress(*CLOSED):
            while await reader.read(65536):
                pass

    try:
        await asyncio.wait_for(until_eof(), within)
    except TimeoutError:
        raise AssertionError(f"the connection was still open after {within:.0f}s") from None
    finally:
        writer.close()
    return time.monotonic() - began


def request_head(
    server: Server,
    *,
    method: str = "POST",
    path: str | None = None,
    headers: dict[str, str] | None = None,
) -> bytes:
    lines = [f"{method} {path or server.path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def dribble(stream: Stream, chunk: bytes, *, every: float, within: float) -> float:
    """Send `chunk` every `every` seconds, as a slow client would, until the server ends
    the connection; how long that took. Fails when it is still open after `within`."""
    reader, writer = stream
    began = time.monotonic()
    while time.monotonic() - began < within:
        try:
            writer.write(chunk)
            await writer.drain()
            # Pacing the client, and at the same time waiting for the server's close.
            if not await asyncio.wait_for(reader.read(65536), every):
                return time.monotonic() - began
        except TimeoutError:
            continue
        except CLOSED:
            return time.monotonic() - began
    writer.close()
    raise AssertionError(f"the server was still reading the body after {within:.0f}s")
