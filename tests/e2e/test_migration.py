"""Reservation-first migrations end to end: controller, webhook and extender together."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from berth.api import keys
from berth.resources import pod_requests
from devtools.nodes import is_schedulable
from devtools.render import fake_node
from tests.e2e.kube import Cluster, pods, refusing_policy
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
from tests.e2e.scrape import scrape, total

pytestmark = pytest.mark.e2e

SEEDS = Path(__file__).resolve().parent / "seed_quickstart"
SEED_POD = "pod-demo-5f9b977566-c7lvk"

# Seed 002, "Use PodMigrationJob > Quick Start", `kubectl get podmigrationjob
# migrationjob-demo` and `kubectl describe podmigrationjob migrationjob-demo`, verbatim.
SEED_GET = """\
NAME                PHASE     STATUS     AGE   NODE     RESERVATION                            PODNAMESPACE   POD                         NEWPOD                      TTL
migrationjob-demo   Succeed   Complete   37s   node-1   d56659ab-ba16-47a2-821d-22d6ba49258e   default        pod-demo-5f9b977566-c7lvk   pod-demo-5f9b977566-nxjdf   5m0s
"""  # noqa: E501
SEED_EVENTS = """\
  Normal  ReservationCreated    8m33s  koord-descheduler  Successfully create Reservation "d56659ab-ba16-47a2-821d-22d6ba49258e"
  Normal  ReservationScheduled  8m33s  koord-descheduler  Assigned Reservation "d56659ab-ba16-47a2-821d-22d6ba49258e" to node "node-1"
  Normal  Evicting              8m33s  koord-descheduler  Try to evict Pod "default/pod-demo-5f9b977566-c7lvk"
  Normal  EvictComplete         8m     koord-descheduler  Pod "default/pod-demo-5f9b977566-c7lvk" has been evicted
  Normal  Complete              8m     koord-descheduler  Bind Pod "default/pod-demo-5f9b977566-nxjdf" in Reservation "d56659ab-ba16-47a2-821d-22d6ba49258e"
