"""The controller's caches: watch events become keys, and the ledger nodeFit reads stays
right. Objects are fed to the informers as their watches would deliver them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from berth.api import keys
from berth.kube.client import Kube
from berth.kube.informer import Informer
from berth.resources import parse_quantity
from berth.settings import MigrationControllerArgs
from controller import build, reservations
from controller.actions import UpdateStatus
from controller.caches import FORGET_AFTER, NODE_GRACE, ROOM_MADE, Absences, Caches, lean_pod
from controller.queue import job_key, reservation_key
from tests.unit.builders import job, node, placeholder, pod, reservation, ts

NODE_FIT = MigrationControllerArgs.model_validate({"nodeFit": True})


def caches(args: MigrationControllerArgs = NODE_FIT) -> tuple[Caches, list[str]]:
    keys_added: list[str] = []
    return Caches(cast(Kube, None), args, enqueue=keys_added.append), keys_added


async def watch(informer: Informer, kind: str, obj: dict[str, Any]) -> None:
    await informer._apply(kind, obj)


def in_handover() -> tuple[dict[str, Any], dict[str, Any]]:
    """A Reservation on node-1 whose owner is recorded and its placeholder gone, and the
    gated owner that claimed it: the Reservation itself holds its 200m."""
    rsv = reservation(
        phase="Available", node="node-1", owners=["web-2"], annotations={keys.CLAIM: "tok"}
    )
    claimer = pod(
        "web-2", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "tok"}
    )
    return rsv, claimer


async def test_a_deleted_claimer_leaves_a_live_reservation_in_the_ledger() -> None:
    cache, _ = caches()
    rsv, claimer = in_handover()
    await watch(cache.nodes, "ADDED", node("node-1"))
    await watch(cache.reservations, "ADDED", rsv)
    await watch(cache.pods, "ADDED", claimer)
    held = parse_quantity("4") - parse_quantity("200m")
    assert cache.frozen().free["node-1"]["cpu"] == held
    # The claimer goes away; the Reservation holds its place until the controller ends it.
    await watch(cache.pods, "DELETED", claimer)
    assert cache.frozen().free["node-1"]["cpu"] == held


async def test_a_reservations_events_bring_in_every_job_naming_it() -> None:
    """A job that names a Reservation made by hand follows it as closely as a job follows
    the one made for it (which names the job in `berth.sh/job`)."""
    cache, added = caches()
    await watch(cache.jobs, "ADDED", job("job-2", phase="Running", reservation_ref="by-hand"))
    added.clear()
    await watch(cache.reservations, "MODIFIED", reservation("by-hand", phase="Available"))
    assert {reservation_key("by-hand"), job_key("job-2")} <= set(added)


async def test_a_claimers_events_bring_in_its_reservation_and_the_reservations_job() -> None:
    cache, added = caches()
    rsv, claimer = in_handover()
    await watch(cache.reservations, "ADDED", rsv)
    added.clear()
    await watch(cache.pods, "DELETED", claimer)
    assert set(added) == {"rsv/uid-job-1", "job/job-1"}


async def test_a_pods_events_bring_in_the_jobs_that_migrate_it() -> None:
    cache, added = caches()
    await watch(cache.jobs, "ADDED", job("job-1", pod_name="web-1"))
    added.clear()
    await watch(cache.pods, "MODIFIED", pod("web-1"))
    assert added == ["job/job-1"]


async def test_a_reservation_view_names_the_non_preempting_class_of_its_pods_priority() -> None:
    cache, _ = caches()
    rsv = reservation()
    view = cache.reservation_view(rsv)
    assert view.priority_class is not None
    assert view.priority_class["metadata"]["name"] == "berth-non-preempting-0"
    assert view.priority_class_found is None
    # No priority in the template: the global default class's, as admission gives it.
    default = {"metadata": {"name": "normal", "uid": "u1"}, "value": 10, "globalDefault": True}
    await watch(cache.priority_classes, "ADDED", default)
    assert cache.reservation_view(rsv).priority_class == build.non_preempting_class(10)
    rsv["spec"]["template"]["spec"]["priority"] = 1000
    await watch(cache.priority_classes, "ADDED", build.non_preempting_class(1000))
    view = cache.reservation_view(rsv)
    assert view.priority_class == build.non_preempting_class(1000)
    assert view.priority_class_found == build.non_preempting_class(1000)


async def test_a_reservation_allowed_to_preempt_keeps_the_pods_own_class() -> None:
    cache, _ = caches()
    rsv = reservation(annotations={keys.PREEMPTION: keys.PREEMPTION_ALLOWED})
    rsv["spec"]["template"]["spec"].update(priorityClassName="high", priority=1000)
    high = {"metadata": {"name": "high", "uid": "u2"}, "value": 1000}
    await watch(cache.priority_classes, "ADDED", high)
    view = cache.reservation_view(rsv)
    assert view.priority_class is None
    assert view.priority_class_found is None  # nothing to create first
    # The class made again with another value: the placeholder no longer preempts.
    await watch(cache.priority_classes, "MODIFIED", {**high, "value": 5000})
    assert cache.reservation_view(rsv).priority_class == build.non_preempting_class(1000)


def marked(name: str, node_name: str) -> dict[str, Any]:
    obj = pod(name, node=node_name, rs=None)
    obj["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    return obj


async def test_a_pod_marked_for_preemption_is_remembered_after_its_deletion() -> None:
    """Victims are gone before the placeholder binds: the job reads them from memory."""
    cache, _ = caches()
    victim, elsewhere = marked("victim", "node-1"), marked("other", "node-2")
    await watch(cache.pods, "ADDED", pod("plain", node="node-1"))
    for obj in (victim, elsewhere):
        await watch(cache.pods, "MODIFIED", obj)
        await watch(cache.pods, "DELETED", obj)
    assert cache.pods.get("default/victim") is None
    assert cache.preempted_on("node-1") == (lean_pod(victim),)
    assert cache.preempted_on(None) == ()


async def test_room_is_being_made_on_a_node_while_its_victims_leave() -> None:
    """After the handover: a replacement the scheduler preempts pods for is not let go
    while they leave, within their grace period, nor for `ROOM_MADE` after (time for the
    scheduler to bind it); a victim marked and never deleted, kept past its grace, or
    gone long ago does not count."""
    cache, _ = caches()
    now = datetime.now(UTC)
    victim = marked("victim", "node-1")
    await watch(cache.pods, "MODIFIED", victim)
    assert not cache.making_room_on("node-1")  # marked, not deleted (yet, or ever)
    victim["metadata"]["deletionTimestamp"] = ts(now + timedelta(seconds=30))
    await watch(cache.pods, "MODIFIED", victim)
    assert cache.making_room_on("node-1")
    assert not cache.making_room_on("node-2")
    assert not cache.making_room_on(None)
    victim["metadata"]["deletionTimestamp"] = ts(now - ROOM_MADE - timedelta(seconds=1))
    await watch(cache.pods, "MODIFIED", victim)
    assert not cache.making_room_on("node-1")  # kept past its grace: a finalizer
    await watch(cache.pods, "DELETED", victim)
    assert cache.making_room_on("node-1")  # gone moments ago
    uid = victim["metadata"]["uid"]
    seen, _ = cache.preempted[uid]
    cache.preempted[uid] = (seen, now - ROOM_MADE - timedelta(seconds=1))
    assert not cache.making_room_on("node-1")


async def test_a_job_view_reads_the_victims_on_its_placeholders_node() -> None:
    cache, _ = caches()
    rsv = reservation()
    await watch(cache.reservations, "ADDED", rsv)
    ph = placeholder(node=None)
    ph["status"]["nominatedNodeName"] = "node-1"
    await watch(cache.pods, "ADDED", ph)
    victim = marked("victim", "node-1")
    await watch(cache.pods, "MODIFIED", victim)
    await watch(cache.pods, "MODIFIED", marked("other", "node-2"))
    view = cache.job_view(job())
    assert view.placeholder == lean_pod(ph)
    assert view.preempted == (lean_pod(victim),)


def controlled(api_version: str, kind: str, uid: str) -> dict[str, Any]:
    found = pod("web-2", node=None)
    found["metadata"]["ownerReferences"] = [
        {"apiVersion": api_version, "kind": kind, "name": "web", "uid": uid, "controller": True}
    ]
    return found


async def test_a_claimers_controller_counts_only_as_the_caches_or_its_kind_vouch() -> None:
    """A StatefulSet (watched) counts only as the cache holds it; a Job (not watched) as
    the pod names it, since only the Job controller's pods get a claim from the webhook; a
    kind Berth does not bind never counts, whatever UID the pod names."""
    cache, _ = caches()
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-sts"},
    }
    await watch(cache.statefulsets, "ADDED", statefulset)
    resolved = cache.resolved_controller
    assert resolved(controlled("apps/v1", "StatefulSet", "uid-sts")) == ("uid-sts", "uid-sts")
    assert resolved(controlled("apps/v1", "StatefulSet", "uid-other")) == (None, None)
    assert resolved(controlled("batch/v1", "Job", "uid-job")) == ("uid-job", "uid-job")
    assert resolved(controlled("example.com/v1", "Game", "uid-game")) == (None, None)
    assert resolved(controlled("v1", "ConfigMap", "uid-cm")) == (None, None)


def tie(pod_: dict[str, Any], node_name: str) -> dict[str, Any]:
    """`pod_` with the required affinity Berth's webhook gives a replacement."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
    pod_["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    return pod_


async def test_a_reservation_view_finds_its_owner_stranded_once_its_node_is_deleted() -> None:
    cache, _ = caches()
    rsv, owner = in_handover()
    tie(owner, "node-1")
    await watch(cache.nodes, "ADDED", node("node-1"))
    await watch(cache.reservations, "ADDED", rsv)
    await watch(cache.pods, "ADDED", owner)
    assert cache.reservation_view(rsv).owner is not None
    assert cache.reservation_view(rsv).stranded == ()
    await watch(cache.nodes, "DELETED", node("node-1"))
    assert [p["metadata"]["name"] for p in cache.reservation_view(rsv).stranded] == ["web-2"]
    # Already being deleted (by anyone): nothing more to do for it.
    terminating = {
        **owner,
        "metadata": {**owner["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"},
    }
    await watch(cache.pods, "MODIFIED", terminating)
    assert cache.reservation_view(rsv).stranded == ()


async def test_claimers_tied_to_a_deleted_node_are_found_whatever_their_reservation() -> None:
    """`stranded_claimers` lists unbound pods with a claim tied to a node the cache no
    longer holds: not pods without a claim, not bound pods, not those on a live node."""
    cache, _ = caches()
    await watch(cache.nodes, "ADDED", node("node-1"))
    await watch(cache.nodes, "ADDED", node("node-2"))
    claim = {keys.CLAIM: "token"}
    for made in (
        tie(pod("web-2", node=None, annotations=claim), "node-1"),
        tie(pod("web-3", node=None, annotations=claim), "node-2"),
        tie(pod("pinned", node=None), "node-1"),
        pod("bound", node="node-1", annotations=claim),
    ):
        await watch(cache.pods, "ADDED", made)
    assert cache.stranded_claimers() == []
    await watch(cache.nodes, "DELETED", node("node-1"))
    assert [p["metadata"]["name"] for p in cache.stranded_claimers()] == ["web-2"]


async def test_a_job_view_reads_the_workload_its_reservation_was_made_for() -> None:
    """The Reservation's one controller owner (ReplicaSet `web-rs`) and its Deployment, by
    UID: what tells whether a replacement may still come (`bind.scaled_away`)."""
    cache, _ = caches()
    rsv = reservation()
    await watch(cache.reservations, "ADDED", rsv)
    assert (cache.job_view(job()).workload, cache.job_view(job()).deployment) == (None, None)
    rs = {
        "kind": "ReplicaSet",
        "metadata": {
            "name": "web-rs",
            "namespace": "default",
            "uid": "uid-web-rs",
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                 "uid": "uid-web", "controller": True}
            ],
        },
        "spec": {"replicas": 0},
    }  # fmt: skip
    await watch(cache.replicasets, "ADDED", rs)
    view = cache.job_view(job())
    assert (view.workload, view.deployment) == (rs, None)
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-web"},
        "spec": {"replicas": 0},
    }
    await watch(cache.deployments, "ADDED", deployment)
    view = cache.job_view(job())
    assert (view.workload, view.deployment) == (rs, deployment)
    # A Reservation of several owners (made by hand) names no one workload.
    shared = reservation()
    shared["spec"]["owners"] = [*shared["spec"]["owners"], {"object": {"name": "other"}}]
    await watch(cache.reservations, "MODIFIED", shared)
    assert cache.job_view(job()).workload is None


