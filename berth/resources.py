"""Resource quantities and a pod's effective requests: the one place Berth does this math.

A placeholder must hold exactly what the scheduler will charge for the pod it stands in
for, and the extender must charge pods the same way, so both use `pod_requests`, which
follows kube-scheduler's rules: init containers run one at a time, restartable init
containers (sidecars) keep running beside the app, pod overhead is added, pod-level
resources, where set, replace the container sum, and a running pod resized in place is
charged what its kubelet reports too (`pod_requests`' status). Berth's own extended resource
(`keys.RESERVATION_RESOURCE`) is no capacity: the scheduler is configured to ignore it, and
so is this math.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from berth.api import keys

Resources = dict[str, Decimal]

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(
    # The number, each digit matched one way only (linear time), ASCII digits only.
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"  # an exponent or a suffix
)
MAX_QUANTITY_LENGTH = 128
"""The longest quantity read: a number within `MAX_EXPONENT` needs far fewer characters."""


MAX_EXPONENT = 30
"""The largest power of ten a quantity may carry (`1e30`, or a number that long): far
beyond any capacity, and the bound keeps `1e999999999` from costing gigabytes of digits."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("100m", "4Gi", "1e3", 2) into a Decimal; ValueError
    for anything else, including numbers beyond `MAX_EXPONENT` and booleans."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"invalid quantity {value!r}: not a string or a number")
    text = str(value) if isinstance(value, int | float) else value.strip()
    if len(text) > MAX_QUANTITY_LENGTH:
        raise ValueError(
            f"invalid quantity {text[:32]!r}…: longer than {MAX_QUANTITY_LENGTH} characters"
        )
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"invalid quantity {str(value)[:100]!r}")
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number)
        power = int(exponent[1:]) if exponent else 0
        if abs(power) > MAX_EXPONENT or base.adjusted() > MAX_EXPONENT:
            raise ValueError(f"quantity {str(value)[:100]!r} is out of range")
        if exponent:
            return base * Decimal(10) ** power
        return base * _SUFFIXES[suffix or ""]
    except (InvalidOperation, ArithmeticError) as error:
        raise ValueError(f"invalid quantity {str(value)[:100]!r}") from error


def parse_resources(values: Mapping[str, Any] | None) -> Resources:
    return {name: parse_quantity(value) for name, value in (values or {}).items()}


def add(total: Resources, more: Mapping[str, Decimal]) -> Resources:
    result = dict(total)
    for name, value in more.items():
        result[name] = result.get(name, Decimal(0)) + value
    return result


def subtract(total: Resources, less: Mapping[str, Decimal]) -> Resources:
    result = dict(total)
    for name, value in less.items():
        result[name] = result.get(name, Decimal(0)) - value
    return result


def maximum(first: Resources, second: Mapping[str, Decimal]) -> Resources:
    result = dict(first)
    for name, value in second.items():
        result[name] = max(result.get(name, Decimal(0)), value)
    return result


