"""Builders for the webhook's unit tests.

Every case starts from the AdmissionReview the real kube-apiserver sent for a
ReplicaSet's pod (tests/data), changed only where the case says.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from berth.api import keys

DATA = Path(__file__).resolve().parents[1] / "data"
REVIEW: dict[str, Any] = json.loads((DATA / "admission_review_pod_create.json").read_text())
NAMESPACE = REVIEW["request"]["namespace"]
REPLICASET_UID = REVIEW["request"]["object"]["metadata"]["ownerReferences"][0]["uid"]
REPLICASET_NAME = REVIEW["request"]["object"]["metadata"]["ownerReferences"][0]["name"]
DEPLOYMENT_UID = "0d5c1e36-0000-4000-8000-00000000d0d0"
TOKEN = "5f1c0ffee"

Change = Callable[[dict[str, Any]], object]


def request(*changes: Change) -> dict[str, Any]:
    """The recorded request, with each change applied to a copy of it."""
    result: dict[str, Any] = copy.deepcopy(REVIEW["request"])
    for change in changes:
        change(result)
    return result


def pod(*changes: Change) -> dict[str, Any]:
    result: dict[str, Any] = request()["object"]
    for change in changes:
        change(result)
    return result


def reservation(
    name: str,
    *,
    owner_uid: str = REPLICASET_UID,
    workload: str | None = None,
    consumable: bool = True,
    claim: str | None = None,
    phase: str = "Available",
    node: str = "node-1",
    namespace: str = NAMESPACE,
    created: str = "2026-11-21T23:50:00Z",
    opened: str | None = None,
    ttl: str = "0s",
) -> dict[str, Any]:
    """A Reservation made for the pods of `REPLICASET_NAME`; it never expires unless a
    `ttl` says so (its creation time is fixed, the webhook's clock is not)."""
    annotations = {keys.CONSUMABLE: "true"} if consumable else {}
    if opened:
        annotations[keys.OPENED_AT] = opened
    if workload:
        annotations[keys.WORKLOAD] = workload
    if claim:
        annotations[keys.CLAIM] = claim
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "creationTimestamp": created,
            "annotations": annotations,
        },
        "spec": {
            "ttl": ttl,
            "template": {"metadata": {"namespace": namespace}, "spec": {}},
            "owners": [
                {
                    "controller": {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": REPLICASET_NAME if owner_uid == REPLICASET_UID else "web-old",
                        "uid": owner_uid,
                        "controller": True,
                    }
                }
            ],
        },
        "status": {"phase": phase, "nodeName": node},
    }


def handed_over(reservation: dict[str, Any]) -> dict[str, Any]:
    reservation["status"]["currentOwners"] = [
        {"namespace": NAMESPACE, "name": "web-x", "uid": "pod-uid"}
    ]
    return reservation


def by_name(*reservations: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in reservations}


def allocated(name: str) -> str:
    return json.dumps({"name": name, "uid": f"uid-{name}"}, separators=(",", ":"))


# ----- changes to the recorded request ---------------------------------------------------


def claimed_by(name: str, token: str = TOKEN) -> Change:
    def change(req: dict[str, Any]) -> None:
        req["object"]["metadata"]["annotations"] = {
            keys.CLAIM: token,
            keys.RESERVATION_ALLOCATED: allocated(name),
        }

    return change


def set_in(path: str, value: Any) -> Change:
    """Set request[path] where path is dotted, e.g. `object.spec.nodeName`."""

    def change(req: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = req
        for key in parents:
            target = target[key]
        target[last] = value

    return change


def apply_patch(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add` (the only operation the webhook emits), strict about parents."""
    result = copy.deepcopy(document)
    for operation in patch:
        assert operation["op"] == "add", operation
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]
        ]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), operation["value"])
        else:
            assert isinstance(target, dict), f"no object at the parent of {operation['path']}"
            target[last] = operation["value"]
    return result


def review_body(**changes: Any) -> bytes:
    body = copy.deepcopy(REVIEW)
    body.update(changes)
    return json.dumps(body).encode()