def pdb(name: str, allowed: int, labels: dict[str, str], namespace: str = "default") -> Any:
    return {
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": labels}},
        "status": {"disruptionsAllowed": allowed},
    }


async def test_a_closed_reservations_job_view_names_a_budget_that_allows_no_disruption() -> None:
    """Read only while the job's Reservation is closed after a refused eviction, and only
    for a ready pod (the Eviction API may let an unready one go whatever the budget)."""
    cache, _ = caches()
    await watch(cache.pods, "ADDED", pod())
    await watch(cache.pdbs, "ADDED", pdb("other-app", 0, {"app": "db"}))
    await watch(cache.pdbs, "ADDED", pdb("elsewhere", 0, {"app": "web"}, namespace="team-b"))
    await watch(cache.pdbs, "ADDED", pdb("roomy", 1, {"app": "web"}))
    closed = reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "closed"})
    await watch(cache.reservations, "ADDED", closed)
    assert cache.job_view(job()).exhausted_pdb is None
    await watch(cache.pdbs, "ADDED", pdb("tight", 0, {"app": "web"}))
    assert cache.job_view(job()).exhausted_pdb == "default/tight"
    await watch(cache.pods, "MODIFIED", pod(ready=False))
    assert cache.job_view(job()).exhausted_pdb is None
    await watch(cache.pods, "MODIFIED", pod())
    opened = reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"})
    await watch(cache.reservations, "MODIFIED", opened)
    assert cache.job_view(job()).exhausted_pdb is None


