"""Opening a job's Reservation to its pod's replacement, and closing it again.

The controller opens a Reservation just before the eviction (`berth.sh/consumable: "true"`,
with the time) and waits `CONSUMABLE_SETTLE` before evicting; it closes it after a refused
eviction, or while the job is paused, so that no other pod of the workload takes the
place of a pod that stays, and opens it again before the next attempt.
"""

from __future__ import annotations

from berth import protocol
from berth.api import ReservationConditionType, ReservationPhase, keys
from berth.api.times import read_time
from berth.kube.client import RESERVATIONS
from controller.actions import Patch
from controller.jobs.view import CONSUMABLE_SETTLE, JobView, Object
from controller.status import condition, micro_timestamp


def opening(view: JobView) -> Patch:
    """Open the job's Reservation to a replacement (again, after a refused eviction closed
    it), with the time: the eviction waits `CONSUMABLE_SETTLE` after it, and the webhook
    offers the Reservation opened first first. It records which job opened it: of the
    jobs that share one made by hand, that one goes first (`reserve.goes_first`)."""
    assert view.reservation is not None
    annotations = {
        keys.CONSUMABLE: "true",
        keys.OPENED_AT: micro_timestamp(view.now),
        keys.OPENED_FOR: str(view.job["metadata"].get("uid") or ""),
        keys.CLOSED_AT: None,
    }
    return Patch(
        RESERVATIONS,
        view.reservation["metadata"]["name"],
        {"metadata": {"annotations": annotations}},
    )


def ended_before_eviction(reservation: Object) -> str:
    """Why a Reservation that ended before its pod's eviction holds no place for it."""
    name, phase = reservation["metadata"]["name"], protocol.phase(reservation)
    owners = (reservation.get("status") or {}).get("currentOwners") or []
    named = [str(owner.get("name")) for owner in owners if owner.get("name")]
    if phase == ReservationPhase.SUCCEEDED and named:
        return (
            f"Reservation {name!r} was taken by pod {named[0]}, which the workload made "
            "before the pod was evicted"
        )
    ready = condition(reservation.get("status") or {}, ReservationConditionType.READY) or {}
    why = (
        f" ({ready['message']})" if ready.get("status") == "False" and ready.get("message") else ""
    )
    return f"Reservation {name!r} is {phase} before it was used{why}"


def opened_before_placed(reservation: Object) -> bool:
    """Whether the Reservation was opened before it was placed where it is now (in an
    earlier second, as its Scheduled condition says): its place moved since (its node
    deleted, cordoned or relabelled before the eviction). It is opened again, so that
    the eviction waits the settle time after the webhooks' caches can have seen it there."""
    opened = protocol.opened_at(reservation)
    scheduled = condition(reservation.get("status") or {}, ReservationConditionType.SCHEDULED)
    placed = read_time((scheduled or {}).get("lastTransitionTime"))
    return opened is not None and placed is not None and opened < placed


def settling(view: JobView) -> float | None:
    """Seconds until the job's open Reservation has been open `CONSUMABLE_SETTLE`; None
    once it has (or when it shows no opening time)."""
    opened = protocol.opened_at(view.reservation) if view.reservation else None
    if opened is None or view.now >= opened + CONSUMABLE_SETTLE:
        return None
    return (opened + CONSUMABLE_SETTLE - view.now).total_seconds()


def closing(view: JobView) -> Patch | None:
    """Close the job's Reservation after the API server refused its pod's eviction, or
    while the job is paused, so that no other pod of the workload takes the place of a
    pod that stays; only one open
    and unclaimed, and conditional on the copy read (a claim made since stays, and the
    place with it). None when there is nothing to close."""
    reservation = view.reservation
    if reservation is None or not protocol.is_consumable(reservation):
        return None
    metadata = {
        "resourceVersion": reservation["metadata"]["resourceVersion"],
        "annotations": {keys.CONSUMABLE: keys.CLOSED, keys.CLOSED_AT: micro_timestamp(view.now)},
    }
    return Patch(RESERVATIONS, reservation["metadata"]["name"], {"metadata": metadata})
