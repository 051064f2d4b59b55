"""The informer's cache takes this process's own writes: newer versions only, never older;
and a frozen copy of it stays as it was taken while events go on."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from berth.api.keys import SOFT_EVICTION
from berth.eviction import soft_evicted as soft_evicted_pod
from berth.eviction import soft_eviction_job
from berth.kube.client import PODMIGRATIONJOBS, PODS, Kube, KubeError
from berth.kube.informer import (
    YIELD_EVERY,
    Informer,
    identity_only,
    pod_node,
    retry_delay,
    without_managed_fields,
)


def version(rv: str, *, phase: str, uid: str = "uid-1") -> dict[str, Any]:
    return {
        "metadata": {"name": "job-1", "uid": uid, "resourceVersion": rv},
        "status": {"phase": phase},
    }


def cache() -> tuple[Informer, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    informer = Informer(
        cast(Kube, None),
        PODMIGRATIONJOBS,
        indexes={"phase": lambda o: [o["status"]["phase"]]},
        handler=lambda kind, obj: seen.append((kind, obj["metadata"]["resourceVersion"])),
    )
    asyncio.run(informer._apply("ADDED", version("10", phase="Pending")))
    return informer, seen


def test_an_own_write_is_seen_at_once_and_its_event_still_reaches_the_handler() -> None:
    informer, seen = cache()
    informer.assume(version("12", phase="Running"))
    assert informer.get("job-1") == version("12", phase="Running")
    assert [o["metadata"]["name"] for o in informer.by_index("phase", "Running")] == ["job-1"]
    assert informer.by_index("phase", "Pending") == []
    # A watch event older than the write does not take the cache back; the write's own
    # event does reach the handler.
    asyncio.run(informer._apply("MODIFIED", version("11", phase="Pending")))
    asyncio.run(informer._apply("MODIFIED", version("12", phase="Running")))
    assert informer.get("job-1") == version("12", phase="Running")
    assert seen == [("ADDED", "10"), ("MODIFIED", "12")]


def test_what_is_not_newer_is_not_assumed() -> None:
    informer, _ = cache()
    for stale in (
        version("9", phase="Running"),
        version("10", phase="Running"),
        version("12", phase="Running", uid="uid-2"),
        version("", phase="Running"),
    ):
        informer.assume(stale)
        assert informer.get("job-1") == version("10", phase="Pending")


def created(name: str, rv: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv},
        "status": {"phase": "Pending"},
    }


def test_an_object_just_created_is_seen_at_once_until_the_watch_passed_it() -> None:
    """Its creation is not yet in the watch: the cache takes it (so that the next pass
    does not create it again). Past it, the watch has said what became of it (here: it
    was deleted before the create's response came), so it is not brought back."""
    informer, _ = cache()
    informer.resource_version = "15"
    informer.assume(created("job-2", "20"))
    assert informer.get("job-2") == created("job-2", "20")
    informer.assume(created("job-3", "14"))
    assert informer.get("job-3") is None


async def test_an_object_created_while_the_cache_relists_is_seen_at_once() -> None:
    """Its watch expired (410): the cache holds no version while it lists again. A
    placeholder the controller creates meanwhile is taken at once (left out, the next pass
    would find it missing and make another, and so on until the relist ended); the relist
    keeps it, newer than its snapshot, and drops one the list shows gone."""
    informer = Informer(
        cast(Kube, _Lister([on_node("kept", "node-1", rv="5")], version="20")),
        PODS,
    )
    informer.put(on_node("kept", "node-1", rv="5"))
    informer.resource_version = ""  # relisting
    informer.assume(on_node("created-since", "node-1", rv="25"))
    informer.assume(on_node("deleted-before-the-list", "node-1", rv="18"))
    assert informer.get("ns/created-since") is not None
    await informer._relist()
    assert names(informer.values()) == ["created-since", "kept"]


def on_node(name: str, node: str, rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv},
        "spec": {"nodeName": node},
    }


def names(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objects)