def test_names_of_missing_nodes_are_forgotten_after_an_hour() -> None:
    """Node names a pod's affinity carries are a pod writer's choice: each one looked up
    and never seen is kept an hour, not for ever, and then waits out the grace again."""
    now = [0.0]
    absences = Absences(clock=lambda: now[0])
    for index in range(1000):
        assert absences.wait(f"never-{index}") == NODE_GRACE
    now[0] += NODE_GRACE
    assert absences.wait("never-0") == 0.0  # gone, and still remembered as gone
    absences.deleted("node-9")
    assert absences.wait("node-9") == 0.0
    assert len(absences) == 1001
    now[0] += FORGET_AFTER
    assert absences.wait("never-1") == NODE_GRACE  # forgotten: the grace again
    assert len(absences) == 1  # every other entry is an hour old
    assert absences.wait("node-9") == NODE_GRACE


async def test_a_node_not_seen_yet_counts_as_gone_only_after_the_grace() -> None:
    """A placeholder bound to a node the nodes' watch has not shown yet keeps its place;
    its Reservation and the job come back when the grace ends, and then the node is gone
    unless the watch showed it meanwhile. A deletion the watch shows counts at once."""
    now = [10.0]
    again: list[tuple[str, float]] = []
    cache = Caches(
        cast(Kube, None),
        NODE_FIT,
        enqueue=lambda _key: None,
        enqueue_after=lambda key, seconds: again.append((key, seconds)),
        clock=lambda: now[0],
    )
    rsv = reservation(phase="Available", node="node-7")
    await watch(cache.reservations, "ADDED", rsv)
    await watch(cache.pods, "ADDED", placeholder(node="node-7"))
    assert cache.reservation_view(rsv).placeholder is not None
    assert cache.reservation_view(rsv).node_gone is False
    assert cache.job_view(job()).reserved_node_gone is False
    assert cache.job_view(job()).reserved_node_unseen is True
    assert {key for key, _ in again} == {reservation_key(rsv["metadata"]["name"]), job_key("job-1")}
    assert all(NODE_GRACE < seconds <= NODE_GRACE + 1 for _, seconds in again)
    now[0] += NODE_GRACE
    assert cache.reservation_view(rsv).node_gone is True
    assert cache.job_view(job()).reserved_node_gone is True
    assert cache.job_view(job()).reserved_node_unseen is False
    # The node shows up after all: it is there.
    await watch(cache.nodes, "ADDED", node("node-7"))
    assert cache.reservation_view(rsv).node_gone is False
    assert cache.job_view(job()).reserved_node_unseen is False
    # Its deletion counts at once.
    await watch(cache.nodes, "DELETED", node("node-7"))
    assert cache.reservation_view(rsv).node_gone is True
    assert cache.job_view(job()).reserved_node_gone is True


