"""The webhook's decision: which Reservation a pod CREATE claims, if any."""

from __future__ import annotations

from typing import Any

import pytest

from berth.api import API_VERSION, keys
from berth.protocol import controller_of, is_replicaset, matches_owner, top_level_workload
from tests.unit.webhook_cases import (
    DEPLOYMENT_UID,
    NAMESPACE,
    REPLICASET_UID,
    REVIEW,
    TOKEN,
    Change,
    allocated,
    by_name,
    claimed_by,
    handed_over,
    request,
    reservation,
    set_in,
)
from webhook.decide import (
    Claim,
    Reassert,
    Skip,
    TakeOver,
    decide,
    pod_of,
    worth_a_fresh_look,
)


def closed(name: str) -> dict[str, Any]:
    """Opened, then closed again after its pod's eviction was refused."""
    closed = reservation(name, opened="2026-11-21T23:56:22.020000Z")
    closed["metadata"]["annotations"][keys.CONSUMABLE] = keys.CLOSED
    return closed


def holding(name: str, spec: dict[str, Any], **options: Any) -> dict[str, Any]:
    """A Reservation whose template's pod spec is `spec` (what its placeholder asked)."""
    made = reservation(name, **options)
    made["spec"]["template"]["spec"] = spec
    return made


def asking(cpu: str | None = None, **spec: Any) -> Change:
    """The pod asks `cpu` in its one container, and has the other `spec` fields."""

    def change(req: dict[str, Any]) -> None:
        pod = req["object"]["spec"]
        if cpu is not None:
            pod["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
        pod.update(spec)

    return change


def app(**values: str) -> dict[str, Any]:
    """A container asking `values`."""
    return {"name": "app", "resources": {"requests": values}}


def requests(**values: str) -> dict[str, Any]:
    """A pod spec of one container asking `values`."""
    return {"containers": [app(**values)]}


@pytest.mark.parametrize(
    ("changes", "reservations", "workload_uid", "expected"),
    [
        pytest.param([], [reservation("r1")], REPLICASET_UID, ["r1"], id="same controller"),
        pytest.param(
            [],
            [reservation("r1", owner_uid="old-rs", workload=DEPLOYMENT_UID)],
            DEPLOYMENT_UID,
            ["r1"],
            id="same workload, new ReplicaSet of a rollout",
        ),
        pytest.param(
            [],
            [reservation("r1", owner_uid="old-rs", workload="other")],
            DEPLOYMENT_UID,
            "no consumable reservation",
            id="other workload",
        ),
        pytest.param(
            [],
            [
                reservation("young", created="2026-11-21T23:55:00Z"),
                reservation("b-old"),
                reservation("a-old"),
            ],
            REPLICASET_UID,
            ["a-old", "b-old", "young"],
            id="none opened with a time: oldest first, then by name",
        ),
        pytest.param(
            [],
            [
                # Created first but opened a moment ago, its pod still running: the
                # replacement of the pod evicted after the other's opening takes the other.
                reservation("a-sibling", opened="2026-11-21T23:56:23.010000Z"),
                reservation("z-own", opened="2026-11-21T23:56:22.020000Z"),
                reservation("unopened-time", created="2026-11-21T23:55:00Z"),
            ],
            REPLICASET_UID,
            ["unopened-time", "z-own", "a-sibling"],
            id="first opened first (within a second), one opened by a Berth that wrote no time "
            "before all",
        ),
        pytest.param(
            [],
            [
                reservation("b", opened="2026-11-21T23:56:22.5Z"),
                reservation("a", opened="2026-11-21T23:56:22.500000Z"),
                reservation("c", opened="not a time"),
            ],
            REPLICASET_UID,
            ["c", "a", "b"],
            id="opened in the same instant: by name; an unreadable time counts as none",
        ),
        pytest.param(
            [],
            [reservation("r1", consumable=False)],
            REPLICASET_UID,
            "no consumable reservation",
            id="not yet consumable",
        ),
        pytest.param(
            [],
            [closed("r1")],
            REPLICASET_UID,
            "no consumable reservation",
            id="closed again after its pod's eviction was refused",
        ),
        pytest.param(
            [],
            [reservation("r1", claim="other")],
            REPLICASET_UID,
            "no consumable reservation",
            id="claimed by another pod",
        ),
        pytest.param(
            [],
            [reservation("r1", phase="Pending")],
            REPLICASET_UID,
            "no consumable reservation",
            id="not available",
        ),
        pytest.param(
            [],
            [reservation("r1", namespace="elsewhere")],
            REPLICASET_UID,
            "no consumable reservation",
            id="made for another namespace",
        ),
        pytest.param(
            [],
            [],
            REPLICASET_UID,
            "no consumable reservation for ReplicaSet web-",
            id="no reservation at all",
        ),
        pytest.param(
            [set_in("operation", "UPDATE")],
            [reservation("r1")],
            REPLICASET_UID,
            "not a pod CREATE",
            id="update",
        ),
        pytest.param(
            [set_in("dryRun", True)], [reservation("r1")], REPLICASET_UID, "dry run", id="dry run"
        ),
        pytest.param(
            [set_in("object.metadata.ownerReferences", [])],
            [reservation("r1")],
            None,
            "no controller",
            id="bare pod",
        ),
        pytest.param(
            [
                set_in(
                    "object.metadata.ownerReferences",
                    [
                        {
                            "apiVersion": API_VERSION,
                            "kind": "Reservation",
                            "name": "r0",
                            "uid": "u",
                            "controller": True,
                        }
                    ],
                )
            ],
            [reservation("r1")],
            REPLICASET_UID,
            "placeholder",
            id="placeholder pod",
        ),
        pytest.param(
            [set_in("object.spec.nodeName", "node-2")],
            [reservation("r1")],
            REPLICASET_UID,
            "already assigned to node node-2",
            id="pod with nodeName",
        ),
        pytest.param(
            [set_in("object.metadata.annotations", {keys.RESERVATION_ALLOCATED: allocated("r0")})],
            [reservation("r1")],
            REPLICASET_UID,
            "already bound to reservation",
            id="bound by someone else",
        ),
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1", claim=TOKEN)],
            REPLICASET_UID,
            ("r1", TOKEN),
            id="reinvoked",
        ),
        # A token the cache does not see on the Reservation buys nothing on this cache (a
        # forged token must not get the gate); an open one is read again (`recheck`: a
        # reinvocation may come before the cache shows its claim).
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1")],
            REPLICASET_UID,
            "no longer waits for it",
            id="token not (yet) on the reservation",
        ),
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1", claim="other")],
            REPLICASET_UID,
            "no longer waits for it",
            id="reinvoked, claim lost",
        ),
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1", consumable=False)],
            REPLICASET_UID,
            "no longer waits for it",
            id="reinvoked, reservation closed",
        ),
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1", claim=TOKEN, phase="Succeeded")],
            REPLICASET_UID,
            "no longer waits for it",
            id="made from the manifest of a pod bound earlier",
        ),
        pytest.param(
            [claimed_by("r1")],
            [handed_over(reservation("r1", claim=TOKEN))],
            REPLICASET_UID,
            "no longer waits for it",
            id="claimed, already handed over",
        ),
        pytest.param(
            [claimed_by("r1")],
            [],
            REPLICASET_UID,
            "not in the cache",
            id="reinvoked, reservation unknown",
        ),
        # The token is readable on the pod that claimed: carried by a pod the Reservation
        # was not made for, or one asking more than it holds, it binds nothing.
        pytest.param(
            [claimed_by("r1")],
            [reservation("r1", claim=TOKEN, owner_uid="00000000-0000-4000-8000-0000000000aa")],
            REPLICASET_UID,
            "which was not made for its workload",
            id="a claim copied onto another workload's pod",
        ),
        pytest.param(
            [claimed_by("r1"), asking("2")],
            [holding("r1", requests(cpu="100m"), claim=TOKEN)],
            REPLICASET_UID,
            "requests more than reservation r1 holds: cpu 2",
            id="a claim copied onto a larger pod",
        ),
        pytest.param(
            [claimed_by("r1")],
            [
                reservation(
                    "r1",
                    claim=TOKEN,
                    owner_uid="00000000-0000-4000-8000-0000000000aa",
                    workload=DEPLOYMENT_UID,
                )
            ],
            DEPLOYMENT_UID,
            ("r1", TOKEN),
            id="reinvoked, a rollout's pod of the same Deployment",
        ),
        pytest.param(
            [set_in("object.metadata.annotations", {keys.CLAIM: TOKEN})],
            [reservation("r1", claim=TOKEN)],
            REPLICASET_UID,
            f"without a readable {keys.RESERVATION_ALLOCATED}",
            id="claim without reservation-allocated",
        ),
        *(
            pytest.param(
                [
                    set_in(
                        "object.metadata.annotations",
                        {keys.CLAIM: TOKEN, keys.RESERVATION_ALLOCATED: allocated},
                    )
                ],
                [reservation("r1", claim=TOKEN)],
                REPLICASET_UID,
                f"without a readable {keys.RESERVATION_ALLOCATED}",
                id=f"claim with reservation-allocated {allocated}",
            )
            for allocated in (
                '{"name": {}, "uid": "u"}',
                '{"name": ["r1"], "uid": "u"}',
                '{"name": "r1", "uid": 7}',
                '["r1"]',
                "null",
            )
        ),
    ],
)
def test_decide(
    changes: list[Change],
    reservations: list[dict[str, Any]],
    workload_uid: str | None,
    expected: list[str] | str | tuple[str, str],
) -> None:
    decision = decide(
        request(*changes), reservations=by_name(*reservations), workload_uid=workload_uid
    )
    if isinstance(expected, str):
        assert isinstance(decision, Skip)
        assert expected in decision.reason
    elif isinstance(expected, tuple):
        assert isinstance(decision, Reassert)
        assert (decision.reservation["metadata"]["name"], decision.token) == expected
    else:
        assert isinstance(decision, Claim)
        assert [r["metadata"]["name"] for r in decision.candidates] == expected