"""  # noqa: E501
SEED_RESERVATION = "d56659ab-ba16-47a2-821d-22d6ba49258e"
SEED_NEW_POD = "pod-demo-5f9b977566-nxjdf"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def describe_events(cluster: Cluster, name: str) -> list[tuple[str, str, str, str]]:
    """Type, Reason, From and Message of each event `kubectl describe pmj` lists, top to
    bottom (Age left out)."""
    text = cluster.kubectl("describe", "pmj", name).stdout
    return event_rows(text.split("Events:", 1)[1].splitlines()[3:])


def event_rows(lines: list[str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for line in lines:
        if line.strip():
            kind, reason, _age, source, message = line.split(maxsplit=4)
            rows.append((kind, reason, source, message))
    return rows


@pytest.fixture
def seed_quick_start(cluster: Cluster) -> Iterator[None]:
    """The quick start's objects (the Deployment in `default`, the job) gone before and
    after the test."""

    def clean() -> None:
        cluster.kubectl("delete", "pmj", "migrationjob-demo", "--ignore-not-found")
        cluster.kubectl(
            "delete", "deployment", "pod-demo", "-n", "default", "--ignore-not-found",
            "--cascade=foreground",
        )  # fmt: skip
        cluster.kubectl("delete", "pod", SEED_POD, "-n", "default", "--ignore-not-found")
        cluster.wait(lambda: not pods(cluster, "default", "app=pod-demo"), what="no pod-demo")

    clean()
    yield
    clean()


def seed_pod_of_the_deployment(cluster: Cluster) -> dict[str, Any]:
    """Make the quick start's Deployment own a pod named as in the seed's output.

    A Deployment names its pods `<name>-<template hash>-<random>`, so the name the seed's
    job refers to (pod-demo-5f9b977566-c7lvk) comes from another cluster. To apply both
    documents unchanged, the Deployment is created once to learn its template hash, deleted,
    and a pod of its template with that name and the hash label is created; the Deployment,
    created again, then adopts that pod as its one replica (a ReplicaSet adopts the orphan
    pods its selector matches) instead of making one."""
    deployment_yaml = (SEEDS / "pod-demo.yaml").read_text()
    created = cluster.kubectl("create", "-f", "-", input=deployment_yaml)
    assert created.stdout.strip() == "deployment.apps/pod-demo created"
    [replica_set] = cluster.wait(
        lambda: cluster.get("replicasets", "-n", "default", "-l", "app=pod-demo")["items"],
        what="the ReplicaSet of pod-demo",
    )
    template_hash = replica_set["metadata"]["labels"]["pod-template-hash"]
    cluster.kubectl("delete", "deployment", "pod-demo", "-n", "default", "--cascade=foreground")
    cluster.wait(lambda: not pods(cluster, "default", "app=pod-demo"), what="no pod-demo")
    template = yaml.safe_load(deployment_yaml)["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": SEED_POD,
            "namespace": "default",
            "labels": {**template["metadata"]["labels"], "pod-template-hash": template_hash},
        },
        "spec": template["spec"],
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    cluster.wait(lambda: ready_pods(cluster, "default", "pod-demo", 1), what=SEED_POD)
    created = cluster.kubectl("create", "-f", "-", input=deployment_yaml)
    assert created.stdout.strip() == "deployment.apps/pod-demo created"

    def adopted() -> dict[str, Any] | None:
        found = ready_pods(cluster, "default", "pod-demo", 1)
        owners = found[0]["metadata"].get("ownerReferences") or [] if found else []
        return found[0] if [o["name"] for o in owners] == [f"pod-demo-{template_hash}"] else None

    old: dict[str, Any] = cluster.wait(adopted, what="the Deployment to adopt " + SEED_POD)
    assert old["metadata"]["name"] == SEED_POD
    return old


@pytest.mark.usefixtures("seed_quick_start")
def test_seed_quick_start_verbatim(cluster: Cluster) -> None:
    """Seed 002's quick start with its two documents applied as they are: the Deployment's
    pod is scheduled by `koord-scheduler` (a profile of Berth's kube-scheduler), the job
    migrates it, and `kubectl get` and `kubectl describe` print what the seed shows, up to
    what differs on every run (age, node, Reservation UID, new pod name) and the events'
    source (Berth's controller, not koord-descheduler)."""
    old = seed_pod_of_the_deployment(cluster)
    assert old["spec"]["schedulerName"] == "koord-scheduler"
    created = cluster.kubectl(
        "create", "-f", "-", input=(SEEDS / "migrationjob-demo.yaml").read_text()
    )
    assert (
        created.stdout.strip()
        == "podmigrationjob.scheduling.koordinator.sh/migrationjob-demo created"
    )
    job = cluster.wait(
        lambda: phase_is(cluster, "migrationjob-demo", "Succeed", "Failed"),
        what="the migration to end",
    )
    assert (job["status"]["phase"], job["status"]["status"]) == ("Succeed", "Complete"), job

    header, row = cluster.kubectl("get", "podmigrationjob", "migrationjob-demo").stdout.splitlines()
    seed_header, seed_row = SEED_GET.splitlines()
    assert header.split() == seed_header.split()
    printed = dict(zip(header.split(), row.split(), strict=True))
    reservation, node, new_pod = printed["RESERVATION"], printed["NODE"], printed["NEWPOD"]
    this_run = {"37s": printed["AGE"], "node-1": node, SEED_RESERVATION: reservation}
    this_run[SEED_NEW_POD] = new_pod
    assert row.split() == [this_run.get(word, word) for word in seed_row.split()]

    assert reservation == job["metadata"]["uid"]
    assert UUID.fullmatch(reservation)
    new = cluster.get("pod", new_pod, "-n", "default")
    assert new["metadata"]["ownerReferences"] == old["metadata"]["ownerReferences"]
    assert new["spec"]["schedulerName"] == "koord-scheduler"
    assert new["spec"]["nodeName"] == node != old["spec"]["nodeName"]
    assert json.loads(new["metadata"]["annotations"][keys.RESERVATION_ALLOCATED])["name"] == (
        reservation
    )

    expected = [
        (kind, reason, "berth-controller", message)
        for kind, reason, _source, message in event_rows(SEED_EVENTS.splitlines())
    ]
    for seed_value, value in (
        (SEED_RESERVATION, reservation),
        ('"node-1"', f'"{node}"'),
        (SEED_NEW_POD, new_pod),
    ):
        expected = [(k, r, s, m.replace(seed_value, value)) for k, r, s, m in expected]
    assert describe_events(cluster, "migrationjob-demo") == expected
    assert not any(leftovers(cluster, "default").values())


def reservation_for(
    pod: dict[str, Any], name: str, *, target: str, ttl: str, cpu: str = "200m"
) -> str:
    """A Reservation made by hand on `target` for the pods of `pod`'s ReplicaSet, holding
    `cpu` (as much as `deployment` asks by default)."""
    namespace = pod["metadata"]["namespace"]
    rs = pod["metadata"]["ownerReferences"][0]
    return f"""
apiVersion: scheduling.koordinator.sh/v1alpha1
kind: Reservation
metadata: {{name: {name}}}
spec:
  ttl: {ttl}
  template:
    metadata: {{namespace: {namespace}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {target}}}
      containers: [{{name: app, resources: {{requests: {{cpu: {cpu}}}}}}}]
  owners:
  - controller: {{apiVersion: apps/v1, kind: ReplicaSet, name: {rs["name"]}, uid: {rs["uid"]},
                  namespace: {namespace}}}
"""


def job_on(
    cluster: Cluster, pod: dict[str, Any], reservation: str, *, ttl: str | None = "2m"
) -> str:
    """A job for `pod` naming `reservation` (reservationRef), once it is Available."""
    cluster.wait(
        lambda: (
            cluster.get("reservation", reservation).get("status", {}).get("phase") == "Available"
        ),
        what="the Reservation to be Available",
    )
    name, manifest = job_manifest(
        pod, ttl=ttl, reservationOptions={"reservationRef": {"name": reservation}}
    )
    cluster.apply(manifest)
    return name


def test_reservation_ref_uses_the_given_reservation(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("ref"), namespace)
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "ref", 1), what="the pod")[0]
    target = "node-2" if old["spec"]["nodeName"] != "node-2" else "node-1"
    rsv_name = f"rsv-{namespace}"[:60]
    cluster.apply(reservation_for(old, rsv_name, target=target, ttl="5m"))
    try:
        name = job_on(cluster, old, rsv_name)
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


