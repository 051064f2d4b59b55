"""The extender's verbs, on the requests the real kube-scheduler sent (tests/data)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from berth.api import API_VERSION, keys
from berth.ledger import Ledger
from extender.decide import (
    Placement,
    answer,
    filter_nodes,
    parse_args,
    parse_preemption_args,
    pending,
    preempt,
    prioritize,
    refusal,
    score,
)
from tests.unit.test_ledger import node, pod, reservation

DATA = Path(__file__).resolve().parents[1] / "data"
FILTER_ARGS = json.loads((DATA / "extender_filter_args.json").read_text())
PRIORITIZE_ARGS = json.loads((DATA / "extender_prioritize_args.json").read_text())
NODES = ["node-0", "node-1", "node-2"]
R_OWNER = "r-owner-uid"
Q_OWNER = "q-owner-uid"
S_OWNER = "s-owner-uid"


@pytest.fixture
def ledger() -> Ledger:
    """node-0: empty. node-1: a 2-CPU pod, and Reservation r (4 CPU) in handover: 2 CPU
    free. node-2: the live 3-CPU placeholder of Reservation q, whose owner is recorded."""
    ledger = Ledger()
    for name in NODES:
        ledger.on_node("ADDED", node(name))
    ledger.on_pod("ADDED", pod("busy", cpu="2", node="node-1"))
    ledger.on_reservation("ADDED", reservation("r", node="node-1", cpu="4", owners=(R_OWNER,)))
    ledger.on_pod("ADDED", pod("q-placeholder", cpu="3", node="node-2", placeholder="q"))
    ledger.on_reservation("ADDED", reservation("q", node="node-2", cpu="3", owners=(Q_OWNER,)))
    ledger.on_reservation("ADDED", reservation("new", phase="Pending", node=None))
    return ledger


def scheduled(
    sample: dict[str, Any],
    *,
    cpu: str | None = None,
    uid: str | None = None,
    labels: dict[str, str] | None = None,
    placeholder: str | None = None,
    annotations: dict[str, str] | None = None,
    nodes: list[str] | None = None,
) -> dict[str, Any]:
    """The recorded request, about a pod changed as asked, with these candidate nodes."""
    args = copy.deepcopy(sample)
    metadata, spec = args["Pod"]["metadata"], args["Pod"]["spec"]
    if cpu is not None:
        spec["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    if uid is not None:
        metadata["uid"] = uid
    metadata.setdefault("labels", {}).update(labels or {})
    if placeholder is not None:  # the placeholder the Reservation records
        metadata["namespace"] = "ns"
        metadata["uid"] = uid or f"uid-{placeholder}-placeholder"
        metadata["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": "Reservation",
                "name": placeholder,
                "uid": f"uid-{placeholder}",
                "controller": True,
            }
        ]
    metadata.setdefault("annotations", {}).update(annotations or {})
    if nodes is not None:
        args["NodeNames"] = nodes
    return args


HELD = "Insufficient cpu: held for Reservation r in handover"
# q's owner is recorded: q holds node-2 itself, even while this cache sees its placeholder.
HELD_Q = "Insufficient cpu: held for Reservation q in handover"
RESERVED = "reserved for this pod on node-1 by Reservation r"
FORGED = {keys.CLAIM: "a-token", keys.RESERVATION_ALLOCATED: '{"name": "r", "uid": "x"}'}


@pytest.mark.parametrize(
    ("change", "passed", "failed", "unresolvable"),
    [
        pytest.param({}, NODES, {}, {}, id="no requests fit anywhere"),
        pytest.param({"cpu": "2"}, NODES, {}, {}, id="fits what the hold leaves"),
        pytest.param(
            {"cpu": "3"},
            ["node-0", "node-2"],
            {},
            {"node-1": HELD},
            id="refused the capacity held in handover",
        ),
        pytest.param(
            {"cpu": "3", "annotations": FORGED},
            ["node-0", "node-2"],
            {},
            {"node-1": HELD},
            id="a forged claim gets nothing",
        ),
        pytest.param(
            {"cpu": "4", "uid": R_OWNER},
            ["node-1"],
            {},
            {"node-0": RESERVED, "node-2": RESERVED},
            id="the owner goes to its node",
        ),
        pytest.param(
            {"uid": R_OWNER, "nodes": ["node-0", "node-2"]},
            [],
            {},
            {"node-0": RESERVED, "node-2": RESERVED},
            id="owner, its node not offered",
        ),
        pytest.param(
            {"uid": Q_OWNER},
            ["node-2"],
            {},
            {n: "reserved for this pod on node-2 by Reservation q" for n in ("node-0", "node-1")},
            id="owner while the placeholder lives",
        ),
        pytest.param(
            {"cpu": "7", "nodes": ["node-9", "node-1"]},
            ["node-9"],
            {},
            {"node-1": HELD},
            id="unknown nodes pass: the scheduler judges them",
        ),
        pytest.param(
            {"cpu": "7", "labels": {keys.RESERVATION_LABEL: "other"}},
            ["node-0"],
            {},
            {"node-1": HELD, "node-2": HELD_Q},
            id="a placeholder is held off too",
        ),
    ],
)
def test_filter(
    ledger: Ledger,
    change: dict[str, Any],
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> None:
    result = filter_nodes(ledger, parse_args(scheduled(FILTER_ARGS, **change)))
    assert result == {
        "Nodes": None,
        "NodeNames": passed,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }


@pytest.mark.parametrize(
    ("owner", "cpu", "refused"),
    [
        pytest.param(R_OWNER, "4", None, id="its own hold"),
        pytest.param(
            R_OWNER,
            "6",
            "Insufficient cpu: held for Reservation s in handover",
            id="more than its hold and the free capacity: not another's hold",
        ),
        pytest.param(S_OWNER, "2", None, id="the other owner, its own hold"),
        pytest.param(Q_OWNER, "8", None, id="its hold, its placeholder still seen: once"),
    ],
)
def test_an_owner_takes_its_own_hold_not_anothers(
    ledger: Ledger, owner: str, cpu: str, refused: str | None
) -> None:
    """node-1 (8 CPU) runs 2 CPU and holds r (4 CPU) and s (2 CPU) in handover: r's owner
    may take r's 4, not s's 2; q's owner on node-2 takes q's 3 and the 5 free there, its
    placeholder (which this cache still sees) counted once."""
    ledger.on_reservation("ADDED", reservation("s", node="node-1", cpu="2", owners=(S_OWNER,)))
    judged = pending(ledger, scheduled(FILTER_ARGS, cpu=cpu, uid=owner)["Pod"])
    assert judged.reserved is not None
    found = refusal(ledger, judged, judged.reserved[1])
    assert (found.reason if found else None) == refused
    # Resolvable for an owner: were every node unresolvable, preemption would clear the
    # owner's nomination, which guards its place. A stranger's refusal is unresolvable.
    assert found is None or not found.unresolvable


def test_a_resource_the_hold_does_not_hold_is_left_to_the_scheduler(ledger: Ledger) -> None:
    """A DRA-backed extended resource (a device class's) is listed by no node: kube-
    scheduler checks it with its claims, not with the node's allocatable, and the place
    in handover holds none of it. Only what the hold holds is judged."""
    args = scheduled(FILTER_ARGS, cpu="2")
    resources = args["Pod"]["spec"]["containers"][0]["resources"]
    resources["requests"]["deviceclass.resource.kubernetes.io/gpu"] = "1"
    resources["limits"] = {"deviceclass.resource.kubernetes.io/gpu": "1"}
    result = filter_nodes(ledger, parse_args(args))
    assert result["NodeNames"] == NODES
    assert result["FailedAndUnresolvableNodes"] == {}


def test_the_pod_slot_a_handover_holds_is_not_free_for_another_pod() -> None:
    """The scheduler counts a node's pods against its `pods` allocatable: on a node that
    runs as many pods as it may, the slot a placeholder gave up in the handover is its
    owner's; any other pod is refused however little it asks."""
    ledger = Ledger()
    full = node("node-1")
    full["status"]["allocatable"]["pods"] = "3"
    ledger.on_node("ADDED", full)
    for name in ("a", "b"):
        ledger.on_pod("ADDED", pod(name, cpu="100m", node="node-1"))
    ledger.on_reservation("ADDED", reservation("r", node="node-1", cpu="1", owners=(R_OWNER,)))
    other = filter_nodes(ledger, parse_args(scheduled(FILTER_ARGS, cpu="100m", nodes=["node-1"])))
    assert other["FailedAndUnresolvableNodes"] == {
        "node-1": "Insufficient pods: held for Reservation r in handover"
    }
    owner = filter_nodes(
        ledger, parse_args(scheduled(FILTER_ARGS, cpu="1", uid=R_OWNER, nodes=["node-1"]))
    )
    assert owner["NodeNames"] == ["node-1"]


def test_filter_over_http_bytes(ledger: Ledger) -> None:
    body = orjson.dumps(scheduled(FILTER_ARGS, cpu="3"))
    status, result = answer(ledger, "filter", body, placement=Placement.SPREAD, ready=True)
    assert status == 200
    assert result["NodeNames"] == ["node-0", "node-2"]
    assert result["FailedAndUnresolvableNodes"] == {"node-1": HELD}


def test_filter_with_whole_nodes(ledger: Ledger) -> None:
    """nodeCacheCapable: false sends a NodeList and wants one back."""
    args = scheduled(FILTER_ARGS, cpu="3")
    args["NodeNames"] = None
    args["Nodes"] = {"metadata": {}, "items": [node(name) for name in NODES]}
    result = filter_nodes(ledger, parse_args(args))
    assert result["NodeNames"] is None
    assert [item["metadata"]["name"] for item in result["Nodes"]["items"]] == ["node-0", "node-2"]
    assert result["Nodes"]["items"][0] == node("node-0")
    assert result["FailedAndUnresolvableNodes"] == {"node-1": HELD}


def with_host_port(port: int, ip: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"containerPort": port, "hostPort": port}
    if ip is not None:
        entry["hostIP"] = ip
    return entry


@pytest.mark.parametrize(
    ("ports", "refused"),
    [
        ([with_host_port(8080)], True),
        ([with_host_port(8080, "10.0.0.7")], True),  # the place holds it on every address
        ([with_host_port(9090)], False),
        ([], False),
    ],
)
def test_a_handover_holds_the_host_ports_its_placeholder_took(
    ledger: Ledger, ports: list[dict[str, Any]], refused: bool
) -> None:
    """The placeholder took its template's host ports on the node; once it is gone, no
    other pod may take them before the owner (the resources aside): preempting frees
    none, so the node is unresolvable for it. The owner itself takes them."""
    held = reservation("p", node="node-0", cpu="1", owners=("p-owner",))
    held["spec"]["template"]["spec"]["containers"][0]["ports"] = [with_host_port(8080)]
    ledger.on_reservation("ADDED", held)
    args = scheduled(FILTER_ARGS, cpu="1")
    args["Pod"]["spec"]["containers"][0]["ports"] = ports
    result = filter_nodes(ledger, parse_args(args))
    expected = {"node-0": "host port 8080/TCP held for Reservation p in handover"}
    assert result["FailedAndUnresolvableNodes"] == (expected if refused else {})
    owner = scheduled(FILTER_ARGS, cpu="1", uid="p-owner")
    owner["Pod"]["spec"]["containers"][0]["ports"] = [with_host_port(8080)]
    assert filter_nodes(ledger, parse_args(owner))["NodeNames"] == ["node-0"]


def scores(ledger: Ledger, args: dict[str, Any], placement: Placement) -> dict[str, int]:
    result = prioritize(ledger, parse_args(args), placement=placement)
    assert [entry["Host"] for entry in result] == args["NodeNames"]
    return {entry["Host"]: entry["Score"] for entry in result}


@pytest.mark.parametrize(
    ("change", "placement", "expected"),
    [
        # Owner: its node only.
        pytest.param(
            {"uid": R_OWNER}, Placement.SPREAD, {"node-0": 0, "node-1": 10, "node-2": 0}, id="owner"
        ),
        # Placeholder of 2 CPU; memory stays all free (share 1), CPU left is 6/8, 0/8, 3/8.
        pytest.param(
            {"cpu": "2", "placeholder": "new"},
            Placement.SPREAD,
            {"node-0": 9, "node-1": 5, "node-2": 7},
            id="placeholder, spread",
        ),
        pytest.param(
            {"cpu": "2", "placeholder": "new"},
            Placement.BINPACK,
            {"node-0": 1, "node-1": 5, "node-2": 3},
            id="placeholder, binpack",
        ),
        pytest.param(
            {"cpu": "2", "placeholder": "new", "nodes": ["node-9"]},
            Placement.SPREAD,
            {"node-9": 0},
            id="placeholder, unknown node",
        ),
        # The label alone makes no placeholder: scored as any other pod.
        pytest.param(
            {"cpu": "2", "labels": {keys.RESERVATION_LABEL: "new"}},
            Placement.SPREAD,
            {"node-0": 10, "node-1": 5, "node-2": 6},
            id="forged placeholder label",
        ),
        # An owner reference to it is enough to be scored as one (kube-scheduler may score
        # the placeholder before the controller records it): a pod that forges it orders
        # the nodes for itself alone.
        pytest.param(
            {"cpu": "2", "placeholder": "new", "uid": "uid-forger"},
            Placement.SPREAD,
            {"node-0": 9, "node-1": 5, "node-2": 7},
            id="placeholder not recorded yet",
        ),
        # Others: promised to Reservations 0/8, 4/8 (handover), 3/8 (placeholder).
        pytest.param(
            {"cpu": "1"},
            Placement.SPREAD,
            {"node-0": 10, "node-1": 5, "node-2": 6},
            id="others avoid promised capacity",
        ),
        pytest.param(
            {"cpu": "1"},
            Placement.BINPACK,
            {"node-0": 10, "node-1": 5, "node-2": 6},
            id="placement is for placeholders only",
        ),
        pytest.param(
            {"nodes": ["node-9"]},
            Placement.SPREAD,
            {"node-9": 10},
            id="unknown node promises nothing",
        ),
    ],
)
def test_prioritize(
    ledger: Ledger, change: dict[str, Any], placement: Placement, expected: dict[str, int]
) -> None:
    assert scores(ledger, scheduled(PRIORITIZE_ARGS, **change), placement) == expected


def preemption(victims: dict[str, list[str]], **change: Any) -> dict[str, Any]:
    """A preempt request in the nodeCacheCapable form, about the recorded pod."""
    return {
        "Pod": scheduled(FILTER_ARGS, **change)["Pod"],
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            name: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 1}
            for name, uids in victims.items()
        },
    }


