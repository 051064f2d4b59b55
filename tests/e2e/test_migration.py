"""Reservation-first migrations end to end: controller, webhook and extender together."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.kube import Cluster
from tests.e2e.migrate import (
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

SEEDS = Path(__file__).resolve().parents[1] / "data" / "seed_quickstart"
SEED_POD = "pod-demo-5f9b977566-c7lvk"


def describe_events(cluster: Cluster, name: str) -> list[str]:
    """The Reason column of `kubectl describe pmj`, top to bottom."""
    text = cluster.kubectl("describe", "pmj", name).stdout
    lines = text.split("Events:", 1)[1].splitlines()[3:]
    return [line.split()[1] for line in lines if line.strip()]


def test_seed_quick_start(cluster: Cluster) -> None:
    deployment_yaml = (SEEDS / "pod-demo.yaml").read_text()
    cluster.kubectl("create", "-f", "-",
                    input=deployment_yaml.replace("koord-scheduler", "default-scheduler"))
    try:
        old = cluster.wait(lambda: ready_pods(cluster, "default", "pod-demo", 1),
                           what="pod-demo")[0]
        job_yaml = (SEEDS / "migrationjob-demo.yaml").read_text()
        cluster.kubectl("create", "-f", "-",
                        input=job_yaml.replace(SEED_POD, old["metadata"]["name"]))
        job = cluster.wait(lambda: phase_is(cluster, "migrationjob-demo", "Succeeded", "Failed"),
                           what="the migration to end")
        assert (job["status"]["phase"], job["status"]["status"]) == ("Succeeded", "Complete")
        header, row = cluster.kubectl("get", "pmj", "migrationjob-demo").stdout.splitlines()
        columns = dict(zip(header.split(), row.split(), strict=True))
        assert columns["PODNAMESPACE"] == "default"
        assert columns["POD"] == old["metadata"]["name"]
        assert columns["RESERVATION"] == job["metadata"]["uid"]
        new = cluster.get("pod", columns["NEWPOD"], "-n", "default")
        assert new["spec"]["nodeName"] == columns["NODE"] != old["spec"]["nodeName"]
        assert new["metadata"]["annotations"]["scheduling.koordinator.sh/reservation-allocated"]
        assert describe_events(cluster, "migrationjob-demo") == [
            "ReservationCreated", "ReservationScheduled", "Evicting", "EvictComplete",
            "Complete"]
        assert not any(leftovers(cluster, "default").values())
    finally:
        cluster.kubectl("delete", "pmj", "migrationjob-demo", "--ignore-not-found")
        cluster.kubectl("delete", "deployment", "pod-demo", "-n", "default",
                        "--ignore-not-found")


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
  - controller: {{apiVersion: apps/v1, kind: ReplicaSet, name: {rs['name']}, uid: {rs['uid']},
                  namespace: {namespace}}}
""")
    try:
        cluster.wait(lambda: cluster.get("reservation", rsv_name).get("status", {})
                     .get("phase") == "Available", what="the Reservation to be Available")
        name, manifest = job_manifest(old, reservationOptions={"reservationRef": {
            "name": rsv_name}})
        cluster.apply(manifest)
        job = cluster.wait(lambda: phase_is(cluster, name, "Succeeded", "Failed"),
                           what="the migration to end")
        assert job["status"]["phase"] == "Succeeded", job["status"]
        assert job["status"]["nodeName"] == target
        assert condition(job, "ReservationCreated") == {}
        reservations = [r["metadata"]["name"] for r in cluster.get("reservations")["items"]]
        assert job["metadata"]["uid"] not in reservations
        assert cluster.get("reservation", rsv_name)["status"]["phase"] == "Succeeded"
        assert events(cluster, name)[0] == "ReservationScheduled"
    finally:
        cluster.kubectl("delete", "reservation", rsv_name, "--ignore-not-found")
