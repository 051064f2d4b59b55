"""Who may own a Reservation (berth.protocol.may_claim, is_placeholder_of) and what the
controller does with its claim (controller.reservations): one acceptable claimer is
recorded, several are refused, a claim no pod took in time is released; tokens are only
ever shown as fingerprints."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from berth import protocol
from berth.api import keys
from controller import reservations
from controller.actions import Event, Patch
from tests.unit.builders import T0, later, placeholder, pod, reservation, ts
from tests.unit.controller_cases import kinds, rsv_plan, status_of

TOKEN = "0123456789abcdef0123456789abcdef"


def claimed(*, at: Any = T0) -> dict[str, Any]:
    rsv = reservation(
        phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true", keys.CLAIM: TOKEN}
    )
    rsv["metadata"]["resourceVersion"] = "42"
    rsv["metadata"]["managedFields"] = [
        {
            "manager": "berth-webhook",
            "operation": "Update",
            "time": ts(at),
            "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{keys.CLAIM}": {}}}},
        }
    ]
    return rsv


def claimer(name: str = "web-2", **kwargs: Any) -> dict[str, Any]:
    return pod(
        name, node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: TOKEN}, **kwargs
    )


@pytest.mark.parametrize(
    ("pod_kwargs", "controller_uid", "workload_uid", "expected"),
    [
        pytest.param({}, "uid-web-rs", None, True, id="the owner controller"),
        pytest.param({}, "other", "uid-deploy", False, id="another workload"),
        pytest.param({}, None, None, False, id="controller not resolved"),
        pytest.param({"namespace": "x"}, "uid-web-rs", None, False, id="another namespace"),
        pytest.param(
            {"cpu": "2"}, "uid-web-rs", None, False, id="made larger than the place holds"
        ),
    ],
)
def test_may_claim(
    pod_kwargs: dict[str, Any], controller_uid: str | None, workload_uid: str | None, expected: bool
) -> None:
    rsv = claimed()
    assert (
        protocol.may_claim(
            rsv, claimer(**pod_kwargs), controller_uid=controller_uid, workload_uid=workload_uid
        )
        is expected
    )


@pytest.mark.parametrize(
    ("labels", "rs", "expected"),
    [
        pytest.param({"tier": "db"}, "web-rs", True, id="its controller and its labels"),
        pytest.param({"app": "web"}, "web-rs", False, id="its controller, not its labels"),
        pytest.param({"tier": "db"}, "other-rs", False, id="its labels, not its controller"),
    ],
)
def test_every_field_an_owner_sets_must_match_for_webhook_and_controller_alike(
    labels: dict[str, str], rs: str, expected: bool
) -> None:
    """An owner naming a controller and a label selector names the pods of that
    controller with those labels: the webhook (binding a replacement) and the controller
    (recording the pod that claimed) read it the same way, or the webhook binds a pod the
    controller never records, which holds the place until it is let go."""
    rsv = claimed()
    rsv["spec"]["owners"][0]["labelSelector"] = {"matchLabels": {"tier": "db"}}
    new = claimer(labels=labels, rs=rs)
    assert protocol.matches_owner(rsv, new, workload_uid=None) is expected
    assert protocol.may_claim(rsv, new, controller_uid=f"uid-{rs}", workload_uid=None) is expected


def test_an_owner_with_nothing_but_an_empty_selector_names_no_pod() -> None:
    rsv = claimed()
    rsv["spec"]["owners"] = [{"labelSelector": {}}]
    assert not protocol.matches_owner(rsv, claimer(rs="web-rs"), workload_uid=None)
    assert not protocol.may_claim(rsv, claimer(), controller_uid="uid-web-rs", workload_uid=None)


def test_may_claim_by_the_reserved_workload() -> None:
    rsv = claimed()
    rsv["metadata"]["annotations"][keys.WORKLOAD] = "uid-deploy"
    assert protocol.may_claim(rsv, claimer(), controller_uid="new-rs", workload_uid="uid-deploy")


def test_a_placeholder_is_the_pod_the_reservation_controls() -> None:
    rsv = reservation()
    name = rsv["metadata"]["name"]
    assert protocol.is_placeholder_of(placeholder(name), rsv)
    labelled = pod("forger", labels={keys.RESERVATION_LABEL: name})
    assert not protocol.is_placeholder_of(labelled, rsv)
    assert protocol.placeholder_reservation(labelled) is None
    elsewhere = placeholder(name)
    elsewhere["metadata"]["namespace"] = "other"
    assert not protocol.is_placeholder_of(elsewhere, rsv)


def test_a_placeholder_is_the_pod_the_controller_recorded() -> None:
    """The Reservation's UID is readable by everyone who may read Reservations: a pod
    with the very owner reference the controller writes is still not its placeholder."""
    rsv = reservation()
    name = rsv["metadata"]["name"]
    forged = placeholder(name)
    forged["metadata"].update(name="forger", uid="uid-forger")
    forged["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = True
    assert protocol.placeholder_reservation(forged) == name  # kept out of claims, evictions
    assert not protocol.is_placeholder_of(forged, rsv)
    unrecorded = reservation()
    del unrecorded["metadata"]["annotations"][keys.PLACEHOLDER]
    assert protocol.recorded_placeholder(unrecorded) is None
    assert not protocol.is_placeholder_of(placeholder(name), unrecorded)
    garbled = reservation(annotations={keys.PLACEHOLDER: "not json"})
    assert protocol.recorded_placeholder(garbled) is None


@pytest.mark.parametrize(
    ("change", "holds"),
    [
        pytest.param({}, True, id="bound to the node, running"),
        pytest.param({"node": None}, False, id="not bound yet"),
        pytest.param({"node": "node-2"}, False, id="bound elsewhere"),
        pytest.param({"phase": "Failed"}, False, id="failed"),
        pytest.param({"phase": "Succeeded"}, False, id="succeeded"),
        pytest.param({"gone": True}, False, id="gone"),
    ],
)
def test_a_placeholder_holds_the_place_bound_there_and_not_finished(
    change: dict[str, Any], holds: bool
) -> None:
    """The one judgement the Reservation's pass and a job about to evict share."""
    rsv = reservation(phase="Available", node="node-1")
    held = placeholder(rsv["metadata"]["name"], node=change.get("node", "node-1"))
    if "phase" in change:
        held["status"]["phase"] = change["phase"]
    assert protocol.placeholder_holds(rsv, None if change.get("gone") else held) is holds


