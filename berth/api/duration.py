"""Go duration strings (`90s`, `5m`, `1h30m`): the one place that parses and prints them.

A PodMigrationJob's `ttl` is a Go `metav1.Duration` on the wire, and the controller args
write their intervals the same way, so both go through this module. It follows Go's
`time.ParseDuration` and `Duration.String`, so a value round-trips with Go clients: `5m`
reads as five minutes and prints back as `5m0s`, which is what `kubectl get` shows for a
job a Go controller has written. Python's `timedelta` stops at microseconds; finer parts
are dropped.
"""

from __future__ import annotations

import re
from datetime import timedelta
from fractions import Fraction
from typing import Annotated

from pydantic import PlainSerializer, PlainValidator, WithJsonSchema

DURATION_PATTERN = "^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$"
"""What `time.ParseDuration` accepts, as an RE2 expression (the CRDs check it with CEL)."""

_DURATION = re.compile(DURATION_PATTERN)
_COMPONENT = re.compile(r"([0-9]*)(?:[.]([0-9]*))?(ns|us|µs|μs|ms|s|m|h)")
_NANOS_PER_UNIT = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,  # U+00B5 micro sign
    "μs": 10**3,  # U+03BC Greek mu; Go accepts both
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_MAX_NANOS = 2**63 - 1  # Go's time.Duration is an int64 count of nanoseconds


def parse_duration(text: str) -> timedelta:
    """Read a Go duration string such as `300ms`, `-1.5h` or `2h45m`."""
    nanos = _parse_nanos(text)
    magnitude = timedelta(microseconds=abs(nanos) // 1000)
    return -magnitude if nanos < 0 else magnitude


def is_zero(text: str) -> bool:
    """Whether a Go duration string is exactly zero: `500ns` is not, though it reads as
    no time to the microsecond (`parse_duration`)."""
    return _parse_nanos(text) == 0


def go_form(text: str) -> str:
    """A Go duration string as Go prints it back: `5m` gives `5m0s`, `1.5h` gives
    `1h30m0s`. Exact to the nanosecond, like a Go client reading and writing the value."""
    return _format_nanos(_parse_nanos(text))


def _parse_nanos(text: str) -> int:
    if not _DURATION.fullmatch(text):
        raise ValueError(f"{text!r} is not a Go duration such as 90s, 5m or 1h30m")
    nanos = Fraction(0)
    for whole, fraction, unit in _COMPONENT.findall(text):
        value = Fraction(int(whole or "0"))
        if fraction:
            value += Fraction(int(fraction), 10 ** len(fraction))
        nanos += value * _NANOS_PER_UNIT[unit]
    if nanos > _MAX_NANOS:
        raise ValueError(f"{text!r} is longer than a Go duration can be (about 2562047h)")
    return -int(nanos) if text.startswith("-") else int(nanos)


def format_duration(value: timedelta) -> str:
    """Print a duration the way Go's `Duration.String` does: `5m0s`, `1h30m0s`, `500ms`."""
    return _format_nanos(((value.days * 86400 + value.seconds) * 10**6 + value.microseconds) * 1000)


def _format_nanos(nanos: int) -> str:
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    if nanos < 10**9:
        # Below one second Go switches to the largest unit that keeps an integer part.
        unit, size = next(
            (u, s) for u, s in (("ms", 10**6), ("µs", 10**3), ("ns", 1)) if nanos >= s
        )
        return f"{sign}{_decimal(nanos, size)}{unit}"
    minutes, second_nanos = divmod(nanos, 60 * 10**9)
    hours, minutes = divmod(minutes, 60)
    seconds = f"{_decimal(second_nanos, 10**9)}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return f"{sign}{seconds}"


def _decimal(nanos: int, unit: int) -> str:
    """`nanos` in `unit`s, with the fraction's trailing zeros dropped (`1.5`, `2`)."""
    whole, fraction = divmod(nanos, unit)
    digits = str(fraction).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def _validate(value: object) -> timedelta:
    if isinstance(value, str):
        value = parse_duration(value)
    elif not isinstance(value, timedelta):
        raise ValueError(f"{value!r} is not a Go duration string such as 90s, 5m or 1h30m")
    if value < timedelta(0):
        raise ValueError(f"must not be negative, got {format_duration(value)}")
    return value


Duration = Annotated[
    timedelta,
    PlainValidator(_validate),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    # On the wire a short string; the bound keeps the CRD's CEL rules cheap to evaluate.
    WithJsonSchema({"type": "string", "maxLength": 64}),
]
"""A non-negative Go duration: a `timedelta` in Python, a Go duration string on the wire."""
