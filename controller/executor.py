"""Carries out a Plan against the API server, in order, stopping at the first failure.

The only place the controller writes to the cluster. Writes are idempotent where the
API allows (a Create that finds the object already there, a Delete of an object already
gone, count as done), so repeating a plan after a crash is harmless; a Create with a
`Record` writes the created object's name and UID where the plan asks, from the API
server's response (a crash in between leaves an object nothing records, which the
decision that asked for it recognises as such); a status write is
conditional on the resourceVersion it was computed from, so a decision made on a stale
cache fails instead of overwriting newer state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from berth import metrics, protocol
from berth.api import keys
from berth.eviction import soft_eviction
from berth.kube.client import (
    JSON_PATCH,
    NODES,
    PODS,
    PRIORITYCLASSES,
    RESERVATIONS,
    Kube,
    KubeError,
    Object,
    Resource,
)
from berth.kube.events import Recorder
from berth.scheduling import node_refusal
from berth.settings import EvictionPolicy
from controller.actions import Action, Create, Delete, Event, Evict, Patch, Plan, UpdateStatus

log = logging.getLogger(__name__)


Versions = dict[tuple[str, str | None, str], str]
"""(plural, namespace, name) → the resourceVersion a plan's own write returned."""


REPORTED_CREATES = (PODS, PRIORITYCLASSES, RESERVATIONS)
"""The creates whose refusal is said on the object they were made for, not only logged."""


@dataclass
class Outcome:
    """How a plan ran: to the end (`done`), or stopped at an action that failed."""

    done: bool = True
    eviction_refused: KubeError | None = None
    """The API server refused the eviction (a PodDisruptionBudget; or any other error:
    403, 429 of API Priority and Fairness, 500, 503...), to be recorded on the job."""
    conflict: bool = False
    """A write lost a race with another writer: the plan was made on stale objects."""
    create_refused: KubeError | None = None
    """The API server refused to create a pod (a ResourceQuota, Pod Security, an
    admission webhook), a placeholder's PriorityClass (RBAC, an admission policy) or a
    Reservation (a template's metadata it does not take, an admission policy), to be
    said on the object it was made for."""
    refused_resource: str = ""
    """The plural of what `create_refused` is about."""
    error: KubeError | None = None
    """The API error any other action stopped on (a namespace's label refused by an
    admission policy, a 5xx...)."""
    failed: str = ""
    """The action `error` stopped on, described (`Patch podmigrationjobs job-1`)."""
    held_back: bool = False
    """An eviction not sent: its Reservation's node, read at the last moment, was gone
    or takes no replacement (`_place_still_there`); the next pass decides again."""


class _RecordRefused(Exception):
    """The create went through, but recording what it made did not: not a refused
    create."""

    def __init__(self, error: KubeError) -> None:
        super().__init__(str(error))
        self.error = error