async def test_a_frozen_copy_stays_as_it_was_taken() -> None:
    informer = Informer(cast(Kube, None), PODS, indexes={"node": pod_node})
    for name in ("a", "b"):
        await informer._apply("ADDED", on_node(name, "node-1"))
    frozen = informer.frozen("node")
    await informer._apply("MODIFIED", on_node("a", "node-2", rv="2"))
    await informer._apply("DELETED", on_node("b", "node-1"))
    await informer._apply("ADDED", on_node("c", "node-1"))
    informer.assume(on_node("c", "node-3", rv="3"))
    assert names(frozen.values()) == ["a", "b"]
    assert frozen.get("ns/a") == on_node("a", "node-1")
    assert names(frozen.by_index("node", "node-1")) == ["a", "b"]
    assert frozen.by_index("node", "node-2") == []
    # The informer itself moved on.
    assert names(informer.values()) == ["a", "c"]
    assert names(informer.by_index("node", "node-2")) == ["a"]
    assert names(informer.by_index("node", "node-3")) == ["c"]
    assert informer.by_index("node", "node-1") == []
    assert set(informer.indexes["node"]) == {"node-2", "node-3"}


async def test_an_update_that_moves_no_index_entry_leaves_the_index_as_it_was() -> None:
    informer = Informer(cast(Kube, None), PODS, indexes={"node": pod_node})
    await informer._apply("ADDED", on_node("a", "node-1"))
    await informer._apply("ADDED", on_node("b", "node-1"))
    entry = informer.indexes["node"]["node-1"]
    await informer._apply("MODIFIED", on_node("a", "node-1", rv="2"))
    assert informer.indexes["node"]["node-1"] is entry
    assert informer.get("ns/a") == on_node("a", "node-1", rv="2")


async def test_an_object_an_index_cannot_read_leaves_every_index_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pod's author writes what an index function cannot read: that index leaves the
    pod out, every other index takes it, and its deletion leaves no entry behind (an
    entry naming a key the store lost would fail every later read of it)."""

    def soft_evicted(pod: Any) -> list[str]:
        return ["yes"] if soft_eviction_job(pod) or soft_evicted_pod(pod) else []

    informer = Informer(
        cast(Kube, None),
        PODS,
        indexes={"soft": soft_evicted, "broken": lambda pod: [pod["spec"]["missing"]],
                 "node": pod_node},
    )  # fmt: skip
    poisoned = on_node("a", "node-1")
    poisoned["metadata"]["annotations"] = {SOFT_EVICTION: "[" * 5000}
    await informer._apply("ADDED", poisoned)
    assert [p["metadata"]["name"] for p in informer.by_index("node", "node-1")] == ["a"]
    assert informer.by_index("soft", "yes") == [informer.get("ns/a")]
    assert "pods ns/a: left out of the 'broken' index" in caplog.text
    await informer._apply("MODIFIED", on_node("a", "node-2", rv="2"))
    await informer._apply("DELETED", on_node("a", "node-2", rv="3"))
    assert informer.indexes == {"soft": {}, "broken": {}, "node": {}}
    assert soft_eviction_job(poisoned) is None


def test_an_event_the_handler_cannot_take_is_logged_by_name_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    def handler(kind: str, obj: Any) -> None:
        if obj["metadata"]["name"] == "bad":
            raise ValueError("invalid quantity '1.5 cores'")
        seen.append(f"{kind} {obj['metadata']['name']}")

    informer = Informer(cast(Kube, None), PODMIGRATIONJOBS, handler=handler)
    for name in ("bad", "good"):
        asyncio.run(informer._apply("ADDED", {"metadata": {"name": name, "resourceVersion": "1"}}))
    assert seen == ["ADDED good"]
    assert "podmigrationjobs bad: skipped a ADDED event" in caplog.text
    assert "invalid quantity '1.5 cores'" in caplog.text


def test_a_cache_may_keep_only_who_an_object_is_while_its_handler_gets_all() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    informer = Informer(
        cast(Kube, None),
        PODS,
        handler=lambda kind, obj: seen.append((kind, obj)),
        keep=identity_only,
    )
    whole: dict[str, Any] = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "10",
            "labels": {"app": "x"},
        },
        "spec": {"nodeName": "node-0", "containers": [{"name": "c"}]},
    }
    asyncio.run(informer._apply("ADDED", whole))
    identity: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "10"}
    }
    assert informer.get("ns/p") == identity
    assert seen == [("ADDED", whole)]
    # Versions still order writes: an older event does not replace an own newer write.
    informer.assume({**whole, "metadata": {**whole["metadata"], "resourceVersion": "12"}})
    asyncio.run(informer._apply("MODIFIED", whole))
    assert informer.get("ns/p") == {"metadata": {**identity["metadata"], "resourceVersion": "12"}}
    assert len(seen) == 1


def test_a_lean_cache_leaves_out_managed_fields_and_nothing_else() -> None:
    managed = [{"manager": "kwok", "operation": "Update", "fieldsV1": {"f:status": {}}}]
    whole: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "managedFields": managed},
        "spec": {"nodeName": "node-0"},
    }
    lean = without_managed_fields(whole)
    assert lean == {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": whole["spec"],
    }
    assert whole["metadata"]["managedFields"] == managed  # the event itself is left whole
    assert without_managed_fields(lean) is lean


class _Burst:
    """A watch whose events all arrive in one read: iterating it never waits."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    async def watch(self, _resource: Any, **_: Any) -> AsyncIterator[dict[str, Any]]:
        for event in self.events:
            yield event


