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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from berth import web
from berth.server import Limits, listening
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


def _head(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@st.composite
def good(draw: st.DrawFn) -> Sent:
    """A POST the echo route serves, in any of the forms a client may send."""
    body = draw(st.binary(max_size=300))
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
    return Sent(_head(lines) + body, 200, closes=not kept, body=body)


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


async def _exchange(requests: list[Sent], cuts: list[int], path: str) -> None:
    data = b"".join(r.data.replace(b"/echo", path.encode(), 1) for r in requests)
    async with listening(Echo().app(), host="127.0.0.1", port=0, limits=Limits()) as site:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        start = 0
        for cut in sorted({c % (len(data) + 1) for c in cuts} | {len(data)}):
            try:
                writer.write(data[start:cut])
                await writer.drain()
            except ConnectionError:
                break  # the server closed after a request it could not read
            await asyncio.sleep(0)  # the server reads what came, before the next piece
            start = cut
        for request in requests:
            status, headers, body = await _answer(reader)
            assert status == request.status, (request, status, body)
            if request.body is not None:
                assert body == request.body
            closes = headers.get("connection", "").lower() == "close"
            if request.closes is not None:
                assert closes == request.closes, (request, headers)
            if closes:
                assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
                break
        writer.close()
        for _ in range(1000):  # the server sees the client go within moments
            if not site.connections:
                break
            await asyncio.sleep(0.005)
        assert not site.connections
        assert site.pending == 0


@settings(FUZZ, max_examples=max(1, CASES // 4))
@given(
    requests=streams,
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
    path=st.sampled_from(["/echo", "/later"]),
)
def test_any_stream_of_requests_cut_anywhere_is_answered_in_order(
    requests: list[Sent], cuts: list[int], path: str
) -> None:
    with crashes_caught() as crashes:
        asyncio.run(_exchange(requests, cuts, path))
    assert crashes.take() == []
