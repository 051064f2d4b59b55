"""The extender's answers to kube-scheduler: filter, prioritize, preempt over the ledger.

Requests and results are the Go types of `k8s.io/kube-scheduler/extender/v1`, which have
no json tags: keys are the Go field names (`Pod`, `NodeNames`, `FailedNodes`, ...) and nil
is `null`. The scheduler only calls an extender after its own plugins have judged the
nodes, so the extender adds exactly what the scheduler cannot know:

- a pod recorded in a Reservation's `status.currentOwners` goes to that Reservation's
  node and nowhere else (keyed by pod UID, which no annotation can forge);
- capacity held by a Reservation in handover (placeholder gone, owner not bound yet) is
  not free for any other pod. Only nodes with such a hold are checked: for the others
  the scheduler's own resource check, on a cache fresher than ours, already decided;
- placeholders (the pod a Reservation the ledger holds records as its placeholder,
  `protocol.is_placeholder_of`: never by label or owner reference alone) never become
  preemption victims, and a node stays a preemption candidate only if the pod would
  pass the filter there once its victims are gone. A placeholder allowed to preempt
  (a job's `preemptionOptions`) keeps only the candidates whose victims violate no
  PodDisruptionBudget (the scheduler's own `NumPDBViolations`), as an eviction would.
  Dropping the whole node, not just the placeholder victim, because the scheduler's
  victim sets are minimal: what is left would no longer make room, and those pods would
  be evicted for nothing.

In the default scope kube-scheduler asks only about pods that request Berth's extended
resource (its `managedResources`): placeholders and bound replacements. In the strict
scope it asks about every pod, and the handover hold then applies to all of them.

`answer` turns a request body into a status and a result. A body it cannot read is a
result with `Error` set for filter (HTTP 200: the scheduler then fails this scheduling
attempt, or skips the extender if it is `ignorable`, and logs the message), and an HTTP
400 for prioritize and preempt, whose result types have no error field (the scheduler
scores without a failed prioritize, and a failed preempt ends that preemption attempt
unless the extender is `ignorable`). The fields of the `Pod` (and of whole victims) that
the extender reads are checked for their types too (`read_pod`): the scheduler sends what
the API server validated, but anyone who reaches the port can send anything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum
from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from berth.ledger import Ledger
from berth.protocol import Object, placeholder_reservation
from berth.resources import Resources, add, fits, node_charge, subtract
from berth.scheduling import HostPort, host_ports, ports_conflict

log = logging.getLogger(__name__)

MAX_SCORE = 10
"""kube-scheduler's MaxExtenderPriority; scores run from 0 to this."""

SCORED_RESOURCES = ("cpu", "memory")
"""What placement and promise scores weigh, as the scheduler's own resource scoring does."""


class Placement(StrEnum):
    """Where placeholders go among the nodes that fit them."""

    SPREAD = "spread"
    """Most free capacity left after placing: migrations land on quiet nodes."""
    BINPACK = "binpack"
    """Least free capacity left after placing: fills nodes up and empties others, the
    defragmentation use of migration."""


class WireError(ValueError):
    """The request is not the extender/v1 type the verb takes."""


# ----- requests ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtenderArgs:
    """`ExtenderArgs`: the pod and its candidate nodes."""

    pod: Object
    node_names: list[str]
    node_list: Object | None
    """The `Nodes` NodeList when the scheduler sent whole nodes (nodeCacheCapable: false)."""


@dataclass(frozen=True)
class Victim:
    uid: str
    pod: Object | None
    """The whole pod when the scheduler sent it (nodeCacheCapable: false)."""


@dataclass(frozen=True)
class Victims:
    pods: list[Victim]
    pdb_violations: int


