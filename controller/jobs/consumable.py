"""Opening a job's Reservation to its pod's replacement, and closing it again.

The controller opens a Reservation just before the eviction (`berth.sh/consumable: "true"`,
with the time) and waits `CONSUMABLE_SETTLE` before evicting; it closes it after a refused
eviction, so that no other pod of the workload takes the place of a pod that stays, and
opens it again before the next attempt.
"""

from __future__ import annotations

from berth import protocol
from berth.api import keys
from berth.kube.client import RESERVATIONS
from controller.actions import Patch
from controller.jobs.view import CONSUMABLE_SETTLE, JobView
from controller.status import micro_timestamp


def opening(view: JobView) -> Patch:
    """Open the job's Reservation to a replacement (again, after a refused eviction closed
    it), with the time: the eviction waits `CONSUMABLE_SETTLE` after it, and the webhook
    offers the Reservation opened first first."""
    assert view.reservation is not None
    annotations = {
        keys.CONSUMABLE: "true",
        keys.OPENED_AT: micro_timestamp(view.now),
        keys.CLOSED_AT: None,
    }
    return Patch(
        RESERVATIONS,
        view.reservation["metadata"]["name"],
        {"metadata": {"annotations": annotations}},
    )


def settling(view: JobView) -> float | None:
    """Seconds until the job's open Reservation has been open `CONSUMABLE_SETTLE`; None
    once it has (or when it shows no opening time)."""
    opened = protocol.opened_at(view.reservation) if view.reservation else None
    if opened is None or view.now >= opened + CONSUMABLE_SETTLE:
        return None
    return (opened + CONSUMABLE_SETTLE - view.now).total_seconds()


def closing(view: JobView) -> Patch | None:
    """Close the job's Reservation after the API server refused its pod's eviction, so
    that no other pod of the workload takes the place of a pod that stays; only one open
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
