"""What the caches of pods and workloads keep (`controller.caches.lean_pod`,
`lean_workload`): less memory, and nothing the controller reads changes. Every reader is
compared on the whole object and on what the cache keeps of it."""

from __future__ import annotations

import copy
from typing import Any, cast

from berth import protocol
from berth.api import keys
from berth.eviction import is_healthy
from berth.kube.client import Kube
from berth.resources import pod_requests
from berth.scheduling import node_affinity_matches, qos_class, taints_tolerated
from berth.settings import MigrationControllerArgs
from controller import build
from controller.arbitration.candidates import PodFacts
from controller.arbitration.workloads import replicas_of, rollout_of, workload_limits
from controller.caches import Caches, lean_pod, lean_workload
from tests.unit.builders import job

Object = dict[str, Any]


def running_pod() -> Object:
    """A ReplicaSet's running pod as the API server returns it, with all a cache could
    leave out: managedFields, the service account's projected volume, a container's image,
    environment and probes, container statuses, addresses."""
    container: Object = {
        "name": "app",
        "image": "registry.example/web:1.2",
        "command": ["/web"],
        "env": [{"name": "MODE", "value": "prod"}],
        "ports": [{"containerPort": 8080, "hostPort": 80, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": "250m", "memory": "64Mi"},
            "limits": {"cpu": "500m", "memory": "64Mi"},
        },
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "terminationMessagePath": "/dev/termination-log",
        "imagePullPolicy": "IfNotPresent",
    }
    sidecar: Object = {
        **copy.deepcopy(container),
        "name": "proxy",
        "restartPolicy": "Always",
        "ports": [{"containerPort": 9000}],
        "resources": {"requests": {"cpu": "50m"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-1",
            "namespace": "default",
            "uid": "uid-web-1",
            "resourceVersion": "42",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "web"},
            "annotations": {keys.CLAIM: "tok"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d4",
                    "uid": "uid-rs",
                    "controller": True,
                }
            ],
            "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "nodeName": "node-1",
            "schedulerName": "default-scheduler",
            "priority": 100,
            "priorityClassName": "web",
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "nodeSelector": {"zone": "a"},
            "schedulingGates": [{"name": "other.example/gate"}],
            "overhead": {"cpu": "10m"},
            "initContainers": [sidecar],
            "containers": [container],
            "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
            "volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": "claim", "persistentVolumeClaim": {"claimName": "web-data"}},
                {"name": "config", "configMap": {"name": "web"}},
                {
                    "name": "kube-api-access-x",
                    "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
                },
            ],
        },
        "status": {
            "phase": "Running",
            "qosClass": "Burstable",
            "nominatedNodeName": "node-2",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [{"name": "app", "ready": True, "restartCount": 0}],
            "initContainerStatuses": [{"name": "proxy", "ready": True, "restartCount": 0}],
            "podIP": "10.0.0.5",
            "podIPs": [{"ip": "10.0.0.5"}],
            "hostIP": "192.168.0.1",
            "hostIPs": [{"ip": "192.168.0.1"}],
        },
    }


def facts(pod: Object) -> dict[str, Any]:
    """What the arbitration reads of the pod; of its spec (kept for the node fit and the
    limits), what those read."""
    read = PodFacts(pod)
    node = {
        "metadata": {"name": "node-2", "labels": {"zone": "a"}},
        "spec": {"taints": [{"key": "dedicated", "effect": "NoSchedule"}]},
    }
    return {name: getattr(read, name) for name in PodFacts.__slots__ if name != "spec"} | {
        "requests": pod_requests(read.spec),
        "affinity": node_affinity_matches(read.spec, "node-2", {"zone": "a"}),
        "tolerated": taints_tolerated(read.spec, node),
    }


def test_every_reader_reads_the_same_of_the_lean_pod() -> None:
    whole = running_pod()
    lean = lean_pod(whole)

    def reservation(pod: Object) -> Object:
        return build.reservation_for(job=job(), pod=pod, workload_uid="uid-deploy", ttl="5m")

    assert reservation(lean) == reservation(whole)
    assert facts(lean) == facts(whole)
    assert facts(lean)["local_storage"] == "emptyDir volume data"
    assert facts(lean)["pvc"] == "volume claim"
    assert pod_requests(lean["spec"]) == pod_requests(whole["spec"])
    assert qos_class(lean) == qos_class(whole)
    without_class = copy.deepcopy(whole)
    del without_class["status"]["qosClass"]
    assert qos_class(lean_pod(without_class)) == qos_class(without_class) == "Burstable"
    for read in (protocol.is_ready, is_healthy, protocol.pod_claim, protocol.is_gated):
        assert read(lean) == read(whole)
    assert protocol.controller_of(lean) == protocol.controller_of(whole)
    assert lean["status"]["nominatedNodeName"] == "node-2"
    assert lean["spec"]["schedulingGates"] == whole["spec"]["schedulingGates"]


def test_the_lean_pod_leaves_out_what_nobody_reads() -> None:
    whole = running_pod()
    kept = copy.deepcopy(whole)
    lean = lean_pod(whole)
    assert whole == kept  # the object handed to the handlers is untouched
    assert "managedFields" not in lean["metadata"]
    assert lean["spec"]["containers"] == [
        {
            "name": "app",
            "resources": whole["spec"]["containers"][0]["resources"],
            "ports": whole["spec"]["containers"][0]["ports"],
        }
    ]
    assert lean["spec"]["initContainers"][0]["restartPolicy"] == "Always"
    assert [v["name"] for v in lean["spec"]["volumes"]] == ["data", "claim"]
    assert "ephemeralContainers" not in lean["spec"]
    assert set(lean["status"]) == {"phase", "qosClass", "nominatedNodeName", "conditions"}


