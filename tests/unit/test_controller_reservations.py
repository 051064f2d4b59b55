"""The Reservation lifecycle (controller.reservations): placeholder, handover, expiry,
clean-up, and the release of stray gates."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from berth import protocol
from berth.api import keys
from berth.kube.client import PODMIGRATIONJOBS, PODS, RESERVATIONS
from controller import build, reservations
from controller.actions import Create, Delete, Event, Patch, Record, UpdateStatus
from tests.unit.builders import T0, later, placeholder, pod, reservation, ts
from tests.unit.controller_cases import (
    cond,
    kinds,
    rsv_plan,
    status_of,
    view_plan,
)


def test_new_reservation_gets_a_placeholder_recorded_from_the_create() -> None:
    plan = rsv_plan(reservation())
    assert kinds(plan) == ["Create:pods"]
    create = plan.actions[0]
    assert isinstance(create, Create)
    assert create.body["metadata"]["generateName"] == "berth-placeholder-uid-job-1-"
    assert "name" not in create.body["metadata"]  # no name to take in advance
    assert create.record == Record(RESERVATIONS, "uid-job-1", keys.PLACEHOLDER)


def stray(name: str = "forger") -> dict[str, Any]:
    """A pod naming the Reservation as its controller, that it did not record."""
    obj = placeholder()
    obj["metadata"].update(name=name, uid=f"uid-{name}")
    return obj


@pytest.mark.parametrize(
    ("rsv", "ph", "then"),
    [
        pytest.param(reservation(), placeholder(node=None), [], id="beside its placeholder"),
        pytest.param(reservation(), None, ["Create:pods"], id="before a new placeholder"),
        pytest.param(
            reservation(phase="Failed"), placeholder(), ["Delete:pods"], id="once it has ended"
        ),
    ],
)
def test_a_stray_is_deleted_by_uid_and_said_so_on_it(
    rsv: dict[str, Any], ph: dict[str, Any] | None, then: list[str]
) -> None:
    plan = rsv_plan(rsv, ph=ph, strays=(stray(),))
    assert kinds(plan)[:2] == ["Delete:pods", "Event:StrayPlaceholderDeleted"]
    assert kinds(plan)[2:][: len(then)] == then
    delete, event = plan.actions[:2]
    assert isinstance(delete, Delete)
    assert (delete.name, delete.namespace, delete.uid) == ("forger", "default", "uid-forger")
    assert isinstance(event, Event)
    assert event.involved["metadata"]["uid"] == "uid-forger"
    assert event.type == "Warning"
    assert "is not its placeholder" in event.message


def test_a_stray_never_makes_the_reservation_available() -> None:
    """The pending Reservation's placeholder waits; a stray bound to a node changes nothing."""
    plan = rsv_plan(reservation(), ph=placeholder(node=None), strays=(stray(),))
    statuses = [a.obj["status"] for a in plan.actions if isinstance(a, UpdateStatus)]
    assert statuses
    assert all(status["phase"] == "Pending" for status in statuses)


def test_a_placeholder_runs_under_its_non_preempting_class_created_first() -> None:
    """The class alone first: the API server's admission refuses a pod whose class its
    cache has not seen yet, so the placeholder comes on a later pass."""
    never = build.non_preempting_class(1000)
    plan = rsv_plan(reservation(), priority_class=never)
    assert kinds(plan) == ["Create:priorityclasses"]
    [create_class] = plan.actions
    assert isinstance(create_class, Create)
    assert create_class.body == never
    assert plan.requeue_after is not None
    # Once the caches hold the class, only the placeholder is created.
    known = rsv_plan(reservation(), priority_class=never, priority_class_found=never)
    assert kinds(known) == ["Create:pods"]
    [create_pod] = known.actions
    assert isinstance(create_pod, Create)
    assert create_pod.body["spec"]["priorityClassName"] == "berth-non-preempting-1000"


