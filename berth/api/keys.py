"""Annotation, label and scheduling-gate names that Berth reads or writes on pods.

Keys under `scheduling.koordinator.sh/` and `descheduler.alpha.kubernetes.io/` keep the
meaning they have in the PodMigrationJob design, so pods annotated for it behave the same
under Berth. Keys that only Berth needs live under `berth.sh/`.
"""

from typing import Final

EVICTION_COST: Final = "scheduling.koordinator.sh/eviction-cost"
"""Pod annotation, an int32: pods with a lower cost migrate first; unset means 0."""

EVICTION_COST_NEVER: Final = 2**31 - 1
"""The eviction cost (MaxInt32) that exempts a pod from migration."""

SOFT_EVICTION: Final = "scheduling.koordinator.sh/soft-eviction"
"""Pod annotation the SoftEviction policy sets instead of deleting the pod."""

RESERVATION_ALLOCATED: Final = "scheduling.koordinator.sh/reservation-allocated"
"""Pod annotation naming the Reservation a pod is bound to, as `{"name": ..., "uid": ...}`."""

DESCHEDULER_EVICT: Final = "descheduler.alpha.kubernetes.io/evict"
"""Pod annotation that lets a pod bypass the retryable arbitration limits."""

RESERVATION_GATE: Final = "berth.sh/reservation"
"""Scheduling gate that holds a replacement pod until its Reservation's capacity is free."""

RESERVATION_RESOURCE: Final = "berth.sh/reservation"
"""Extended resource that only Berth's own pods request (one, in requests and limits): the
placeholders and the replacement pods the webhook binds. kube-scheduler calls Berth's
extender only for pods that request it (`managedResources` in the scheduler's
configuration, with `ignoredByScheduler`, so no node needs to advertise it); it stands for
no capacity, and Berth's own resource math leaves it out."""

RESERVATION_LABEL: Final = "berth.sh/reservation"
"""Label on a placeholder pod; the value is the name of the Reservation it holds capacity for."""

CLAIM: Final = "berth.sh/claim"
"""Annotation the webhook writes on a Reservation and on the replacement pod that claimed it."""

MIGRATING_LABEL: Final = "berth.sh/migrating"
"""Namespace label, "true" while a Reservation waits there for its replacement pod: the
webhook's namespaceSelector requires it, so pod creations elsewhere never call the
webhook. The controller alone writes and removes it."""

CONSUMABLE: Final = "berth.sh/consumable"
"""Reservation annotation, "true" once the pod it was made for is being evicted: from then
on (and not before) a replacement pod may claim it. `CLOSED` while an eviction the API
server refused (a PodDisruptionBudget) waits to be tried again: the pod stays, so no
replacement may claim its place meanwhile."""

CLOSED: Final = "closed"
"""`CONSUMABLE`'s value on a Reservation closed again after its pod's eviction was refused."""

WORKLOAD: Final = "berth.sh/workload"
"""Reservation annotation: UID of the top-level workload (e.g. the Deployment) of the pod it
was made for, so a replacement from a new ReplicaSet of a rollout also matches."""

PLACEHOLDER: Final = "berth.sh/placeholder"
"""Reservation annotation the controller writes from the response to its create of the
placeholder pod: `{"name": ..., "uid": ...}` of that pod. Only the pod with this UID is
the Reservation's placeholder; an owner reference to the Reservation proves nothing (its
UID is readable by everyone who may read Reservations)."""

PREEMPTION: Final = "berth.sh/preemption"
"""Reservation annotation, "allowed" on a Reservation the controller made for a job that
sets `reservationOptions.preemptionOptions`: its placeholder runs under the pod's own
PriorityClass, so kube-scheduler may preempt pods of lower priority to place it. Only the
controller writes it (a job template's `berth.sh/` keys are dropped)."""

PREEMPTION_ALLOWED: Final = "allowed"

JOB: Final = "berth.sh/job"
"""Reservation annotation: the name of the PodMigrationJob that created it."""

POD_UID: Final = "berth.sh/pod-uid"
"""PodMigrationJob annotation: UID of the pod when the job started, so that a new pod of
the same name (a StatefulSet's) is recognised as a replacement, not the original."""

SOURCE_NODE: Final = "berth.sh/source-node"
"""PodMigrationJob annotation: the node the pod ran on when the job started."""

OPENED_AT: Final = "berth.sh/opened-at"
"""Reservation annotation: when it was made consumable (RFC 3339, to the microsecond); the
eviction waits a moment after it, so every webhook's cache has seen the Reservation open,
and the webhook offers open Reservations to replacements in this order."""

OPENED_FOR: Final = "berth.sh/opened-for"
"""Reservation annotation: the UID of the PodMigrationJob that opened it (written with
`OPENED_AT`, and kept when it is closed again). Of the jobs naming one Reservation made by
hand, the one that opened it goes first: a job's status, which says whether it tried an
eviction, is written by whoever may abort the job; a Reservation only by Berth."""

CLOSED_AT: Final = "berth.sh/closed-at"
"""Reservation annotation: when it was closed after its pod's eviction was refused (RFC
3339, to the microsecond); reopened `EVICTION_RETRY` less the settle time after it."""

ADMISSION: Final = "berth.sh/admission"
"""PodMigrationJob annotation the controller writes when arbitration admits the job: an
HMAC over the job's UID, the pod's UID and the mode, keyed by a secret only the controller
reads. A job's status subresource is writable by whoever may abort it, so phase Running
alone never makes the controller act: only a job carrying a valid mark was admitted."""

FINISHED_AT: Final = "berth.sh/finished-at"
"""PodMigrationJob annotation the controller writes on a finished job made from an
intercepted eviction, when it first sees it finished (RFC 3339, to the microsecond): it
deletes the job `evictionInterception.keepFinished` after that, once its pod is gone."""

INTERCEPT_EVICTIONS: Final = "berth.sh/intercept-evictions"
"""Namespace label: "true" opts the namespace in to eviction interception: an eviction of
a pod there (kubectl drain, the descheduler) becomes a PodMigrationJob, and the evicting
tool is told to retry (429) until the job has moved the pod."""

EVICTION_OF: Final = "berth.sh/eviction-of"
"""PodMigrationJob label on a job made from an intercepted eviction: the namespace and
name of its pod, in a label's form (`webhook.evictions.pod_label`). A retry by name that
reaches a StatefulSet's replacement finds with it the job that moved the pod, where no
Reservation ties the two (EvictDirectly)."""

REQUESTER: Final = "berth.sh/requester"
"""PodMigrationJob label and annotation on a job made from an intercepted eviction: who
asked for the eviction (the label a label-safe form of the user name, the annotation the
user name as the API server authenticated it)."""
