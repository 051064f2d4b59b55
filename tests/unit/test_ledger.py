"""The capacity ledger counts each pod once, and holds a Reservation's capacity exactly
during its handover: owner recorded, placeholder gone, owner not bound yet."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from berth.api import API_VERSION, keys
from berth.ledger import Ledger, held_by

Event = tuple[str, str, dict[str, Any]]


def node(name: str, cpu: str = "8") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"}},
    }


def pod(
    name: str,
    *,
    cpu: str = "1",
    node: str | None = None,
    uid: str | None = None,
    phase: str = "Running",
    placeholder: str | None = None,
) -> dict[str, Any]:
    labels = {keys.RESERVATION_LABEL: placeholder} if placeholder else {}
    controller = {
        "apiVersion": API_VERSION,
        "kind": "Reservation",
        "name": placeholder,
        "uid": f"uid-{placeholder}",
        "controller": True,
    }
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "labels": labels,
            "ownerReferences": [controller] if placeholder else [],
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def reservation(
    name: str,
    *,
    node: str | None = "node-0",
    phase: str = "Available",
    owners: tuple[str, ...] = (),
    cpu: str = "2",
    placeholder: str | None = "",
) -> dict[str, Any]:
    """A Reservation; the controller recorded `placeholder` (by default the UID of
    `pod(f"{name}-placeholder", ...)`; None: no record)."""
    if placeholder == "":
        placeholder = f"uid-{name}-placeholder"
    record = {"name": f"{name}-placeholder", "uid": placeholder}
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "annotations": {keys.PLACEHOLDER: json.dumps(record)} if placeholder else {},
        },
        "spec": {
            "template": {
                "metadata": {"namespace": "ns"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            }
        },
        "status": {
            "phase": phase,
            "nodeName": node,
            "allocatable": {"cpu": cpu},
            "currentOwners": [{"name": uid, "namespace": "ns", "uid": uid} for uid in owners],
        },
    }


def ledger_after(events: list[Event]) -> Ledger:
    ledger = Ledger()
    for name in ("node-0", "node-1"):
        ledger.on_node("ADDED", node(name))
    handlers = {"pod": ledger.on_pod, "node": ledger.on_node, "reservation": ledger.on_reservation}
    for what, kind, obj in events:
        handlers[what](kind, obj)
    return ledger


def free_cpu(ledger: Ledger, name: str) -> Decimal | None:
    free = ledger.free(name)
    return None if free is None else free.get("cpu", Decimal(0))


PLACEHOLDER = pod("r-placeholder", cpu="2", node="node-0", placeholder="r")
OWNER = pod("owner", cpu="2", uid="owner-uid")
OWNER_BOUND = pod("owner", cpu="2", uid="owner-uid", node="node-0")
R_OWNED = reservation("r", owners=("owner-uid",))


@pytest.mark.parametrize(
    ("events", "node0", "node1", "in_handover"),
    [
        pytest.param([], "8", "8", [], id="empty"),
        pytest.param([("pod", "ADDED", pod("a", node="node-0"))], "7", "8", [], id="bound pod"),
        pytest.param([("pod", "ADDED", pod("a"))], "8", "8", [], id="pending pod"),
        pytest.param(
            [("pod", "ADDED", pod("a", node="node-0", phase="Succeeded"))],
            "8",
            "8",
            [],
            id="terminal pod",
        ),
        pytest.param(
            [
                ("pod", "ADDED", pod("a", node="node-0")),
                ("pod", "MODIFIED", pod("a", node="node-0")),
            ],
            "7",
            "8",
            [],
            id="an update counts once",
        ),
        pytest.param(
            [("pod", "ADDED", pod("a")), ("pod", "MODIFIED", pod("a", node="node-1"))],
            "8",
            "7",
            [],
            id="binding charges the node",
        ),
        pytest.param(
            [
                ("pod", "ADDED", pod("a", node="node-0")),
                ("pod", "MODIFIED", pod("a", node="node-1")),
            ],
            "8",
            "7",
            [],
            id="a node change moves the charge",
        ),
        pytest.param(
            [
                ("pod", "ADDED", pod("a", node="node-0")),
                ("pod", "MODIFIED", pod("a", node="node-0", phase="Failed")),
            ],
            "8",
            "8",
            [],
            id="going terminal releases",
        ),
        pytest.param(
            [
                ("pod", "ADDED", pod("a", node="node-0")),
                ("pod", "DELETED", pod("a", node="node-0")),
            ],
            "8",
            "8",
            [],
            id="deleted",
        ),
        pytest.param(
            [
                ("pod", "ADDED", pod("a", node="node-0", uid="1")),
                ("pod", "MODIFIED", pod("a", cpu="3", node="node-1", uid="2")),
            ],
            "8",
            "5",
            [],
            id="same name, new UID replaces the old pod",
        ),
        # Reservations: once an owner is recorded the Reservation holds the capacity, even
        # while this cache still sees its placeholder; the two are never counted twice.
        pytest.param(
            [
                ("pod", "ADDED", PLACEHOLDER),
                ("reservation", "ADDED", R_OWNED),
                ("pod", "ADDED", OWNER),
            ],
            "6",
            "8",
            ["r"],
            id="live placeholder",
        ),
        pytest.param(
            [
                ("pod", "ADDED", PLACEHOLDER),
                ("reservation", "ADDED", R_OWNED),
                ("pod", "ADDED", OWNER),
                ("pod", "DELETED", PLACEHOLDER),
            ],
            "6",
            "8",
            ["r"],
            id="handover: placeholder gone, owner not bound",
        ),
        pytest.param(
            [("reservation", "ADDED", R_OWNED)], "6", "8", ["r"], id="handover: owner not seen yet"
        ),
        pytest.param(
            [
                ("pod", "ADDED", PLACEHOLDER),
                ("pod", "ADDED", OWNER),
                ("pod", "DELETED", PLACEHOLDER),
                ("reservation", "ADDED", R_OWNED),
            ],
            "6",
            "8",
            ["r"],
            id="handover: placeholder gone before the owner is seen",
        ),
        pytest.param(
            [
                ("pod", "ADDED", PLACEHOLDER),
                ("reservation", "ADDED", R_OWNED),
                ("pod", "MODIFIED", {**PLACEHOLDER, "status": {"phase": "Failed"}}),
            ],
            "6",
            "8",
            ["r"],
            id="handover: placeholder terminal",
        ),
        pytest.param(
            [
                ("reservation", "ADDED", R_OWNED),
                ("pod", "ADDED", OWNER),
                ("pod", "MODIFIED", OWNER_BOUND),
            ],
            "6",
            "8",
            [],
            id="owner bound: its own pod is charged instead",
        ),
        pytest.param(
            [
                ("reservation", "ADDED", R_OWNED),
                ("pod", "ADDED", OWNER),
                (
                    "pod",
                    "MODIFIED",
                    {**OWNER_BOUND, "spec": {**OWNER_BOUND["spec"], "nodeName": "node-1"}},
                ),
            ],
            "8",
            "6",
            [],
            id="owner bound elsewhere ends the hold",
        ),
        pytest.param(
            [
                ("reservation", "ADDED", R_OWNED),
                ("pod", "ADDED", OWNER_BOUND),
                ("pod", "DELETED", OWNER_BOUND),
            ],
            "6",
            "8",
            ["r"],
            id="owner deleted: held until the Reservation ends",
        ),
        pytest.param(
            [("reservation", "ADDED", reservation("r"))],
            "8",
            "8",
            [],
            id="no owner recorded: nothing to hold for",
        ),
        pytest.param(
            [("reservation", "ADDED", reservation("r", phase="Pending", owners=("owner-uid",)))],
            "8",
            "8",
            [],
            id="pending Reservation holds nothing",
        ),
        pytest.param(
            [
                ("reservation", "ADDED", R_OWNED),
                (
                    "reservation",
                    "MODIFIED",
                    reservation("r", phase="Succeeded", owners=("owner-uid",)),
                ),
            ],
            "8",
            "8",
            [],
            id="succeeded Reservation holds nothing",
        ),
        pytest.param(
            [("reservation", "ADDED", R_OWNED), ("reservation", "DELETED", R_OWNED)],
            "8",
            "8",
            [],
            id="deleted Reservation holds nothing",
        ),
        pytest.param(
            [
                ("reservation", "ADDED", R_OWNED),
                ("reservation", "MODIFIED", reservation("r", node="node-1", owners=("owner-uid",))),
            ],
            "8",
            "6",
            ["r"],
            id="the hold follows status.nodeName",
        ),
    ],
)
def test_free_capacity(events: list[Event], node0: str, node1: str, in_handover: list[str]) -> None:
    ledger = ledger_after(events)
    assert free_cpu(ledger, "node-0") == Decimal(node0)
    assert free_cpu(ledger, "node-1") == Decimal(node1)
    assert sorted(ledger.handover("node-0")) + sorted(ledger.handover("node-1")) == in_handover
    # The frozen copy a round reads says the same of every node.
    assert dict(ledger.frozen_free()) == {name: ledger.free(name) for name in ledger.frozen_free()}


def test_frozen_free_capacity_stays_as_it_was_taken() -> None:
    ledger = ledger_after(
        [("reservation", "ADDED", R_OWNED), ("pod", "ADDED", pod("a", node="node-1"))]
    )
    frozen = ledger.frozen_free()
    before = {name: ledger.free(name) for name in ledger.frozen_free()}
    for what, obj in (
        ("pod", OWNER_BOUND),  # the handover on node-0 ends
        ("pod", pod("b", node="node-1")),
        ("node", node("node-2")),
    ):
        handler = {"pod": ledger.on_pod, "node": ledger.on_node}[what]
        handler("ADDED", obj)
    ledger.on_node("DELETED", node("node-0"))
    assert dict(frozen) == before
    assert "node-2" not in frozen
    assert free_cpu(ledger, "node-1") == Decimal(6)


def test_unknown_and_deleted_nodes_have_no_capacity() -> None:
    ledger = ledger_after([("node", "DELETED", node("node-1"))])
    assert ledger.free("node-9") is None
    assert ledger.allocatable("node-9") is None
    assert ledger.free("node-1") is None
    assert ledger.allocatable("node-0") == {
        "cpu": Decimal(8),
        "memory": Decimal(16 * 2**30),
        "pods": Decimal(110),
    }


@pytest.mark.parametrize(
    ("events", "uid", "expected"),
    [
        pytest.param(
            [("reservation", "ADDED", R_OWNED)], "owner-uid", ("r", "node-0"), id="recorded owner"
        ),
        pytest.param([("reservation", "ADDED", R_OWNED)], "someone-else", None, id="other pod"),
        pytest.param(
            [("reservation", "ADDED", reservation("r", phase="Pending", owners=("owner-uid",)))],
            "owner-uid",
            None,
            id="not Available",
        ),
        pytest.param(
            [("reservation", "ADDED", reservation("r", node=None, owners=("owner-uid",)))],
            "owner-uid",
            None,
            id="no node",
        ),
        pytest.param(
            [
                ("reservation", "ADDED", R_OWNED),
                ("reservation", "MODIFIED", reservation("r", owners=("new-uid",))),
            ],
            "owner-uid",
            None,
            id="owner replaced",
        ),
        pytest.param(
            [("reservation", "ADDED", R_OWNED), ("reservation", "DELETED", R_OWNED)],
            "owner-uid",
            None,
            id="Reservation deleted",
        ),
    ],
)
def test_reserved_for(events: list[Event], uid: str, expected: tuple[str, str] | None) -> None:
    assert ledger_after(events).reserved_for(uid) == expected


def test_promised_counts_bound_placeholders_and_handover() -> None:
    ledger = ledger_after(
        [
            ("pod", "ADDED", pod("ordinary", cpu="3", node="node-0")),
            ("pod", "ADDED", PLACEHOLDER),  # 2, for r
            ("reservation", "ADDED", reservation("r", phase="Pending", node=None)),
            ("pod", "ADDED", pod("pending-placeholder", cpu="5", placeholder="q")),
            ("reservation", "ADDED", reservation("s", cpu="1", owners=("s-owner",))),
        ]
    )
    assert ledger.promised("node-0") == {"cpu": Decimal(3), "pods": Decimal(2)}
    assert ledger.promised("node-1") == {}
    assert free_cpu(ledger, "node-0") == Decimal(2)


def test_a_handover_holds_the_overhead_its_placeholder_was_charged() -> None:
    """A runtime class's overhead is charged on the placeholder (the API server sets it on
    every pod of the class) and on the owner alike, but status.allocatable leaves it out:
    once the placeholder is gone, the handover holds what it was charged, overhead
    included, so that no other pod takes that part of the place."""
    with_overhead = pod("r-placeholder", cpu="2", node="node-0", placeholder="r")
    with_overhead["spec"]["overhead"] = {"cpu": "500m"}
    ledger = ledger_after(
        [
            ("reservation", "ADDED", reservation("r")),
            ("pod", "ADDED", with_overhead),
            ("pod", "ADDED", pod("other", cpu="3", node="node-0")),
        ]
    )
    assert free_cpu(ledger, "node-0") == Decimal("2.5")
    ledger.on_reservation("MODIFIED", R_OWNED)
    ledger.on_pod("DELETED", with_overhead)
    assert free_cpu(ledger, "node-0") == Decimal("2.5")
    assert ledger.handover("node-0")["r"]["cpu"] == Decimal("2.5")
    ledger.on_reservation("DELETED", R_OWNED)
    assert free_cpu(ledger, "node-0") == Decimal(5)


def forged(name: str, **change: Any) -> dict[str, Any]:
    """A 2-CPU pod on node-0 that says it is r's placeholder, altered as asked."""
    obj = pod(name, cpu="2", node="node-0", placeholder="r")
    for key, value in change.items():
        if key == "namespace":
            obj["metadata"]["namespace"] = value
        else:
            obj["metadata"]["ownerReferences"][0][key] = value
    return obj


