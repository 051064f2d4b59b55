"""Small builders for API objects used by the pure-decision tests."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from berth.api import API_VERSION, keys
from controller.jobs import marker

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
ADMISSION_KEY = b"k" * 32
"""The key the controller's unit tests sign and check admission marks with."""
Object = dict[str, Any]


def ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str = "web-1",
    *,
    namespace: str = "default",
    node: str | None = "node-0",
    uid: str | None = None,
    cpu: str = "200m",
    rs: str | None = "web-rs",
    ready: bool = True,
    gates: list[str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> Object:
    obj: Object = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "creationTimestamp": ts(T0),
            "labels": labels or {"app": "web"},
            "annotations": annotations or {},
        },
        "spec": {
            "containers": [
                {"name": "app", "image": "app", "resources": {"requests": {"cpu": cpu}}}
            ],
            "schedulerName": "default-scheduler",
        },
        "status": {
            "phase": "Running" if node else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    if node:
        obj["spec"]["nodeName"] = node
    if rs:
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": rs,
                "uid": f"uid-{rs}",
                "controller": True,
            }
        ]
    if gates:
        obj["spec"]["schedulingGates"] = [{"name": gate} for gate in gates]
    return obj


def job(
    name: str = "job-1",
    *,
    pod_name: str = "web-1",
    mode: str = "ReservationFirst",
    ttl: str = "5m0s",  # as the controller records it (a user's `5m` is rewritten first)
    phase: str | None = "Running",
    paused: bool = False,
    conditions: list[Object] | None = None,
    pod_uid: str | None = "uid-web-1",
    reservation_ref: str | None = None,
) -> Object:
    obj: Object = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "PodMigrationJob",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "10",
            "creationTimestamp": ts(T0),
            "annotations": {keys.POD_UID: pod_uid} if pod_uid else {},
        },
        "spec": {
            "podRef": {"namespace": "default", "name": pod_name},
            "mode": mode,
            "ttl": ttl,
            "paused": paused,
        },
        "status": {},
    }
    if phase:
        obj["status"]["phase"] = phase
    if phase == "Running" and pod_uid:  # admitted by arbitration
        obj["metadata"]["annotations"][keys.ADMISSION] = marker.sign(
            ADMISSION_KEY, job_uid=f"uid-{name}", pod_uid=pod_uid, mode=mode
        )
    if conditions:
        obj["status"]["conditions"] = conditions
    if reservation_ref:
        obj["spec"]["reservationOptions"] = {"reservationRef": {"name": reservation_ref}}
    return obj


def reservation(
    name: str = "uid-job-1",
    *,
    phase: str = "Pending",
    node: str | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[str] | None = None,
    ttl: str = "5m",
    job_name: str = "job-1",
) -> Object:
    obj: Object = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {
            "name": name,
            "uid": f"uid-rsv-{name}",
            "resourceVersion": "5",
            "creationTimestamp": ts(T0),
            "annotations": {
                keys.JOB: job_name,
                # The placeholder the controller created for it: `placeholder(name)`.
                keys.PLACEHOLDER: json.dumps(
                    {"name": f"berth-placeholder-{name}", "uid": f"uid-berth-placeholder-{name}"}
                ),
                **(annotations or {}),
            },
        },
        "spec": {
            "template": {
                "metadata": {"namespace": "default"},
                "spec": {
                    "containers": [{"name": "app", "resources": {"requests": {"cpu": "200m"}}}]
                },
            },
            "owners": [
                {
                    "controller": {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": "web-rs",
                        "uid": "uid-web-rs",
                        "namespace": "default",
                    }
                }
            ],
            "ttl": ttl,
        },
        "status": {"phase": phase},
    }
    if node:
        obj["status"]["nodeName"] = node
    if owners:
        obj["status"]["currentOwners"] = [
            {"namespace": "default", "name": o, "uid": f"uid-{o}"} for o in owners
        ]
    return obj


def placeholder(rsv: str = "uid-job-1", *, node: str | None = "node-1") -> Object:
    obj = pod(f"berth-placeholder-{rsv}", node=node, rs=None, labels={keys.RESERVATION_LABEL: rsv})
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": API_VERSION,
            "kind": "Reservation",
            "name": rsv,
            "uid": f"uid-rsv-{rsv}",
            "controller": True,
        }
    ]
    return obj


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def with_status(obj: Object, **status: Any) -> Object:
    result = copy.deepcopy(obj)
    result["status"].update(status)
    return result


def workload(
    name: str = "web",
    *,
    kind: str = "Deployment",
    replicas: int = 3,
    available: int | None = None,
    updated: int | None = None,
    generation: int = 1,
    observed: int | None = None,
    namespace: str = "default",
) -> Object:
    """A top-level workload (uid `uid-<name>`) whose status says all is well unless told."""
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": generation,
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
        "status": {
            "observedGeneration": generation if observed is None else observed,
            "replicas": replicas,
            "updatedReplicas": replicas if updated is None else updated,
            "availableReplicas": replicas if available is None else available,
        },
    }


def pdb(
    name: str = "web-pdb",
    *,
    selector: Object | None = None,
    allowed: int = 1,
    disrupted: tuple[str, ...] = (),
    namespace: str = "default",
) -> Object:
    """A policy/v1 PodDisruptionBudget; `disrupted` pods are in status.disruptedPods."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": "web"}} if selector is None else selector},
        "status": {
            "disruptionsAllowed": allowed,
            "disruptedPods": {pod_name: ts(T0) for pod_name in disrupted},
        },
    }


def node(
    name: str = "node-1",
    *,
    ready: bool = True,
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
    taints: list[Object] | None = None,
) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": {"cpu": "4", "memory": "8Gi"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