@pytest.mark.parametrize(
    ("cached", "recheck"),
    [
        (reservation("r1"), "r1"),  # open, unclaimed: this cache may lag the claim
        (reservation("r1", claim="other"), "r1"),  # or lag a takeover
        (handed_over(reservation("r1", claim="other")), None),
        # Not open in this cache: it may lag the opening the claim was made on.
        (reservation("r1", consumable=False), "r1"),
        (reservation("r1", claim=TOKEN, phase="Pending"), None),
        (reservation("r1", claim=TOKEN, phase="Succeeded"), None),
    ],
)
def test_a_claim_the_cache_does_not_show_on_an_open_reservation_is_worth_a_read(
    cached: dict[str, Any], recheck: str | None
) -> None:
    decision = decide(
        request(claimed_by("r1")), reservations=by_name(cached), workload_uid=REPLICASET_UID
    )
    assert isinstance(decision, Skip)
    assert decision.recheck == recheck


@pytest.mark.parametrize(
    ("cached", "taken_over"),
    [
        (reservation("r1", claim="old"), True),
        # An owner recorded: the claim was carried.
        (handed_over(reservation("r1", claim="old")), False),
        # Made for another workload, or closed: not this pod's to take.
        (reservation("r1", claim="old", owner_uid="00000000-0000-4000-8000-0000000000aa"), False),
        (reservation("r1", claim="old", consumable=False), False),
    ],
)
def test_a_claim_no_owner_took_may_be_contested_by_a_pod_of_its_workload(
    cached: dict[str, Any], taken_over: bool
) -> None:
    """A claim is written while its pod is being admitted; refused after that (a quota,
    a policy), the pod is never stored and the claim binds nothing. The workload's next
    pod may take the Reservation over: `webhook.app` first asks the API server whether
    any pod carries the old claim."""
    decision = decide(
        request(), reservations=by_name(cached), workload_uid=REPLICASET_UID, contest=True
    )
    if taken_over:
        assert isinstance(decision, TakeOver)
        assert [r["metadata"]["name"] for r in decision.candidates] == ["r1"]
    else:
        assert isinstance(decision, Skip)
    # Not asked to contest claims, or its ReplicaSet not confirmed: nothing is taken over.
    for workload_uid, contest in ((REPLICASET_UID, False), (None, True)):
        assert isinstance(
            decide(
                request(), reservations=by_name(cached), workload_uid=workload_uid, contest=contest
            ),
            Skip,
        )


