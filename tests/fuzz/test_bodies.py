"""What the fuzz tests found in the HTTP layer, kept as plain cases: a body that cannot be
decoded as its Content-Encoding says gets a 400 naming the problem, not a 500 and a
logged traceback."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from contextlib import AsyncExitStack

import pytest
from aiohttp import web

from berth.ledger import Ledger
from extender.app import make_app
from extender.decide import Placement
from tests.fuzz.harness import Client, Crashes, crash_log, running


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Crashes]]:
    async def make(_: AsyncExitStack) -> web.Application:
        return make_app(Ledger(), placement=Placement.SPREAD, ready=lambda: True)

    with crash_log() as crashes, running(make, tmp_path_factory.mktemp("tls")) as http:
        yield http, crashes


@pytest.mark.parametrize(
    ("encoding", "body", "problem"),
    [
        pytest.param(
            "gzip", b"{}", "Can not decode content-encoding: gzip", id="gzip, not gzipped"
        ),
        # aiohttp's parser meets this one before the app does, and answers its own 400.
        pytest.param("deflate", b"\x01", "deflate", id="deflate, not deflated"),
        pytest.param(
            "gzip",
            gzip.compress(b"{}")[:10] + b"\xff" * 64,
            "Can not decode content-encoding: gzip",
            id="gzip, corrupt",
        ),
        pytest.param("br", b"{}", "brotli", id="an encoding aiohttp cannot decode"),
    ],
)
def test_an_undecodable_body_is_refused_with_the_problem(
    server: tuple[Client, Crashes], encoding: str, body: bytes, problem: str
) -> None:
    http, crashes = server
    answer = http.post(
        "/prioritize",
        body,
        {"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    assert answer is not None
    assert answer.status == 400
    assert problem in answer.body.decode()
    assert crashes.take() == []


def test_a_compressed_body_is_read(server: tuple[Client, Crashes]) -> None:
    http, crashes = server
    body = b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["node-0"]}'
    for encoding, compressed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        answer = http.post(
            "/prioritize",
            compressed,
            {"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert answer is not None, encoding
        assert answer.status == 200, encoding
        assert answer.body == b'[{"Host":"node-0","Score":10}]'
    assert crashes.take() == []