async def test_a_job_views_siblings_are_its_workloads_pods_in_its_namespace() -> None:
    """A pod anywhere may name the ReplicaSet's UID as its controller (a UID is readable
    in the Reservation's owners): only the pods of the Reservation's namespace naming the
    same kind and name count as the workload's, so a decoy elsewhere cannot end the job
    as a bypass or a scale-down, nor count in arbitration's view of the workload."""
    cache, _ = caches()
    await watch(cache.reservations, "ADDED", reservation(phase="Available", node="node-1"))
    kept = pod("web-2")
    elsewhere = pod("decoy", namespace="attacker")
    other_kind = pod("other-kind")
    other_kind["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSetX"
    for member in (kept, elsewhere, other_kind):
        await watch(cache.pods, "ADDED", member)
    names = [p["metadata"]["name"] for p in cache.job_view(job()).siblings]
    assert names == ["web-2"]
    workload = cache.frozen().pods_of_workload()
    assert sorted(p["metadata"]["name"] for p in workload["default/uid-web-rs"]) == [
        "other-kind",
        "web-2",
    ]
    assert [p["metadata"]["name"] for p in workload["attacker/uid-web-rs"]] == ["decoy"]


async def test_a_token_copied_to_a_pod_of_another_namespace_is_no_second_claimer() -> None:
    """Whoever may read Reservations reads their claim token; a pod elsewhere carrying it
    does not make the claim ambiguous (which would stall the handover): only pods where
    the replacement is made count."""
    cache, _ = caches()
    rsv = reservation(phase="Available", node="node-1", annotations={keys.CLAIM: "tok"})
    await watch(cache.reservations, "ADDED", rsv)
    real = pod("web-2", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "tok"})
    copy = pod("copy", namespace="elsewhere", node=None, annotations={keys.CLAIM: "tok"})
    for member in (real, copy):
        await watch(cache.pods, "ADDED", member)
    view = cache.reservation_view(rsv)
    assert [p["metadata"]["name"] for p in view.claimers] == ["web-2"]


