"""The executor's guards: nothing is done by a replica that may no longer act, and a
write refused for the pod's UID precondition means the pod of that name is another."""

from __future__ import annotations

from typing import Any, cast

import pytest

from berth.kube.client import (
    NAMESPACES,
    NODES,
    PODS,
    PRIORITYCLASSES,
    RESERVATIONS,
    Kube,
    KubeError,
)
from berth.kube.events import Recorder
from controller.actions import Create, Event, Evict, Plan, Record
from controller.executor import Executor, _another_pod


async def test_an_executor_that_may_not_act_does_nothing() -> None:
    """Asked before each action: nothing reaches the API server (here none: any call
    would fail on it) once the replica may not act."""
    executor = Executor(cast(Kube, None), cast(Recorder, None), may_act=lambda: False)
    job = {"metadata": {"name": "j"}}
    outcome = await executor.run(Plan().then(Event(job, "Reason", "message")))
    assert not outcome.done


@pytest.mark.parametrize(
    ("status", "message", "another"),
    [
        (409, "Precondition failed: UID in precondition: a, UID in object meta: b", True),
        (422, 'Pod "web-0" is invalid: metadata.uid: Invalid value: "a": field is immutable', True),
        (422, 'Pod "web-0" is invalid: spec: Forbidden: pod updates may not change fields', False),
        (409, "Operation cannot be fulfilled: the object has been modified", False),
        (429, "Cannot evict pod as it would violate the pod's disruption budget.", False),
    ],
)
def test_a_write_refused_for_its_uid_precondition_means_another_pod(
    status: int, message: str, another: bool
) -> None:
    """An eviction or a soft eviction's patch carries the pod's UID: refused for it, the
    pod of that name is a new one (a StatefulSet's), and the old one is gone."""
    assert _another_pod(KubeError(status, {"message": message})) is another


BUDGET = {
    "kind": "Status",
    "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {
        "causes": [{"reason": "DisruptionBudget", "message": "The disruption budget db needs 2"}]
    },
    "code": 429,
}
THROTTLED = {
    "kind": "Status",
    "status": "Failure",
    "message": "Too many requests, please try again later.",
    "reason": "TooManyRequests",
    "details": {"retryAfterSeconds": 1},
    "code": 429,
}


@pytest.mark.parametrize(
    ("status", "body", "budget"),
    [
        (429, BUDGET, True),
        # API Priority and Fairness sheds load with 429 and no cause: not a budget.
        (429, THROTTLED, False),
        # A webhook denying the eviction with 429 (a drain guard) names no budget either.
        (429, {"message": "admission webhook denied the request", "code": 429}, False),
        (500, BUDGET, False),
        (429, {"details": {"causes": "DisruptionBudget"}}, False),  # malformed: ignored
        (429, {"details": [1]}, False),
    ],
)
def test_only_an_eviction_refused_for_a_budget_reads_as_one(
    status: int, body: dict[str, object], budget: bool
) -> None:
    assert KubeError(status, body).disruption_budget is budget


class _Refusing:
    """An API server that refuses every create as a ResourceQuota does."""

    async def create(self, *_: object, **__: object) -> object:
        raise KubeError(403, {"message": "exceeded quota: pods", "reason": "Forbidden"})


async def test_a_refused_pod_class_or_reservation_create_is_said_on_its_object() -> None:
    executor = Executor(cast(Kube, _Refusing()), cast(Recorder, None))
    pod_body = {"metadata": {"generateName": "berth-placeholder-r-"}}
    outcome = await executor.run(Plan().then(Create(PODS, pod_body, namespace="ns")))
    assert not outcome.done
    assert outcome.create_refused is not None
    assert outcome.create_refused.status == 403
    assert outcome.refused_resource == "pods"
    made = await executor.run(Plan().then(Create(RESERVATIONS, {"metadata": {"name": "r"}})))
    assert made.create_refused is not None
    # A placeholder's PriorityClass too: refused, the Reservation says so (it would
    # otherwise wait "for the scheduler", silently, until its job's TTL).
    made = await executor.run(Plan().then(Create(PRIORITYCLASSES, {"metadata": {"name": "p"}})))
    assert made.create_refused is not None
    assert made.refused_resource == "priorityclasses"
    other = await executor.run(
        Plan().then(Create(NAMESPACES, {"metadata": {"name": "n"}}))  # any other create
    )
    assert (other.done, other.create_refused) == (False, None)


