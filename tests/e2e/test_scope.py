"""Scope: pods that are not part of a migration pass neither Berth's extender nor its
webhook, and the guarantees of a migration hold without them.

In the default scope (the session's cluster, unless BERTH_E2E_SCOPE=strict)
kube-scheduler calls the extender only for pods that request berth.sh/reservation, and
the API server calls the webhook only for pod creations in namespaces labelled
berth.sh/migrating; in both scopes, only for those kube-controller-manager makes.
Between the placeholder's deletion and the replacement's binding, nothing but the
replacement's nomination to the reserved node keeps other pods off it: the scheduler
counts it against pods of equal or lower priority, not higher.

The handover is held open with a Reservation made by hand and an owner recorded the way
the controller records a claimer, kept unbound by a gate of the test's own
(tests/e2e/capacity.py); the controller does the rest of the handover.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from berth.api import keys
from berth.kube.client import Kube, KubeError
from devtools import render
from devtools.render import Scope
from tests.e2e.capacity import (
    bound_node,
    hand_over,
    lift,
    pod,
    priority_class,
    reserve,
    shape_free_cpu,
)
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import (
    LONG_TTL,
    aexpire,
    condition,
    deployment,
    job_manifest,
    job_of,
    leftovers,
    phase_is,
    ready_pods,
)
from tests.e2e.scrape import scrape, scrape_apiserver, scrape_scheduler, total
from tests.e2e.webhook_world import AS_REPLICASET_CONTROLLER

pytestmark = pytest.mark.e2e

SCHEDULER = "default-scheduler"
FLOOD = 4

Pod = dict[str, Any]


def migrating(cluster: Cluster, namespace: str) -> str | None:
    labels = cluster.get("namespace", namespace)["metadata"].get("labels") or {}
    value: str | None = labels.get(keys.MIGRATING_LABEL)
    return value


def unschedulable(pod: Pod) -> bool:
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in pod["status"].get("conditions") or []
    )


def all_refused(cluster: Cluster, namespace: str, selector: str, count: int) -> list[Pod]:
    """The `count` pods of `selector`, once the scheduler refused each of them."""
    found = pods(cluster, namespace, selector)
    return found if len(found) == count and all(map(unschedulable, found)) else []


async def extender_filters(cluster: Cluster) -> float:
    return total(
        await scrape(cluster, "berth-extender"), "berth_extender_requests_total", verb="filter"
    )


async def webhook_reviews(cluster: Cluster) -> float:
    return total(await scrape(cluster, "berth-webhook"), "berth_webhook_requests_total")


async def unschedulable_attempts(cluster: Cluster) -> float:
    return total(
        await scrape_scheduler(cluster),
        "scheduler_schedule_attempts_total",
        profile=SCHEDULER,
        result="unschedulable",
    )


def flood(prefix: str, *, cpu: str = "1") -> str:
    items = [pod(f"{prefix}-{index}", cpu=cpu) for index in range(FLOOD)]
    for item in items:
        item["metadata"]["labels"] = {"role": prefix}
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


# ----- the extender and the webhook see only migrations -----------------------------------


async def test_pods_outside_a_migration_reach_neither_extender_nor_webhook(
    cluster: Cluster, namespace: str, scope: Scope
) -> None:
    filters, reviews = await extender_filters(cluster), await webhook_reviews(cluster)
    await cluster.aapply(deployment("plain", replicas=3), namespace)
    await cluster.await_(lambda: ready_pods(cluster, namespace, "plain", 3), what="3 pods")
    more_filters = await extender_filters(cluster) - filters
    more_reviews = await webhook_reviews(cluster) - reviews
    assert migrating(cluster, namespace) is None
    if scope == Scope.DEFAULT:
        assert (more_filters, more_reviews) == (0, 0)
    else:  # every pod, on its creation and on its scheduling
        assert more_filters >= 3
        assert more_reviews >= 3


async def dry_run_create(cluster: Cluster, namespace: str, body: Pod, *as_user: str) -> None:
    """Create `body` on a server-side dry run: admission runs, nothing is stored."""
    await cluster.akubectl(
        "create", *as_user, "--dry-run=server", "-n", namespace, "-f", "-",
        input=json.dumps(body),
    )  # fmt: skip


async def test_in_a_migrating_namespace_only_pods_a_workload_controller_creates_reach_the_webhook(
    cluster: Cluster, namespace: str
) -> None:
    """The webhook's match condition (both scopes): the API server sends it a pod creation
    only when kube-controller-manager makes it. A pod a user creates, even one naming a
    real ReplicaSet as its controller, is not sent, in a namespace where a Reservation
    waits for its replacement."""
    reservation = f"{namespace}-waits"
    try:
        await reserve(
            cluster, namespace, reservation, node="node-0", cpu="100m", scheduler=SCHEDULER
        )
        await cluster.await_(
            lambda: migrating(cluster, namespace) == "true", what="the namespace to be labelled"
        )
        await cluster.aapply(deployment("web", replicas=0), namespace)
        [replicaset] = await cluster.await_(
            lambda: cluster.get("replicasets", "-n", namespace, "-l=app=web")["items"],
            what="the Deployment's ReplicaSet",
        )
        forged = pod("forged", cpu="100m")
        forged["metadata"]["labels"] = {"app": "web"}
        forged["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": replicaset["metadata"]["name"],
                "uid": replicaset["metadata"]["uid"],
                "controller": True,
            }
        ]

        # The same pod, created as the ReplicaSet controller: reviewed once the API
        # server's namespace informer shows the label.
        async def reviewed_as_its_controller() -> bool:
            before = await webhook_reviews(cluster)
            await dry_run_create(cluster, namespace, forged, AS_REPLICASET_CONTROLLER)
            return await webhook_reviews(cluster) > before

        await cluster.await_(reviewed_as_its_controller, what="the webhook to review a creation")
        reviews = await webhook_reviews(cluster)
        await dry_run_create(cluster, namespace, forged)
        await dry_run_create(cluster, namespace, pod("plain", cpu="100m"))
        assert await webhook_reviews(cluster) == reviews, "a user's pod reached the webhook"
        await cluster.akubectl("scale", "deployment", "web", "--replicas=1", "-n", namespace)

        async def reviewed() -> bool:
            return await webhook_reviews(cluster) > reviews

        await cluster.await_(reviewed, what="the ReplicaSet's pod to reach the webhook")
    finally:
        await cluster.akubectl("delete", "reservation", reservation, check=False)


# ----- the namespace label ----------------------------------------------------------------

LABELLED = (
    "has(namespaceObject.metadata.labels) && "
    f"'{keys.MIGRATING_LABEL}' in namespaceObject.metadata.labels && "
    f"namespaceObject.metadata.labels['{keys.MIGRATING_LABEL}'] == 'true'"
)


@contextmanager
def evictions_need_the_label(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy that denies any eviction in `namespace` unless the
    namespace carries berth.sh/migrating, as the API server's admission sees it: from the
    same namespace informer the webhook's namespaceSelector is matched against. Its name."""
    name = f"berth-test-{namespace}"[:63]
    items = render.denying_policy(
        name,
        operation="CREATE",
        resource="pods/eviction",
        expression=LABELLED,
        message="evicted before berth.sh/migrating",
        namespace=namespace,
    )
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding", name, "--ignore-not-found")
        cluster.kubectl("delete", "validatingadmissionpolicy", name, "--ignore-not-found")


