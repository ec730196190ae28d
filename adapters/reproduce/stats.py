"""The statistics of `pivotrl reproduce`: intervals, the verdict rule, and the power of a held-out set.

Every claim's verdict is decided by one 95% interval and the paper's direction: "reproduced"
when the interval lies wholly on the paper's side of the threshold (0 for a difference),
"not reproduced" when it lies wholly on the other side, "inconclusive" when it holds the
threshold. Differences between training arms are paired by held-out item and resampled
hierarchically (seeds, then items), so both the seed-to-seed and the item-to-item variation
widen the interval.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

from pivot_envs.evaluate import wilson_interval

VERDICTS = ("reproduced", "not reproduced", "inconclusive")
Z_95 = 1.959963984540054  # two-sided 5%
Z_80 = 0.8416212335729143  # 80% power
RESAMPLES = 2000


def verdict(low: float, high: float, direction: int = 1, threshold: float = 0.0) -> str:
    """The verdict of a claim from its 95% interval [low, high]: "reproduced" when the interval lies
    wholly on the paper's side of `threshold` (above it for direction +1, below for -1), "not
    reproduced" when wholly on the other side, else "inconclusive"."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    if low > high:
        raise ValueError(f"interval [{low}, {high}]: low is above high")
    above, below = low > threshold, high < threshold
    if above or below:
        return "reproduced" if (above if direction == 1 else below) else "not reproduced"
    return "inconclusive"


def wilson(successes: int, n: int) -> dict[str, float]:
    """A rate with its 95% Wilson interval: {"estimate", "low", "high", "n"}."""
    low, high = wilson_interval(successes, n)
    return {"estimate": successes / n if n else 0.0, "low": low, "high": high, "n": n}


def minimum_detectable_difference(n: int, p: float = 0.5) -> float:
    """The smallest difference of two accuracies measured on n items each that a two-sided 5% test
    detects with 80% power, at accuracy p (0.5 is the worst case). Paired arms on the same items
    do better; this is the conservative figure the report states."""
    if n <= 0:
        return 1.0
    return (Z_95 + Z_80) * math.sqrt(2 * p * (1 - p) / n)


def observed_mdd(low: float, high: float) -> float:
    """The smallest difference the design that produced the 95% interval [low, high] detects (two-sided 5%,
    80% power), from that interval's own spread: (z_0.975 + z_0.8) x its standard error, the error read as the
    half-width over z_0.975. For arms paired by seed and item this is the design's real power (pairing removes
    the items' shared difficulty); it is estimated from the same data, so it is a guide, not a guarantee."""
    if high < low:
        raise ValueError(f"interval [{low}, {high}]: low is above high")
    return (Z_95 + Z_80) * (high - low) / (2 * Z_95)


def seeds_for_mdd(
    differences: Sequence[Sequence[float | None]],
    target: float = 0.10,
    observed: float | None = None,
    limit: int = 1000,
) -> int | None:
    """How many seeds a paired comparison needs for its paired MDD to reach `target`, projected from its
    seeds x items table of differences (None: no value) by a two-way variance decomposition.

    The table's variance splits into the seeds' (how much a whole seed's difference moves: shrinks with more
    seeds), the items' (how much the arms' difference depends on the item: a floor only more held-out items
    lower) and their interaction (shrinks with either). With S seeds and I items the mean's variance is
    seed/S + item/I + residual/(S I); the MDD is (z_0.975 + z_0.8) times its square root. Given `observed`
    (the paired MDD of the bootstrap interval), the projection keeps its ratio to the model's MDD at the
    table's own seeds. Returns the number of seeds (the table's own when it already reaches the target),
    or None when it cannot say: fewer than 2 seeds or items with values, or a target no number of seeds up to
    `limit` reaches (the items' floor is above it: more held-out items are needed).
    It assumes new seeds vary as the measured ones did: a guide for planning, not a guarantee."""
    rows = [list(row) for row in differences if any(v is not None for v in row)]
    width = max((len(row) for row in rows), default=0)
    cells = [(s, i, v) for s, row in enumerate(rows) for i, v in enumerate(row) if v is not None]
    columns = [i for i in range(width) if any(i < len(row) and row[i] is not None for row in rows)]
    seeds, items = len(rows), len(columns)
    if seeds < 2 or items < 2:
        return None
    grand = sum(v for _, _, v in cells) / len(cells)
    seed_mean = [_nanmean(row) for row in rows]
    item_mean = {i: _nanmean([row[i] if i < len(row) else None for row in rows]) for i in columns}
    residual_sum = sum((v - seed_mean[s] - item_mean[i] + grand) ** 2 for s, i, v in cells)
    residual = residual_sum / max(len(cells) - seeds - items + 1, 1)
    # every row and column kept has a value, so no mean is None
    seed_var = max(statistics.variance(seed_mean) - residual / items, 0.0)
    item_var = max(statistics.variance(item_mean.values()) - residual / seeds, 0.0)

    def model_mdd(n: int) -> float:
        return (Z_95 + Z_80) * math.sqrt(seed_var / n + item_var / items + residual / (n * items))

    scale = observed / model_mdd(seeds) if observed and model_mdd(seeds) > 0 else 1.0
    for n in range(seeds, limit + 1):
        if scale * model_mdd(n) <= target:
            return n
    return None


