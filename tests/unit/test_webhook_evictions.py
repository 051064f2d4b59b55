"""What the webhook answers to an eviction (webhook.evictions), and how it reads one."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any, cast
from unittest.mock import AsyncMock

import orjson
import pytest

from berth import web
from berth.api import ALREADY_MIGRATING, already_migrating, keys
from berth.kube.client import NAMESPACES, PODMIGRATIONJOBS, Kube, KubeError
from berth.scheduling import being_drained
from berth.settings import MigrationControllerArgs
from tests.served import served
from tests.unit.builders import T0, job, later, pod, reservation, ts, with_status
from webhook import review
from webhook.evictions import (
    ATTEMPTS,
    Deny,
    Eviction,
    Gone,
    Other,
    Pass,
    already_migrated,
    behind,
    job_for,
    job_name,
    moved,
    moved_on,
    not_opted_in,
    pod_label,
    replaced_in,
    replaces_by_name,
    requester_label,
    screen,
    screen_pod,
    stale,
    verdict,
    waited_for,
)
from webhook.intercept import Interception, Interceptor

CONTROLLER = "system:serviceaccount:berth-system:berth-controller"
ADMIN = "kubernetes-admin"
EVICTION = Eviction(
    uid="review-1",
    namespace="default",
    pod="web-1",
    user=ADMIN,
    groups=("system:masters", "system:authenticated"),
    dry_run=False,
)


def settings(**config: Any) -> MigrationControllerArgs:
    return MigrationControllerArgs.model_validate(config)


def reason(answer: Pass | None) -> str | None:
    return answer.reason if answer else None


@pytest.mark.parametrize(
    ("eviction", "config", "labelled", "expected"),
    [
        (EVICTION, {}, True, None),
        # Berth's own evictions, by the identity the API server authenticated.
        (replace(EVICTION, user=CONTROLLER), {}, True, "BerthEviction"),
        (replace(EVICTION, dry_run=True), {}, True, "DryRun"),
        (EVICTION, {"dryRun": True}, True, "ControllerDryRun"),
        # A job would delete the pod past its PDBs, or only annotate it.
        (EVICTION, {"evictionPolicy": "Delete"}, True, "EvictionPolicy"),
        (EVICTION, {"evictionPolicy": "SoftEviction"}, True, "EvictionPolicy"),
        (EVICTION, {}, False, "NotOptedIn"),
        (EVICTION, {"evictionInterception": {"allNamespaces": True}}, False, None),
        (replace(EVICTION, namespace="kube-system"), {}, True, "NamespaceExcluded"),
        (
            replace(EVICTION, namespace="kube-system"),
            {"evictionInterception": {"allNamespaces": True}},
            False,
            "NamespaceExcluded",
        ),
        (EVICTION, {"namespaces": {"include": ["other"]}}, True, "NamespaceExcluded"),
        (
            EVICTION,
            {"evictionInterception": {"requesters": {"users": ["descheduler"]}}},
            True,
            "RequesterNotListed",
        ),
        (
            replace(EVICTION, user="descheduler"),
            {"evictionInterception": {"requesters": {"users": ["descheduler"]}}},
            True,
            None,
        ),
        (
            EVICTION,
            {"evictionInterception": {"requesters": {"groups": ["system:masters"]}}},
            True,
            None,
        ),
    ],
)
def test_screen(
    eviction: Eviction, config: dict[str, Any], labelled: bool, expected: str | None
) -> None:
    answer = screen(
        eviction, settings=settings(**config), controller_user=CONTROLLER, labelled=labelled
    )
    assert reason(answer) == expected


def daemonset_pod() -> dict[str, Any]:
    found = pod()
    found["metadata"]["ownerReferences"][0].update(kind="DaemonSet", name="agent")
    return found


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (pod(), None),
        (pod(rs=None), "pod has no owner to recreate it (evictFailedBarePods allows failed ones)"),
        (daemonset_pod(), "pod is a DaemonSet pod"),
        (
            pod(annotations={"kubernetes.io/config.mirror": "x"}),
            "pod is a static pod (its kubelet runs it from a manifest)",
        ),
        (pod(node=None), "pod is not scheduled to a node"),
    ],
)
def test_pods_berth_never_migrates_are_evicted_as_asked(
    candidate: dict[str, Any], expected: str | None
) -> None:
    answer = screen_pod(candidate, EVICTION)
    assert (answer.message if answer else None) == expected
    assert answer is None or answer.reason == "NotMigratable"


def test_an_eviction_for_another_pod_of_that_name_is_left_to_the_api_server() -> None:
    answer = screen_pod(pod(), replace(EVICTION, uid_precondition="uid-old"))
    assert answer == Pass("OtherPod", "the eviction requires UID uid-old")
    assert screen_pod(pod(), replace(EVICTION, uid_precondition="uid-web-1")) is None


def test_the_job_takes_mode_and_ttl_from_the_configuration_and_names_the_requester() -> None:
    config = settings(defaultJobMode="EvictDirectly", defaultJobTTL="90s")
    body = job_for(pod(uid="1234"), eviction=EVICTION, settings=config)
    assert body["metadata"]["name"] == "eviction-1234"
    assert body["metadata"]["labels"] == {
        keys.REQUESTER: ADMIN,
        keys.EVICTION_OF: "default.web-1",
    }
    assert body["metadata"]["annotations"] == {keys.REQUESTER: ADMIN}
    assert body["spec"] == {
        "mode": "EvictDirectly",
        "ttl": "1m30s",
        "podRef": {"namespace": "default", "name": "web-1", "uid": "1234"},
    }


@pytest.mark.parametrize(
    ("user", "label"),
    [
        ("kubernetes-admin", "kubernetes-admin"),
        (
            "system:serviceaccount:kube-system:descheduler",
            "system.serviceaccount.kube-system.descheduler",
        ),
        ("user@example.com", "user.example.com"),
        ("::", "unknown"),
    ],
)
def test_requester_label(user: str, label: str) -> None:
    assert requester_label(user) == label


def test_only_a_statefulset_pod_retried_by_name_is_looked_up_by_name() -> None:
    """A StatefulSet makes its replacement under the same name; a Deployment's has a name
    of its own, and an eviction naming a UID means that pod."""
    stateful = pod()
    stateful["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": "db",
            "uid": "u",
            "controller": True,
        }
    ]
    assert replaces_by_name(stateful, EVICTION)
    assert not replaces_by_name(stateful, replace(EVICTION, uid_precondition="uid-web-1"))
    assert not replaces_by_name(pod(), EVICTION)
    assert pod_label("shop", "db-0") == "shop.db-0"
    assert len(pod_label("shop", "x" * 253)) <= 63


def test_a_long_requester_keeps_its_start_and_a_hash() -> None:
    user = "system:serviceaccount:a-very-long-namespace-name:" + "x" * 60
    label = requester_label(user)
    assert len(label) <= 63
    assert label.startswith("system.serviceaccount.a-very-long-namespace-name.")
    assert label != requester_label(user + "y")


def the_job(phase: str | None, **status: Any) -> dict[str, Any]:
    found = job("eviction-uid-web-1", phase=phase)
    found["spec"]["podRef"]["uid"] = "uid-web-1"
    found["status"].update(status)
    return found


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (the_job(None), Deny),
        (the_job("Pending", reason="MaxMigratingPerNode", message="2 running on node-0"), Deny),
        (the_job("Running"), Deny),
        (the_job("Failed", reason="Timeout"), Pass),
        (the_job("Aborted"), Pass),
        (the_job("Succeed"), Pass),
    ],
)
def test_verdict_waits_for_the_job_and_never_blocks_for_good(
    found: dict[str, Any], expected: type
) -> None:
    answer = verdict(found, pod(), now=T0, default_ttl=FIVE_MINUTES)
    assert isinstance(answer, expected)
    if isinstance(answer, Deny):
        assert answer.job == "eviction-uid-web-1"
        assert "PodMigrationJob eviction-uid-web-1" in answer.message
    else:
        assert answer.reason == "JobEnded"


def test_a_job_of_that_name_for_another_pod_never_blocks_the_eviction() -> None:
    found = the_job("Running")
    found["spec"]["podRef"]["uid"] = "someone-else"
    answer = verdict(found, pod(), now=T0, default_ttl=FIVE_MINUTES)
    assert isinstance(answer, Pass)
    assert answer.reason == "JobMismatch"


FIVE_MINUTES = timedelta(minutes=5)


@pytest.mark.parametrize(
    ("ttl", "after", "reason"),
    [
        ("5m0s", 5 * 60 + 59, None),
        ("5m0s", 6 * 60 + 1, "JobOverdue"),
        # Written with a year's TTL to hold drains off: no longer than the webhook's own.
        ("8760h0m0s", 6 * 60 + 1, "JobOverdue"),
        ("1m0s", 2 * 60 + 1, "JobOverdue"),
    ],
)
def test_a_job_not_ended_after_its_ttl_blocks_no_drain(
    ttl: str, after: int, reason: str | None
) -> None:
    """Only the controller ends a job at its TTL: while it is down (or cannot be
    scheduled in a full cluster), a drain would get 429 for ever."""
    found = the_job("Pending")
    found["spec"]["ttl"] = ttl
    answer = verdict(found, pod(), now=later(after), default_ttl=FIVE_MINUTES)
    if reason is None:
        assert isinstance(answer, Deny)
    else:
        assert isinstance(answer, Pass)
        assert answer.reason == reason
        assert "is the controller running?" in answer.message


@pytest.mark.parametrize(
    ("phase", "after", "expected"),
    [
        ("Failed", 6 * 60 + 1, True),  # ended long ago: a later eviction gets a new job
        ("Succeed", 6 * 60 + 1, True),
        ("Failed", 60, False),  # the drain's own retries within its job's life
        ("Running", 6 * 60 + 1, False),  # not ended: verdict says JobOverdue
        ("Pending", 60, False),
    ],
)
def test_a_job_ended_long_ago_is_stale(phase: str, after: int, expected: bool) -> None:
    found = the_job(phase)
    assert stale(found, now=later(after), default_ttl=FIVE_MINUTES) is expected


def test_each_attempt_has_a_name_of_its_own() -> None:
    names = [job_name(pod(), attempt) for attempt in range(1, ATTEMPTS + 1)]
    assert names[0] == "eviction-uid-web-1"
    assert names[1] == "eviction-uid-web-1-2"
    assert len(set(names)) == ATTEMPTS


def test_a_paused_job_blocks_no_drain() -> None:
    found = the_job("Pending")
    found["spec"]["paused"] = True
    answer = verdict(found, pod(), now=T0, default_ttl=FIVE_MINUTES)
    assert isinstance(answer, Pass)
    assert answer.reason == "JobPaused"


def test_a_pod_another_job_migrates_keeps_the_drain_waiting() -> None:
    """kubectl migrate node, then kubectl drain of the node: arbitration fails the
    eviction's job (the pod is another job's), and the pod is moved by that job, not
    evicted plainly by the drain's next retry."""
    found = the_job(
        "Failed",
        reason="ForbiddenMigratePod",
        message=f"pod default/web-1 {ALREADY_MIGRATING}",
    )
    answer = verdict(found, pod(), now=later(60), default_ttl=FIVE_MINUTES)
    assert isinstance(answer, Deny)
    assert answer.reason == "MigratedByAnotherJob"
    late = verdict(found, pod(), now=later(7 * 60), default_ttl=FIVE_MINUTES)
    assert isinstance(late, Pass)