@pytest.mark.parametrize(
    ("found", "shown"),
    [
        pytest.param(
            {"preemptionPolicy": "PreemptLowerPriority"},
            "value 1000 and preemptionPolicy PreemptLowerPriority",
            id="preempts",
        ),
        pytest.param({"value": 999}, "value 999 and preemptionPolicy Never", id="another value"),
        pytest.param(
            {"preemptionPolicy": None},
            "value 1000 and preemptionPolicy PreemptLowerPriority",
            id="the API's default policy",
        ),
    ],
)
def test_no_placeholder_under_a_class_made_otherwise(found: dict[str, Any], shown: str) -> None:
    """Someone made `berth-non-preempting-1000` before Berth, with preemption on or another
    value: no placeholder runs under it; the Reservation says why, with a Warning event
    naming the class, and looks again later."""
    never = build.non_preempting_class(1000)
    forged = {**never, **found}
    plan = rsv_plan(reservation(), priority_class=never, priority_class_found=forged)
    assert kinds(plan) == ["UpdateStatus:reservations", "Event:PriorityClassMismatch"]
    status = status_of(plan)
    [scheduled] = [c for c in status["conditions"] if c["type"] == "Scheduled"]
    assert (status["phase"], scheduled["status"], scheduled["reason"]) == (
        "Pending",
        "False",
        "PriorityClassMismatch",
    )
    message = f"PriorityClass berth-non-preempting-1000 has {shown}, not value 1000"
    assert message in scheduled["message"]
    [event] = [a for a in plan.actions if isinstance(a, Event)]
    assert (event.type, event.reason) == ("Warning", "PriorityClassMismatch")
    assert message in event.message
    assert plan.requeue_after is not None
    assert plan.requeue_after <= 10
    # Said once: the next look, with the condition written, writes nothing.
    again = rsv_plan(
        {**reservation(), "status": status}, priority_class=never, priority_class_found=forged
    )
    assert kinds(again) == []


def test_reservation_without_template_namespace_places_its_placeholder_by_its_owner() -> None:
    rsv = reservation()
    del rsv["spec"]["template"]["metadata"]
    plan = rsv_plan(rsv)
    create = plan.actions[0]
    assert isinstance(create, Create)
    assert create.namespace == "default"
    assert create.body["metadata"]["namespace"] == "default"


def test_bound_placeholder_makes_the_reservation_available() -> None:
    plan = rsv_plan(reservation(), ph=placeholder(node="node-1"))
    status = status_of(plan)
    assert (status["phase"], status["nodeName"]) == ("Available", "node-1")
    assert status["allocatable"] == {"cpu": "200m"}


def test_claimer_is_recorded_as_owner() -> None:
    rsv = reservation(
        phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true", keys.CLAIM: "tok"}
    )
    claimer = pod(
        "web-2", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "tok"}
    )
    plan = rsv_plan(rsv, ph=placeholder(), claimer=claimer)
    assert status_of(plan)["currentOwners"][0]["uid"] == "uid-web-2"


def test_a_claim_on_a_reservation_that_lost_its_place_is_released_not_recorded() -> None:
    """The placeholder was lost after the webhook's claim (the Reservation is Pending, no
    node): recording the claimer would start a handover to no node."""
    rsv = reservation(
        phase="Pending", node=None, annotations={keys.CONSUMABLE: "true", keys.CLAIM: "tok"}
    )
    claimer = pod(
        "web-2", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "tok"}
    )
    plan = rsv_plan(rsv, ph=placeholder(node=None), claimer=claimer)
    assert kinds(plan) == ["Patch:reservations", "Event:ReservationClaimReleased"]


def finished(obj: dict[str, Any]) -> dict[str, Any]:
    obj["status"]["phase"] = "Failed"
    return obj


