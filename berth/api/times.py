"""Times a user may write where Berth reads one: the one place that reads them.

The schema's `date-time` (kube-openapi's `IsDateTime`) lets in more than Berth writes: a
lower-case `t` or `z`, any character before a fraction, year 0000; an annotation holds
any string at all. Times the API server itself decodes (`creationTimestamp`, a pod's
conditions) come back in one canonical form and need none of this.
"""

from __future__ import annotations

from datetime import UTC, datetime


def read_time(text: object) -> datetime | None:
    """`text` as an RFC 3339 time in UTC; None when it is not a string Python reads as
    one, has no zone, or lies in year 9999 or beyond it in UTC (where adding a second,
    or moving it to UTC, overflows)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
        if moment.tzinfo is None:
            return None
        moment = moment.astimezone(UTC)
    except (ValueError, OverflowError):
        return None
    return moment if moment.year < 9999 else None
