"""How `berth.server` reads requests off a connection and answers them, over a real local
socket (plain HTTP: TLS, the deadlines and the connection cap are tests/e2e/test_serving.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from berth import tls, web
from berth.server import AT_ONCE, Limits, Tls, _Site, listening

BIG = 32 * 1024 * 1024
"""An answer larger than any socket's buffers."""


class Echo:
    """An app that answers a POST with its body, and counts what it served."""

    def __init__(self) -> None:
        self.served = 0
        self.release = asyncio.Event()
        self.release.set()
        self.delivered: list[str] = []
        self.tasks: list[asyncio.Task[object] | None] = []

    def app(self) -> web.App:
        app = web.App()
        app.post("/echo", self.echo)
        app.post("/slow", self.slow)
        app.post("/deliver", self.deliver)
        app.get("/fail", self.fail)
        app.get("/big", self.big)
        app.post("/quick", self.quick)
        return app

    def quick(self, request: web.Request) -> web.Response:
        self.tasks.append(asyncio.current_task())
        return web.Response(body=request.body, content_type="application/json")

    async def big(self, _: web.Request) -> web.Response:
        return web.Response(body=b"x" * BIG)

    async def echo(self, request: web.Request) -> web.Response:
        self.served += 1
        return web.Response(body=request.body, content_type="application/json")

    async def slow(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return await self.echo(request)

    async def deliver(self, request: web.Request) -> web.Response:
        await self.release.wait()
        response = web.text("sent early")
        try:
            await request.deliver(response)
        except ConnectionError as error:
            self.delivered.append(f"failed: {error}")
        else:
            self.delivered.append("sent")
        return response

    async def fail(self, _: web.Request) -> web.Response:
        raise RuntimeError("a bug")


@pytest.fixture
async def echo() -> AsyncIterator[tuple[Echo, int]]:
    served = Echo()
    async with listening(served.app(), host="127.0.0.1", port=0, limits=Limits()) as site:
        yield served, site.port


@pytest.fixture
async def site() -> AsyncIterator[tuple[Echo, _Site]]:
    served = Echo()
    async with listening(served.app(), host="127.0.0.1", port=0) as listened:
        yield served, listened


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), 5) == b""


async def test_requests_on_one_connection_are_answered_in_order(echo: tuple[Echo, int]) -> None:
    served, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/echo", b'{"n":1}'))
    assert await answer(reader) == (200, answer_headers(7), b'{"n":1}')
    # Two at once, the second cut in the middle of its head.
    both = post("/echo", b'{"n":2}') + post("/echo", b'{"n":3}')
    writer.write(both[:40])
    await writer.drain()
    writer.write(both[40:])
    assert (await answer(reader))[2] == b'{"n":2}'
    assert (await answer(reader))[2] == b'{"n":3}'
    assert served.served == 3
    writer.close()


def answer_headers(length: int) -> dict[str, str]:
    return {"content-type": "application/json", "content-length": str(length)}


async def test_a_client_that_says_close_is_answered_then_closed(echo: tuple[Echo, int]) -> None:
    _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/echo", b"{}", "Connection: close"))
    status, headers, _ = await answer(reader)
    assert (status, headers["connection"]) == (200, "close")
    assert await closed(reader)
    writer.close()


async def test_a_client_that_expects_continue_is_told_to(echo: tuple[Echo, int]) -> None:
    _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = post("/echo", b'{"a":1}', "Expect: 100-continue")
    head, _, body = request.partition(b"\r\n\r\n")
    writer.write(head + b"\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == web.CONTINUE
    writer.write(body)
    assert (await answer(reader))[2] == b'{"a":1}'
    writer.close()


async def test_a_request_that_cannot_be_read_is_answered_with_the_problem_then_closed(
    echo: tuple[Echo, int], caplog: pytest.LogCaptureFixture
) -> None:
    served, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    with caplog.at_level(logging.WARNING, logger="berth.server"):
        writer.write(b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")
        status, headers, body = await answer(reader)
        assert await closed(reader)
    assert (status, headers["connection"]) == (411, "close")
    assert b"Content-Length" in body
    assert served.served == 0
    [record] = caplog.records
    assert record.getMessage().startswith("refused a request that cannot be parsed: send the")
    assert record.exc_info is None
    writer.close()


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (b"GET /echo HTTP/1.1\r\n\r\n", 405),
        (b"GET /nowhere HTTP/1.1\r\n\r\n", 404),
        (post("/echo", b"{}", "Content-Encoding: br"), 415),
        (post("/echo", b"{}").replace(b"application/json", b"text/plain"), 415),
    ],
)
async def test_a_request_not_served_is_answered_and_the_connection_kept(
    echo: tuple[Echo, int], request_: bytes, status: int
) -> None:
    served, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_)
    assert (await answer(reader))[0] == status
    writer.write(post("/echo", b"{}"))
    assert (await answer(reader))[0] == 200
    assert served.served == 1
    writer.close()


