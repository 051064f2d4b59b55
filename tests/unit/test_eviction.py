"""One set of rules for the pods Berth never migrates: arbitration (a Pending job for the
pod) and `kubectl migrate node` (whether it creates a job at all) refuse the same pods,
with the same reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from berth.api import keys
from berth.eviction import eviction_cost, forbidden, is_healthy
from berth.protocol import controlled_key, is_object_name
from berth.settings import MigrationControllerArgs
from cli.migrate import job_for, why_not_migratable
from controller.arbitration import Snapshot, arbitrate
from tests.unit.builders import T0, job, placeholder, pod, ts

Object = dict[str, Any]

NEVER = str(keys.EVICTION_COST_NEVER)
RS_OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-rs", "uid": "uid-web-rs"}
RESERVATION_OWNER = {
    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
    "kind": "Reservation",
    "name": "uid-job-1",
    "uid": "uid-rsv-uid-job-1",
    "controller": True,
}
"""A placeholder's owner, as the controller creates it: its Reservation, as controller."""


def owned_by(*owners: Object) -> Callable[[Object], object]:
    return lambda target: target["metadata"].update(ownerReferences=list(owners))


def annotated(**annotations: str) -> Callable[[Object], object]:
    return lambda target: target["metadata"]["annotations"].update(annotations)


def phase(value: str) -> Callable[[Object], object]:
    return lambda target: target["status"].update(phase=value)


def terminating(target: Object) -> None:
    target["metadata"]["deletionTimestamp"] = ts(T0)


def unchanged(_target: Object) -> None:
    pass


PODS = [
    pytest.param(pod(), unchanged, None, id="running pod of a ReplicaSet"),
    pytest.param(
        placeholder(node="node-0"),
        owned_by(RESERVATION_OWNER),
        "pod is a Berth placeholder (it holds Reservation uid-job-1)",
        id="placeholder",
    ),
    pytest.param(pod(node=None), unchanged, "pod is not scheduled to a node", id="unscheduled"),
    pytest.param(pod(), terminating, "pod is terminating", id="terminating"),
    pytest.param(pod(), phase("Succeeded"), "pod has completed", id="completed"),
    pytest.param(
        pod(), phase("Failed"), "pod has failed (its controller replaces it)", id="failed"
    ),
    pytest.param(
        pod(rs=None),
        phase("Failed"),
        "pod has no owner to recreate it (evictFailedBarePods allows failed ones)",
        id="failed bare pod",
    ),
    *[
        pytest.param(
            pod(),
            annotated(**{keys.EVICTION_COST: cost}),
            f"eviction cost is MaxInt32 ({keys.EVICTION_COST})",
            id=f"eviction cost {cost!r}",
        )
        for cost in (NEVER, f"+{NEVER}", f"0{NEVER}", "9999999999")
    ],
    *[
        pytest.param(pod(), annotated(**{keys.EVICTION_COST: cost}), None, id=f"cost {cost!r}")
        for cost in ("100", "-5", "2147483646", "cheap", "")
    ],
    pytest.param(
        pod(),
        annotated(**{"kubernetes.io/config.mirror": "abc", "kubernetes.io/config.source": "file"}),
        "pod is a static pod (its kubelet runs it from a manifest)",
        id="mirror pod",
    ),
    pytest.param(
        pod(),
        annotated(**{"kubernetes.io/config.source": "http"}),
        "pod is a static pod (its kubelet runs it from a manifest)",
        id="static pod without the mirror annotation",
    ),
    pytest.param(
        pod(), annotated(**{"kubernetes.io/config.source": "api"}), None, id="config source api"
    ),
    pytest.param(
        pod(),
        owned_by({**RS_OWNER, "kind": "DaemonSet", "controller": True}),
        "pod is a DaemonSet pod",
        id="DaemonSet pod",
    ),
    pytest.param(
        pod(),
        owned_by({**RS_OWNER, "controller": True}, {**RS_OWNER, "kind": "DaemonSet"}),
        "pod is a DaemonSet pod",
        id="DaemonSet among its owners",
    ),
    pytest.param(
        pod(rs=None),
        unchanged,
        "pod has no owner to recreate it (evictFailedBarePods allows failed ones)",
        id="bare pod",
    ),
    pytest.param(
        pod(),
        owned_by({**RS_OWNER, "kind": "ConfigMap"}),
        "pod has no owner to recreate it (evictFailedBarePods allows failed ones)",
        id="owned, but by no controller",
    ),
]


