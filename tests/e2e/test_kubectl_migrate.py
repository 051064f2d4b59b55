"""`kubectl migrate` as a kubectl plugin, against the real control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devtools.accounts import account_kubeconfig
from devtools.chart import helm_template
from devtools.helm import helm_binary
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import deployment, job_manifest, leftovers, ready_pods

pytestmark = pytest.mark.e2e


def kubectl_migrate(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """Through our kubectl, which finds the `kubectl-migrate` plugin on PATH."""
    assert cluster.local.binaries is not None
    path = f"{Path(sys.executable).parent}:{cluster.local.binaries.bin_dir}:{os.environ['PATH']}"
    return subprocess.run(
        [str(cluster.local.binaries.kubectl), "migrate", *args],
        env={**os.environ, "PATH": path, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_migrate_pod_to_a_node_waits_and_lands_there(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    target = next(n for n in ("node-0", "node-1", "node-2") if n != pod["spec"]["nodeName"])
    result = kubectl_migrate(
        cluster, "pod", pod["metadata"]["name"], "-n", namespace, "--to", target, "--wait"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Succeed" in result.stdout
    assert "Complete" in result.stdout
    (new,) = ready_pods(cluster, namespace, "web", 1)
    assert new["spec"]["nodeName"] == target
    assert new["metadata"]["uid"] != pod["metadata"]["uid"]


def test_migrate_node_empties_it_into_reserved_places(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("web", replicas=4), namespace)
    cluster.wait(lambda: ready_pods(cluster, namespace, "web", 4), what="4 pods")
    node = max(
        ("node-0", "node-1", "node-2"),
        key=lambda n: sum(
            p["spec"].get("nodeName") == n for p in pods(cluster, namespace, "app=web")
        ),
    )
    on_node = [p for p in pods(cluster, namespace, "app=web") if p["spec"]["nodeName"] == node]
    result = kubectl_migrate(cluster, "node", node, "-n", namespace, "--wait")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("created for") == len(on_node)
    after = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 4), what="4 pods again")
    assert not [p for p in after if p["spec"]["nodeName"] == node]
    moved = [p for p in after if "berth.sh/claim" in (p["metadata"].get("annotations") or {})]
    assert len(moved) == len(on_node)
    for pod in moved:
        bound = json.loads(
            pod["metadata"]["annotations"]["scheduling.koordinator.sh/reservation-allocated"]
        )
        reservation = cluster.get("reservation", bound["name"])
        assert reservation["status"]["nodeName"] == pod["spec"]["nodeName"]
        assert reservation["status"]["phase"] == "Succeeded"
    assert not any(leftovers(cluster, namespace).values())


def test_migrate_reports_a_missing_pod(cluster: Cluster, namespace: str) -> None:
    result = kubectl_migrate(cluster, "pod", "no-such-pod", "-n", namespace)
    assert result.returncode == 1
    assert "not found" in result.stderr


def test_migrate_to_a_node_that_cannot_take_the_pod_creates_no_job(
    cluster: Cluster, namespace: str
) -> None:
    """A job pinned to a node that does not exist, or to the pod's own node, could only
    fail at its TTL: said at once, nothing created."""
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    missing = kubectl_migrate(cluster, "pod", name, "-n", namespace, "--to", "no-such-node")
    assert missing.returncode == 1
    assert "no node no-such-node" in missing.stderr
    same = kubectl_migrate(cluster, "pod", name, "-n", namespace, "--to", node)
    assert same.returncode == 1
    assert f"is already on node {node}" in same.stderr
    jobs = cluster.get("podmigrationjobs")["items"]
    assert not [j for j in jobs if j["spec"]["podRef"].get("name") == name]


def test_a_wait_ends_at_its_timeout_and_the_jobs_go_on(cluster: Cluster, namespace: str) -> None:
    """A paused job never ends by itself: `--timeout` ends the wait (its own exit code),
    and the job is left as it is."""
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name = pod["metadata"]["name"]
    result = kubectl_migrate(
        cluster, "pod", name, "-n", namespace, "--paused", "--wait", "--timeout", "3s"
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "timed out after 3s; the jobs go on" in result.stderr
    [job] = [
        j
        for j in cluster.get("podmigrationjobs")["items"]
        if j["spec"]["podRef"].get("name") == name
    ]
    assert job["spec"]["paused"] is True
    assert (job.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    cluster.kubectl("delete", "podmigrationjob", job["metadata"]["name"])


def test_a_job_deleted_while_followed_ends_the_wait_as_not_succeeded(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name = pod["metadata"]["name"]
    assert cluster.local.binaries is not None
    path = f"{Path(sys.executable).parent}:{cluster.local.binaries.bin_dir}:{os.environ['PATH']}"
    argv = ["migrate", "pod", name, "-n", namespace, "--paused", "--wait"]
    waiting = subprocess.Popen(
        [str(cluster.local.binaries.kubectl), *argv],
        env={**os.environ, "PATH": path, "KUBECONFIG": str(cluster.kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job = cluster.wait(
            lambda: next(
                (
                    j["metadata"]["name"]
                    for j in cluster.get("podmigrationjobs")["items"]
                    if j["spec"]["podRef"].get("name") == name
                ),
                None,
            ),
            what="the job",
        )
        cluster.kubectl("delete", "podmigrationjob", job)
        out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 1, out + err
    assert "Deleted" in out
    assert "failed or was deleted" in err


# --- abort ------------------------------------------------------------------------


@pytest.fixture
def hook_kubeconfig(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig of the chart's uninstall hook: its ServiceAccount, ClusterRole and
    binding as `helm template` renders them (for a release named after the namespace),
    applied for the test and removed after it."""
    objects = [
        obj
        for obj in helm_template(helm_binary(), release=namespace, namespace=namespace)
        if (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "uninstall"
        and obj["kind"] != "Job"
    ]
    assert {obj["kind"] for obj in objects} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding"
    }  # fmt: skip
    manifest = yaml.safe_dump_all(objects)
    cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        [account] = [obj["metadata"]["name"] for obj in objects if obj["kind"] == "ServiceAccount"]
        yield account_kubeconfig(
            cluster.kubectl,
            admin=cluster.kubeconfig,
            name=account,
            namespace=namespace,
            path=tmp_path / "uninstall.kubeconfig",
        )
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=manifest, check=False)


