"""A finished job (ended by the controller, or aborted by the user) frees its Reservation.

Rolled back before anything was evicted, the Reservation simply goes away. After the
eviction it is marked Failed, which makes its own lifecycle (`controller.reservations`)
delete the placeholder and let any pod gated on it go.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from berth import protocol
from berth.api import (
    PodMigrationJobConditionType,
    ReservationConditionType,
    ReservationPhase,
    ReservationReason,
    keys,
)
from berth.kube.client import RESERVATIONS
from controller.actions import Delete, Plan, UpdateStatus
from controller.jobs.view import JobView, Object, job_name, used_on
from controller.status import condition, with_condition


def release(view: JobView, status: Object) -> Plan:
    """Free the Reservation this job created, if it still holds anything."""
    reservation = view.reservation
    if reservation is None or not _created_by(reservation, view.job):
        return Plan()
    evicting = condition(status, PodMigrationJobConditionType.EVICTION) is not None
    if not evicting and not protocol.owner_uids(reservation):
        meta = reservation["metadata"]
        return Plan().then(Delete(RESERVATIONS, meta["name"], uid=meta["uid"]))
    if protocol.phase(reservation) in (ReservationPhase.SUCCEEDED, ReservationPhase.FAILED):
        return Plan()
    if used_on(view):
        # The Reservation's own pass records it Succeeded (Allocated), which a release
        # here, coming first, would make Failed.
        return Plan()
    released = copy.deepcopy(reservation)
    released["status"] = with_condition(
        {**(reservation.get("status") or {}), "phase": ReservationPhase.FAILED},
        kind=ReservationConditionType.READY,
        state="False",
        reason=ReservationReason.RELEASED,
        message=f"job {job_name(view)} ended",
        now=view.now,
    )
    return Plan().then(UpdateStatus(RESERVATIONS, released))


def _created_by(reservation: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    return bool(protocol.annotations_of(reservation).get(keys.JOB) == job["metadata"]["name"])
