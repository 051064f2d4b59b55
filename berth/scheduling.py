"""What kube-scheduler and the API server read off pods and nodes, read the same way here.

Some of Berth's decisions repeat a judgement the scheduler or the API server makes: which
pods a label selector names, whether another node could take a pod (arbitration's
nodeFit), which QoS class a pod has. Read differently, a decision would promise what the
scheduler then refuses, so these readings live in one place. Only the hard rules are
here (required affinity, NoSchedule and NoExecute taints, host ports); preferences,
inter-pod affinity and spreading stay the scheduler's business.

Objects are the API server's dicts; these functions are pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from berth.resources import parse_quantity

Object = Mapping[str, Any]


# ----- label selectors --------------------------------------------------------------------


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector as the API reads it: every requirement holds, so an empty
    selector matches everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(requirement_matches(e, labels) for e in selector.get("matchExpressions") or ())


def requirement_matches(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One selector requirement: In, NotIn, Exists, DoesNotExist, and for nodes Gt, Lt."""
    value = labels.get(requirement["key"])
    operator = requirement["operator"]
    values = requirement.get("values") or ()
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            number, bound = int(value), int(values[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


_SELECTOR_PART = re.compile(
    r"^\s*(?:!\s*(?P<absent>[^\s=!(),]+)"
    r"|(?P<key>[^\s=!(),]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s=!(),]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$"
)


def parse_selector(text: str) -> dict[str, Any]:
    """A label selector string as kubectl -l takes it (`pool=general,zone in (a,b),!spot`),
    as a metav1.LabelSelector dict. Raises ValueError naming the part it cannot read."""
    expressions: list[dict[str, Any]] = []
    for part in re.split(r",(?![^()]*\))", text):
        if not part.strip():
            continue
        match = _SELECTOR_PART.match(part)
        if match is None:
            raise ValueError(f"{part.strip()!r} is not a label selector requirement")
        if match["absent"]:
            expressions.append({"key": match["absent"], "operator": "DoesNotExist"})
        elif match["op"]:
            expressions.append(
                {
                    "key": match["key"],
                    "operator": "NotIn" if match["op"] == "!=" else "In",
                    "values": [match["value"]],
                }
            )
        elif match["set"]:
            values = [v.strip() for v in match["values"].split(",") if v.strip()]
            if not values:  # as kubectl: a set needs one value at least
                raise ValueError(f"{part.strip()!r} names no value in its set")
            expressions.append(
                {
                    "key": match["key"],
                    "operator": "In" if match["set"] == "in" else "NotIn",
                    "values": values,
                }
            )
        else:
            expressions.append({"key": match["key"], "operator": "Exists"})
    return {"matchExpressions": expressions}


# ----- nodes ------------------------------------------------------------------------------


def node_schedulable(node: Object) -> bool:
    """Ready and not cordoned: the scheduler places new pods there."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or ()
    )


def node_affinity_matches(spec: Object, name: str, labels: Mapping[str, str]) -> bool:
    """The pod's nodeSelector and required node affinity admit the node `name` with these
    labels: every nodeSelector label, and any one of the nodeSelectorTerms."""
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    return not terms or any(_term_matches(term, name, labels) for term in terms)


def _term_matches(term: Object, name: str, labels: Mapping[str, str]) -> bool:
    """A nodeSelectorTerm: all its expressions on labels and fields hold (an empty term
    matches no node)."""
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    return all(requirement_matches(e, labels) for e in expressions) and all(
        requirement_matches(f, {"metadata.name": name}) for f in fields
    )


def taints_tolerated(spec: Object, node: Object) -> bool:
    """The pod tolerates every NoSchedule and NoExecute taint of the node (a
    PreferNoSchedule taint keeps no pod away)."""
    return _untolerated(spec, node) is None


DRAIN_TAINTS = frozenset(
    {"ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted", "karpenter.sh/disruption"}
)
"""The taints with which Cluster Autoscaler and Karpenter (v1, and before v1) mark a node
they are draining to remove it; they do not cordon it."""


def being_drained(node: Object, spec: Object) -> bool:
    """Whether `node` is being drained, as far as a pod of `spec` on it goes: cordoned
    (whatever the pod tolerates), tainted NoSchedule or NoExecute against the pod, or
    carrying a drain taint of Cluster Autoscaler or Karpenter (`DRAIN_TAINTS`), which
    removes the node whatever its pods tolerate."""
    if (node.get("spec") or {}).get("unschedulable"):
        return True
    if any(taint.get("key") in DRAIN_TAINTS for taint in _keeping_away(node)):
        return True
    return not taints_tolerated(spec, node)


UNSCHEDULABLE_TAINT: Object = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
"""What a cordon means to the scheduler (its NodeUnschedulable plugin): a pod that
tolerates this taint may still go to a cordoned node."""


def node_refusal(node: Object, spec: Object) -> str | None:
    """Why the scheduler places no new pod of `spec` on `node`, however much room it has:
    the node is cordoned, has a NoSchedule or NoExecute taint the pod does not tolerate
    (a node going NotReady gets such taints), or its labels do not satisfy the pod's
    nodeSelector or required node affinity (a rollout that moved the pods elsewhere, a
    label taken off the node); None when it would."""
    metadata = node.get("metadata") or {}
    name = metadata.get("name")
    cordoned = (node.get("spec") or {}).get("unschedulable")
    if cordoned and not _tolerated(UNSCHEDULABLE_TAINT, spec.get("tolerations") or ()):
        return f"node {name} is cordoned"
    taint = _untolerated(spec, node)
    if taint is not None:
        value = f"={taint['value']}" if taint.get("value") else ""
        return (
            f"node {name} has the taint {taint.get('key')}{value}:{taint.get('effect')}, "
            "which the pod does not tolerate"
        )
    if not node_affinity_matches(spec, str(name), metadata.get("labels") or {}):
        return f"node {name} does not match the pod's node selector or required node affinity"
    return None


def node_gates(node: Object) -> tuple[object, ...]:
    """What of a node `node_refusal` reads: its cordon, its taints that keep pods away and
    its labels. Compared between two versions of a node, to tell whether anything decided
    on it is to be decided again."""
    taints = sorted(
        (str(t.get("key")), str(t.get("value") or ""), str(t.get("effect")))
        for t in _keeping_away(node)
    )
    labels = sorted(((node.get("metadata") or {}).get("labels") or {}).items())
    return bool((node.get("spec") or {}).get("unschedulable")), tuple(taints), tuple(labels)


def _keeping_away(node: Object) -> list[Object]:
    """The node's NoSchedule and NoExecute taints: a PreferNoSchedule one keeps no pod away."""
    return [
        taint
        for taint in (node.get("spec") or {}).get("taints") or ()
        if taint.get("effect") in ("NoSchedule", "NoExecute")
    ]


def _untolerated(spec: Object, node: Object) -> Object | None:
    """The first of the node's taints that keep pods away which the pod does not tolerate."""
    tolerations = spec.get("tolerations") or ()
    return next((t for t in _keeping_away(node) if not _tolerated(t, tolerations)), None)


def _tolerated(taint: Object, tolerations: Sequence[Object]) -> bool:
    """Whether a toleration matches the taint. One whose operator this reading does not
    know (`Lt`, `Gt`: an alpha feature of the scheduler) counts as matching when its key
    does, so that no node the scheduler might accept is ever refused here."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator not in ("Exists", "Equal"):
            if toleration.get("key") == taint.get("key"):
                return True
            continue
        if operator == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


# ----- pods -------------------------------------------------------------------------------


def qos_class(pod: Object) -> str:
    """Guaranteed, Burstable or BestEffort: `status.qosClass`, or for a pod whose status
    does not carry it yet, worked out from cpu and memory requests and limits as the API
    server does."""
    known = (pod.get("status") or {}).get("qosClass")
    if known:
        return str(known)
    spec = pod.get("spec") or {}
    guaranteed, best_effort = True, True
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in ("cpu", "memory"):
            request, limit = requests.get(name), limits.get(name)
            if request is not None or limit is not None:
                best_effort = False
            if limit is None or (
                request is not None
                and request != limit
                and parse_quantity(request) != parse_quantity(limit)
            ):
                guaranteed = False
    if best_effort:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


# ----- host ports -------------------------------------------------------------------------

HostPort = tuple[int, str, str]
"""`(hostPort, protocol, hostIP)` as the NodePorts plugin reads a container port:
protocol TCP and host IP 0.0.0.0 (every address) when not given."""

ANY_ADDRESS = "0.0.0.0"


def host_port_entries(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The container ports with a host port that the pod takes on its node, as
    kube-scheduler reads them (`util.GetHostPorts`): its containers' and its sidecars'
    (init containers with `restartPolicy: Always`, which run as long as the pod). An
    ordinary init container's have ended before the pod's containers start."""
    containers = [
        *(c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"),
        *(spec.get("containers") or ()),
    ]
    return [port for c in containers for port in c.get("ports") or () if port.get("hostPort")]


def host_ports(spec: Mapping[str, Any]) -> frozenset[HostPort]:
    """The host ports the pod takes on its node (`host_port_entries`)."""
    return frozenset(
        (port["hostPort"], port.get("protocol") or "TCP", port.get("hostIP") or ANY_ADDRESS)
        for port in host_port_entries(spec)
    )


def ports_conflict(first: HostPort, second: HostPort) -> bool:
    """Whether two pods taking these host ports cannot share a node (the NodePorts
    plugin's HostPortInfo): the same port and protocol, on the same address or on every
    address."""
    return first[:2] == second[:2] and (
        first[2] == second[2] or ANY_ADDRESS in (first[2], second[2])
    )


def spreads_hard(pod: Object) -> bool:
    """Whether the pod has a `DoNotSchedule` topology spread constraint."""
    return any(
        c.get("whenUnsatisfiable") == "DoNotSchedule"
        for c in (pod.get("spec") or {}).get("topologySpreadConstraints") or ()
    )


def spread_refusal(
    pod: Object, node: Object, *, nodes: Iterable[Object], pods: Iterable[Object]
) -> str | None:
    """Why kube-scheduler's PodTopologySpread would refuse `pod`'s replacement (the same
    labels and constraints, and the webhook's pin to `node` ANDed into its required node
    affinity) on `node`, once `pod` is gone; None when none of its `DoNotSchedule`
    constraints would. Counted as the plugin counts: per domain of the nodes that carry
    every constraint's topology key and pass the constraint's node inclusion policies (the
    required node affinity, pin included, unless `nodeAffinityPolicy: Ignore`; the taints
    only with `nodeTaintsPolicy: Honor`), the pods of the namespace bound there that its
    selector (with `matchLabelKeys`) matches, neither finished, terminating nor `pod`
    itself; against the least of those counts (0 when fewer domains than `minDomains`).

    With the default policy the pin leaves `node` the only node counted, and the spread
    holds whatever the other domains hold, unless `minDomains` asks for more domains than
    one. With `nodeAffinityPolicy: Ignore` every node counts: the placeholder, which
    carries none of the pod's labels, was placed without counting as one of them, and its
    node may be one where the replacement breaks the spread."""
    spec = pod.get("spec") or {}
    constraints = [
        c
        for c in spec.get("topologySpreadConstraints") or ()
        if c.get("whenUnsatisfiable") == "DoNotSchedule" and c.get("topologyKey")
    ]
    if not constraints:
        return None
    labels: Mapping[str, str] = (pod.get("metadata") or {}).get("labels") or {}
    namespace = (pod.get("metadata") or {}).get("namespace")
    uid = (pod.get("metadata") or {}).get("uid")
    keys = [str(c["topologyKey"]) for c in constraints]
    node_labels = (node.get("metadata") or {}).get("labels") or {}
    name = (node.get("metadata") or {}).get("name")
    for key in keys:
        if key not in node_labels:
            return f"node {name} has no label {key}, the pod's topology spread key"
    carrying = [
        n for n in nodes if all(k in ((n.get("metadata") or {}).get("labels") or {}) for k in keys)
    ]
    others = [
        p
        for p in pods
        if (p.get("metadata") or {}).get("namespace") == namespace
        and (p.get("metadata") or {}).get("uid") != uid
        and not (p.get("metadata") or {}).get("deletionTimestamp")
        and (p.get("spec") or {}).get("nodeName")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    for constraint in constraints:
        key = str(constraint["topologyKey"])
        selector = _spread_selector(constraint, labels) or NOTHING
        included = {
            str((n.get("metadata") or {}).get("name")): str(n["metadata"]["labels"][key])
            for n in carrying
            if _included(constraint, spec, n, pinned=str(name))
        }
        counts = dict.fromkeys(included.values(), 0)
        # An empty selector counts no pod (the plugin's `countPodsMatchSelector`).
        empty = not selector.get("matchLabels") and not selector.get("matchExpressions")
        for other in () if empty else others:
            domain = included.get(str(other["spec"]["nodeName"]))
            if domain is not None and selector_matches(
                selector, (other.get("metadata") or {}).get("labels") or {}
            ):
                counts[domain] += 1
        least = min(counts.values(), default=0)
        if len(counts) < int(constraint.get("minDomains") or 0):
            least = 0
        mine = 1 if selector_matches(selector, labels) else 0
        domain = str(node_labels[key])
        skew = counts.get(domain, 0) + mine - least
        limit = int(constraint.get("maxSkew") or 1)
        if skew > limit:
            return (
                f"a pod like it on node {name} would break its topology spread on {key} "
                f"(maxSkew {limit}): {counts.get(domain, 0)} of its pods in {key}={domain} "
                f"against {least} where there are fewest"
            )
    return None


NOTHING: Object = {"matchExpressions": [{"key": "berth.sh/none", "operator": "In", "values": []}]}
"""A selector no pod matches: a spread constraint's when it has no labelSelector."""


def _spread_selector(constraint: Object, labels: Mapping[str, str]) -> Object | None:
    """The constraint's label selector with its `matchLabelKeys` requirements added, as
    the scheduler reads it; None when it has none (it matches no pod)."""
    selector = constraint.get("labelSelector")
    if not isinstance(selector, Mapping):
        return None
    extra = [
        {"key": key, "operator": "In", "values": [labels[key]]}
        for key in constraint.get("matchLabelKeys") or ()
        if key in labels
    ]
    if not extra:
        return dict(selector)
    return {**selector, "matchExpressions": [*(selector.get("matchExpressions") or ()), *extra]}


def _included(constraint: Object, spec: Object, node: Object, *, pinned: str) -> bool:
    """The constraint's node inclusion policies: required node affinity honoured unless
    `nodeAffinityPolicy: Ignore` (the pod's own, and the pin to `pinned` the webhook ANDs
    into it); taints only with `nodeTaintsPolicy: Honor`."""
    metadata = node.get("metadata") or {}
    name = str(metadata.get("name"))
    if constraint.get("nodeAffinityPolicy") != "Ignore" and not (
        name == pinned and node_affinity_matches(spec, name, metadata.get("labels") or {})
    ):
        return False
    return constraint.get("nodeTaintsPolicy") != "Honor" or taints_tolerated(spec, node)
