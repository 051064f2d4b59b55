"""Small pure helpers for status: conditions, timestamps, deadlines, object references."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from berth.api import is_zero, parse_duration

Object = dict[str, Any]


UNREADABLE = (TypeError, AttributeError, ValueError, KeyError)
"""What reading a free-form field (a job's template, a Reservation's spec) of a shape the
code does not expect raises: caught where the field is read, and said once."""


def unreadable(error: Exception) -> str:
    """`error` as it is said on the object: its kind and its words, cut short."""
    return f"{type(error).__name__}: {str(error)[:200]}"


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_timestamp(moment: datetime) -> str:
    """RFC 3339 to the microsecond, as metav1.MicroTime prints it: for times that order
    events less than a second apart."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """A time the API server wrote (`berth.api.times` reads those a user wrote)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def created_at(obj: Mapping[str, Any]) -> datetime:
    return parse_time(obj["metadata"]["creationTimestamp"])


def deadline(obj: Mapping[str, Any], ttl: str | None, default: timedelta) -> datetime:
    """Creation time plus the object's TTL (a Go duration), or plus `default`."""
    return created_at(obj) + (parse_duration(ttl) if ttl else default)


def job_deadline(job: Mapping[str, Any]) -> datetime | None:
    """When the job times out: its creation plus its `ttl`; never when it sets none or a
    ttl of 0, as in Koordinator (`defaultJobTTL` is the ttl of the jobs Berth writes
    itself: evictions it intercepts)."""
    ttl = job["spec"].get("ttl")
    if not ttl or is_zero(ttl):
        return None
    # A ttl under a microsecond (`500ns`) reads as none to the microsecond: it has run out.
    return created_at(job) + parse_duration(ttl)


def condition(status: Mapping[str, Any], kind: str) -> Object | None:
    for item in status.get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return None


def with_condition(
    status: Mapping[str, Any], *, kind: str, state: str, reason: str, message: str, now: datetime
) -> Object:
    """A copy of `status` with condition `kind` set; its transition time moves only when
    its status does, so a condition says since when it has been so."""
    result: Object = copy.deepcopy(dict(status))
    conditions = [c for c in result.get("conditions") or [] if c.get("type") != kind]
    previous = condition(status, kind)
    since = (
        previous.get("lastTransitionTime") if previous and previous.get("status") == state else None
    ) or timestamp(now)
    conditions.append(
        {
            "type": kind,
            "status": state,
            "reason": reason,
            "message": message,
            "lastProbeTime": timestamp(now),
            "lastTransitionTime": since,
        }
    )
    result["conditions"] = conditions
    return result


def same_condition(
    status: Mapping[str, Any], *, kind: str, state: str, reason: str, message: str
) -> bool:
    """Whether the condition already says exactly this (so nothing needs writing)."""
    current = condition(status, kind)
    return current is not None and (
        current.get("status"),
        current.get("reason"),
        current.get("message"),
    ) == (state, reason, message)


def reference(obj: Mapping[str, Any]) -> Object:
    """An ObjectReference to a pod (or any object)."""
    metadata = obj["metadata"]
    ref: Object = {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", "Pod"),
        "name": metadata["name"],
        "uid": metadata["uid"],
    }
    if metadata.get("namespace"):
        ref["namespace"] = metadata["namespace"]
    return ref


def scheduling_message(pod: Mapping[str, Any]) -> str:
    """Why the scheduler has not placed the pod, from its PodScheduled condition."""
    scheduled = condition(pod.get("status") or {}, "PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        return str(scheduled.get("message") or scheduled.get("reason") or "")
    return ""
