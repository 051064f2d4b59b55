"""A watch's stream, as `Kube.watch` reads it: whole events whatever the reads cut, and
with `gather`, the events of a burst taken in one read. Against a local HTTP server that
writes the stream in the pieces each test chooses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import orjson
import pytest
from kubernetes_asyncio import client

from berth.kube.client import MAX_EVENT, PODS, Kube, Lines

Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def event(name: str, *, padding: int = 0) -> bytes:
    pod = {"metadata": {"name": name, "resourceVersion": "1", "annotations": {"a": "x" * padding}}}
    return orjson.dumps({"type": "ADDED", "object": pod}) + b"\n"


def chunk(data: bytes) -> bytes:
    """One chunk of HTTP/1.1 chunked transfer encoding."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@asynccontextmanager
async def streaming(write: Writer) -> AsyncIterator[Kube]:
    """A client of a server that answers one watch with `write`, then ends the stream."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        await write(writer)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    kube = Kube(client.ApiClient(configuration))
    try:
        yield kube
    finally:
        server.close()
        await kube.close()


def test_lines_come_whole_once_their_newline_has_come() -> None:
    lines = Lines()
    assert lines.feed(b'{"a":1}\n\n{"b"') == [b'{"a":1}']
    assert lines.feed(b":2") == []
    assert lines.feed(b'}\n{"c"') == [b'{"b":2}']
    assert lines.rest() == b'{"c"'


@pytest.mark.parametrize(
    ("start", "last"), [(b"", b"x" * (MAX_EVENT + 1)), (b"{}\n" + b"x" * MAX_EVENT, b"x")]
)
def test_an_event_longer_than_any_object_is_refused_by_name(start: bytes, last: bytes) -> None:
    lines = Lines()
    assert lines.feed(start) == ([b"{}"] if start else [])
    with pytest.raises(ValueError, match="a watch event longer than"):
        lines.feed(last)


async def test_events_come_whole_whatever_pieces_the_stream_is_cut_in() -> None:
    """An event cut across writes, several in one write, and one larger than aiohttp's
    line limit (twice its 256 KiB read buffer): each comes whole, in order."""
    big = event("big", padding=600_000)
    stream = event("a") + event("b") + big + event("c")

    async def write(writer: asyncio.StreamWriter) -> None:
        for start in range(0, len(stream), 7_000):
            writer.write(chunk(stream[start : start + 7_000]))
            await writer.drain()

    async with streaming(write) as kube:
        names = [
            e["object"]["metadata"]["name"]
            async for e in kube.watch(PODS, resource_version="1", gather=0.01)
        ]
    assert names == ["a", "b", "big", "c"]


async def test_with_gather_the_events_of_a_burst_are_taken_in_one_read() -> None:
    """The first event is taken at once; the five written while the connection rests,
    each in a write of its own, are then taken together: no other task of the loop runs
    between them."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def write(writer: asyncio.StreamWriter) -> None:
        writer.write(chunk(event("first")))
        await writer.drain()
        await asyncio.sleep(0.05)
        for index in range(5):
            writer.write(chunk(event(f"burst-{index}")))
            await writer.drain()
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    try:
        async with streaming(write) as kube:
            seen = [
                (e["object"]["metadata"]["name"], ticks)
                async for e in kube.watch(PODS, resource_version="1", gather=1.0)
            ]
    finally:
        ticker.cancel()
    assert [name for name, _ in seen] == ["first", *(f"burst-{i}" for i in range(5))]
    assert len({tick for name, tick in seen if name.startswith("burst")}) == 1
    assert seen[0][1] != seen[1][1]


async def test_a_backlog_is_read_without_resting_between_reads() -> None:
    """4 MiB of events written at once take some 16 reads; resting 2 s after each, as
    after a lone event, would take over 30 s. A large read means more is waiting."""
    stream = b"".join(event(f"p{i}", padding=4_000) for i in range(1_000))

    async def write(writer: asyncio.StreamWriter) -> None:
        writer.write(chunk(stream))
        await writer.drain()

    async with streaming(write) as kube:

        async def names() -> list[str]:
            return [
                e["object"]["metadata"]["name"]
                async for e in kube.watch(PODS, resource_version="1", gather=2.0)
            ]

        seen = await asyncio.wait_for(names(), 30)
    assert seen == [f"p{i}" for i in range(1_000)]