async def test_the_workload_a_reservation_was_made_for_is_found_in_its_namespace_only() -> None:
    """A ReplicaSet of another namespace with the UID the Reservation names is none of
    its workload: its status is never read for the job (scaled away, rolled past)."""
    cache, _ = caches()
    rsv = reservation(phase="Available", node="node-1")

    def replicaset(namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web-rs", "namespace": namespace, "uid": "uid-web-rs"},
            "spec": {"replicas": 3},
        }

    await watch(cache.replicasets, "ADDED", replicaset("elsewhere"))
    elsewhere = cache.reserved_workload(rsv)
    assert elsewhere["workload"] is None
    assert elsewhere["workload_deleted"] == "ReplicaSet web-rs (uid uid-web-rs)"
    await watch(cache.replicasets, "ADDED", replicaset("default"))
    found = cache.reserved_workload(rsv)
    assert found["workload"]["metadata"]["namespace"] == "default"
    assert found["workload_deleted"] is None


def test_the_workload_of_a_replicaset_is_its_deployment_or_itself() -> None:
    """Arbitration's limits read the workload's spec and status: a Deployment's
    ReplicaSet counts as the Deployment; one another kind controls (an Argo Rollout,
    which Berth does not cache) as itself, not as a workload nobody can read."""
    cache, _ = caches()

    def replicaset(name: str, owner_kind: str, api: str = "apps/v1") -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": f"uid-{name}",
                "ownerReferences": [
                    {
                        "apiVersion": api,
                        "kind": owner_kind,
                        "name": "top",
                        "uid": f"uid-{owner_kind}",
                        "controller": True,
                    }
                ],
            },
        }

    cache.replicasets.put(replicaset("of-deployment", "Deployment"))
    cache.replicasets.put(replicaset("of-rollout", "Rollout", api="argoproj.io/v1alpha1"))
    # Read as the webhook and the admission's record read it: an apps/v1 Deployment only,
    # so that the limits count a migration against the workload its record names.
    cache.replicasets.put(replicaset("of-old", "Deployment", api="extensions/v1beta1"))
    workload_of = cache.frozen().workload_of()
    assert workload_of.get("default/uid-of-deployment") == "uid-Deployment"
    assert workload_of.get("default/uid-of-rollout") is None
    assert workload_of.get("default/uid-of-old") is None
    assert set(workload_of) == {"default/uid-of-deployment"}
    # A pod of another namespace naming that ReplicaSet's UID is none of its pods.
    assert workload_of.get("other/uid-of-deployment") is None
    workloads = cache.frozen().workloads()
    assert workloads["default/uid-of-deployment"]["metadata"]["name"] == "of-deployment"
    assert workloads.get("other/uid-of-deployment") is None