def test_decide_uses_the_request_namespace_when_the_pod_has_none() -> None:
    decision = decide(
        request(lambda req: req["object"]["metadata"].pop("namespace")),
        reservations=by_name(reservation("r1")),
        workload_uid=REPLICASET_UID,
    )
    assert isinstance(decision, Claim)


@pytest.mark.parametrize(
    ("replicaset", "expected"),
    [
        pytest.param(
            {
                "metadata": {
                    "uid": REPLICASET_UID,
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": "web",
                            "uid": DEPLOYMENT_UID,
                            "controller": True,
                        }
                    ],
                }
            },
            DEPLOYMENT_UID,
            id="ReplicaSet of a Deployment",
        ),
        pytest.param(
            {"metadata": {"uid": REPLICASET_UID}}, REPLICASET_UID, id="ReplicaSet on its own"
        ),
        pytest.param(
            {
                "metadata": {
                    "uid": "recreated",
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": "web",
                            "uid": DEPLOYMENT_UID,
                            "controller": True,
                        }
                    ],
                }
            },
            REPLICASET_UID,
            id="a different ReplicaSet of the same name",
        ),
        pytest.param(None, REPLICASET_UID, id="ReplicaSet gone"),
        # Written by whoever created the ReplicaSet: only a Deployment above it counts.
        pytest.param(
            {
                "metadata": {
                    "uid": REPLICASET_UID,
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "StatefulSet",
                            "name": "db",
                            "uid": "5e7f0000-0000-4000-8000-0000000000db",
                            "controller": True,
                        }
                    ],
                }
            },
            REPLICASET_UID,
            id="a StatefulSet named above a ReplicaSet",
        ),
        pytest.param(
            {
                "metadata": {
                    "uid": REPLICASET_UID,
                    "ownerReferences": [
                        {
                            "apiVersion": "argoproj.io/v1alpha1",
                            "kind": "Rollout",
                            "name": "web",
                            "uid": DEPLOYMENT_UID,
                            "controller": True,
                        }
                    ],
                }
            },
            REPLICASET_UID,
            id="another kind above a ReplicaSet",
        ),
    ],
)
def test_top_level_workload(replicaset: dict[str, Any] | None, expected: str) -> None:
    controller = REVIEW["request"]["object"]["metadata"]["ownerReferences"][0]
    assert top_level_workload(controller, replicaset) == expected


