"""Reading the daemon's Prometheus histograms the way Prometheus does."""

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