@pytest.mark.parametrize(
    "template",
    [
        {"spec": "x"},
        {"spec": {"priorityClassName": ["a"], "containers": [{"name": "a"}]}},
        {"metadata": "x", "spec": {"containers": [{"name": "a"}]}},
    ],
)
async def test_a_reservation_template_of_an_odd_shape_ends_it_once(
    template: dict[str, Any],
) -> None:
    """A Reservation's template is free-form past its top level: a shape the controller
    cannot read is cached (the namespace index names no namespace) and ends it Invalid or
    as any other, never raising on every pass before a decision."""
    cache, _ = caches()
    made = reservation(phase="Pending", node=None)
    made["spec"]["template"] = template
    await watch(cache.reservations, "ADDED", made)
    assert cache.reservations.get(made["metadata"]["name"]) is not None
    plan = reservations.decide(cache.reservation_view(made))
    statuses = [a.obj["status"] for a in plan.actions if isinstance(a, UpdateStatus)]
    assert [status["phase"] for status in statuses] == ["Failed"]


async def test_a_cordon_or_taint_on_a_placeholders_node_brings_its_reservation_and_job_back() -> (
    None
):
    """The views say why the node takes no replacement; only a change of what decides it
    (the node's cordon, its taints that keep pods away, its labels) brings the Reservation
    and its job back."""
    cache, added = caches()
    rsv = reservation(phase="Available", node="node-1")
    await watch(cache.nodes, "ADDED", node("node-1"))
    await watch(cache.reservations, "ADDED", rsv)
    await watch(cache.pods, "ADDED", placeholder(node="node-1"))
    await watch(cache.pods, "ADDED", pod(node="node-2"))
    assert cache.reservation_view(rsv).node_refuses is None
    assert cache.job_view(job()).reserved_node_refuses is None
    expected = {reservation_key(rsv["metadata"]["name"]), job_key("job-1")}

    added.clear()
    await watch(cache.nodes, "MODIFIED", {**node("node-1"), "status": {"allocatable": {}}})
    assert added == []
    await watch(cache.nodes, "MODIFIED", node("node-1", labels={"zone": "b"}))
    assert set(added) == expected
    assert cache.reservation_view(rsv).node_refuses is None

    added.clear()
    await watch(cache.nodes, "MODIFIED", node("node-1", unschedulable=True))
    assert set(added) == expected
    assert cache.reservation_view(rsv).node_refuses == "node node-1 is cordoned"
    assert cache.job_view(job()).reserved_node_refuses == "node node-1 is cordoned"

    added.clear()
    tainted = node("node-1", taints=[{"key": "maintenance", "effect": "NoSchedule"}])
    await watch(cache.nodes, "MODIFIED", tainted)
    assert set(added) == expected
    assert "maintenance:NoSchedule" in str(cache.reservation_view(rsv).node_refuses)

    added.clear()
    await watch(cache.nodes, "MODIFIED", node("node-1"))
    assert set(added) == expected
    assert cache.reservation_view(rsv).node_refuses is None