async def test_a_burst_of_events_lets_other_work_of_the_loop_run_between_them() -> None:
    """A thousand bound pods arrive in one read while the scheduler waits for the
    extender's answer: the request is served after an event, not after the burst."""
    burst = [
        {"type": "ADDED", "object": on_node(f"p-{index}", "node-1", rv=str(index + 1))}
        for index in range(1000)
    ]
    seen: list[str] = []
    informer = Informer(cast(Kube, _Burst(burst)), PODS, handler=lambda kind, _: seen.append(kind))
    taken_when_served: list[int] = []

    async def request() -> None:
        taken_when_served.append(len(seen))

    served = asyncio.create_task(request())
    await informer._watch()
    await served
    assert len(seen) == 1000
    assert taken_when_served == [1]
    assert informer.resource_version == "1000"


async def test_an_event_without_a_resource_version_is_skipped_not_met_again() -> None:
    """The API server always sets one; were it missing, the watch would start again from
    the same place and meet the same event for ever."""
    events = [
        {"type": "ADDED", "object": on_node("p-1", "node-1", rv="1")},
        {"type": "ADDED", "object": {"metadata": {"name": "odd", "namespace": "ns", "uid": "u"}}},
        {"type": "BOOKMARK", "object": {"metadata": {}}},
        {"type": "ADDED", "object": on_node("p-2", "node-1", rv="3")},
    ]
    seen: list[str] = []
    informer = Informer(
        cast(Kube, _Burst(events)),
        PODS,
        handler=lambda _, obj: seen.append(obj["metadata"]["name"]),
    )
    await informer._watch()
    assert seen == ["p-1", "p-2"]
    assert informer.resource_version == "3"


class _Lister:
    """An API server that answers a list with `items` at the snapshot `version`."""

    def __init__(self, items: list[dict[str, Any]], version: str) -> None:
        self.page = {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": version},
            "items": items,
        }

    async def list(self, _resource: Any, **_: Any) -> dict[str, Any]:
        return self.page


async def test_a_relist_leaves_what_is_newer_than_its_snapshot_to_the_watch() -> None:
    """After a 410 the informer lists again. An object it holds from after the list's
    snapshot (created since, or updated since by its own write) is not reported deleted,
    nor put back to the listed version: the watch from the snapshot tells what became of
    it. An object the snapshot no longer has, and held from before it, is gone."""
    informer = Informer(
        cast(Kube, _Lister([on_node("kept", "node-1", rv="5")], version="20")),
        PODS,
        handler=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
    )
    seen: list[tuple[str, str]] = []
    for pod in (
        on_node("gone", "node-1", rv="3"),
        on_node("created-since", "node-1", rv="25"),
        on_node("kept", "node-2", rv="22"),  # updated since the snapshot
    ):
        informer.put(pod)
    await informer._relist()
    assert seen == [("DELETED", "gone")]
    assert names(informer.values()) == ["created-since", "kept"]
    assert informer.get("ns/kept")["spec"]["nodeName"] == "node-2"  # type: ignore[index]
    assert informer.resource_version == "20"


