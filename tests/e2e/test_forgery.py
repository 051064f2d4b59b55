"""Nobody gets more from Berth than their own RBAC gives them.

A user who may create pods in a namespace can copy anything a pod carries: the
placeholder label, a claim token seen on a Reservation, Berth's scheduling gate, the
ownerReference of a workload. None of it makes the session's controller, webhook, or a
real extender process, treat the pod as a placeholder or as a Reservation's owner, and no
claim token ever shows in an event.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from berth.api import API_VERSION, keys
from berth.protocol import annotations_of, claim_of, is_gated, owner_uids, phase
from tests.e2e.capacity import PAUSE, pod
from tests.e2e.kube import Cluster, pods
from tests.e2e.migrate import (
    CLUSTER_EVENTS,
    deployment,
    job_manifest,
    job_of,
    phase_is,
    ready_pods,
    statefulset,
)
from tests.e2e.scrape import scrape, total
from tests.e2e.test_extender import (  # noqa: F401  (fixtures)
    Scheduling,
    extender_log,
    scheduling,
    show_extender_log,
)
from tests.e2e.webhook_world import post, review_of

pytestmark = pytest.mark.e2e

TEST_LABEL = "berth.sh/test-forgery"
SOFT_EVICTION = "scheduling.koordinator.sh/soft-eviction"


@pytest.fixture(autouse=True)
def delete_reservations(cluster: Cluster, namespace: str) -> Iterator[None]:
    yield
    cluster.kubectl(
        "delete", "reservations", "-l", f"{TEST_LABEL}={namespace}", "--wait=false", check=False
    )


@pytest.fixture
async def other_namespace(cluster: Cluster, namespace: str) -> AsyncIterator[str]:
    name = f"{namespace}-x"[:63]
    await cluster.akubectl("create", "namespace", name)
    yield name
    await cluster.akubectl("delete", "namespace", name, "--wait=false", check=False)


async def make_reservation(
    cluster: Cluster,
    namespace: str,
    name: str,
    *,
    node: str,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Reservation whose placeholder the controller creates, pinned to `node`."""
    pin = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    }
    manifest = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name, "labels": {TEST_LABEL: namespace}},
        "spec": {
            "template": {
                "metadata": {"namespace": namespace},
                "spec": {
                    "containers": [
                        {"name": "app", "image": PAUSE, "resources": {"requests": {"cpu": "1"}}}
                    ],
                    "affinity": {"nodeAffinity": pin},
                },
            },
            "owners": owners or [{"object": {"name": "nobody", "namespace": namespace}}],
            "ttl": "10m",
        },
    }
    await cluster.akubectl("create", "-f", "-", input=json.dumps(manifest))
    return await cluster.aget("reservation", name)


async def available(cluster: Cluster, name: str) -> None:
    def ready() -> bool:
        return phase(cluster.get("reservation", name)) == "Available"

    await cluster.await_(ready, what=f"Reservation {name} to be Available")


async def replicaset(
    cluster: Cluster, namespace: str, *, replicas: int, token: str
) -> dict[str, Any]:
    """A ReplicaSet whose pods are made carrying `token` and Berth's gate, as pods of a
    template copied from a claimed replacement would be."""
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {keys.CLAIM: token}},
                "spec": {
                    "containers": [{"name": "app", "image": PAUSE}],
                    "schedulingGates": [{"name": keys.RESERVATION_GATE}],
                },
            },
        },
    }
    await cluster.aapply(json.dumps(manifest), namespace)
    return await cluster.aget("rs", "web", "-n", namespace)


def controller_owner(rs: dict[str, Any]) -> dict[str, Any]:
    metadata = rs["metadata"]
    return {
        "controller": {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata["uid"],
        }
    }


async def claim(cluster: Cluster, name: str, token: str) -> None:
    """Write a claim as the webhook does (the test is the webhook here)."""
    await cluster.akubectl(
        "annotate", "reservation", name, f"{keys.CONSUMABLE}=true", f"{keys.CLAIM}={token}"
    )


def no_token_in_events(cluster: Cluster, token: str) -> None:
    events = cluster.get("events", "--all-namespaces")["items"]
    shown = [e["message"] for e in events if token in (e.get("message") or "")]
    assert shown == [], "a raw claim token in an event"