def other_job(phase: str | None, *, paused: bool = False, ttl: str | None = "5m") -> dict[str, Any]:
    """The job made by hand (kubectl migrate node) that migrates web-1, two minutes
    before the eviction's."""
    other = job("by-hand", phase=phase)
    other["metadata"]["creationTimestamp"] = ts(later(-120))
    other["spec"]["paused"] = paused
    if ttl is None:
        other["spec"].pop("ttl", None)
    else:
        other["spec"]["ttl"] = ttl
    return other


@pytest.mark.parametrize(
    ("other", "at", "reason"),
    [
        (other_job("Running"), 60, "MigratedByAnotherJob"),
        (other_job(None), 60, "MigratedByAnotherJob"),
        (None, 60, "MigratingJobGone"),
        (other_job("Succeed"), 60, "MigratingJobEnded"),
        (other_job("Failed"), 60, "MigratingJobEnded"),
        (other_job("Running", paused=True), 60, "MigratingJobPaused"),
        # No TTL (kubectl migrate node): waited for no longer than defaultJobTTL.
        (other_job("Pending", ttl=None), 3 * 60, "MigratedByAnotherJob"),
        (other_job("Pending", ttl=None), 4 * 60 + 1, "MigratingJobOverdue"),
    ],
)
def test_the_drain_waits_behind_the_job_migrating_the_pod_only_while_it_would_wait_for_it(
    other: dict[str, Any] | None, at: int, reason: str
) -> None:
    """The eviction's job was failed for the job named in its message: the drain waits
    as long as that job would hold it back on its own account, not for a paused,
    ended, vanished or overdue one."""
    found = the_job(
        "Failed",
        reason="ForbiddenMigratePod",
        message=already_migrating("default/web-1", "by-hand"),
    )
    assert behind(found) == "by-hand"
    answer = verdict(
        found, pod(), now=later(at), default_ttl=FIVE_MINUTES, other=Other("by-hand", other)
    )
    assert answer.reason == reason
    assert isinstance(answer, Deny) == (reason == "MigratedByAnotherJob")
    assert "by-hand" in answer.message