@pytest.mark.parametrize(
    ("ph", "node_gone", "node_refuses"),
    [
        pytest.param(None, False, None, id="placeholder gone (preempted, deleted)"),
        pytest.param(finished(placeholder()), False, None, id="placeholder finished"),
        pytest.param(placeholder(), True, None, id="its node deleted"),
        pytest.param(placeholder(), False, "node node-1 is cordoned", id="its node cordoned"),
    ],
)
def test_a_claim_on_a_place_lost_before_this_pass_is_never_handed_over(
    ph: dict[str, Any] | None, node_gone: bool, node_refuses: str | None
) -> None:
    """Still Available as last written, but nothing holds the place now: the claimer is
    not recorded (a handover would send it to a node where nothing waits for it); the
    place is found lost first, and the claim released on the next pass."""
    rsv = reservation(
        phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true", keys.CLAIM: "tok"}
    )
    claimer = pod(
        "web-2", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "tok"}
    )
    plan = rsv_plan(rsv, ph=ph, claimer=claimer, node_gone=node_gone, node_refuses=node_refuses)
    assert "UpdateStatus:reservations" in kinds(plan)
    assert "Event:ReservationClaimed" not in kinds(plan)
    status = status_of(plan)
    assert (status["phase"], status.get("currentOwners")) == ("Pending", None)


def test_an_owner_recorded_on_a_reservation_without_a_node_is_let_go() -> None:
    rsv = reservation(phase="Pending", node=None, owners=["web-2"])
    owner = pod("web-2", node=None, gates=[keys.RESERVATION_GATE])
    status = status_of(rsv_plan(rsv, ph=None, owner=owner))
    assert status["phase"] == "Failed"


Step = reservations.Step


@pytest.mark.parametrize(
    ("placeholder_exists", "nominated", "gated", "expected"),
    [
        # The placeholder holds the node: nominate the owner first, then free the place.
        (True, False, True, Step.NOMINATE),
        (True, True, True, Step.FREE),
        # Never ungated while the placeholder is there (it would fail to fit and lose its
        # nomination, or preempt a pod of lower priority): free the place first.
        (True, True, False, Step.FREE),
        (True, False, False, Step.NOMINATE),
        # The place is free: lift the gate of a nominated owner, nominating it first if
        # it is not.
        (False, True, True, Step.UNGATE),
        (False, False, True, Step.NOMINATE_AND_UNGATE),
        # Ungated: the scheduler binds it; if it cleared the nomination, set it again.
        (False, True, False, Step.WAIT),
        (False, False, False, Step.RENOMINATE),
    ],
)
def test_handover_step_order(
    placeholder_exists: bool, nominated: bool, gated: bool, expected: reservations.Step
) -> None:
    assert (
        reservations.handover_step(placeholder=placeholder_exists, nominated=nominated, gated=gated)
        == expected
    )


def nominated(owner: dict[str, Any], node: str | None = "node-1") -> dict[str, Any]:
    return {**owner, "status": {**owner.get("status", {}), "nominatedNodeName": node}}


def test_handover_nominates_then_deletes_the_placeholder_then_ungates() -> None:
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    owner = pod("web-2", node=None, gates=[keys.RESERVATION_GATE, "other/gate"])
    owner["status"] = {"phase": "Pending"}

    first = rsv_plan(rsv, ph=placeholder(), owner=owner)
    assert kinds(first) == ["Patch:pods"]
    nominate = first.actions[0]
    assert isinstance(nominate, Patch)
    assert (nominate.subresource, nominate.json_patch) == ("status", False)
    assert nominate.patch == {
        "metadata": {"uid": "uid-web-2"},
        "status": {"nominatedNodeName": "node-1"},
    }
    assert (nominate.name, nominate.namespace) == ("web-2", "default")

    second = rsv_plan(rsv, ph=placeholder(), owner=nominated(owner))
    assert kinds(second) == ["Delete:pods"]
    delete = second.actions[0]
    assert isinstance(delete, Delete)
    assert delete.uid
    assert delete.grace_period_seconds == 0

    third = rsv_plan(rsv, ph=None, owner=nominated(owner))
    assert kinds(third) == ["Patch:pods", "Event:ReservationHandover"]
    ungate = third.actions[0]
    assert isinstance(ungate, Patch)
    assert ungate.json_patch
    assert ungate.subresource is None
    assert ungate.patch[0] == {"op": "test", "path": "/metadata/uid", "value": "uid-web-2"}
    assert ungate.patch[-1] == {"op": "remove", "path": "/spec/schedulingGates/0"}


