"""Hostile request bodies and envelopes, for the fuzz tests.

Three kinds of body, mixed: raw bytes; JSON of any shape; and, most of the time, a real
request (one the API server or kube-scheduler sent, from tests/data) with a few of its
values replaced by something of the wrong type or an absurd value, or taken out. The
envelope varies too: Content-Type, and Content-Encoding with a body that is or is not
compressed as it says.
"""

from __future__ import annotations

import copy
import gzip
import json
import zlib
from typing import Any

import orjson
from hypothesis import strategies as st

HUGE_LIST = [f"node-{i}" for i in range(20_000)]
"""20,000 node names (250 kB)."""

OVERSIZED = b'{"request": "' + b"x" * (9 * 1024 * 1024) + b'"}'
"""A body past the 8 MiB limit."""

HOSTILE_STRINGS = [
    "",
    "1e999999999",
    "-1e999999999",
    "1.5 cores",
    "NaN",
    "Infinity",
    "-1",
    "0x10",
    "1Ei",
    "99999999999999999999999999999Ei",
    "1m",
    "1n",
    "e",
    ".",
    "+",
    "﻿",
    "\u0000",
    "/",
    "~1",
    "..",
    "../..",
    "a" * 300,
    "ñamé-ü",
    "名前",
    "\U0001f4a5",
]

hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, -(2**63) - 1, 10**400, 0, -1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(HOSTILE_STRINGS),
    st.text(max_size=40),
)

json_values: st.SearchStrategy[Any] = st.recursive(
    hostile_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(
            st.one_of(st.text(max_size=12), st.sampled_from(["", "Pod"])), children, max_size=5
        ),
    ),
    max_leaves=20,
)

hostile_values: st.SearchStrategy[Any] = st.one_of(
    hostile_scalars,
    json_values,
    st.sampled_from([[], {}, [None], [{}], {"": None}, HUGE_LIST, [[[[[[]]]]]]]),
)


def _paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in `document` (the root excluded)."""
    found: list[tuple[Any, ...]] = []
    if isinstance(document, dict):
        items: list[tuple[Any, Any]] = list(document.items())
    elif isinstance(document, list) and len(document) <= 100:  # not into HUGE_LIST
        items = list(enumerate(document))
    else:
        return found
    for key, value in items:
        path = (*prefix, key)
        found.append(path)
        found.extend(_paths(value, path))
    return found


@st.composite
def mutated(draw: st.DrawFn, bases: list[Any]) -> Any:
    """One of `bases`, with one to four of its values replaced or removed, and maybe a
    key added somewhere."""
    base = draw(st.sampled_from(bases))
    document = orjson.loads(orjson.dumps(base))  # a deep copy, faster
    paths = _paths_of(base)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        *parents, last = draw(st.sampled_from(paths))
        target = document
        try:
            for key in parents:
                target = target[key]
            current = target[last]
        except (KeyError, IndexError, TypeError):
            continue  # gone with an earlier change
        if not isinstance(target, dict | list):
            continue  # now a string: an earlier change put it there
        action = draw(st.sampled_from(["replace", "replace", "replace", "remove", "add"]))
        if action == "remove":
            del target[last]
        elif action == "add" and isinstance(current, dict):
            current[draw(st.text(max_size=12))] = copy.deepcopy(draw(hostile_values))
        else:
            target[last] = copy.deepcopy(draw(hostile_values))
    return document


_PATHS: dict[int, list[tuple[Any, ...]]] = {}


def _paths_of(base: Any) -> list[tuple[Any, ...]]:
    if id(base) not in _PATHS:
        _PATHS[id(base)] = _paths(base)
    return _PATHS[id(base)]


class Request:
    """A body, its headers, and the body `sent` before any Content-Encoding."""

    def __init__(self, *, body: bytes, headers: dict[str, str], sent: bytes) -> None:
        self.body, self.headers, self.sent = body, headers, sent

    def __repr__(self) -> str:  # what hypothesis prints for a failing case
        return f"Request(headers={self.headers!r}, body={self.body[:2000]!r})"


def _json_text(document: Any) -> bytes:
    # json (not orjson) writes what it is given: NaN, lone surrogates, integers of any size.
    return json.dumps(document, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def requests(draw: st.DrawFn, bases: list[Any]) -> Request:
    """A POST body and its headers, from `bases` (valid requests) most of the time."""
    kind = draw(
        st.sampled_from(
            ["mutated"] * 24 + ["valid"] * 4 + ["json"] * 4 + ["raw"] * 4 + ["oversized"]
        )
    )
    if kind == "valid":
        body = _json_text(draw(st.sampled_from(bases)))
    elif kind == "mutated":
        body = _json_text(draw(mutated(bases)))
    elif kind == "json":
        body = _json_text(draw(json_values))
    elif kind == "raw":
        body = draw(st.binary(max_size=512))
    else:
        body = OVERSIZED
    headers = {
        "Content-Type": draw(
            st.sampled_from(
                ["application/json"] * 8
                + ["application/json; charset=utf-8", "text/plain", "", "application/x-yaml"]
            )
        )
    }
    sent = body
    encoding = draw(st.sampled_from([None] * 8 + ["gzip", "deflate", "br", "identity", "x-bad"]))
    if encoding is not None:
        headers["Content-Encoding"] = encoding
        if draw(st.booleans()):  # honestly compressed; otherwise the body is not
            if encoding == "gzip":
                body = gzip.compress(body)
            elif encoding == "deflate":
                body = zlib.compress(body)
    return Request(body=body, headers=headers, sent=sent)
