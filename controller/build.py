"""The objects the controller creates: a Reservation for a pod, a placeholder for a Reservation.

A Reservation carries the pod's scheduling constraints and requests, minus its current
node. Its placeholder is the smallest pod kube-scheduler will charge exactly like the
original: a pause container with the pod's effective requests and every constraint that
decides placement, and nothing that could make a Service, a PodDisruptionBudget or the
workload's selector mistake it for the workload's own pod.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from berth.api import API_VERSION, is_zero, keys, parse_duration
from berth.protocol import annotations_of, controller_of, placeholder_namespace
from berth.resources import format_quantity, held_requests
from berth.scheduling import host_port_entries
from controller.template import without_berth_keys

Object = dict[str, Any]

# Pod spec fields that decide where a pod may go; the placeholder copies exactly these.
PLACEMENT_FIELDS = (
    "priorityClassName",
    "priority",
    "schedulerName",
    "tolerations",
    "nodeSelector",
    "affinity",
    "topologySpreadConstraints",
    "runtimeClassName",
    "preemptionPolicy",
)
PLACEHOLDER_PREFIX = "berth-placeholder-"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def placeholder_prefix(reservation_name: str) -> str:
    """The `generateName` of a Reservation's placeholder: the API server adds a random
    suffix (and shortens a long prefix), so no pod can take the name in advance."""
    return f"{PLACEHOLDER_PREFIX}{reservation_name}-"


def exclude_node(affinity: Mapping[str, Any] | None, node: str) -> Object:
    """`affinity` with a required "not on `node`" ANDed into every node selector term."""
    return _and_node_field(
        affinity, {"key": "metadata.name", "operator": "NotIn", "values": [node]}
    )


def only_node(affinity: Mapping[str, Any] | None, node: str) -> Object:
    """`affinity` with a required "only on `node`" ANDed into every node selector term:
    what a template's `nodeName` asks, scheduled (as the DaemonSet controller does)."""
    return _and_node_field(affinity, {"key": "metadata.name", "operator": "In", "values": [node]})


def _and_node_field(affinity: Mapping[str, Any] | None, field: Object) -> Object:
    result: Object = copy.deepcopy(dict(affinity or {}))
    node_affinity = result.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*(term.get("matchFields") or []), field]} for term in terms
    ]
    return result


def _required_terms(affinity: Mapping[str, Any] | None) -> list[Object]:
    node_affinity = (affinity or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


def merge_placement(pod_spec: Mapping[str, Any], user: Mapping[str, Any]) -> Object:
    """The job template's pod fields laid over the pod's own, narrowing, never widening:
    nodeSelector entries are added, required node affinity terms are ANDed (every pair of
    terms combined), tolerations are added; any other field the template sets replaces."""
    result: Object = copy.deepcopy(dict(user))
    if "nodeSelector" in user:
        result["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **user["nodeSelector"]}
    if "tolerations" in user:
        result["tolerations"] = [*(pod_spec.get("tolerations") or []), *user["tolerations"]]
    own, extra = _required_terms(pod_spec.get("affinity")), _required_terms(user.get("affinity"))
    if "affinity" in user:
        affinity: Object = {
            **copy.deepcopy(dict(pod_spec.get("affinity") or {})),
            **copy.deepcopy(dict(user["affinity"])),
        }
        if own and not extra:
            affinity["nodeAffinity"] = {
                **(affinity.get("nodeAffinity") or {}),
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": own},
            }
        if own and extra:
            combined = _and_terms(own, extra)
            node_affinity = {**(affinity.get("nodeAffinity") or {})}
            node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
                "nodeSelectorTerms": combined
            }
            affinity["nodeAffinity"] = node_affinity
        result["affinity"] = affinity
    return result


def _and_terms(
    own: Sequence[Mapping[str, Any]], extra: Sequence[Mapping[str, Any]]
) -> list[Object]:
    """Node selector terms matching where one of `own` and one of `extra` both match:
    every pair of terms combined (terms are ORed, a term's requirements ANDed)."""
    return [
        {
            key: [*(a.get(key) or []), *(b.get(key) or [])]
            for key in ("matchExpressions", "matchFields")
            if a.get(key) or b.get(key)
        }
        for a in own
        for b in extra
    ]


def and_required_terms(affinity: Mapping[str, Any] | None, extra: Sequence[Object]) -> Object:
    """`affinity` narrowed to where one of the node selector terms `extra` matches too."""
    result: Object = copy.deepcopy(dict(affinity or {}))
    own = _required_terms(affinity)
    node_affinity = result.setdefault("nodeAffinity", {})
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": _and_terms(own, extra) if own else copy.deepcopy(list(extra))
    }
    return result