async def test_a_handler_that_fails_is_a_500_logged_with_its_traceback(
    echo: tuple[Echo, int], caplog: pytest.LogCaptureFixture
) -> None:
    _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    with caplog.at_level(logging.ERROR, logger="berth.server"):
        writer.write(b"GET /fail HTTP/1.1\r\n\r\n")
        assert (await answer(reader))[0] == 500
    [record] = caplog.records
    assert record.exc_info is not None
    assert "GET /fail" in record.getMessage()
    writer.close()


async def test_an_answer_delivered_early_is_sent_once(echo: tuple[Echo, int]) -> None:
    served, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/deliver", b"{}") + post("/echo", b"{}"))
    assert (await answer(reader))[2] == b"sent early"
    assert (await answer(reader))[2] == b"{}"
    assert served.delivered == ["sent"]
    writer.close()


async def test_an_answer_to_a_client_gone_cannot_be_delivered() -> None:
    served = Echo()
    served.release.clear()
    async with listening(served.app(), host="127.0.0.1", port=0) as site:
        _, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(post("/deliver", b"{}"))
        await writer.drain()
        await until(lambda: any(c.serving for c in site.connections))
        writer.close()
        await writer.wait_closed()
        await until(lambda: not site.connections)  # the server saw the connection end
        served.release.set()
        await until(lambda: bool(served.delivered))
    assert served.delivered == ["failed: the client closed the connection"]


async def until(condition: Callable[[], bool]) -> None:
    """Look at the server's state (in this process) until `condition` holds, for 5 s."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not within 5 s")


async def test_a_stopping_server_answers_the_request_in_flight() -> None:
    served = Echo()
    served.release.clear()
    async with listening(served.app(), host="127.0.0.1", port=0) as site:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(post("/slow", b'{"late":1}'))
        await writer.drain()
        await until(lambda: any(c.serving for c in site.connections))
        asyncio.get_running_loop().call_later(0.1, served.release.set)
    # Left the block: the server stopped, after answering (and saying it closes).
    status, headers, body = await answer(reader)
    assert (status, headers["connection"], body) == (200, "close", b'{"late":1}')
    assert await closed(reader)
    writer.close()


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (post("/echo", b"{" * 100_000).replace(b"application/json", b"text/plain"), 415),
        (post("/nowhere", b"{" * 100_000), 404),
        (post("/echo", b"{" * 100_000, "Expect: something"), 417),
    ],
)
async def test_a_request_refused_by_its_head_is_answered_before_its_body_is_read(
    site: tuple[Echo, _Site], request_: bytes, status: int
) -> None:
    served, listened = site
    reader, writer = await asyncio.open_connection("127.0.0.1", listened.port)
    head, _, body = request_.partition(b"\r\n\r\n")
    writer.write(head + b"\r\n\r\n" + body[:10])  # the rest of the body never comes
    got, headers, _ = await answer(reader)
    assert (got, headers["connection"]) == (status, "close")
    assert await closed(reader)  # the server wrote its end, and drops what comes
    assert served.served == 0
    writer.close()


async def test_head_is_answered_without_a_body(echo: tuple[Echo, int]) -> None:
    _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"HEAD /big HTTP/1.1\r\n\r\n" + post("/echo", b"{}"))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert f"Content-Length: {BIG}".encode() in head
    assert (await answer(reader))[2] == b"{}"  # the next answer follows at once
    writer.close()


async def test_a_client_that_does_not_read_is_not_read_from(site: tuple[Echo, _Site]) -> None:
    served, listened = site
    reader, writer = await asyncio.open_connection("127.0.0.1", listened.port)
    writer.write(b"GET /big HTTP/1.1\r\n\r\n" + post("/echo", b"{}"))
    await until(lambda: any(not c.writable.is_set() for c in listened.connections))
    assert served.served == 0  # the request after the unread answer waits
    assert (await answer(reader))[2] == b"x" * BIG
    assert (await answer(reader))[2] == b"{}"
    assert served.served == 1
    writer.close()


async def test_a_request_turned_away_leaves_its_connection_the_idle_deadline() -> None:
    """After a refusal that keeps the connection (404, the body read), the next request
    may come within the idle deadline, as after an answer: not within what was left of
    the refused request's header deadline."""
    limits = Limits(header_timeout=1.0, idle_timeout=60.0)
    async with listening(Echo().app(), host="127.0.0.1", port=0, limits=limits) as listened:
        reader, writer = await asyncio.open_connection("127.0.0.1", listened.port)
        writer.write(post("/nowhere", b"{}"))
        assert (await answer(reader))[0] == 404
        [connection] = listened.connections
        assert connection.deadline is not None
        assert connection.deadline - asyncio.get_running_loop().time() > 30
        writer.write(post("/echo", b"{}"))
        assert (await answer(reader))[0] == 200
        writer.close()


