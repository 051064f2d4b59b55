"""The API client turns the API server's refusals into KubeError with status and reason."""

from __future__ import annotations

import pytest

from berth.kube.client import PODS, Kube, KubeError

pytestmark = pytest.mark.e2e


async def test_errors_carry_status_and_reason(namespace: str, kube: Kube) -> None:
    with pytest.raises(KubeError) as missing:
        await kube.get(PODS, "no-such-pod", namespace)
    assert missing.value.not_found
    assert missing.value.reason == "NotFound"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }
    created = await kube.create(PODS, pod, namespace=namespace)
    assert created["metadata"]["uid"]
    with pytest.raises(KubeError) as exists:
        await kube.create(PODS, pod, namespace=namespace)
    assert exists.value.conflict
    assert exists.value.reason == "AlreadyExists"
    with pytest.raises(KubeError) as invalid:
        await kube.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "q"},
                "spec": {"containers": []},
            },
            namespace=namespace,
        )
    assert invalid.value.status == 422
    assert "spec.containers" in invalid.value.message
    with pytest.raises(KubeError) as wrong_uid:
        await kube.delete(PODS, "p", namespace=namespace, uid="not-its-uid")
    assert wrong_uid.value.conflict