def test_an_owner_nominated_elsewhere_is_nominated_to_the_reservations_node() -> None:
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    owner = nominated(pod("web-2", node=None, gates=[keys.RESERVATION_GATE]), "node-2")
    plan = rsv_plan(rsv, ph=placeholder(), owner=owner)
    assert kinds(plan) == ["Patch:pods"]
    assert plan.actions[0].patch["status"] == {"nominatedNodeName": "node-1"}  # type: ignore[union-attr]


def test_an_owner_whose_nomination_the_scheduler_cleared_is_nominated_again() -> None:
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    ungated = pod("web-2", node=None)
    assert kinds(rsv_plan(rsv, ph=None, owner=nominated(ungated, None))) == ["Patch:pods"]
    assert kinds(rsv_plan(rsv, ph=None, owner=nominated(ungated))) == []


def test_a_released_reservation_clears_the_nomination_it_set() -> None:
    failed = reservation(phase="Failed", node="node-1", owners=["web-2"])
    owner = nominated(pod("web-2", node=None, gates=[keys.RESERVATION_GATE]))
    plan = rsv_plan(failed, ph=None, owner=owner)
    assert kinds(plan) == ["Patch:pods", "Event:ReservationReleased", "Patch:pods"]
    clear = plan.actions[-1]
    assert isinstance(clear, Patch)
    assert (clear.subresource, clear.patch["status"]) == ("status", {"nominatedNodeName": None})


def test_bound_owner_makes_the_reservation_succeeded() -> None:
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    plan = rsv_plan(rsv, owner=pod("web-2", node="node-1"))
    assert status_of(plan)["phase"] == "Succeeded"


def test_expired_reservation_fails_then_cleans_up_and_lets_the_pod_go() -> None:
    rsv = reservation(phase="Available", node="node-1", ttl="1m")
    assert status_of(rsv_plan(rsv, ph=placeholder(), now=later(61)))["phase"] == "Failed"
    failed = reservation(phase="Failed", node="node-1", owners=["web-2"])
    gated = pod("web-2", node=None, gates=[keys.RESERVATION_GATE])
    plan = rsv_plan(failed, ph=placeholder(), owner=gated)
    assert kinds(plan) == ["Delete:pods", "Patch:pods", "Event:ReservationReleased"]


DAY = 24 * 3600


@pytest.mark.parametrize(
    ("ttl", "expected"), [("0s", None), ("0", None), ("90s", 90), ("500ns", 0), ("0.5us", 0)]
)
def test_a_ttl_of_zero_never_expires(ttl: str, expected: int | None) -> None:
    """Koordinator's Reservation API: "Set 0 to disable expiration". A ttl under a
    microsecond is not zero: it has run out (as in Go), it does not hold for ever."""
    rsv = reservation(phase="Available", node="node-1", ttl=ttl)
    found = protocol.expires_at(rsv)
    assert found == (protocol.NEVER if expected is None else later(expected))
    plan = rsv_plan(rsv, ph=placeholder(), now=later(365 * DAY))
    assert expected is not None or plan.requeue_after == reservations.LOOK_AGAIN


@pytest.mark.parametrize(
    ("expires", "expected"),
    [
        ("2026-01-01T12:00:30Z", later(30)),
        ("2026-01-01t12:00:30z", later(30)),  # the schema's date-time lets lower case in
        ("2026-01-01T12:00:30x5Z", later(DAY)),  # and any character before a fraction
        ("0000-01-01T00:00:00Z", later(DAY)),  # and year 0
        ("2026-01-01T12:00:30", later(DAY)),  # no zone: not from the schema
    ],
)
def test_an_expiry_is_read_as_the_schema_lets_it_in_or_else_the_default_ttl(
    expires: str, expected: object
) -> None:
    """A Reservation made by hand states `expires` as its writer likes: each is read, or
    counts as absent (a day from its creation, Koordinator's default), and no pass fails
    on it."""
    rsv = reservation(phase="Available", node="node-1")
    rsv["spec"].pop("ttl", None)
    rsv["spec"]["expires"] = expires
    assert protocol.expires_at(rsv) == expected
    plan = rsv_plan(rsv, ph=placeholder(), now=later(61))
    if expected == later(30):
        assert status_of(plan)["phase"] == "Failed"
    else:
        assert "UpdateStatus:reservations" not in kinds(plan)