@dataclass(frozen=True)
class PreemptionArgs:
    """`ExtenderPreemptionArgs`, in either form, as victims per candidate node."""

    pod: Object
    victims: dict[str, Victims]


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise WireError(f"{what} must be an object, not {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:  # a nil Go slice
        return []
    if not isinstance(value, list):
        raise WireError(f"{what} must be a list, not {type(value).__name__}")
    return value


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise WireError(f"{what} must be a non-empty string")
    return value


class _Read(BaseModel):
    """The fields of a pod the extender reads, each of the type the API has; the others
    are not looked at."""

    model_config = ConfigDict(strict=True)


Quantities = dict[str, str | int | float] | None


class _OwnerReference(_Read):
    apiVersion: str | None = None
    kind: str | None = None
    name: str | None = None
    uid: str | None = None
    controller: bool | None = None


class _Metadata(_Read):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    ownerReferences: list[_OwnerReference] | None = None


class _Resources(_Read):
    requests: Quantities = None
    limits: Quantities = None


class _ContainerPort(_Read):
    hostPort: int | None = None
    protocol: str | None = None
    hostIP: str | None = None


class _Container(_Read):
    restartPolicy: str | None = None
    resources: _Resources | None = None
    ports: list[_ContainerPort] | None = None


class _PodSpec(_Read):
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None
    overhead: Quantities = None
    resources: _Resources | None = None


class _ContainerStatus(_Read):
    name: str | None = None
    resources: _Resources | None = None
    allocatedResources: Quantities = None


class _Condition(_Read):
    type: str | None = None
    status: str | None = None
    reason: str | None = None


class _PodStatus(_Read):
    """What a victim's charge reads of its status: an in-place resize's progress."""

    containerStatuses: list[_ContainerStatus] | None = None
    initContainerStatuses: list[_ContainerStatus] | None = None
    resources: _Resources | None = None
    allocatedResources: Quantities = None
    conditions: list[_Condition] | None = None


class _Pod(_Read):
    metadata: _Metadata
    spec: _PodSpec | None = None
    status: _PodStatus | None = None


def read_pod(value: Any, what: str) -> Object:
    """`value` when it is a pod whose fields the extender reads have their API types
    (WireError naming the first that does not). A pod comes from the scheduler, which
    sends what the API server validated, but anyone who reaches the port can send any."""
    pod = _object(value, what)
    try:
        _Pod.model_validate(pod)
    except ValidationError as error:
        problem = error.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise WireError(f"{what}.{where}: {problem['msg']}") from None
    return pod


def _pod(body: Any) -> Object:
    args = _object(body, "the request")
    if args.get("Pod") is None:
        raise WireError("the request has no Pod")
    return read_pod(args["Pod"], "Pod")


def parse_args(body: Any) -> ExtenderArgs:
    """The arguments of filter and prioritize, with node names in either form."""
    pod = _pod(body)
    if body.get("NodeNames") is not None:
        names = _list(body["NodeNames"], "NodeNames")
        # One pass in C over thousands of names; the loop that names the culprit only
        # runs when there is one.
        if set(map(type, names)) - {str} or "" in names:
            for name in names:
                _string(name, "each of NodeNames")
        return ExtenderArgs(pod=pod, node_names=names, node_list=None)
    if body.get("Nodes") is not None:
        node_list = _object(body["Nodes"], "Nodes")
        names = [
            _string(
                _object(
                    _object(node, "each of Nodes.items").get("metadata"), "a node's metadata"
                ).get("name"),
                "a node's name",
            )
            for node in _list(node_list.get("items"), "Nodes.items")
        ]
        return ExtenderArgs(pod=pod, node_names=names, node_list=node_list)
    raise WireError("the request has neither NodeNames nor Nodes")


def parse_preemption_args(body: Any) -> PreemptionArgs:
    """The arguments of preempt: `NodeNameToMetaVictims` (UIDs) or `NodeNameToVictims`."""
    pod = _pod(body)
    victims: dict[str, Victims] = {}
    if body.get("NodeNameToMetaVictims") is not None:
        for node, value in _object(body["NodeNameToMetaVictims"], "NodeNameToMetaVictims").items():
            meta = _object(value, f"the victims on {node}")
            victims[node] = Victims(
                pods=[
                    Victim(
                        uid=_string(_object(item, "a victim").get("UID"), "a victim's UID"),
                        pod=None,
                    )
                    for item in _list(meta.get("Pods"), f"the victims on {node}")
                ],
                pdb_violations=_count(meta.get("NumPDBViolations")),
            )
    elif body.get("NodeNameToVictims") is not None:
        for node, value in _object(body["NodeNameToVictims"], "NodeNameToVictims").items():
            full = _object(value, f"the victims on {node}")
            pods = [
                read_pod(item, "a victim")
                for item in _list(full.get("Pods"), f"the victims on {node}")
            ]
            victims[node] = Victims(
                pods=[
                    Victim(
                        uid=_string(
                            _object(item.get("metadata"), "a victim's metadata").get("uid"),
                            "a victim's uid",
                        ),
                        pod=item,
                    )
                    for item in pods
                ],
                pdb_violations=_count(full.get("NumPDBViolations")),
            )
    return PreemptionArgs(pod=pod, victims=victims)


def _count(value: Any) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError("NumPDBViolations must be an integer")
    return value


# ----- the pod being scheduled ------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """The pod the scheduler asks about, as the decisions see it."""

    requests: Resources
    reserved: tuple[str, str] | None
    """`(reservation, node)` when the pod is a Reservation's recorded owner."""
    ports: frozenset[HostPort]
    reservation_pod: bool
    """The pod names a Reservation as its controller, recorded as its placeholder or not
    (yet): such a pod never preempts past a PodDisruptionBudget, and is scored by the
    placement strategy (the controller records a placeholder only once its create is
    answered, and kube-scheduler may score it before). What a pod says of itself is
    enough here: it only ever takes something away from the pod, or orders the nodes for
    that pod alone."""


def pod_name(pod: Object) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


def pending(ledger: Ledger, pod: Object) -> Pending:
    return Pending(
        requests=node_charge(pod.get("spec") or {}),
        reserved=ledger.reserved_for(str(pod["metadata"].get("uid") or "")),
        ports=host_ports(pod.get("spec") or {}),
        reservation_pod=placeholder_reservation(pod) is not None,
    )


class Refusal(NamedTuple):
    reason: str
    unresolvable: bool
    """Preemption cannot help."""


def refusal(
    ledger: Ledger, pod: Pending, node: str, *, released: Resources | None = None
) -> Refusal | None:
    """Why `pod` may not go to `node` (None: it may), with `released` freed by preemption.
    An owner goes only to its Reservation's node, and takes there what its Reservation
    holds and what is free, not what another Reservation in handover there holds."""
    own = None
    if pod.reserved is not None:
        own, reserved_node = pod.reserved
        if node != reserved_node:
            return Refusal(
                f"reserved for this pod on {reserved_node} by Reservation {own}",
                unresolvable=True,
            )
    held = [name for name in ledger.handover(node) if name != own]
    if not held:
        return None
    for name in held if pod.ports else ():
        taken = next(
            (
                port
                for port in ledger.held_ports(name)
                if any(ports_conflict(port, mine) for mine in pod.ports)
            ),
            None,
        )
        if taken is not None:
            return Refusal(
                f"host port {taken[0]}/{taken[1]} held for Reservation {name} in handover",
                # Preempting a pod frees no port the place holds; an owner's own node
                # stays resolvable, as below.
                unresolvable=own is None,
            )
    free = ledger.free(node, for_reservation=own)
    if free is None:
        return None
    # Only what the place holds is judged here: the rest of the pod's requests kube-
    # scheduler has checked itself (some it does not, a DRA-backed extended resource,
    # which a node does not list and the ledger would read as none free).
    holds = ledger.handover(node)
    missing = [
        name
        for name in fits(pod.requests, add(free, released or {}))
        if any(holds[reservation].get(name, 0) > 0 for reservation in held)
    ]
    if not missing:
        return None
    return Refusal(
        f"Insufficient {', '.join(sorted(missing))}: held for Reservation "
        f"{', '.join(sorted(held))} in handover",
        # Every node judged here passed kube-scheduler's own filters, so its preemption
        # dry run, which does not know the hold, finds no victim to take there and fails
        # the attempt ("expected at least one victim pod"): preemption cannot help. But
        # an owner's own node stays resolvable: with every node unresolvable, preemption
        # would clear the owner's nomination (`NominatedNode("")`), which guards its place.
        unresolvable=own is None,
    )


# ----- the verbs --------------------------------------------------------------------------


def filter_nodes(ledger: Ledger, args: ExtenderArgs) -> Object:
    """`ExtenderFilterResult`, in the form the request came in.

    A pod that owns no Reservation can only be refused a node with a Reservation in
    handover, so only those of the candidates are judged: a request costs the few held
    nodes, not the thousands of names it carries. Every name that passes is sent back:
    kube-scheduler reads `NodeNames: null` as no node passing (extender.go, `Filter`)."""
    pod = pending(ledger, args.pod)
    if pod.reserved is None:
        held = ledger.handover_nodes()
        judged = [node for node in args.node_names if node in held] if held else []
    else:
        judged = args.node_names
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    for node in judged:
        refused = refusal(ledger, pod, node)
        if refused is not None:
            (unresolvable if refused.unresolvable else failed)[node] = refused.reason
    passed = (
        [node for node in args.node_names if node not in failed and node not in unresolvable]
        if failed or unresolvable
        else args.node_names
    )
    if args.node_list is None:
        nodes, names = None, passed
    else:
        kept = set(passed)
        nodes = {
            **args.node_list,
            "items": [
                item
                for item in args.node_list.get("items") or []
                if item["metadata"]["name"] in kept
            ],
        }
        names = None
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }


