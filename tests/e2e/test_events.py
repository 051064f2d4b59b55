"""Events as the API server takes them: a story told again is one Event with a count, and
a message longer than an Event holds is cut rather than refused."""

from __future__ import annotations

import asyncio

import pytest

from berth.kube.client import EVENTS, Kube
from berth.kube.events import NOTE_LIMIT, Recorder

pytestmark = pytest.mark.e2e


def about(namespace: str, name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
    }


async def events_of(kube: Kube, namespace: str, name: str) -> list[dict[str, object]]:
    listed = await kube.list(
        EVENTS, namespace=namespace, field_selector=f"involvedObject.name={name}"
    )
    return sorted(listed["items"], key=lambda e: str(e["message"]))


async def test_an_event_told_again_is_one_event_with_its_count(kube: Kube, namespace: str) -> None:
    recorder = Recorder(kube, component="berth-e2e", instance="e2e", update_every=0)
    pod = about(namespace, "web-0")
    for _ in range(3):
        await recorder.record(pod, "EvictionAllowed", "the job was refused", "Warning")
    await recorder.record(pod, "EvictionAllowed", "another story", "Warning")
    told = await events_of(kube, namespace, "web-0")
    assert [(e["message"], e["count"]) for e in told] == [
        ("another story", 1),
        ("the job was refused", 3),
    ]
    # Told again at most every `update_every` seconds: counted, written later.
    slow = Recorder(kube, component="berth-e2e", instance="e2e", update_every=3600)
    for _ in range(3):
        await slow.record(about(namespace, "web-1"), "Reason", "again")
    assert [e["count"] for e in await events_of(kube, namespace, "web-1")] == [1]


async def test_a_message_longer_than_an_event_holds_is_cut(kube: Kube, namespace: str) -> None:
    recorder = Recorder(kube, component="berth-e2e", instance="e2e")
    long = "preempted " + ", ".join(f"{namespace}/pod-{i}" for i in range(200))
    assert len(long) > NOTE_LIMIT
    await recorder.record(about(namespace, "web-2"), "Preempted", long, "Warning")
    [event] = await events_of(kube, namespace, "web-2")
    message = str(event["message"])
    assert len(message) == NOTE_LIMIT
    assert message == long[: NOTE_LIMIT - 3] + "..."


async def test_an_event_deleted_meanwhile_is_told_anew(kube: Kube, namespace: str) -> None:
    recorder = Recorder(kube, component="berth-e2e", instance="e2e", update_every=0)
    pod = about(namespace, "web-3")
    await recorder.record(pod, "Reason", "told")
    [first] = await events_of(kube, namespace, "web-3")
    await kube.delete(EVENTS, str(first["metadata"]["name"]), namespace=namespace)  # type: ignore[index]
    await recorder.record(pod, "Reason", "told")  # the count's patch finds nothing
    await recorder.record(pod, "Reason", "told")
    assert [e["count"] for e in await events_of(kube, namespace, "web-3")] == [1]


async def test_the_same_event_told_at_once_is_one_event(kube: Kube, namespace: str) -> None:
    """The webhook tells each event from a task of its own: the same one told by several
    at once is one Event, not one each."""
    recorder = Recorder(kube, component="berth-e2e", instance="e2e", update_every=3600)
    pod = about(namespace, "web-4")
    await asyncio.gather(*(recorder.record(pod, "Reason", "at once") for _ in range(3)))
    assert [e["count"] for e in await events_of(kube, namespace, "web-4")] == [1]
