"""Leader election on a coordination.k8s.io Lease.

One controller replica acts; the others wait. The holder renews the Lease every
`retry` seconds; a standby takes it over once it has not been renewed for `duration`
seconds. A holder that cannot renew within `renew_deadline` stops acting (its
`lost` event is set) before anyone else may take over, so two never act at once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from berth.kube.client import LEASES, Kube, KubeError

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _micro(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration: float = 10.0,
        renew_deadline: float = 7.0,
        retry: float = 2.0,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.renew_deadline = renew_deadline
        self.retry = retry
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self.holder: str | None = None

    def _spec(self, *, acquire: datetime | None, transitions: int) -> dict[str, Any]:
        now = _now()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "acquireTime": _micro(acquire or now),
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }

    async def _try(self) -> bool:
        try:
            lease = await self.kube.get(LEASES, self.name, self.namespace)
        except KubeError as error:
            if not error.not_found:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(acquire=None, transitions=0),
            }
            await self.kube.create(LEASES, body, namespace=self.namespace)
            return True
        spec = lease.get("spec") or {}
        self.holder = spec.get("holderIdentity")
        renewed = spec.get("renewTime")
        expired = (
            renewed is None
            or _parse(renewed)
            + timedelta(seconds=spec.get("leaseDurationSeconds") or self.duration)
            < _now()
        )
        if self.holder != self.identity and not expired and self.holder:
            return False
        ours = self.holder == self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        acquire = _parse(spec["acquireTime"]) if ours and spec.get("acquireTime") else None
        lease["spec"] = self._spec(acquire=acquire, transitions=transitions)
        # The PUT carries the resourceVersion read: of two candidates, one wins.
        await self.kube.request(
            "PUT", LEASES.path(namespace=self.namespace, name=self.name), body=lease
        )
        return True

    async def run(self) -> None:
        """Acquire, then renew until renewal fails for longer than the deadline."""
        last_renewal = _now()
        while True:
            try:
                ok = await self._try()
            except KubeError as error:
                ok = False
                if not error.conflict:
                    log.warning("lease %s/%s: %s", self.namespace, self.name, error)
            except Exception as error:
                ok = False
                log.warning("lease %s/%s: %r", self.namespace, self.name, error)
            if ok:
                last_renewal = _now()
                if not self.leading.is_set():
                    log.info("became leader (%s)", self.identity)
                    self.holder = self.identity
                    self.leading.set()
            elif (
                self.leading.is_set()
                and (_now() - last_renewal).total_seconds() > self.renew_deadline
            ):
                log.error("lost the lease: could not renew for %.0fs", self.renew_deadline)
                self.lost.set()
                return
            await asyncio.sleep(self.retry)