def test_a_wait_behind_a_job_that_ended_is_over_and_only_a_job_that_evicted_moved_its_pod() -> None:
    assert moved_on(Other("by-hand", None))
    assert moved_on(Other("by-hand", other_job("Aborted")))
    assert not moved_on(Other("by-hand", other_job("Running")))
    assert not moved_on(None)
    assert moved(the_job("Succeed"))
    evicted = the_job("Running", conditions=[
        {"type": "Eviction", "status": "True", "reason": "EvictComplete"}])  # fmt: skip
    assert moved(evicted)
    assert not moved(the_job("Failed", reason="MissingPod"))
    assert not moved(the_job("Running"))
    # Sent: the replacement may come before the job records the eviction complete.
    assert moved(the_job("Running", conditions=[
        {"type": "Eviction", "status": "False", "reason": "Evicting"}]))  # fmt: skip


def migrated_by(user: str) -> dict[str, Any]:
    found = the_job("Succeed")
    found["metadata"]["annotations"][keys.REQUESTER] = user
    return found


def test_the_replacement_of_a_migrated_pod_is_found_by_its_reservation() -> None:
    reservations = {
        "a": reservation("a", owners=["other"], job_name="job-a"),
        "b": with_status(reservation("b", owners=["web-1"], job_name="job-b"), phase="Succeeded"),
        "c": reservation("c", annotations={keys.CLAIM: "token-c"}, job_name="job-c"),
    }
    assert replaced_in(pod(), reservations) == "job-b"
    assert replaced_in(pod(uid="new"), reservations) is None
    # Claimed, not yet recorded as owner: the window between the webhook and the
    # controller, when the replacement is still gated.
    claimed = pod(uid="new", node=None, annotations={keys.CLAIM: "token-c"})
    assert replaced_in(claimed, reservations) == "job-c"
    assert replaced_in(pod(uid="new", annotations={keys.CLAIM: "other"}), reservations) is None