def prioritize(ledger: Ledger, args: ExtenderArgs, *, placement: Placement) -> list[Object]:
    """`HostPriorityList`: a 0 to 10 score for every candidate node."""
    pod = pending(ledger, args.pod)
    if pod.reserved is None and not pod.reservation_pod:
        # Any other pod scores the maximum on a node where nothing is promised: only the
        # few nodes with a Reservation on them are worked out.
        promising = ledger.promising_nodes()
        return [
            {
                "Host": node,
                "Score": score(ledger, pod, node, placement=placement)
                if node in promising
                else MAX_SCORE,
            }
            for node in args.node_names
        ]
    return [
        {"Host": node, "Score": score(ledger, pod, node, placement=placement)}
        for node in args.node_names
    ]


def score(ledger: Ledger, pod: Pending, node: str, *, placement: Placement) -> int:
    """An owner wants its Reservation's node; a placeholder follows the placement strategy;
    any other pod prefers nodes whose capacity is not promised to Reservations, so that it
    stays out of the way of migrations in flight."""
    if pod.reserved is not None:
        return MAX_SCORE if node == pod.reserved[1] else 0
    allocatable = ledger.allocatable(node)
    if pod.reservation_pod:
        free = ledger.free(node)
        if allocatable is None or free is None:
            return 0
        left = _tenths(_mean_share(subtract(free, pod.requests), allocatable))
        return left if placement == Placement.SPREAD else MAX_SCORE - left
    promised = ledger.promised(node)
    if allocatable is None or not any(promised.values()):
        return MAX_SCORE
    return MAX_SCORE - _tenths(_max_share(promised, allocatable))


