"""The informer keeps an exact, indexed copy of the API server's objects."""

from __future__ import annotations

import asyncio
import json

import pytest

from berth.kube.client import PODS, Kube
from berth.kube.informer import Informer, pod_node
from tests.e2e.kube import Cluster

pytestmark = pytest.mark.e2e


def pod(name: str, node: str | None = None) -> str:
    spec: dict[str, object] = {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    if node:
        spec["nodeName"] = node
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


async def test_informer_follows_create_update_delete_with_index(
    cluster: Cluster, namespace: str, kube: Kube
) -> None:
    seen: list[tuple[str, str]] = []
    informer = Informer(
        kube,
        PODS,
        namespace=namespace,
        indexes={"node": pod_node},
        handler=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
    )
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        await cluster.aapply(pod("a", node="node-1"), namespace)
        await cluster.await_(
            lambda: informer.by_index("node", "node-1"), what="pod a indexed under node-1"
        )
        await cluster.akubectl("label", "pod", "a", "-n", namespace, "color=blue")
        await cluster.await_(
            lambda: (
                (informer.get(f"{namespace}/a") or {})
                .get("metadata", {})
                .get("labels", {})
                .get("color")
                == "blue"
            ),
            what="the label to arrive",
        )
        await cluster.akubectl("delete", "pod", "a", "-n", namespace, "--wait=false")
        await cluster.await_(
            lambda: informer.get(f"{namespace}/a") is None, what="the deletion to arrive"
        )
        assert informer.by_index("node", "node-1") == []
        assert ("ADDED", "a") in seen
        assert ("DELETED", "a") in seen
    finally:
        task.cancel()


async def test_informer_catches_up_after_missing_events(
    cluster: Cluster, namespace: str, kube: Kube
) -> None:
    seen: list[tuple[str, str]] = []
    informer = Informer(
        kube,
        PODS,
        namespace=namespace,
        handler=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
    )
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        await cluster.aapply(pod("kept"), namespace)
        await cluster.aapply(pod("doomed"), namespace)
        await cluster.await_(lambda: len(informer.store) == 2, what="both pods cached")

        # Away, then resume the watch from the last version seen: nothing is lost.
        task.cancel()
        await cluster.aapply(pod("missed"), namespace)
        task = asyncio.create_task(informer.run())
        await cluster.await_(
            lambda: informer.get(f"{namespace}/missed"),
            what="the resumed watch to deliver the missed pod",
        )
        assert informer.relists == 1

        # Away again, and this time the version is forgotten (as after a 410): the relist
        # reports what vanished meanwhile as DELETED.
        task.cancel()
        await cluster.akubectl(
            "delete", "pod", "doomed", "-n", namespace, "--grace-period=0", "--force"
        )
        informer.resource_version = ""
        task = asyncio.create_task(informer.run())
        await cluster.await_(lambda: informer.relists == 2, what="the relist")
        assert informer.get(f"{namespace}/doomed") is None
        assert ("DELETED", "doomed") in seen
        assert informer.get(f"{namespace}/kept") is not None
    finally:
        task.cancel()


async def test_an_object_its_handler_cannot_take_does_not_stop_the_watch(
    cluster: Cluster, namespace: str, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that fails on one object (as the ledger did on a quantity it could not
    read): that event is logged by name and skipped, and the watch goes on past it,
    without restarting, to the objects that come after."""
    seen: list[str] = []

    def handler(kind: str, obj: dict[str, object]) -> None:
        name = obj["metadata"]["name"]  # type: ignore[index]
        if name == "bad":
            raise ValueError("invalid quantity '1.5 cores'")
        seen.append(f"{kind} {name}")

    informer = Informer(kube, PODS, namespace=namespace, handler=handler)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        await cluster.aapply(pod("bad"), namespace)
        await cluster.aapply(pod("later"), namespace)
        await cluster.await_(lambda: "ADDED later" in seen, what="the pod after the bad one")
        bad = informer.get(f"{namespace}/bad")
        assert bad is not None, "the cache holds what the API server holds"
        assert int(informer.resource_version) >= int(bad["metadata"]["resourceVersion"])
        assert f"pods {namespace}/bad: skipped a ADDED event" in caplog.text
        assert "interrupted" not in caplog.text, "the watch went on without restarting"
        assert informer.relists == 1
    finally:
        task.cancel()
