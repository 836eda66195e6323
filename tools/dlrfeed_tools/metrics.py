"""Quantiles of measurements: of the values themselves, and of the daemon's Prometheus
histograms the way Prometheus reads them."""

from collections.abc import Sequence


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' `histogram_quantile(q, buckets)` over cumulative (upper bound, count) pairs
    sorted with +Inf last: linear within the bucket holding the q-th observation, the largest
    finite bound when that bucket is +Inf, and None when nothing was observed."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def histogram_window(
    now: Sequence[tuple[float, float]], before: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The bucket counts observed between two scrapes of the same histogram (all of `now` when
    the buckets differ, as after a restart)."""
    if len(now) != len(before):
        return list(now)
    return [(b, c - c0) for (b, c), (_, c0) in zip(now, before, strict=True)]


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of already sorted values: the one at rank q·n (0 when there are none)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