class Executor:
    def __init__(
        self,
        kube: Kube,
        recorder: Recorder,
        *,
        written: Callable[[Resource, Object], None] | None = None,
        may_act: Callable[[], bool] = lambda: True,
    ) -> None:
        self.kube = kube
        self.recorder = recorder
        self.written = written
        """Told of every object a write returns (create, patch, status), to keep caches
        current."""
        self.may_act = may_act
        """Asked before each action: False once this replica may no longer hold the lease
        (`LeaderElector.still_leading`), when nothing more is done."""

    async def run(self, plan: Plan) -> Outcome:
        versions: Versions = {}
        for action in plan.actions:
            if not self.may_act():
                log.warning("not leading any more: %s and what follows not done", _describe(action))
                return Outcome(done=False)
            try:
                held = await self._held_back(action) if isinstance(action, Evict) else None
                if held is not None:
                    return held
                await self._one(action, versions)
            except _RecordRefused as failed:
                log.warning("%s: recording it failed: %s", _describe(action), failed.error)
                return Outcome(
                    done=False,
                    conflict=failed.error.conflict,
                    error=failed.error,
                    failed=f"recording {_describe(action)}",
                )
            except KubeError as error:
                if isinstance(action, Evict):
                    return Outcome(done=False, eviction_refused=error)
                if error.conflict:
                    log.info("conflict on %s, will retry: %s", type(action).__name__, error)
                    return Outcome(done=False, conflict=True)
                log.warning("%s failed: %s", _describe(action), error)
                if isinstance(action, Create) and action.resource in REPORTED_CREATES:
                    return Outcome(
                        done=False, create_refused=error, refused_resource=action.resource.plural
                    )
                return Outcome(done=False, error=error, failed=_describe(action))
        return Outcome()

    async def _held_back(self, action: Evict) -> Outcome | None:
        """How the plan stops before the eviction, if it does (`_place_still_there`)."""
        try:
            there = await self._place_still_there(action)
        except KubeError as error:  # not an eviction refused: none was sent
            log.warning("%s: its node could not be read: %s", _describe(action), error)
            return Outcome(
                done=False, error=error, failed=f"reading node {action.reserved_node} to evict"
            )
        if not there:
            return Outcome(done=False, held_back=True)
        if not self.may_act():
            # The node's read took long enough for the lease to run out meanwhile.
            log.warning("not leading any more: %s not done", _describe(action))
            return Outcome(done=False)
        return None

    async def _place_still_there(self, action: Evict) -> bool:
        """Whether the node of the Reservation that holds the replacement's place is there
        and takes the replacement, as the API server says now (True when there is none to
        ask about): a node deleted, cordoned or tainted moments ago may not show so in the
        caches the plan was made from. Not evicted when it is gone or refuses; a read that
        fails otherwise raises (an API failure: the pass backs off). The job's next pass
        decides again."""
        if action.reserved_node is None:
            return True
        try:
            node = await self.kube.get(NODES, action.reserved_node)
        except KubeError as error:
            if not error.not_found:
                raise
            why = f"node {action.reserved_node}, where its Reservation holds the place, was deleted"
        else:
            refusal = node_refusal(node, action.placement)
            if refusal is None:
                return True
            why = f"{refusal}, and its Reservation holds the place there"
        log.warning("not evicting %s/%s: %s", action.namespace, action.name, why)
        return False

    async def _one(self, action: Action, versions: Versions) -> None:
        if isinstance(action, Create):
            await self._create(action, versions)
        elif isinstance(action, Patch):
            await self._patch(action, versions)
        elif isinstance(action, UpdateStatus):
            await self._update_status(action, versions)
        elif isinstance(action, Delete):
            await self._delete(action)
        elif isinstance(action, Evict):
            await self._evict(action)
        elif isinstance(action, Event):
            await self.recorder.record(action.involved, action.reason, action.message, action.type)

    async def _create(self, action: Create, versions: Versions) -> None:
        try:
            created = await self.kube.create(
                action.resource, action.body, namespace=action.namespace
            )
        except KubeError as error:
            named = (action.body.get("metadata") or {}).get("name")
            if error.conflict and error.reason == "AlreadyExists" and named:
                # Made before (by an earlier pass whose answer was lost): done. Not for a
                # generated name, whose collision made nothing.
                return
            raise
        _remember(versions, action.resource.plural, created)
        self._written(action.resource, created)
        record = action.record
        if record is not None:
            if not self.may_act():
                # Unrecorded, it is a stray to the next leader, which deletes it.
                log.warning("not leading any more: %s not recorded", _describe(action))
                return
            annotations = {record.key: protocol.name_and_uid(created)}
            try:
                await self._patch(
                    Patch(
                        record.resource,
                        record.name,
                        {"metadata": {"annotations": annotations}},
                        namespace=record.namespace,
                    ),
                    versions,
                )
            except KubeError as error:
                raise _RecordRefused(error) from error

    async def _patch(self, action: Patch, versions: Versions) -> None:
        patched = await self.kube.patch(
            action.resource,
            action.name,
            action.patch,
            namespace=action.namespace,
            subresource=action.subresource,
            content_type=JSON_PATCH if action.json_patch else "application/merge-patch+json",
        )
        _remember(versions, action.resource.plural, patched)
        self._written(action.resource, patched)

    async def _update_status(self, action: UpdateStatus, versions: Versions) -> None:
        metadata = action.obj["metadata"]
        key = (action.resource.plural, metadata.get("namespace"), metadata["name"])
        if key in versions:  # this plan already changed the object: build on that
            metadata = {**metadata, "resourceVersion": versions[key]}
        updated = await self.kube.replace_status(
            action.resource, {**action.obj, "metadata": metadata}
        )
        _remember(versions, action.resource.plural, updated)
        self._written(action.resource, updated)

    async def _delete(self, action: Delete) -> None:
        try:
            await self.kube.delete(
                action.resource,
                action.name,
                namespace=action.namespace,
                uid=action.uid,
                grace_period_seconds=action.grace_period_seconds,
                options=action.options,
            )
        except KubeError as error:
            if not error.not_found:
                raise

    def _written(self, resource: Resource, obj: Object) -> None:
        if self.written is not None and obj.get("metadata"):
            self.written(resource, obj)

    async def _evict(self, action: Evict) -> None:
        options = dict(action.delete_options or {})
        try:
            if action.policy == EvictionPolicy.DELETE:
                await self.kube.delete(
                    PODS, action.name, namespace=action.namespace, uid=action.uid, options=options
                )
            elif action.policy == EvictionPolicy.SOFT_EVICTION:
                value = soft_eviction(action.job, options, datetime.now(UTC))
                # The UID in the patch is the precondition: a new pod of that name (a
                # StatefulSet's) fails validation ("field is immutable") untouched.
                patch = {
                    "metadata": {"uid": action.uid, "annotations": {keys.SOFT_EVICTION: value}}
                }
                await self.kube.patch(PODS, action.name, namespace=action.namespace, patch=patch)
            else:
                options["preconditions"] = {"uid": action.uid}
                await self.kube.evict(action.namespace, action.name, delete_options=options)
        except KubeError as error:
            if error.not_found or _another_pod(error):
                return  # already gone, or a new pod of the same name: the old one is gone
            result = "blocked_by_pdb" if error.disruption_budget else "failed"
            metrics.EVICTIONS.labels(policy=action.policy, result=result).inc()
            raise
        metrics.EVICTIONS.labels(policy=action.policy, result="evicted").inc()


def _another_pod(error: KubeError) -> bool:
    """Whether the API server refused a write to a pod for its UID precondition: the pod
    of that name is another (the Eviction's preconditions; a patch carrying the UID)."""
    message = error.message.lower()
    return (error.conflict and "precondition" in message) or (
        error.status == 422 and "metadata.uid" in message
    )


def _remember(versions: Versions, plural: str, obj: dict[str, Any]) -> None:
    metadata = obj.get("metadata") or {}
    if metadata.get("resourceVersion"):
        versions[(plural, metadata.get("namespace"), metadata["name"])] = metadata[
            "resourceVersion"
        ]


def _describe(action: Action) -> str:
    """`Patch podmigrationjobs/job-1`: the action, what it is about, and its name."""
    metadata = (getattr(action, "body", None) or getattr(action, "obj", None) or {}).get(
        "metadata", {}
    )
    name = getattr(action, "name", "") or metadata.get("name") or metadata.get("generateName", "")
    resource = getattr(action, "resource", None)
    about = f"{resource.plural}/{name}" if resource is not None else name
    return f"{type(action).__name__} {about}".strip()
