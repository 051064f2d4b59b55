"""HTTP/1.1 as Berth's servers speak it: requests, responses, routes, and the reading of a
request's head. Pure: `berth.server` does the I/O.

Berth serves few clients, each with a known way of asking: kube-apiserver (admission
reviews), kube-scheduler (extender verbs), kubelet probes and metrics scrapers. Each sends
a request line, headers and a body of known length, one request at a time on a kept-alive
connection. So the parser reads that and nothing looser, and refuses the rest with a
status and a message naming the problem:

- a request line `METHOD /path[?query] HTTP/1.1` (or 1.0), headers `Name: value`; no
  line folding, no control characters, at most `MAX_HEAD` bytes and `MAX_HEADERS` lines
  (431 beyond);
- a body only with `Content-Length` (one value, digits): `Transfer-Encoding` is refused
  (411), which no such client sends (Go's clients give the length of a body they hold);
- `Expect: 100-continue` is answered.

The limits on time (how long a head or body may take) are the connection's
(`berth.server`).
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import orjson

MAX_BODY = 8 * 1024 * 1024
"""The largest request body the apps read. etcd stores a pod of up to 1.5 MiB (protobuf);
its JSON is larger, and an AdmissionReview or the scheduler's ExtenderArgs carry it with
more around it (node names, user info). A pod refused for its size would pass the webhook
unbound and skip the (ignorable) extender, so the limit must sit well above any pod."""

MAX_HEAD = 64 * 1024
"""The largest request line and headers together."""

MAX_HEADERS = 100

HEAD_END = b"\r\n\r\n"

_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
"""The bytes of a method or a header's name (RFC 9110, `tchar`)."""

_CONTROL = bytes([*range(9), *range(10, 32), 127])
"""Bytes no header value or request target holds (a tab is allowed in a value)."""


def _only(raw: bytes, allowed: bytes) -> bool:
    """Whether every byte of `raw` is one of `allowed` (and there is one at least)."""
    return bool(raw) and not raw.translate(None, allowed)


def _clean(raw: bytes) -> bool:
    """Whether `raw` holds no control byte."""
    return len(raw.translate(None, _CONTROL)) == len(raw)


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


def text(message: str, *, status: int = 200) -> Response:
    return Response(status=status, body=message.encode())


def json(value: Any, *, status: int = 200) -> Response:
    return Response(status=status, body=orjson.dumps(value), content_type="application/json")


class Refused(Exception):
    """A request that is answered `status` with `message` and not served; the connection
    is closed after the answer when `close`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        close: bool = True,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.close, self.headers = status, message, close, headers

    def response(self) -> Response:
        return Response(status=self.status, body=self.message.encode(), headers=self.headers)


@dataclass(frozen=True)
class Head:
    """A request's line and headers, as read."""

    method: str
    path: str
    query: str
    version: str
    headers: Mapping[str, str]
    """By lower-case name; a header given more than once, its values joined by ", "."""
    length: int = 0
    """The body's length in bytes."""

    @property
    def keep_alive(self) -> bool:
        connection = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection

    @property
    def expects_continue(self) -> bool:
        return self.headers.get("expect", "").lower() == "100-continue"


def parse_head(raw: bytes) -> Head:
    """The head of a request (its bytes up to the blank line, excluded), or Refused."""
    if len(raw) > MAX_HEAD:
        raise Refused(431, f"the request line and headers are over {MAX_HEAD} bytes")
    line, *lines = raw.split(b"\r\n")
    if len(lines) > MAX_HEADERS:
        raise Refused(431, f"over {MAX_HEADERS} headers")
    method, path, query, version = _request_line(line)
    headers: dict[str, str] = {}
    for header in lines:
        name, value = _header(header)
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if "transfer-encoding" in headers:
        raise Refused(411, "send the body with a Content-Length: Transfer-Encoding is not read")
    return Head(method, path, query, version, headers, _length(headers.get("content-length")))


def _length(given: str | None) -> int:
    """The body's length a Content-Length gives (its value repeated counts once)."""
    if given is None:
        return 0
    values = {v.strip(" \t") for v in given.split(",")}  # only HTTP's own whitespace
    if len(values) != 1 or not (value := values.pop()).isdigit() or not value.isascii():
        raise Refused(400, f"Content-Length {given[:40]!r} is not a number of bytes")
    digits = value.lstrip("0") or "0"
    if len(digits) > len(str(MAX_BODY)) or int(digits) > MAX_BODY:
        raise Refused(413, f"the body is over {MAX_BODY} bytes")
    return int(digits)


