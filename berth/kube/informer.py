"""A list-then-watch cache of one resource, with indexes kept up to date by the watch.

It lists once, then watches from the list's resourceVersion with bookmarks; when the
watch ends it resumes from the last version it saw, and when the server says that
version is gone (410) it lists again and tells its handler about every difference, so
nothing changed while it was away is lost; what it holds from after the list's snapshot
is left to the watch that follows, which starts there. Objects are the API server's dicts; indexes
map a key (a node name, an owner UID) to object keys, so a lookup is O(1) whatever the
size of the cluster.

A cached object is never changed in place: a change replaces it, and an index replaces
the set of keys it changes rather than adding to it. So `Informer.frozen` can hand out
what the cache holds at one moment for the price of copying two dicts, and readers on
another thread keep reading that moment while the watch moves on.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable

from berth.kube.client import Kube, KubeError, Object, Resource

log = logging.getLogger(__name__)

Handler = Callable[[str, Object], Awaitable[None] | None]
IndexFunc = Callable[[Object], Iterable[str]]
Keep = Callable[[Object], Object]
"""What the cache keeps of an object; the handler still gets the whole object."""

IDENTITY = ("name", "namespace", "uid", "resourceVersion")


def identity_only(obj: Object) -> Object:
    """What a cache must keep of an object that only its handler reads: who it is and
    which version (for a relist to tell what changed or went, and for `assume`). A
    handler told of a deletion from a relist gets this much."""
    metadata = obj["metadata"]
    return {"metadata": {key: metadata[key] for key in IDENTITY if key in metadata}}


def without_managed_fields(obj: Object) -> Object:
    """The object without `metadata.managedFields`: who wrote which field, which a cache
    that never reads it need not hold (some 40% of a running pod's memory here). An update
    sent without them keeps the API server's own (it takes the live object's)."""
    metadata = obj.get("metadata") or {}
    if "managedFields" not in metadata:
        return obj
    return {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}


RETRY_DELAY = 1.0
"""Seconds before the first retry of a failed list or watch; each failure in a row
doubles it, up to `MAX_RETRY_DELAY`, with a fifth either way at random (so that the
replicas of a component, and its informers, do not come back in step)."""
MAX_RETRY_DELAY = 30.0

WATCH_TIMEOUT = 300
"""Seconds a watch asks the API server to keep it open, up to twice that at random (as
client-go does), so that the watches of a process do not all end and reopen together."""

SHORT_WATCH = 1.0
"""A watch that ends this soon after it began, having brought nothing, was closed by the
other end at once: the next one waits as after a failure (client-go's "very short
watch")."""

YIELD_EVERY = 256
"""Objects of a relist handled between two turns of the loop: a relist of tens of
thousands of objects must not hold up requests, probes and lease renewals."""


def retry_delay(failures: int) -> float:
    """Seconds to wait after `failures` failures in a row (at least 1)."""
    base = min(MAX_RETRY_DELAY, RETRY_DELAY * 2.0 ** min(failures - 1, 16))
    return base * random.uniform(0.8, 1.2)


def object_key(obj: Object) -> str:
    """`namespace/name`, or `name` for a cluster-scoped object."""
    metadata = obj["metadata"]
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata['name']}" if namespace else str(metadata["name"])


class Store:
    """Objects by key, and indexes from a value to the keys of the objects it names."""

    def __init__(
        self,
        store: dict[str, Object] | None = None,
        indexes: dict[str, dict[str, frozenset[str]]] | None = None,
    ) -> None:
        self.store: dict[str, Object] = store if store is not None else {}
        self.indexes: dict[str, dict[str, frozenset[str]]] = indexes or {}

    def get(self, key: str) -> Object | None:
        return self.store.get(key)

    def by_index(self, index: str, value: str) -> list[Object]:
        return [self.store[key] for key in self.indexes[index].get(value, ())]

    def values(self) -> list[Object]:
        return list(self.store.values())