def refusals(cluster: Cluster, reservation: str) -> list[dict[str, Any]]:
    """The controller's ReservationClaimRefused events about the Reservation."""
    events = cluster.get(
        "events", "-n", CLUSTER_EVENTS, f"--field-selector=involvedObject.name={reservation}"
    )["items"]
    return [e for e in events if e["reason"] == "ReservationClaimRefused"]


def ungated(cluster: Cluster, namespace: str, selector: str = "") -> bool:
    found = pods(cluster, namespace, selector)
    return bool(found) and not any(is_gated(p) for p in found)


# ----- finding 1: the placeholder label --------------------------------------------------


def placeholders(cluster: Cluster, namespace: str, reservation: str) -> list[dict[str, Any]]:
    return pods(cluster, namespace, f"{keys.RESERVATION_LABEL}={reservation}")


def scheduler_refused(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The Reservation, once the controller has copied the scheduler's refusal of its
    placeholder (or has made it anything but Pending)."""
    reservation = cluster.get("reservation", name)
    conditions = reservation.get("status", {}).get("conditions") or []
    scheduled: dict[str, Any] = next((c for c in conditions if c["type"] == "Scheduled"), {})
    refused = scheduled.get("reason") == "Unschedulable" and scheduled.get("message") not in (
        None,
        "waiting for the scheduler",
    )
    return reservation if refused or phase(reservation) != "Pending" else None


async def kept_beside(
    cluster: Cluster, extender_url: str, body: dict[str, Any], *, protected: str
) -> list[str]:
    """The candidate nodes the extender keeps for a preempt `body`, asked again until it
    drops `protected` (whose victim is a real placeholder): from then on it has seen that
    placeholder and the Reservation's record, and so every pod created before them."""

    async def kept() -> dict[str, list[str]] | None:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{extender_url}/preempt", json=body) as response,
        ):
            assert response.status == 200
            nodes = list((await response.json())["NodeNameToMetaVictims"])
        return None if protected in nodes else {"kept": nodes}

    answer: dict[str, list[str]] = await cluster.await_(
        kept, what="the extender to protect the real placeholder"
    )
    return answer["kept"]


def preemptor(namespace: str) -> dict[str, Any]:
    found = pod("preemptor", cpu="1")
    found["metadata"].update(namespace=namespace, uid="preemptor-uid")
    return found


async def test_a_forged_placeholder_label_gets_nothing(
    cluster: Cluster,
    namespace: str,
    scheduling: Scheduling,  # noqa: F811  (the fixture)
) -> None:
    """The Reservation's own placeholder could not schedule (its node does not exist); a
    user pod on node-0 labelled with the Reservation's name is not taken for it, and the
    extender neither protects it from preemption nor counts it as promised capacity."""
    name = f"{namespace}-forged"
    # The forger is there first: the controller finds a bound pod with the label, ready.
    forged = pod("forger", cpu="4", node="node-0")
    forged["metadata"]["labels"] = {keys.RESERVATION_LABEL: name}
    await cluster.aapply(json.dumps(forged), namespace)
    forger = await cluster.aget("pod", "forger", "-n", namespace)
    await make_reservation(cluster, namespace, name, node="node-nowhere")
    # Its copy of the scheduler's word is about a pod made after the forger: the
    # controller's pod cache had seen the forger by then.
    reservation = await cluster.await_(
        lambda: scheduler_refused(cluster, name), what="the controller to judge its placeholder"
    )
    assert phase(reservation) == "Pending", reservation.get("status")
    assert not reservation.get("status", {}).get("nodeName")

    [real] = [
        p for p in await asyncio.to_thread(placeholders, cluster, namespace, name)
        if p["metadata"]["name"] != "forger"
    ]  # fmt: skip
    body: dict[str, Any] = {
        "Pod": preemptor(namespace),
        "NodeNameToMetaVictims": {
            "node-0": {"Pods": [{"UID": forger["metadata"]["uid"]}], "NumPDBViolations": 0},
            "node-1": {"Pods": [{"UID": real["metadata"]["uid"]}], "NumPDBViolations": 0},
        },
    }
    kept = await kept_beside(cluster, scheduling.extender_url, body, protected="node-1")
    assert kept == ["node-0"], "the forged pod was protected as a placeholder"
    body = {"Pod": preemptor(namespace), "Nodes": None, "NodeNames": ["node-0"]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{scheduling.extender_url}/prioritize", json=body) as response,
    ):
        [score] = await response.json()
    assert score == {"Host": "node-0", "Score": 10}, "the forged pod counted as promised"