def test_a_pod_without_a_status_or_volumes_is_kept_as_it_is() -> None:
    bare: Object = {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "pause"}]},
    }
    lean = lean_pod(bare)
    assert lean["spec"] == {"containers": [{"name": "c"}]}
    assert lean["metadata"] == bare["metadata"]
    assert not lean.get("status")


async def test_the_pods_cache_keeps_the_lean_pod() -> None:
    cache = Caches(cast(Kube, None), MigrationControllerArgs(), enqueue=lambda _: None)
    whole = running_pod()
    await cache.pods._apply("ADDED", whole)
    assert cache.pods.get("default/web-1") == lean_pod(whole)


def workloads() -> list[Object]:
    """A Deployment, its ReplicaSet and a StatefulSet as the API server returns them."""
    pod = running_pod()
    template: Object = {"metadata": {"labels": {"app": "web"}}, "spec": pod["spec"]}
    managed = pod["metadata"]["managedFields"]

    def workload(kind: str, name: str, spec: Object, status: Object, **meta: Any) -> Object:
        return {
            "apiVersion": "apps/v1",
            "kind": kind,
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": f"uid-{name}",
                "generation": 3,
                "managedFields": managed,
                **meta,
            },
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, **spec},
            "status": {"observedGeneration": 3, **status},
        }

    revision = {"deployment.kubernetes.io/revision": "5"}
    return [
        workload(
            "Deployment",
            "web",
            {"template": template, "strategy": {"type": "RollingUpdate"}},
            {"replicas": 4, "updatedReplicas": 3, "availableReplicas": 3},
            annotations=revision,
        ),
        workload(
            "ReplicaSet",
            "web-7d4",
            {"template": template},
            {"replicas": 3, "availableReplicas": 2},
            annotations=revision,
            ownerReferences=[
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "web",
                    "uid": "uid-web",
                    "controller": True,
                }
            ],
        ),
        workload(
            "StatefulSet",
            "db",
            {
                "template": template,
                "ordinals": {"start": 1},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}],
            },
            {"replicas": 3, "updatedReplicas": 2},
        ),
    ]


def test_every_reader_reads_the_same_of_the_lean_workload() -> None:
    args = MigrationControllerArgs()
    for whole in workloads():
        kept = copy.deepcopy(whole)
        lean = lean_workload(whole)
        assert whole == kept
        assert "managedFields" not in lean["metadata"]
        assert "template" not in lean["spec"]
        assert "volumeClaimTemplates" not in lean["spec"]
        # All else is as it was: whatever reads it reads the same.
        rest = {
            k: v for k, v in whole["spec"].items() if k not in ("template", "volumeClaimTemplates")
        }
        assert lean["spec"] == rest
        assert lean["status"] == whole["status"]
        assert lean["metadata"] == {
            k: v for k, v in whole["metadata"].items() if k != "managedFields"
        }
        assert rollout_of(lean) == rollout_of(whole)
        assert replicas_of(lean, ()) == replicas_of(whole, ()) == 3
        limits = workload_limits("u", lean, (), available=2, args=args)
        assert limits == workload_limits("u", whole, (), available=2, args=args)
        assert protocol.controller_of(lean) == protocol.controller_of(whole)


def test_a_workload_without_a_template_is_kept_as_it_is() -> None:
    for odd in ({"metadata": {"name": "w"}}, {"metadata": {"name": "w"}, "spec": None}):
        assert lean_workload(odd) == odd


async def test_the_workloads_caches_keep_the_lean_workload() -> None:
    cache = Caches(cast(Kube, None), MigrationControllerArgs(), enqueue=lambda _: None)
    deployment, replicaset, statefulset = workloads()
    for informer, whole in (
        (cache.deployments, deployment),
        (cache.replicasets, replicaset),
        (cache.statefulsets, statefulset),
    ):
        await informer._apply("ADDED", whole)
        assert informer.get(f"default/{whole['metadata']['name']}") == lean_workload(whole)
    # The job's view finds the workloads as before.
    made_for = {
        "metadata": {"annotations": {keys.WORKLOAD: deployment["metadata"]["uid"]}},
        "spec": {
            "owners": [
                {"controller": {"kind": "ReplicaSet", "name": "web-7d4", "uid": "uid-web-7d4"}}
            ]
        },
    }
    found = cache.reserved_workload(made_for)
    assert found == {
        "workload": lean_workload(replicaset),
        "deployment": lean_workload(deployment),
        "workload_deleted": None,
    }
    # The ReplicaSet deleted, its Deployment not (a revision history's clean-up): a pod
    # of the Deployment's may still take the place.
    await cache.replicasets._apply("DELETED", replicaset)
    assert cache.reserved_workload(made_for)["workload_deleted"] is None
    await cache.deployments._apply("DELETED", deployment)
    gone = cache.reserved_workload(made_for)["workload_deleted"]
    assert gone == "ReplicaSet web-7d4 (uid uid-web-7d4)"
