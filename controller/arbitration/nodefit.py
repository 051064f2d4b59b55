"""nodeFit: whether another node could take a pod now, before the pod is moved.

With nodeFit on, a job waits rather than start a migration whose pod has nowhere to go.
The hard rules are read as kube-scheduler reads them (berth.scheduling); preferences,
inter-pod affinity, spreading and ports are left to the scheduler, which the Reservation
consults anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from berth.protocol import labels_of
from berth.resources import fits, node_charge
from berth.scheduling import (
    node_affinity_matches,
    node_schedulable,
    parse_selector,
    selector_matches,
    taints_tolerated,
)
from controller.arbitration.objects import Object

if TYPE_CHECKING:
    from controller.arbitration.candidates import Candidate
    from controller.arbitration.round import Snapshot


class NodeFit:
    """Whether another node could take a pod now: Ready, not cordoned, matching
    `nodeSelector` of the config and the pod's nodeSelector and required node affinity,
    its NoSchedule/NoExecute taints tolerated, and `free` covering the pod's requests and
    a pod slot (`node_charge`). Admissions within the round do not use up `free`. Pods of
    one controller share a template, so the answer is worked out once per controller."""

    def __init__(self, snapshot: Snapshot) -> None:
        selector = parse_selector(snapshot.args.node_selector or "")
        self.free = snapshot.free
        self.nodes = [
            (name, node)
            for name, node in snapshot.nodes.items()
            if node_schedulable(node) and selector_matches(selector, labels_of(node))
        ]
        self.fitting: dict[str, tuple[str, ...]] = {}

    def fits_elsewhere(self, c: Candidate) -> bool:
        key = c.controller or c.uid
        if key not in self.fitting:
            self.fitting[key] = self._first_two(c.spec)
        return any(name != c.node for name in self.fitting[key])

    def _first_two(self, spec: Object) -> tuple[str, ...]:
        """Up to two nodes that fit: one of them is not the pod's own."""
        requests = node_charge(spec)
        found: list[str] = []
        for name, node in self.nodes:
            if (
                name in self.free
                and not fits(requests, self.free[name])
                and node_affinity_matches(spec, name, labels_of(node))
                and taints_tolerated(spec, node)
            ):
                found.append(name)
                if len(found) == 2:
                    break
        return tuple(found)
