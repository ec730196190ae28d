"""Line 4's filter modes: D_adv, its fallback to the unsolved candidates when empty, and typed errors."""

from __future__ import annotations

import pytest

from pivot_envs.errors import PivotSetError, UnknownNameError
from pivot_envs.extract import FilterConfig, filter_pivots
from pivot_envs.pivot import Pivot, Profile


def _pivot(pid: str, rewards: list[float] | None) -> Pivot:
    return Pivot(
        pid,
        "tool-use",
        [{"role": "user", "content": "hi"}],
        {"role": "assistant", "content": "hello"},
        profile=None if rewards is None else Profile.from_samples(rewards),
    )


def test_adv_or_unsolved_is_d_adv_whenever_d_adv_holds_a_pivot() -> None:
    pivots = [_pivot("a/t0", [1, 0, 0, 0]), _pivot("a/t1", [0, 0, 0, 0]), _pivot("a/t2", [1, 1, 1, 1])]
    assert [p.id for p in filter_pivots(pivots, 0.6, mode="adv-or-unsolved")] == ["a/t0"]
    assert filter_pivots(pivots, 0.6, mode="adv-or-unsolved") == filter_pivots(pivots, 0.6, mode="adv")


def test_adv_or_unsolved_falls_back_to_the_candidates_below_lambda_diff_when_d_adv_is_empty() -> None:
    # No candidate is mixed: D_adv is empty; the never-solved ones are kept, the always-solved one is not.
    pivots = [_pivot("a/t0", [0, 0, 0, 0]), _pivot("a/t1", [1, 1, 1, 1]), _pivot("a/t2", [0, 0, 0, 0])]
    assert filter_pivots(pivots, 0.6, mode="adv") == []
    assert [p.id for p in filter_pivots(pivots, 0.6, mode="adv-or-unsolved")] == ["a/t0", "a/t2"]
    # Everything solved: nothing to fall back to.
    assert filter_pivots([_pivot("b/t0", [1, 1])], 0.6, mode="adv-or-unsolved") == []


def test_a_pivot_without_a_profile_is_a_pivot_set_error_in_every_mode_that_reads_profiles() -> None:
    pivots = [_pivot("a/t0", [1, 0]), _pivot("a/t1", None)]
    for mode in ("adv", "adv-or-unsolved"):
        with pytest.raises(PivotSetError, match="pivot a/t1 has no profile"):
            filter_pivots(pivots, mode=mode)
    assert filter_pivots(pivots, mode="cand") == pivots


def test_an_unknown_mode_suggests_the_nearest_one() -> None:
    with pytest.raises(
        UnknownNameError, match="unknown filter mode 'adv-or-unsolve'; did you mean 'adv-or-unsolved'"
    ):
        filter_pivots([], mode="adv-or-unsolve")
    assert FilterConfig(mode="adv-or-unsolved").mode == "adv-or-unsolved"
