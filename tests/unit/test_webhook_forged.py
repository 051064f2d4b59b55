"""Reviews nobody's API server would send: the webhook refuses them (400) or lets the pod
through, and never fails (500); owner references are never put in a URL unchecked; claim
tokens are only ever shown as fingerprints."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth.protocol import fingerprint
from tests.served import served
from tests.unit.webhook_cases import (
    REVIEW,
    TOKEN,
    claimed_by,
    request,
    reservation,
    set_in,
)
from webhook import review
from webhook.app import Webhook, make_app

# Every field the webhook reads, as a dotted path in the request.
READ_FIELDS = [
    "operation",
    "namespace",
    "dryRun",
    "object.metadata.name",
    "object.metadata.generateName",
    "object.metadata.namespace",
    "object.metadata.annotations",
    "object.metadata.labels",
    "object.metadata.ownerReferences",
    "object.metadata.ownerReferences.0",
    "object.metadata.ownerReferences.0.uid",
    "object.metadata.ownerReferences.0.controller",
    "object.spec.nodeName",
    "object.spec.schedulingGates",
    "object.spec.affinity",
    "object.spec.affinity.nodeAffinity",
    "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


def put(req: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set `path` in `req`, making the objects on the way (a list index counts as 0)."""
    *parents, last = path.split(".")
    target: Any = req
    for key in parents:
        if key == "0":
            target = target[0]
            continue
        target = target.setdefault(key, {} if key != "ownerReferences" else [{}])
    if last == "0":
        target[0] = value
    else:
        target[last] = value
    return req


@pytest.fixture
async def http(webhook: Webhook) -> AsyncIterator[aiohttp.ClientSession]:
    async with served(make_app(webhook)) as test_client:
        yield test_client


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(path=st.sampled_from(READ_FIELDS), value=json_values)
async def test_any_value_anywhere_is_answered_never_failed(
    http: aiohttp.ClientSession, webhook: Webhook, path: str, value: Any
) -> None:
    """A pod that carries its claim on a Reservation waiting for it is decided and
    patched from the cache alone: every field reaches the patch code."""
    webhook.reservations.put(reservation("r1", claim=TOKEN))
    body = {**REVIEW, "request": put(request(claimed_by("r1")), path, value)}
    response = await http.post("/mutate-pod", data=json.dumps(body))
    assert response.status in (200, 400), await response.text()


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        ("object.spec.schedulingGates", ["gate"], "object.spec.schedulingGates.0"),
        ("object.spec.affinity", "node-1", "object.spec.affinity"),
        ("object.metadata.labels", {"app": 1}, "object.metadata.labels.app"),
        ("object.metadata.ownerReferences", [{"kind": "ReplicaSet"}], "ownerReferences.0"),
        ("dryRun", "no", "dryRun"),
    ],
)
def test_a_field_of_the_wrong_type_is_named(path: str, value: Any, where: str) -> None:
    body = {**REVIEW, "request": request(set_in(path, value))}
    with pytest.raises(review.MalformedReview, match=where):
        review.parse(json.dumps(body).encode())


def test_the_recorded_review_is_read() -> None:
    assert review.parse(json.dumps(REVIEW).encode())["uid"] == REVIEW["request"]["uid"]


@pytest.mark.parametrize(
    "reference",
    [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "../../secrets/x", "uid": "u"},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a/b", "uid": "u"},
        {"apiVersion": "../v1", "kind": "ReplicaSet", "name": "web", "uid": "u"},
        {"apiVersion": "apps/v1", "kind": "Replica/Set", "name": "web", "uid": "u"},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "Web", "uid": "u"},
    ],
)
async def test_an_owner_the_api_could_not_hold_is_never_looked_up(
    webhook: Webhook, reference: dict[str, str]
) -> None:
    """The API server here is a closed port: asking it would raise."""
    assert await webhook.owners.confirmed(reference, "default") is None


async def test_a_namespace_the_api_could_not_hold_is_never_looked_up(webhook: Webhook) -> None:
    reference = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u"}
    assert await webhook.owners.confirmed(reference, "../kube-system") is None


def test_a_fingerprint_tells_tokens_apart_and_hides_them() -> None:
    assert fingerprint(TOKEN) == fingerprint(TOKEN)
    assert fingerprint(TOKEN) != fingerprint(TOKEN + "0")
    assert TOKEN not in fingerprint(TOKEN)