def test_a_reservation_smaller_than_the_pod_evicts_nothing(
    cluster: Cluster, namespace: str
) -> None:
    """A Reservation made by hand that holds less than the pod asks: the webhook would not
    bind its replacement there, so the job fails before the eviction, saying why."""
    cluster.apply(deployment("small"), namespace)
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "small", 1), what="the pod")[0]
    target = "node-2" if old["spec"]["nodeName"] != "node-2" else "node-1"
    rsv_name = f"rsv-{namespace}"[:60]
    cluster.apply(reservation_for(old, rsv_name, target=target, ttl="5m", cpu="100m"))
    try:
        name = job_on(cluster, old, rsv_name)
        job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the end")
        assert job["status"]["reason"] == "InvalidSpec", job["status"]
        assert (
            f"the pod requests more than reservation {rsv_name} holds: cpu 200m (it holds 100m)"
        ) in job["status"]["message"]
        assert "nothing was evicted" in job["status"]["message"]
        [still] = ready_pods(cluster, namespace, "small", 1)
        assert still["metadata"]["uid"] == old["metadata"]["uid"]
    finally:
        cluster.kubectl("delete", "reservation", rsv_name, "--ignore-not-found")


def test_two_jobs_naming_one_reservation_evict_one_pod(cluster: Cluster, namespace: str) -> None:
    """One Reservation made by hand (for the pods of two Deployments) holds one place: of
    two jobs naming it, created together, the one created second fails (InvalidSpec,
    naming the first) and its pod is not evicted, whichever job the controller looks at
    first; the first migrates its pod into the place."""
    cluster.apply(deployment("one"), namespace)
    cluster.apply(deployment("two"), namespace)
    one = cluster.wait(lambda: ready_pods(cluster, namespace, "one", 1), what="one's pod")[0]
    two = cluster.wait(lambda: ready_pods(cluster, namespace, "two", 1), what="two's pod")[0]
    used = {one["spec"]["nodeName"], two["spec"]["nodeName"]}
    target = next(n for n in ("node-0", "node-1", "node-2") if n not in used)
    rsv_name = f"rsv-{namespace}"[:60]
    shared = yaml.safe_load(reservation_for(one, rsv_name, target=target, ttl="5m"))
    shared["spec"]["owners"] += yaml.safe_load(
        reservation_for(two, rsv_name, target=target, ttl="5m")
    )["spec"]["owners"]
    cluster.apply(json.dumps(shared))
    try:
        cluster.wait(
            lambda: (
                cluster.get("reservation", rsv_name).get("status", {}).get("phase") == "Available"
            ),
            what="the Reservation to be Available",
        )
        ref = {"reservationRef": {"name": rsv_name}}
        first, a = job_manifest(one, name=f"a-{namespace}"[:60], reservationOptions=ref)
        second, b = job_manifest(two, name=f"b-{namespace}"[:60], reservationOptions=ref)
        # One request: both exist before the controller's next arbitration round.
        cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            json.loads(a), json.loads(b)
        ]}))  # fmt: skip
        refused = cluster.wait(
            lambda: phase_is(cluster, second, "Failed", "Succeed"), what="the second job to end"
        )
        assert refused["status"]["reason"] == "InvalidSpec", refused["status"]
        assert f"is named by PodMigrationJob {first!r} too" in refused["status"]["message"]
        job = cluster.wait(
            lambda: phase_is(cluster, first, "Succeed", "Failed"), what="the first job to end"
        )
        assert job["status"]["phase"] == "Succeed", job["status"]
        assert job["status"]["nodeName"] == target
        assert (
            ready_pods(cluster, namespace, "two", 1)[0]["metadata"]["uid"] == two["metadata"]["uid"]
        )
    finally:
        cluster.kubectl("delete", "reservation", rsv_name, "--ignore-not-found")