REPLACEMENT = pod(uid="uid-web-1-new", node="node-1")
"""A StatefulSet's replacement: the name of the pod the job migrated (uid-web-1)."""


@pytest.mark.parametrize(
    ("user", "after", "gone"),
    [
        (ADMIN, timedelta(seconds=10), True),
        (ADMIN, timedelta(minutes=5, seconds=59), True),  # TTL 5m + the grace
        (ADMIN, timedelta(minutes=7), False),
        ("someone-else", timedelta(seconds=10), False),
    ],
)
def test_a_retry_on_the_replacement_is_answered_gone(
    user: str, after: timedelta, gone: bool
) -> None:
    answer = already_migrated(
        migrated_by(user), REPLACEMENT, eviction=EVICTION, now=T0 + after, draining=False
    )
    assert isinstance(answer, Gone) == gone


def told_to_wait(user: str, *, reason: str = "ForbiddenMigratePod") -> dict[str, Any]:
    """The job the webhook made for `user`'s eviction of web-1, which arbitration failed
    because another job was migrating the pod."""
    own = the_job("Failed")
    own["metadata"]["annotations"][keys.REQUESTER] = user
    own["status"]["reason"] = reason
    own["status"]["message"] = f"pod default/web-1 {ALREADY_MIGRATING} (job-by-hand)"
    return own


