"""Berth's servers hold against clients that are slow, many or anonymous on purpose.

The webhook and the extender listen through one module (`berth.server`); each test runs
on both, as real processes with small limits passed as flags, and speaks to them over raw
sockets: half a request line, a body that never ends, a TLS connection that says
nothing, one connection more than the cap. The server must end each of those on its own,
answer a body of the wrong type with 415, read a pod as large as etcd stores, and with a
client CA answer only clients that present a certificate it signed.
"""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.processes import free_port
from tests.e2e.kube import Cluster
from tests.e2e.serving import (
    CLOSED,
    REPO,
    Certs,
    Server,
    closed_by_server,
    connect,
    dribble,
    make_certs,
    request_head,
    start,
)

pytestmark = pytest.mark.e2e

COMPONENTS = ["webhook", "extender"]
HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
IDLE_TIMEOUT = 2.0
BOUND = 10.0
"""How long a test waits for the server to end a connection it must end after 1-2 s."""
CAP = 4

FILTER_ARGS: dict[str, Any] = json.loads(
    (REPO / "tests" / "data" / "extender_filter_args.json").read_text()
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("serving-certs"))


@pytest.fixture(scope="module", params=COMPONENTS)
async def quick(
    request: pytest.FixtureRequest, cluster: Cluster, certs: Certs
) -> AsyncIterator[Server]:
    """A server that gives a client 1 s for headers, 1 s for a body, 2 s idle."""
    server = await start(
        cluster,
        certs,
        request.param,
        f"--header-timeout={HEADER_TIMEOUT}",
        f"--body-timeout={BODY_TIMEOUT}",
        f"--idle-timeout={IDLE_TIMEOUT}",
    )
    yield server
    server.stop()


@pytest.fixture(scope="module", params=COMPONENTS)
async def capped(
    request: pytest.FixtureRequest, cluster: Cluster, certs: Certs
) -> AsyncIterator[Server]:
    """A server that holds at most CAP connections (and lets them idle long enough for
    the test to see it)."""
    server = await start(
        cluster, certs, request.param, f"--max-connections={CAP}", "--header-timeout=60"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module", params=COMPONENTS)
async def authenticating(
    request: pytest.FixtureRequest, cluster: Cluster, certs: Certs
) -> AsyncIterator[Server]:
    server = await start(cluster, certs, request.param, f"--client-ca-file={certs.ca}")
    yield server
    server.stop()


# ----- slow clients -----------------------------------------------------------------------


async def test_partial_headers_are_dropped(quick: Server) -> None:
    stream = await connect(quick)
    stream[1].write(f"POST {quick.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty".encode())
    took = await closed_by_server(stream, within=BOUND)
    assert took < HEADER_TIMEOUT + 3


async def test_a_tls_connection_that_sends_nothing_is_dropped(quick: Server) -> None:
    await closed_by_server(await connect(quick), within=BOUND)


async def test_a_connection_that_never_starts_tls_is_dropped(quick: Server) -> None:
    await closed_by_server(await connect(quick, handshake=False), within=BOUND)


async def test_a_body_that_stops_is_dropped(quick: Server) -> None:
    stream = await connect(quick)
    head = request_head(
        quick, headers={"Content-Type": "application/json", "Content-Length": "1000"}
    )
    stream[1].write(head + b'{"apiVersion": ')
    took = await closed_by_server(stream, within=BOUND)
    assert took < BODY_TIMEOUT + 3


async def test_an_endless_chunked_body_is_dropped(quick: Server) -> None:
    """A chunk every 0.1 s keeps the connection busy and stays far below the size limit:
    only the body deadline ends it."""
    stream = await connect(quick)
    head = request_head(
        quick, headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    )
    stream[1].write(head)
    took = await dribble(stream, b"1\r\n \r\n", every=0.1, within=BOUND)
    assert took < BODY_TIMEOUT + 3


async def test_an_idle_keep_alive_connection_is_closed(quick: Server) -> None:
    reader, writer = stream = await connect(quick)
    writer.write(request_head(quick, method="GET", path="/healthz"))
    status = await reader.readline()
    assert status.startswith(b"HTTP/1.1 200"), status
    await closed_by_server(stream, within=BOUND)


async def test_a_body_of_another_type_is_refused(quick: Server) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            quick.url + quick.path,
            data=b"{}",
            headers={"Content-Type": "text/plain"},
            ssl=quick.context or False,
        ) as response,
    ):
        assert response.status == 415, await response.text()


# ----- many clients -----------------------------------------------------------------------


