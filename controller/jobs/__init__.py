"""The PodMigrationJob state machine: a pure function from the observed world to actions.

Everything it needs to know is on the API objects (the job's conditions, the Reservation,
the pods), so a restarted or newly elected controller picks up any job where it stood.
Each step declares its actions in the order they run: the job's status first, so that
the job records "Evicting" before it evicts, and a pod found missing later is known to
have been evicted, never mistaken for a pod that vanished on its own.

- `machine`: which step a job is at (`decide`)
- `reserve`: ReservationFirst before the eviction: reserve, wait for the place, open it
- `preempt`: the pods the scheduler preempted for the placeholder, as the job records them
- `evict`: the eviction itself, and EvictDirectly jobs
- `bind`: ReservationFirst after the eviction: the replacement binds and becomes Ready
- `release`: a finished job frees its Reservation
- `admit`: arbitration's decision on a Pending job
- `view`: what a decision reads, and the plans every step builds on
"""

from controller.jobs.admit import admission
from controller.jobs.evict import eviction_refused
from controller.jobs.machine import decide
from controller.jobs.preempt import placeholder_node, preemption_mark
from controller.jobs.reserve import REFUSED_FOR_GOOD, reservation_refused
from controller.jobs.view import JobView, own_reservation, reservation_name, reservation_of

__all__ = [
    "REFUSED_FOR_GOOD",
    "JobView",
    "admission",
    "decide",
    "eviction_refused",
    "own_reservation",
    "placeholder_node",
    "preemption_mark",
    "reservation_name",
    "reservation_of",
    "reservation_refused",
]