def test_a_retry_on_the_replacement_of_a_job_the_requester_waited_for_is_answered_gone() -> None:
    """`kubectl migrate node`, then a drain of that node: the drain was told to wait for
    the job made by hand, which has no requester; its retry by name reaches the
    replacement, which is not migrated again."""
    by_hand = the_job("Succeed")
    by_hand["metadata"]["annotations"].pop(keys.REQUESTER, None)
    now = T0 + timedelta(seconds=10)
    assert waited_for(told_to_wait(ADMIN), by_hand, EVICTION)
    answer = already_migrated(
        by_hand, REPLACEMENT, eviction=EVICTION, now=now, draining=False, waited=True
    )
    assert isinstance(answer, Gone)
    assert (
        already_migrated(by_hand, REPLACEMENT, eviction=EVICTION, now=now, draining=False) is None
    )
    # Another requester's job, one that ended otherwise, or none: no wait for this job.
    assert not waited_for(told_to_wait("someone-else"), by_hand, EVICTION)
    assert not waited_for(told_to_wait(ADMIN, reason="Timeout"), by_hand, EVICTION)
    assert not waited_for(None, by_hand, EVICTION)
    other_pod = the_job("Succeed")
    other_pod["spec"]["podRef"]["uid"] = "uid-web-9"
    assert not waited_for(told_to_wait(ADMIN), other_pod, EVICTION)


@pytest.mark.parametrize("ttl", [300, ["5m"], "5 minutes"])
def test_a_job_whose_ttl_cannot_be_read_answers_no_retry_as_gone(ttl: Any) -> None:
    """Whatever its spec holds (the webhook reads jobs as the API server stores them, and
    a schema may be looser), an unreadable TTL makes no 404 and raises nothing."""
    job_obj = migrated_by(ADMIN)
    job_obj["spec"]["ttl"] = ttl
    assert (
        already_migrated(
            job_obj, REPLACEMENT, eviction=EVICTION, now=T0 + timedelta(seconds=10), draining=False
        )
        is None
    )


@pytest.mark.parametrize(
    ("replacement", "eviction", "draining"),
    [
        # The pod the job migrated, still there: not a replacement.
        (pod(), EVICTION, False),
        # A Deployment's replacement has a name of its own: a retry by the old name never
        # reaches it, so an eviction of it is a new one (the drain of its node, say).
        (pod("web-2", uid="uid-web-2"), replace(EVICTION, pod="web-2"), False),
        # The same name, on a node being drained: a drain of that node.
        (REPLACEMENT, EVICTION, True),
        # An eviction naming this pod's UID means this pod.
        (REPLACEMENT, replace(EVICTION, uid_precondition="uid-web-1-new"), False),
    ],
)
def test_an_eviction_of_the_replacement_that_is_no_retry_is_not_answered_gone(
    replacement: dict[str, Any], eviction: Eviction, draining: bool
) -> None:
    answer = already_migrated(
        migrated_by(ADMIN),
        replacement,
        eviction=eviction,
        now=T0 + timedelta(seconds=10),
        draining=draining,
    )
    assert answer is None


TOLERATES_ALL = {
    **REPLACEMENT,
    "spec": {**REPLACEMENT["spec"], "tolerations": [{"operator": "Exists"}]},
}


