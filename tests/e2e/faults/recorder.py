"""A watch recorder: every version of every pod, job and Reservation the API server
announces, in the order of etcd's revisions, from before the first fault to the end.

Invariants are judged on this history, not on samples: a pod gated for a moment, an
eviction between two polls, a Reservation that was Pending when its pod was evicted all
leave a version here. Each watch resumes from the last revision it saw; when the API
server answers 410 (its history compacted) the recorder lists again and records every
difference as an event marked `relisted`, so what changed while it was away still shows
(as its end state) and the table says how often that happened.

Written against the API directly (list, then watch), not through Berth's informer: the
recorder must not share the code it judges.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from berth.kube.client import PODMIGRATIONJOBS, PODS, RESERVATIONS, Kube, KubeError, Resource

Object = dict[str, Any]
RECORDED = (PODS, PODMIGRATIONJOBS, RESERVATIONS)


@dataclass(frozen=True)
class Seen:
    """One version of one object as a watch (or a relist after a 410) delivered it."""

    revision: int
    """The object's resourceVersion: etcd's revision, one clock for every resource."""
    plural: str
    type: str
    """ADDED, MODIFIED or DELETED."""
    obj: Object
    at: float
    """time.time() when it arrived."""
    relisted: bool = False

    @property
    def key(self) -> str:
        metadata = self.obj["metadata"]
        namespace = metadata.get("namespace")
        return f"{namespace}/{metadata['name']}" if namespace else str(metadata["name"])


@dataclass
class Recorder:
    kube: Kube
    history: list[Seen] = field(default_factory=list)
    state: dict[str, dict[str, Object]] = field(default_factory=dict)
    """plural → key → the latest version seen (deleted objects removed)."""
    versions: dict[tuple[str, str], list[Seen]] = field(default_factory=dict)
    """(plural, key) → every version seen of that object, in order."""
    expired: int = 0
    """Watches the API server ended with 410 Gone (each followed by a relist)."""
    interrupted: int = 0
    """Watches that broke otherwise (the API server restarting), each resumed."""
    _synced: dict[str, asyncio.Event] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def __aenter__(self) -> Recorder:
        for resource in RECORDED:
            self.state[resource.plural] = {}
            self._synced[resource.plural] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._follow(resource)))
        for event in self._synced.values():
            await asyncio.wait_for(event.wait(), 60)
        return self

    async def __aexit__(self, *_: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def objects(self, plural: str) -> list[Object]:
        return list(self.state[plural].values())

    def ordered(self) -> list[Seen]:
        """The history in etcd's order (each watch delivers in order; the watches of
        different resources interleave freely)."""
        return sorted(self.history, key=lambda seen: seen.revision)

    async def _follow(self, resource: Resource) -> None:
        version = ""
        while True:
            try:
                if not version:
                    version = await self._relist(resource)
                async for event in _watch(self.kube, resource, version):
                    version = self._take(resource, event)
            except asyncio.CancelledError:
                raise
            except KubeError as error:
                if error.gone:
                    self.expired += 1
                    version = ""
                else:
                    self.interrupted += 1
                    await asyncio.sleep(0.5)
            except Exception:  # the API server went away mid-watch
                self.interrupted += 1
                await asyncio.sleep(0.5)

    async def _relist(self, resource: Resource) -> str:
        page = await self.kube.list(resource)
        first = not self._synced[resource.plural].is_set()
        current = self.state[resource.plural]
        found = {}
        for item in page.get("items", []):
            seen = self._seen(resource, "ADDED", item, relisted=not first)
            found[seen.key] = item
            old = current.get(seen.key)
            if old is None or old["metadata"]["resourceVersion"] != item["metadata"].get(
                "resourceVersion"
            ):
                self._record(seen if old is None else _retype(seen, "MODIFIED"))
        for key, old in list(current.items()):
            if key not in found:
                # Gone while the recorder was away: when exactly is unknown, so the
                # deletion is dated at the list's revision.
                revision = int(page["metadata"]["resourceVersion"])
                self._record(
                    Seen(revision, resource.plural, "DELETED", old, time.time(), relisted=True)
                )
        self._synced[resource.plural].set()
        return str(page["metadata"]["resourceVersion"])

    def _take(self, resource: Resource, event: Object) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise KubeError(int(obj.get("code", 500)), obj)
        version = str(obj["metadata"]["resourceVersion"])
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._record(self._seen(resource, str(kind), obj))
        return version

    def _seen(self, resource: Resource, kind: str, obj: Object, *, relisted: bool = False) -> Seen:
        revision = int(obj["metadata"]["resourceVersion"])
        return Seen(revision, resource.plural, kind, obj, time.time(), relisted=relisted)

    def seen(self, plural: str, key: str) -> list[Seen]:
        """Every version of the object seen so far (a state that lasted a moment too)."""
        return self.versions.get((plural, key), [])

    def _record(self, seen: Seen) -> None:
        self.history.append(seen)
        self.versions.setdefault((seen.plural, seen.key), []).append(seen)
        if seen.type == "DELETED":
            self.state[seen.plural].pop(seen.key, None)
        else:
            self.state[seen.plural][seen.key] = seen.obj


def _retype(seen: Seen, kind: str) -> Seen:
    return Seen(seen.revision, seen.plural, kind, seen.obj, seen.at, relisted=seen.relisted)


async def _watch(kube: Kube, resource: Resource, version: str) -> AsyncIterator[Object]:
    async for event in kube.watch(resource, resource_version=version, timeout_seconds=120):
        yield event