async def test_a_node_whose_labels_the_pods_placement_excludes_takes_no_replacement() -> None:
    """A node that lost a label the pod's node selector asks takes none of its
    replacements. A pod Berth bound before is judged as its replacement, without the term
    tying it to the node it runs on."""
    cache, _ = caches()
    rsv = reservation(phase="Available", node="node-1")
    await watch(cache.nodes, "ADDED", node("node-1", labels={"pool": "a"}))
    await watch(cache.reservations, "ADDED", rsv)
    bound = pod(node="node-2", annotations={keys.RESERVATION_ALLOCATED: "earlier"})
    pin = {"key": "metadata.name", "operator": "In", "values": ["node-2"]}
    bound["spec"] |= {
        "nodeSelector": {"pool": "a"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [pin]}]
                }
            }
        },
    }
    await watch(cache.pods, "ADDED", bound)
    assert cache.job_view(job()).reserved_node_refuses is None
    await watch(cache.nodes, "MODIFIED", node("node-1", labels={"pool": "b"}))
    assert cache.job_view(job()).reserved_node_refuses == (
        "node node-1 does not match the pod's node selector or required node affinity"
    )


async def test_a_place_made_by_hand_is_judged_by_what_the_pod_tolerates_alone() -> None:
    """A Reservation a job names in reservationRef may be for another pod than the one
    evicted, on a node its maker chose: before the eviction only a cordon or a taint the
    pod does not tolerate holds the eviction back, not the pod's node selector."""
    cache, _ = caches()
    by_hand = reservation("by-hand", phase="Available", node="node-1")
    await watch(cache.nodes, "ADDED", node("node-1", labels={"pool": "b"}))
    await watch(cache.reservations, "ADDED", by_hand)
    pinned = pod(node="node-0")
    pinned["spec"]["nodeSelector"] = {"pool": "a"}
    await watch(cache.pods, "ADDED", pinned)
    named = job(reservation_ref="by-hand")
    assert cache.job_view(named).reserved_node_refuses is None
    await watch(cache.nodes, "MODIFIED", node("node-1", labels={"pool": "b"}, unschedulable=True))
    assert cache.job_view(named).reserved_node_refuses == "node node-1 is cordoned"


async def test_after_the_eviction_a_job_view_judges_the_node_by_its_replacement() -> None:
    """The evicted pod is gone: what its replacement (the Reservation's recorded owner)
    tolerates decides whether the node still takes it."""
    cache, _ = caches()
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    taint = {"key": "maintenance", "effect": "NoSchedule"}
    await watch(cache.nodes, "ADDED", node("node-1", taints=[taint]))
    await watch(cache.reservations, "ADDED", rsv)
    owner = pod("web-2", node=None)
    await watch(cache.pods, "ADDED", owner)
    assert "maintenance:NoSchedule" in str(cache.job_view(job()).reserved_node_refuses)
    tolerant = {
        **owner,
        "spec": {**owner["spec"], "tolerations": [{**taint, "operator": "Exists"}]},
    }
    await watch(
        cache.pods,
        "MODIFIED",
        {**tolerant, "metadata": {**owner["metadata"], "resourceVersion": "9"}},
    )
    assert cache.job_view(job()).reserved_node_refuses is None


