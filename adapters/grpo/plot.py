"""The reward curve of a run: reward mean +- std per step from metrics.jsonl, as a PNG (the `plot` extra)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pivot_envs.errors import MissingExtraError, PivotEnvsError


class NoMetricsError(PivotEnvsError, ValueError):
    """A metrics file with no step recorded in it: nothing to plot."""


def plot_metrics(metrics_jsonl: str | os.PathLike, png: str | os.PathLike) -> Path:
    """Plot reward mean +- std per step (and the held-out turn accuracy when logged) to a PNG.

    Raises MissingExtraError (the `plot` extra) when matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError("plotting the training rewards", "matplotlib", "plot") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in Path(metrics_jsonl).read_text().splitlines() if line.strip()]
    if not records:
        raise NoMetricsError(f"{metrics_jsonl}: no metrics to plot")
    steps = [r["step"] for r in records]
    mean = [r["reward_mean"] for r in records]
    std = [r["reward_std"] for r in records]
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, mean, label="reward mean")
    axis.fill_between(
        steps,
        [m - s for m, s in zip(mean, std)],
        [m + s for m, s in zip(mean, std)],
        alpha=0.25,
        label="+- std",
    )
    evaluated = [r for r in records if "eval_turn_accuracy" in r]
    if evaluated:
        axis.plot(
            [r["step"] for r in evaluated],
            [r["eval_turn_accuracy"] for r in evaluated],
            "o-",
            label="held-out turn accuracy",
        )
    axis.set_xlabel("step")
    axis.set_ylabel("reward")
    axis.legend()
    figure.tight_layout()
    figure.savefig(png)
    plt.close(figure)
    return Path(png)
