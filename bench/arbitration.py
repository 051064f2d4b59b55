"""How long one arbitration round takes on a large synthetic cluster.

The controller arbitrates every arbitrationArgs.interval (500ms by default) and the round
must stay well inside it, so this builds a seeded, realistic snapshot (Deployments and
StatefulSets of many sizes, some rolling out, PDBs, a few forbidden pods, jobs in flight
and finished) and times `arbitrate` over several rounds for a few configurations.

Run: python bench/arbitration.py [--rounds 7] [--jobs 10000] [--nodes 5000] [--pods 50000]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from berth.api import keys
from berth.protocol import controlled_key
from berth.resources import Resources, parse_quantity, pod_requests
from berth.settings import MigrationControllerArgs
from controller.arbitration import Snapshot, arbitrate
from controller.jobs import marker

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ADMISSION_KEY = b"bench"
"""The key the synthetic jobs in flight are marked with, as the controller admits them
(`controller.jobs.marker`): a Running job without a valid mark is not counted in flight."""
SIZES = [1, 1, 2, 2, 3, 3, 3, 5, 5, 8, 10, 10, 12, 20, 30, 50, 100]
Object = dict[str, Any]


def ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, rng: random.Random) -> Object:
    ready = rng.random() > 0.01
    obj: Object = {
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/zone": f"z{rng.randrange(3)}",
                "pool": rng.choice(["general", "general", "mem"]),
            },
        },
        "spec": {"unschedulable": rng.random() < 0.01},
        "status": {
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    if rng.random() < 0.02:
        obj["spec"]["taints"] = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
    return obj


def workload(kind: str, namespace: str, name: str, replicas: int, *, rolling: bool) -> Object:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "generation": 3,
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
        "status": {
            "observedGeneration": 3,
            "replicas": replicas,
            "availableReplicas": replicas,
            "updatedReplicas": replicas - 1 if rolling else replicas,
            "readyReplicas": replicas,
        },
    }


def pod(owner: Object, index: int, *, node_name: str, rng: random.Random) -> Object:
    namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
    controller = (
        {"kind": "ReplicaSet", "name": f"{app}-7d9f", "uid": f"uid-rs-{namespace}-{app}"}
        if owner["kind"] == "Deployment"
        else {"kind": owner["kind"], "name": app, "uid": owner["metadata"]["uid"]}
    )
    cpu = rng.choice(["100m", "250m", "500m", "1"])
    limits = {"cpu": cpu, "memory": "512Mi"} if rng.random() < 0.3 else {"memory": "1Gi"}
    ready = rng.random() > 0.03
    spec: Object = {
        "nodeName": node_name,
        "schedulerName": "default-scheduler",
        "priority": rng.choice([0, 0, 0, 100, 1000]),
        "containers": [
            {
                "name": "app",
                "image": "app:1",
                "resources": {"requests": {"cpu": cpu, "memory": "512Mi"}, "limits": limits},
            }
        ],
        "volumes": [{"name": "token", "projected": {"sources": []}}],
        "nodeSelector": {"pool": "general"} if rng.random() < 0.2 else {},
    }
    if rng.random() < 0.02:
        spec["volumes"].append({"name": "cache", "emptyDir": {}})
    labels = {"app": app, "pod-template-hash": "7d9f"}
    if rng.random() < 0.1:
        labels["koordinator.sh/qosClass"] = rng.choice(["LSE", "LSR", "LS", "BE"])
    annotations = {}
    if rng.random() < 0.05:
        annotations[keys.EVICTION_COST] = str(rng.choice([-10, 10, 100, keys.EVICTION_COST_NEVER]))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-{index}",
            "namespace": namespace,
            "uid": f"uid-pod-{namespace}-{app}-{index}",
            "creationTimestamp": ts(NOW - timedelta(days=1)),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "controller": True, **controller}],
        },
        "spec": spec,
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed" if "cpu" in limits else "Burstable",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pdb(owner: Object, rng: random.Random) -> Object:
    namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": f"{app}-pdb", "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": app}}, "maxUnavailable": 1},
        "status": {"disruptionsAllowed": rng.choice([0, 1, 1, 2]), "disruptedPods": {}},
    }


def job(
    name: str, target: Object, *, phase: str, created: datetime, workload_uid: str | None = None
) -> Object:
    metadata = target["metadata"]
    mode = "ReservationFirst" if int(name[4:]) % 10 else "EvictDirectly"
    annotations = {}
    if phase != "Pending":
        annotations = {keys.SOURCE_NODE: target["spec"]["nodeName"], keys.POD_UID: metadata["uid"]}
        if workload_uid:
            annotations[keys.WORKLOAD] = workload_uid
    if phase == "Running":
        annotations[keys.ADMISSION] = marker.sign(
            ADMISSION_KEY,
            job_uid=f"uid-{name}",
            pod_uid=metadata["uid"],
            mode=mode,
            source_node=target["spec"]["nodeName"],
            workload=workload_uid or "",
        )
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "PodMigrationJob",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": ts(created),
            "annotations": annotations,
        },
        "spec": {
            "podRef": {"namespace": metadata["namespace"], "name": metadata["name"]},
            "mode": mode,
            "ttl": "5m",
        },
        "status": {"phase": phase},
    }


def build(*, jobs: int, nodes: int, pods: int, seed: int = 1) -> Snapshot:
    rng = random.Random(seed)
    node_names = [f"node-{i}" for i in range(nodes)]
    node_objects = {name: node(name, rng) for name in node_names}
    workloads: dict[str, Object] = {}
    pods_of: dict[str, list[Object]] = {}
    all_pods: list[Object] = []
    pdbs: list[Object] = []
    while len(all_pods) < pods:
        namespace = f"team-{rng.randrange(50)}"
        kind = "StatefulSet" if rng.random() < 0.1 else "Deployment"
        replicas = min(rng.choice(SIZES), pods - len(all_pods))
        owner = workload(
            kind, namespace, f"app-{len(workloads)}", replicas, rolling=rng.random() < 0.03
        )
        uid = owner["metadata"]["uid"]
        workloads[uid] = owner
        pods_of[uid] = [
            pod(owner, i, node_name=rng.choice(node_names), rng=rng) for i in range(replicas)
        ]
        all_pods += pods_of[uid]
        if rng.random() < 0.3:
            pdbs.append(pdb(owner, rng))
    workload_of = {p["metadata"]["uid"]: uid for uid, members in pods_of.items() for p in members}
    above = {
        controlled_key(
            w["metadata"]["namespace"],
            f"uid-rs-{w['metadata']['namespace']}-{w['metadata']['name']}",
        ): uid
        for uid, w in workloads.items()
        if w["kind"] == "Deployment"
    }
    used: dict[str, Resources] = {name: {} for name in node_names}
    for member in all_pods:
        node_used = used[member["spec"]["nodeName"]]
        for name, value in pod_requests(member["spec"]).items():
            node_used[name] = node_used.get(name, Decimal(0)) + value
    free = {
        name: {
            resource: parse_quantity(quantity) - used[name].get(resource, Decimal(0))
            for resource, quantity in node_objects[name]["status"]["allocatable"].items()
        }
        for name in node_names
    }
    targets = rng.sample(all_pods, jobs + jobs // 20)
    pending = [
        job(
            f"pmj-{i}",
            target,
            phase="Pending",
            created=NOW - timedelta(seconds=rng.randrange(3600)),
        )
        for i, target in enumerate(targets[:jobs])
    ]
    in_flight = [
        job(
            f"pmj-{jobs + i}",
            target,
            phase="Running",
            created=NOW - timedelta(hours=1),
            workload_uid=workload_of[target["metadata"]["uid"]],
        )
        for i, target in enumerate(targets[jobs:])
    ]
    history = [
        job(
            f"pmj-{2 * jobs + i}",
            target,
            created=NOW - timedelta(days=1),
            phase=rng.choice(["Succeed", "Succeed", "Failed", "Aborted"]),
            workload_uid=workload_of[target["metadata"]["uid"]],
        )
        for i, target in enumerate(rng.sample(all_pods, jobs // 2))
    ]
    return Snapshot(
        pending=pending,
        in_flight=in_flight,
        history=history,
        pods={f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in all_pods},
        workload_of=above,
        workloads={
            controlled_key(w["metadata"]["namespace"], uid): w for uid, w in workloads.items()
        },
        pods_of_workload={
            controlled_key(workloads[uid]["metadata"]["namespace"], uid): members
            for uid, members in pods_of.items()
        },
        pdbs=pdbs,
        nodes=node_objects,
        free=free,
        args=MigrationControllerArgs(),
        now=NOW,
    )


CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("defaults", {}),
    ("no rate limit", {"evictQPS": 0}),
    ("no rate limit, nodeFit", {"evictQPS": 0, "nodeFit": True}),
    ("arbitration disabled", {"arbitrationArgs": {"enabled": False}}),
]


def run(
    snapshot: Snapshot, rounds: int, *, steady: bool, churn: float = 0.0
) -> tuple[list[float], Counter[str], Counter[str]]:
    """Time `rounds` rounds. Steady: each round gets the memo of the one before, as in the
    controller (after a first cold round, not timed); else every round starts cold.
    `churn`: before each round that share of the pods and of the pending jobs is replaced
    by a changed copy, as the informers replace objects that changed."""
    timings, verdicts, reasons = [], Counter[str](), Counter[str]()
    rng = random.Random(2)
    if steady:
        snapshot = replace(snapshot, memo=arbitrate(snapshot).memo)
    for _ in range(rounds):
        if churn:
            snapshot = changed(snapshot, churn, rng)
        gc.collect()
        start = time.perf_counter()
        result = arbitrate(snapshot)
        timings.append((time.perf_counter() - start) * 1000)
        verdicts = Counter(decision.verdict for decision in result.decisions)
        reasons = Counter(d.reason for d in result.decisions if d.verdict == "wait")
        if steady:
            snapshot = replace(snapshot, memo=result.memo)
    return timings, verdicts, reasons


def changed(snapshot: Snapshot, share: float, rng: random.Random) -> Snapshot:
    """The snapshot with `share` of its pods and pending jobs replaced by new objects (a
    new resourceVersion, as after a status update)."""
    pods = dict(snapshot.pods)
    for key in rng.sample(sorted(pods), int(len(pods) * share)):
        pods[key] = renewed(pods[key])
    pending = list(snapshot.pending)
    for index in rng.sample(range(len(pending)), int(len(pending) * share)):
        pending[index] = renewed(pending[index])
    return replace(snapshot, pods=pods, pending=pending)


def renewed(obj: Mapping[str, Any]) -> Object:
    version = int(obj["metadata"].get("resourceVersion", "1")) + 1
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(version)}}


def touch(snapshot: Snapshot, rounds: int) -> list[float]:
    """The floor: read the pod fields a round reads for every job, and decide nothing."""
    timings = []
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter()
        for job in snapshot.pending:
            ref = job["spec"]["podRef"]
            pod = snapshot.pods[f"{ref['namespace']}/{ref['name']}"]
            metadata, spec, status = pod["metadata"], pod["spec"], pod["status"]
            for item in (
                *(metadata.get("ownerReferences") or ()),
                *(spec.get("volumes") or ()),
                *(status.get("conditions") or ()),
            ):
                item.get("kind")
            metadata.get("labels", {}).get("app")
            metadata.get("annotations", {}).get(keys.EVICTION_COST)
            snapshot.workload_of.get(
                controlled_key(metadata["namespace"], metadata["ownerReferences"][0]["uid"])
            )
            job["metadata"].get("creationTimestamp")
        timings.append((time.perf_counter() - start) * 1000)
    return timings


def row(
    name: str, options: argparse.Namespace, timings: list[float], verdicts: Counter[str]
) -> str:
    return (
        f"{name:<32}{options.rounds:>7}{options.jobs:>7}{options.nodes:>7}"
        f"{options.pods:>7}{min(timings):>8.1f}{statistics.median(timings):>8.1f}"
        f"{max(timings):>8.1f}{verdicts['admit']:>7}{verdicts['wait']:>7}"
        f"{verdicts['fail']:>7}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--pods", type=int, default=50_000)
    options = parser.parse_args(argv)
    base = build(jobs=options.jobs, nodes=options.nodes, pods=options.pods)
    header = (
        f"{'config':<32}{'rounds':>7}{'jobs':>7}{'nodes':>7}{'pods':>7}{'min ms':>8}"
        f"{'median':>8}{'max ms':>8}{'admit':>7}{'wait':>7}{'fail':>7}"
    )
    print(header)
    print("-" * len(header))
    waits = {}
    for name, args in CONFIGS:
        snapshot = replace(base, args=MigrationControllerArgs.model_validate(args))
        for steady in (True, False):
            timings, verdicts, waits[name] = run(snapshot, options.rounds, steady=steady)
            label = f"{name}{'' if steady else ' (cold)'}"
            print(row(label, options, timings, verdicts))
    defaults = replace(base, args=MigrationControllerArgs())
    for churn in (0.01, 0.1):
        timings, verdicts, _ = run(defaults, options.rounds, steady=True, churn=churn)
        print(row(f"defaults, {churn:.0%} changed a round", options, timings, verdicts))
    print(row("floor: read pods only", options, touch(base, options.rounds), Counter()))
    print()
    for name, reasons in waits.items():
        if reasons:
            top = ", ".join(f"{reason} {count}" for reason, count in reasons.most_common(4))
            print(f"{name}: waiting on {top}")


if __name__ == "__main__":
    main()