def test_lost_placeholder_is_recreated_and_the_reservation_pending_again() -> None:
    """Pending is written first: a plan stopped after the create (a crash, a conflict, a
    refused create) must not leave the Reservation Available where nothing holds it."""
    plan = rsv_plan(reservation(phase="Available", node="node-1"), ph=None)
    assert kinds(plan) == ["UpdateStatus:reservations", "Create:pods"]
    assert status_of(plan)["phase"] == "Pending"
    assert status_of(plan)["nodeName"] is None


def test_a_lost_placeholder_whose_class_is_still_to_be_made_says_pending_all_the_same() -> None:
    plan = rsv_plan(
        reservation(phase="Available", node="node-1"),
        ph=None,
        priority_class={"metadata": {"name": "berth-placeholder-100"}, "value": 100},
    )
    assert kinds(plan) == ["UpdateStatus:reservations", "Create:priorityclasses"]
    assert status_of(plan)["phase"] == "Pending"


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_finished_placeholder_holds_nothing(phase: str) -> None:
    """Evicted by the kubelet under node pressure (Failed), its pod object stays, but the
    scheduler counts it no more: the Reservation is Pending and a new placeholder made."""
    finished = placeholder()
    finished["status"]["phase"] = phase
    plan = rsv_plan(reservation(phase="Available", node="node-1"), ph=finished)
    assert kinds(plan) == ["UpdateStatus:reservations", "Create:pods"]
    assert status_of(plan)["phase"] == "Pending"
    pending = rsv_plan(reservation(phase="Pending", node=None), ph=finished)
    assert "UpdateStatus:reservations" not in kinds(pending)  # never Available on it
    assert kinds(pending) == ["Create:pods"]


def test_available_follows_the_placeholder_it_has() -> None:
    """Available with a placeholder not bound (made again by an older controller, which
    wrote Pending after the create), or bound to another node than the status says."""
    unbound = rsv_plan(reservation(phase="Available", node="node-1"), ph=placeholder(node=None))
    assert status_of(unbound)["phase"] == "Pending"
    moved = rsv_plan(reservation(phase="Available", node="node-1"), ph=placeholder(node="node-2"))
    assert (status_of(moved)["phase"], status_of(moved)["nodeName"]) == ("Available", "node-2")
    held = rsv_plan(reservation(phase="Available", node="node-1"), ph=placeholder(node="node-1"))
    assert "UpdateStatus:reservations" not in kinds(held)


@pytest.mark.parametrize(
    ("age", "claimed", "expected"),
    [
        (5, False, []),
        (31, False, ["Patch:pods", "Event:ReservationGateRemoved"]),
        (31, True, []),
    ],
)
def test_stray_gate_is_removed_after_a_grace_period(
    age: int, claimed: bool, expected: list[str]
) -> None:
    gated = pod(
        "web-9", node=None, gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "forged"}
    )
    plan = reservations.stray(
        gated,
        holders=[reservation()] if claimed else [],
        node_gone=False,
        now=later(age),
    )
    assert kinds(plan) == expected


@pytest.mark.parametrize(
    ("gates", "age", "held", "expected"),
    [
        pytest.param([], 31, False, ["Delete:pods", "Event:StrandedPodDeleted"], id="ungated"),
        pytest.param(
            [keys.RESERVATION_GATE],
            31,
            False,
            ["Delete:pods", "Event:StrandedPodDeleted"],
            id="gated: deleted, not let go",
        ),
        pytest.param([], 5, False, [], id="young"),
        pytest.param([], 31, True, [], id="a Reservation's own pass looks after it"),
    ],
)
def test_a_claimer_tied_to_a_deleted_node_that_no_reservation_holds_is_deleted(
    gates: list[str], age: int, held: bool, expected: list[str]
) -> None:
    tied = pod("web-9", node=None, gates=gates, annotations={keys.CLAIM: "token"})
    plan = reservations.stray(
        tied, holders=[reservation(phase="Failed")] if held else [], node_gone=True, now=later(age)
    )
    assert kinds(plan) == expected
    if expected:
        delete = plan.actions[0]
        assert isinstance(delete, Delete)
        assert delete.uid == tied["metadata"]["uid"]