# ----- finding 1b: a hand-made owner reference ------------------------------------------


def owned_by(reservation: dict[str, Any]) -> list[dict[str, Any]]:
    """The controller owner reference Berth gives its placeholders, name and UID included."""
    metadata = reservation["metadata"]
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "Reservation",
            "name": metadata["name"],
            "uid": metadata["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def gone(cluster: Cluster, namespace: str, uid: str) -> bool:
    return not any(
        p["metadata"]["uid"] == uid and not p["metadata"].get("deletionTimestamp")
        for p in pods(cluster, namespace)
    )


async def test_a_forged_owner_reference_gets_nothing(
    cluster: Cluster,
    namespace: str,
    scheduling: Scheduling,  # noqa: F811  (the fixture)
) -> None:
    """A Pending Reservation whose real placeholder cannot schedule; a user pod on node-0
    with the very owner reference the controller gives placeholders (the Reservation's
    name and UID, blockOwnerDeletion) is not taken for it: the Reservation stays Pending,
    the pod is deleted as a stray of the Reservation, and the extender offers it as a
    preemption victim like any other pod."""
    name = f"{namespace}-owned"
    reservation = await make_reservation(cluster, namespace, name, node="node-nowhere")
    [real] = await cluster.await_(
        lambda: placeholders(cluster, namespace, name), what="the real placeholder"
    )
    forged = pod("forger", cpu="4", node="node-0")
    forged["metadata"]["labels"] = {keys.RESERVATION_LABEL: name}
    forged["metadata"]["ownerReferences"] = owned_by(reservation)
    created = await cluster.akubectl(
        "create", "-n", namespace, "-f", "-", "-o", "json", input=json.dumps(forged)
    )
    forger = json.loads(created.stdout)  # as created: the controller may delete it at once

    def judged() -> bool:
        taken = phase(cluster.get("reservation", name)) != "Pending"
        return taken or gone(cluster, namespace, forger["metadata"]["uid"])

    await cluster.await_(judged, what="the controller to judge the forged pod")
    reservation = await cluster.aget("reservation", name)
    assert phase(reservation) == "Pending", (
        f"the forged pod was taken for the placeholder: {reservation.get('status')}"
    )
    assert not reservation.get("status", {}).get("nodeName")
    messages = [
        e.get("message") or ""
        for e in (await cluster.aget("events", "-n", namespace))["items"]
        if e["involvedObject"].get("uid") == forger["metadata"]["uid"]
    ]
    assert any("not its placeholder" in m for m in messages), messages

    body: dict[str, Any] = {
        "Pod": preemptor(namespace),
        "NodeNameToVictims": {
            "node-0": {"Pods": [forger], "NumPDBViolations": 0},
            "node-1": {"Pods": [real], "NumPDBViolations": 0},
        },
    }
    kept = await kept_beside(cluster, scheduling.extender_url, body, protected="node-1")
    assert kept == ["node-0"], "the forged pod was protected as a placeholder"


# ----- finding 2: claims --------------------------------------------------------------


async def test_a_claim_token_copied_to_another_namespace_gets_nothing(
    cluster: Cluster, namespace: str, other_namespace: str
) -> None:
    token = secrets.token_hex(16)
    rs = await replicaset(cluster, namespace, replicas=0, token=token)
    name = f"{namespace}-copied"
    await make_reservation(cluster, namespace, name, node="node-1", owners=[controller_owner(rs)])
    await available(cluster, name)
    await claim(cluster, name, token)
    thief = pod("thief", cpu="100m", gates=(keys.RESERVATION_GATE,))
    thief["metadata"]["annotations"] = {keys.CLAIM: token}
    await cluster.aapply(json.dumps(thief), other_namespace)
    # Ungated only once its claim was released, 30 s after it was written: the
    # controller had the thief in view all that time.
    await cluster.await_(
        lambda: ungated(cluster, other_namespace), what="the thief's gate to be released"
    )
    assert owner_uids(await cluster.aget("reservation", name)) == set()
    await asyncio.to_thread(no_token_in_events, cluster, token)


async def test_two_pods_with_one_token_get_nothing(cluster: Cluster, namespace: str) -> None:
    token = secrets.token_hex(16)
    rs = await replicaset(cluster, namespace, replicas=2, token=token)
    await cluster.await_(
        lambda: len(pods(cluster, namespace, "app=web")) == 2, what="the ReplicaSet's pods"
    )
    name = f"{namespace}-shared"
    await make_reservation(cluster, namespace, name, node="node-2", owners=[controller_owner(rs)])
    await available(cluster, name)
    await claim(cluster, name, token)
    await cluster.await_(
        lambda: refusals(cluster, name), what="the controller to refuse both claimers"
    )
    assert owner_uids(await cluster.aget("reservation", name)) == set()

    await cluster.await_(
        lambda: ungated(cluster, namespace, "app=web"), what="both pods' gates to be released"
    )
    assert owner_uids(await cluster.aget("reservation", name)) == set()
    await asyncio.to_thread(no_token_in_events, cluster, token)


async def test_a_claim_no_pod_carries_is_released(cluster: Cluster, namespace: str) -> None:
    name = f"{namespace}-orphan"
    await make_reservation(cluster, namespace, name, node="node-1")
    await available(cluster, name)
    await claim(cluster, name, secrets.token_hex(16))

    def released() -> bool:
        return claim_of(cluster.get("reservation", name)) is None

    await cluster.await_(released, what="the orphan claim to be released", timeout=50)
    reservation = await cluster.aget("reservation", name)
    assert phase(reservation) == "Available"
    assert owner_uids(reservation) == set()


# ----- finding 2b: a hand-made ownerReference to the workload -----------------------------


def controlled_by(owner: dict[str, Any], name: str) -> dict[str, Any]:
    """A pod naming `owner` (apiVersion, kind, name, uid) as its controller."""
    forged = pod(name, cpu="200m")
    forged["metadata"]["ownerReferences"] = [{**owner, "controller": True}]
    return forged


def webhook_reviews(cluster: Cluster) -> float:
    return total(asyncio.run(scrape(cluster, "berth-webhook")), "berth_webhook_requests_total")


def migrating(cluster: Cluster, namespace: str) -> bool:
    labels = cluster.get("namespace", namespace)["metadata"].get("labels") or {}
    return labels.get(keys.MIGRATING_LABEL) == "true"


@dataclass(frozen=True)
class Address:
    url: str


def as_the_api_server(cluster: Cluster) -> ssl.SSLContext:
    """TLS to the session's webhook with the client certificate the API server presents
    (its admission configuration): the only one the webhook accepts."""
    tls = ssl.create_default_context(cafile=cluster.local.serving_ca)
    tls.load_cert_chain(*cluster.local.webhook_client)
    return tls


def send_to_the_webhook(cluster: Cluster, review: dict[str, Any]) -> list[dict[str, Any]]:
    """Post `review` straight to the session's webhook, as the API server would: its
    JSONPatch."""
    port = next(c.port for c in cluster.local.running() if c.name == "berth-webhook")
    tls = as_the_api_server(cluster)

    async def send() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            return await post(session, Address(f"https://127.0.0.1:{port}"), review, tls)

    return asyncio.run(send())


def webhook_log(cluster: Cluster) -> str:
    return "".join(
        Path(c.log).read_text() for c in cluster.local.components if c.name == "berth-webhook"
    )


def test_a_hand_made_owner_reference_to_a_statefulset_gets_no_claim(
    cluster: Cluster, namespace: str, restart_controller: Callable[[str], None]
) -> None:
    """A StatefulSet pod's Reservation is open (the soft eviction waits for someone to
    remove the pod). A user who may edit the namespace creates pods naming the
    StatefulSet, its real UID included, as their controller: they get no claim. The API
    server does not even send them to the webhook (its match condition: they were created
    by that user, not by a workload controller); sent there straight, as the API server
    would without that condition, the webhook refuses them for the same reason. The
    StatefulSet's own replacement then takes the Reservation and the migration ends on
    the reserved node."""
    restart_controller("evictionPolicy: SoftEviction\n")
    cluster.apply(statefulset("db"), namespace)
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "db", 1), what="db-0")[0]
    sts = cluster.get("statefulset", "db", "-n", namespace)
    name, manifest = job_manifest(old)
    cluster.apply(manifest)

    def marked() -> bool:
        current = cluster.get("pod", "db-0", "-n", namespace)["metadata"]
        return SOFT_EVICTION in (current.get("annotations") or {})

    cluster.wait(marked, what="the soft eviction: the Reservation is open")
    reservation_name = job_of(cluster, name)["spec"]["reservationOptions"]["reservationRef"]["name"]
    open_reservation = cluster.get("reservation", reservation_name)
    assert annotations_of(open_reservation).get(keys.CONSUMABLE) == "true"
    assert claim_of(open_reservation) is None

    cluster.kubectl(
        "create", "rolebinding", "mallory-edit", "--clusterrole=edit", "--user=mallory",
        "-n", namespace,
    )  # fmt: skip
    owner = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "db",
        "uid": sts["metadata"]["uid"],
    }
    forged = {
        "forged-db": controlled_by(owner, "forged-db"),
        # The same, as kube-controller-manager's own name for it.
        "forged-db-1": controlled_by(owner, "db-1"),
    }
    cluster.wait(
        lambda: migrating(cluster, namespace), what="the namespace to be labelled migrating"
    )
    reviewed = webhook_reviews(cluster)
    made = []
    for forged_name, body in forged.items():
        created = json.loads(
            cluster.kubectl(
                "create", "--as=mallory", "-n", namespace, "-o", "json", "-f", "-",
                input=json.dumps(body),
            ).stdout
        )  # fmt: skip
        assert not is_gated(created), f"{forged_name} was bound to the Reservation"
        assert keys.CLAIM not in annotations_of(created), f"{forged_name} got a claim"
        made.append(created)
    assert webhook_reviews(cluster) == reviewed, "a forged pod was sent to the webhook"
    for created in made:
        assert send_to_the_webhook(cluster, review_of(created, user="mallory")) == []
    assert claim_of(cluster.get("reservation", reservation_name)) is None
    log = cluster.wait(
        lambda: (
            (text := webhook_log(cluster)).count(
                "created by mallory, not by the apps/v1 StatefulSet controller"
            )
            >= 2
            and text
        ),
        what="the webhook to log why it refused the forged pods",
    )
    assert f"pod {namespace}/db-1: created by mallory" in log

    # Whoever honours soft evictions removes the pod; its replacement takes the place.
    cluster.kubectl("delete", "pod", "db-0", "-n", namespace, "--wait=false")
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    assert job["status"]["phase"] == "Succeed", job["status"]
    new = cluster.get("pod", "db-0", "-n", namespace)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert job["status"]["podRef"]["uid"] == new["metadata"]["uid"]
    assert new["spec"]["nodeName"] == job["status"]["nodeName"] != old["spec"]["nodeName"]


