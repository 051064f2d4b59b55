"""What a job's `reservationOptions.template` may ask of the Reservation and placeholder.

The controller creates the placeholder with its own rights, so a template must never get
a job's creator more than the pod already has: no higher priority, no toleration or node
the pod could not use, no larger requests, no Berth keys that would open the Reservation
early. A template that asks for more is refused (the job fails, naming the field) rather
than silently trimmed: the user learns what they wrote is not honoured.

Pure: the objects are the API server's dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from berth.resources import pod_requests

Object = dict[str, Any]

ALLOWED_FIELDS = frozenset(
    {
        "priorityClassName",
        "priority",
        "tolerations",
        "nodeSelector",
        "affinity",
        "containers",
        "initContainers",
        "resources",
    }
)
"""Pod spec fields a template may set; each is checked below to only narrow the pod's."""
BERTH_PREFIX = "berth.sh/"


def refused(template: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> str | None:
    """Why the template asks for more than the pod has (naming the field), or None."""
    spec = (template or {}).get("spec") or {}
    user: Mapping[str, Any] = (spec.get("template") or {}).get("spec") or {}
    own: Mapping[str, Any] = pod.get("spec") or {}
    namespace = pod["metadata"]["namespace"]
    for check in (_fields, _priority, _tolerations, _node_selector, _affinity, _requests):
        reason = check(user, own)
        if reason:
            return f"reservationOptions.template.spec.template.spec.{reason}"
    for owner in spec.get("owners") or []:
        ref = owner.get("object") or owner.get("controller") or {}
        if ref.get("namespace", namespace) != namespace or "labelSelector" in owner:
            return (
                "reservationOptions.template.spec.owners: an owner must be an object or "
                f"controller in the pod's namespace {namespace}"
            )
    return None


def without_berth_keys(values: Mapping[str, str] | None) -> dict[str, str]:
    """Labels or annotations without Berth's own keys (berth.sh/consumable would open
    the Reservation before its pod is evicted)."""
    return {k: v for k, v in (values or {}).items() if not k.startswith(BERTH_PREFIX)}


def _fields(user: Mapping[str, Any], _own: Mapping[str, Any]) -> str | None:
    extra = sorted(set(user) - ALLOWED_FIELDS)
    return (
        f"{extra[0]} may not be set (allowed: {', '.join(sorted(ALLOWED_FIELDS))})"
        if extra
        else None
    )


def _priority(user: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    """The pod's own PriorityClass only: another class could outrank it."""
    name = user.get("priorityClassName")
    if name is not None and name != (own.get("priorityClassName") or ""):
        return f"priorityClassName {name} is not the pod's own"
    priority = user.get("priority")
    if priority is not None and priority > (own.get("priority") or 0):
        return f"priority {priority} is above the pod's"
    return None


def _tolerations(user: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    mine = own.get("tolerations") or []
    extra = [t for t in user.get("tolerations") or [] if t not in mine]
    return f"tolerations: {extra[0]} is not one of the pod's" if extra else None


def _node_selector(user: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    mine = own.get("nodeSelector") or {}
    changed = [k for k, v in (user.get("nodeSelector") or {}).items() if mine.get(k, v) != v]
    return f"nodeSelector {changed[0]} differs from the pod's" if changed else None


def _affinity(user: Mapping[str, Any], _own: Mapping[str, Any]) -> str | None:
    """Only required node affinity, which is ANDed into the pod's (narrowing): pod
    (anti-)affinity or preferences would replace the pod's own."""
    affinity = user.get("affinity") or {}
    node = affinity.get("nodeAffinity") or {}
    if set(affinity) - {"nodeAffinity"} or set(node) - {
        "requiredDuringSchedulingIgnoredDuringExecution"
    }:
        return "affinity: only nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    return None


def _requests(user: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    if not ({"containers", "initContainers", "resources"} & set(user)):
        return None
    mine = pod_requests(own)
    asked = pod_requests(
        {
            key: user.get(key) or own.get(key)
            for key in ("containers", "initContainers", "resources")
        }
    )
    above = sorted(name for name, value in asked.items() if value > mine.get(name, 0))
    return f"resources: requests of {above[0]} exceed the pod's" if above else None