def test_abort_waits_until_berth_holds_nothing_with_the_uninstall_hooks_rights(
    cluster: Cluster, namespace: str, hook_kubeconfig: Path
) -> None:
    cluster.apply(deployment("web"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    # A place no node offers: the job holds a Reservation and a Pending placeholder.
    nowhere = {"template": {"spec": {"template": {"spec": {"nodeSelector": {"e2e": "nowhere"}}}}}}
    name, manifest = job_manifest(pod, reservationOptions=nowhere)
    cluster.apply(manifest)
    cluster.wait(
        lambda: leftovers(cluster, namespace)["placeholders"], what="the job's placeholder"
    )

    result = kubectl_migrate(
        cluster, "abort", name, "--wait", "--timeout", "60s", f"--kubeconfig={hook_kubeconfig}"
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"podmigrationjob/{name} aborted" in result.stdout
    assert "Berth holds nothing for these jobs" in result.stdout
    assert cluster.get("pmj", name)["status"]["phase"] == "Aborted"
    assert not any(leftovers(cluster, namespace).values())
    reservations = [
        r
        for r in cluster.get("reservations")["items"]
        if (r["metadata"].get("annotations") or {}).get("berth.sh/job") == name
    ]
    assert all(r["status"].get("phase") in ("Succeeded", "Failed") for r in reservations)
    (still,) = ready_pods(cluster, namespace, "web", 1)
    assert still["metadata"]["uid"] == pod["metadata"]["uid"], "nothing was evicted"

    again = kubectl_migrate(cluster, "abort", name)
    assert again.returncode == 0, again.stderr
    assert f"podmigrationjob/{name} has already ended (Aborted)" in again.stdout
    missing = kubectl_migrate(cluster, "abort", "no-such-job")
    assert missing.returncode == 1
    assert "no podmigrationjob no-such-job" in missing.stderr