class Informer(Store):
    """Cache of one resource. Call `run()` as a task; wait on `synced` before reading."""

    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        indexes: dict[str, IndexFunc] | None = None,
        handler: Handler | None = None,
        keep: Keep | None = None,
    ) -> None:
        self.kube = kube
        self.keep = keep
        self.gather = 0.0
        """Passed to `Kube.watch`: how long a burst's events may wait to be taken together
        (none unless set)."""
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.index_funcs = indexes or {}
        super().__init__({}, {name: {} for name in self.index_funcs})
        self.handler = handler
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self._unannounced: set[str] = set()
        """Keys of objects taken from this process's own writes (`assume`) whose version
        no handler has been given yet: a relist hands them over even when it lists the
        same version (the watch that would have brought it expired)."""
        self.failures = 0
        """Lists and watches that failed in a row (`retry_delay`)."""

    # ----- writes this process made ------------------------------------------------------

    def put(self, obj: Object) -> None:
        """Take `obj` into the cache as it is, indexes and all: for a cache filled without
        a watch (the bench's handlers, tests)."""
        key = object_key(obj)
        old = self.store.get(key)
        self.store[key] = obj
        self._reindex(key, old, obj)

    def assume(self, obj: Object) -> None:
        """Take the object as the API server returned it from this process's own write,
        when it is newer than the cached one, so that readers see the write at once rather
        than when the watch brings it; the watch's event for it still reaches the handler.
        An object the cache does not hold (just created) is taken only while the watch has
        not reached its version: past it, the watch has told what became of it. While the
        cache relists (no version: its watch expired), it is taken: the relist keeps what
        is newer than its list and drops what the list shows gone, and the watch from the
        list brings what became of it. Dropped, a placeholder the controller just created
        would be missing from the cache for the whole relist, and made again each pass."""
        key = object_key(obj)
        old = self.store.get(key)
        if old is None and self.resource_version and not _after(obj, self.resource_version):
            return
        if old is not None and not _newer(obj, old):
            return
        kept = obj if self.keep is None else self.keep(obj)
        self.store[key] = kept
        self._reindex(key, old, kept)
        if self.handler is not None:
            self._unannounced.add(key)

    # ----- reading --------------------------------------------------------------------

    def frozen(self, *indexes: str) -> Store:
        """What the cache holds now, with the named indexes, as it stays: later events
        change the informer, never the store returned, which may be read from another
        thread. Costs a copy of the dict of objects and of each index named (no object
        is copied: objects and index entries are only ever replaced)."""
        return Store(dict(self.store), {name: dict(self.indexes[name]) for name in indexes})

    # ----- keeping up to date ---------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                if not self.resource_version:
                    await self._relist()
                started = loop.time()
                events = await self._watch()
                if events == 0 and loop.time() - started < SHORT_WATCH:
                    # Closed as soon as opened (an API server shutting down, a proxy):
                    # opened again at once, it would be opened again hundreds of times
                    # a second.
                    await self._failed("ended as soon as it began")
            except asyncio.CancelledError:
                raise
            except KubeError as error:
                if error.gone and self.resource_version:
                    log.info("watch of %s expired (%s); relisting", self.resource.plural, error)
                    self.resource_version = ""
                    continue
                # 410 from a relist: its continue token expired while it paged.
                await self._failed(f"failed: {error}")
            except Exception as error:  # the connection dropped, a proxy timed out, ...
                await self._failed(f"interrupted: {error!r}")

    async def _failed(self, why: str) -> None:
        self.failures += 1
        delay = retry_delay(self.failures)
        log.warning("watch of %s %s; again in %.1f s", self.resource.plural, why, delay)
        await asyncio.sleep(delay)

    async def _relist(self) -> None:
        items, snapshot = await self._list_all()
        self.relists += 1
        # What is listed first, then what is gone: with turns of the loop in between, a
        # reader (the ledger's free capacity) meanwhile sees a pod bound since counted,
        # and one deleted since still counted: less room than there is, never more.
        for n, item in enumerate(items.values(), 1):
            key = object_key(item)
            old = self.store.get(key)
            fresh = (
                old is None
                or (
                    not _after(old, snapshot)
                    and old["metadata"].get("resourceVersion")
                    != item["metadata"].get("resourceVersion")
                )
                or (key in self._unannounced and not _after(old, snapshot))
            )
            if fresh:
                await self._apply("MODIFIED" if old else "ADDED", item)
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        for n, key in enumerate(list(self.store), 1):
            # What the cache holds from after the list's snapshot (a watch event, an own
            # write) is newer than the list: the watch from the snapshot brings what
            # became of it. Reported deleted now, it would vanish until then.
            held = self.store.get(key)
            if held is not None and key not in items and not _after(held, snapshot):
                await self._apply("DELETED", held)
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        self.resource_version = snapshot
        self.failures = 0
        self.synced.set()

    async def _list_all(self) -> tuple[dict[str, Object], str]:
        """Every object, by key, page after page of one consistent list, and the list's
        resourceVersion (its snapshot)."""
        items: dict[str, Object] = {}
        continue_token: str | None = None
        while True:
            page = await self.kube.list(
                self.resource,
                namespace=self.namespace,
                label_selector=self.label_selector,
                limit=500,
                continue_=continue_token,
            )
            kind = page.get("kind", "").removesuffix("List")
            for item in page.get("items", []):
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", page.get("apiVersion"))
                items[object_key(item)] = item
            continue_token = page.get("metadata", {}).get("continue")
            if not continue_token:
                return items, page.get("metadata", {}).get("resourceVersion", "")

    async def _watch(self) -> int:
        """Follow the watch until it ends; the number of events it brought."""
        events = 0
        async for event in self.kube.watch(
            self.resource,
            resource_version=self.resource_version,
            namespace=self.namespace,
            label_selector=self.label_selector,
            gather=self.gather,
            timeout_seconds=random.randint(WATCH_TIMEOUT, 2 * WATCH_TIMEOUT),
        ):
            kind, obj = event.get("type"), event.get("object", {})
            if kind == "ERROR":
                raise KubeError(int(obj.get("code", 500)), obj)
            events += 1
            self.failures = 0
            version = (obj.get("metadata") or {}).get("resourceVersion") if obj else None
            if kind == "BOOKMARK":
                self.resource_version = version or self.resource_version
                continue
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                if not isinstance(version, str) or not version:
                    # The API server always sets it: an event without one is skipped,
                    # not met again on every watch from the same place.
                    log.warning(
                        "watch of %s: an event without resourceVersion, skipped",
                        self.resource.plural,
                    )
                    continue
                await self._apply(kind, obj)
                self.resource_version = version
            # The events of a burst arrive in one read, and the loop would handle them
            # all before anything else: requests, probes and lease renewals would wait
            # behind the burst. One event, then whatever else is ready.
            await asyncio.sleep(0)
        return events

    async def _apply(self, kind: str, obj: Object) -> None:
        """Take one event into the cache and hand it to the handler. An object the cache
        or the handler cannot take is logged by name and skipped: were the error to end
        the watch, the watch would resume from before it, meet it again, and never get
        past it, so that every later change is lost to this cache."""
        try:
            await self._take(kind, obj)
        except Exception:
            log.exception(
                "%s %s: skipped a %s event that could not be handled",
                self.resource.plural,
                _name_of(obj),
                kind,
            )

    async def _take(self, kind: str, obj: Object) -> None:
        key = object_key(obj)
        old = self.store.get(key)
        if kind != "DELETED" and old is not None and _newer(old, obj):
            return  # an own write already assumed is newer than this event
        if kind == "DELETED":
            self.store.pop(key, None)
            self._reindex(key, old, None)
        else:
            kept = obj if self.keep is None else self.keep(obj)
            self.store[key] = kept
            self._reindex(key, old, kept)
        self._unannounced.discard(key)
        if self.handler is not None:
            result = self.handler(kind, obj)
            if result is not None:
                await result

    def _reindex(self, key: str, old: Object | None, new: Object | None) -> None:
        """Move `key` from the index entries of `old` to those of `new` (either None).
        Every index's values are computed before any entry changes, so that no index is
        left half moved. An entry that changes is replaced, never changed in place, so
        that a `frozen` copy of an index keeps its sets as they were; most updates change
        no entry."""
        moves = [
            (name, self._values(name, old), self._values(name, new)) for name in self.index_funcs
        ]
        for name, before, after in moves:
            if before == after:
                continue
            index = self.indexes[name]
            for value in before:
                if value not in after and value in index:
                    rest = index[value] - {key}
                    if rest:
                        index[value] = rest
                    else:
                        del index[value]
            for value in after:
                if value not in before:
                    index[value] = index.get(value, frozenset()) | {key}

    def _values(self, name: str, obj: Object | None) -> list[str]:
        """What index `name` files `obj` under. An object its function cannot read (what
        its author wrote is malformed) is in no entry of that index, the same each time
        it is met, so that taking it in and out again stays consistent."""
        if obj is None:
            return []
        try:
            return list(self.index_funcs[name](obj))
        except Exception:
            log.exception(
                "%s %s: left out of the %r index, which cannot read it",
                self.resource.plural,
                _name_of(obj),
                name,
            )
            return []


