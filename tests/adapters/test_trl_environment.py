"""TRL's environment API over pivot envs: one env per rollout, reset to its row's pivot, driven by the real GRPOTrainer."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from echo_domain import EchoEnv, real_pivots  # noqa: E402  (the core tests' env over real NeMo-Gym pivot rows)
from test_trl import letter_env, tool_parsing_tokenizer  # noqa: E402  (has-letter env; SmolLM2 with a tool template)
from trl_cpu import cpu_grpo_trainer  # noqa: E402

from pivot_envs.adapters.trl import (  # noqa: E402
    PivotEnvironment,
    TRLInputError,
    environment_reward,
    pivot_environment_factory,
    to_dataset,
)
from pivot_envs.env import InfrastructureError  # noqa: E402


class BrokenRestoreEnv(EchoEnv):
    """Restoring pivot 2 fails (its sandbox or backend is down); every other pivot works."""

    def restore(self, pivot):
        if pivot.id.endswith("/2"):
            raise InfrastructureError("snapshot store down")


class BrokenBackendEnv(EchoEnv):
    def execute(self, pivot, action):
        if pivot.id.endswith("/3"):
            raise InfrastructureError("tool backend down")
        return super().execute(pivot, action)


def rows(pivots):
    return list(to_dataset(pivots))


def test_each_rollouts_environment_resets_to_its_rows_pivot_and_scores_its_own_completion():
    pivots = real_pivots()
    # the strict verifier: only the expert's action scores 1
    make = pivot_environment_factory(lambda: EchoEnv(pivots))
    row = rows(pivots)[4]
    group = [make(), make(), make()]
    for environment in group:
        # the prompt already holds the pivot: reset appends nothing to it
        assert environment.reset(**row) is None
    assert [e.pivot_id for e in group] == [pivots[4].id] * 3
    answer = pivots[4].expert["content"]
    got = environment_reward(
        completions=[[{"role": "assistant", "content": answer}], "something else", answer], environments=group
    )
    assert got == [1.0, 0.0, 1.0]


class ClosingEnv(EchoEnv):
    closed: list[str] = []

    def close(self):
        ClosingEnv.closed.append(self.pivot.id if self.pivot is not None else "")
        super().close()


def test_a_collected_environment_closes_its_env_as_trl_has_no_close_hook():
    import gc

    pivots = real_pivots()
    make = pivot_environment_factory(lambda: ClosingEnv(pivots))
    environment, unused = make(), make()
    environment.reset(**rows(pivots)[2])
    ClosingEnv.closed.clear()
    del environment, unused  # the unused one never built an env: nothing to close
    gc.collect()
    assert ClosingEnv.closed == [pivots[2].id]


def test_environments_built_by_env_id_score_the_registered_tool_use_domain():
    import gymnasium as gym

    import pivot_envs
    from pivot_envs.adapters.chat_template import prompt_messages

    gym.register_envs(pivot_envs)
    pivot = next(p for p in gym.make("pivot/tool-use-v0").unwrapped.pivots if p.expert.get("tool_calls"))
    make = pivot_environment_factory("pivot/tool-use-v0", pivots=[pivot])
    group = [make(), make()]
    for environment in group:
        environment.reset(**rows([pivot])[0])
    # the expert's turn as the model writes it: Hermes <tool_call> blocks
    expert_text = prompt_messages([pivot.expert], [])[0]["content"]
    assert environment_reward(completions=[expert_text, "no tool call"], environments=group) == [1.0, 0.0]


def test_a_failed_restore_or_a_failed_backend_scores_none_not_zero():
    pivots = real_pivots()
    make_restore = pivot_environment_factory(lambda: BrokenRestoreEnv(pivots))
    make_backend = pivot_environment_factory(lambda: BrokenBackendEnv(pivots))
    envs = [make_restore(), make_restore(), make_backend()]
    for environment, index in zip(envs, [1, 0, 2]):  # ids .../2, .../1, .../3
        environment.reset(**rows(pivots)[index])  # the broken restore does not raise into TRL's loop
    assert environment_reward(completions=["x", "x", "x"], environments=envs) == [None, 0.0, None]


def test_a_row_without_a_pivot_id_is_refused_naming_its_keys():
    make = pivot_environment_factory(lambda: EchoEnv(real_pivots()))
    with pytest.raises(TRLInputError, match=r"must carry a pivot_id .*got keys \['prompt'\]"):
        make().reset(prompt=[{"role": "user", "content": "hi"}])


def test_environment_reward_without_trls_environments_says_to_pass_the_factory():
    with pytest.raises(TRLInputError, match="environment_factory="):
        environment_reward(completions=["x"])


def test_the_environment_exposes_no_public_method_trl_would_turn_into_a_tool():
    import inspect

    public = [
        name
        for name, _ in inspect.getmembers(PivotEnvironment, predicate=inspect.isfunction)
        if not name.startswith("_")
    ]
    assert public == ["reset"]


@pytest.mark.slow
def test_trl_grpo_trainer_trains_through_the_environment_factory_and_logs_the_envs_rewards(tmp_path):
    from pivot_envs.adapters import smollm2

    torch.set_num_threads(2)
    model, _ = smollm2.load()
    tokenizer = tool_parsing_tokenizer()  # TRL's environment API needs a chat template that speaks tools
    pivots = real_pivots()[:4]
    made: list[PivotEnvironment] = []
    factory = pivot_environment_factory(letter_env)

    def counting_factory():
        made.append(factory())
        return made[-1]

    seen: list[tuple[list, list, list, list]] = []  # per step: completions, env pivots, row pivots, rewards

    def pivot_reward(completions, environments, pivot_id, **kwargs):
        rewards = environment_reward(completions=completions, environments=environments, **kwargs)
        seen.append((list(completions), [e.pivot_id for e in environments], list(pivot_id), rewards))
        return rewards

    trainer = cpu_grpo_trainer(
        model, tokenizer, pivot_reward, pivots, tmp_path, {"environment_factory": counting_factory}
    )
    trainer.train()

    logged = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    assert len(seen) == 2 and len(logged) == 2
    assert len(made) == 2  # TRL's probe plus one per rollout (a batch is one group of 2), reused across steps
    fresh = letter_env()
    for (completions, env_pivots, row_pivots, rewards), mean in zip(seen, logged):
        assert env_pivots == row_pivots  # each rollout's env was reset to its own row's pivot
        assert len(env_pivots) == 2 and env_pivots[0] == env_pivots[1]  # the group shares its pivot
        rescored = []
        for completion, pid in zip(completions, env_pivots):
            fresh.reset(options={"pivot": pid})
            rescored.append(fresh.step(completion[0]["content"])[1])
        assert rewards == rescored and set(rewards) <= {0.0, 1.0}
        assert mean == pytest.approx(sum(rescored) / len(rescored))
        assert not any(math.isnan(r) for r in rescored)
