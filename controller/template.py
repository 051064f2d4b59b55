"""What a job's `reservationOptions.template` may ask of the Reservation and placeholder.

The controller creates the placeholder with its own rights, so a template must never get
a job's creator more than the pod already has: no priority but the pod's own, no toleration or node
the pod could not use, no other requests, no Berth keys that would open the Reservation
early. Nor smaller requests: the webhook binds a replacement only to a place that holds
what it asks (`berth.protocol.asks_more`). A template that asks for more, or for less
than the pod's requests, is refused (the job fails, naming the field) rather than
silently trimmed: the user learns what they wrote is not honoured.

Pure: the objects are the API server's dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from berth.resources import pod_requests
from berth.scheduling import host_ports
from controller.status import UNREADABLE, unreadable

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


PREFIX = "reservationOptions.template"

Check = Callable[[Mapping[str, Any], Mapping[str, Any]], str | None]


def refused(template: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> str | None:
    """Why the template asks for more than the pod has, or for other requests, or cannot
    be read (naming the field), or None. The template is free-form in the schema: a field
    of the wrong type is refused, never an exception on every pass."""
    outer = _mapping(template)
    spec = _mapping(outer.get("spec")) if outer is not None else None
    if spec is None:
        return f"{PREFIX}: spec is not a ReservationSpec"
    pod_template = _mapping(spec.get("template"))
    user = _mapping(pod_template.get("spec")) if pod_template is not None else None
    if user is None:
        return f"{PREFIX}: spec.template.spec is not a pod spec"
    own: Mapping[str, Any] = pod.get("spec") or {}
    checks: tuple[tuple[str, Check], ...] = (
        ("", _fields),
        ("priority", _priority),
        ("tolerations", _tolerations),
        ("nodeSelector", _node_selector),
        ("affinity", _affinity),
        ("resources", _requests),
        ("containers", _host_ports),
    )
    for field, check in checks:
        try:
            reason = check(user, own)
        except UNREADABLE as error:
            reason = f"{field}: cannot be read ({unreadable(error)})"
        if reason:
            return f"{PREFIX}.spec.template.spec.{reason}"
    return _owners(spec, pod["metadata"]["namespace"])


def _mapping(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return {}
    return value if isinstance(value, Mapping) else None


def _owners(spec: Mapping[str, Any], namespace: str) -> str | None:
    owners = spec.get("owners") or []
    wrong = (
        f"{PREFIX}.spec.owners: an owner must be an object or controller in the pod's "
        f"namespace {namespace}"
    )
    if not isinstance(owners, list):
        return wrong
    for owner in owners:
        if not isinstance(owner, Mapping) or "labelSelector" in owner:
            return wrong
        ref = owner.get("object") or owner.get("controller") or {}
        if not isinstance(ref, Mapping) or ref.get("namespace", namespace) != namespace:
            return wrong
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
    """The pod's own PriorityClass and priority only: another class could outrank it, and
    any other value would have the controller make a PriorityClass for it (the
    placeholder's non-preempting twin, `build.non_preempting_class`), one cluster-wide
    object per value a job's creator picks."""
    name = user.get("priorityClassName")
    if name is not None and name != (own.get("priorityClassName") or ""):
        return f"priorityClassName {name} is not the pod's own"
    priority = user.get("priority")
    if priority is None:
        return None
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"{priority!r} is not an integer")
    if priority != (own.get("priority") or 0):
        return f"priority {priority} is not the pod's own ({own.get('priority') or 0})"
    return None