async def dry_run_eviction_denied(kube: Kube, namespace: str, name: str) -> bool:
    try:
        await kube.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            query={"dryRun": "All"},
            body={
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            },
        )
    except KubeError as error:
        return "berth.sh/migrating" in error.message
    return False


async def test_the_namespace_carries_the_label_from_before_the_eviction_until_the_handover(
    cluster: Cluster, namespace: str, kube: Kube
) -> None:
    await cluster.aapply(deployment("web"), namespace)
    [old] = await cluster.await_(lambda: ready_pods(cluster, namespace, "web", 1), what="pod")
    checks = "apiserver_validating_admission_policy_check_total"
    with evictions_need_the_label(cluster, namespace) as policy:

        async def denied(pod: Pod = old) -> bool:
            return await dry_run_eviction_denied(kube, namespace, pod["metadata"]["name"])

        # In force once the API server denies a dry-run eviction (the label is absent).
        await cluster.await_(denied, what="the policy to be in force")
        before = total(await scrape_apiserver(cluster), checks, policy=policy)
        name, manifest = job_manifest(old)
        await cluster.aapply(manifest)
        job = await cluster.await_(
            lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the migration"
        )
        assert job["status"]["phase"] == "Succeed", job["status"]
        assert condition(job, "Eviction")["reason"] == "EvictComplete"
        # The policy denied nothing in between: the eviction passed it, so the namespace
        # carried the label as the API server's admission saw it.
        assert total(await scrape_apiserver(cluster), checks, policy=policy) == before
        # The replacement is the Reservation's owner: nothing waits there any more, and the
        # policy, still in force, would now deny an eviction.
        await cluster.await_(
            lambda: migrating(cluster, namespace) is None, what="the label to be removed"
        )
        [new] = await cluster.await_(
            lambda: ready_pods(cluster, namespace, "web", 1), what="the replacement"
        )
        assert await denied(new)