def test_a_pod_without_a_claim_is_never_deleted_for_its_node() -> None:
    """A pod a user pinned to a node by name is the user's business, gone node or not."""
    pinned = pod("web-9", node=None)
    assert kinds(reservations.stray(pinned, holders=[], node_gone=True, now=later(60))) == []


def test_actions_target_the_right_resources() -> None:
    plan = view_plan(pod_obj=pod())
    assert plan.actions[0].resource is RESERVATIONS  # type: ignore[union-attr]
    assert plan.actions[1].resource is PODMIGRATIONJOBS  # type: ignore[union-attr]
    assert rsv_plan(reservation()).actions[0].resource is PODS  # type: ignore[union-attr]


def test_a_placeholder_on_a_deleted_node_is_replaced_and_holds_nothing_meanwhile() -> None:
    ph = placeholder(node="node-1")
    plan = rsv_plan(reservation(phase="Available", node="node-1"), ph=ph, node_gone=True)
    assert kinds(plan) == ["Delete:pods", "UpdateStatus:reservations"]
    delete = plan.actions[0]
    assert isinstance(delete, Delete)
    assert delete.uid == ph["metadata"]["uid"]
    status = status_of(plan)
    assert (status["phase"], status.get("nodeName")) == ("Pending", None)
    scheduled = next(c for c in status["conditions"] if c["type"] == "Scheduled")
    assert (scheduled["reason"], scheduled["status"]) == ("Lost", "False")
    assert "node-1" in scheduled["message"]


def test_a_placeholder_bound_to_a_deleted_node_never_makes_the_reservation_available() -> None:
    plan = rsv_plan(reservation(), ph=placeholder(node="node-1"), node_gone=True)
    assert kinds(plan) == ["Delete:pods"]


def tied(name: str, node: str = "node-1", **kwargs: Any) -> dict[str, Any]:
    """A replacement the webhook tied to `node`, not bound."""
    replacement = pod(name, node=None, **kwargs)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    replacement["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    return replacement


def test_an_owner_tied_to_a_deleted_node_is_deleted_and_nothing_else_happens() -> None:
    rsv = reservation(phase="Available", node="node-1", owners=["web-2"])
    owner = nominated(tied("web-2", gates=[keys.RESERVATION_GATE]))
    plan = rsv_plan(rsv, ph=placeholder(node="node-1"), owner=owner, stranded=(owner,))
    assert kinds(plan) == ["Delete:pods", "Event:StrandedPodDeleted"]
    delete, event = plan.actions
    assert isinstance(delete, Delete)
    assert isinstance(event, Event)
    assert (delete.name, delete.uid) == ("web-2", owner["metadata"]["uid"])
    assert event.type == "Warning"
    assert "node-1" in event.message
    assert plan.requeue_after is not None
    # Once it is gone, the Reservation fails OwnerGone and lets the place go.
    assert status_of(rsv_plan(rsv, ph=placeholder(node="node-1"), owner=None))["phase"] == "Failed"


def test_a_claimer_tied_to_a_deleted_node_is_deleted_not_recorded() -> None:
    """The node went in the moments between the webhook's claim and its record: the claimer
    could never be scheduled, and recording it would hand it a place it cannot reach."""
    rsv = reservation(
        phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true", keys.CLAIM: "tok"}
    )
    claimer = tied("web-2", gates=[keys.RESERVATION_GATE], annotations={keys.CLAIM: "tok"})
    plan = rsv_plan(rsv, ph=placeholder(node="node-1"), claimer=claimer, stranded=(claimer,))
    assert kinds(plan) == ["Delete:pods", "Event:StrandedPodDeleted"]


def test_an_ended_reservation_deletes_a_pod_tied_to_a_deleted_node_rather_than_ungate_it() -> None:
    failed = reservation(phase="Failed", node="node-1", owners=["web-2"])
    owner = tied("web-2", gates=[keys.RESERVATION_GATE])
    plan = rsv_plan(failed, ph=None, owner=owner, stranded=(owner,))
    assert kinds(plan) == ["Delete:pods", "Event:StrandedPodDeleted"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param(
            {"template": {}}, "template.spec.containers is empty", id="a template without a spec"
        ),
        pytest.param(
            {"template": {"spec": {"containers": []}}},
            "template.spec.containers is empty",
            id="a template without containers",
        ),
        pytest.param(
            {"template": {"spec": {"containers": "app"}}},
            "AttributeError",
            id="containers a string",
        ),
        pytest.param(
            {
                "template": {
                    "spec": {
                        "containers": [{"name": "a", "resources": {"requests": {"cpu": "abc"}}}]
                    }
                }
            },
            "invalid quantity 'abc'",
            id="an unreadable quantity",
        ),
        pytest.param(
            {"ttl": "2562048h"}, "longer than a Go duration can be", id="a ttl beyond Go's"
        ),
    ],
)
def test_a_reservation_berth_cannot_make_a_place_for_fails_once_saying_why(
    change: dict[str, Any], problem: str
) -> None:
    """The schema lets these in (a template is free-form); no placeholder can be made from
    them: the Reservation fails at once (Ready=False, Invalid) with a Warning event, rather
    than every pass raising until someone notices."""
    rsv = reservation()
    rsv["spec"].update(change)
    plan = rsv_plan(rsv)
    assert kinds(plan) == ["UpdateStatus:reservations", "Event:Invalid"]
    status = status_of(plan)
    assert status["phase"] == "Failed"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Invalid")
    assert problem in ready["message"]


