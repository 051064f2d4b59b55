"""How a request's head is read, an answer written, a body decoded and a route found
(`berth.web`)."""

from __future__ import annotations

import gzip
from typing import Any

import pytest

from berth import web


def test_a_request_head_is_read() -> None:
    head = web.parse_head(
        b"POST /filter?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        b"Content-Length: 12\r\nX-Many: a\r\nx-many: b\r\nX-Tab: a\tb"
    )
    assert (head.method, head.path, head.query, head.version) == (
        "POST",
        "/filter",
        "x=1",
        "HTTP/1.1",
    )
    assert head.length == 12
    assert head.headers["x-many"] == "a, b"
    assert head.headers["x-tab"] == "a\tb"
    assert head.keep_alive


@pytest.mark.parametrize(
    ("raw", "status", "problem"),
    [
        pytest.param(b"", 400, "is not 'METHOD /path HTTP/1.1'", id="empty"),
        pytest.param(b"GET /  HTTP/1.1", 400, "is not 'METHOD /path", id="two spaces"),
        pytest.param(b"G(T / HTTP/1.1", 400, "is not a token", id="method"),
        pytest.param(b"GET http://a/ HTTP/1.1", 400, "is not a path", id="absolute form"),
        pytest.param(b"GET /\x7f HTTP/1.1", 400, "is not a path", id="control in path"),
        pytest.param(b"GET / HTTP/2.0", 400, "send HTTP/1.1", id="version"),
        pytest.param(b"GET / HTTP/1.1\r\nNo colon", 400, "is not 'Name: value'", id="no colon"),
        pytest.param(b"GET / HTTP/1.1\r\n Folded: x", 400, "is not 'Name: value'", id="fold"),
        pytest.param(b"GET / HTTP/1.1\r\nA B: x", 400, "is not 'Name: value'", id="name"),
        pytest.param(b"GET / HTTP/1.1\r\nX: a\x00b", 400, "control character", id="NUL"),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2",
            400,
            "is not a number of bytes",
            id="two lengths",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: -1", 400, "not a number of bytes", id="negative"
        ),
        pytest.param(
            "POST / HTTP/1.1\r\nContent-Length: \u0661".encode(),
            400,
            "not a number of bytes",
            id="another script's digit",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: 5\xa0",
            400,
            "not a number of bytes",
            id="a space that is not HTTP's",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", 411, "Content-Length", id="chunked"
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: %d" % (web.MAX_BODY + 1),
            413,
            "over",
            id="too large",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: " + b"9" * 5000, 413, "over", id="5,000 digits"
        ),
        pytest.param(
            b"GET / HTTP/1.1" + b"\r\nX: y" * (web.MAX_HEADERS + 1), 431, "headers", id="many"
        ),
        pytest.param(b"GET / HTTP/1.1\r\nX: " + b"y" * web.MAX_HEAD, 431, "bytes", id="long head"),
    ],
)
def test_a_head_that_cannot_be_read_is_refused_naming_the_problem(
    raw: bytes, status: int, problem: str
) -> None:
    with pytest.raises(web.Refused) as refused:
        web.parse_head(raw)
    assert refused.value.status == status
    assert problem in refused.value.message
    assert refused.value.close


@pytest.mark.parametrize(
    ("raw", "keep_alive"),
    [
        (b"GET / HTTP/1.1", True),
        (b"GET / HTTP/1.1\r\nConnection: close", False),
        (b"GET / HTTP/1.1\r\nConnection: Upgrade, Close", False),
        (b"GET / HTTP/1.0", False),
        (b"GET / HTTP/1.0\r\nConnection: keep-alive", True),
    ],
)
def test_a_connection_is_kept_as_the_version_and_the_client_say(
    raw: bytes, keep_alive: bool
) -> None:
    assert web.parse_head(raw).keep_alive is keep_alive


def test_an_answer_is_written_whole() -> None:
    answer = web.encode(web.json({"a": 1}, status=201), close=True)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n") == [
        b"HTTP/1.1 201 Created",
        b"Content-Type: application/json",
        b"Content-Length: 7",
        b"Connection: close",
    ]
    assert body == b'{"a":1}'


def test_a_body_is_decoded_as_its_encoding_says() -> None:
    assert web.decoded(gzip.compress(b"{}"), "gzip") == b"{}"
    assert web.decoded(b"{}", None) == b"{}"
    for raw, encoding, status in (
        (b"{}", "br", 415),
        (b"{}", "gzip", 400),
        (gzip.compress(b"{}")[:-4], "gzip", 400),
        (gzip.compress(b" " * (web.MAX_BODY + 1)), "gzip", 413),
    ):
        with pytest.raises(web.Refused) as refused:
            web.decoded(raw, encoding)
        assert refused.value.status == status, encoding
        assert not refused.value.close


async def test_a_route_is_found_by_path_then_method() -> None:
    async def ok(_: web.Request) -> web.Response:
        return web.text("ok")

    app = web.App()
    app.post("/mutate-pod", ok)
    app.get("/healthz", ok)
    assert app.handler(web.parse_head(b"POST /mutate-pod HTTP/1.1")) is ok
    assert app.handler(web.parse_head(b"HEAD /healthz HTTP/1.1")) is ok
    for raw, status in ((b"GET /mutate-pod HTTP/1.1", 405), (b"POST /other HTTP/1.1", 404)):
        with pytest.raises(web.Refused) as refused:
            app.handler(web.parse_head(raw))
        assert refused.value.status == status
        assert not refused.value.close
    with pytest.raises(web.Refused) as refused:
        app.handler(web.parse_head(b"POST /healthz HTTP/1.1"))
    assert refused.value.response().headers == (("Allow", "GET, HEAD"),)


def test_an_answer_to_head_has_no_body() -> None:
    answer = web.encode(web.text("ok"), close=False, body=False)
    assert answer.endswith(b"Content-Length: 2\r\n\r\n")


def test_an_http_1_0_client_that_is_kept_is_told_so() -> None:
    def connection(**how: Any) -> list[bytes]:
        head = web.encode(web.text("ok"), **how).partition(b"\r\n\r\n")[0]
        return [line for line in head.split(b"\r\n") if line.startswith(b"Connection")]

    assert connection(close=False, version="HTTP/1.0") == [b"Connection: keep-alive"]
    assert connection(close=True, version="HTTP/1.0") == [b"Connection: close"]
    assert connection(close=False) == []  # HTTP/1.1 keeps by default


def test_a_content_length_with_leading_zeros_is_its_number() -> None:
    assert web.parse_head(b"POST / HTTP/1.1\r\nContent-Length: 000000005").length == 5
    assert web.parse_head(b"POST / HTTP/1.1\r\nContent-Length: 0000000000").length == 0