LABEL_ONLY = pod("label-only", cpu="2", node="node-0")
LABEL_ONLY["metadata"]["labels"] = {keys.RESERVATION_LABEL: "r"}


@pytest.mark.parametrize(
    ("events", "placeholder"),
    [
        pytest.param([("pod", "ADDED", PLACEHOLDER)], "r", id="genuine"),
        pytest.param([("pod", "ADDED", LABEL_ONLY)], None, id="the label alone"),
        pytest.param(
            [("pod", "ADDED", forged("f", uid="uid-other"))], None, id="another Reservation's uid"
        ),
        pytest.param(
            [("pod", "ADDED", forged("f", namespace="elsewhere"))], None, id="another namespace"
        ),
        pytest.param([("pod", "ADDED", forged("f", kind="Pod"))], None, id="another kind"),
        # The Reservation's name, UID and namespace, but not the pod the controller recorded.
        pytest.param([("pod", "ADDED", forged("f"))], None, id="a hand-made owner reference"),
    ],
)
def test_only_a_pod_controlled_by_the_reservation_is_its_placeholder(
    events: list[Event], placeholder: str | None
) -> None:
    ledger = ledger_after(
        [("reservation", "ADDED", reservation("r", phase="Pending", node=None)), *events]
    )
    [(_, _, obj)] = events
    uid = obj["metadata"]["uid"]
    assert ledger.placeholder_of(uid) == placeholder
    assert ledger.placeholder_of_pod(obj) == placeholder
    assert ledger.promised("node-0") == (
        {"cpu": Decimal(2), "pods": Decimal(1)} if placeholder else {}
    )


