"""Berth's HTTP/1.1 server (`berth.server`, `berth.web`) fed streams of requests, good and
bad, cut into pieces at random places, over a real local socket.

Whatever comes, and however it is cut: every request is answered in order with the status
it calls for, an answer that closes the connection is the last, nothing is logged with a
traceback, and once the client is gone the server holds nothing for it (no connection,
no body counted as still arriving).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from berth import web
from berth.server import SMALL_BODY, Limits, _Connection, _Site, listening
from tests.fuzz.harness import Crashes
from tests.fuzz.settings import CASES, FUZZ

TIMEOUT = 10.0
"""Seconds a read waits: far beyond any answer here, short of a hang."""


@dataclass(frozen=True)
class Sent:
    """A request as bytes, and what the server must answer it."""

    data: bytes
    status: int
    closes: bool | None
    """The answer closes the connection (True), keeps it (False), or either (None: a
    refused request whose body may or may not be whole when its head is read)."""
    body: bytes | None = None
    """The answer's body, when known."""
    version: str = "HTTP/1.1"


def _head(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@st.composite
def good(draw: st.DrawFn) -> Sent:
    """A POST the echo route serves, in any of the forms a client may send."""
    body = draw(
        st.one_of(
            st.binary(max_size=300),
            # Large enough to count against what all clients may hold while it arrives.
            st.integers(SMALL_BODY + 1, 3 * SMALL_BODY).map(lambda size: b"x" * size),
        )
    )
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0"]))
    connection = draw(st.sampled_from([None, "keep-alive", "close", "Keep-Alive, foo"]))
    lines = [
        f"POST /echo {version}",
        draw(st.sampled_from(["Content-Type: application/json", "content-type:application/JSON"])),
        f"{draw(st.sampled_from(['Content-Length', 'content-length']))}: {len(body)}",
    ]
    if connection is not None:
        lines.append(f"Connection: {connection}")
    if draw(st.booleans()):
        lines.append("Expect: 100-continue")
    kept = (
        "keep-alive" in (connection or "").lower()
        if version == "HTTP/1.0"
        else (connection != "close")
    )
    return Sent(_head(lines) + body, 200, closes=not kept, body=body, version=version)


@st.composite
def turned_away(draw: st.DrawFn) -> Sent:
    """A request the guard refuses from its head: with no body the connection is kept; with
    one it is kept only if the whole body is there when the head is read."""
    body = draw(st.sampled_from([b"", b"{}", b"x" * 200]))
    path, content_type, status = draw(
        st.sampled_from(
            [
                ("/nowhere", "application/json", 404),
                ("/echo", "text/plain", 415),
                ("/echo", "application/json; charset=utf-8", None),
            ]
        )
    )
    lines = [
        f"POST {path} HTTP/1.1",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    if status is None:  # a parameter of the type is fine: served
        return Sent(_head(lines) + body, 200, closes=False, body=body)
    return Sent(_head(lines) + body, status, closes=False if not body else None)


BROKEN = [
    (b"GET\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", 413),
    (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
    (b"POST /echo HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
    (b"POST /echo HTTP/2.0\r\n\r\n", 400),
]


@st.composite
def broken(draw: st.DrawFn) -> Sent:
    """A request that cannot be read: answered with the problem, then the connection closes."""
    if draw(st.booleans()):
        data, status = draw(st.sampled_from(BROKEN))
        return Sent(data, status, closes=True)
    # Bytes with no space in their first line are no request line.
    junk = draw(st.binary(min_size=1, max_size=200).filter(lambda b: b" " not in b))
    return Sent(junk.replace(b"\r\n\r\n", b"") + b"\r\n\r\n", 400, closes=True)


def _until_the_client_closes(requests: list[Sent]) -> list[Sent]:
    """A client that asked for its connection to close sends nothing after that request
    (RFC 9112, 9.6)."""
    for at, request in enumerate(requests):
        if request.status == 200 and request.closes:
            return requests[: at + 1]
    return requests


streams = st.lists(st.one_of(good(), good(), turned_away(), broken()), min_size=1, max_size=6).map(
    _until_the_client_closes
)


@contextmanager
def crashes_caught() -> Iterator[Crashes]:
    crashes = Crashes()
    logger = logging.getLogger("berth")
    logger.addHandler(crashes)
    try:
        yield crashes
    finally:
        logger.removeHandler(crashes)


class Echo:
    def app(self) -> web.App:
        app = web.App()
        app.post("/echo", self.echo)
        app.post("/later", self.later)
        return app

    def echo(self, request: web.Request) -> web.Response:
        return web.Response(body=request.body, content_type="application/json")

    async def later(self, request: web.Request) -> web.Response:
        await asyncio.sleep(0)
        return self.echo(request)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """The next final answer (interim 100 Continue skipped)."""
    while True:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
        status = int(status_line.split()[1])
        if status != 100:
            break
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


class Watched:
    """The server's end of one connection, watched: the bytes it has taken in, and
    whether what it counts against `Limits.max_pending_bytes` was right after each read
    (the bytes of a large body in its buffer while it arrives, nothing otherwise)."""

    def __init__(self, site: _Site, connection: _Connection) -> None:
        self.site, self.connection = site, connection
        self.received = 0
        self.wrong: list[str] = []
        taken_in = connection.data_received

        def data_received(data: bytes) -> None:
            self.received += len(data)
            taken_in(data)
            self.check()

        connection.data_received = data_received  # type: ignore[method-assign]

    def check(self) -> None:
        c = self.connection
        reading_large = c.head is not None and c.head.length > SMALL_BODY and not c.closing
        expected = len(c.buffer) if reading_large else 0
        if c.pending != expected:
            self.wrong.append(f"counted {c.pending} bytes, not {expected}")
        if self.site.pending != sum(other.pending for other in self.site.connections):
            self.wrong.append(f"the site counts {self.site.pending}")
        if self.site.pending > self.site.limits.max_pending_bytes:
            self.wrong.append(f"{self.site.pending} bytes counted, over the limit")

    def gone(self) -> bool:
        return self.connection.closing or self.connection not in self.site.connections


async def _soon(condition: Callable[[], bool]) -> None:
    """Let the loop run until `condition` holds (a local socket: moments)."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, "not within the timeout"
        await asyncio.sleep(0)


async def _connect(site: _Site) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Watched]:
    known = set(site.connections)
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    await _soon(lambda: bool(site.connections - known))
    [connection] = site.connections - known
    return reader, writer, Watched(site, connection)


async def _send(writer: asyncio.StreamWriter, watched: Watched, piece: bytes) -> bool:
    """Send `piece` and wait until the server has read it (False: it closed meanwhile)."""
    target = watched.received + len(piece)
    try:
        writer.write(piece)
        await writer.drain()
    except ConnectionError:
        return False  # the server closed after a request it could not read
    await _soon(lambda: watched.received >= target or watched.gone())
    return not watched.gone()


async def _left_nothing(site: _Site) -> None:
    await _soon(lambda: not site.connections)
    assert site.pending == 0


async def _exchange(requests: list[Sent], cuts: list[int], path: str) -> None:
    data = b"".join(r.data.replace(b"/echo", path.encode(), 1) for r in requests)
    async with listening(Echo().app(), host="127.0.0.1", port=0, limits=Limits()) as site:
        reader, writer, watched = await _connect(site)
        start = 0
        for cut in sorted({c % (len(data) + 1) for c in cuts} | {len(data)}):
            if not await _send(writer, watched, data[start:cut]):
                break
            start = cut
        for request in requests:
            status, headers, body = await _answer(reader)
            assert status == request.status, (request, status, body[:200])
            if request.body is not None:
                assert body == request.body
            said = headers.get("connection", "").lower()
            if request.closes is not None:
                assert (said == "close") == request.closes, (request, headers)
            if request.version == "HTTP/1.0" and said != "close":
                assert said == "keep-alive", headers
            if said == "close":
                assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
                break
        writer.close()
        await _left_nothing(site)
        assert watched.wrong == []


@settings(FUZZ, max_examples=max(1, CASES // 4))
@given(
    requests=streams,
    cuts=st.lists(st.integers(min_value=0, max_value=4 * SMALL_BODY), max_size=8),
    path=st.sampled_from(["/echo", "/later"]),
)
def test_any_stream_of_requests_cut_anywhere_is_answered_in_order(
    requests: list[Sent], cuts: list[int], path: str
) -> None:
    with crashes_caught() as crashes:
        asyncio.run(_exchange(requests, cuts, path))
    assert crashes.take() == []


BUDGET = 4 * SMALL_BODY
"""What all clients may hold of large bodies in the test below: less than its clients send."""


async def _race(sizes: list[int], pieces: int) -> None:
    async with listening(
        Echo().app(), host="127.0.0.1", port=0, limits=Limits(max_pending_bytes=BUDGET)
    ) as site:
        clients = [await _connect(site) for _ in sizes]
        bodies = [b'"' + bytes([ord("a") + i]) * (size - 2) + b'"' for i, size in enumerate(sizes)]
        requests = [post_echo(body) for body in bodies]
        step = [-(-len(r) // pieces) for r in requests]
        # Piece k of every client before piece k + 1 of any: their bodies arrive together.
        for k in range(pieces):
            for (_, writer, watched), request, size in zip(clients, requests, step, strict=True):
                piece = request[k * size : (k + 1) * size]
                if piece and not watched.gone():
                    await _send(writer, watched, piece)
        statuses = []
        for (reader, writer, watched), body in zip(clients, bodies, strict=True):
            status, headers, answered = await _answer(reader)
            statuses.append(status)
            if status == 200:
                assert answered == body
            else:
                assert (status, headers["retry-after"], headers["connection"]) == (
                    503,
                    "1",
                    "close",
                )
            writer.close()
            assert watched.wrong == []
        # Each refusal gives its bytes back, so the last body standing always fits.
        assert 200 in statuses
        await _left_nothing(site)


def post_echo(body: bytes) -> bytes:
    return (
        _head(
            [
                "POST /echo HTTP/1.1",
                "Content-Type: application/json",
                f"Content-Length: {len(body)}",
            ]
        )
        + body
    )


@settings(FUZZ, max_examples=max(1, CASES // 20))
@given(
    sizes=st.lists(st.integers(SMALL_BODY + 1, 3 * SMALL_BODY), min_size=2, max_size=5),
    pieces=st.integers(1, 6),
)
def test_large_bodies_arriving_together_are_served_or_refused_within_the_budget(
    sizes: list[int], pieces: int
) -> None:
    with crashes_caught() as crashes:
        asyncio.run(_race(sizes, pieces))
    assert crashes.take() == []
