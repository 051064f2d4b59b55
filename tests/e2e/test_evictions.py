"""Evictions from tools that only know the Eviction API, intercepted: the real
`kubectl drain` (the local control plane's kubectl) and the real descheduler
(tools/descheduler, built from sigs.k8s.io/descheduler) evict pods of an opted-in
namespace, and every pod moves reservation-first through a PodMigrationJob the webhook
created; a webhook outage and a failed job never block a drain.

Each drain empties a kwok node of its own, made for the test and removed after it, that
only the test's pods tolerate: `kubectl drain` acts on every pod of its node, whatever the
namespace, and gives up at once on one it may not evict (a bare pod, say), so a node
shared with other tests would let their leftovers decide the outcome."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from berth.api import keys
from devtools.binaries import tool_binary
from devtools.nodes import is_schedulable
from devtools.render import fake_node
from tests.e2e.capacity import cpu_in_use
from tests.e2e.capacity import pod as bare_pod
from tests.e2e.kube import Cluster, pods, refusing_policy
from tests.e2e.migrate import deployment, events, job_manifest, ready_pods, statefulset
from tests.e2e.scrape import scrape, total
from webhook.evictions import pod_label

pytestmark = pytest.mark.e2e

NODES = ("node-0", "node-1", "node-2")
ADMIN = "berth-dev-admin"
"""The user of the local cluster's admin kubeconfig: kubectl drain's requester."""

UNLIMITED = """\
maxMigratingPerNode: 0
maxMigratingPerWorkload: "100%"
maxUnavailablePerWorkload: "100%"
"""
"""Every pod of a drained node may migrate at once, so that every Reservation is made
before the competing flood starts (the workload limits would otherwise hold the second
pod of each workload back until the flood has taken every free place)."""


def opt_in(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("label", "namespace", namespace, f"{keys.INTERCEPT_EVICTIONS}=true")


@contextmanager
def only_schedulable(cluster: Cluster, node: str) -> Iterator[None]:
    """Every other schedulable node cordoned for the block: what is created in it lands
    on `node`."""
    others = [
        n["metadata"]["name"]
        for n in cluster.get("nodes")["items"]
        if n["metadata"]["name"] != node and not n["spec"].get("unschedulable")
    ]
    for other in others:
        cluster.kubectl("cordon", other)
    try:
        yield
    finally:
        for other in others:
            cluster.kubectl("uncordon", other)


DRAIN_TAINT = "berth.sh/test-drain"
"""The taint that keeps every pod but the test's own off the node it drains."""


def tolerating(node: str) -> dict[str, Any]:
    """Pod spec fields that let a pod onto `node` (it does not require it: a replacement,
    made from the same template, may go anywhere)."""
    return {
        "tolerations": [
            {"key": DRAIN_TAINT, "operator": "Equal", "value": node, "effect": "NoSchedule"}
        ]
    }


@pytest.fixture
def own_node(cluster: Cluster) -> Iterator[str]:
    """A fresh kwok node, the size of the session's, tainted so that only pods tolerating
    it (the test's) land there. Afterwards the pods still bound to it are removed, then
    the node."""
    name = f"drain-{uuid.uuid4().hex[:5]}"
    size = cluster.get("node", NODES[0])["status"]["allocatable"]
    node = fake_node(name=name, cpu=size["cpu"], memory=size["memory"], pods=int(size["pods"]))
    node["spec"] = {"taints": [{"key": DRAIN_TAINT, "value": name, "effect": "NoSchedule"}]}
    cluster.kubectl("create", "-f", "-", input=json.dumps(node))
    try:
        cluster.wait(
            lambda: is_schedulable(cluster.get("node", name)), what=f"node {name} to be Ready"
        )
        yield name
    finally:
        cluster.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={name}",
            "--force",
            "--grace-period=0",
            check=False,
        )
        cluster.kubectl("delete", "node", name, "--wait=true", check=False)