def arbitration_refuses(target: Object) -> str | None:
    """What a round with the default configuration says of a Pending job for the pod:
    the ForbiddenMigratePod message, or None when the job is admitted."""
    metadata = target["metadata"]
    pending = job(pod_name=metadata["name"], phase="Pending", pod_uid=None)
    controller = next(
        (o["uid"] for o in metadata.get("ownerReferences") or () if o.get("controller")), None
    )
    snapshot = Snapshot(
        pending=[pending],
        in_flight=[],
        pods={f"{metadata['namespace']}/{metadata['name']}": target},
        workload_of={},
        pods_of_workload=(
            {controlled_key(metadata["namespace"], controller): [target]} if controller else {}
        ),
        args=MigrationControllerArgs(),
        now=T0,
    )
    (decision,) = arbitrate(snapshot).decisions
    if decision.verdict == "admit":
        return None
    assert (decision.verdict, decision.reason) == ("fail", "ForbiddenMigratePod")
    return decision.message


@pytest.mark.parametrize(("target", "change", "reason"), PODS)
def test_arbitration_and_kubectl_migrate_refuse_the_same_pods(
    target: Object, change: Callable[[Object], object], reason: str | None
) -> None:
    change(target)
    assert arbitration_refuses(target) == reason
    assert why_not_migratable(target) == reason


@pytest.mark.parametrize("lifted", [False, True])
def test_evict_failed_bare_pods_lifts_only_the_bare_pod_rule(lifted: bool) -> None:
    failed_bare, failed = pod(rs=None), pod()
    for target in (failed_bare, failed):
        target["status"]["phase"] = "Failed"
    assert (forbidden(failed_bare, evict_failed_bare_pods=lifted) is None) is lifted
    assert forbidden(failed, evict_failed_bare_pods=lifted) == (
        "pod has failed (its controller replaces it)"
    )


@pytest.mark.parametrize(
    ("annotations", "cost"),
    [({}, 0), ({keys.EVICTION_COST: "7"}, 7), ({keys.EVICTION_COST: "-5"}, -5),
     ({keys.EVICTION_COST: "cheap"}, 0), ({keys.EVICTION_COST: NEVER}, 2**31 - 1),
     ({keys.EVICTION_COST: str(-(2**31))}, -(2**31)),
     ({keys.EVICTION_COST: "-99999999999999"}, 0)],
)  # fmt: skip
def test_eviction_cost(annotations: dict[str, str], cost: int) -> None:
    assert eviction_cost(annotations) == cost


@pytest.mark.parametrize(
    ("change", "healthy"),
    [
        (unchanged, True),
        (terminating, False),
        (phase("Pending"), False),
        (lambda target: target["status"].update(conditions=[]), False),
    ],
)
def test_is_healthy(change: Callable[[Object], object], healthy: bool) -> None:
    target = pod()
    change(target)
    assert is_healthy(target) is healthy


@pytest.mark.parametrize("name", ["a" * 39 + ".b", "a" * 39 + "-b", "web-0"])
def test_kubectl_migrates_job_name_is_an_object_name_whatever_the_pod_is_called(name: str) -> None:
    target = {"metadata": {"name": name, "namespace": "default", "uid": "u"}}
    made = job_for(target, to=None, mode="ReservationFirst", ttl="5m", paused=False)
    assert is_object_name(made["metadata"]["name"])
    assert ".-" not in made["metadata"]["name"]


def test_kubectl_migrate_leaves_mode_and_ttl_to_the_controller_unless_given() -> None:
    """A mode not given is the controller's defaultJobMode (it records it), but a pin
    needs a Reservation; a ttl not given is none (`migrate node`'s default)."""
    target = {"metadata": {"name": "web", "namespace": "default", "uid": "u"}}
    plain = job_for(target, to=None, mode=None, ttl=None, paused=False)["spec"]
    assert "mode" not in plain
    assert "ttl" not in plain
    pinned = job_for(target, to="node-2", mode=None, ttl="5m", paused=True)["spec"]
    assert (pinned["mode"], pinned["ttl"], pinned["paused"]) == ("ReservationFirst", "5m", True)
    assert "reservationOptions" in pinned
    chosen = job_for(target, to=None, mode="EvictDirectly", ttl="1m", paused=False)["spec"]
    assert (chosen["mode"], chosen["ttl"]) == ("EvictDirectly", "1m")
