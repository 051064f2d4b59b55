"""The berth.sh/migrating label on namespaces (controller.namespaces): on while a
Reservation waits there for its replacement, off once none is live and unowned."""

from __future__ import annotations

from typing import Any

import pytest

from berth.api import keys
from berth.kube.client import NAMESPACES
from controller import namespaces
from controller.actions import Patch, Plan
from tests.unit.builders import reservation

LABELLED = {keys.MIGRATING_LABEL: "true"}


def namespace(labels: dict[str, str] | None = None, *, terminating: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "default", "labels": dict(labels or {})}
    if terminating:
        metadata["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def label_written(plan: Plan) -> str | bool | None:
    """The value the plan writes, None to remove it, False when it writes nothing."""
    if not plan.actions:
        return False
    [patch] = plan.actions
    assert isinstance(patch, Patch)
    assert (patch.resource, patch.name, patch.json_patch) == (NAMESPACES, "default", False)
    value: str | None = patch.patch["metadata"]["labels"][keys.MIGRATING_LABEL]
    return value


AVAILABLE = reservation(phase="Available", node="node-1")
OPEN = reservation(phase="Available", node="node-1", annotations={keys.CONSUMABLE: "true"})
PENDING = reservation()
OWNED = reservation(phase="Available", node="node-1", owners=["web-2"])
SUCCEEDED = reservation(phase="Succeeded", node="node-1", owners=["web-2"])
FAILED = reservation(phase="Failed", node="node-1")


@pytest.mark.parametrize(
    ("labels", "rsvs", "expected"),
    [
        # A Reservation holds its place, open or about to be: the label goes on first.
        pytest.param({}, [AVAILABLE], "true", id="available, unlabelled: label"),
        pytest.param({}, [OPEN], "true", id="open, unlabelled: label"),
        pytest.param(LABELLED, [OPEN], False, id="open, labelled: nothing"),
        pytest.param(
            {keys.MIGRATING_LABEL: "yes"}, [OPEN], "true", id="a value of someone else's: true"
        ),
        # Not placed yet: no label needed, but one already there stays (hysteresis).
        pytest.param({}, [PENDING], False, id="pending, unlabelled: nothing"),
        pytest.param(LABELLED, [PENDING], False, id="pending, labelled: kept"),
        # The replacement is recorded, or the Reservation ended: the label goes.
        pytest.param(LABELLED, [OWNED], None, id="owned: removed"),
        pytest.param(LABELLED, [SUCCEEDED, FAILED], None, id="ended: removed"),
        pytest.param(LABELLED, [], None, id="none: removed"),
        pytest.param({keys.MIGRATING_LABEL: "no"}, [], None, id="any value: removed"),
        pytest.param({}, [OWNED, FAILED], False, id="nothing to remove"),
        pytest.param(LABELLED, [OWNED, OPEN], False, id="one still waits: kept"),
    ],
)
def test_label_follows_the_reservations_waiting_in_the_namespace(
    labels: dict[str, str], rsvs: list[dict[str, Any]], expected: str | bool | None
) -> None:
    assert label_written(namespaces.decide(namespace(labels), rsvs)) == expected


def test_a_terminating_namespace_is_not_labelled() -> None:
    assert label_written(namespaces.decide(namespace(terminating=True), [OPEN])) is False


def test_a_missing_namespace_needs_nothing() -> None:
    assert namespaces.decide(None, [OPEN]).actions == []


def test_other_labels_are_never_touched() -> None:
    [patch] = namespaces.decide(namespace({"team": "a", **LABELLED}), []).actions
    assert isinstance(patch, Patch)
    assert patch.patch == {"metadata": {"labels": {keys.MIGRATING_LABEL: None}}}


def test_only_a_plan_that_sets_the_label_adds_it() -> None:
    assert namespaces.adds_label(namespaces.decide(namespace(), [OPEN]))
    assert not namespaces.adds_label(namespaces.decide(namespace(LABELLED), []))
    assert not namespaces.adds_label(namespaces.decide(namespace(LABELLED), [OPEN]))