def test_a_pod_of_a_kind_berth_cannot_bind_is_refused_before_eviction(
    cluster: Cluster, namespace: str
) -> None:
    """A pod whose controller is of a kind Berth's webhook binds no replacement of (a
    custom controller's): a ReservationFirst job for it fails before anything is created
    or evicted, saying why, instead of evicting it for a Reservation only a pod naming
    that controller's UID (anyone's) could take."""
    # Any object will do as a controller Berth does not know.
    configmap = json.loads(
        cluster.kubectl("create", "configmap", "custom", "-n", namespace, "-o", "json").stdout
    )
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": configmap["metadata"]["name"],
        "uid": configmap["metadata"]["uid"],
    }
    cluster.apply(json.dumps(controlled_by(owner, "custom-0")), namespace)
    target = cluster.wait(
        lambda: (
            (p := cluster.get("pod", "custom-0", "-n", namespace)).get("spec", {}).get("nodeName")
            and p
        ),
        what="the pod to be scheduled",
    )
    name, manifest = job_manifest(target)
    cluster.apply(manifest)
    job = cluster.wait(
        lambda: phase_is(cluster, name, "Running", "Succeed", "Failed"),
        what="arbitration to decide the job",
    )
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Failed", "ForbiddenMigratePod")
    assert "pod's controller is a v1 ConfigMap" in job["status"]["message"]
    assert not job["spec"].get("reservationOptions", {}).get("reservationRef")
    still = cluster.get("pod", "custom-0", "-n", namespace)
    assert still["metadata"]["uid"] == target["metadata"]["uid"]
    assert not still["metadata"].get("deletionTimestamp")