def test_a_placeholder_counts_from_when_its_reservation_is_seen_until_it_goes() -> None:
    r = reservation("r", phase="Pending", node=None)
    ledger = ledger_after([("pod", "ADDED", PLACEHOLDER)])
    assert ledger.promised("node-0") == {}
    ledger.on_reservation("ADDED", r)
    assert ledger.promised("node-0") == {"cpu": Decimal(2), "pods": Decimal(1)}
    ledger.on_reservation("DELETED", r)
    assert ledger.promised("node-0") == {}
    # No sum of nothing is kept: prioritize looks at these nodes on every request.
    assert "node-0" not in ledger.promising_nodes()
    assert ledger.placeholder_of("uid-r-placeholder") is None
    assert free_cpu(ledger, "node-0") == Decimal(6)


def test_a_recorded_placeholder_is_one_before_the_ledger_sees_it() -> None:
    """kube-scheduler may offer a placeholder it bound as a preemption victim before the
    pod's events reach the ledger: the Reservation's record says what it is."""
    ledger = ledger_after([("reservation", "ADDED", reservation("r", phase="Pending", node=None))])
    assert ledger.placeholder_of("uid-r-placeholder") == "r"
    ledger.on_reservation(
        "MODIFIED", reservation("r", phase="Pending", node=None, placeholder="uid-next")
    )
    assert ledger.placeholder_of("uid-r-placeholder") is None
    assert ledger.placeholder_of("uid-next") == "r"
    ledger.on_reservation("DELETED", reservation("r", phase="Pending", node=None))
    assert ledger.placeholder_of("uid-next") is None


