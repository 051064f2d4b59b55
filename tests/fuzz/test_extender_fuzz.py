"""The extender's HTTPS endpoints under hostile ExtenderArgs: for every verb, every body
gets the verb's result or a refusal with a reason (filter: an `Error` in its result;
prioritize and preempt: a 4xx), never a 5xx, a traceback or a hang.

The ledger holds what makes every decision path run: a Reservation in handover with a
recorded owner, a live placeholder, nodes with and without room.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import orjson
import pytest
from hypothesis import given

from berth import web
from berth.ledger import Ledger
from extender.app import make_app
from extender.decide import MAX_SCORE, Placement
from tests.fuzz.bodies import Request, requests
from tests.fuzz.harness import REFUSED_EARLY, Client, Crashes, crash_log, running
from tests.fuzz.settings import CASES, FUZZ
from tests.unit.test_extender import FILTER_ARGS, PRIORITIZE_ARGS, Q_OWNER, R_OWNER, scheduled
from tests.unit.test_ledger import node, pod, reservation

NODES = ["node-0", "node-1", "node-2"]


def _ledger() -> Ledger:
    """node-0: empty. node-1: a 2-CPU pod and Reservation r (4 CPU) in handover.
    node-2: the live placeholder of Reservation q, whose owner is recorded."""
    ledger = Ledger()
    for name in NODES:
        ledger.on_node("ADDED", node(name))
    ledger.on_pod("ADDED", pod("busy", cpu="2", node="node-1"))
    ledger.on_reservation("ADDED", reservation("r", node="node-1", cpu="4", owners=(R_OWNER,)))
    ledger.on_pod("ADDED", pod("q-placeholder", cpu="3", node="node-2", placeholder="q"))
    ledger.on_reservation("ADDED", reservation("q", node="node-2", cpu="3", owners=(Q_OWNER,)))
    return ledger


def _node_list(args: dict[str, Any]) -> dict[str, Any]:
    """The same request with whole nodes (nodeCacheCapable: false) instead of names."""
    changed = copy.deepcopy(args)
    changed["Nodes"] = {"items": [node(name) for name in changed.pop("NodeNames")]}
    changed["NodeNames"] = None
    return changed


ARGS = [
    scheduled(FILTER_ARGS, cpu="3"),
    scheduled(FILTER_ARGS, uid=R_OWNER),
    scheduled(FILTER_ARGS, placeholder="q", cpu="3"),
    scheduled(PRIORITIZE_ARGS, cpu="500m"),
    _node_list(scheduled(FILTER_ARGS, cpu="1")),
]


def _preemption(args: dict[str, Any], *, full: bool) -> dict[str, Any]:
    """Victims on node-1 (an ordinary pod) and node-2 (q's placeholder), by UID or whole."""
    victims = {"node-1": pod("busy", cpu="2", node="node-1")}
    victims["node-2"] = pod("q-placeholder", cpu="3", node="node-2", placeholder="q")
    if full:
        key = "NodeNameToVictims"
        value = {n: {"Pods": [p], "NumPDBViolations": 0} for n, p in victims.items()}
    else:
        key = "NodeNameToMetaVictims"
        value = {
            n: {"Pods": [{"UID": p["metadata"]["uid"]}], "NumPDBViolations": 1}
            for n, p in victims.items()
        }
    return {"Pod": args["Pod"], key: value}


PREEMPTION_ARGS = [
    _preemption(scheduled(FILTER_ARGS, cpu="4"), full=False),
    _preemption(scheduled(FILTER_ARGS, cpu="4"), full=True),
    _preemption(scheduled(FILTER_ARGS, uid=R_OWNER), full=False),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Crashes]]:
    async def make(_: AsyncExitStack) -> web.App:
        return make_app(_ledger(), placement=Placement.SPREAD, ready=lambda: True)

    with crash_log() as crashes, running(make, tmp_path_factory.mktemp("tls")) as http:
        yield http, crashes


def _names(args: Any) -> list[str] | None:
    """The candidate node names of a filter or prioritize request the extender can read."""
    if not isinstance(args, dict) or not isinstance(args.get("Pod"), dict):
        return None
    if isinstance(args.get("NodeNames"), list):
        return list(args["NodeNames"])
    nodes = args.get("Nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        return [item["metadata"]["name"] for item in nodes["items"]]
    return []


def check_filter(request: Request, status: int, result: Any) -> None:
    assert status == 200, "filter answers every request with a result"
    assert isinstance(result, dict)
    if result["Error"]:
        assert isinstance(result["Error"], str)
        return
    # A correct answer: every candidate node passed, failed or unresolvable, once.
    names = _names(orjson.loads(request.sent))
    assert names is not None
    passed = result["NodeNames"]
    if passed is None:
        passed = [item["metadata"]["name"] for item in result["Nodes"]["items"]]
    refused = [*result["FailedNodes"], *result["FailedAndUnresolvableNodes"]]
    assert sorted(passed + refused) == sorted(set(names)) or sorted(passed + refused) == sorted(
        names
    )


def check_prioritize(request: Request, status: int, result: Any) -> None:
    if status != 200:
        assert 400 <= status < 500
        assert result["Error"]
        return
    names = _names(orjson.loads(request.sent))
    assert [entry["Host"] for entry in result] == names
    assert all(0 <= entry["Score"] <= MAX_SCORE for entry in result)


def check_preempt(request: Request, status: int, result: Any) -> None:
    if status != 200:
        assert 400 <= status < 500
        assert result["Error"]
        return
    sent = orjson.loads(request.sent)
    offered = sent.get("NodeNameToMetaVictims") or sent.get("NodeNameToVictims") or {}
    kept = result["NodeNameToMetaVictims"]
    assert set(kept) <= set(offered)
    # q's placeholder never becomes a victim.
    assert "node-2" not in kept or all(
        victim["UID"] != "uid-q-placeholder" for victim in kept["node-2"]["Pods"]
    )


CHECKS = {"filter": check_filter, "prioritize": check_prioritize, "preempt": check_preempt}


def run(http: Client, crashes: Crashes, verb: str, bases: list[Any]) -> None:
    cases = 0

    @FUZZ
    @given(request=requests(bases))
    def case(request: Request) -> None:
        nonlocal cases
        cases += 1
        answer = http.post(f"/{verb}", request.body, request.headers)
        assert not crashes.take(), "the server logged a traceback"
        if answer is None:
            assert len(request.body) > REFUSED_EARLY, "the server closed the connection"
            return
        assert answer.status < 500, f"{answer.status}: {answer.body[:500]!r}"
        if answer.content_type.startswith("application/json"):
            CHECKS[verb](request, answer.status, orjson.loads(answer.body))
        else:  # refused before the extender read it (415, 413, an unreadable body)
            assert 400 <= answer.status < 500
            assert answer.body.strip()

    case()
    assert cases >= CASES


def test_filter(server: tuple[Client, Crashes]) -> None:
    run(*server, "filter", ARGS)


def test_prioritize(server: tuple[Client, Crashes]) -> None:
    run(*server, "prioritize", ARGS)


def test_preempt(server: tuple[Client, Crashes]) -> None:
    run(*server, "preempt", PREEMPTION_ARGS)