# ----- who created the pod ------------------------------------------------------------------

STATEFULSET_UID = "5e7f0000-0000-4000-8000-00000000f5f5"
STATEFULSET = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "name": "db",
    "uid": STATEFULSET_UID,
    "controller": True,
}


def statefulset_reservation(name: str) -> dict[str, Any]:
    found = reservation(name)
    found["spec"]["owners"] = [{"controller": dict(STATEFULSET)}]
    return found


def created_by(username: str | None) -> Change:
    def change(req: dict[str, Any]) -> None:
        if username is None:
            req.pop("userInfo")
        else:
            req["userInfo"] = {"username": username, "groups": ["system:authenticated"]}

    return change


def owned_by(owner: dict[str, Any]) -> Change:
    return set_in("object.metadata.ownerReferences", [owner])


@pytest.mark.parametrize(
    ("changes", "reservations", "expected"),
    [
        pytest.param(
            [created_by("alice")],
            [reservation("r1")],
            "created by alice, not by the apps/v1 ReplicaSet controller",
            id="a user copies a ReplicaSet's owner reference",
        ),
        pytest.param(
            [created_by(None)],
            [reservation("r1")],
            "created by an unknown user",
            id="no userInfo",
        ),
        pytest.param(
            [created_by("system:serviceaccount:kube-system:statefulset-controller")],
            [reservation("r1")],
            "not by the apps/v1 ReplicaSet controller",
            id="another kind's controller",
        ),
        pytest.param(
            [created_by("system:serviceaccount:other:replicaset-controller")],
            [reservation("r1")],
            "not by the apps/v1 ReplicaSet controller",
            id="a ServiceAccount of the same name elsewhere",
        ),
        pytest.param(
            [created_by("system:kube-controller-manager")],
            [reservation("r1")],
            ["r1"],
            id="kube-controller-manager without per-controller credentials",
        ),
        pytest.param(
            [
                owned_by(STATEFULSET),
                created_by("system:serviceaccount:kube-system:statefulset-controller"),
            ],
            [statefulset_reservation("r1")],
            ["r1"],
            id="a StatefulSet's pod",
        ),
        pytest.param(
            [owned_by(STATEFULSET), created_by("alice")],
            [statefulset_reservation("r1")],
            "created by alice, not by the apps/v1 StatefulSet controller",
            id="a user copies a StatefulSet's owner reference",
        ),
        pytest.param(
            [
                owned_by({**STATEFULSET, "kind": "CloneSet", "apiVersion": "apps.kruise.io/v1"}),
                created_by("system:serviceaccount:kruise-system:kruise-manager"),
            ],
            [reservation("r1")],
            "a apps.kruise.io/v1 CloneSet, whose pods Berth does not bind",
            id="a kind Berth does not bind",
        ),
        pytest.param(
            [
                owned_by({**STATEFULSET, "apiVersion": "apps/v1beta2"}),
                created_by("system:serviceaccount:kube-system:statefulset-controller"),
            ],
            [statefulset_reservation("r1")],
            "whose pods Berth does not bind",
            id="a kind of the same name in another API version",
        ),
        pytest.param(
            [claimed_by("r1"), created_by("alice")],
            [reservation("r1", claim=TOKEN)],
            "created by alice",
            id="a user's pod carrying a copied claim",
        ),
    ],
)
def test_only_the_controllers_own_pods_take_a_reservation(
    changes: list[Change], reservations: list[dict[str, Any]], expected: list[str] | str
) -> None:
    req = request(*changes)
    # What webhook.app resolves through the API server for a ReplicaSet's pod.
    controller = controller_of(req["object"]) or {}
    workload_uid = REPLICASET_UID if is_replicaset(controller) else None
    decision = decide(req, reservations=by_name(*reservations), workload_uid=workload_uid)
    if isinstance(expected, str):
        assert isinstance(decision, Skip)
        assert expected in decision.reason
    else:
        assert isinstance(decision, Claim)
        assert [r["metadata"]["name"] for r in decision.candidates] == expected


