"""The arithmetic of the report: percentiles, rates, ratios, and quantiles read from a
Prometheus histogram. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families


def percentile(values: Sequence[float], share: float) -> float:
    """The `share` (0 to 1) percentile, by linear interpolation between the closest ranks."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = share * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def rate(count: int, seconds: float) -> float:
    """Events per second; 0 for an empty span."""
    return count / seconds if seconds > 0 else 0.0


def span_rate(moments: Iterable[float]) -> tuple[int, float]:
    """Events and seconds from the first to the last of `moments`: the rate of a stream
    already under way (the first event starts the clock, so it is not counted)."""
    ordered = sorted(moments)
    if len(ordered) < 2:
        return 0, 0.0
    return len(ordered) - 1, ordered[-1] - ordered[0]


def ratio(with_berth: float, without: float) -> float | None:
    return with_berth / without if without else None


Buckets = dict[float, float]
"""A histogram's cumulative bucket counts by upper bound (`le`), +Inf included."""


def histogram(text: str, name: str) -> Buckets:
    """The buckets of histogram `name` (without labels) in a /metrics page."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {
                float(sample.labels["le"]): sample.value
                for sample in family.samples
                if sample.name == f"{name}_bucket"
            }
    raise KeyError(f"no histogram {name}")


def difference(after: Buckets, before: Buckets) -> Buckets:
    """What was observed between two reads of the same histogram."""
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def bucket_bound(buckets: Mapping[float, float], share: float) -> float | None:
    """The upper bound of the bucket that holds the `share` quantile: what a histogram
    can tell without guessing inside a bucket. None when nothing was observed."""
    total = max(buckets.values(), default=0.0)
    if total <= 0:
        return None
    return min(bound for bound, count in buckets.items() if count >= share * total)
