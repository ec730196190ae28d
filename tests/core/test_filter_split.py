"""D_adv filtering (paper Eq. 5), near-duplicate removal and the split by trajectory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivot_envs.extract import dedup_pivots, filter_pivots, split_by_trajectory
from pivot_envs.formats import read_trajectories
from pivot_envs.pivot import Pivot, Profile, read_pivots, write_pivots


def _pivot(
    pid: str,
    rewards: list[float] | None = None,
    valid: list[bool] | None = None,
    command: str = "ls",
    prefix: str = "q",
) -> Pivot:
    call = {
        "id": "c0",
        "type": "function",
        "function": {"name": "terminal", "arguments": json.dumps({"command": command})},
    }
    return Pivot(
        id=pid,
        domain="terminal",
        messages=[{"role": "user", "content": prefix}],
        expert={"role": "assistant", "content": None, "tool_calls": [call]},
        source={"trajectory": pid.rsplit("/t", 1)[0], "turn": int(pid.rsplit("/t", 1)[1])},
        profile=None if rewards is None else Profile.from_samples(rewards, valid=valid),
    )


def test_adv_keeps_mixed_outcome_pivots_below_lambda_diff() -> None:
    pivots = [
        _pivot("a/t0", [1, 0, 0, 0]),  # mean 0.25, var > 0: kept
        _pivot("a/t1", [1, 1, 1, 1]),  # uniformly solved: var 0
        _pivot("a/t2", [0, 0, 0, 0]),  # uniformly failed: var 0
        _pivot("a/t3", [1, 1, 1, 0]),  # mean 0.75 >= 0.6: too easy
        _pivot("a/t4", [1, 1, 0, 0]),  # mean 0.5: kept
        _pivot("a/t5", [1, 1, 1, 0, 0]),  # mean exactly 0.6: not < lambda_diff
        _pivot("a/t6", [1, 0, 1, 0], valid=[True, False, True, False]),  # valid samples all 1: var 0
    ]
    assert [p.id for p in filter_pivots(pivots, lambda_diff=0.6)] == ["a/t0", "a/t4"]
    assert [p.id for p in filter_pivots(pivots, lambda_diff=0.8)] == ["a/t0", "a/t3", "a/t4", "a/t5"]
    assert [p.id for p in filter_pivots(pivots, lambda_diff=0.3)] == ["a/t0"]


def test_cand_mode_keeps_every_candidate_profiled_or_not() -> None:
    pivots = [_pivot("a/t0"), _pivot("a/t1", [1, 1])]
    assert filter_pivots(pivots, mode="cand") == pivots


def test_adv_mode_names_the_pivot_without_a_profile() -> None:
    with pytest.raises(ValueError, match="pivot b/t1 has no profile"):
        filter_pivots([_pivot("b/t0", [1, 0]), _pivot("b/t1")])
    with pytest.raises(ValueError, match="unknown filter mode 'best'"):
        filter_pivots([], mode="best")


def test_dedup_by_action_drops_commands_differing_only_in_whitespace_and_keeps_the_first() -> None:
    pivots = [
        _pivot("a/t0", command="ls -la /app"),
        _pivot("b/t0", command="ls   -la  /app ", prefix="other task"),
        _pivot("a/t1", command="ls -la /tmp"),
        _pivot("c/t0", command="LS -la /app"),  # case matters in shells
    ]
    assert [p.id for p in dedup_pivots(pivots)] == ["a/t0", "a/t1", "c/t0"]


def test_dedup_by_state_needs_the_same_prefix_too() -> None:
    pivots = [
        _pivot("a/t0", command="make"),
        _pivot("b/t0", command="make", prefix="other task"),
        _pivot("a2/t0", command=" make", prefix="q"),
    ]
    assert [p.id for p in dedup_pivots(pivots, by="state")] == ["a/t0", "b/t0"]
    assert [p.id for p in dedup_pivots(pivots, by="action")] == ["a/t0"]


def test_dedup_compares_arguments_as_json_not_as_strings() -> None:
    first, second = _pivot("a/t0"), _pivot("b/t0")
    first.expert["tool_calls"][0]["function"]["arguments"] = '{"path": "/a", "limit": 5}'
    second.expert["tool_calls"][0]["function"]["arguments"] = '{"limit":5,"path":"/a"}'
    assert dedup_pivots([first, second]) == [first]


@pytest.fixture(scope="module")
def tau_pivots(shared_data: Path) -> list[Pivot]:
    """One light pivot per assistant turn of the 100 tau-bench episodes (the split only needs ids)."""
    trajectories = read_trajectories(shared_data / "tau_bench" / "airline" / "gpt4o_trajectories.json")
    return [
        Pivot(
            f"{t.id}/t{k}",
            "tool-use",
            [],
            {"role": "assistant", "content": "x"},
            source={"trajectory": t.id, "turn": k},
        )
        for t in trajectories
        for k in range(t.assistant_turns)
    ]


def test_split_never_puts_one_trajectory_on_both_sides(tau_pivots: list[Pivot]) -> None:
    train, heldout = split_by_trajectory(tau_pivots, 0.2, seed=0)
    assert len(train) + len(heldout) == len(tau_pivots)
    train_ids = {p.trajectory_id for p in train}
    heldout_ids = {p.trajectory_id for p in heldout}
    assert train_ids and heldout_ids and not train_ids & heldout_ids
    assert 8 <= len(heldout_ids) <= 35  # about 20 of the 100 episodes


def test_split_is_deterministic_order_free_and_seeded(tau_pivots: list[Pivot]) -> None:
    _, heldout = split_by_trajectory(tau_pivots, 0.2, seed=0)
    _, again = split_by_trajectory(list(reversed(tau_pivots)), 0.2, seed=0)
    assert {p.id for p in heldout} == {p.id for p in again}
    _, other = split_by_trajectory(tau_pivots, 0.2, seed=1)
    assert {p.trajectory_id for p in heldout} != {p.trajectory_id for p in other}


def test_split_edges_and_bad_fraction(tau_pivots: list[Pivot]) -> None:
    assert split_by_trajectory(tau_pivots, 0.0) == (tau_pivots, [])
    assert split_by_trajectory(tau_pivots, 1.0) == ([], tau_pivots)
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_by_trajectory(tau_pivots, 1.5)


def test_both_sides_of_a_split_are_written_and_read_back_whole(
    tau_pivots: list[Pivot], tmp_path: Path
) -> None:
    train, heldout = split_by_trajectory(tau_pivots, 0.2, seed=0)
    assert write_pivots(iter(train), tmp_path / "split" / "train.jsonl", desc="writing train") == len(train)
    # records already in their JSON form are written as they are
    assert write_pivots([p.to_dict() for p in heldout], tmp_path / "split" / "heldout.jsonl") == len(heldout)
    assert [p.to_dict() for p in read_pivots(tmp_path / "split" / "train.jsonl")] == [
        p.to_dict() for p in train
    ]
    assert [p.to_dict() for p in read_pivots(tmp_path / "split" / "heldout.jsonl")] == [
        p.to_dict() for p in heldout
    ]
    with pytest.raises(TypeError, match="arguments are swapped"):
        write_pivots(tmp_path / "x.jsonl", train)  # type: ignore[arg-type]
