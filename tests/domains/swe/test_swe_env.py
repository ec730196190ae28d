"""pivot/swe-v0: reset restores the repository at the pivot (built once, verified by its tree hash,
forked per sample); step runs one tool call and scores it."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest
from sandbox_fixtures import FAST_LIMITS
from swe_helpers import EXPERT_CALLS, FIX_NEW, FIX_OLD, calc_pivot, call_message

import pivot_envs
from pivot_envs.checker import check_pivot_env
from pivot_envs.domains.swe import SweEnv
from pivot_envs.errors import UnknownNameError

gym.register_envs(pivot_envs)
LIMITS = dataclasses.asdict(FAST_LIMITS) | {"timeout": 10.0}


def make_env(pivots, kind="bwrap", **kwargs) -> SweEnv:
    return SweEnv(pivots, sandbox=kind, limits=LIMITS, **kwargs)


def test_the_expert_call_scores_one_at_every_turn_under_every_verifier(calc_pivots, has_bwrap):
    env = make_env(calc_pivots)
    for name, level in SweEnv.verifiers.items():
        env.verifier = level()
        for pivot in calc_pivots:
            env.reset(options={"pivot": pivot.id})
            _, reward, _, _, info = env.step(pivot.expert)
            assert (reward, info["valid"], info["executed"]) == (1.0, True, True), (name, pivot.id, info)
    env.close()


def test_the_prefix_state_holds_the_experts_earlier_edit(calc_pivots, has_bwrap):
    env = make_env(calc_pivots)
    env.reset(options={"pivot": "calc-mean/t3"})  # after the str_replace
    _, _, _, _, info = env.step(
        call_message("bash", {"command": "grep -c 'len(values) + 1' calc/ops.py; git diff --stat"})
    )
    assert info["output"]["text"].startswith("0\n") and "calc/ops.py | 2 +-" in info["output"]["text"]
    env.close()


def test_g_resets_at_one_pivot_cost_one_build_and_each_sample_sees_the_prefix_state(calc_pivots, has_bwrap):
    env = make_env(calc_pivots)
    for _ in range(3):
        env.reset(options={"pivot": "calc-mean/t2"})
        _, reward, _, _, info = env.step(call_message("bash", {"command": "rm -rf /repo/calc && echo gone"}))
        assert reward == 0.0 and info["valid"]
    env.reset(options={"pivot": "calc-mean/t2"})
    _, reward, _, _, _ = env.step(env.pivot.expert)
    assert reward == 1.0
    assert (env.prefixes.builds, env.prefixes.starts) == (1, 1)
    env.close()


def test_a_recorded_tree_hash_that_differs_makes_the_pivot_stale_and_its_steps_invalid(calc_repo, has_bwrap):
    pivot = calc_pivot(calc_repo, 2, tree_hash="0" * 40)
    env = make_env([pivot])
    env.reset()
    _, reward, _, _, info = env.step(pivot.expert)
    assert (reward, info["valid"], info["category"]) == (0.0, False, "infrastructure_error")
    assert "stale" in info["detail"]
    env.close()


def test_the_recorded_tree_hash_of_the_rebuilt_prefix_is_accepted(calc_repo, has_bwrap):
    env = make_env([calc_pivot(calc_repo, 3)])
    env.reset()
    recorded = env._state.tree_hash
    env.close()
    env = make_env([calc_pivot(calc_repo, 3, tree_hash=recorded)])
    env.reset()
    _, reward, _, _, info = env.step(env.pivot.expert)
    # It failed once, under a loaded full run, with valid=False: the detail says why if it recurs.
    assert (reward, info["valid"]) == (1.0, True), (info.get("category"), info.get("detail"))
    env.close()


def test_the_fresh_harness_keeps_no_shell_state_between_calls_and_the_persistent_one_does(
    calc_repo, has_bwrap
):
    prefix_cd = [("bash", {"command": "cd calc && export MARK=1"})]
    for harness, expected in (("persistent", "/repo/calc 1"), ("fresh", "/repo ")):
        pivot = calc_pivot(calc_repo, 0, harness=harness)
        pivot = dataclasses.replace(
            pivot,
            messages=[
                *pivot.messages,
                call_message(*prefix_cd[0]),
                {"role": "tool", "tool_call_id": "call_0", "content": ""},
            ],
        )
        env = make_env([pivot])
        env.reset()
        _, _, _, _, info = env.step(call_message("bash", {"command": 'echo "$PWD $MARK"'}))
        assert expected in info["output"]["text"], (harness, info["output"])
        env.close()


def test_the_env_passes_gymnasiums_checker_and_the_pivot_checker(calc_pivots, kind):
    env = gym.make("pivot/swe-v0", pivots=calc_pivots[:2], sandbox=kind, limits=LIMITS).unwrapped

    def break_infrastructure(env: SweEnv) -> bool:
        env.sandbox.close()  # the fork is gone: the next step's sandbox fails
        return True

    report = check_pivot_env(env, pivots=[calc_pivots[1].id], break_infrastructure=break_infrastructure)
    assert report.ok and {"gymnasium_check_env", "infrastructure_failure_invalid"} <= set(report.passed), (
        report
    )
    env.close()


def test_an_unknown_sandbox_or_harness_is_refused_with_the_choices():
    with pytest.raises(UnknownNameError, match="harness 'openhands'"):
        SweEnv([], harness="openhands")
    with pytest.raises(UnknownNameError, match="sandbox 'podman'"):
        SweEnv([], sandbox="podman")


def test_an_equivalent_edit_on_docker_scores_one_like_on_bubblewrap(calc_pivots, has_docker):
    env = make_env(calc_pivots, kind="docker")
    env.reset(options={"pivot": "calc-mean/t2"})
    command = f"sed -i 's|{FIX_OLD.strip()}|{FIX_NEW.strip()}|' calc/ops.py"
    _, reward, _, _, info = env.step(call_message("bash", {"command": command}))
    assert (reward, info["category"]) == (1.0, "same_files"), info
    assert EXPERT_CALLS[2][0] == "str_replace_editor"
    env.close()
