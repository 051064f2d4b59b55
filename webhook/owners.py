"""A pod's ReplicaSet, as the API server knows it.

A pod's ownerReferences are whatever its author wrote: anyone who may create a pod in a
namespace may name any controller there, UID included. So they count only for a pod the
API server says its controller created (`berth.protocol.created_by_controller`, checked
by `webhook.decide` before anything is looked up); then:

- a controller owner matches a Reservation only with the same kind, name and UID as the
  controller the controller recorded from the real pod (`berth.protocol.matches_owner`),
  in the Reservation's namespace; no other workload is read (their pod templates hold env
  values: least privilege keeps `get` on them away from the webhook);
- a ReplicaSet is looked up (the webhook may `get` ReplicaSets, and must: a rollout's new
  ReplicaSet matches through the Deployment above it), and believed only when the API
  server holds one of that name with that UID in the pod's namespace.

A ReplicaSet found is remembered for `REMEMBER` seconds, by namespace, name and UID: the
replacement pods of a migration wave, and every other pod a ReplicaSet creates in a
namespace where a Reservation is about to open, then cost one GET per ReplicaSet rather
than one each. What could change meanwhile is only the ReplicaSet's own controller (a
Deployment orphaning or adopting it), and for seconds at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from berth.kube.client import REPLICASETS, Kube, KubeError
from berth.protocol import Object, is_object_name, is_replicaset

REMEMBER = 10.0
"""Seconds a ReplicaSet found stays confirmed without asking again."""
REMEMBERED = 1024
"""ReplicaSets remembered at most; the oldest go first."""


class Owners:
    """Looks up the ReplicaSets pods name as their controller."""

    def __init__(
        self, kube: Kube, *, remember: float = REMEMBER, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kube = kube
        self.remember = remember
        self.clock = clock
        self.found: dict[tuple[str, str, str], tuple[float, Object]] = {}
        """(namespace, name, uid) → (until when, the ReplicaSet)."""

    async def confirmed(self, reference: Mapping[str, Any], namespace: str) -> Object | None:
        """The ReplicaSet `reference` names, when the API server has it in `namespace`
        with the reference's UID; None otherwise (and for any other kind)."""
        name = reference.get("name")
        if not (
            is_replicaset(reference)
            and isinstance(name, str)
            and is_object_name(name)
            and is_object_name(namespace)
        ):
            return None  # nothing the API server could hold; never put it in a URL
        key = (namespace, name, str(reference.get("uid")))
        remembered = self.found.get(key)
        if remembered is not None and self.clock() < remembered[0]:
            return remembered[1]
        try:
            found = await self.kube.get(REPLICASETS, name, namespace)
        except KubeError as error:
            if error.not_found:
                return None
            raise
        uid = (found.get("metadata") or {}).get("uid")
        if uid != reference.get("uid"):
            return None
        self.found.pop(key, None)
        self.found[key] = (self.clock() + self.remember, found)
        if len(self.found) > REMEMBERED:
            del self.found[next(iter(self.found))]
        return found
