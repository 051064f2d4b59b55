"""What the kernel reads off a Reservation: when its time is up."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from berth import protocol


@pytest.mark.parametrize(
    ("spec", "expired"),
    [
        ({"ttl": "5m"}, True),
        ({"ttl": "2h"}, False),
        ({"ttl": "0s"}, False),  # never expires
        ({}, False),  # the 24 h default
        ({"expires": "2026-01-01T12:30:00Z"}, True),
        ({"ttl": "soon"}, False),  # unreadable: the controller says why
    ],
)
def test_a_reservations_time_is_up_after_its_expires_or_ttl(
    spec: dict[str, Any], expired: bool
) -> None:
    reservation = {"metadata": {"creationTimestamp": "2026-01-01T12:00:00Z"}, "spec": spec}
    now = datetime(2026, 1, 1, 13, 0, tzinfo=UTC)
    assert protocol.has_expired(reservation, now) is expired