def _nanmean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return sum(kept) / len(kept) if kept else None


def bootstrap_mean(
    table: Sequence[Sequence[float | None]], resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, float]:
    """The mean of a seeds x items table (None: an item without a value in that seed) with a 95%
    percentile interval, resampling seeds and then items with replacement.

    For a difference between arms, pass the table of per-item differences (arm A minus arm B at
    the same item and seed): the interval is then paired. Returns {"estimate", "low", "high", "n"}
    where n is the number of items; an empty table gives (0, -1, 1), an interval holding 0."""
    rows = [list(row) for row in table if any(v is not None for v in row)]
    flat = [v for row in rows for v in row if v is not None]
    if not flat:
        return {"estimate": 0.0, "low": -1.0, "high": 1.0, "n": 0}
    estimate = sum(flat) / len(flat)
    width = max(len(row) for row in rows)
    draw = random.Random(seed)
    means = []
    for _ in range(resamples):
        chosen = [rows[draw.randrange(len(rows))] for _ in rows]
        items = [draw.randrange(width) for _ in range(width)]
        value = _nanmean([row[i] if i < len(row) else None for row in chosen for i in items])
        if value is not None:
            means.append(value)
    means.sort()
    low = means[int(0.025 * (len(means) - 1))]
    high = means[int(math.ceil(0.975 * (len(means) - 1)))]
    return {"estimate": estimate, "low": min(low, estimate), "high": max(high, estimate), "n": width}


def paired_differences(
    a: Sequence[Sequence[float | None]], b: Sequence[Sequence[float | None]]
) -> list[list[float | None]]:
    """Per seed and item, a - b (None where either is missing); b may have one row, used for every seed of a
    (a deterministic baseline such as the base model's greedy accuracy)."""
    out = []
    for index, row in enumerate(a):
        other = b[index] if len(b) > 1 else b[0]
        out.append([x - y if x is not None and y is not None else None for x, y in zip(row, other)])
    return out


# -- the pre-registered analysis (docs/preregistration.md) ---------------------------------------------------

PREREG_RESAMPLES = 10_000
SMALLEST_EFFECT = 0.05  # 5 accuracy points: the paper's in-domain gain over SFT on tau2-bench is 5.4
READINGS = ("better", "worse", "no effect of 5 points or more", "inconclusive")


def crossed_bootstrap(
    table: Sequence[Sequence[float | None]], resamples: int = PREREG_RESAMPLES, seed: int = 0
) -> dict[str, Any]:
    """The mean of a seeds x items table (None: no value) with the item-random crossed bootstrap: seeds and items
    resampled independently with replacement, `resamples` times. Returns the estimate, the 95% and 90% percentile
    intervals, a two-sided p-value from the same draws (twice the smaller share on either side of 0; at least
    1/resamples), and the item-fixed 95% interval (the seeds' own means resampled over seeds only)."""
    import numpy as np

    rows = [list(row) for row in table if any(v is not None for v in row)]
    if not rows:
        raise ValueError("an empty table has no mean")
    width = max(len(row) for row in rows)
    values = np.full((len(rows), width), np.nan)
    for s, row in enumerate(rows):
        for i, v in enumerate(row):
            if v is not None:
                values[s, i] = v
    estimate = float(np.nanmean(values))
    rng = np.random.default_rng(seed)
    draws = np.empty(resamples)
    for r in range(resamples):
        picked = values[rng.integers(len(rows), size=len(rows))][:, rng.integers(width, size=width)]
        draws[r] = np.nan if np.isnan(picked).all() else np.nanmean(picked)
    draws = draws[~np.isnan(draws)]
    seed_means = np.nanmean(values, axis=1)
    fixed = seed_means[rng.integers(len(rows), size=(resamples, len(rows)))].mean(axis=1)
    p = min(1.0, 2 * min(float((draws <= 0).mean()), float((draws >= 0).mean())))
    return {
        "estimate": estimate,
        "low": float(np.quantile(draws, 0.025)),
        "high": float(np.quantile(draws, 0.975)),
        "low90": float(np.quantile(draws, 0.05)),
        "high90": float(np.quantile(draws, 0.95)),
        "p": max(p, 1.0 / resamples),
        "item_fixed": {"low": float(np.quantile(fixed, 0.025)), "high": float(np.quantile(fixed, 0.975))},
        "n_seeds": len(rows),
        "n_items": width,
    }


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (each at most 1, never below an earlier one's in
    the sorted order)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [0.0] * len(pvalues)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


def reading(
    figure: dict[str, Any], adjusted_p: float, alpha: float = 0.05, margin: float = SMALLEST_EFFECT
) -> str:
    """The pre-registered reading of a difference: "better" or "worse" when the Holm-adjusted p is below `alpha`
    and the 95% interval lies on that side of 0; "no effect of 5 points or more" when the 90% interval (two
    one-sided tests at 5%) lies within (-margin, +margin); else "inconclusive"."""
    if adjusted_p < alpha and figure["low"] > 0:
        return "better"
    if adjusted_p < alpha and figure["high"] < 0:
        return "worse"
    if -margin < figure["low90"] and figure["high90"] < margin:
        return "no effect of 5 points or more"
    return "inconclusive"
