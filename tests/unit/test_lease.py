"""Leader election's decisions, on the observer's own clock; and the API connection's own
timeouts (a renewal, a watch) against a server that stops answering."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from berth.kube.client import PODS, Kube
from berth.kube.lease import (
    LeaderElector,
    Observation,
    Record,
    Verdict,
    judge,
    observe,
    released,
)

HTTP_TIMEOUT = 30.0
"""The Kube client's timeout for a request (`Kube.request`)."""

OTHER = Record(holder="other", renew_time="2026-11-23T10:00:00.000000Z", duration=10.0)


def test_an_unchanged_record_keeps_the_moment_it_was_first_seen() -> None:
    first = observe(None, OTHER, now=100.0)
    assert observe(first, OTHER, now=105.0) == Observation(OTHER, seen_at=100.0)


def test_a_renewal_starts_the_count_again() -> None:
    first = observe(None, OTHER, now=100.0)
    renewed = Record("other", "2026-11-23T10:00:02.000000Z", 10.0)
    assert observe(first, renewed, now=108.0) == Observation(renewed, seen_at=108.0)


@pytest.mark.parametrize(
    ("record", "seen_at", "now", "verdict"),
    [
        pytest.param(Record(None, None, 10.0), 0.0, 0.0, Verdict.FREE, id="no holder"),
        pytest.param(Record("me", None, 10.0), 0.0, 50.0, Verdict.OURS, id="ours"),
        pytest.param(OTHER, 100.0, 109.9, Verdict.HELD, id="another's, seen 9.9s unchanged"),
        pytest.param(OTHER, 100.0, 110.0, Verdict.FREE, id="another's, seen 10s unchanged"),
        pytest.param(
            Record("other", "2000-01-01T00:00:00.000000Z", 10.0),
            100.0,
            100.0,
            Verdict.HELD,
            id="a renewTime long past, just seen: the holder's clock is not ours",
        ),
        pytest.param(
            Record("other", "2999-01-01T00:00:00.000000Z", 10.0),
            100.0,
            111.0,
            Verdict.FREE,
            id="a renewTime in the future, unchanged for a duration: expired",
        ),
    ],
)
def test_whose_lease(record: Record, seen_at: float, now: float, verdict: Verdict) -> None:
    assert judge(Observation(record, seen_at), identity="me", now=now) == verdict


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, Record(None, None, 7.0)),
        ({"holderIdentity": "", "leaseDurationSeconds": 0}, Record(None, None, 7.0)),
        ({"holderIdentity": "x", "leaseDurationSeconds": True}, Record("x", None, 7.0)),
        (
            {"holderIdentity": "x", "leaseDurationSeconds": 15, "renewTime": "t"},
            Record("x", "t", 15.0),
        ),
    ],
)
def test_record_of_a_lease(spec: dict[str, object], expected: Record) -> None:
    assert Record.of(spec, default_duration=7.0) == expected


async def test_a_renewal_that_gets_no_answer_ends_at_the_renew_deadline() -> None:
    """An API server that accepts the connection and never answers: the leader gives up
    at its renew deadline (0.2 s here) and stops leading, long before the HTTP client's
    own 30 s timeout would have ended the request."""
    hung: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    kube = Kube(client.ApiClient(configuration))
    elector = LeaderElector(
        kube, namespace="ns", name="l", identity="me", renew_deadline=0.2, retry=0.05
    )
    elector.leading.set()  # as if it had renewed just now
    try:
        await asyncio.wait_for(elector.run(), timeout=HTTP_TIMEOUT / 2)
        assert elector.lost.is_set()
        assert hung, "the renewal reached the server"
    finally:
        server.close()
        await kube.close()


async def test_a_leader_acts_only_within_the_renew_deadline_of_its_last_renewal() -> None:
    """Others may take the lease `duration` after its last renewal: a leader whose loop
    stalled past `renew_deadline` acts no more, even before `run` notices (`lost`)."""
    elector = LeaderElector(
        cast(Kube, None), namespace="ns", name="l", identity="me", renew_deadline=7.0
    )
    now = asyncio.get_running_loop().time()
    assert not elector.still_leading()  # never led
    elector.leading.set()
    elector.renewed = now - 1.0
    assert elector.still_leading()
    elector.renewed = now - 7.0
    assert not elector.still_leading()
    elector.renewed = now
    elector.lost.set()
    assert not elector.still_leading()


async def drain(events: AsyncIterator[object]) -> None:
    async for _ in events:
        pass


async def test_a_watch_that_goes_silent_ends_after_its_idle_time() -> None:
    """A half-open connection (the API server's node lost, a load balancer's idle drop):
    the response started, then nothing, not even a bookmark. The watch ends after its
    idle time (0.2 s here) instead of at the request's end, minutes later."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(HTTP_TIMEOUT)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    kube = Kube(client.ApiClient(configuration))
    try:
        with pytest.raises(aiohttp.ServerTimeoutError):  # the socket's, not the guard's
            await asyncio.wait_for(drain(kube.watch(PODS, resource_version="1", idle=0.2)), 15)
    finally:
        server.close()
        await kube.close()


def test_a_released_lease_names_no_holder_and_keeps_its_transitions() -> None:
    spec = {
        "holderIdentity": "me",
        "leaseDurationSeconds": 10,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:05.000000Z",
        "leaseTransitions": 3,
    }
    given_up = released(spec)
    assert "holderIdentity" not in given_up
    assert given_up["leaseTransitions"] == 3
    record = Record.of(given_up, default_duration=10.0)
    assert judge(Observation(record, 0.0), identity="other", now=0.0) == Verdict.FREE


async def test_a_replica_that_releases_acts_no_more_even_when_the_api_server_is_silent() -> None:
    """Release stops acting first; a Lease it cannot give up in time only expires, and
    the shutdown goes on (no exception)."""
    hung: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    kube = Kube(client.ApiClient(configuration))
    elector = LeaderElector(kube, namespace="ns", name="l", identity="me")
    elector.leading.set()
    elector.renewed = asyncio.get_running_loop().time()
    assert elector.still_leading()
    try:
        assert not await elector.release(timeout=0.2)
        assert not elector.still_leading()
        assert hung, "the release reached the server"
    finally:
        server.close()
        await kube.close()


async def test_slow_renewals_that_each_succeed_keep_the_lease() -> None:
    """Each renewal takes a second (a loaded API server answers each request in half a
    second) and succeeds: the leader keeps leading. The next attempt starts `retry` after
    the start of the last one, so it has what is left of the renew deadline, not that
    less the last attempt's own time (which stepped down a leader whose renewals took a
    third of the deadline)."""
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": "ns", "resourceVersion": "1"},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 10, "leaseTransitions": 0},
    }

    async def slowly(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        if request.method == "PUT":
            lease.update(await request.json())
        return web.json_response(lease)

    app = web.Application()
    app.router.add_route("*", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", slowly)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    kube = Kube(client.ApiClient(configuration))
    elector = LeaderElector(
        kube, namespace="ns", name="l", identity="me", renew_deadline=3.0, retry=1.5
    )
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(elector.run(), timeout=7.0)
        assert elector.leading.is_set()
        assert not elector.lost.is_set()
    finally:
        await kube.close()
        await runner.cleanup()