def test_claimed_at_reads_managed_fields() -> None:
    assert protocol.claimed_at(claimed(at=later(5))) == later(5)
    assert protocol.claimed_at(reservation()) is None


def test_the_one_acceptable_claimer_is_recorded() -> None:
    pod_ = claimer()
    plan = rsv_plan(claimed(), ph=placeholder(), claimers=(pod_,), accepted=(pod_,))
    assert status_of(plan)["currentOwners"][0]["uid"] == "uid-web-2"


def test_an_unacceptable_claimer_is_not_recorded() -> None:
    plan = rsv_plan(claimed(), ph=placeholder(node="node-1"), claimers=(claimer(),), accepted=())
    assert "UpdateStatus:reservations" not in kinds(plan)
    assert plan.requeue_after == pytest.approx(1)


def test_several_claimers_are_refused_with_a_fingerprint() -> None:
    one, two = claimer("web-2"), claimer("web-3")
    plan = rsv_plan(
        claimed(), ph=placeholder(node="node-1"), claimers=(one, two), accepted=(one, two)
    )
    assert "UpdateStatus:reservations" not in kinds(plan)
    [event] = [a for a in plan.actions if isinstance(a, Event)]
    assert protocol.fingerprint(TOKEN) in event.message
    assert TOKEN not in event.message


@pytest.mark.parametrize("claimers", [0, 1, 2])
def test_a_claim_no_pod_took_in_time_is_released(claimers: int) -> None:
    pods = tuple(claimer(f"web-{i}") for i in range(claimers))
    now = T0 + protocol.CLAIM_BOUND + timedelta(seconds=1)
    plan = rsv_plan(claimed(), ph=placeholder(node="node-1"), claimers=pods, accepted=(), now=now)
    [patch] = [a for a in plan.actions if isinstance(a, Patch)]
    assert patch.json_patch
    assert patch.patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    assert patch.patch[1]["value"] == TOKEN
    assert patch.patch[2] == {"op": "remove", "path": "/metadata/annotations/berth.sh~1claim"}
    assert all(TOKEN not in a.message for a in plan.actions if isinstance(a, Event))


def test_a_young_claim_is_kept_and_looked_at_when_due() -> None:
    plan = rsv_plan(claimed(), ph=placeholder(node="node-1"), now=later(10))
    assert not [a for a in plan.actions if isinstance(a, Patch)]
    assert plan.requeue_after == pytest.approx(20)


def test_a_stray_gate_event_shows_only_a_fingerprint() -> None:

    plan = reservations.stray(claimer(), holders=[], node_gone=False, now=later(60))
    [event] = [a for a in plan.actions if isinstance(a, Event)]
    assert protocol.fingerprint(TOKEN) in event.message
    assert TOKEN not in event.message