@pytest.mark.parametrize(
    ("victims", "change", "kept"),
    [
        pytest.param({"node-0": ["uid-x"]}, {"cpu": "1"}, ["node-0"], id="ordinary victim"),
        pytest.param(
            {"node-2": ["uid-q-placeholder"]},
            {"cpu": "1"},
            [],
            id="a placeholder is never a victim",
        ),
        pytest.param(
            {"node-2": ["uid-x", "uid-q-placeholder"]},
            {"cpu": "1"},
            [],
            id="nor part of a victim set",
        ),
        pytest.param(
            {"node-1": ["uid-busy"]},
            {"cpu": "4"},
            ["node-1"],
            id="victims make room beside the hold",
        ),
        pytest.param(
            {"node-1": ["uid-busy"]},
            {"cpu": "5"},
            [],
            id="victims cannot make room: the hold stays",
        ),
        pytest.param(
            {"node-1": ["uid-unknown"]}, {"cpu": "3"}, [], id="an unknown victim frees nothing"
        ),
        pytest.param(
            {"node-0": ["uid-x"], "node-1": ["uid-busy"]},
            {"uid": R_OWNER},
            ["node-1"],
            id="the owner preempts only on its node",
        ),
    ],
)
def test_preempt(
    ledger: Ledger, victims: dict[str, list[str]], change: dict[str, Any], kept: list[str]
) -> None:
    args = preemption(victims, **change)
    result, dropped = preempt(ledger, parse_preemption_args(args))
    assert result == {
        "NodeNameToMetaVictims": {name: args["NodeNameToMetaVictims"][name] for name in kept}
    }
    assert sorted(dropped) == sorted(set(victims) - set(kept))