@pytest.mark.parametrize(
    ("spec", "draining"),
    [
        ({}, False),
        ({"unschedulable": True}, True),
        ({"unschedulable": True, "tolerant": True}, True),  # a cordon is a drain, tolerated or not
        # Cluster Autoscaler and Karpenter taint a node they remove; they do not cordon it.
        ({"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}, True),
        ({"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}, True),
        # ...whatever the replacement tolerates: they remove the node all the same.
        (
            {
                "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}],
                "tolerant": True,
            },
            True,
        ),
        (
            {
                "taints": [
                    {
                        "key": "karpenter.sh/disruption",
                        "value": "disrupting",
                        "effect": "NoSchedule",
                    }
                ],
                "tolerant": True,
            },
            True,
        ),
        ({"taints": [{"key": "gpu", "effect": "NoSchedule"}], "tolerant": True}, False),
        ({"taints": [{"key": "soon", "effect": "PreferNoSchedule"}]}, False),
    ],
)
def test_the_replacements_node_is_drained_when_it_takes_no_new_pod_like_it(
    spec: dict[str, Any], draining: bool
) -> None:
    """The decision the interceptor makes of the node it reads (`scheduling.being_drained`;
    its read against the real API server: `test_a_retry_by_name_never_evicts_a_statefulset_
    replacement` in tests/e2e/test_evictions.py)."""
    tolerant = spec.pop("tolerant", False)
    replacement = TOLERATES_ALL if tolerant else REPLACEMENT
    node = {"metadata": {"name": "node-2"}, "spec": spec}
    assert being_drained(node, replacement["spec"]) is draining


# --- the wire ---------------------------------------------------------------


def eviction_review(**request: Any) -> bytes:
    body = {
        "uid": "review-1",
        "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "eviction",
        "name": "web-1",
        "namespace": "default",
        "operation": "CREATE",
        "userInfo": {"username": ADMIN, "groups": ["system:masters"]},
        "object": {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "web-1", "namespace": "default"},
        },
        "dryRun": False,
        **request,
    }
    return orjson.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}
    )


def test_an_eviction_review_is_read() -> None:
    assert review.parse_eviction(eviction_review()) == replace(EVICTION, groups=("system:masters",))
    assert review.parse_eviction(eviction_review(dryRun=True)).dry_run


@pytest.mark.parametrize(("asked", "read"), [(600, 600), (0, 0), (-1, None), (None, None)])
def test_the_grace_period_an_eviction_asks_for_is_the_jobs(
    asked: int | None, read: int | None
) -> None:
    """`kubectl drain --grace-period=600`: the job evicts the pod with it (the controller
    never makes it shorter than the pod's own), beside the configuration's other delete
    options."""
    options = {} if asked is None else {"deleteOptions": {"gracePeriodSeconds": asked}}
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "web-1", "namespace": "default"}, **options}  # fmt: skip
    eviction = review.parse_eviction(eviction_review(object=body))
    assert eviction.grace_period_seconds == read
    config = settings(defaultDeleteOptions={"propagationPolicy": "Background"})
    spec = job_for(pod(), eviction=eviction, settings=config)["spec"]
    if read is None:
        assert "deleteOptions" not in spec
    else:
        assert spec["deleteOptions"] == {
            "propagationPolicy": "Background",
            "gracePeriodSeconds": read,
        }


