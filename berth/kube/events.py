"""Kubernetes Events, so `kubectl describe` tells the story of a job."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from berth.kube.client import EVENTS, Kube, KubeError

log = logging.getLogger(__name__)

CLUSTER_EVENTS_NAMESPACE = "kube-system"
"""Where Events about cluster-scoped objects (jobs, Reservations) go. They name the pods,
namespaces and nodes of every migration, so not in `default`, which many may read; the
API server takes Events with an eventTime about a cluster-scoped object only there or in
kube-system (`legacyValidateEvent`). `kubectl describe` finds them in either."""


def event_body(
    *,
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    event_type: str,
    component: str,
    instance: str,
    now: datetime,
) -> dict[str, Any]:
    metadata = involved["metadata"]
    namespace = metadata.get("namespace") or CLUSTER_EVENTS_NAMESPACE
    moment = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    micro = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    reference = {
        "apiVersion": involved.get("apiVersion"),
        "kind": involved.get("kind"),
        "name": metadata["name"],
        "uid": metadata.get("uid"),
    }
    if metadata.get("namespace"):
        reference["namespace"] = metadata["namespace"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # Named by the time in nanoseconds, as the kubelet names its events: the API lists
        # them by name, and kubectl keeps that order for events of the same second.
        "metadata": {"name": f"{metadata['name']}.{time.time_ns():x}", "namespace": namespace},
        "involvedObject": reference,
        "reason": reason,
        "message": message,
        "type": event_type,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "eventTime": micro,
        "action": reason,
        "firstTimestamp": moment,
        "lastTimestamp": moment,
        "count": 1,
    }


class Recorder:
    """Writes Events; a failure to write one is logged, never raised."""

    def __init__(self, kube: Kube, *, component: str, instance: str) -> None:
        self.kube = kube
        self.component = component
        self.instance = instance

    async def record(
        self, involved: Mapping[str, Any], reason: str, message: str, event_type: str = "Normal"
    ) -> None:
        body = event_body(
            involved=involved,
            reason=reason,
            message=message,
            event_type=event_type,
            component=self.component,
            instance=self.instance,
            now=datetime.now(UTC),
        )
        kind, name = involved.get("kind"), involved["metadata"]["name"]
        about = {"PodMigrationJob": "job", "Reservation": "reservation", "Pod": "pod"}
        extra = {about[str(kind)]: name} if kind in about else {}
        log.info("%s %s/%s: %s", reason, kind, name, message, extra=extra)
        try:
            await self.kube.create(EVENTS, body, namespace=body["metadata"]["namespace"])
        except KubeError as error:
            log.warning("could not record event %s: %s", reason, error)
