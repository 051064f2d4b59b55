"""Carries out a Plan against the API server, in order, stopping at the first failure.

The only place the controller writes to the cluster. Writes are idempotent where the
API allows (a Create that finds the object already there, a Delete of an object already
gone, count as done), so repeating a plan after a crash is harmless; a status write is
conditional on the resourceVersion it was computed from, so a decision made on a stale
cache fails instead of overwriting newer state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from berth import metrics
from berth.api import keys
from berth.kube.client import JSON_PATCH, PODS, Kube, KubeError, Object, Resource
from berth.kube.events import Recorder
from berth.settings import EvictionPolicy
from controller.actions import Action, Create, Delete, Event, Evict, Patch, Plan, UpdateStatus

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    done: bool = True
    error: str = ""
    eviction_refused: KubeError | None = None
    conflict: bool = False


class Executor:
    def __init__(
        self,
        kube: Kube,
        recorder: Recorder,
        *,
        written: Callable[[Resource, Object], None] | None = None,
    ) -> None:
        self.kube = kube
        self.recorder = recorder
        self.written = written
        """Told of every object an update returns (patch, status), to keep caches current."""

    async def run(self, plan: Plan) -> Outcome:
        versions: dict[tuple[str, str | None, str], str] = {}
        for action in plan.actions:
            try:
                await self._one(action, versions)
            except KubeError as error:
                if isinstance(action, Evict) and error.status in (429, 500, 503):
                    return Outcome(done=False, error=str(error), eviction_refused=error)
                if error.conflict:
                    log.info("conflict on %s, will retry: %s", type(action).__name__, error)
                    return Outcome(done=False, error=str(error), conflict=True)
                log.warning("%s failed: %s", _describe(action), error)
                return Outcome(done=False, error=str(error))
        return Outcome()

    async def _one(self, action: Action, versions: dict[tuple[str, str | None, str], str]) -> None:
        kube = self.kube
        if isinstance(action, Create):
            try:
                created = await kube.create(
                    action.resource, action.body, namespace=action.namespace
                )
            except KubeError as error:
                if error.conflict and error.reason == "AlreadyExists":
                    return
                raise
            _remember(versions, action.resource.plural, created)
        elif isinstance(action, Patch):
            patched = await kube.patch(
                action.resource,
                action.name,
                action.patch,
                namespace=action.namespace,
                subresource=action.subresource,
                content_type=JSON_PATCH if action.json_patch else "application/merge-patch+json",
            )
            _remember(versions, action.resource.plural, patched)
            self._written(action.resource, patched)
        elif isinstance(action, UpdateStatus):
            metadata = action.obj["metadata"]
            key = (action.resource.plural, metadata.get("namespace"), metadata["name"])
            if key in versions:  # this plan already changed the object: build on that
                metadata = {**metadata, "resourceVersion": versions[key]}
            updated = await kube.replace_status(
                action.resource, {**action.obj, "metadata": metadata}
            )
            _remember(versions, action.resource.plural, updated)
            self._written(action.resource, updated)
        elif isinstance(action, Delete):
            try:
                await kube.delete(
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
        elif isinstance(action, Evict):
            await self._evict(action)
        elif isinstance(action, Event):
            await self.recorder.record(action.involved, action.reason, action.message, action.type)

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
                value = json.dumps(
                    {
                        "timestamp": datetime.now(UTC).isoformat(),
                        "reason": "PodMigrationJob",
                        "deleteOptions": options,
                    }
                )
                await self.kube.patch(
                    PODS,
                    action.name,
                    namespace=action.namespace,
                    patch={"metadata": {"annotations": {keys.SOFT_EVICTION: value}}},
                )
            else:
                options.setdefault("preconditions", {"uid": action.uid})
                await self.kube.evict(action.namespace, action.name, delete_options=options)
        except KubeError as error:
            if error.not_found or (error.conflict and "precondition" in error.message.lower()):
                return  # already gone, or a new pod of the same name: the old one is gone
            result = "blocked_by_pdb" if error.status == 429 else "failed"
            metrics.EVICTIONS.labels(policy=action.policy, result=result).inc()
            raise
        metrics.EVICTIONS.labels(policy=action.policy, result="evicted").inc()


def _remember(
    versions: dict[tuple[str, str | None, str], str], plural: str, obj: dict[str, Any]
) -> None:
    metadata = obj.get("metadata") or {}
    if metadata.get("resourceVersion"):
        versions[(plural, metadata.get("namespace"), metadata["name"])] = metadata[
            "resourceVersion"
        ]


def _describe(action: Action) -> str:
    name = getattr(action, "name", "") or (getattr(action, "body", None) or {}).get(
        "metadata", {}
    ).get("name", "")
    return f"{type(action).__name__} {name}".strip()
