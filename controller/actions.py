"""What the controller's decisions ask for: plain data, carried out in order by the executor.

Decisions never touch the API; they return these. The executor stops at the first
action that fails, so an action only runs when everything before it succeeded (a job's
status is written before the eviction it announces, never after).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from berth.kube.client import Resource

Object = dict[str, Any]


@dataclass(frozen=True)
class Record:
    """Where a Create writes down what it made: annotation `key` of object `name` (a
    `resource`) gets the created object's name and UID (`berth.protocol.name_and_uid`),
    which only the API server's response tells (`generateName`, a fresh UID)."""

    resource: Resource
    name: str
    key: str
    namespace: str | None = None


@dataclass(frozen=True)
class Create:
    resource: Resource
    body: Object
    namespace: str | None = None
    record: Record | None = None
    """Once created, write its name and UID there (a merge patch of one annotation)."""


@dataclass(frozen=True)
class Patch:
    """A merge patch (or a JSON patch when `json_patch`) of an object or its status."""

    resource: Resource
    name: str
    patch: Any
    namespace: str | None = None
    subresource: str | None = None
    json_patch: bool = False


@dataclass(frozen=True)
class UpdateStatus:
    """Replace the status subresource; `obj` carries the resourceVersion it was read at."""

    resource: Resource
    obj: Object


@dataclass(frozen=True)
class Delete:
    resource: Resource
    name: str
    namespace: str | None = None
    uid: str | None = None
    grace_period_seconds: int | None = None
    options: Object | None = None


@dataclass(frozen=True)
class Evict:
    """Remove the pod by the configured policy: Eviction, Delete or SoftEviction."""

    namespace: str
    name: str
    uid: str
    policy: str
    delete_options: Object | None = None
    reserved_node: str | None = None
    """The node where the job's Reservation holds the replacement's place: read from the
    API server just before the eviction, which is not sent if it is gone, or takes no new
    pod of the evicted one's `placement` (the caches may not show a deletion, a cordon, a
    taint or a label of moments ago)."""
    placement: Object = field(default_factory=dict)
    """The replacement's tolerations, node selector and required node affinity
    (`build.replacement_placement`)."""
    job: str = ""
    """The job evicting the pod, named in a soft eviction's annotation."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about `involved` (a job or a Reservation)."""

    involved: Object
    reason: str
    message: str
    type: str = "Normal"


Action = Create | Patch | UpdateStatus | Delete | Evict | Event


@dataclass
class Plan:
    """The actions of one reconcile pass, and when to look again if nothing else happens."""

    actions: list[Action] = field(default_factory=list)
    requeue_after: float | None = None

    def then(self, *actions: Action) -> Plan:
        self.actions.extend(actions)
        return self

    def again_in(self, seconds: float) -> Plan:
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )
        return self