def rsv_view(rsv: dict[str, Any]) -> reservations.ReservationView:
    return reservations.ReservationView(
        reservation=rsv, placeholder=None, claimers=(), accepted=(), owner=None, now=T0,
        image="pause",
    )  # fmt: skip


@pytest.mark.parametrize("name", ["rsv-1", "r" * 60])
def test_a_placeholder_the_api_server_refuses_is_said_on_the_reservation_once(name: str) -> None:
    """A ResourceQuota, Pod Security or an admission webhook refuses the placeholder: the
    Reservation says so (its job would otherwise wait "for the scheduler" until its TTL),
    once per message; the create is tried again after the API-error back-off. The name
    the API server generated for each attempt is left out: a message that differed each
    time would be written each time, and each write would bring the Reservation straight
    back to the queue, and the create with it, without any back-off."""
    rsv = reservation(phase="Pending", node=None)
    rsv["metadata"]["name"] = name
    # The API server keeps 58 characters of a long generateName.
    prefix = f"berth-placeholder-{name}-"[:58]
    refused = 'pods "{}" is forbidden: exceeded quota: pods, requested: pods=1'
    plan = reservations.placeholder_refused(
        rsv_view(rsv), status_code=403, message=refused.format(prefix + "wdssc")
    )
    assert kinds(plan) == ["UpdateStatus:reservations", "Event:FailedCreate"]
    scheduled = next(c for c in status_of(plan)["conditions"] if c["type"] == "Scheduled")
    assert scheduled["reason"] == "FailedCreate"
    assert "answered 403: " + refused.format(prefix + "*") in scheduled["message"]
    said = reservation(phase="Pending", node=None)
    said["metadata"]["name"] = name
    said["status"] = status_of(plan)
    again = reservations.placeholder_refused(
        rsv_view(said), status_code=403, message=refused.format(prefix + "rdv66")
    )
    assert again.actions == []


def test_a_refused_priority_class_is_said_on_the_reservation_naming_it() -> None:
    rsv = reservation(phase="Pending", node=None)
    view = replace(rsv_view(rsv), priority_class={"metadata": {"name": "berth-non-preempting-7"}})
    plan = reservations.placeholder_refused(
        view, status_code=403, message="forbidden", resource="priorityclasses"
    )
    assert kinds(plan) == ["UpdateStatus:reservations", "Event:FailedCreate"]
    scheduled = next(c for c in status_of(plan)["conditions"] if c["type"] == "Scheduled")
    assert scheduled["message"] == (
        "the placeholder's PriorityClass 'berth-non-preempting-7' cannot be created: "
        "the API server answered 403: forbidden"
    )


