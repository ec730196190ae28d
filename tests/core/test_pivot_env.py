"""PivotEnv's contract, on a minimal domain over real NeMo-Gym pivot rows."""

from __future__ import annotations

import gymnasium as gym
import pytest
from echo_domain import EchoEnv, real_pivots
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env

from pivot_envs import Pivot, PivotEnv
from pivot_envs.env import InfrastructureError, Outcome

ENV_ID = "pivot/echo-core-test-v0"
if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=EchoEnv)


@pytest.fixture
def env() -> EchoEnv:
    return EchoEnv()


def test_env_passes_gymnasium_check_env(env: EchoEnv) -> None:
    check_env(env, skip_render_check=True)


def test_reset_by_id_index_and_seed(env: EchoEnv) -> None:
    target = env.pivots[3]
    obs, info = env.reset(options={"pivot": target.id})
    assert info["pivot_id"] == target.id and env.unwrapped.pivot is target
    assert obs == {"messages": target.messages, "tools": target.tools}
    _, info = env.reset(options={"index": 1})
    assert info["pivot_id"] == env.pivots[1].id
    with pytest.raises(KeyError, match="no-such-pivot"):
        env.reset(options={"pivot": "no-such-pivot"})
    with pytest.raises(IndexError, match="out of range"):
        env.reset(options={"index": 99})


def test_two_envs_reset_with_the_same_seed_pick_the_same_pivots() -> None:
    first, second = EchoEnv(), EchoEnv()
    drawn_first = [first.reset(seed=7)[1]["pivot_id"]] + [first.reset()[1]["pivot_id"] for _ in range(10)]
    drawn_second = [second.reset(seed=7)[1]["pivot_id"]] + [second.reset()[1]["pivot_id"] for _ in range(10)]
    assert drawn_first == drawn_second
    assert len(set(drawn_first)) > 1  # the draw is random, not constant


def test_expert_action_scores_one_and_other_text_scores_zero(env: EchoEnv) -> None:
    for pivot in env.pivots:
        env.reset(options={"pivot": pivot.id})
        obs, reward, terminated, truncated, info = env.step(pivot.expert)
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info["valid"] and info["category"] == "exact_match" and info["strict_reward"] == 1.0
        assert obs["messages"][: len(pivot.messages)] == pivot.messages
        env.reset(options={"pivot": pivot.id})
        _, reward, _, _, info = env.step("I cannot help with that.")
        assert reward == 0.0 and info["category"] == "not_exact_match"
        assert info["parsed"] == {"role": "assistant", "content": "I cannot help with that."}


def test_step_requires_reset_and_episodes_last_one_step(env: EchoEnv) -> None:
    with pytest.raises(ResetNeeded):
        env.step("hi")
    env.reset(seed=0)
    env.step("hi")
    with pytest.raises(ResetNeeded):
        env.step("again")


def test_an_action_of_the_wrong_type_is_unparseable_not_an_exception(env: EchoEnv) -> None:
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(12345)
    assert reward == 0.0 and terminated and info["category"] == "unparseable" and info["valid"]


def test_infrastructure_failure_is_invalid_not_reward_zero() -> None:
    class BrokenBackendEnv(EchoEnv):
        def execute(self, pivot: Pivot, action: dict) -> Outcome:
            raise InfrastructureError("backend unreachable")

    env = BrokenBackendEnv()
    pivot = env.pivots[0]
    env.reset(options={"pivot": pivot.id})
    _, reward, _, _, info = env.step(pivot.expert)
    assert info["valid"] is False and info["category"] == "infrastructure_error"
    assert "backend unreachable" in info["detail"]


def test_unknown_verifier_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown EchoEnv verifier 'fuzzy' \(choose from strict\)"):
        EchoEnv(verifier="fuzzy")


def test_pivots_are_records_with_their_jsonl_form(env: EchoEnv) -> None:
    for pivot in env.unwrapped.pivots:
        assert Pivot.from_dict(pivot.to_dict()) == pivot


def test_write_pivots_with_swapped_arguments_says_so(tmp_path) -> None:
    from pivot_envs import write_pivots

    with pytest.raises(TypeError, match="swapped"):
        write_pivots(tmp_path / "p.jsonl", real_pivots()[:1])
    assert not (tmp_path / "p.jsonl").exists()


def test_an_empty_pivot_set_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        EchoEnv(pivots=[])


def test_pivots_load_from_a_file(tmp_path) -> None:
    from pivot_envs import write_pivots

    path = tmp_path / "p.jsonl"
    write_pivots(real_pivots()[:2], path)
    env = EchoEnv(pivots=path)
    assert [p.id for p in env.pivots] == [p.id for p in real_pivots()[:2]]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_steps_a_batch_of_pivots(mode: str) -> None:
    envs = gym.make_vec(ENV_ID, num_envs=3, vectorization_mode=mode)
    try:
        observations, infos = envs.reset(seed=3)
        assert len(observations) == 3 and all("messages" in o for o in observations)
        pivots = {p.id: p for p in real_pivots()}
        actions = [pivots[pid].expert for pid in infos["pivot_id"][:2]] + ["wrong"]
        observations, rewards, terminated, truncated, infos = envs.step(actions)
        assert list(rewards) == [1.0, 1.0, 0.0]
        assert all(terminated) and not any(truncated)
        assert list(infos["category"]) == ["exact_match", "exact_match", "not_exact_match"]
        assert observations[2]["messages"][-1] == {"role": "assistant", "content": "wrong"}
    finally:
        envs.close()


def test_render_ansi_shows_the_pivot_and_the_verdict() -> None:
    env = EchoEnv(render_mode="ansi")
    env.reset(options={"index": 0})
    env.step("nope")
    text = env.render()
    assert env.pivots[0].id in text and "reward 0.0 (not_exact_match)" in text


def test_base_env_has_no_bundled_pivots() -> None:
    with pytest.raises(ValueError, match="pass pivots=PATH"):
        PivotEnv()