@contextmanager
def label_refused(cluster: Cluster, namespace: str) -> Iterator[None]:
    """A ValidatingAdmissionPolicy that refuses `namespace` the berth.sh/migrating label,
    as a policy engine of the cluster's might, in force once the API server refuses a
    dry run of the label."""
    name = f"berth-test-label-{namespace}"[:63]
    items = render.denying_policy(
        name,
        operation="UPDATE",
        resource="namespaces",
        expression=f"!has(object.metadata.labels) || !('{keys.MIGRATING_LABEL}' in "
        "object.metadata.labels)",
        message="no berth.sh/migrating here",
        namespace=namespace,
    )
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    try:

        def in_force() -> bool:
            tried = cluster.kubectl(
                "label", "namespace", namespace, f"{keys.MIGRATING_LABEL}=true",
                "--dry-run=server", check=False,
            )  # fmt: skip
            return tried.returncode != 0 and "no berth.sh/migrating here" in tried.stderr

        cluster.wait(in_force, what="the policy to be in force")
        yield
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding", name, "--ignore-not-found")
        cluster.kubectl("delete", "validatingadmissionpolicy", name, "--ignore-not-found")


def test_a_namespace_refused_the_label_ends_the_job_before_the_eviction(
    cluster: Cluster, namespace: str
) -> None:
    """Without the label the webhook is not called for the replacement (in the default
    scope): the job ends naming the API server's answer, its Reservation is released,
    and the pod was never evicted."""
    cluster.apply(deployment("unlabelled"), namespace)
    [pod] = cluster.wait(lambda: ready_pods(cluster, namespace, "unlabelled", 1), what="pod")
    with label_refused(cluster, namespace):
        name, manifest = job_manifest(pod)
        cluster.apply(manifest)
        ended = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="its end")
        status = ended["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "NamespaceNotLabelled")
        for said in ("no berth.sh/migrating here", "nothing was evicted"):
            assert said in status["message"], status["message"]
        assert condition(ended, "ReservationScheduled")["status"] == "True"
        reservation = ended["metadata"]["uid"]

        def released() -> bool:
            found = cluster.kubectl("get", "reservation", reservation, "--ignore-not-found")
            return not found.stdout.strip() and not leftovers(cluster, namespace)["placeholders"]

        cluster.wait(released, what="the Reservation and its placeholder to be gone")
    [still] = ready_pods(cluster, namespace, "unlabelled", 1)
    assert still["metadata"]["uid"] == pod["metadata"]["uid"]
    assert migrating(cluster, namespace) is None


async def test_a_new_leader_removes_a_label_no_reservation_needs(
    cluster: Cluster, namespace: str
) -> None:
    controller = next(c for c in cluster.local.components if c.name == "berth-controller")
    await asyncio.to_thread(cluster.local.stop, controller)
    try:
        await cluster.akubectl("label", "namespace", namespace, f"{keys.MIGRATING_LABEL}=true")
    finally:
        await asyncio.to_thread(cluster.local.start_controller, name="berth-controller")
    await cluster.await_(
        lambda: migrating(cluster, namespace) is None, what="the new leader to remove the label"
    )


# ----- the nomination: what kube-scheduler keeps and what it clears -----------------------


async def test_the_scheduler_keeps_a_gated_pods_nomination_and_clears_a_failed_ones(
    cluster: Cluster, namespace: str
) -> None:
    """The two facts the handover's order rests on (controller/reservations.py,
    handover_step), shown on the scheduler itself with plain pods."""
    await shape_free_cpu(cluster, namespace, {"node-0": "500m", "node-1": "2", "node-2": "500m"})
    held = pod("held", cpu="2", gates=("example.com/hold",))
    await cluster.aapply(json.dumps(held), namespace)
    await cluster.akubectl(
        "patch",
        "pod",
        "held",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"nominatedNodeName": "node-1"}}),
    )
    # A gated pod nominated by someone else: counted against a pod of equal priority.
    await cluster.aapply(json.dumps(pod("other", cpu="2")), namespace)
    await cluster.await_(
        lambda: unschedulable(cluster.get("pod", "other", "-n", namespace)),
        what="the other pod to be refused node-1's 2 free CPU",
    )
    await cluster.akubectl("delete", "pod", "other", "-n", namespace, "--grace-period=0")
    # Ungated on a node that is full: it fails to fit, and the scheduler clears the
    # nomination (no preemption victims).
    await cluster.aapply(json.dumps(pod("filler", cpu="2", node="node-1")), namespace)
    await lift(cluster, namespace, "held")

    def cleared() -> bool:
        current = cluster.get("pod", "held", "-n", namespace)
        return unschedulable(current) and not current["status"].get("nominatedNodeName")

    await cluster.await_(cleared, what="the scheduler to clear the failed pod's nomination")


