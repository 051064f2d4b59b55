"""A pod's controller, as the API server knows it.

A pod's ownerReferences are whatever its author wrote: anyone who may create a pod in a
namespace may name any UID there, the UID of another workload's ReplicaSet included. The
webhook gives a pod a Reservation by its controller's UID, so it believes a controller
reference only once the API server shows an object of that kind and name, in the pod's
namespace, with that UID.

The kinds Berth's RBAC lets the webhook read (manifests/rbac/webhook.yaml) are known
here; another kind is found once through API discovery, and needs `get` on its resource
granted to the webhook's ServiceAccount (without it the API server answers 403, which the
webhook logs, and the pod gets no Reservation).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from berth.kube.client import DEPLOYMENTS, REPLICASETS, STATEFULSETS, Kube, KubeError, Resource
from berth.protocol import Object

BUILT_IN: dict[tuple[str, str], Resource] = {
    ("apps/v1", "ReplicaSet"): REPLICASETS,
    ("apps/v1", "Deployment"): DEPLOYMENTS,
    ("apps/v1", "StatefulSet"): STATEFULSETS,
    ("apps/v1", "DaemonSet"): Resource("apps", "v1", "daemonsets", namespaced=True),
    ("batch/v1", "Job"): Resource("batch", "v1", "jobs", namespaced=True),
    ("v1", "ReplicationController"): Resource("", "v1", "replicationcontrollers", namespaced=True),
}

_SEGMENT = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A name or namespace as the API allows them (DNS subdomain): one URL path segment."""
_API_VERSION = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?v[0-9]+((alpha|beta)[0-9]+)?")
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9]{0,62}")


class Owners:
    """Looks up controller references; remembers where each kind lives."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.resources: dict[tuple[str, str], Resource] = dict(BUILT_IN)

    async def confirmed(self, reference: Mapping[str, Any], namespace: str) -> Object | None:
        """The object `reference` names, when the API server has it with the reference's
        UID (in `namespace`, for a namespaced kind); None otherwise."""
        api_version, kind, name = reference["apiVersion"], reference["kind"], reference["name"]
        if not (
            _API_VERSION.fullmatch(api_version)
            and _KIND.fullmatch(kind)
            and _SEGMENT.fullmatch(name)
            and _SEGMENT.fullmatch(namespace)
        ):
            return None  # nothing the API server could hold; never put it in a URL
        resource = await self.resource(api_version, kind)
        if resource is None:
            return None
        try:
            found = await self.kube.get(resource, name, namespace if resource.namespaced else None)
        except KubeError as error:
            if error.not_found:
                return None
            raise
        uid = (found.get("metadata") or {}).get("uid")
        return found if uid == reference["uid"] else None

    async def resource(self, api_version: str, kind: str) -> Resource | None:
        """Where objects of `kind` live: known, or found through discovery."""
        known = self.resources.get((api_version, kind))
        if known is not None:
            return known
        group, _, version = api_version.rpartition("/")
        try:
            listing = await self.kube.request(
                "GET", f"/apis/{api_version}" if group else f"/api/{version}"
            )
        except KubeError as error:
            if error.not_found:
                return None
            raise
        for entry in listing.get("resources") or []:
            if entry.get("kind") == kind and "/" not in str(entry.get("name", "/")):
                found = Resource(
                    group, version, str(entry["name"]), namespaced=bool(entry.get("namespaced"))
                )
                self.resources[(api_version, kind)] = found
                return found
        return None