def test_preempt_with_whole_pods(ledger: Ledger) -> None:
    """nodeCacheCapable: false sends whole victim pods; the answer is UIDs all the same."""
    placeholder = pod("q-placeholder", cpu="3", node="node-2", placeholder="q")
    args = {
        "Pod": scheduled(FILTER_ARGS, cpu="1")["Pod"],
        "NodeNameToMetaVictims": None,
        "NodeNameToVictims": {
            "node-0": {"Pods": [pod("x", node="node-0")], "NumPDBViolations": 0},
            "node-2": {"Pods": [placeholder], "NumPDBViolations": 0},
        },
    }
    result, dropped = preempt(ledger, parse_preemption_args(args))
    assert result == {
        "NodeNameToMetaVictims": {"node-0": {"Pods": [{"UID": "uid-x"}], "NumPDBViolations": 0}}
    }
    assert dropped == {"node-2": "victim ns/q-placeholder is the placeholder of Reservation q"}


def test_a_whole_victim_is_a_placeholder_by_its_uid_whatever_its_body_says(
    ledger: Ledger,
) -> None:
    """A whole victim carrying the UID of q's placeholder but no owner reference (the
    body lies, or was cut): the ledger knows the UID, and the node is no candidate."""
    placeholder = pod("q-placeholder", cpu="3", node="node-2", placeholder="q")
    placeholder["metadata"]["ownerReferences"] = []
    args = {
        "Pod": scheduled(FILTER_ARGS, cpu="1")["Pod"],
        "NodeNameToMetaVictims": None,
        "NodeNameToVictims": {"node-2": {"Pods": [placeholder], "NumPDBViolations": 0}},
    }
    result, dropped = preempt(ledger, parse_preemption_args(args))
    assert result == {"NodeNameToMetaVictims": {}}
    assert dropped == {"node-2": "victim ns/q-placeholder is the placeholder of Reservation q"}