async def test_a_stopping_server_closes_idle_connections() -> None:
    served = Echo()
    async with listening(served.app(), host="127.0.0.1", port=0) as listened:
        reader, writer = await asyncio.open_connection("127.0.0.1", listened.port)
        writer.write(post("/echo", b"{}"))
        assert (await answer(reader))[0] == 200
    assert await closed(reader)
    writer.close()


async def test_a_handler_that_answers_at_once_is_answered_without_a_task(
    echo: tuple[Echo, int],
) -> None:
    served, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/quick", b"{}") + post("/quick", b"[]"))
    assert (await answer(reader))[2] == b"{}"
    assert (await answer(reader))[2] == b"[]"
    assert served.tasks == [None, None]  # called from the protocol, as the bytes came
    writer.close()


async def test_large_bodies_past_what_all_clients_may_hold_are_refused_small_ones_never(
    caplog: pytest.LogCaptureFixture,
) -> None:
    served = Echo()
    kib = 1024
    limits = Limits(max_pending_bytes=256 * kib)
    async with listening(served.app(), host="127.0.0.1", port=0, limits=limits) as listened:
        first = await asyncio.open_connection("127.0.0.1", listened.port)
        large = post("/echo", b'"' + b"x" * (250 * kib - 2) + b'"')
        first[1].write(large[: -50 * kib])  # 200 KiB of its body
        await until(lambda: listened.pending == 200 * kib)

        # Another large body would take the count past the limit as it arrives.
        second = await asyncio.open_connection("127.0.0.1", listened.port)
        other = post("/echo", b'"' + b"y" * (100 * kib - 2) + b'"')
        with caplog.at_level(logging.WARNING, logger="berth.server"):
            second[1].write(other[: -50 * kib])
            await until(lambda: listened.pending == 250 * kib)
            second[1].write(other[-50 * kib :])
            status, headers, body = await answer(second[0])
        assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
        assert b"too many request bodies" in body
        assert await closed(second[0])
        assert "--max-pending-bytes" in caplog.text
        await until(lambda: listened.pending == 200 * kib)  # the refused one's bytes gone

        # A small body is not counted, and never refused for it, however it arrives.
        third = await asyncio.open_connection("127.0.0.1", listened.port)
        small = post("/echo", b'"' + b"z" * 998 + b'"')
        third[1].write(small[:-500])
        await until(lambda: any(c.head is not None for c in listened.connections if c.pending == 0))
        third[1].write(small[-500:])
        assert (await answer(third[0]))[0] == 200

        first[1].write(large[-50 * kib :])
        assert (await answer(first[0]))[0] == 200
        assert listened.pending == 0

        # A client gone before its body is in gives its share back.
        fourth = await asyncio.open_connection("127.0.0.1", listened.port)
        fourth[1].write(large[: -50 * kib])
        await until(lambda: listened.pending == 200 * kib)
        fourth[1].close()
        await until(lambda: listened.pending == 0)
        for _, writer in (first, second, third):
            writer.close()
    assert served.served == 2


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_body_on_a_get_or_head_is_refused_before_it_is_read(
    echo: tuple[Echo, int], method: str
) -> None:
    _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} /big HTTP/1.1\r\nContent-Length: 8000000\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"Connection: close" in head
    rest = await asyncio.wait_for(reader.read(), 5)
    assert rest == (b"" if method == "HEAD" else f"a {method} request carries no body".encode())
    writer.close()