def without_pin(affinity: Mapping[str, Any] | None, node: str) -> Object | None:
    """`affinity` without the "only on `node`" term Berth's webhook added when the pod was
    bound to a Reservation there; kept, it would forbid every other node to a new one. A
    term left empty by it (the webhook's own, made for a pod without one) goes, as does the
    required node affinity when no term is left: an empty term would match no node."""
    if not affinity:
        return None
    result: Object = copy.deepcopy(dict(affinity))
    node_affinity = result.get("nodeAffinity") or {}
    required = node_affinity.get(REQUIRED) or {}
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        fields = [field for field in term.get("matchFields") or [] if field != pin]
        left = {key: value for key, value in term.items() if key != "matchFields"}
        if fields:
            left["matchFields"] = fields
        if fields or left.get("matchExpressions") or pin not in (term.get("matchFields") or []):
            terms.append(left)
    if terms:
        required["nodeSelectorTerms"] = terms
    elif REQUIRED in node_affinity:
        del node_affinity[REQUIRED]
        if not node_affinity:
            result.pop("nodeAffinity", None)
    return result


def unpinned(pod: Mapping[str, Any], affinity: Mapping[str, Any] | None) -> Object | None:
    """`affinity` (the pod's own, or one made from it) as the pod's replacement asks: for
    a pod Berth's webhook bound to a Reservation, without the term tying it to the node
    it runs on (`without_pin`)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node and keys.RESERVATION_ALLOCATED in (pod["metadata"].get("annotations") or {}):
        return without_pin(affinity, node)
    return dict(affinity) if affinity is not None else None


def replacement_placement(pod: Mapping[str, Any], *, where: bool = True) -> Object:
    """What decides which nodes take the pod's replacement, as `scheduling.node_refusal`
    reads it: the pod's tolerations and, with `where`, its node selector and required
    node affinity, less the term tying a pod Berth bound before to the node it runs on
    (`unpinned`). Without `where`, only the tolerations: for a Reservation made by hand
    (`reservationRef`), whose owners may name another pod than the one evicted, and whose
    node is its maker's choice."""
    spec = pod.get("spec") or {}
    fields = ("tolerations", "nodeSelector") if where else ("tolerations",)
    placement: Object = {field: copy.deepcopy(spec[field]) for field in fields if spec.get(field)}
    affinity = unpinned(pod, spec.get("affinity")) if where else None
    if affinity:
        placement["affinity"] = affinity
    return placement


def _containers_for_requests(spec: Mapping[str, Any]) -> Object:
    """The container parts of a pod spec that decide its requests and host ports."""

    def strip(container: Mapping[str, Any]) -> Object:
        kept: Object = {"name": container["name"]}
        requests = {
            name: value
            for name, value in ((container.get("resources") or {}).get("requests") or {}).items()
            # A pod bound to an earlier Reservation carries Berth's marker, which holds no
            # capacity: the placeholder gets its own.
            if name != keys.RESERVATION_RESOURCE
        }
        if requests:
            kept["resources"] = {"requests": requests}
        ports = [p for p in container.get("ports") or [] if p.get("hostPort")]
        if ports:
            kept["ports"] = ports
        if container.get("restartPolicy"):
            kept["restartPolicy"] = container["restartPolicy"]
        return kept

    result: Object = {"containers": [strip(c) for c in spec.get("containers") or []]}
    if spec.get("initContainers"):
        result["initContainers"] = [strip(c) for c in spec["initContainers"]]
    if (spec.get("resources") or {}).get("requests"):
        result["resources"] = {"requests": dict(spec["resources"]["requests"])}
    return result