def test_a_hand_made_owner_reference_makes_no_placeholder(ledger: Ledger) -> None:
    """A 4-CPU pod on node-0 naming q (name and UID) as its controller, in q's namespace,
    but not the pod q records: a victim like any other, promising nothing."""
    forger = pod("forger", cpu="4", node="node-0", placeholder="q")
    forger["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = True
    ledger.on_pod("ADDED", forger)
    by_uid = preemption({"node-0": ["uid-forger"]}, cpu="1")
    whole = {
        "Pod": by_uid["Pod"],
        "NodeNameToMetaVictims": None,
        "NodeNameToVictims": {"node-0": {"Pods": [forger], "NumPDBViolations": 0}},
    }
    for args in (by_uid, whole):
        result, dropped = preempt(ledger, parse_preemption_args(args))
        assert list(result["NodeNameToMetaVictims"]) == ["node-0"]
        assert dropped == {}
    assert ledger.placeholder_of("uid-forger") is None
    assert ledger.promised("node-0") == {}
    assert scores(ledger, scheduled(PRIORITIZE_ARGS, cpu="1"), Placement.SPREAD)["node-0"] == 10


POD = FILTER_ARGS["Pod"]
BAD_QUANTITY = scheduled(FILTER_ARGS, cpu="lots")["Pod"]


@pytest.mark.parametrize(
    ("verb", "body", "message"),
    [
        *[(verb, b"{not json", "bad") for verb in ("filter", "prioritize", "preempt")],
        *[
            (verb, b"[]", "the request must be an object, not list")
            for verb in ("filter", "prioritize", "preempt")
        ],
        *[(verb, b"{}", "the request has no Pod") for verb in ("filter", "prioritize", "preempt")],
        ("filter", {"Pod": "accepted", "NodeNames": NODES}, "Pod must be an object, not str"),
        ("filter", {"Pod": {"spec": {}}, "NodeNames": NODES}, "Pod.metadata: Field required"),
        ("filter", {"Pod": POD, "NodeNames": "node-0"}, "NodeNames must be a list, not str"),
        ("filter", {"Pod": POD, "NodeNames": [0]}, "each of NodeNames must be a non-empty string"),
        (
            "filter",
            {"Pod": POD, "NodeNames": None, "Nodes": None},
            "the request has neither NodeNames nor Nodes",
        ),
        (
            "filter",
            {"Pod": POD, "Nodes": {"items": [{"metadata": {}}]}},
            "a node's name must be a non-empty string",
        ),
        ("filter", {"Pod": BAD_QUANTITY, "NodeNames": NODES}, "invalid quantity 'lots'"),
        ("filter", {"Pod": {**POD, "spec": 1}, "NodeNames": NODES}, "Pod.spec: Input should be"),
        (
            "filter",
            {"Pod": {**POD, "spec": {"containers": [None]}}, "NodeNames": NODES},
            "Pod.spec.containers.0: Input should be",
        ),
        (
            "prioritize",
            {"Pod": scheduled(FILTER_ARGS, cpu="1e999999999")["Pod"], "NodeNames": NODES},
            "quantity '1e999999999' is out of range",
        ),
        (
            "filter",
            {
                "Pod": {
                    **POD,
                    "spec": {"containers": [{"resources": {"requests": {"cpu": True}}}]},
                },
                "NodeNames": NODES,
            },
            "Pod.spec.containers.0.resources.requests.cpu",
        ),
        ("prioritize", {"Pod": POD, "Nodes": []}, "Nodes must be an object, not list"),
        (
            "preempt",
            {"Pod": POD, "NodeNameToMetaVictims": {"node-0": {"Pods": [{"UID": 7}]}}},
            "a victim's UID must be a non-empty string",
        ),
        (
            "preempt",
            {"Pod": POD, "NodeNameToMetaVictims": {"node-0": []}},
            "the victims on node-0 must be an object",
        ),
        (
            "preempt",
            {
                "Pod": POD,
                "NodeNameToMetaVictims": {"node-0": {"Pods": [], "NumPDBViolations": "1"}},
            },
            "NumPDBViolations must be an integer",
        ),
        (
            "preempt",
            {"Pod": POD, "NodeNameToVictims": {"node-0": {"Pods": [{"metadata": {}}]}}},
            "a victim's uid must be a non-empty string",
        ),
        (
            "filter",
            {"Pod": {**POD, "spec": {"containers": [{"ports": [1]}]}}, "NodeNames": NODES},
            "Pod.spec.containers.0.ports.0",
        ),
        (
            "filter",
            {
                "Pod": {**POD, "spec": {"containers": [{"ports": [{"hostPort": [1]}]}]}},
                "NodeNames": NODES,
            },
            "Pod.spec.containers.0.ports.0.hostPort",
        ),
        (
            "preempt",
            {
                "Pod": POD,
                "NodeNameToVictims": {
                    "node-0": {
                        "Pods": [
                            {
                                "metadata": {"uid": "v"},
                                "status": {"containerStatuses": [{"resources": {"requests": [1]}}]},
                            }
                        ]
                    }
                },
            },
            "a victim.status.containerStatuses.0.resources.requests",
        ),
    ],
)
def test_bad_requests_get_an_error_not_an_exception(
    ledger: Ledger, verb: str, body: bytes | dict[str, Any], message: str
) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    status, result = answer(ledger, verb, raw, placement=Placement.SPREAD, ready=True)
    if verb == "filter":
        # The scheduler reads Error only from a 200; it fails the attempt with that message.
        assert status == 200
        assert result == {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": None,
            "FailedAndUnresolvableNodes": None,
            "Error": result["Error"],
        }
    else:
        assert status == 400
    assert result["Error"].startswith(f"bad {verb} request: ")
    assert message in result["Error"]


@pytest.mark.parametrize(
    ("verb", "status"), [("filter", 200), ("prioritize", 503), ("preempt", 503)]
)
def test_no_answer_before_the_caches_sync(ledger: Ledger, verb: str, status: int) -> None:
    body = orjson.dumps(FILTER_ARGS)
    code, result = answer(ledger, verb, body, placement=Placement.SPREAD, ready=False)
    assert code == status
    assert result["Error"] == "the extender's caches are not synced yet"


def test_answers_use_the_go_field_names(ledger: Ledger) -> None:
    body = orjson.dumps(FILTER_ARGS)
    for verb, fields in (
        ("filter", {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}),
        ("preempt", {"NodeNameToMetaVictims"}),
    ):
        _, result = answer(ledger, verb, body, placement=Placement.SPREAD, ready=True)
        assert set(result) == fields
    _, result = answer(
        ledger, "prioritize", orjson.dumps(PRIORITIZE_ARGS), placement=Placement.SPREAD, ready=True
    )
    assert all(set(entry) == {"Host", "Score"} for entry in result)


@pytest.mark.parametrize(("violations", "kept"), [(0, ["node-0"]), (1, [])])
def test_a_placeholder_preempts_no_pod_a_pdb_protects(
    ledger: Ledger, violations: int, kept: list[str]
) -> None:
    """A placeholder allowed to preempt keeps only the candidates an eviction could
    empty: the scheduler's own count of PDB violations decides, for a pod naming a
    Reservation as its controller whether or not the extender has seen it recorded."""
    args = preemption({"node-0": ["uid-x"]}, cpu="1", placeholder="new")
    args["NodeNameToMetaVictims"]["node-0"]["NumPDBViolations"] = violations
    result, dropped = preempt(ledger, parse_preemption_args(args))
    assert list(result["NodeNameToMetaVictims"]) == kept
    if violations:
        assert "PodDisruptionBudget" in dropped["node-0"]


def test_an_ordinary_pod_preempts_as_the_scheduler_decides(ledger: Ledger) -> None:
    """Other pods keep the scheduler's best effort: a victim set violating a PDB stays."""
    args = preemption({"node-0": ["uid-x"]}, cpu="1")
    assert args["NodeNameToMetaVictims"]["node-0"]["NumPDBViolations"] == 1
    result, _ = preempt(ledger, parse_preemption_args(args))
    assert list(result["NodeNameToMetaVictims"]) == ["node-0"]


def many_nodes() -> tuple[Ledger, list[str]]:
    """60 nodes, busy in turn, with bound placeholders, Reservations in handover (one whose
    placeholder this cache still sees), and a Reservation whose owner is bound."""
    ledger = Ledger()
    names = [f"n-{index}" for index in range(60)]
    for index, name in enumerate(names):
        ledger.on_node("ADDED", node(name))
        ledger.on_pod("ADDED", pod(f"busy-{index}", cpu=str(index % 7), node=name))
    for index in range(0, 60, 10):
        held, handed = names[index], names[index + 1]
        ledger.on_pod(
            "ADDED", pod(f"b{index}-placeholder", cpu="2", node=held, placeholder=f"b{index}")
        )
        ledger.on_reservation("ADDED", reservation(f"b{index}", node=held, cpu="2"))
        ledger.on_reservation(
            "ADDED", reservation(f"h{index}", node=handed, cpu="3", owners=(f"owner-{index}",))
        )
    ledger.on_pod("ADDED", pod("s-placeholder", cpu="1", node="n-5", placeholder="s"))
    ledger.on_reservation("ADDED", reservation("s", node="n-5", cpu="1", owners=("s-owner",)))
    ledger.on_pod("ADDED", pod("done-owner", uid="done-owner", node="n-7"))
    ledger.on_reservation("ADDED", reservation("done", node="n-7", owners=("done-owner",)))
    return ledger, names


@pytest.mark.parametrize("cpu", ["0", "1", "3", "6"])
@pytest.mark.parametrize("uid", [None, "owner-10", "s-owner"])
def test_verbs_judge_only_nodes_with_reservations_yet_answer_as_for_every_node(
    cpu: str, uid: str | None
) -> None:
    """The fast paths (a pod that owns nothing is judged only on nodes in handover, and
    scored only on nodes with something promised) give what judging every node gives."""
    ledger, names = many_nodes()
    args = parse_args(scheduled(FILTER_ARGS, cpu=cpu, uid=uid, nodes=[*reversed(names), "n-99"]))
    pod_ = pending(ledger, args.pod)
    judged = {name: refusal(ledger, pod_, name) for name in args.node_names}
    result = filter_nodes(ledger, args)
    assert result["NodeNames"] == [name for name, refused in judged.items() if refused is None]
    assert {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]} == {
        name: refused.reason for name, refused in judged.items() if refused is not None
    }
    # the held nodes do refuse
    assert result["FailedAndUnresolvableNodes"] or uid or cpu in ("0", "1")
    for placement in Placement:
        assert prioritize(ledger, args, placement=placement) == [
            {"Host": name, "Score": score(ledger, pod_, name, placement=placement)}
            for name in args.node_names
        ]


def test_a_bad_name_among_thousands_is_named() -> None:
    names: list[Any] = [f"node-{index}" for index in range(5000)]
    for bad in ("", None, 7):
        body = orjson.dumps({"Pod": POD, "NodeNames": [*names, bad]})
        status, result = answer(Ledger(), "filter", body, placement=Placement.SPREAD, ready=True)
        assert status == 200
        assert "each of NodeNames must be a non-empty string" in result["Error"]
