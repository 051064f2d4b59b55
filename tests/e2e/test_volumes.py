"""A pod whose claim is bound to a volume usable on some nodes only (a zonal disk, a
local volume) gets its Reservation where that volume may be used: its replacement mounts
the same claim, and kube-scheduler puts it nowhere else."""

from __future__ import annotations

import json

import pytest

from tests.e2e.capacity import shape_free_cpu
from tests.e2e.kube import Cluster
from tests.e2e.migrate import deployment, job_manifest, phase_is, ready_pods

pytestmark = pytest.mark.e2e

USABLE_ON = ["node-0", "node-1"]


def volume(name: str, namespace: str) -> str:
    """A local volume on node-0 and node-1 (by their hostname label), bound ahead to the
    claim `data` of `namespace`."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "local": {"path": "/tmp"},
                "claimRef": {"namespace": namespace, "name": "data"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": USABLE_ON,
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        }
    )


CLAIM = json.dumps(
    {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
)


async def test_a_pods_reservation_is_made_where_its_volume_may_be_used(
    cluster: Cluster, namespace: str
) -> None:
    pv = f"pv-{namespace}"[:60]
    await cluster.aapply(volume(pv, namespace))
    try:
        await cluster.aapply(CLAIM, namespace)
        mounting = {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
        await cluster.aapply(deployment("db", spec_extra=mounting), namespace)
        [old] = await cluster.await_(
            lambda: ready_pods(cluster, namespace, "db", 1), what="the pod on its volume's nodes"
        )
        source = old["spec"]["nodeName"]
        assert source in USABLE_ON
        other = next(node for node in USABLE_ON if node != source)
        # The node the volume cannot be used on is by far the emptiest: the scheduler
        # would place a Reservation that does not know of the volume there.
        await shape_free_cpu(cluster, namespace, {"node-0": "1", "node-1": "1", "node-2": "6"})
        name, manifest = job_manifest(old)
        await cluster.aapply(manifest)
        job = await cluster.await_(
            lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the migration to end"
        )
        assert job["status"]["phase"] == "Succeed", job["status"]
        assert job["status"]["nodeName"] == other
        [new] = await cluster.await_(
            lambda: ready_pods(cluster, namespace, "db", 1), what="the replacement Ready"
        )
        assert new["spec"]["nodeName"] == other
    finally:
        await cluster.akubectl("delete", "pv", pv, "--ignore-not-found", "--wait=false")