async def test_an_own_write_the_expired_watch_never_brought_reaches_the_handler_by_the_relist() -> (
    None
):
    """A write taken at once (`assume`), then the watch expired before its event came: the
    relist lists that same version, and hands it to the handler, which never saw it (a
    Reservation turning Available, for the ledger)."""
    seen: list[tuple[str, str]] = []
    informer = Informer(
        cast(Kube, _Lister([on_node("mine", "node-2", rv="12")], version="20")),
        PODS,
        handler=lambda kind, obj: seen.append((kind, obj["metadata"]["resourceVersion"])),
    )
    await informer._apply("ADDED", on_node("mine", "node-1", rv="10"))
    informer.resource_version = "10"
    informer.assume(on_node("mine", "node-2", rv="12"))
    await informer._relist()
    assert seen == [("ADDED", "10"), ("MODIFIED", "12")]
    # Handed over once: the next relist of the same version is quiet.
    await informer._relist()
    assert seen == [("ADDED", "10"), ("MODIFIED", "12")]


def meta(name: str, rv: str) -> dict[str, str]:
    return {"name": name, "uid": "u2", "resourceVersion": rv}


def test_an_added_event_older_than_an_own_write_does_not_take_the_cache_back() -> None:
    """Created (assumed at 500), patched (assumed at 520), then the watch's ADDED of the
    creation: the cache keeps the patch, as for a MODIFIED older than a write."""
    informer, seen = cache()
    informer.resource_version = "400"  # where the watch stands
    for rv, phase in (("500", "Pending"), ("520", "Running")):
        informer.assume(version(rv, phase=phase, uid="u2") | {"metadata": meta("job-2", rv)})
    created = version("500", phase="Pending", uid="u2") | {"metadata": meta("job-2", "500")}
    asyncio.run(informer._apply("ADDED", created))
    assert informer.get("job-2")["status"]["phase"] == "Running"  # type: ignore[index]
    assert seen == [("ADDED", "10")]


def test_failures_in_a_row_back_off_to_half_a_minute_at_random() -> None:
    delays = [retry_delay(n) for n in range(1, 12)]
    assert 0.8 <= delays[0] <= 1.2
    assert 1.6 <= delays[1] <= 2.4
    assert all(24 <= d <= 36 for d in delays[6:])
    assert retry_delay(10_000) <= 36


async def test_a_relist_lets_other_work_of_the_loop_run_while_it_is_taken() -> None:
    """A relist of thousands of objects (a watch expired on a large cluster) is handed to
    the handler between turns of the loop: a lease renewal or a probe waits for at most
    `YIELD_EVERY` objects, not for the whole list."""
    listed = [on_node(f"p-{index}", "node-1", rv=str(index + 1)) for index in range(2000)]
    seen: list[str] = []
    informer = Informer(
        cast(Kube, _Lister(listed, version="3000")), PODS, handler=lambda kind, _: seen.append(kind)
    )
    turns: list[int] = []

    async def other_work() -> None:
        while len(seen) < 2000:
            turns.append(len(seen))
            await asyncio.sleep(0)

    other = asyncio.create_task(other_work())
    await informer._relist()
    await other
    assert len(seen) == 2000
    assert max(b - a for a, b in itertools.pairwise(turns)) <= YIELD_EVERY


async def test_an_error_in_the_stream_keeps_the_back_off() -> None:
    """A watch that keeps failing with an ERROR event (not 410) backs off further; only a
    real event shows it working again."""
    failing = [{"type": "ERROR", "object": {"code": 500, "message": "etcd is down"}}]
    informer = Informer(cast(Kube, _Burst(failing)), PODS)
    informer.failures = 3
    with pytest.raises(KubeError):
        await informer._watch()
    assert informer.failures == 3
    informer.kube = cast(Kube, _Burst([{"type": "ADDED", "object": on_node("p", "n", rv="1")}]))
    await informer._watch()
    assert informer.failures == 0


class _ClosedAtOnce(_Burst):
    """A watch the other end closes as soon as it is opened, counted."""

    def __init__(self) -> None:
        super().__init__([])
        self.opened = 0

    async def watch(self, _resource: Any, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.opened += 1
        await asyncio.sleep(0)  # a connection's turn of the loop
        for event in self.events:
            yield event


async def test_a_watch_closed_as_soon_as_it_opens_is_opened_again_only_after_a_wait() -> None:
    """An API server shutting down, or a proxy, ends every watch at once: the informer
    waits as after a failure rather than open one after another without end."""
    kube = _ClosedAtOnce()
    informer = Informer(cast(Kube, kube), PODS)
    informer.resource_version = "10"  # synced: only watching
    task = asyncio.create_task(informer.run())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert kube.opened == 1
    assert informer.failures == 1
