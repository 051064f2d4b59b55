"""How long the webhook believes a ReplicaSet it has looked up."""

from __future__ import annotations

from typing import Any, cast

from berth.kube.client import Kube, Resource
from webhook.owners import Owners

REFERENCE = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u-1"}


class ReplicaSets:
    """What the API server holds, and how often it was asked."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.gets = 0

    async def get(self, resource: Resource, name: str, namespace: str) -> dict[str, Any]:
        assert resource.plural == "replicasets"
        self.gets += 1
        return {"metadata": {"name": name, "namespace": namespace, "uid": self.uid}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_replicaset_found_is_not_asked_for_again_for_a_while() -> None:
    api, clock = ReplicaSets("u-1"), Clock()
    owners = Owners(cast(Kube, api), remember=10.0, clock=clock)
    first = await owners.confirmed(REFERENCE, "default")
    assert first is not None
    assert first["metadata"]["uid"] == "u-1"
    clock.now += 9.9
    assert await owners.confirmed(REFERENCE, "default") == first
    assert api.gets == 1
    clock.now += 0.2
    assert await owners.confirmed(REFERENCE, "default") == first
    assert api.gets == 2


async def test_what_is_remembered_is_that_namespace_name_and_uid_only() -> None:
    api = ReplicaSets("u-1")
    owners = Owners(cast(Kube, api), clock=Clock())
    await owners.confirmed(REFERENCE, "default")
    await owners.confirmed(REFERENCE, "other")
    assert await owners.confirmed({**REFERENCE, "uid": "u-2"}, "default") is None
    assert api.gets == 3


async def test_a_replicaset_with_another_uid_is_not_believed_nor_remembered() -> None:
    api = ReplicaSets("u-other")
    owners = Owners(cast(Kube, api), clock=Clock())
    assert await owners.confirmed(REFERENCE, "default") is None
    assert await owners.confirmed(REFERENCE, "default") is None
    assert api.gets == 2