def test_a_dry_run_asked_in_the_evictions_delete_options_is_a_dry_run() -> None:
    """kubectl drain --dry-run=server asks in the Eviction's deleteOptions; the review's
    own dryRun stays false."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "web-1", "namespace": "default"},
        "deleteOptions": {"dryRun": ["All"], "preconditions": {"uid": "uid-web-1"}},
    }
    eviction = review.parse_eviction(eviction_review(object=body))
    assert eviction.dry_run
    assert eviction.uid_precondition == "uid-web-1"


@pytest.mark.parametrize(
    ("request_fields", "problem"),
    [
        ({"subResource": "status"}, "pods/status, not pods/eviction"),
        ({"userInfo": {"groups": []}}, "userInfo.username: Field required"),
        ({"name": 3}, "name: Input should be a valid string"),
        ({"uid": ""}, "the request has no uid"),
        ({"object": {"deleteOptions": {"dryRun": "All"}}}, "deleteOptions.dryRun: Input should be"),
        ({"name": ""}, "the request's name '' is not an object's name"),
        ({"name": "../../nodes/n1"}, "name '../../nodes/n1' is not an object's name"),
        ({"namespace": "Payments"}, "namespace 'Payments' is not an object's name"),
    ],
)
def test_a_malformed_eviction_review_is_refused_naming_the_problem(
    request_fields: dict[str, Any], problem: str
) -> None:
    with pytest.raises(review.MalformedReview, match=problem):
        review.parse_eviction(eviction_review(**request_fields))


def test_a_refusal_carries_the_code_the_client_sees() -> None:
    answer = review.refusal("review-1", code=429, reason="TooManyRequests", message="wait")
    assert answer["response"] == {
        "uid": "review-1",
        "allowed": False,
        "status": {
            "status": "Failure",
            "code": 429,
            "reason": "TooManyRequests",
            "message": "wait",
        },
    }
    assert review.response("review-1", [])["response"] == {"uid": "review-1", "allowed": True}


def interceptor_on(kube: Any, *, deadline: float = 5) -> Interceptor:
    return Interceptor(
        cast(Kube, kube),
        interception=Interception(MigrationControllerArgs()),
        reservations={},
        deadline=deadline,
    )


async def reviewed(interceptor: Interceptor) -> dict[str, Any]:
    """The answer to the labelled path's review of evicting web-1, over HTTP."""
    app = web.App()
    app.post("/", interceptor.labelled)
    async with served(app) as client:
        answer = await client.post("/", data=eviction_review())
        result: dict[str, Any] = (await answer.json())["response"]
    return result


class _SlowCreates:
    """An API server that has the pod and takes every create in without answering in
    time: the job may exist once the webhook's deadline ends its wait."""

    find = Kube.find  # on this `get`

    def __init__(self) -> None:
        self.created: list[str] = []

    async def get(self, resource: Any, name: str, _namespace: str | None = None) -> Any:
        if resource == NAMESPACES:  # opted in, as the path it came to says
            return {"metadata": {"name": name, "labels": {keys.INTERCEPT_EVICTIONS: "true"}}}
        return pod(name)

    async def create(self, _resource: Any, body: dict[str, Any], **_: Any) -> Any:
        self.created.append(body["metadata"]["name"])
        await asyncio.sleep(30)


async def test_an_eviction_whose_job_may_exist_is_not_let_through() -> None:
    """The create was sent, its answer did not come within the deadline: the job may
    exist and run, so the requester is told to retry (its retry finds the job), not let
    evict the pod under it."""
    kube = _SlowCreates()
    interceptor = interceptor_on(kube, deadline=0.2)
    result = await reviewed(interceptor)
    assert kube.created == ["eviction-uid-web-1"]
    assert result["allowed"] is False
    assert result["status"]["code"] == 429
    assert "eviction-uid-web-1" in result["status"]["message"]


class _RefusingCreates(_SlowCreates):
    """An API server that refuses every job create with `status` (an admission policy,
    a quota, a validation rule), throttles it, or fails it (a webhook on jobs down);
    the job exists only if `exists` (a failure after it was stored)."""

    def __init__(self, status: int, *, exists: bool = False) -> None:
        super().__init__()
        self.status = status
        self.exists = exists

    async def create(self, _resource: Any, body: dict[str, Any], **_: Any) -> Any:
        self.created.append(body["metadata"]["name"])
        raise KubeError(self.status, {"reason": "Forbidden", "message": "denied by policy"})

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> Any:
        if resource == PODMIGRATIONJOBS and not self.exists:
            raise KubeError(404, {"reason": "NotFound", "message": f"{name} not found"})
        return await super().get(resource, name, namespace)