def _shares(part: Resources, whole: Resources) -> list[Decimal]:
    return [
        min(max(part.get(name, Decimal(0)) / whole[name], Decimal(0)), Decimal(1))
        for name in SCORED_RESOURCES
        if whole.get(name, Decimal(0)) > 0
    ]


def _mean_share(part: Resources, whole: Resources) -> Decimal:
    shares = _shares(part, whole)
    return sum(shares, Decimal(0)) / len(shares) if shares else Decimal(0)


def _max_share(part: Resources, whole: Resources) -> Decimal:
    return max(_shares(part, whole), default=Decimal(0))


def _tenths(share: Decimal) -> int:
    return int((share * MAX_SCORE).to_integral_value(ROUND_HALF_UP))


def preempt(ledger: Ledger, args: PreemptionArgs) -> tuple[Object, dict[str, str]]:
    """`ExtenderPreemptionResult` with the candidate nodes kept, and why the others went."""
    pod = pending(ledger, args.pod)
    kept: dict[str, Object] = {}
    dropped: dict[str, str] = {}
    for node, victims in args.victims.items():
        reason = _preemption_refusal(ledger, pod, node, victims)
        if reason is None:
            kept[node] = {
                "Pods": [{"UID": victim.uid} for victim in victims.pods],
                "NumPDBViolations": victims.pdb_violations,
            }
        else:
            dropped[node] = reason
    return {"NodeNameToMetaVictims": kept}, dropped