class _RecordRefused:
    """An API server that creates the pod, then refuses the patch recording it."""

    async def create(self, _resource: object, body: dict[str, Any], **_: object) -> object:
        return {**body, "metadata": {"name": "berth-placeholder-r-x1", "uid": "u1"}}

    async def patch(self, *_: object, **__: object) -> object:
        raise KubeError(403, {"message": "reservations is forbidden", "reason": "Forbidden"})


async def test_a_create_whose_record_is_refused_is_not_a_refused_create() -> None:
    """The pod exists: nothing is said on its object as if it had not been made; the
    plan stops on an API error, and the key is tried again."""
    executor = Executor(cast(Kube, _RecordRefused()), cast(Recorder, None))
    record = Record(RESERVATIONS, "r", "berth.sh/placeholder")
    body = {"metadata": {"generateName": "berth-placeholder-r-"}}
    outcome = await executor.run(Plan().then(Create(PODS, body, namespace="ns", record=record)))
    assert not outcome.done
    assert outcome.create_refused is None
    assert outcome.error is not None
    assert outcome.error.status == 403
    # Named for the Warning event said on the job (`WriteRefused`).
    assert outcome.failed == "recording Create pods/berth-placeholder-r-"


class _NodeGone:
    """An API server where the node was deleted moments ago (or cordoned: `cordoned`), and
    evictions are recorded."""

    def __init__(
        self, nodes: set[str], *, cordoned: bool = False, labels: dict[str, str] | None = None
    ) -> None:
        self.nodes = nodes
        self.cordoned = cordoned
        self.labels = labels or {}
        self.evicted: list[str] = []

    async def get(self, resource: object, name: str, *_: object) -> object:
        assert resource is NODES
        if name not in self.nodes:
            raise KubeError(404, {"message": f'nodes "{name}" not found', "reason": "NotFound"})
        return {
            "metadata": {"name": name, "labels": self.labels},
            "spec": {"unschedulable": self.cordoned},
        }

    async def evict(self, namespace: str, name: str, **_: object) -> None:
        self.evicted.append(f"{namespace}/{name}")


@pytest.mark.parametrize(
    ("reserved_node", "evicted"),
    [("node-1", ["ns/web-1"]), ("node-9", []), (None, ["ns/web-1"])],
)
async def test_a_pod_is_not_evicted_into_a_place_on_a_node_deleted_moments_ago(
    reserved_node: str | None, evicted: list[str]
) -> None:
    """The plan was made from caches that may not show a node deleted moments ago: the
    Reservation's node is read again just before the eviction (EvictDirectly: none)."""
    kube = _NodeGone({"node-1"})
    executor = Executor(cast(Kube, kube), cast(Recorder, None))
    eviction = Evict("ns", "web-1", "uid-1", policy="Eviction", reserved_node=reserved_node)
    outcome = await executor.run(Plan().then(eviction))
    assert kube.evicted == evicted
    assert outcome.done == bool(evicted)
    assert outcome.eviction_refused is None
    # Held back, not failed: the pass is not counted an API failure and backed off.
    assert outcome.held_back == (not evicted)
    assert outcome.error is None


class _NodeUnreadable(_NodeGone):
    """An API server that refuses to say anything of the node (RBAC, throttling)."""

    async def get(self, _resource: object, _name: str, *_: object) -> object:
        raise KubeError(429, {"message": "throttled", "reason": "TooManyRequests"})