class _ExistsThenUnreadable(_SlowCreates):
    """The job exists (409 on create), and the GET that follows is refused."""

    async def create(self, _resource: Any, body: dict[str, Any], **_: Any) -> Any:
        self.created.append(body["metadata"]["name"])
        raise KubeError(409, {"reason": "AlreadyExists", "message": "exists"})

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> Any:
        if resource == PODMIGRATIONJOBS:
            raise KubeError(401, {"reason": "Unauthorized", "message": "token rotated"})
        return await super().get(resource, name, namespace)


class _UnreadableAnswer(_SlowCreates):
    """The create goes through, and reading its answer fails in a way no API error does
    (a defect, a body of another shape)."""

    async def create(self, _resource: Any, body: dict[str, Any], **_: Any) -> Any:
        self.created.append(body["metadata"]["name"])
        raise AttributeError("'list' object has no attribute 'get'")


async def test_any_failure_once_the_job_is_made_keeps_the_eviction_waiting() -> None:
    """Not only an API error: whatever fails once the create was sent, the job may exist
    and run, so the requester is told to retry (a 500 would let the eviction through,
    the webhook failing open)."""
    kube = _UnreadableAnswer()
    result = await reviewed(interceptor_on(kube))
    assert kube.created == ["eviction-uid-web-1"]
    assert result["allowed"] is False
    assert result["status"]["code"] == 429


async def test_a_job_that_exists_but_cannot_be_read_keeps_the_eviction_waiting() -> None:
    """Only a refused create means no job: a job found to exist, then not read, may run,
    so the requester is told to retry."""
    kube = _ExistsThenUnreadable()
    interceptor = interceptor_on(kube)
    result = await reviewed(interceptor)
    assert result["allowed"] is False
    assert result["status"]["code"] == 429


@pytest.mark.parametrize(("status", "let_through"), [(403, True), (422, True), (429, False)])
async def test_a_job_create_refused_outright_lets_the_eviction_through(
    status: int, let_through: bool
) -> None:
    """A refused create made no job, and every retry would be refused the same way:
    answering 429 would block the drain for good. A throttled create is retried."""
    kube = _RefusingCreates(status)
    interceptor = interceptor_on(kube)
    interceptor.recorder.record = AsyncMock()  # type: ignore[method-assign]
    result = await reviewed(interceptor)
    assert kube.created == ["eviction-uid-web-1"]
    assert result["allowed"] is let_through
    if let_through:
        _pod, reason, message, kind = interceptor.recorder.record.call_args.args
        assert (reason, kind) == ("EvictionAllowed", "Warning")
        assert "refused to create its PodMigrationJob" in message
        assert f"HTTP {status}" in message
    else:
        assert result["status"]["code"] == 429


@pytest.mark.parametrize(("exists", "let_through"), [(False, True), (True, False)])
async def test_a_create_that_failed_lets_the_eviction_through_only_if_no_job_was_made(
    exists: bool, let_through: bool
) -> None:
    """A create that failed (500: a webhook on jobs is down) may still have stored the
    job: the requester waits only while the API server has it. Otherwise every retry
    would fail the same way and be told to wait for a job that never was."""
    kube = _RefusingCreates(500, exists=exists)
    result = await reviewed(interceptor_on(kube))
    assert kube.created == ["eviction-uid-web-1"]
    assert result["allowed"] is let_through
    if not let_through:
        assert result["status"]["code"] == 429


@pytest.mark.parametrize(
    ("namespace", "opted_in"),
    [
        ({"metadata": {"name": "shop", "labels": {keys.INTERCEPT_EVICTIONS: "true"}}}, True),
        ({"metadata": {"name": "shop", "labels": {keys.INTERCEPT_EVICTIONS: "false"}}}, False),
        ({"metadata": {"name": "shop", "labels": {"team": "a"}}}, False),
        ({"metadata": {"name": "shop"}}, False),
        (None, False),
    ],
)
def test_the_labelled_path_holds_only_for_a_namespace_labelled_now(
    namespace: dict[str, Any] | None, opted_in: bool
) -> None:
    passed = not_opted_in(namespace, EVICTION)
    assert (passed is None) == opted_in
    if passed is not None:
        assert passed.reason == "NotOptedIn"
        assert "path of labelled namespaces" in passed.message