async def test_an_http_1_0_client_that_asks_to_be_kept_is_kept(echo: tuple[Echo, int]) -> None:
    _, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = post("/echo", b"{}", "Connection: keep-alive").replace(b"HTTP/1.1", b"HTTP/1.0")
    for _ in range(2):
        writer.write(request)
        status, headers, _ = await answer(reader)
        assert (status, headers["connection"]) == (200, "keep-alive")
    writer.write(request.replace(b"Connection: keep-alive", b"X-Other: 1"))
    assert (await answer(reader))[1]["connection"] == "close"
    assert await closed(reader)
    writer.close()


async def unread_refusals(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that sends request after request the server turns away (404, the
    connection kept) and reads none of the answers, from a socket with a small receive
    buffer: the server's answers back up on it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


NOWHERE = b"GET /nowhere HTTP/1.1\r\n\r\n"


async def test_a_client_that_does_not_read_its_refusals_is_not_read_from() -> None:
    """Refusals the client does not read stop the server reading it (the connection
    paused, under the body deadline) rather than piling up in the server's memory; once
    it reads them, the connection goes on."""
    async with listening(Echo().app(), host="127.0.0.1", port=0) as listened:
        reader, writer = await unread_refusals(listened.port)
        sending = asyncio.ensure_future(_send_until_blocked(writer))
        await until(lambda: any(not c.writable.is_set() for c in listened.connections))
        [connection] = listened.connections
        assert connection.paused
        assert connection.deadline is not None
        assert connection.deadline - asyncio.get_running_loop().time() <= Limits().body_timeout
        read = 0
        while not sending.done() or read < sending.result():
            assert (await answer(reader))[0] == 404
            read += 1
        writer.write(post("/echo", b'{"after":1}'))
        assert await answer(reader) == (200, answer_headers(11), b'{"after":1}')
        writer.close()


async def _send_until_blocked(writer: asyncio.StreamWriter, limit: int = 200_000) -> int:
    """Send refused requests until the server stops taking them (or `limit`), then a
    last batch that waits; the number sent."""
    sent = 0
    while sent < limit:
        writer.write(NOWHERE * 100)
        sent += 100
        try:
            await asyncio.wait_for(writer.drain(), 0.5)
        except TimeoutError:
            await writer.drain()
            break
    return sent


async def test_a_client_that_never_reads_its_refusals_is_dropped_at_the_body_deadline() -> None:
    limits = Limits(body_timeout=0.5)
    async with listening(Echo().app(), host="127.0.0.1", port=0, limits=limits) as listened:
        _, writer = await unread_refusals(listened.port)
        sending = asyncio.ensure_future(_send_until_blocked(writer))
        await until(lambda: any(not c.writable.is_set() for c in listened.connections))
        await until(lambda: not listened.connections)
        sending.cancel()
        writer.close()


async def test_pipelined_requests_answered_at_once_leave_the_loop_its_turns(
    echo: tuple[Echo, int],
) -> None:
    """Thousands of requests a handler answers at once, sent in one write, are served
    `AT_ONCE` per turn of the loop: the other connections, probes and reviews are not
    held up behind them."""
    served, port = echo
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    seen: list[int] = []

    async def sample() -> None:
        while True:
            seen.append(len(served.tasks))
            await asyncio.sleep(0)

    sampler = asyncio.ensure_future(sample())
    writer.write(post("/quick", b"{}") * 300)
    for _ in range(300):
        assert (await answer(reader))[0] == 200
    sampler.cancel()
    assert len(served.tasks) == 300
    assert max(b - a for a, b in itertools.pairwise(seen)) <= AT_ONCE
    writer.close()


@pytest.mark.parametrize("secure", [False, True], ids=["http", "https"])
async def test_a_client_reading_a_large_answer_slowly_is_not_dropped(
    secure: bool, tmp_path: Path
) -> None:
    """The deadline while an answer waits for its reader is pushed back whenever the
    client has read some of it: only one that reads nothing for that long is dropped.
    Over TLS too, where asyncio hands a whole answer to the socket's transport at once."""
    limits = Limits(body_timeout=0.5, idle_timeout=0.5)
    served = Echo()
    serving, client = served_over_tls(tmp_path) if secure else (None, None)
    async with listening(
        served.app(), host="127.0.0.1", port=0, limits=limits, tls=serving
    ) as listened:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", listened.port, limit=2**16, ssl=client
        )
        writer.write(b"GET /big HTTP/1.1\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b" 200 " in head
        got = 0
        started = asyncio.get_running_loop().time()
        while got < BIG:
            chunk = await asyncio.wait_for(reader.read(2 * 1024 * 1024), 5)
            assert chunk, f"dropped after {got} of {BIG} bytes"
            got += len(chunk)
            await asyncio.sleep(0.02)
        assert asyncio.get_running_loop().time() - started > limits.body_timeout
        writer.close()


def served_over_tls(directory: Path) -> tuple[Tls, ssl.SSLContext]:
    """A serving certificate for 127.0.0.1 written to `directory`, and a client context
    that trusts its CA."""
    ca = tls.make_ca("exchange-ca")
    pair = tls.issue(ca, common_name="127.0.0.1", ip_addresses=("127.0.0.1",))
    cert, key = directory / "tls.crt", directory / "tls.key"
    pair.write(cert_path=cert, key_path=key)
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    return Tls(cert, key), client


def _closes_first_and_stops_reading(
    port: int, context: ssl.SSLContext, done: threading.Event
) -> None:
    """A TLS client that asks for a large answer and a last one (`Connection: close`),
    then sends its close_notify and never reads again."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_client = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    while True:
        try:
            tls_client.do_handshake()
            break
        except ssl.SSLWantReadError:
            sock.sendall(outgoing.read())
            incoming.write(sock.recv(65536))
    sock.sendall(outgoing.read())
    tls_client.write(b"GET /big HTTP/1.1\r\n\r\n" + post("/slow", b"{}", "Connection: close"))
    sock.sendall(outgoing.read())
    time.sleep(0.5)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls_client.unwrap()
    sock.sendall(outgoing.read())
    done.wait(20)
    sock.close()


async def test_a_tls_client_that_closes_first_is_dropped_and_the_sweeps_go_on(
    tmp_path: Path,
) -> None:
    """Its transport is closing when the server closes it after the last answer: looking
    at what it still has to send must not end the sweeper, which keeps every deadline."""
    limits = Limits(header_timeout=5, body_timeout=1.0, idle_timeout=1.0)
    served = Echo()
    served.release.clear()
    serving, context = served_over_tls(tmp_path)
    done = threading.Event()
    async with listening(
        served.app(), host="127.0.0.1", port=0, limits=limits, tls=serving
    ) as listened:
        client = threading.Thread(
            target=_closes_first_and_stops_reading, args=(listened.port, context, done)
        )
        [sweeping] = [
            task
            for task in asyncio.all_tasks()
            if getattr(task.get_coro(), "__qualname__", "") == "_Site.sweep"
        ]
        client.start()
        try:
            await until(lambda: bool(listened.connections))
            await asyncio.sleep(1.0)
            served.release.set()  # the last answer: the server closes
            await until_within(lambda: not listened.connections, seconds=10)
            assert not sweeping.done()
        finally:
            done.set()
            await asyncio.to_thread(client.join)


async def until_within(condition: Callable[[], bool], *, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, f"not within {seconds} s"
        await asyncio.sleep(0.05)