def test_a_placeholder_that_failed_is_made_again(cluster: Cluster, namespace: str) -> None:
    """The kubelet evicts a placeholder under node pressure: the pod object stays, Failed,
    and the scheduler counts it no more. The Reservation goes Pending, a new placeholder
    is made and bound, the Reservation is Available again, and the failed pod goes."""
    cluster.apply(deployment("held"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "held", 1), what="the pod")[0]
    target = next(n for n in ("node-0", "node-1", "node-2") if n != pod["spec"]["nodeName"])
    rsv_name = f"rsv-{namespace}"[:60]
    cluster.apply(reservation_for(pod, rsv_name, target=target, ttl="5m"))

    def recorded() -> dict[str, Any] | None:
        reservation = cluster.get("reservation", rsv_name)
        record = (reservation["metadata"].get("annotations") or {}).get(keys.PLACEHOLDER)
        if reservation.get("status", {}).get("phase") != "Available" or not record:
            return None
        return dict(json.loads(record))

    try:
        first = cluster.wait(recorded, what="the Reservation to be Available")
        cluster.kubectl(
            "patch", "pod", first["name"], "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"phase": "Failed", "reason": "Evicted"}}),
        )  # fmt: skip
        second = cluster.wait(
            lambda: (found := recorded()) and found["uid"] != first["uid"] and found,
            what="a new placeholder, bound, and the Reservation Available again",
        )
        assert second["name"] != first["name"]
        cluster.wait(
            lambda: (
                not any(p["metadata"]["uid"] == first["uid"] for p in pods(cluster, namespace, ""))
            ),
            what="the failed placeholder to be deleted",
        )
    finally:
        cluster.kubectl("delete", "reservation", rsv_name, "--ignore-not-found")