def refused_since(replacement: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The replacement as kube-scheduler leaves it once it finds no node for it."""
    replacement.setdefault("status", {})["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "lastTransitionTime": ts(later(seconds)),
        }
    ]
    return replacement


@pytest.mark.parametrize(
    ("holder", "refused_at", "now", "gates", "expected"),
    [
        pytest.param("Failed", 0, 31, [], ["Delete:pods", "Event:PinnedPodDeleted"],
                     id="its job ended, refused 31s"),
        pytest.param(None, 0, 31, [], ["Delete:pods", "Event:PinnedPodDeleted"],
                     id="its Reservation deleted"),
        pytest.param("Failed", 10, 31, [], [], id="refused 21s: not yet"),
        pytest.param("Available", 0, 600, [], [], id="a live Reservation: its job decides"),
        pytest.param("Failed", None, 600, [], [], id="not refused: the scheduler may bind it"),
        pytest.param("Failed", 0, 600, [keys.RESERVATION_GATE],
                     ["Patch:pods", "Event:ReservationGateRemoved"],
                     id="gated: let go first, tried by the scheduler then"),
    ],
)  # fmt: skip
def test_a_claimer_tied_to_a_node_that_keeps_refusing_it_is_deleted_once_nothing_holds_it(
    holder: str | None, refused_at: float | None, now: float, gates: list[str], expected: list[str]
) -> None:
    """The hole of the default scope: a pod of higher priority took the place in
    handover, the job timed out. The replacement's affinity to the node can only be
    narrowed: it would wait for that node for ever. Once no live Reservation holds its
    claim and the scheduler has refused it for the grace period, it goes, and its
    workload makes one without the tie."""
    replacement = tied("web-2", gates=gates, annotations={keys.CLAIM: "tok"})
    if refused_at is not None:
        refused_since(replacement, refused_at)
    holders = [reservation(phase=holder, node="node-1")] if holder else []
    plan = reservations.stray(replacement, holders=holders, node_gone=False, now=later(now))
    assert kinds(plan) == expected
    if "Event:PinnedPodDeleted" in expected:
        delete, event = plan.actions
        assert isinstance(delete, Delete)
        assert isinstance(event, Event)
        assert delete.uid == replacement["metadata"]["uid"]
        assert "node-1" in event.message
    if expected == [] and refused_at == 10:
        assert plan.requeue_after == pytest.approx(9)


def test_a_pod_a_user_tied_to_a_node_is_never_deleted_for_being_refused() -> None:
    """No claim: the tie is the user's, not Berth's."""
    users = refused_since(tied("web-9"), 0)
    assert kinds(reservations.stray(users, holders=[], node_gone=False, now=later(600))) == []


def test_a_placeholder_on_a_node_that_takes_no_replacement_is_placed_again() -> None:
    """Cordoned, or tainted against the pod: a replacement sent there would stay Pending.
    The placeholder goes, so that a new one is placed elsewhere, and the Reservation is
    Pending until then, saying why."""
    rsv = reservation(phase="Available", node="node-1")
    ph = placeholder()
    plan = rsv_plan(rsv, ph=ph, node_refuses="node node-1 is cordoned")
    deleted = [a for a in plan.actions if isinstance(a, Delete)]
    assert [(a.name, a.uid) for a in deleted] == [(ph["metadata"]["name"], ph["metadata"]["uid"])]
    status = status_of(plan)
    assert (status["phase"], status.get("nodeName")) == ("Pending", None)
    scheduled = cond(status, "Scheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Lost")
    assert scheduled["message"].startswith("node node-1 is cordoned: a replacement could not")
    # On a node that takes it, the same placeholder keeps the place.
    assert not any(isinstance(a, Delete) for a in rsv_plan(rsv, ph=ph).actions)