# ----- a non-preempting PriorityClass made in advance -------------------------------------


def priority_class(name: str, value: int, *, policy: str) -> str:
    return json.dumps(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": {TEST_LABEL: "priority"}},
            "value": value,
            "preemptionPolicy": policy,
        }
    )


@pytest.fixture
def priority_value(cluster: Cluster) -> Iterator[int]:
    """A priority value no other test uses; the classes made for it are deleted after."""
    value = 100_000 + secrets.randbelow(800_000)
    yield value
    cluster.kubectl(
        "delete", "priorityclass", f"berth-non-preempting-{value}", f"test-{value}",
        "--ignore-not-found",
    )  # fmt: skip


def test_a_non_preempting_class_made_with_preemption_is_never_used(
    cluster: Cluster, namespace: str, priority_value: int
) -> None:
    """Someone who may create PriorityClasses made `berth-non-preempting-<value>` first,
    with preemption on: no placeholder runs under it (it would preempt pods to make room);
    the job waits, saying why, and a Warning event on the Reservation names the class.
    Once that class is deleted, the controller makes its own and the migration ends."""
    value = priority_value
    berths = f"berth-non-preempting-{value}"
    cluster.apply(priority_class(f"test-{value}", value, policy="PreemptLowerPriority"))
    cluster.apply(priority_class(berths, value, policy="PreemptLowerPriority"))
    cluster.apply(deployment("web", spec_extra={"priorityClassName": f"test-{value}"}), namespace)
    old = cluster.wait(lambda: ready_pods(cluster, namespace, "web", 1), what="the pod")[0]
    name, manifest = job_manifest(old)
    cluster.apply(manifest)
    said = f"PriorityClass {berths} has value {value} and preemptionPolicy PreemptLowerPriority"

    def waiting() -> dict[str, Any] | None:
        job = job_of(cluster, name)
        return job if said in (job.get("status", {}).get("message") or "") else None

    job = cluster.wait(waiting, what="the job to say why it waits")
    assert job["status"]["phase"] == "Running", job["status"]
    reservation_name = job["spec"]["reservationOptions"]["reservationRef"]["name"]
    assert placeholders(cluster, namespace, reservation_name) == []
    warnings = [
        e
        for e in cluster.get(
            "events",
            "-n",
            CLUSTER_EVENTS,
            f"--field-selector=involvedObject.name={reservation_name}",
        )["items"]
        if e["reason"] == "PriorityClassMismatch"
    ]
    assert warnings, "no event names the PriorityClass"
    assert warnings[0]["type"] == "Warning"
    assert said in warnings[0]["message"]
    current = cluster.get("pod", old["metadata"]["name"], "-n", namespace)
    assert current["metadata"]["uid"] == old["metadata"]["uid"]
    assert not current["metadata"].get("deletionTimestamp")

    cluster.kubectl("delete", "priorityclass", berths)
    job = cluster.wait(lambda: phase_is(cluster, name, "Succeed", "Failed"), what="the job to end")
    assert job["status"]["phase"] == "Succeed", job["status"]
    remade = cluster.get("priorityclass", berths)
    assert (remade["value"], remade["preemptionPolicy"]) == (value, "Never")