def test_a_placeholder_the_api_server_refuses_is_said_on_the_reservation(
    cluster: Cluster, namespace: str
) -> None:
    """A ResourceQuota that allows no more pods refuses the placeholder: the Reservation
    says so (Scheduled=False, FailedCreate, the API server's message) and a Warning event,
    and holds nothing; the create is tried again, backing off, and said once (the name
    the API server generates for each attempt is left out of the message: one that
    differed each time was written each time, and each write brought the Reservation
    straight back to the queue, a create and an event per write, for the whole TTL); once
    the quota allows it, the placeholder is made and bound."""
    cluster.apply(deployment("quota"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "quota", 1), what="the pod")[0]
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-more-pods"},
        "spec": {"hard": {"pods": "1"}},
    }
    cluster.apply(json.dumps(quota), namespace)
    target = next(n for n in ("node-0", "node-1", "node-2") if n != pod["spec"]["nodeName"])
    rsv_name = f"rsv-{namespace}"[:60]
    cluster.apply(reservation_for(pod, rsv_name, target=target, ttl="5m"))

    def scheduled() -> dict[str, Any]:
        found = cluster.get("reservation", rsv_name).get("status", {}).get("conditions") or []
        return next((c for c in found if c["type"] == "Scheduled"), {})

    def errors() -> float:
        """Reservation passes that failed, the refused creates among them."""
        samples = asyncio.run(scrape(cluster, "berth-controller"))
        return total(samples, "berth_reconcile_errors_total", kind="rsv")

    try:
        refused = cluster.wait(
            lambda: (c := scheduled()).get("reason") == "FailedCreate" and c,
            what="the Reservation to say its placeholder was refused",
        )
        assert "exceeded quota" in refused["message"]
        assert f'"berth-placeholder-{rsv_name}-'[:59] + '*"' in refused["message"]
        assert cluster.get("reservation", rsv_name)["status"].get("phase") != "Available"
        attempts = errors()
        cluster.wait(lambda: errors() >= attempts + 2, what="two more attempts at the create")
        said = [
            e["message"]
            for e in cluster.get(
                "events", "-A", f"--field-selector=involvedObject.name={rsv_name}"
            )["items"]
            if e["reason"] == "FailedCreate"
        ]
        assert len(set(said)) == 1, said
        cluster.kubectl("delete", "resourcequota", "no-more-pods", "-n", namespace)
        cluster.wait(
            lambda: cluster.get("reservation", rsv_name)["status"].get("phase") == "Available",
            what="the placeholder to be made once the quota is gone",
            timeout=90,
        )
    finally:
        cluster.kubectl("delete", "reservation", rsv_name, "--ignore-not-found")


def refusing_pods_of(app: str, namespace: str) -> str:
    """A ValidatingAdmissionPolicy, and its binding, that refuse the pods labelled
    app=`app` created in `namespace`: as a ResourceQuota, a policy or a validating
    webhook does, after the mutating webhooks."""
    return refusing_policy(
        f"refuse-{namespace}"[:63],
        rule={"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
        condition=(
            f"has(object.metadata.labels) && object.metadata.labels[?'app'].orValue('') == '{app}'"
        ),
        message="refused for the test",
        namespace=namespace,
    )


def test_a_replacement_refused_after_its_claim_leaves_the_reservation_to_the_next(
    cluster: Cluster, namespace: str
) -> None:
    """The first replacement is refused after the webhook claimed the Reservation for it
    (a policy, a quota, a validating webhook: here a ValidatingAdmissionPolicy), and
    that claim binds no pod. Once pods are let in again, the ReplicaSet's next pod finds
    no pod carrying the claim (by its label), takes the Reservation over, and the
    migration ends on the reserved node, well before the controller would release that
    claim (30 s)."""
    cluster.apply(deployment("tight"), namespace)
    [old] = cluster.wait(lambda: ready_pods(cluster, namespace, "tight", 1), what="the pod")

    def refused() -> list[str]:
        """What the ReplicaSet says of its creates refused (its ReplicaFailure)."""
        return [
            c["message"]
            for rs in cluster.get("replicasets", "-n", namespace, "-l", "app=tight")["items"]
            for c in (rs.get("status") or {}).get("conditions") or ()
            if c["type"] == "ReplicaFailure" and "refused for the test" in c["message"]
        ]

    name, manifest = job_manifest(old, ttl="2m")

    def claim() -> str | None:
        found = cluster.get("reservation", job_of(cluster, name)["metadata"]["uid"])
        return str(found["metadata"].get("annotations", {}).get(keys.CLAIM) or "") or None

    try:
        cluster.apply(refusing_pods_of("tight", namespace))
        cluster.apply(manifest)
        cluster.wait(refused, what="the first replacement refused after its claim")
        first = cluster.wait(claim, what="the claim written for it")
        # A second claim for a later pod, refused too: a claim was taken over.
        cluster.wait(lambda: claim() not in (None, first), what="a claim taken over")
    finally:
        cluster.kubectl(
            "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
            f"refuse-{namespace}"[:63], "--ignore-not-found",
        )  # fmt: skip
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end", timeout=150
    )
    status = job["status"]
    assert status["phase"] == "Succeed", status
    [new] = cluster.wait(lambda: ready_pods(cluster, namespace, "tight", 1), what="the new pod")
    assert new["metadata"]["name"] == status["podRef"]["name"]
    assert new["spec"]["nodeName"] == status["nodeName"]
    assert leftovers(cluster, namespace)["gated"] == []