# ----- owners of a Reservation made by hand --------------------------------------------------


def by_hand(owner: dict[str, Any], *, namespace: str | None) -> dict[str, Any]:
    """A Reservation an admin made for a job's reservationRef: its template may name no
    namespace, its owners any of the three kinds."""
    found = reservation("by-hand")
    found["spec"]["owners"] = [owner]
    found["spec"]["template"]["metadata"] = {"namespace": namespace} if namespace else {}
    return found


LABELLED = {"labelSelector": {"matchLabels": {"app": "web"}}}


@pytest.mark.parametrize(
    ("owner", "namespace", "changes", "expected"),
    [
        pytest.param(LABELLED, NAMESPACE, [], True, id="selector, in the template's namespace"),
        pytest.param(
            LABELLED,
            None,
            [set_in("namespace", "default"), set_in("object.metadata.namespace", "default")],
            True,
            id="selector, no template namespace: a pod of default",
        ),
        pytest.param(
            LABELLED,
            None,
            [],
            False,
            id="selector, no template namespace: a pod of another namespace",
        ),
        pytest.param(
            {"object": {"namespace": NAMESPACE, "uid": "uid-of-another-pod"}},
            NAMESPACE,
            [],
            False,
            id="an object owner with no name, a pod with a generated name",
        ),
        pytest.param(
            {"object": {"namespace": NAMESPACE, "name": "web-0"}},
            NAMESPACE,
            [set_in("object.metadata.name", "web-0")],
            True,
            id="an object owner naming the pod",
        ),
        pytest.param(
            {"object": {"namespace": NAMESPACE, "name": "web-0", "uid": "uid-old-web-0"}},
            NAMESPACE,
            [set_in("object.metadata.name", "web-0")],
            False,
            id="an object owner naming the pod and a UID (a pod created has none yet)",
        ),
    ],
)
def test_owners_of_a_reservation_made_by_hand(
    owner: dict[str, Any], namespace: str | None, changes: list[Change], expected: bool
) -> None:
    """The webhook claims a Reservation only for a pod the controller will record as its
    owner: in the Reservation's placeholder namespace (the template's, else its owners',
    else default), as `may_claim` requires; an object owner names a pod by its name."""
    req = request(set_in("object.metadata.labels", {"app": "web"}), *changes)
    found = by_hand(owner, namespace=namespace)
    assert matches_owner(found, pod_of(req), workload_uid=None) is expected
    decision = decide(req, reservations=by_name(found), workload_uid=DEPLOYMENT_UID)
    assert isinstance(decision, Claim) is expected


