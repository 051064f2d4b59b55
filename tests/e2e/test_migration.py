"""Reservation-first migrations end to end: controller, webhook and extender together."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from berth.resources import pod_requests
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import (
    PAUSE,
    condition,
    deployment,
    events,
    job_manifest,
    job_of,
    leftovers,
    phase_is,
    ready_pods,
)

pytestmark = pytest.mark.e2e

SEEDS = Path(__file__).resolve().parent / "seed_quickstart"
SEED_POD = "pod-demo-5f9b977566-c7lvk"


def describe_events(cluster: Cluster, name: str) -> list[str]:
    """The Reason column of `kubectl describe pmj`, top to bottom."""
    text = cluster.kubectl("describe", "pmj", name).stdout
    lines = text.split("Events:", 1)[1].splitlines()[3:]
    return [line.split()[1] for line in lines if line.strip()]


def test_seed_quick_start(cluster: Cluster) -> None:
    deployment_yaml = (SEEDS / "pod-demo.yaml").read_text()
    cluster.kubectl(
        "create", "-f", "-", input=deployment_yaml.replace("koord-scheduler", "default-scheduler")
    )
    try:
        old = cluster.wait(lambda: ready_pods(cluster, "default", "pod-demo", 1), what="pod-demo")[
            0
        ]
        job_yaml = (SEEDS / "migrationjob-demo.yaml").read_text()
        cluster.kubectl(
            "create", "-f", "-", input=job_yaml.replace(SEED_POD, old["metadata"]["name"])
        )
        job = cluster.wait(
            lambda: phase_is(cluster, "migrationjob-demo", "Succeed", "Failed"),
            what="the migration to end",
        )
        assert (job["status"]["phase"], job["status"]["status"]) == ("Succeed", "Complete")
        header, row = cluster.kubectl("get", "pmj", "migrationjob-demo").stdout.splitlines()
        columns = dict(zip(header.split(), row.split(), strict=True))
        assert columns["PODNAMESPACE"] == "default"
        assert columns["POD"] == old["metadata"]["name"]
        assert columns["RESERVATION"] == job["metadata"]["uid"]
        new = cluster.get("pod", columns["NEWPOD"], "-n", "default")
        assert new["spec"]["nodeName"] == columns["NODE"] != old["spec"]["nodeName"]
        assert new["metadata"]["annotations"]["scheduling.koordinator.sh/reservation-allocated"]
        assert describe_events(cluster, "migrationjob-demo") == [
            "ReservationCreated",
            "ReservationScheduled",
            "Evicting",
            "EvictComplete",
            "Complete",
        ]
        assert not any(leftovers(cluster, "default").values())
    finally:
        cluster.kubectl("delete", "pmj", "migrationjob-demo", "--ignore-not-found")
        cluster.kubectl("delete", "deployment", "pod-demo", "-n", "default", "--ignore-not-found")


def test_reservation_ref_uses_the_given_reservation(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("ref"), namespace)
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "ref", 1), what="the pod")[0]
    target = "node-2" if old["spec"]["nodeName"] != "node-2" else "node-1"
    rs = old["metadata"]["ownerReferences"][0]
    rsv_name = f"rsv-{namespace}"[:60]
    cluster.apply(f"""
apiVersion: scheduling.koordinator.sh/v1alpha1
kind: Reservation
metadata: {{name: {rsv_name}}}
spec:
  ttl: 5m
  template:
    metadata: {{namespace: {namespace}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {target}}}
      containers: [{{name: app, resources: {{requests: {{cpu: 200m}}}}}}]
  owners:
  - controller: {{apiVersion: apps/v1, kind: ReplicaSet, name: {rs["name"]}, uid: {rs["uid"]},
                  namespace: {namespace}}}
""")
    try:
        cluster.wait(
            lambda: (
                cluster.get("reservation", rsv_name).get("status", {}).get("phase") == "Available"
            ),
            what="the Reservation to be Available",
        )
        name, manifest = job_manifest(
            old, reservationOptions={"reservationRef": {"name": rsv_name}}
        )
        cluster.apply(manifest)
        job = cluster.wait(
            lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the migration to end"
        )
        assert job["status"]["phase"] == "Succeed", job["status"]
        assert job["status"]["nodeName"] == target
        assert condition(job, "ReservationCreated") == {}
        reservations = [r["metadata"]["name"] for r in cluster.get("reservations")["items"]]
        assert job["metadata"]["uid"] not in reservations
        assert cluster.get("reservation", rsv_name)["status"]["phase"] == "Succeeded"
        assert events(cluster, name)[0] == "ReservationScheduled"
    finally:
        cluster.kubectl("delete", "reservation", rsv_name, "--ignore-not-found")


NODES = ("node-0", "node-1", "node-2")
NODE_CPU = Decimal(8000)
ROUNDS = 20
FLOOD = 4


def cpu_in_use(cluster: Cluster, *, skip_namespace: str) -> dict[str, Decimal]:
    """Millicores requested on each node by bound pods outside `skip_namespace`'s fillers."""
    used = dict.fromkeys(NODES, Decimal(0))
    for item in cluster.get("pods", "--all-namespaces")["items"]:
        node = item["spec"].get("nodeName")
        role = (item["metadata"].get("labels") or {}).get("role")
        if node not in used or item["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        if item["metadata"]["namespace"] == skip_namespace and role in ("filler", "flood"):
            continue
        used[node] += pod_requests(item["spec"]).get("cpu", Decimal(0)) * 1000
    return used


def bare_pod(
    name: str, *, cpu_millis: Decimal, role: str, node: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": PAUSE, "resources": {"requests": {"cpu": f"{int(cpu_millis)}m"}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"role": role}},
        "spec": spec,
    }


def settled(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]] | None:
    """The pods of `selector` once each is bound or refused by the scheduler."""
    found = [
        p for p in pods(cluster, namespace, selector) if not p["metadata"].get("deletionTimestamp")
    ]
    for pod in found:
        scheduled = [
            c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"
        ]
        if not pod["spec"].get("nodeName") and not (
            scheduled and scheduled[0].get("reason") == "Unschedulable"
        ):
            return None
    return found or None


