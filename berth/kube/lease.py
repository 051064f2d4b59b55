"""Leader election on a coordination.k8s.io Lease.

One controller replica acts; the others wait. The holder renews the Lease every
`retry` seconds; a standby takes it over once it has seen the Lease unchanged for
`duration` seconds. Two rules keep two replicas from acting at once:

- The holder stops acting (its `lost` event is set) as soon as it cannot renew within
  `renew_deadline` of its last renewal: every attempt is bounded by what is left of
  that deadline, never by the HTTP client's own timeout. It stops at once, too, when it
  reads the Lease and finds another holder there.
- A holder that stops of its own accord (SIGTERM) gives the Lease up once it has
  stopped acting (`release`): an empty holder, which a standby takes at its next try
  instead of waiting out `duration`.
- Expiry is judged on the observer's own clock, as client-go does: a standby counts
  `duration` from the moment it first saw the Lease's current holder and renewTime, never
  from the timestamps the holder wrote, so clocks that disagree between machines do not
  let it take over early. `duration` is longer than `renew_deadline`, so a holder that
  cannot renew has stopped before anyone may take over.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from berth.kube.client import LEASES, Kube, KubeError

log = logging.getLogger(__name__)


def _micro(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ----- the decisions, on the observer's clock -------------------------------------------


@dataclass(frozen=True)
class Record:
    """What a Lease says about its holder: the parts whose change shows it is alive."""

    holder: str | None
    renew_time: str | None
    duration: float

    @classmethod
    def of(cls, spec: dict[str, Any], *, default_duration: float) -> Record:
        seconds = spec.get("leaseDurationSeconds")
        duration = default_duration
        if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds > 0:
            duration = float(seconds)
        return cls(
            holder=spec.get("holderIdentity") or None,
            renew_time=spec.get("renewTime"),
            duration=duration,
        )


@dataclass(frozen=True)
class Observation:
    """A record, and when (on this process's monotonic clock) it was first seen as it is."""

    record: Record
    seen_at: float


def observe(previous: Observation | None, record: Record, *, now: float) -> Observation:
    """The observation after reading `record` at `now`: the earlier one while the record
    is unchanged (its clock keeps running), a new one from `now` when it changed."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


class Verdict(Enum):
    FREE = "free"
    """Nobody holds the Lease, or its holder let it expire: take it."""
    OURS = "ours"
    """This process holds it: renew."""
    HELD = "held"
    """Another holder, alive as far as this observer can tell: keep off."""


def judge(observation: Observation, *, identity: str, now: float) -> Verdict:
    """Whose the Lease is, seen from this process at `now`."""
    record = observation.record
    if record.holder is None:
        return Verdict.FREE
    if record.holder == identity:
        return Verdict.OURS
    if now - observation.seen_at >= record.duration:
        return Verdict.FREE
    return Verdict.HELD


def released(spec: dict[str, Any]) -> dict[str, Any]:
    """The Lease's spec once its holder gives it up: nobody holds it, the transitions kept."""
    now = _micro(datetime.now(UTC))
    return {
        "leaseDurationSeconds": 1,
        "acquireTime": now,
        "renewTime": now,
        "leaseTransitions": spec.get("leaseTransitions") or 0,
    }


# ----- the loop -------------------------------------------------------------------------


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
        self.observation: Observation | None = None
        self.renewed: float | None = None
        """Loop time at the start of the last attempt that renewed the lease: the others
        count its duration from no earlier than that."""
        self.releasing = False
        """Set by `release`: this replica acts no more."""

    def still_leading(self) -> bool:
        """Whether this replica may act now: it holds the lease and renewed it less than
        `renew_deadline` ago (others may take it `duration` after its last renewal). A
        loop that stalled past that acts no more, even before `run` notices."""
        if not self.leading.is_set() or self.lost.is_set() or self.renewed is None:
            return False
        if self.releasing:
            return False
        return asyncio.get_running_loop().time() - self.renewed < self.renew_deadline

    def _spec(self, *, acquire: str | None, transitions: int) -> dict[str, Any]:
        now = _micro(datetime.now(UTC))
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "acquireTime": acquire or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    async def _try(self) -> Verdict:
        """Read the Lease and, unless another holds it, take or renew it. OURS when this
        process holds it now, HELD when another does."""
        loop = asyncio.get_running_loop()
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
            return Verdict.OURS
        spec = lease.get("spec") or {}
        record = Record.of(spec, default_duration=self.duration)
        self.observation = observe(self.observation, record, now=loop.time())
        self.holder = record.holder
        verdict = judge(self.observation, identity=self.identity, now=loop.time())
        if verdict == Verdict.HELD:
            return verdict
        ours = verdict == Verdict.OURS
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        acquire = spec.get("acquireTime") if ours else None
        lease["spec"] = self._spec(acquire=acquire, transitions=transitions)
        # The PUT carries the resourceVersion read: of two candidates, one wins.
        await self.kube.request(
            "PUT", LEASES.path(namespace=self.namespace, name=self.name), body=lease
        )
        return Verdict.OURS

    async def release(self, *, timeout: float = 2.0) -> bool:
        """Stop acting and, if this replica still holds the Lease, give it up: an empty
        holder (as client-go's ReleaseOnCancel writes), so that a standby takes over at its
        next try instead of `duration` later. Call it once the loops that act are stopped;
        True when the Lease was given up. Never raises: a Lease not given up only expires."""
        self.releasing = True
        if not self.leading.is_set() or self.lost.is_set():
            return False
        try:
            async with asyncio.timeout(timeout):
                lease = await self.kube.get(LEASES, self.name, self.namespace)
                spec = lease.get("spec") or {}
                if (spec.get("holderIdentity") or None) != self.identity:
                    return False
                lease["spec"] = released(spec)
                # With the resourceVersion read: a Lease someone else wrote since stays theirs.
                await self.kube.request(
                    "PUT", LEASES.path(namespace=self.namespace, name=self.name), body=lease
                )
        except (TimeoutError, KubeError) as error:
            log.warning(
                "lease %s/%s: not released (%s); it expires", self.namespace, self.name, error
            )
            return False
        log.info("released the lease %s/%s", self.namespace, self.name)
        return True

    async def _attempt(self, *, deadline: float) -> Verdict | None:
        """One try, given up at `deadline` (loop time); None when it failed."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self._try()
        except TimeoutError:
            log.warning("lease %s/%s: no answer in time", self.namespace, self.name)
        except KubeError as error:
            if not error.conflict:
                log.warning("lease %s/%s: %s", self.namespace, self.name, error)
        except Exception as error:
            log.warning("lease %s/%s: %r", self.namespace, self.name, error)
        return None

    async def run(self) -> None:
        """Acquire, then renew until renewal fails for `renew_deadline` or another holder
        is seen; then set `lost` and return."""
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while True:
            leading = self.leading.is_set()
            # While leading, an attempt may take what is left of the renew deadline; while
            # standing by, as long as a whole deadline.
            deadline = (renewed if leading else loop.time()) + self.renew_deadline
            started = loop.time()
            verdict = await self._attempt(deadline=deadline)
            if verdict == Verdict.OURS:
                renewed = self.renewed = started
                if not leading:
                    log.info("became leader (%s)", self.identity)
                    self.holder = self.identity
                    self.leading.set()
            elif leading and verdict == Verdict.HELD:
                log.error("lost the lease: %s holds it now; stepping down", self.holder)
                self.lost.set()
                return
            elif leading and loop.time() - renewed >= self.renew_deadline:
                log.error("lost the lease: could not renew for %.0fs", self.renew_deadline)
                self.lost.set()
                return
            # `retry` from the start of this attempt, not from its end: a renewal that
            # takes a while (a loaded API server) leaves the next one the rest of the
            # renew deadline, rather than that less the attempt's own time.
            await asyncio.sleep(max(0.0, started + self.retry - loop.time()))