async def test_connections_past_the_cap_are_closed_at_once(
    cluster: Cluster, capped: Server
) -> None:
    held: list[asyncio.StreamWriter] = []

    async def fill() -> bool:
        """CAP connections, each through its TLS handshake. One may still be refused
        while the server counts out a probe that just closed: then try again."""
        for writer in held:
            writer.close()
        held.clear()
        try:
            for _ in range(CAP):
                held.append((await connect(capped))[1])
        except CLOSED:
            return False
        return True

    try:
        await cluster.await_(fill, what=f"{CAP} connections to be accepted")
        # One more is closed before any TLS is spoken, long before the 60 s header
        # deadline would close it.
        with pytest.raises(CLOSED):
            await asyncio.wait_for(connect(capped), 5)
        # Room again once one of them goes.
        held.pop().close()

        async def accepted() -> bool:
            try:
                held.append((await connect(capped))[1])
            except CLOSED:
                return False
            return True

        await cluster.await_(accepted, what="a connection to be accepted below the cap")
    finally:
        for writer in held:
            writer.close()


# ----- anonymous clients ------------------------------------------------------------------


async def post_json(server: Server, context: ssl.SSLContext) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.url + server.path, json={}, ssl=context) as response,
    ):
        return response.status


async def test_a_client_without_a_certificate_is_refused(
    authenticating: Server, certs: Certs
) -> None:
    assert await post_json(authenticating, certs.anonymous()) == 401


async def test_a_client_certificate_of_another_ca_is_refused(
    authenticating: Server, certs: Certs
) -> None:
    with pytest.raises(aiohttp.ClientError):
        await post_json(authenticating, certs.client(trusted=False))


async def test_a_client_certificate_of_the_ca_is_served(
    authenticating: Server, certs: Certs
) -> None:
    # An empty object: refused as a request (400, or filter's 200 with Error), but read.
    assert await post_json(authenticating, certs.client()) in (200, 400)


async def test_probes_need_no_client_certificate(authenticating: Server, certs: Certs) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz", "/metrics"):
            async with session.get(authenticating.url + path, ssl=certs.anonymous()) as response:
                assert response.status == 200, path


# ----- the extender -------------------------------------------------------------------------


def filter_args(pod_bytes: int) -> dict[str, Any]:
    """The recorded ExtenderArgs, its pod grown to about `pod_bytes` by an environment
    variable (the API server accepts a pod up to etcd's 1.5 MiB)."""
    args = copy.deepcopy(FILTER_ARGS)
    container = args["Pod"]["spec"]["containers"][0]
    container.setdefault("env", []).append({"name": "PADDING", "value": "x" * pod_bytes})
    return args


async def test_the_extender_reads_a_pod_as_large_as_etcd_stores(
    cluster: Cluster, certs: Certs
) -> None:
    """A pod refused for its size would be scheduled without the extender (it is
    ignorable), past the capacity a Reservation holds in handover."""
    extender = await start(cluster, certs, "extender")
    try:
        async with aiohttp.ClientSession() as session:
            url = extender.url + "/filter"
            large = filter_args(int(1.5 * 1024 * 1024))
            async with session.post(url, json=large, ssl=extender.context or False) as response:
                assert response.status == 200, await response.text()
                result = await response.json()
            assert result["Error"] == ""
            assert result["NodeNames"] == FILTER_ARGS["NodeNames"]
            huge = filter_args(9 * 1024 * 1024)
            async with session.post(url, json=huge, ssl=extender.context or False) as response:
                assert response.status == 413
    finally:
        extender.stop()


def test_the_extender_never_serves_plain_http_unasked(cluster: Cluster) -> None:
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "extender",
                f"--kubeconfig={cluster.kubeconfig}",
                "--host=127.0.0.1",
                f"--port={free_port()}",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired as running:
        raise AssertionError(
            f"the extender served without a certificate:\n{running.stderr!r}"
        ) from None
    assert result.returncode == 2  # a configuration the command cannot use
    [line] = result.stderr.splitlines()
    assert "--insecure" in line
    assert "--tls-cert-file" in line


async def test_the_extender_serves_plain_http_when_asked(cluster: Cluster, certs: Certs) -> None:
    extender = await start(cluster, certs, "extender", insecure=True)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(extender.url + "/healthz") as response,
        ):
            assert response.status == 200
        assert extender.url.startswith("http://")
    finally:
        extender.stop()


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(
            ["--insecure", "--tls-cert-file=tls.crt", "--tls-private-key-file=tls.key"],
            id="insecure and a certificate",
        ),
        pytest.param(["--insecure", "--client-ca-file=ca.crt"], id="insecure and a client CA"),
    ],
)
def test_the_extender_refuses_contradictory_flags(flags: list[str], tmp_path: Path) -> None:
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / name).write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "extender", f"--kubeconfig={tmp_path / 'none'}", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert "--insecure" in line