# ----- a fresh look at Reservations about to open ---------------------------------------------


@pytest.mark.parametrize(
    ("changes", "owners", "workload_uid", "looked_up", "expected"),
    [
        pytest.param([], None, DEPLOYMENT_UID, True, ["r1"], id="a ReplicaSet's pod"),
        pytest.param([], None, None, True, [], id="a ReplicaSet's pod not confirmed"),
        pytest.param(
            [
                owned_by(STATEFULSET),
                created_by("system:serviceaccount:kube-system:statefulset-controller"),
            ],
            [{"controller": dict(STATEFULSET)}],
            None,
            True,
            ["r1"],
            id="a StatefulSet's pod",
        ),
        pytest.param([], None, DEPLOYMENT_UID, False, [], id="no Reservation in flight"),
        pytest.param(
            [owned_by(STATEFULSET)],
            None,
            None,
            True,
            [],
            id="another workload's Reservation",
        ),
    ],
)
def test_reservations_about_to_open_are_read_again(
    changes: list[Change],
    owners: list[dict[str, Any]] | None,
    workload_uid: str | None,
    looked_up: bool,
    expected: list[str],
) -> None:
    """A replacement may come before this webhook's cache has seen its Reservation opened:
    the matching ones the cache shows about to open are read again, for a StatefulSet's
    or Job's pod as for a ReplicaSet's."""
    about_to_open = reservation("r1", consumable=False, workload=DEPLOYMENT_UID)
    if owners is not None:
        about_to_open["spec"]["owners"] = owners
    req = request(*changes)
    reservations = by_name(about_to_open)
    decision = decide(req, reservations=reservations, workload_uid=workload_uid)
    assert isinstance(decision, Skip)
    assert worth_a_fresh_look(decision, pod_of(req), reservations, looked_up, workload_uid) == (
        expected
    )


