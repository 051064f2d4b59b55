"""A webhook and an extender that do nothing, as fast as Python serves: the floor rows.

The API server pays for calling a webhook whatever answers it: the AdmissionReview it
builds and encodes, the HTTPS round trip, the answer it decodes; kube-scheduler likewise
for an extender. This server answers every review "allowed, no patch" and every
extender filter "all the nodes sent pass" straight from asyncio's TLS transport (no HTTP
library, no work), so a row measured against it shows what being called costs on this
machine; Berth cannot cost less. It counts the requests it answered (`GET /count`).

    python -m bench.nullhook --port PORT --cert FILE --key FILE

Only for the bench: it trusts its client, reads Content-Length bodies only, and has
none of the limits of `berth.server`.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import orjson

from bench.cluster import Bench, wait_for
from devtools.processes import free_port

HEADERS_END = b"\r\n\r\n"


class Reviews(asyncio.Protocol):
    count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (request := self.next_request()) is not None:
            head, body = request
            self.transport.write(self.answer(head, body))

    def next_request(self) -> tuple[bytes, bytes] | None:
        head, found, rest = self.buffer.partition(HEADERS_END)
        if not found:
            return None
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(rest) < length:
            return None
        self.buffer = rest[length:]
        return head, rest[:length]

    def answer(self, head: bytes, body: bytes) -> bytes:
        if head.startswith(b"GET /count"):
            content = str(Reviews.count).encode()
        elif head.startswith(b"POST /filter"):
            Reviews.count += 1
            names = orjson.loads(body).get("NodeNames")
            content = orjson.dumps(
                {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}}
            )
        else:
            Reviews.count += 1
            uid = orjson.loads(body)["request"]["uid"]
            content = orjson.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {"uid": uid, "allowed": True},
                }
            )
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(content), content)
        )


async def serve(port: int, cert: str, key: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = await asyncio.get_running_loop().create_server(Reviews, "127.0.0.1", port, ssl=context)
    await server.serve_forever()


@dataclass(frozen=True)
class Running:
    url: str
    """`https://127.0.0.1:PORT`: add `/mutate-pod`, or use as an extender's urlPrefix."""
    count: Callable[[], Awaitable[float]]
    """Requests answered so far (webhook reviews and extender filters)."""
    pid: int


@asynccontextmanager
async def running(bench: Bench) -> AsyncIterator[Running]:
    """This server in a process of its own, on the cluster's serving certificate."""
    port = free_port()
    cert, key = bench.cluster.serving_files
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.nullhook", f"--port={port}", f"--cert={cert}", f"--key={key}"
    )
    url = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(bench.cluster.serving_ca))

    async def count() -> float:
        async with bench.api.session.get(f"{url}/count", ssl=context) as answer:
            return float(await answer.text())

    async def answers() -> bool:
        try:
            await count()
        except OSError:
            return False
        return True

    try:
        await wait_for(answers, what="the server that answers at once to listen")
        yield Running(url, count, process.pid)
    finally:
        process.terminate()
        await process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.cert, args.key))


if __name__ == "__main__":
    main()
