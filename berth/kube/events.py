"""Kubernetes Events, so `kubectl describe` tells the story of a job."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from berth.kube.client import EVENTS, Kube, KubeError

log = logging.getLogger(__name__)

CLUSTER_EVENTS_NAMESPACE = "kube-system"
"""Where Events about cluster-scoped objects (jobs, Reservations) go. They name the pods,
namespaces and nodes of every migration, so not in `default`, which many may read; the
API server takes Events with an eventTime about a cluster-scoped object only there or in
kube-system (`legacyValidateEvent`). `kubectl describe` finds them in either."""


NOTE_LIMIT = 1024
"""The longest message the API server takes on an Event with an eventTime
(`NoteLengthLimit`, k8s.io/kubernetes pkg/apis/core/validation/events.go)."""

WRITE_TIMEOUT = 5.0
"""Seconds an Event's write may take: an event is told, never waited on."""


def note(message: str) -> str:
    """`message` as an Event can hold it: cut, with an ellipsis, at `NOTE_LIMIT` bytes of
    UTF-8 (the API server counts the bytes of the Go string)."""
    encoded = message.encode()
    if len(encoded) <= NOTE_LIMIT:
        return message
    return encoded[: NOTE_LIMIT - 3].decode(errors="ignore") + "..."


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
        "message": note(message),
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


@dataclass
class _Told:
    """An event written, and how often it was told since."""

    namespace: str
    name: str
    count: int
    written: float
    """When its count was last written (monotonic)."""


class Recorder:
    """Writes Events; a failure to write one is logged, never raised.

    The same event about the same object (type, reason and message) told again within
    `forget_after` seconds is not a new Event: the first one's `count` and
    `lastTimestamp` are brought up to date when it is told again `update_every` seconds
    or more after they were last written, as client-go's recorder aggregates them
    (`kubectl describe` says "x12 over 5m"): the count written is the least it was told.
    A tool that retries every few seconds (a drain's evictions) so leaves one Event per
    object and story, not one per attempt."""

    def __init__(
        self,
        kube: Kube,
        *,
        component: str,
        instance: str,
        update_every: float = 60.0,
        forget_after: float = 600.0,
        remembered: int = 4096,
    ) -> None:
        self.kube = kube
        self.component = component
        self.instance = instance
        self.update_every = update_every
        self.forget_after = forget_after
        self.remembered = remembered
        self.told: OrderedDict[tuple[str, ...], _Told] = OrderedDict()

    async def record(
        self, involved: Mapping[str, Any], reason: str, message: str, event_type: str = "Normal"
    ) -> None:
        kind, name = involved.get("kind"), involved["metadata"]["name"]
        key = (str(involved["metadata"].get("uid") or name), event_type, reason, message)
        now = time.monotonic()
        told = self.told.get(key)
        if told is not None and now - told.written > self.forget_after:
            told = None
        about = {"PodMigrationJob": "job", "Reservation": "reservation", "Pod": "pod"}
        extra = {about[str(kind)]: name} if kind in about else {}
        log.log(
            logging.INFO if told is None else logging.DEBUG,
            "%s %s/%s: %s",
            reason,
            kind,
            name,
            message,
            extra=extra,
        )
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                if told is None:
                    await self._create(
                        key=key,
                        involved=involved,
                        reason=reason,
                        message=message,
                        event_type=event_type,
                        now=now,
                    )
                else:
                    await self._again(key, told, now)
        except Exception as error:  # noqa: BLE001: an event is told, never raised
            said = str(error) if isinstance(error, KubeError) else repr(error)
            log.warning("could not record event %s: %s", reason, said)

    async def _create(
        self,
        *,
        key: tuple[str, ...],
        involved: Mapping[str, Any],
        reason: str,
        message: str,
        event_type: str,
        now: float,
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
        namespace = body["metadata"]["namespace"]
        # Remembered before it is written, so that the same event told meanwhile (the
        # webhook tells each from a task of its own) is counted, not created twice.
        told = _Told(namespace, body["metadata"]["name"], count=1, written=now)
        self.told[key] = told
        self.told.move_to_end(key)
        while len(self.told) > self.remembered:
            self.told.popitem(last=False)
        try:
            await self.kube.create(EVENTS, body, namespace=namespace)
        except BaseException:
            if self.told.get(key) is told:
                del self.told[key]  # not written: told anew next time
            raise

    async def _again(self, key: tuple[str, ...], told: _Told, now: float) -> None:
        told.count += 1
        self.told.move_to_end(key)
        if now - told.written < self.update_every:
            return
        told.written = now
        moment = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            await self.kube.patch(
                EVENTS,
                told.name,
                {"count": told.count, "lastTimestamp": moment},
                namespace=told.namespace,
            )
        except KubeError as error:
            if not error.not_found:
                raise
            # Gone (events expire after an hour, or were deleted): told anew from here.
            if self.told.get(key) is told:
                del self.told[key]