def _tolerations(user: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    mine = own.get("tolerations") or []
    extra = [t for t in user.get("tolerations") or [] if t not in mine]
    return f"tolerations: {extra[0]} is not one of the pod's" if extra else None


def _node_selector(user: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    mine = own.get("nodeSelector") or {}
    given = user.get("nodeSelector") or {}
    odd = [k for k, v in given.items() if not isinstance(k, str) or not isinstance(v, str)]
    if odd:
        return f"nodeSelector {odd[0]}: a node selector maps label names to strings"
    changed = [k for k, v in given.items() if mine.get(k, v) != v]
    return f"nodeSelector {changed[0]} differs from the pod's" if changed else None


OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


def _affinity(user: Mapping[str, Any], _own: Mapping[str, Any]) -> str | None:
    """Only required node affinity, which is ANDed into the pod's (narrowing): pod
    (anti-)affinity or preferences would replace the pod's own. Its terms are checked as
    the API server checks a pod's (k8s.io/kubernetes pkg/apis/core/validation), so that
    one it would refuse fails the job now rather than every placeholder create."""
    affinity = user.get("affinity") or {}
    node = affinity.get("nodeAffinity") or {}
    if set(affinity) - {"nodeAffinity"} or set(node) - {
        "requiredDuringSchedulingIgnoredDuringExecution"
    }:
        return "affinity: only nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms")
    where = "affinity: nodeSelectorTerms"
    if not isinstance(terms, list) or not terms:
        return f"{where}: at least one term is required" if required else None
    for term in terms:
        if not isinstance(term, Mapping) or set(term) - {"matchExpressions", "matchFields"}:
            return f"{where}: a term has only matchExpressions and matchFields"
        for requirement in term.get("matchExpressions") or []:
            problem = _requirement_problem(requirement)
            if problem:
                return f"{where}: matchExpressions: {problem}"
        for requirement in term.get("matchFields") or []:
            problem = _requirement_problem(requirement)
            if problem is None and (
                requirement.get("key") != "metadata.name"
                or requirement.get("operator") not in ("In", "NotIn")
                or len(requirement.get("values") or []) != 1
            ):
                problem = "only metadata.name, In or NotIn, with one value"
            if problem:
                return f"{where}: matchFields: {problem}"
    return None


def _requirement_problem(requirement: object) -> str | None:
    """What the API server would refuse in a node selector requirement (None: nothing)."""
    if not isinstance(requirement, Mapping):
        return f"{requirement!r} is not a requirement"
    key, operator, values = (requirement.get(k) for k in ("key", "operator", "values"))
    if not isinstance(key, str) or not key:
        return f"key {key!r} is not a label name"
    if operator not in OPERATORS:
        return f"{key}: operator {operator!r} is not one of {', '.join(sorted(OPERATORS))}"
    if values is not None and (
        not isinstance(values, list) or not all(isinstance(v, str) for v in values)
    ):
        return f"{key}: values must be a list of strings"
    count = len(values or [])
    if operator in ("In", "NotIn") and not count:
        return f"{key}: {operator} needs values"
    if operator in ("Exists", "DoesNotExist") and count:
        return f"{key}: {operator} takes no values"
    if operator in ("Gt", "Lt") and (count != 1 or not _is_integer((values or [""])[0])):
        return f"{key}: {operator} takes one integer value"
    return None


def _is_integer(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def _host_ports(user: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    """No host port the pod does not use: the placeholder takes its containers' host
    ports on its node, which would let a job's creator hold any port there."""
    mine = host_ports(own)
    extra = sorted(host_ports(user) - mine)
    return (
        f"containers: hostPort {extra[0][0]}/{extra[0][1]} is not one of the pod's"
        if extra
        else None
    )


def _requests(user: Mapping[str, Any], own: Mapping[str, Any]) -> str | None:
    if not ({"containers", "initContainers", "resources"} & set(user)):
        return None
    fields = ("containers", "initContainers", "resources")
    mine = pod_requests({key: own.get(key) for key in fields})
    asked = pod_requests({key: user[key] if key in user else own.get(key) for key in fields})
    above = sorted(name for name, value in asked.items() if value > mine.get(name, 0))
    if above:
        return f"resources: requests of {above[0]} exceed the pod's"
    below = sorted(name for name, value in mine.items() if value > asked.get(name, 0))
    if below:
        return (
            f"resources: requests of {below[0]} are below the pod's, and the webhook binds "
            "a replacement only to a place that holds what it asks"
        )
    return None