def contention_round(cluster: Cluster, namespace: str, *, mode: str) -> str:
    """One migration in a busy cluster: exactly one other node has room for the pod, and
    competing pods are already waiting for capacity when the pod is evicted (a PDB holds
    the eviction until they are). Returns where the replacement ended: "reserved" (the one
    node with room), "elsewhere" or "pending"."""
    cluster.kubectl(
        "delete",
        "pods",
        "-n",
        namespace,
        "-l",
        "role in (filler,flood)",
        "--grace-period=0",
        "--force",
        "--wait=true",
    )
    victim = cluster.wait(lambda: ready_pods(cluster, namespace, "victim", 1), what="victim")[0]
    source = victim["spec"]["nodeName"]
    used = cpu_in_use(cluster, skip_namespace=namespace)
    target, other = sorted((n for n in NODES if n != source), key=lambda n: used[n])
    free = {source: Decimal(0), target: Decimal(3000), other: Decimal(1000)}
    fillers = [
        bare_pod(
            f"filler-{node}",
            cpu_millis=NODE_CPU - used[node] - free[node],
            role="filler",
            node=node,
        )
        for node in NODES
        if NODE_CPU - used[node] - free[node] > 0
    ]
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": fillers}), namespace)
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "hold"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "victim"}}},
            }
        ),
        namespace,
    )
    cluster.wait(
        lambda: (
            cluster.get("pdb", "hold", "-n", namespace).get("status", {}).get("currentHealthy") == 1
        ),
        what="the PDB to hold the pod",
    )
    name, manifest = job_manifest(victim, mode=mode, ttl="90s")
    cluster.apply(manifest)
    cluster.wait(
        lambda: condition(job_of(cluster, name), "Eviction").get("reason") == "BlockedByPDB",
        what="the eviction to wait on the PDB",
        timeout=30,
    )
    flood = [bare_pod(f"flood-{i}", cpu_millis=Decimal(3000), role="flood") for i in range(FLOOD)]
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": flood}), namespace)
    cluster.wait(
        lambda: settled(cluster, namespace, "role=flood"),
        what="the competing pods to be placed or refused",
    )
    cluster.kubectl("delete", "pdb", "hold", "-n", namespace)
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    replacement = cluster.wait(
        lambda: [
            p
            for p in settled(cluster, namespace, "app=victim") or []
            if p["metadata"]["uid"] != victim["metadata"]["uid"]
        ],
        what="the replacement to be placed or refused",
    )[0]
    flood_nodes = [p["spec"].get("nodeName") for p in pods(cluster, namespace, "role=flood")]
    cluster.kubectl("delete", "pmj", name, "--wait=false")
    node = replacement["spec"].get("nodeName")
    if mode == "ReservationFirst":
        assert job["status"]["phase"] == "Succeed", job["status"]
        assert job["status"]["nodeName"] == target
        assert target not in flood_nodes, "a competing pod took the reserved place"
    if node is None:
        # Free its place for the next round: the flood goes, the replacement then fits.
        cluster.kubectl(
            "delete",
            "pods",
            "-n",
            namespace,
            "-l",
            "role in (filler,flood)",
            "--grace-period=0",
            "--force",
            "--wait=true",
        )
        return "pending"
    return "reserved" if node == target else "elsewhere"


def test_contention_reservation_first_always_lands_evict_directly_does_not(
    cluster: Cluster,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
    restart_controller: Callable[[str], None],
) -> None:
    # The PDB that holds each eviction is the test's stopwatch, not a limit to arbitrate.
    restart_controller("arbitrationArgs:\n  enabled: false\n")
    cluster.apply(deployment("victim", cpu="3"), namespace)
    outcomes: dict[str, Counter[str]] = {}
    for mode in ("ReservationFirst", "EvictDirectly"):
        outcomes[mode] = Counter(
            contention_round(cluster, namespace, mode=mode) for _ in range(ROUNDS)
        )
    with capsys.disabled():
        print(
            f"\ncontention over {ROUNDS} migrations each, {FLOOD} competing pods waiting "
            "for capacity at each eviction:"
        )
        for mode, counts in outcomes.items():
            print(
                f"  {mode:<17} on the reserved node {counts['reserved']:>2}, "
                f"elsewhere {counts['elsewhere']:>2}, left Pending {counts['pending']:>2}"
            )
    assert outcomes["ReservationFirst"] == Counter(reserved=ROUNDS)
    assert not any(leftovers(cluster, namespace).values())