def forged_eviction_review(target: dict[str, Any], uid: str) -> dict[str, Any]:
    """An eviction review of `target` as anyone could write it, naming a user of its own."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "name": target["metadata"]["name"],
            "namespace": target["metadata"]["namespace"],
            "subResource": "eviction",
            "operation": "CREATE",
            "userInfo": {"username": "whoever-i-like", "groups": ["system:authenticated"]},
            "object": {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": target["metadata"]["name"]},
            },
        },
    }


def test_only_the_api_server_may_post_reviews_to_the_webhook(
    cluster: Cluster, namespace: str
) -> None:
    """A review names its user and its pod, and the webhook takes it at its word: posted
    straight to its port, an eviction review for any pod by any user would make Berth
    create that pod's migration job with its own rights. The webhook requires the client
    certificate the API server presents to webhooks (its admission configuration, a CA
    of its own): without one the answer is 401 and nothing is done; a certificate of
    another CA (the cluster's, which signs users') fails the handshake. The probes stay
    open; the API server's own reviews are served (every migration in the suite)."""
    cluster.apply(deployment("target"), namespace)
    target = cluster.wait(lambda: ready_pods(cluster, namespace, "target", 1), what="the pod")[0]
    port = next(c.port for c in cluster.local.running() if c.name == "berth-webhook")
    base = f"https://127.0.0.1:{port}"
    review = forged_eviction_review(target, secrets.token_hex(8))
    anonymous = ssl.create_default_context(cafile=cluster.local.serving_ca)
    a_user = ssl.create_default_context(cafile=cluster.local.serving_ca)
    a_user.load_cert_chain(cluster.local.pki / "admin.crt", cluster.local.pki / "admin.key")

    async def attempts() -> tuple[list[int], str, int]:
        async with aiohttp.ClientSession() as session:
            statuses = []
            for path in ("/validate-eviction", "/validate-eviction/unlabelled", "/mutate-pod"):
                async with session.post(f"{base}{path}", json=review, ssl=anonymous) as answer:
                    statuses.append(answer.status)
            try:
                async with session.post(
                    f"{base}/validate-eviction/unlabelled", json=review, ssl=a_user
                ) as answer:
                    refused = f"answered {answer.status}"
            except aiohttp.ClientError as error:
                refused = type(error).__name__
            async with session.get(f"{base}/healthz", ssl=anonymous) as answer:
                return statuses, refused, answer.status

    statuses, refused, probe = asyncio.run(attempts())
    assert statuses == [401, 401, 401]
    # Refused in the TLS handshake (with TLS 1.3 the client sees the connection dropped).
    assert not refused.startswith("answered"), refused
    assert probe == 200
    jobs = cluster.get("podmigrationjobs")["items"]
    assert not [j for j in jobs if j["spec"]["podRef"].get("namespace") == namespace]


