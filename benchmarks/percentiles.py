"""Helpers the latency benchmarks share."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values` by the nearest rank: a value that was measured, never interpolated."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