async def test_a_node_that_cannot_be_read_before_the_eviction_is_an_api_failure() -> None:
    """Not evicted, and not "held back" either (which is looked at again in 2 s, with no
    back-off): the API server failed, so the pass backs off as after any API failure."""
    kube = _NodeUnreadable(set())
    executor = Executor(cast(Kube, kube), cast(Recorder, None))
    eviction = Evict("ns", "web-1", "uid-1", policy="Eviction", reserved_node="node-1")
    outcome = await executor.run(Plan().then(eviction))
    assert kube.evicted == []
    assert not outcome.done
    assert not outcome.held_back
    assert outcome.eviction_refused is None
    assert outcome.error is not None
    assert outcome.error.status == 429


@pytest.mark.parametrize(
    ("cordoned", "placement", "evicted"),
    [
        (True, {}, []),
        (True, {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]},
         ["ns/web-1"]),
        (False, {"nodeSelector": {"pool": "a"}}, ["ns/web-1"]),
        (False, {"nodeSelector": {"pool": "b"}}, []),
    ],
)  # fmt: skip
async def test_a_pod_is_not_evicted_into_a_place_on_a_node_cordoned_or_relabelled_moments_ago(
    cordoned: bool, placement: dict[str, Any], evicted: list[str]
) -> None:
    """A replacement would stay Pending on a cordoned node, unless it tolerates the cordon
    (as the evicted pod does), or on one whose labels its node selector excludes."""
    kube = _NodeGone({"node-1"}, cordoned=cordoned, labels={"pool": "a"})
    executor = Executor(cast(Kube, kube), cast(Recorder, None))
    eviction = Evict(
        "ns", "web-1", "uid-1", policy="Eviction", reserved_node="node-1", placement=placement
    )
    outcome = await executor.run(Plan().then(eviction))
    assert kube.evicted == evicted
    assert outcome.done == bool(evicted)


async def test_a_lease_lost_while_the_node_is_read_stops_the_eviction() -> None:
    """The node's read before an eviction may take a while: the right to act is asked
    again after it, so a replica whose lease ran out meanwhile evicts nothing (the new
    leader decides anew)."""
    kube = _NodeGone({"node-1"})
    answers = iter([True, False])
    executor = Executor(cast(Kube, kube), cast(Recorder, None), may_act=lambda: next(answers))
    eviction = Evict("ns", "web-1", "uid-1", policy="Eviction", reserved_node="node-1")
    outcome = await executor.run(Plan().then(eviction))
    assert kube.evicted == []
    assert not outcome.done


async def test_a_lease_lost_after_a_create_leaves_it_unrecorded() -> None:
    """Unrecorded, the placeholder is a stray to the next leader, which deletes it; a
    record written after the lease ran out could overwrite that leader's own."""
    kube = _RecordRefused()  # its patch would raise: it must not be called
    answers = iter([True, False])
    executor = Executor(cast(Kube, kube), cast(Recorder, None), may_act=lambda: next(answers))
    record = Record(RESERVATIONS, "r", "berth.sh/placeholder")
    body = {"metadata": {"generateName": "berth-placeholder-r-"}}
    outcome = await executor.run(Plan().then(Create(PODS, body, namespace="ns", record=record)))
    assert outcome.error is None


class _Exists:
    """An API server that answers every create 409 AlreadyExists."""

    async def create(self, *_: object, **__: object) -> object:
        raise KubeError(409, {"message": "already exists", "reason": "AlreadyExists"})


async def test_an_object_made_before_is_done_but_a_generated_name_collision_is_not() -> None:
    """A named create answered AlreadyExists was made by an earlier pass; a generated
    name's collision (where the API server does not retry it) made nothing, and the
    placeholder is neither made nor recorded: the pass fails and is tried again."""
    executor = Executor(cast(Kube, _Exists()), cast(Recorder, None))
    named = await executor.run(Plan().then(Create(RESERVATIONS, {"metadata": {"name": "r"}})))
    assert named.done
    body = {"metadata": {"generateName": "berth-placeholder-r-"}}
    record = Record(RESERVATIONS, "r", "berth.sh/placeholder")
    generated = await executor.run(Plan().then(Create(PODS, body, namespace="ns", record=record)))
    assert not generated.done