def test_an_eviction_review_on_the_labelled_path_is_checked_against_the_namespace(
    cluster: Cluster, namespace: str
) -> None:
    """The API server sends evictions of namespaces labelled
    `berth.sh/intercept-evictions=true` to one path; whoever else reaches the webhook
    (with the API server's client certificate, or where none is required) could post a
    review there for a pod of any namespace. The webhook reads the label itself: an
    unlabelled namespace's pod gets no job and its eviction goes ahead as asked."""
    cluster.apply(deployment("target"), namespace)
    target = cluster.wait(lambda: ready_pods(cluster, namespace, "target", 1), what="the pod")[0]
    port = next(c.port for c in cluster.local.running() if c.name == "berth-webhook")
    uid = secrets.token_hex(8)
    review = forged_eviction_review(target, uid)
    as_the_api_server = ssl.create_default_context(cafile=cluster.local.serving_ca)
    as_the_api_server.load_cert_chain(*cluster.local.webhook_client)

    async def post() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            url = f"https://127.0.0.1:{port}/validate-eviction"
            async with session.post(url, json=review, ssl=as_the_api_server) as answer:
                assert answer.status == 200
                body: dict[str, Any] = await answer.json()
                return body

    answer = asyncio.run(post())["response"]
    assert (answer["uid"], answer["allowed"]) == (uid, True)
    jobs = cluster.get("podmigrationjobs")["items"]
    assert not [j for j in jobs if j["spec"]["podRef"].get("namespace") == namespace]