def intercepted(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    """The jobs the webhook made for pods of `namespace`."""
    return [
        job
        for job in cluster.get("pmj")["items"]
        if job["metadata"]["name"].startswith("eviction-")
        and job["spec"]["podRef"]["namespace"] == namespace
    ]


def drain(cluster: Cluster, node: str, *extra: str) -> subprocess.Popen[str]:
    """`kubectl drain` as an administrator runs it, in the background."""
    assert cluster.local.binaries is not None
    return subprocess.Popen(
        [
            str(cluster.local.binaries.kubectl),
            f"--kubeconfig={cluster.kubeconfig}",
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=600s",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finished(process: subprocess.Popen[str], *, timeout: float = 600) -> tuple[int, str]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        raise AssertionError(f"kubectl drain still ran after {timeout:.0f}s:\n{out}") from None
    return process.returncode, out


def while_running(
    process: subprocess.Popen[str], predicate: Callable[[], Any]
) -> Callable[[], Any]:
    """`predicate` for a wait that kubectl drain must outlive: once the drain has exited
    and the predicate is still unmet, the wait fails at once with the drain's output."""

    def check() -> Any:
        exited = process.poll() is not None  # before the predicate: it may have been met since
        value = predicate()
        if value or not exited:
            return value
        out, _ = process.communicate()
        raise AssertionError(
            f"kubectl drain exited ({process.returncode}) before the wait was met:\n{out}"
        )

    return check


def ended(jobs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`jobs`, once every one of them has a terminal phase (else None)."""
    done = all(j.get("status", {}).get("phase") in ("Succeed", "Failed", "Aborted") for j in jobs)
    return jobs if jobs and done else None


def landed_where_reserved(cluster: Cluster, job: dict[str, Any]) -> None:
    """The job succeeded; its replacement runs on the node its Reservation held, which
    is not the node the pod left, and the Reservation was scheduled before the eviction."""
    name = job["metadata"]["name"]
    status = job["status"]
    assert (status.get("phase"), status.get("status")) == ("Succeed", "Complete"), job
    assert job["metadata"]["labels"][keys.REQUESTER] == ADMIN
    assert job["spec"]["mode"] == "ReservationFirst"
    reservation = cluster.get("reservation", job["metadata"]["uid"])
    reserved = reservation["status"]["nodeName"]
    assert status["nodeName"] == reserved != job["metadata"]["annotations"][keys.SOURCE_NODE]
    namespace = job["spec"]["podRef"]["namespace"]
    new = cluster.get("pod", status["podRef"]["name"], "-n", namespace)
    assert new["spec"]["nodeName"] == reserved
    allocated = json.loads(new["metadata"]["annotations"][keys.RESERVATION_ALLOCATED])
    assert allocated["name"] == reservation["metadata"]["name"]
    reasons = events(cluster, name)
    assert reasons.index("ReservationScheduled") < reasons.index("Evicting"), reasons


def test_kubectl_drain_moves_every_pod_reservation_first_against_a_flood(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None], own_node: str
) -> None:
    restart_controller(UNLIMITED)
    opt_in(cluster, namespace)
    source = own_node
    spec = tolerating(source)
    with only_schedulable(cluster, source):
        cluster.apply(deployment("web", replicas=2, cpu="500m", spec_extra=spec), namespace)
        cluster.apply(statefulset("db", replicas=2, cpu="500m", spec_extra=spec), namespace)
        for app in ("web", "db"):
            cluster.wait(partial(ready_pods, cluster, namespace, app, 2), what=app)
    originals = {p["metadata"]["uid"]: p for p in pods(cluster, namespace)}
    assert {p["spec"]["nodeName"] for p in originals.values()} == {source}

    draining = drain(cluster, source)
    try:
        # Every pod's job exists and has its Reservation placed: then the flood starts,
        # asking for more than the session's nodes have left (the drained node is
        # cordoned, and tainted against the flood too).
        cluster.wait(
            while_running(
                draining,
                lambda: (
                    len(
                        [
                            j
                            for j in intercepted(cluster, namespace)
                            if j.get("status", {}).get("nodeName")
                        ]
                    )
                    == 4
                ),
            ),
            what="a Reservation for each of the four pods",
            timeout=180,
        )
        in_use = cpu_in_use(cluster)
        free = sum(int((8 - in_use[node]) * 1000) for node in NODES)
        cluster.apply(deployment("flood", replicas=free // 250 + 8, cpu="250m"), namespace)
        code, out = finished(draining)
        # While the drained node is still cordoned: the flood did compete, some of it
        # found no place.
        flood = pods(cluster, namespace, "app=flood")
        assert any(not p["spec"].get("nodeName") for p in flood)
        cluster.kubectl("delete", "deployment", "flood", "-n", namespace)
    finally:
        if draining.poll() is None:
            draining.kill()
            draining.communicate()
    assert code == 0, out
    assert f"node/{source} drained" in out
    assert "is being migrated by PodMigrationJob eviction-" in out  # the 429, retried

    # The drain ends once the pods are gone; a replacement may still be binding then.
    jobs = cluster.wait(
        lambda: ended(intercepted(cluster, namespace)), what="every job to end", timeout=240
    )
    assert sorted(j["spec"]["podRef"]["uid"] for j in jobs) == sorted(originals)
    for job in jobs:
        landed_where_reserved(cluster, job)
    # The StatefulSet's replacements kept their names and were not evicted again.
    db = pods(cluster, namespace, "app=db")
    assert sorted(p["metadata"]["name"] for p in db) == ["db-0", "db-1"]
    assert all(p["metadata"]["uid"] not in originals for p in db)
    assert all(p["spec"]["nodeName"] != source for p in db + pods(cluster, namespace, "app=web"))
    # The webhook counted what it did: four jobs made, and the controller's four
    # evictions let through.
    samples = asyncio.run(scrape(cluster, "berth-webhook"))
    name = "berth_eviction_reviews_total"
    assert total(samples, name, result="intercepted", reason="JobCreated") >= 4
    assert total(samples, name, result="passed", reason="BerthEviction") >= 4


def test_a_webhook_outage_does_not_block_a_drain(
    cluster: Cluster, namespace: str, own_node: str
) -> None:
    opt_in(cluster, namespace)
    source = own_node
    with only_schedulable(cluster, source):
        cluster.apply(
            deployment("web", replicas=1, cpu="100m", spec_extra=tolerating(source)), namespace
        )
        [pod] = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")
    webhooks = [c for c in cluster.local.running() if c.name.startswith("berth-webhook")]
    for webhook in webhooks:
        cluster.local.stop(webhook)
    try:
        code, out = finished(drain(cluster, source), timeout=180)
    finally:
        for webhook in webhooks:
            cluster.local.start_webhook(name=webhook.name)
    assert code == 0, out
    assert f"pod/{pod['metadata']['name']} evicted" in out
    assert "denied" not in out
    assert not intercepted(cluster, namespace)


def test_a_failed_job_lets_the_drain_continue(
    cluster: Cluster, namespace: str, own_node: str
) -> None:
    """A ReservationFirst job for a pod of a scheduler Berth does not reserve through
    fails at arbitration; the drain's next eviction goes through. A dry run before it
    creates nothing."""
    opt_in(cluster, namespace)
    source = own_node
    elsewhere = {"schedulerName": "elsewhere", "nodeName": source, **tolerating(source)}
    cluster.apply(deployment("odd", replicas=1, cpu="100m", spec_extra=elsewhere), namespace)
    [pod] = cluster.wait(lambda: ready_pods(cluster, namespace, "odd", 1), what="the pod")
    # A server-side dry run is answered as asked and creates no job.
    code, out = finished(drain(cluster, source, "--dry-run=server"), timeout=180)
    assert code == 0, out
    assert "(server dry run)" in out
    assert not intercepted(cluster, namespace)
    code, out = finished(drain(cluster, source), timeout=180)
    assert code == 0, out
    assert "is being migrated by PodMigrationJob eviction-" in out
    assert f"pod/{pod['metadata']['name']} evicted" in out
    [job] = intercepted(cluster, namespace)
    assert job["status"]["phase"] == "Failed"
    assert "not in schedulerNames" in job["status"]["message"]
    reasons = [e["reason"] for e in pod_events(cluster, pod)]
    assert "EvictionIntercepted" in reasons
    assert "EvictionAllowed" in reasons
    samples = asyncio.run(scrape(cluster, "berth-webhook"))
    name = "berth_eviction_reviews_total"
    assert total(samples, name, result="intercepted", reason="JobCreated") >= 1
    assert total(samples, name, result="passed", reason="JobEnded") >= 1


def test_a_drain_waits_for_the_job_already_migrating_the_pod(
    cluster: Cluster, namespace: str, own_node: str
) -> None:
    """kubectl migrate, then kubectl drain of the same node: arbitration fails the
    eviction's job (another job migrates the pod), and the drain keeps being told to
    retry instead of evicting the pod plainly. The first job's Reservation cannot be
    placed here (its template asks for a node label none has), so it stays Running.
    Once that job is paused (it waits for a person), the drain waits for it no more."""
    opt_in(cluster, namespace)
    source = own_node
    on_source = {"nodeName": source, **tolerating(source)}
    cluster.apply(deployment("taken", replicas=1, cpu="100m", spec_extra=on_source), namespace)
    [pod] = cluster.wait(lambda: ready_pods(cluster, namespace, "taken", 1), what="the pod")
    name = f"first-{namespace}"[:60]
    template = {"spec": {"template": {"spec": {"nodeSelector": {"berth.sh/test-nowhere": "true"}}}}}
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "scheduling.koordinator.sh/v1alpha1",
                "kind": "PodMigrationJob",
                "metadata": {"name": name},
                "spec": {
                    "ttl": "10m",
                    "mode": "ReservationFirst",
                    "podRef": {"namespace": namespace, "name": pod["metadata"]["name"]},
                    "reservationOptions": {"template": template},
                },
            }
        )
    )
    try:
        cluster.wait(
            lambda: cluster.get("pmj", name).get("status", {}).get("phase") == "Running",
            what="the first job to run",
        )
        code, out = finished(drain(cluster, source, "--timeout=30s"), timeout=180)
        assert code != 0, out  # the drain gave up at its own timeout, the pod still there
        assert f"is being migrated by PodMigrationJob {name} (phase Running)" in out
        [job] = intercepted(cluster, namespace)
        assert job["status"]["reason"] == "ForbiddenMigratePod"
        assert job["status"]["message"].endswith(f"(PodMigrationJob {name})")
        [still] = pods(cluster, namespace, "app=taken")
        assert still["metadata"]["uid"] == pod["metadata"]["uid"]
        assert not still["metadata"].get("deletionTimestamp")

        cluster.kubectl("patch", "pmj", name, "--type=merge", "-p", '{"spec":{"paused":true}}')
        code, out = finished(drain(cluster, source, "--timeout=60s"), timeout=180)
        assert code == 0, out
        left = [
            p
            for p in pods(cluster, namespace, "app=taken")
            if p["metadata"]["uid"] == pod["metadata"]["uid"]
            and not p["metadata"].get("deletionTimestamp")
        ]
        assert not left, "the drain evicted the pod"
    finally:
        cluster.kubectl("delete", "pmj", name, "--ignore-not-found")


POLICY = {
    "apiVersion": "descheduler/v1alpha2",
    "kind": "DeschedulerPolicy",
    "profiles": [
        {
            "name": "spread-duplicates",
            "pluginConfig": [{"name": "DefaultEvictor", "args": {}}, {"name": "RemoveDuplicates"}],
            "plugins": {"balance": {"enabled": ["RemoveDuplicates"]}},
        }
    ],
}
"""RemoveDuplicates: of a workload's pods crowded on one node, evict those beyond an even
share of the nodes they fit on."""


def descheduler_once(cluster: Cluster, policy: Path) -> subprocess.CompletedProcess[str]:
    """The descheduler, built from sigs.k8s.io/descheduler, run once (interval 0) as an
    administrator, without its metrics server."""
    return subprocess.run(
        [
            str(tool_binary("descheduler")),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--policy-config-file={policy}",
            "--descheduling-interval=0",
            "--secure-port=0",
            "--disable-metrics",
            "--v=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_descheduler_run_once_migrates_reservation_first_within_the_limits(
    cluster: Cluster,
    namespace: str,
    restart_controller: Callable[[str], None],
    tmp_path: Path,
) -> None:
    # At most two of a workload's pods start migrating per ten minutes.
    restart_controller("objectLimiters:\n  workload: {duration: 10m, maxMigrating: 2}\n")
    opt_in(cluster, namespace)
    source = "node-0"
    with only_schedulable(cluster, source):
        cluster.apply(deployment("dup", replicas=6, cpu="100m"), namespace)
        cluster.wait(lambda: ready_pods(cluster, namespace, "dup", 6), what="six pods on one node")
    originals = {p["metadata"]["uid"]: p for p in pods(cluster, namespace)}
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))

    run = descheduler_once(cluster, policy)
    assert run.returncode == 0, run.stderr[-4000:]

    # Six pods, three nodes: an even share is two, so four evictions, each made a job.
    jobs = intercepted(cluster, namespace)
    assert len(jobs) == 4, run.stderr[-4000:]
    assert {j["spec"]["podRef"]["uid"] for j in jobs} <= set(originals)

    def settled() -> list[dict[str, Any]] | None:
        # A waiting job's reason is the one its last round found: while the first two
        # still migrate, maxMigratingPerWorkload holds the others back too; the rounds
        # after they succeed name the object limiter alone.
        current = intercepted(cluster, namespace)
        statuses = [j.get("status", {}) for j in current]
        phases = sorted(status.get("phase") or "Pending" for status in statuses)
        held = [
            status.get("reason") == "ObjectLimiters"
            for status in statuses
            if (status.get("phase") or "Pending") == "Pending"
        ]
        if phases == ["Pending", "Pending", "Succeed", "Succeed"] and all(held):
            return current
        return None

    jobs = cluster.wait(
        settled, what="two jobs to succeed, two to wait on the object limiter", timeout=240
    )
    for job in jobs:
        if job["status"].get("phase") == "Succeed":
            landed_where_reserved(cluster, job)
        else:
            assert job["status"]["reason"] == "ObjectLimiters", job["status"]
            # Held back, the pod stays where it is.
            uid = job["spec"]["podRef"]["uid"]
            assert any(p["metadata"]["uid"] == uid for p in pods(cluster, namespace, "app=dup"))


def evict(cluster: Cluster, namespace: str, name: str) -> subprocess.CompletedProcess[str]:
    """One eviction through the Eviction API, as the administrator."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    return cluster.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
        "-f",
        "-",
        input=json.dumps(body),
        check=False,
    )


@contextmanager
def webhook_config(cluster: Cluster, path: Path, config: str) -> Iterator[None]:
    """The webhook restarted with this configuration file for the block, then with none."""
    path.write_text(config)

    def restart(config_path: Path | None) -> None:
        for webhook in [c for c in cluster.local.running() if c.name.startswith("berth-webhook")]:
            cluster.local.stop(webhook)
        cluster.local.start_webhook(name="berth-webhook", config=config_path)

    restart(path)
    try:
        yield
    finally:
        restart(None)


def test_evictions_elsewhere_pass_unless_all_namespaces_and_requesters_say_so(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A namespace without the label: by default its evictions pass; with allNamespaces
    they are intercepted (in the configured mode and TTL), unless the requester is not
    among those listed."""
    cluster.apply(deployment("web", replicas=3, cpu="50m"), namespace)
    first, second, third = (
        p["metadata"]["name"]
        for p in cluster.wait(lambda: ready_pods(cluster, namespace, "web", 3), what="pods")
    )
    assert evict(cluster, namespace, first).returncode == 0

    elsewhere = "evictionInterception:\n  allNamespaces: true\n"
    listed = elsewhere + "  requesters: {users: [system:serviceaccount:kube-system:descheduler]}\n"
    with webhook_config(cluster, tmp_path / "listed.yaml", listed):
        assert evict(cluster, namespace, second).returncode == 0
    assert not intercepted(cluster, namespace)

    config = f"defaultJobMode: EvictDirectly\ndefaultJobTTL: 1m\n{elsewhere}"
    with webhook_config(cluster, tmp_path / "all.yaml", config):
        refused = evict(cluster, namespace, third)
    assert refused.returncode != 0
    assert "is being migrated by PodMigrationJob eviction-" in refused.stderr
    [job] = intercepted(cluster, namespace)
    assert job["spec"]["podRef"]["name"] == third
    assert (job["spec"]["mode"], job["spec"]["ttl"]) == ("EvictDirectly", "1m0s")


def test_a_retry_by_name_after_an_evict_directly_job_never_evicts_the_replacement(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """With `defaultJobMode: EvictDirectly` the eviction's job reserves nothing, so no
    Reservation ties a StatefulSet's replacement to it. The retry by name that reaches
    the replacement finds the job by its `berth.sh/eviction-of` label and is answered
    404: the drain counts the pod gone instead of evicting each new db-0 in turn. (Two
    replicas: arbitration keeps an EvictDirectly job of a one-replica workload waiting.)"""
    opt_in(cluster, namespace)
    cluster.apply(statefulset("db", replicas=2, cpu="100m"), namespace)

    def db_0() -> list[dict[str, Any]]:
        return [p for p in pods(cluster, namespace, "app=db") if p["metadata"]["name"] == "db-0"]

    cluster.wait(lambda: ready_pods(cluster, namespace, "db", 2), what="db-0 and db-1")
    [original] = db_0()
    with webhook_config(cluster, tmp_path / "direct.yaml", "defaultJobMode: EvictDirectly\n"):
        first = evict(cluster, namespace, "db-0")
        assert first.returncode != 0
        assert "is being migrated by PodMigrationJob eviction-" in first.stderr
        [job] = cluster.wait(lambda: ended(intercepted(cluster, namespace)), what="the job")
        assert job["spec"]["mode"] == "EvictDirectly"
        assert job["status"]["phase"] == "Succeed", job["status"]
        [new] = cluster.wait(
            lambda: [
                p
                for p in db_0()
                if p["metadata"]["uid"] != original["metadata"]["uid"]
                and p["status"].get("phase") == "Running"
            ],
            what="the replacement db-0",
        )
        retry = evict(cluster, namespace, "db-0")
    assert "NotFound" in retry.stderr, retry.stderr
    assert f"is the replacement PodMigrationJob {job['metadata']['name']}" in retry.stderr
    [still] = db_0()
    assert still["metadata"]["uid"] == new["metadata"]["uid"]
    assert not still["metadata"].get("deletionTimestamp")
    assert len(intercepted(cluster, namespace)) == 1


@pytest.mark.parametrize("drained_by", ["cordon", "taint"])
def test_a_retry_by_name_never_evicts_a_statefulset_replacement(
    cluster: Cluster, namespace: str, own_node: str, drained_by: str
) -> None:
    """kubectl drain re-reads a pod by name after each 429 and evicts whatever pod has
    that name then, without a UID precondition: for a StatefulSet, the replacement Berth
    put in place. Retried by the same requester, the eviction is answered 404 (the pod it
    meant is gone), whether the replacement is still gated or already bound, and the
    replacement stays. Once its node is cordoned, an eviction of it is a drain of that
    node: intercepted, and the replacement moves on reservation-first. So it is once the
    node is tainted against it, as Cluster Autoscaler marks a node it removes."""
    opt_in(cluster, namespace)
    source = own_node
    with only_schedulable(cluster, source):
        cluster.apply(
            statefulset("db", replicas=1, cpu="100m", spec_extra=tolerating(source)), namespace
        )
        [original] = cluster.wait(lambda: ready_pods(cluster, namespace, "db", 1), what="db-0")
    first = evict(cluster, namespace, "db-0")
    assert first.returncode != 0
    assert "is being migrated by PodMigrationJob eviction-" in first.stderr

    def replacement() -> dict[str, Any] | None:
        found = [
            p
            for p in pods(cluster, namespace, "app=db")
            if p["metadata"]["uid"] != original["metadata"]["uid"]
        ]
        return found[0] if found else None

    # The retry, as soon as the replacement exists (still gated, as a rule).
    new = cluster.wait(replacement, what="the replacement db-0")
    retry = evict(cluster, namespace, "db-0")
    assert retry.returncode != 0
    assert "NotFound" in retry.stderr, retry.stderr
    assert "is the replacement PodMigrationJob eviction-" in retry.stderr, retry.stderr
    [job] = cluster.wait(lambda: ended(intercepted(cluster, namespace)), what="the job to end")
    landed_where_reserved(cluster, job)
    # And again once it is bound and Ready: still the same pod, still answered 404.
    [bound] = cluster.wait(lambda: ready_pods(cluster, namespace, "db", 1), what="db-0 ready")
    assert bound["metadata"]["uid"] == new["metadata"]["uid"]
    again = evict(cluster, namespace, "db-0")
    assert "NotFound" in again.stderr, again.stderr

    # Its node being drained now: the replacement is migrated off it in turn.
    reserved = bound["spec"]["nodeName"]
    taint = "ToBeDeletedByClusterAutoscaler=1:NoSchedule"
    if drained_by == "cordon":
        cluster.kubectl("cordon", reserved)
    else:
        cluster.kubectl("taint", "node", reserved, taint)
    try:
        drained = evict(cluster, namespace, "db-0")
        assert drained.returncode != 0
        assert f"PodMigrationJob eviction-{new['metadata']['uid']}" in drained.stderr
        second = cluster.wait(
            lambda: ended(
                [
                    j
                    for j in intercepted(cluster, namespace)
                    if j["metadata"]["uid"] != job["metadata"]["uid"]
                ]
            ),
            what="the second job to end",
        )
        [moved] = second
        landed_where_reserved(cluster, moved)
    finally:
        if drained_by == "cordon":
            cluster.kubectl("uncordon", reserved)
        else:
            cluster.kubectl("taint", "node", reserved, f"{taint.split('=')[0]}:NoSchedule-")


def test_an_eviction_whose_job_the_api_server_refuses_goes_ahead(
    cluster: Cluster, namespace: str
) -> None:
    """A ValidatingAdmissionPolicy refuses PodMigrationJobs for the namespace's pods: the
    webhook made no job, and a 429 would only come again at every retry. The eviction
    goes ahead, with an EvictionAllowed Warning event on the pod saying why."""
    opt_in(cluster, namespace)
    cluster.apply(deployment("refused", cpu="50m"), namespace)
    [pod] = cluster.wait(lambda: ready_pods(cluster, namespace, "refused", 1), what="the pod")
    name = f"no-jobs-{namespace}"[:63]
    cluster.apply(
        refusing_policy(
            name,
            rule={
                "apiGroups": ["scheduling.koordinator.sh"],
                "apiVersions": ["v1alpha1"],
                "resources": ["podmigrationjobs"],
            },
            condition=f"object.spec.podRef.namespace == '{namespace}'",
            message="no jobs here",
        )
    )
    try:
        # In force once the API server has loaded it: a server dry run of a job says so.
        _, manifest = job_manifest(pod)

        def in_force() -> bool:
            tried = cluster.kubectl(
                "create", "--dry-run=server", "-f", "-", input=manifest, check=False
            )
            return "no jobs here" in tried.stderr

        cluster.wait(in_force, what="the policy to be in force")
        result = evict(cluster, namespace, pod["metadata"]["name"])
        assert result.returncode == 0, result.stderr
        said = [
            e["message"]
            for e in pod_events(cluster, pod)
            if e["reason"] == "EvictionAllowed" and e["type"] == "Warning"
        ]
        assert any("refused to create its PodMigrationJob" in m for m in said), said
        assert any("no jobs here" in m for m in said), said
        assert intercepted(cluster, namespace) == []
    finally:
        cluster.kubectl(
            "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name,
            "--ignore-not-found",
        )  # fmt: skip


def test_an_eviction_whose_job_create_fails_and_makes_nothing_goes_ahead(
    cluster: Cluster, namespace: str
) -> None:
    """A webhook on PodMigrationJob creates that cannot be reached (failurePolicy Fail):
    the API server answers the job's create 500 and makes nothing. The webhook reads the
    job, finds none, and lets the eviction through rather than answer 429 at every retry
    for a job that never was."""
    opt_in(cluster, namespace)
    cluster.apply(deployment("unmade", cpu="50m"), namespace)
    [pod] = cluster.wait(lambda: ready_pods(cluster, namespace, "unmade", 1), what="the pod")
    name = f"down-{namespace}"[:63]
    label = pod_label(namespace, pod["metadata"]["name"])
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "down.e2e.berth.sh",
                "clientConfig": {"url": "https://127.0.0.1:1/validate"},
                "rules": [
                    {
                        "apiGroups": ["scheduling.koordinator.sh"],
                        "apiVersions": ["v1alpha1"],
                        "resources": ["podmigrationjobs"],
                        "operations": ["CREATE"],
                    }
                ],
                "objectSelector": {"matchLabels": {keys.EVICTION_OF: label}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 1,
            }
        ],
    }
    cluster.apply(json.dumps(config))
    try:
        # In force once the API server has loaded it: a server dry run of such a job fails.
        job = {
            "apiVersion": "scheduling.koordinator.sh/v1alpha1",
            "kind": "PodMigrationJob",
            "metadata": {"generateName": "probe-", "labels": {keys.EVICTION_OF: label}},
            "spec": {"podRef": {"namespace": namespace, "name": pod["metadata"]["name"]}},
        }

        def in_force() -> bool:
            tried = cluster.kubectl(
                "create", "--dry-run=server", "-f", "-", input=json.dumps(job), check=False
            )
            return "down.e2e.berth.sh" in tried.stderr

        cluster.wait(in_force, what="the webhook configuration to be in force")
        result = evict(cluster, namespace, pod["metadata"]["name"])
        assert result.returncode == 0, result.stderr
        assert intercepted(cluster, namespace) == []
        gone = cluster.wait(
            lambda: (
                not [
                    p
                    for p in pods(cluster, namespace, "app=unmade")
                    if p["metadata"]["uid"] == pod["metadata"]["uid"]
                    and not p["metadata"].get("deletionTimestamp")
                ]
            ),
            what="the pod evicted",
        )
        assert gone
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", name, "--ignore-not-found")


def test_a_pod_berth_never_migrates_is_evicted_as_asked(cluster: Cluster, namespace: str) -> None:
    """A bare pod (nothing would recreate it) in an opted-in namespace: the eviction goes
    ahead at once, and no job is made."""
    opt_in(cluster, namespace)
    cluster.apply(json.dumps(bare_pod("lonely", cpu="50m")), namespace)
    cluster.wait(
        lambda: cluster.get("pod", "lonely", "-n", namespace)["spec"].get("nodeName"),
        what="the pod to be scheduled",
    )
    result = evict(cluster, namespace, "lonely")
    assert result.returncode == 0, result.stderr
    cluster.wait(lambda: not pods(cluster, namespace), what="the pod to be gone")
    assert not intercepted(cluster, namespace)


def pod_events(cluster: Cluster, pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events about `pod`, as the API server has them."""
    metadata = pod["metadata"]
    selector = f"--field-selector=involvedObject.name={metadata['name']}"
    items: list[dict[str, Any]] = cluster.get("events", "-n", metadata["namespace"], selector)[
        "items"
    ]
    return items