async def test_an_evict_directly_job_has_no_reservation_whatever_it_names() -> None:
    """Its reservationRef names another job's open Reservation: the EvictDirectly job
    neither sees it (so a refused eviction closes nothing of it) nor counts as sharing it
    (so the other job does not wait behind it)."""
    cache, _ = caches()
    other = reservation("uid-job-1", phase="Available", node="node-1", job_name="job-1")
    await watch(cache.reservations, "ADDED", other)
    owner = job("job-1")
    direct = job("job-2", pod_name="web-2", mode="EvictDirectly", reservation_ref="uid-job-1")
    await watch(cache.jobs, "ADDED", owner)
    await watch(cache.jobs, "ADDED", direct)
    assert cache.job_view(direct).reservation is None
    assert cache.job_view(direct).sharing == ()
    assert cache.job_view(owner).reservation is not None
    assert cache.job_view(owner).sharing == ()
    # The same job in ReservationFirst mode names it, and shares it.
    reserving = job("job-2", pod_name="web-2", reservation_ref="uid-job-1")
    await watch(cache.jobs, "MODIFIED", reserving)
    assert cache.job_view(reserving).reservation is not None
    assert [j["metadata"]["name"] for j in cache.job_view(owner).sharing] == ["job-2"]


def volume(
    name: str, claim: str, terms: list[dict[str, Any]] | None, phase: str = "Bound"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "claimRef": {"namespace": "default", "name": claim, "uid": f"uid-{claim}"},
        "csi": {"driver": "disk", "volumeHandle": "secret-handle"},
    }
    if terms is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": terms}}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": spec,
        "status": {"phase": phase},
    }


async def test_a_job_view_reads_where_the_pods_volumes_may_be_used() -> None:
    """As kube-scheduler reads a volume's affinity: against labels alone (field
    requirements passed over, so a term of none matches every node)."""
    cache, _ = caches()
    zone_a = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    zone_b = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
    for pv in (
        volume("pv-data", "data", [{**zone_a, **by_name}]),  # zone a, the field passed over
        volume("pv-logs", "logs", None),  # usable anywhere
        volume("pv-cache", "cache", [zone_a, by_name]),  # the second term matches every node
        volume("pv-old", "data", [zone_b], phase="Released"),  # bound to it no more
        volume("pv-empty", "empty", [{}, zone_b]),  # an empty term matches no node
        volume("pv-other", "other", [zone_a]),  # a claim the pod does not mount
    ):
        await watch(cache.volumes, "ADDED", pv)
    assert "csi" not in cache.volumes.get("pv-data")["spec"]  # type: ignore[index]
    mounting = pod()
    mounting["spec"]["volumes"] = [
        {"name": name, "persistentVolumeClaim": {"claimName": name}}
        for name in ("data", "logs", "cache", "empty")
    ] + [{"name": "e", "emptyDir": {}}]
    await watch(cache.pods, "ADDED", mounting)
    assert cache.job_view(job()).volume_terms == ((zone_a,), (zone_b,))
    assert cache.volume_terms(None) == ()


async def test_a_job_view_says_when_the_reserved_node_would_break_the_pods_spread() -> None:
    """The pods of the namespace as the cache holds them, the nodes with their zones: once
    the pod (on node-0, zone b) has left, a=1, b=0, c=0; its replacement would break
    maxSkew 1 in zone a (1 + 1 - 0), not in zone c."""
    cache, _ = caches()
    zones = {"node-0": "b", "node-1": "a", "node-2": "c"}
    for name, zone in zones.items():
        await watch(cache.nodes, "ADDED", node(name, labels={"zone": zone}))
    moving = pod()
    moving["spec"]["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
            "nodeAffinityPolicy": "Ignore",  # every node counts, not the pinned one alone
        }
    ]
    await watch(cache.pods, "ADDED", moving)
    await watch(cache.pods, "ADDED", pod("web-a", node="node-1", uid="uid-web-a"))
    rsv = reservation(phase="Available", node="node-1")
    await watch(cache.reservations, "ADDED", rsv)
    refusal = cache.job_view(job()).reserved_node_spread
    assert refusal is not None
    assert "1 of its pods in zone=a against 0 where there are fewest" in refusal
    await watch(cache.reservations, "MODIFIED", reservation(phase="Available", node="node-2"))
    assert cache.job_view(job()).reserved_node_spread is None
