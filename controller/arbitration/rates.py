"""Flow control: evictQPS/evictBurst, flowControlQPS/flowControlBurst, objectLimiters.

The other limits count what is in flight, which the API server holds; rates count what
happened recently, which it does not. Their state goes out of a round as
`LimiterState` and into the next one by the caller, and a new leader starts with full
buckets: at worst one burst more than the rate, never a job lost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from berth.settings import MigrationControllerArgs, ObjectLimiterKind
from controller.arbitration.limits import Wait, WaitReason


@dataclass(frozen=True)
class TokenBucket:
    """A token bucket as of `updated`; a new bucket is full."""

    tokens: float = math.inf
    updated: datetime | None = None

    def refilled(self, *, qps: float, burst: int, now: datetime) -> float:
        """Tokens at `now`: one more every 1/qps seconds, never more than `burst`."""
        elapsed = 0.0 if self.updated is None else max(0.0, (now - self.updated).total_seconds())
        return min(float(burst), self.tokens + elapsed * qps)


@dataclass(frozen=True)
class LimiterState:
    """The rate limiters, carried from one round to the next by the caller."""

    evictions: TokenBucket = TokenBucket()
    """evictQPS/evictBurst."""
    admissions: TokenBucket = TokenBucket()
    """flowControlQPS/flowControlBurst."""
    workload_admissions: Mapping[str, tuple[datetime, ...]] = field(default_factory=dict)
    """objectLimiters.workload: when jobs of each workload (`protocol.controlled_key`)
    were admitted, within the window."""


class Rates:
    """The rate limiters during one round: one token of each bucket per admitted job
    (each leads to at most one eviction), and the admissions of each workload within the
    objectLimiters.workload window."""

    def __init__(self, args: MigrationControllerArgs, state: LimiterState, now: datetime) -> None:
        self.args, self.now = args, now
        self.object_limiter = (args.object_limiters or {}).get(ObjectLimiterKind.WORKLOAD)
        self.window = _recent(
            state.workload_admissions,
            now=now,
            duration=self.object_limiter.duration if self.object_limiter else None,
        )
        """objectLimiters.workload: admissions of each workload within the window."""
        self.evict_tokens = state.evictions.refilled(
            qps=args.evict_qps, burst=args.evict_burst, now=now
        )
        self.flow_tokens = state.admissions.refilled(
            qps=args.flow_control_qps or 0.0, burst=args.flow_control_burst or 1, now=now
        )
        self.evict_wait: Wait = (
            WaitReason.EVICT_QPS,
            (
                f"eviction rate limit reached (evictQPS {args.evict_qps:g}, "
                f"evictBurst {args.evict_burst})"
            ),
        )
        self.flow_wait: Wait = (
            WaitReason.FLOW_CONTROL_QPS,
            (
                f"arbitration rate limit reached (flowControlQPS {args.flow_control_qps or 0:g}, "
                f"flowControlBurst {args.flow_control_burst or 1})"
            ),
        )

    def exhausted(self) -> Wait | None:
        """The rate that lets no more job through this round, if one; 0 or unset is no
        limit."""
        if self.args.evict_qps and self.evict_tokens < 1:
            return self.evict_wait
        if self.args.flow_control_qps and self.flow_tokens < 1:
            return self.flow_wait
        return None

    def admitted(self, workload: str | None) -> None:
        """Take a job admitted now (of this workload, if it has one) off the limiters."""
        self.evict_tokens -= 1
        self.flow_tokens -= 1
        if workload and self.object_limiter is not None:
            self.window.setdefault(workload, []).append(self.now)

    def state(self) -> LimiterState:
        """The rate limiters' state to hand to the next round."""
        now, args = self.now, self.args
        return LimiterState(
            evictions=TokenBucket(self.evict_tokens, now) if args.evict_qps else TokenBucket(),
            admissions=(
                TokenBucket(self.flow_tokens, now) if args.flow_control_qps else TokenBucket()
            ),
            workload_admissions={key: tuple(times) for key, times in self.window.items()},
        )


def _recent(
    admissions: Mapping[str, tuple[datetime, ...]], *, now: datetime, duration: timedelta | None
) -> dict[str, list[datetime]]:
    """The admissions within the last `duration`; none without an object limiter."""
    if duration is None:
        return {}
    recent = {
        uid: [moment for moment in times if moment > now - duration]
        for uid, times in admissions.items()
    }
    return {uid: times for uid, times in recent.items() if times}