def fits(requests: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> list[str]:
    """The resources of `requests` that `free` cannot cover (empty when it fits).

    A resource the node does not list at all counts as zero free, as in the scheduler.
    """
    return [
        name for name, value in requests.items() if value > 0 and value > free.get(name, Decimal(0))
    ]


def _requests(container: Mapping[str, Any]) -> Resources:
    return parse_resources((container.get("resources") or {}).get("requests"))


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _reported_containers(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The statuses of a pod's containers and init containers (JSON objects: dicts)."""
    return [
        s
        for field in ("containerStatuses", "initContainerStatuses")
        for s in _list(status.get(field))
        if isinstance(s, dict)
    ]


def resize_reported(status: object) -> tuple[object, ...]:
    """What of a pod's `status` its charge depends on (the resources its kubelet reports,
    and whether a resize was found infeasible): while it stays, as the spec does, so does
    the charge. Most status changes (conditions, IPs, restarts) leave it as it was."""
    if not isinstance(status, dict):
        return ()
    reported = [
        (s.get("resources"), s.get("allocatedResources")) for s in _reported_containers(status)
    ]
    return (
        *reported,
        status.get("resources"),
        status.get("allocatedResources"),
        resize_infeasible(status),
    )


def resize_infeasible(status: Mapping[str, Any]) -> bool:
    """The kubelet found the pod's pending resize infeasible on its node."""
    for condition in _list(status.get("conditions")):
        if isinstance(condition, dict) and condition.get("type") == "PodResizePending":
            return condition.get("reason") == "Infeasible"
    return False


def _effective(asked: Resources, status: Mapping[str, Any] | None, infeasible: bool) -> Resources:
    """What the scheduler charges for requests `asked`, given the `status` the kubelet
    reports for them (its `resources` actuated and its `allocatedResources`): the largest
    of the three while a resize is under way, and the last two only when the kubelet
    found the resize infeasible (k8s.io/component-helpers resource.PodRequests)."""
    if status is None or not isinstance(status.get("resources"), dict):
        return asked
    if not isinstance(status.get("allocatedResources") or {}, dict):
        return asked
    actuated = parse_resources(status["resources"].get("requests"))
    allocated = parse_resources(status.get("allocatedResources"))
    return maximum(maximum({} if infeasible else asked, actuated), allocated)


def pod_requests(spec: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> Resources:
    """What the scheduler charges a node for a pod with this spec, and with this `status`
    once it runs: a pod resized in place is charged what its kubelet reports too."""
    status = status if isinstance(status, dict) else {}
    infeasible = resize_infeasible(status)
    reported = {
        s["name"]: s for s in _reported_containers(status) if isinstance(s.get("name"), str)
    }

    def effective(container: Mapping[str, Any]) -> Resources:
        name = container.get("name")
        return _effective(
            _requests(container), reported.get(name) if isinstance(name, str) else None, infeasible
        )

    requests: Resources = {}
    for container in spec.get("containers") or []:
        requests = add(requests, effective(container))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for container in spec.get("initContainers") or []:
        if container.get("restartPolicy") == "Always":
            own = effective(container)
            requests = add(requests, own)
            sidecars = add(sidecars, own)
        else:
            init_peak = maximum(init_peak, add(_requests(container), sidecars))
    requests = maximum(requests, init_peak)
    pod_level = parse_resources((spec.get("resources") or {}).get("requests"))
    if pod_level and isinstance(status.get("resources"), dict):
        # The pod's own resources, resized in place: actuated in status.resources,
        # allocated in status.allocatedResources; a name the status leaves out counts 0.
        reported_pod = _effective(pod_level, status, infeasible)
        pod_level = {name: reported_pod.get(name, Decimal(0)) for name in pod_level}
    requests.update(
        {
            name: value
            for name, value in pod_level.items()
            if name in {"cpu", "memory"} or name.startswith("hugepages-")
        }
    )
    requests.pop(keys.RESERVATION_RESOURCE, None)
    return add(requests, parse_resources(spec.get("overhead")))


def held_requests(spec: Mapping[str, Any]) -> Resources:
    """What a pod of `spec` asks, the runtime class's overhead left out (the API server
    sets it on every pod of that class alike): what a Reservation's template holds for its
    pod, and what that pod asks of it."""
    return pod_requests({**spec, "overhead": None})


POD_SLOT: Resources = {"pods": Decimal(1)}
"""What a pod takes of a node's `pods` allocatable, as the scheduler counts it."""


def node_charge(spec: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> Resources:
    """Everything the scheduler charges a node for a pod with this spec and status: its
    requests (`pod_requests`) and one of the node's pod slots."""
    return add(pod_requests(spec, status), POD_SLOT)


def format_quantity(name: str, value: Decimal) -> str:
    """A compact, exact rendering: millicores for CPU, plain integers elsewhere."""
    if name == "cpu" and value != value.to_integral_value():
        return f"{(value * 1000).to_integral_value()}m"
    if value == value.to_integral_value():
        return str(int(value))
    return f"{(value * 1000).to_integral_value()}m"