def reservation_for(
    *,
    job: Mapping[str, Any],
    pod: Mapping[str, Any],
    workload_uid: str | None,
    ttl: str | None,
    template: Mapping[str, Any] | None = None,
    volume_terms: Sequence[Sequence[Object]] = (),
) -> Object:
    """The Reservation that holds a place for `pod` elsewhere, named after the job's UID.

    `volume_terms`: the node selector terms of each PersistentVolume the pod's claims are
    bound to (`JobView.volume_terms`), ANDed into the place's required node affinity: the
    replacement mounts the same claims, and kube-scheduler puts it only where its volumes
    may be used (a zonal disk, a local volume).

    `template` is the job's `reservationOptions.template` (a ReservationTemplateSpec): its
    metadata is merged in, its `spec.template` pod fields override the pod's own, and its
    owners, when given, replace the pod's controller. `ttl`: the template's when it is a
    positive duration, else the job's, else (a job that never times out) the Reservation's
    default; never a ttl of 0 (a Reservation that never expires, holding its place for
    ever should its job wait for ever).
    """
    spec = pod.get("spec", {})
    pod_template_spec: Object = {
        field: copy.deepcopy(spec[field])
        for field in PLACEMENT_FIELDS
        if spec.get(field) is not None
    }
    pod_template_spec.update(_containers_for_requests(spec))
    user = template or {}
    user_spec = user.get("spec") or {}
    user_pod = (user_spec.get("template") or {}).get("spec") or {}
    pod_template_spec.update(merge_placement(pod_template_spec, user_pod))
    if spec.get("nodeName"):
        own = unpinned(pod, pod_template_spec.get("affinity"))
        pod_template_spec["affinity"] = exclude_node(own, spec["nodeName"])
    for terms in volume_terms:
        pod_template_spec["affinity"] = and_required_terms(
            pod_template_spec.get("affinity"), list(terms)
        )
    namespace = pod["metadata"]["namespace"]
    controller = controller_of(pod)
    owners: list[Object] = copy.deepcopy(user_spec.get("owners") or [])
    if not owners and controller:
        owners = [{"controller": {**controller, "namespace": namespace}}]
    if not owners:  # a bare pod: only a pod of the same name (e.g. re-created by hand)
        owners = [{"object": {"namespace": namespace, "name": pod["metadata"]["name"]}}]
    user_meta = user.get("metadata") or {}
    annotations = {
        **without_berth_keys(user_meta.get("annotations")),
        keys.JOB: job["metadata"]["name"],
    }
    if workload_uid:
        annotations[keys.WORKLOAD] = workload_uid
    if asks_for_preemption(job):
        annotations[keys.PREEMPTION] = keys.PREEMPTION_ALLOWED
    reservation_spec: Object = {
        "template": {"metadata": {"namespace": namespace}, "spec": pod_template_spec},
        "owners": owners,
        "allocateOnce": True,
    }
    asked = user_spec.get("ttl")
    if asked and not is_zero(str(asked)) and parse_duration(str(asked)) >= timedelta(0):
        reservation_spec["ttl"] = asked
    elif ttl:
        reservation_spec["ttl"] = ttl
    return {
        "apiVersion": API_VERSION,
        "kind": "Reservation",
        "metadata": {
            "name": job["metadata"]["uid"],
            "labels": without_berth_keys(user_meta.get("labels")),
            "annotations": annotations,
            # Deleting the job deletes its Reservation (and so the placeholder) too.
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "PodMigrationJob",
                    "name": job["metadata"]["name"],
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": reservation_spec,
    }


def asks_for_preemption(job: Mapping[str, Any]) -> bool:
    """Whether the job sets `reservationOptions.preemptionOptions` (an empty object too:
    the seeds define no field in it, so its presence is the whole request)."""
    options = (job.get("spec") or {}).get("reservationOptions") or {}
    return options.get("preemptionOptions") is not None


def allocatable_of(reservation: Mapping[str, Any]) -> dict[str, str]:
    """What the Reservation holds, as quantities (its `status.allocatable`)."""
    spec = ((reservation.get("spec") or {}).get("template") or {}).get("spec") or {}
    return {name: format_quantity(name, value) for name, value in held_requests(spec).items()}


def placeholder_for(
    reservation: Mapping[str, Any], *, image: str, priority_class: Mapping[str, Any] | None = None
) -> Object:
    """The pause pod that makes the Reservation's capacity real to kube-scheduler. Its
    name comes from the API server; the controller records it with its UID on the
    Reservation (`berth.sh/placeholder`), which is what makes it the placeholder.

    `priority_class` is the non-preempting twin of the pod's PriorityClass
    (`non_preempting_class`): the placeholder runs under it so that it never preempts."""
    template = reservation["spec"]["template"]
    spec = template.get("spec") or {}
    name = reservation["metadata"]["name"]
    requests = allocatable_of(reservation)
    ports = host_port_entries(spec)
    container: Object = {
        "name": "reserve",
        "image": image,
        # Berth's marker makes kube-scheduler call the extender for this pod (and only
        # Berth's pods carry it); requests and limits equal, as the API requires of an
        # extended resource.
        "resources": {
            "requests": {**requests, keys.RESERVATION_RESOURCE: "1"},
            "limits": {keys.RESERVATION_RESOURCE: "1"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
    }
    if ports:
        container["ports"] = ports
    pod_spec: Object = {
        field: copy.deepcopy(spec[field])
        for field in PLACEMENT_FIELDS
        if spec.get(field) is not None
    }
    pod_spec.update(
        {
            "containers": [container],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "restartPolicy": "Always",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65535,
                "runAsGroup": 65535,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
    )
    if isinstance(spec.get("nodeName"), str) and spec["nodeName"]:
        # A Reservation made by hand for one node (Koordinator's template.spec.nodeName):
        # scheduled there, not bound past the scheduler, so its capacity is checked.
        pod_spec["affinity"] = only_node(pod_spec.get("affinity"), spec["nodeName"])
    pod_spec.pop("priority", None)  # set by admission from priorityClassName
    if priority_class:
        # The class's value and policy are stated on the pod too: the Priority admission
        # plugin refuses a pod whose priority or preemptionPolicy differs from its class's,
        # so a class of that name made by someone else with other values, whenever it was
        # made, gets no placeholder (`unusable_class` says why beforehand).
        pod_spec["priorityClassName"] = priority_class["metadata"]["name"]
        pod_spec["priority"] = priority_class["value"]
        pod_spec["preemptionPolicy"] = NEVER
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": placeholder_prefix(name),
            "namespace": placeholder_namespace(reservation),
            # Only Berth's label: no workload label, so no selector, Service or PDB matches.
            "labels": {keys.RESERVATION_LABEL: name},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "Reservation",
                    "name": name,
                    "uid": reservation["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": pod_spec,
    }


NON_PREEMPTING_PREFIX = "berth-non-preempting-"
NEVER = "Never"
HIGHEST_USER_PRIORITY = 1_000_000_000
"""The highest value of a PriorityClass that is not one of Kubernetes' system classes."""


def non_preempting_class(priority: int) -> Object:
    """The PriorityClass a placeholder for a pod of `priority` runs under: the same value
    (capped at the highest a class outside the system ones may have), so it is scheduled
    in the same order and preempted by the same pods as the pod, with preemptionPolicy
    Never, so it never preempts a pod to make room for itself. A pod cannot set
    preemptionPolicy Never itself under a class that preempts: admission refuses it."""
    value = min(priority, HIGHEST_USER_PRIORITY)
    name = (
        f"{NON_PREEMPTING_PREFIX}{value}" if value >= 0 else f"{NON_PREEMPTING_PREFIX}minus{-value}"
    )
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "berth"}},
        "value": value,
        "preemptionPolicy": NEVER,
        "globalDefault": False,
        "description": f"Berth's placeholder pods for pods of priority {value}: they never "
        "preempt other pods.",
    }


def may_preempt(reservation: Mapping[str, Any], classes: Mapping[str, int], default: int) -> bool:
    """Whether the Reservation's placeholder runs under the pod's own PriorityClass, and so
    may have kube-scheduler preempt pods of lower priority to place it.

    Only on a Reservation the controller made for a job that allows preemption
    (`keys.PREEMPTION`), and only when that lends nothing the pod does not have: the pod
    itself may preempt (its preemptionPolicy is not Never), and its class (or, without
    one, the global default) still has the value the pod was admitted with. A class
    deleted and made again with a higher value would otherwise give the placeholder more
    than the pod. Otherwise the placeholder runs under the non-preempting twin."""
    if annotations_of(reservation).get(keys.PREEMPTION) != keys.PREEMPTION_ALLOWED:
        return False
    spec = ((reservation.get("spec") or {}).get("template") or {}).get("spec") or {}
    priority = spec.get("priority")
    if spec.get("preemptionPolicy") == "Never" or not isinstance(priority, int):
        return False
    name = spec.get("priorityClassName")
    return (classes.get(name) if name else default) == priority


def unusable_class(wanted: Mapping[str, Any], found: Mapping[str, Any]) -> str | None:
    """Why `found`, the PriorityClass of `wanted`'s name as the API server holds it, is not
    one a placeholder may run under (None: it is). Anyone who may create PriorityClasses
    may make one of that name first; one that preempts, or of another value, would let a
    placeholder evict pods, or order it apart from the pod it holds a place for."""
    value = found.get("value")
    policy = found.get("preemptionPolicy") or "PreemptLowerPriority"  # the API's default
    if value == wanted["value"] and policy == NEVER:
        return None
    return (
        f"PriorityClass {wanted['metadata']['name']} has value {value} and preemptionPolicy "
        f"{policy}, not value {wanted['value']} and preemptionPolicy {NEVER}: Berth's "
        "placeholders never run under it; delete it and the controller makes it as they need"
    )


def placeholder_priority(
    reservation: Mapping[str, Any], classes: Mapping[str, int], default: int
) -> int:
    """The priority of the pod a Reservation holds a place for: its template's `priority`
    (copied from the pod), else the value of its `priorityClassName`, else `default` (the
    global default class's value, or 0)."""
    spec = ((reservation.get("spec") or {}).get("template") or {}).get("spec") or {}
    if isinstance(spec.get("priority"), int):
        return int(spec["priority"])
    name = spec.get("priorityClassName")
    return classes.get(name, 0) if name else default
