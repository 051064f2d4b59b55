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


def added_per_event(with_berth: float, without: float) -> float | None:
    """Seconds each event takes more with Berth than without, from the two rates: what a
    ratio hides when the rows' baselines differ (the same added time is a lower ratio
    against a faster baseline). None when a side has no rate."""
    if with_berth <= 0 or without <= 0:
        return None
    return 1 / with_berth - 1 / without


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


def paired_ratios(batches: Sequence[tuple[bool, float]]) -> list[float]:
    """The with/without ratio of each pair of consecutive batches (`(with_berth, rate)`
    in the order run, each pair one of each side, in either order): one ratio per trial,
    measured moments apart, so that the spread of the ratios shows the noise of the run."""
    if len(batches) % 2:
        raise ValueError("an odd number of batches makes no pairs")
    ratios = []
    for first, second in zip(batches[::2], batches[1::2], strict=True):
        if first[0] == second[0]:
            raise ValueError("a pair of batches must have one batch of each side")
        with_rate, without_rate = (first[1], second[1]) if first[0] else (second[1], first[1])
        if without_rate > 0:
            ratios.append(with_rate / without_rate)
    return ratios


def spread(ratios: Sequence[float]) -> str:
    """`n pairs: ratios a to b` (or the one ratio), for the n column beside their median."""
    if not ratios:
        return "no pair measured"
    if len(ratios) == 1:
        return f"1 pair: ratio {ratios[0]:.2f}"
    return f"{len(ratios)} pairs: ratios {min(ratios):.2f} to {max(ratios):.2f}"