@pytest.mark.parametrize(
    ("changes", "reservations", "expected"),
    [
        pytest.param([asking("200m")], [holding("r1", requests(cpu="200m"))], ["r1"], id="as much"),
        pytest.param([asking("100m")], [holding("r1", requests(cpu="0.2"))], ["r1"], id="less"),
        pytest.param(
            [asking("300m")],
            [holding("r1", requests(cpu="200m"))],
            "requests more than reservation r1 holds: cpu 300m (it holds 200m)",
            id="a rollout's larger pod",
        ),
        pytest.param(
            [
                asking(
                    "200m",
                    initContainers=[{"name": "init", "resources": {"requests": {"memory": "1Gi"}}}],
                )
            ],
            [holding("r1", requests(cpu="200m", memory="512Mi"))],
            "requests more than reservation r1 holds: memory 1073741824 (it holds 536870912)",
            id="more of another resource, in an init container",
        ),
        pytest.param(
            [asking(containers=[app(cpu="200m", memory="1Gi")])],
            [holding("r1", requests(cpu="200m"))],
            ["r1"],
            id="a resource the Reservation does not name is not judged: one made for CPU",
        ),
        pytest.param(
            [asking(containers=[app(cpu="200m", memory="1Gi")])],
            [
                holding(
                    "r1",
                    {"containers": [{"name": "app", "resources": {"limits": {"memory": "512Mi"}}}]},
                )
            ],
            ["r1"],
            id="a template's limit holds nothing: its placeholder asks its requests alone",
        ),
        pytest.param(
            [asking("300m")],
            [
                holding("small", requests(cpu="200m")),
                holding("large", requests(cpu="500m"), created="2026-11-22T00:00:00Z"),
            ],
            ["large"],
            id="only the Reservations that hold enough",
        ),
        pytest.param(
            [asking("200m", overhead={"cpu": "250m"}, runtimeClassName="kata")],
            [holding("r1", {**requests(cpu="200m"), "runtimeClassName": "kata"})],
            ["r1"],
            id="the runtime class's overhead on the pod and not in the template",
        ),
        pytest.param(
            [asking("2")],
            [holding("r1", {"containers": [{"name": "app"}]})],
            ["r1"],
            id="a template that requests nothing is not judged",
        ),
        pytest.param(
            [asking("2")],
            [holding("r1", requests(cpu="lots"))],
            "reservation r1 holds requests that cannot be read (invalid quantity 'lots')",
            id="a template whose requests cannot be read",
        ),
        pytest.param(
            [asking("2")],
            [holding("r1", {"containers": "app"})],
            "reservation r1 holds requests that cannot be read",
            id="a template whose containers are not a list",
        ),
    ],
)
def test_a_pod_takes_only_a_reservation_that_holds_what_it_asks(
    changes: list[Change], reservations: list[dict[str, Any]], expected: list[str] | str
) -> None:
    """Bound to a place smaller than it asks, a pod may never fit there, and its affinity
    to that node could never be lifted: it is left to the scheduler instead."""
    decision = decide(
        request(*changes), reservations=by_name(*reservations), workload_uid=REPLICASET_UID
    )
    if isinstance(expected, str):
        assert isinstance(decision, Skip)
        assert expected in decision.reason
    else:
        assert isinstance(decision, Claim)
        assert [r["metadata"]["name"] for r in decision.candidates] == expected


def test_a_reservation_too_small_is_not_read_again() -> None:
    """One about to open that the pod would match by its owners, but holding less than the
    pod asks, is not worth a read from the API server."""
    req = request(asking("300m"))
    reservations = by_name(holding("r1", requests(cpu="200m"), consumable=False))
    decision = decide(req, reservations=reservations, workload_uid=REPLICASET_UID)
    assert isinstance(decision, Skip)
    assert worth_a_fresh_look(decision, pod_of(req), reservations, True, REPLICASET_UID) == []
    reservations["r1"]["spec"]["template"]["spec"] = requests(cpu="300m")
    assert worth_a_fresh_look(decision, pod_of(req), reservations, True, REPLICASET_UID) == ["r1"]