# ----- the handover -----------------------------------------------------------------------


async def test_a_flood_of_ordinary_pods_never_takes_a_place_in_handover(
    cluster: Cluster, namespace: str, scope: Scope
) -> None:
    # node-1: 3 CPU free, which the placeholder takes; a 1-CPU pod fits nowhere else.
    await shape_free_cpu(cluster, namespace, {"node-0": "500m", "node-1": "3", "node-2": "500m"})
    reservation = f"{namespace}-flood"
    try:
        await reserve(cluster, namespace, reservation, node="node-1", cpu="3", scheduler=SCHEDULER)
        # Pods already waiting for room when the placeholder goes...
        await cluster.aapply(flood("early"), namespace)
        await cluster.await_(
            lambda: all_refused(cluster, namespace, "role=early", FLOOD), what="early pods"
        )
        filters = await extender_filters(cluster)
        attempts = await unschedulable_attempts(cluster)
        owner = await hand_over(cluster, namespace, reservation, cpu="3", scheduler=SCHEDULER)
        assert owner["status"].get("nominatedNodeName") == "node-1"

        # ...are tried again once it is gone (3 CPU free on node-1 as the API counts),
        async def tried_again() -> bool:
            return await unschedulable_attempts(cluster) >= attempts + FLOOD

        await cluster.await_(tried_again, what="the early pods to be tried again")
        # ...and so are pods created while the owner waits.
        await cluster.aapply(flood("late"), namespace)
        await cluster.await_(
            lambda: all_refused(cluster, namespace, "role=late", FLOOD), what="late pods"
        )
        if scope == Scope.DEFAULT:  # none of them asked the extender
            assert await extender_filters(cluster) == filters
        await lift(cluster, namespace, "owner")
        node = await cluster.await_(
            lambda: bound_node(cluster, namespace, "owner"), what="the owner to be bound"
        )
        assert node == "node-1"
        placed = [
            p["metadata"]["name"]
            for p in pods(cluster, namespace, "role in (early,late)")
            if p["spec"].get("nodeName")
        ]
        assert placed == [], "an ordinary pod took the place in handover"
    finally:
        await cluster.akubectl("delete", "reservation", reservation, check=False)


@pytest.fixture
def high_priority(cluster: Cluster) -> Iterator[str]:
    with priority_class(cluster, value=1000) as name:
        yield name


