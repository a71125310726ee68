"""Summary statistics of timing samples: median and 95th percentile, in milliseconds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

__all__ = ["Summary", "percentile", "summarize"]


class Summary(TypedDict):
    """One operation's timings: ``p50_ms``/``p95_ms`` in milliseconds over ``n`` samples."""

    p50_ms: float
    p95_ms: float
    n: int


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default), so p50 of an even count is the mean of the middle two.

    :raises ValueError: no values, or ``q`` outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be 0..100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples_ms: Sequence[float]) -> Summary:
    """p50, p95 (rounded to 0.1 ms) and the count. :raises ValueError: no samples."""
    return Summary(
        p50_ms=round(percentile(samples_ms, 50), 1),
        p95_ms=round(percentile(samples_ms, 95), 1),
        n=len(samples_ms),
    )