def test_a_reservation_the_api_server_refuses_ends_the_job_saying_why(
    cluster: Cluster, namespace: str
) -> None:
    """The job's template carries a label value the API server does not take on the
    Reservation (the job's schema keeps template metadata free-form): the create is
    refused with 422 for as long as the job stands, so the job ends at once,
    FailedCreateReservation with the API server's words, and the pod is left running."""
    cluster.apply(deployment("refused"), namespace)
    pod = cluster.wait(lambda: ready_pods(cluster, namespace, "refused", 1), what="the pod")[0]
    template = {"metadata": {"labels": {"team": "a b/c!"}}}
    name, manifest = job_manifest(pod, reservationOptions={"template": template})
    cluster.apply(manifest)
    ended = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="its end")
    status = ended["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "FailedCreateReservation")
    for said in ("(422: ", "a b/c!", "nothing was evicted"):
        assert said in status["message"], status["message"]
    [still] = ready_pods(cluster, namespace, "refused", 1)
    assert still["metadata"]["uid"] == pod["metadata"]["uid"]


HOLD = "berth.sh/test-hold"
"""A finalizer the test puts on a placeholder: deleted at the handover, it stays
terminating, so the replacement stays gated (its gate comes off once the placeholder is
gone) for as long as the test needs."""


def hold_placeholder(
    cluster: Cluster, pod: dict[str, Any], name: str, *, target: str
) -> dict[str, Any]:
    """A hand-made Reservation `name` on `target` for `pod`'s workload, whose placeholder
    carries the HOLD finalizer; the placeholder's metadata."""

    def placeholder() -> dict[str, Any] | None:
        found = cluster.get("pods", "-A", f"--selector={keys.RESERVATION_LABEL}={name}")
        return found["items"][0] if found["items"] else None

    cluster.kubectl("cordon", target)  # the placeholder waits, Pending, for the finalizer
    try:
        cluster.apply(reservation_for(pod, name, target=target, ttl="10m"))
        held: dict[str, Any] = cluster.wait(placeholder, what="the placeholder")["metadata"]
        cluster.kubectl(
            "patch", "pod", held["name"], "-n", held["namespace"], "--type=merge",
            "-p", json.dumps({"metadata": {"finalizers": [HOLD]}}),
        )  # fmt: skip
    finally:
        cluster.kubectl("uncordon", target)
    return held


def let_go(cluster: Cluster, held: dict[str, Any], reservation: str) -> None:
    cluster.kubectl(
        "patch", "pod", held["name"], "-n", held["namespace"], "--type=json",
        "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]', check=False,
    )  # fmt: skip
    cluster.kubectl("delete", "reservation", reservation, "--ignore-not-found")


def handed_over(
    cluster: Cluster, namespace: str, app: str, old: dict[str, Any], target: str
) -> dict[str, Any]:
    """The replacement of `old`, nominated to `target` and still gated (HOLD)."""

    def found() -> dict[str, Any] | None:
        return next(
            (
                p
                for p in pods(cluster, namespace, f"app={app}")
                if p["metadata"]["uid"] != old["metadata"]["uid"]
                and p["spec"].get("schedulingGates")
                and p.get("status", {}).get("nominatedNodeName") == target
            ),
            None,
        )

    replacement: dict[str, Any] = cluster.wait(found, what="the replacement, nominated and gated")
    return replacement


def test_a_replacement_deleted_before_its_binding_ends_the_job_at_once(
    cluster: Cluster, namespace: str
) -> None:
    """The replacement that took the Reservation is deleted while still gated (a tool
    evicting it, a user): the Reservation fails (OwnerGone) and the job ends
    `ReservationOwnerGone` then, rather than waiting for its TTL while no place is held;
    the workload's next pod runs, gated by nothing."""
    cluster.apply(deployment("gone"), namespace)
    [old] = cluster.wait(lambda: ready_pods(cluster, namespace, "gone", 1), what="the pod")
    target = "node-2" if old["spec"]["nodeName"] != "node-2" else "node-1"
    rsv_name = f"gone-{namespace}"[:60]
    held = hold_placeholder(cluster, old, rsv_name, target=target)
    try:
        name = job_on(cluster, old, rsv_name)
        owner = handed_over(cluster, namespace, "gone", old, target)
        cluster.kubectl("delete", "pod", owner["metadata"]["name"], "-n", namespace)
        job = cluster.wait(
            lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end"
        )
        status = job["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "ReservationOwnerGone"), status
        assert owner["metadata"]["name"] in status["message"]
        assert cluster.get("reservation", rsv_name)["status"]["phase"] == "Failed"
        [after] = cluster.wait(
            lambda: ready_pods(cluster, namespace, "gone", 1), what="the workload's next pod"
        )
        assert after["metadata"]["uid"] not in (old["metadata"]["uid"], owner["metadata"]["uid"])
        assert leftovers(cluster, namespace)["gated"] == []
    finally:
        let_go(cluster, held, rsv_name)


def test_a_pod_left_terminating_ends_its_job_once_the_replacement_runs(
    cluster: Cluster, namespace: str
) -> None:
    """The evicted pod stays terminating (a finalizer here; a node that no longer answers
    in a drain of a failing node): its ReplicaSet's replacement takes the place at once,
    and the job Succeeds once it is Ready, with no TTL to wait for, rather than counting
    against the node's migration limit while the old pod lingers."""
    # A grace period of 0: its deletion timestamp is the eviction's moment, and it counts
    # as kept (by the finalizer) 15 s on.
    quick = {"terminationGracePeriodSeconds": 0}
    cluster.apply(deployment("lingers", spec_extra=quick), namespace)
    [old] = cluster.wait(lambda: ready_pods(cluster, namespace, "lingers", 1), what="the pod")
    pod_name = old["metadata"]["name"]
    cluster.kubectl(
        "patch", "pod", pod_name, "-n", namespace, "--type=merge",
        "-p", json.dumps({"metadata": {"finalizers": [HOLD]}}),
    )  # fmt: skip
    try:
        name, manifest = job_manifest(old, ttl=None)
        cluster.apply(manifest)
        done = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job")
        assert done["status"]["phase"] == "Succeed", done["status"]
        assert "still terminating" in condition(done, "Eviction")["message"]
        lingering = cluster.get("pod", pod_name, "-n", namespace)["metadata"]
        assert lingering["uid"] == old["metadata"]["uid"]
        assert lingering.get("deletionTimestamp")
        [new] = ready_pods(cluster, namespace, "lingers", 1)
        assert new["metadata"]["name"] == done["status"]["podRef"]["name"]
        assert new["spec"]["nodeName"] == done["status"]["nodeName"]
    finally:
        cluster.kubectl(
            "patch", "pod", pod_name, "-n", namespace, "--type=json",
            "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]', check=False,
        )  # fmt: skip


@dataclass(frozen=True)
class Tied:
    """A migration in handover to a node of the test's own: its replacement, gated and
    tied there by the webhook's affinity, waits for a placeholder held by HOLD."""

    node: str
    old: dict[str, Any]
    job: str
    owner: dict[str, Any]
    reservation: str
    held: dict[str, Any]
    """The placeholder's metadata (`let_go` frees it)."""


@contextmanager
def tied_replacement(
    cluster: Cluster, namespace: str, *, cpu: str | None = None, ttl: str | None = "2m"
) -> Iterator[Tied]:
    """`cpu`: the node's, instead of node-0's; `ttl`: the job's."""
    # The pod runs before its target node exists: the scheduler would favour the empty node.
    cluster.apply(deployment("tied"), namespace)
    [old] = cluster.wait(lambda: ready_pods(cluster, namespace, "tied", 1), what="the pod")
    size = cluster.get("node", "node-0")["status"]["allocatable"]
    target = f"tie-{namespace}"[:60]
    made = fake_node(
        name=target, cpu=cpu or size["cpu"], memory=size["memory"], pods=int(size["pods"])
    )
    cluster.kubectl("create", "-f", "-", input=json.dumps(made))
    try:
        cluster.wait(lambda: is_schedulable(cluster.get("node", target)), what="the node Ready")
        rsv_name = f"tied-{namespace}"[:60]
        held = hold_placeholder(cluster, old, rsv_name, target=target)
        try:
            name = job_on(cluster, old, rsv_name, ttl=ttl)
            owner = handed_over(cluster, namespace, "tied", old, target)
            yield Tied(node=target, old=old, job=name, owner=owner, reservation=rsv_name, held=held)
        finally:
            let_go(cluster, held, rsv_name)
    finally:
        cluster.kubectl("delete", "node", target, "--ignore-not-found", "--wait=false")


def replaced_elsewhere(cluster: Cluster, namespace: str, tied: Tied, *, reason: str) -> None:
    """The job ended `Failed` for `reason`, the tied replacement was deleted, saying why,
    and the workload's next pod runs on another node, gated by nothing."""
    job = cluster.wait(
        lambda: phase_is(cluster, tied.job, "Succeed", "Failed"), what="the job to end"
    )
    status = job["status"]
    assert (status["phase"], status["reason"]) == ("Failed", reason), status
    [after] = cluster.wait(
        lambda: ready_pods(cluster, namespace, "tied", 1), what="the workload's next pod"
    )
    assert after["metadata"]["uid"] not in (
        tied.old["metadata"]["uid"],
        tied.owner["metadata"]["uid"],
    )
    assert after["spec"]["nodeName"] != tied.node
    said = cluster.get(
        "events", "-n", namespace,
        f"--field-selector=involvedObject.uid={tied.owner['metadata']['uid']}",
    )["items"]  # fmt: skip
    reasons = [e["reason"] for e in said]
    assert "StrandedPodDeleted" in reasons, said
    assert "ReservationGateRemoved" not in reasons, said
    assert leftovers(cluster, namespace)["gated"] == []


def test_a_reservation_that_expires_in_handover_ends_a_job_without_a_ttl(
    cluster: Cluster, namespace: str
) -> None:
    """A job without a TTL, whose Reservation (made by hand) expires after the eviction,
    while its replacement waits in handover (the node has room for one of them, and the
    placeholder, held, still takes it): the job ends `ReservationExpired` rather than
    waiting for ever, no pod stays gated, and the workload runs again."""
    with tied_replacement(cluster, namespace, cpu="300m", ttl=None) as tied:
        assert "ttl" not in job_of(cluster, tied.job)["spec"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cluster.kubectl(
            "patch", "reservation", tied.reservation, "--type=merge",
            "-p", json.dumps({"spec": {"ttl": None, "expires": now}}),
        )  # fmt: skip
        job = cluster.wait(
            lambda: phase_is(cluster, tied.job, "Succeed", "Failed"), what="the job to end"
        )
        status = job["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "ReservationExpired"), status
        assert tied.reservation in status["message"]
        assert cluster.get("reservation", tied.reservation)["status"]["phase"] == "Failed"
        cluster.wait(lambda: leftovers(cluster, namespace)["gated"] == [], what="no pod left gated")
        # The node has room once the placeholder is gone: the workload runs again (its
        # replacement there, or a pod made after Berth let it go), nothing Pending.
        let_go(cluster, tied.held, tied.reservation)
        [after] = cluster.wait(
            lambda: ready_pods(cluster, namespace, "tied", 1), what="the workload's next pod"
        )
        assert after["metadata"]["uid"] != tied.old["metadata"]["uid"]


def test_a_replacement_tied_to_a_deleted_node_is_replaced_by_one_that_runs(
    cluster: Cluster, namespace: str
) -> None:
    """The Reservation's node is deleted while its replacement, tied there by the webhook's
    affinity, is still gated: an affinity can only be narrowed, so that pod could never
    run. Berth deletes it (`StrandedPodDeleted`), the job ends `ReservationLost`, and the
    workload's next pod runs elsewhere, gated by nothing."""
    with tied_replacement(cluster, namespace) as tied:
        cluster.kubectl("delete", "node", tied.node, "--wait=false")
        replaced_elsewhere(cluster, namespace, tied, reason="ReservationLost")


def test_a_replacement_tied_to_a_deleted_node_is_replaced_with_its_reservation_gone(
    cluster: Cluster, namespace: str
) -> None:
    """The same, but the Reservation is deleted before the node, so no Reservation's pass
    will ever see its pod stranded: the controller's pass over stray pods deletes it (a
    pod whose claim no Reservation holds would otherwise only have its gate let go, and
    stay Pending for ever), and the job ends `MissingReservation` at once."""
    with tied_replacement(cluster, namespace) as tied:
        cluster.kubectl("delete", "reservation", tied.reservation, "--wait=false")
        cluster.kubectl("delete", "node", tied.node, "--wait=false")
        replaced_elsewhere(cluster, namespace, tied, reason="MissingReservation")


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
    # Without a reservation the competing pods take the freed place: the replacement of
    # an EvictDirectly job does not always land there.
    assert outcomes["EvictDirectly"]["reserved"] < ROUNDS, outcomes["EvictDirectly"]
    assert not any(leftovers(cluster, namespace).values())