def _name_of(obj: Object) -> str:
    """`namespace/name` of an object that may lack either, for a log line."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict):
        return "(an object without metadata)"
    namespace, name = metadata.get("namespace"), metadata.get("name")
    return f"{namespace}/{name}" if namespace else str(name)


def _newer(obj: Object, than: Object) -> bool:
    """Whether `obj` is a later version of the same object than `than`. The API server's
    resourceVersions are etcd revisions; what cannot be compared is not newer."""
    if obj["metadata"].get("uid") != than["metadata"].get("uid"):
        return False
    return _after(obj, than["metadata"].get("resourceVersion"))


def _after(obj: Object, version: str | None) -> bool:
    """Whether `obj` was written after `version` (an etcd revision); what cannot be
    compared is not."""
    mine = obj["metadata"].get("resourceVersion")
    if not (mine and version and mine.isdigit() and version.isdigit()):
        return False
    return int(mine) > int(version)


def pod_node(pod: Object) -> list[str]:
    """Index function: the node a pod is bound to."""
    node = pod.get("spec", {}).get("nodeName")
    return [node] if node else []


def owner_uids(obj: Object) -> list[str]:
    """Index function: the UIDs of an object's owners."""
    return [ref["uid"] for ref in obj.get("metadata", {}).get("ownerReferences") or []]