def test_a_placeholder_counts_from_when_it_is_recorded() -> None:
    """Created, then recorded (the controller writes the record from the create
    response): an ordinary pod until the record arrives, and again if another is recorded."""
    ledger = ledger_after(
        [
            (
                "reservation",
                "ADDED",
                reservation("r", phase="Pending", node=None, placeholder=None),
            ),
            ("pod", "ADDED", PLACEHOLDER),
        ]
    )
    assert ledger.placeholder_of("uid-r-placeholder") is None
    assert ledger.promised("node-0") == {}
    ledger.on_reservation("MODIFIED", reservation("r", phase="Pending", node=None))
    assert ledger.placeholder_of("uid-r-placeholder") == "r"
    assert ledger.promised("node-0") == {"cpu": Decimal(2), "pods": Decimal(1)}
    another = reservation("r", phase="Pending", node=None, placeholder="uid-next")
    ledger.on_reservation("MODIFIED", another)
    assert ledger.placeholder_of("uid-r-placeholder") is None
    assert ledger.promised("node-0").get("cpu", Decimal(0)) == 0
    assert free_cpu(ledger, "node-0") == Decimal(6)


def test_pod_entries_by_uid() -> None:
    ledger = ledger_after([("pod", "ADDED", PLACEHOLDER)])
    entry = ledger.pod("uid-r-placeholder")
    assert entry is not None
    assert (entry.name, entry.node) == ("ns/r-placeholder", "node-0")
    assert ledger.pod("nobody") is None