async def test_a_pod_of_higher_priority_and_a_place_in_handover(
    cluster: Cluster, namespace: str, scope: Scope, high_priority: str
) -> None:
    """The hole of the default scope: the scheduler counts a nominated pod only against
    pods of equal or lower priority. A pod of higher priority that fits takes the place
    the placeholder left; the replacement stays Pending, the job reports why until its
    TTL (made to come here; two minutes of refusals would end it `ReservationLost`),
    then fails, and nothing stays gated. In the strict scope the extender refuses
    that pod the place, and the migration completes."""
    # The pod to migrate runs on node-0; node-1 has exactly the Reservation's 3 CPU.
    pinned = {"nodeSelector": {"kubernetes.io/hostname": "node-0"}}
    await cluster.aapply(deployment("web", spec_extra=pinned), namespace)
    [old] = await cluster.await_(lambda: ready_pods(cluster, namespace, "web", 1), what="pod")
    await shape_free_cpu(cluster, namespace, {"node-0": "300m", "node-1": "3", "node-2": "300m"})
    reservation = f"{namespace}-hole"
    # The job's pod by name: a job uses only a Reservation whose owners take its pod. Its
    # replacement (a Deployment's, named anew) is not one: the test's `owner` takes over.
    migrated = {"object": {"name": old["metadata"]["name"], "namespace": namespace}}
    try:
        await reserve(
            cluster,
            namespace,
            reservation,
            node="node-1",
            cpu="3",
            scheduler=SCHEDULER,
            owners=(migrated,),
        )
        name, manifest = job_manifest(
            old, ttl=LONG_TTL, reservationOptions={"reservationRef": {"name": reservation}}
        )
        await cluster.aapply(manifest)
        await cluster.await_(
            lambda: condition(job_of(cluster, name), "Eviction").get("status") == "True",
            what="the pod to be evicted",
        )
        await hand_over(cluster, namespace, reservation, cpu="3", scheduler=SCHEDULER)
        await cluster.aapply(
            json.dumps(pod("vip", cpu="3", priority_class=high_priority)), namespace
        )
        if scope == Scope.STRICT:
            await place_kept_from_any_priority(cluster, namespace, name, reservation)
        else:
            await place_taken_and_job_reports_it(cluster, namespace, name)
    finally:
        await cluster.akubectl("delete", "reservation", reservation, check=False)
    assert not any(leftovers(cluster, namespace).values())


async def place_taken_and_job_reports_it(cluster: Cluster, namespace: str, job: str) -> None:
    node = await cluster.await_(
        lambda: bound_node(cluster, namespace, "vip"), what="the pod of higher priority"
    )
    assert node == "node-1"
    await lift(cluster, namespace, "owner")

    def reported() -> dict[str, Any] | None:
        bound = condition(job_of(cluster, job), "PodBoundReservation")
        return bound if "does not fit on node-1" in bound.get("message", "") else None

    waiting = await cluster.await_(reported, what="the job to report the replacement")
    assert waiting["reason"] == "WaitForPodBindReservation"
    assert "Insufficient cpu" in waiting["message"]
    await aexpire(cluster, job)
    ended = await cluster.await_(
        lambda: phase_is(cluster, job, "Succeed", "Failed"), what="the job's TTL"
    )
    assert (ended["status"]["phase"], ended["status"]["reason"]) == ("Failed", "Timeout")
    assert "does not fit on node-1" in ended["status"]["message"]
    assert await asyncio.to_thread(bound_node, cluster, namespace, "owner") is None


async def place_kept_from_any_priority(
    cluster: Cluster, namespace: str, job: str, reservation: str
) -> None:
    reason = f"held for Reservation {reservation} in handover"

    def refused() -> bool:
        events = cluster.get("events", "-n", namespace, "--field-selector=involvedObject.name=vip")[
            "items"
        ]
        return any(e["reason"] == "FailedScheduling" and reason in e["message"] for e in events)

    await cluster.await_(refused, what="the extender to refuse the pod the place")
    await lift(cluster, namespace, "owner")
    node = await cluster.await_(
        lambda: bound_node(cluster, namespace, "owner"), what="the owner to be bound"
    )
    assert node == "node-1"
    ended = await cluster.await_(
        lambda: phase_is(cluster, job, "Succeed", "Failed"), what="the migration"
    )
    assert ended["status"]["phase"] == "Succeed", ended["status"]
    assert await asyncio.to_thread(bound_node, cluster, namespace, "vip") is None
