"""What Algorithm 1 returns: the selection of lines 1-4 (`Selection`), the GRPO run of lines 5-14
(`TrainResult`), both (`PivotRLResult`); and `NoPivotsError` when line 4 keeps nothing to train at."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError
from pivot_envs.extract import FilterConfig
from pivot_envs.pivot import Pivot
from pivot_envs.profile import ProfileRun


@dataclass
class TrainResult:
    """What `train` leaves behind: where, how far, and the metrics of every step."""

    out: Path
    steps: int
    final: Path
    metrics_path: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0  # wall time of this call, setup and final checkpoint included


@dataclass
class Selection:
    """What lines 1-4 made: D_cand, its profiles under pi_0, and D_pivot (the pivots `train` samples from)."""

    candidates: list[Pivot]
    profiled: list[Pivot]
    pivots: list[Pivot]
    profile_run: ProfileRun


@dataclass
class PivotRLResult:
    """A whole run of Algorithm 1: the pivots selected (lines 1-4) and the GRPO run at them (lines 5-14)."""

    selection: Selection
    training: TrainResult


class NoPivotsError(PivotEnvsError, ValueError):
    """No pivot to train at: `train` was given none, or line 4 kept none (every profiled candidate was
    uniformly solved, uniformly failed or too easy)."""

    @classmethod
    def of(cls, profiled: int, k: int, mixed: int, filtering: FilterConfig) -> NoPivotsError:
        """The error with the profiles' figures: `profiled` candidates at K=`k`, `mixed` with var > 0."""
        lambda_diff = filtering.lambda_diff
        if filtering.mode == "adv":
            why = (
                f"{mixed} had mixed rewards (var > 0) and none of them a mean below lambda_diff={lambda_diff}"
            )
        else:  # adv-or-unsolved: not even the fallback holds a candidate
            why = f"none had a mean below lambda_diff={lambda_diff} (D_adv and the fallback of {filtering.mode} are empty)"
        return cls(
            f"no pivot to train on: of {profiled} profiled candidates (K={k}), {why}; raise K or "
            "lambda_diff, or start from a stronger reference policy"
        )