@pytest.mark.parametrize(
    ("status", "spec", "cpu"),
    [
        (
            {"allocatable": {"cpu": "1500m"}},
            {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "1.5",
        ),
        (
            {},
            {
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                "overhead": {"cpu": "250m"},
            },
            "1.25",
        ),
        ({}, {}, None),
    ],
)
def test_held_by(status: dict[str, Any], spec: dict[str, Any], cpu: str | None) -> None:
    held = held_by({"spec": {"template": {"spec": spec}}, "status": status})
    assert held.get("cpu") == (Decimal(cpu) if cpu else None)


def test_a_pod_is_charged_anew_only_when_its_node_or_spec_changed() -> None:
    """Most events of a pod change its status alone: its requests are parsed again only
    when its generation (bumped by the API server on every spec change, a resize included)
    moved; a binding keeps the generation and still moves the charge."""
    ledger = ledger_after([("node", "ADDED", node("node-0")), ("node", "ADDED", node("node-1"))])
    created = pod("web", cpu="1")
    created["metadata"]["generation"] = 1
    ledger.on_pod("ADDED", created)
    bound = json.loads(json.dumps(created))
    bound["spec"]["nodeName"] = "node-0"
    ledger.on_pod("MODIFIED", bound)
    assert free_cpu(ledger, "node-0") == Decimal(7)
    running = json.loads(json.dumps(bound))
    running["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    before = ledger.pod("uid-web")
    ledger.on_pod("MODIFIED", running)
    assert ledger.pod("uid-web") is before  # nothing charged anew
    assert free_cpu(ledger, "node-0") == Decimal(7)
    resized = json.loads(json.dumps(running))
    resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    resized["metadata"]["generation"] = 2
    ledger.on_pod("MODIFIED", resized)
    assert free_cpu(ledger, "node-0") == Decimal(5)
    # Without a generation (an API server that does not set it) the spec is always read.
    unversioned = json.loads(json.dumps(resized))
    del unversioned["metadata"]["generation"]
    unversioned["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    ledger.on_pod("MODIFIED", unversioned)
    assert free_cpu(ledger, "node-0") == Decimal(6)
    ledger.on_pod("DELETED", unversioned)
    assert free_cpu(ledger, "node-0") == Decimal(8)


def test_a_pod_resized_in_place_is_charged_what_its_kubelet_reports() -> None:
    """A resize changes the spec first (generation bumped) and the kubelet's account in
    the status later (generation kept): the charge follows both, as kube-scheduler's does,
    so a node whose pod is shrinking is not taken for freer than it is."""
    ledger = ledger_after([])
    running = pod("web", cpu="2", node="node-0")
    running["metadata"]["generation"] = 1
    running["status"]["containerStatuses"] = [
        {"name": "c", "resources": {"requests": {"cpu": "2"}}, "allocatedResources": {"cpu": "2"}}
    ]
    ledger.on_pod("ADDED", running)
    assert free_cpu(ledger, "node-0") == Decimal(6)
    shrinking = json.loads(json.dumps(running))
    shrinking["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500m"
    shrinking["metadata"]["generation"] = 2
    ledger.on_pod("MODIFIED", shrinking)
    assert free_cpu(ledger, "node-0") == Decimal(6)  # still runs with 2
    actuated = json.loads(json.dumps(shrinking))
    actuated["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] = "500m"
    actuated["status"]["containerStatuses"][0]["allocatedResources"]["cpu"] = "500m"
    ledger.on_pod("MODIFIED", actuated)
    assert free_cpu(ledger, "node-0") == Decimal("7.5")
    growing = json.loads(json.dumps(actuated))
    growing["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "16"
    growing["metadata"]["generation"] = 3
    ledger.on_pod("MODIFIED", growing)
    assert free_cpu(ledger, "node-0") == Decimal(-8)  # asked, not yet found infeasible
    infeasible = json.loads(json.dumps(growing))
    infeasible["status"]["conditions"] = [
        {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}
    ]
    ledger.on_pod("MODIFIED", infeasible)
    assert free_cpu(ledger, "node-0") == Decimal("7.5")