def _preemption_refusal(ledger: Ledger, pod: Pending, node: str, victims: Victims) -> str | None:
    if pod.reservation_pod and victims.pdb_violations:
        return (
            f"{victims.pdb_violations} of the victims would violate a PodDisruptionBudget, "
            "and a placeholder preempts only what an eviction could remove"
        )
    released: Resources = {}
    for victim in victims.pods:
        if victim.pod is not None:
            name = pod_name(victim.pod)
            # By UID too: a victim the ledger knows as a placeholder stays one, whatever
            # the body says of it.
            reservation = ledger.placeholder_of_pod(victim.pod) or ledger.placeholder_of(victim.uid)
            requests = node_charge(victim.pod.get("spec") or {}, victim.pod.get("status"))
        else:
            entry = ledger.pod(victim.uid)
            # A victim the ledger has not seen yet frees nothing that it counts.
            name = entry.name if entry else victim.uid
            reservation = ledger.placeholder_of(victim.uid)
            requests = entry.requests if entry else {}
        if reservation is not None:
            return f"victim {name} is the placeholder of Reservation {reservation}"
        released = add(released, requests)
    refused = refusal(ledger, pod, node, released=released)
    return refused.reason if refused else None


# ----- bodies in, bodies out --------------------------------------------------------------

VERBS = ("filter", "prioritize", "preempt")


def answer(
    ledger: Ledger, verb: str, body: bytes, *, placement: Placement, ready: bool
) -> tuple[int, Any]:
    """The HTTP status and JSON result for a request body to `verb` (one of VERBS); never
    raises on bad input."""
    if not ready:
        return _error(verb, "the extender's caches are not synced yet", status=503)
    try:
        request = orjson.loads(body)
        if verb == "filter":
            args = parse_args(request)
            result = filter_nodes(ledger, args)
            _log_filter(args, result)
            return 200, result
        if verb == "prioritize":
            return 200, prioritize(ledger, parse_args(request), placement=placement)
        preemption = parse_preemption_args(request)
        result, dropped = preempt(ledger, preemption)
        for node, reason in dropped.items():
            log.info(
                "preempt %s: node %s is no candidate: %s", pod_name(preemption.pod), node, reason
            )
        return 200, result
    except ValueError as error:  # not JSON, not the wire type, an unreadable quantity
        log.warning("%s: bad request: %s", verb, error)
        return _error(verb, f"bad {verb} request: {error}", status=400)


def _error(verb: str, message: str, *, status: int) -> tuple[int, Any]:
    if verb == "filter":
        return 200, {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": None,
            "FailedAndUnresolvableNodes": None,
            "Error": message,
        }
    return status, {"Error": message}


def _log_filter(args: ExtenderArgs, result: Object) -> None:
    refused = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    if refused:
        log.info(
            "filter %s: %d of %d nodes pass; refused %s",
            pod_name(args.pod),
            len(args.node_names) - len(refused),
            len(args.node_names),
            "; ".join(f"{node}: {reason}" for node, reason in sorted(refused.items())),
        )
    else:
        log.debug("filter %s: all %d nodes pass", pod_name(args.pod), len(args.node_names))