def _request_line(line: bytes) -> tuple[str, str, str, str]:
    parts = line.split(b" ")
    if len(parts) != 3:
        raise Refused(400, f"the request line {_shown(line)} is not 'METHOD /path HTTP/1.1'")
    method, target, version = parts
    if not _only(method, _TOKEN):
        raise Refused(400, f"the method {_shown(method)} is not a token")
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise Refused(400, f"{_shown(version)} is not served: send HTTP/1.1")
    if not target.startswith(b"/") or not _clean(target):
        raise Refused(400, f"the request target {_shown(target)} is not a path")
    path, _, query = target.decode("latin-1").partition("?")
    return method.decode("ascii"), path, query, version.decode("ascii")


def _header(line: bytes) -> tuple[str, str]:
    name, colon, value = line.partition(b":")
    if not colon or not _only(name, _TOKEN):
        raise Refused(400, f"the header line {_shown(line)} is not 'Name: value'")
    value = value.strip(b" \t")
    if not _clean(value):
        raise Refused(400, f"the header {_shown(name)} holds a control character")
    return name.decode("ascii").lower(), value.decode("latin-1")


def _shown(raw: bytes) -> str:
    """A client's bytes in a message: the first 40, quoted."""
    return repr(raw[:40].decode("latin-1"))


@dataclass
class Request:
    """A request read whole, its body decoded (`decoded`)."""

    head: Head
    body: bytes
    deliver: Callable[[Response], Awaitable[None]] = field(repr=False)
    """Send the answer now, rather than when the handler returns; ConnectionError when
    it cannot go out (the caller is gone). For a handler that must know it went out."""

    @property
    def headers(self) -> Mapping[str, str]:
        return self.head.headers


Handler = Callable[[Request], Response | Awaitable[Response]]
"""A route's handler: a plain function when it answers at once, else a coroutine
function (or a function returning an awaitable) when it must wait for something."""


class App:
    """Handlers by method and path."""

    def __init__(self) -> None:
        self.routes: dict[str, dict[str, Handler]] = {}

    def get(self, path: str, handler: Handler) -> None:
        self.routes.setdefault(path, {})["GET"] = handler

    def post(self, path: str, handler: Handler) -> None:
        self.routes.setdefault(path, {})["POST"] = handler

    def handler(self, head: Head) -> Handler:
        """The handler of a request, or Refused (404, 405)."""
        methods = self.routes.get(head.path)
        if methods is None:
            raise Refused(404, f"{head.path[:100]} is not served", close=False)
        found = methods.get("GET" if head.method == "HEAD" else head.method)
        if found is None:
            allowed = ", ".join(sorted({*methods, *(["HEAD"] if "GET" in methods else [])}))
            raise Refused(
                405,
                f"{head.method} is not served on this path: {allowed}",
                close=False,
                headers=(("Allow", allowed),),
            )
        return found


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The Content-Encodings the servers read (zlib's window bits for each)."""


def decoded(raw: bytes, encoding: str | None) -> bytes:
    """The body as its sender wrote it, before its Content-Encoding; or Refused, naming
    the problem."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return raw
    if name not in _WBITS:
        raise Refused(
            415,
            f"Content-Encoding {encoding} is not read: send gzip, deflate or none",
            close=False,
        )
    decompressor = zlib.decompressobj(_WBITS[name])
    try:
        body = decompressor.decompress(raw, MAX_BODY + 1)
    except zlib.error as error:
        raise Refused(400, f"the body is not {name}: {error}", close=False) from None
    if len(body) > MAX_BODY:
        raise Refused(413, f"the body is over {MAX_BODY} bytes once decoded", close=False)
    if not decompressor.eof:
        raise Refused(400, f"the body is not {name}: it is cut short", close=False)
    return body


def encode(
    response: Response, *, close: bool, body: bool = True, version: str = "HTTP/1.1"
) -> bytes:
    """The bytes of an answer to a request of `version`: status line, headers, body (not
    to a HEAD request: `body` False). An HTTP/1.0 client that is kept is told so: it
    closes otherwise."""
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = ""
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    if close:
        lines.append("Connection: close")
    elif version == "HTTP/1.0":
        lines.append("Connection: keep-alive")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + response.body if body else head


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
