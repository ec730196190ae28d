"""The method on real parts only: SmolLM2, the SFT warm-up, profiling, the D_adv filter and GRPO
steps, every reward from the tool-use domain's own functional verifier (no toy verifier).

SmolLM2 as it ships never makes a correct airline tool call; after a short warm-up on two
pivots' expert turns its sampled calls are sometimes right and sometimes wrong, which is the
situation PivotRL is for: profiling finds the mixed pivots, and GRPO gets groups with reward
variance to learn from.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")

from tiny_model import tiny_config  # noqa: E402

from pivot_envs.adapters.grpo import train  # noqa: E402
from pivot_envs.adapters.sft import SFTConfig, warm_up  # noqa: E402
from pivot_envs.extract import filter_pivots  # noqa: E402
from pivot_envs.pivot import read_pivots  # noqa: E402
from pivot_envs.policy import SamplingParams, load_policy  # noqa: E402
from pivot_envs.profile import ProfileConfig, profile  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pivots():
    env = gym.make("pivot/tool-use-v0")
    try:
        calls = [p for p in env.unwrapped.pivots if p.expert.get("tool_calls")]
        # two short calls of different tools
        calls.sort(key=lambda p: len(json.dumps(p.expert["tool_calls"])))
        chosen, tools = [], set()
        for pivot in calls:
            name = pivot.expert["tool_calls"][0]["function"]["name"]
            if name not in tools:
                chosen.append(pivot)
                tools.add(name)
            if len(chosen) == 2:
                return chosen
    finally:
        env.close()
    raise AssertionError("the bundled tool-use pivots hold fewer than two tools")


def test_warm_up_profile_filter_and_grpo_with_the_real_verifier(pivots, tmp_path):
    torch.set_num_threads(1)  # the test machine's cores are shared: one thread is much faster there
    torch.manual_seed(0)
    policy = load_policy("hf:smollm2", device="cpu", max_prompt_tokens=256)
    env = gym.make("pivot/tool-use-v0", pivots=pivots)
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=48)

        def greedy_rewards() -> list[float]:
            rewards = []
            for pivot, group in zip(pivots, policy.generate([p.observation for p in pivots], 1, greedy)):
                env.reset(options={"pivot": pivot.id})
                rewards.append(env.step(group[0].action)[1])
            return rewards

        assert greedy_rewards() == [0.0, 0.0]  # the model as it ships

        records = warm_up(
            policy, pivots, SFTConfig(epochs=3, batch_size=2, learning_rate=1e-4, progress=False)
        )
        assert records[-1]["loss"] < records[0]["loss"] / 2

        run = profile(
            pivots,
            policy,
            tmp_path / "profiled.jsonl",
            ProfileConfig(k=8, max_new_tokens=48, seed=0, batch_pivots=2, env_workers=1, progress=False),
        )
        assert run.profiled == 2
        profiled = read_pivots(tmp_path / "profiled.jsonl")
        successes = sum(sum(p.profile.rewards) for p in profiled)
        assert 0 < successes < 16, [p.profile for p in profiled]  # the warmed-up model succeeds sometimes
        kept = filter_pivots(profiled, lambda_diff=0.95)
        assert kept and all(0 < p.profile.mean < 0.95 for p in kept)

        result = train(
            tiny_config(
                tmp_path / "train",
                batch_pivots=len(kept),
                group_size=8,
                max_new_tokens=48,
                learning_rate=1e-5,
                steps=2,
                checkpoint_every=0,
                num_envs=1,
                seed=0,
            ),
            kept,
            policy=policy,
        )
        history = result.history
        assert all(0 < r["reward_mean"] < 1 for r in history), history
        assert sum(r["groups_trained"] for r in history) > 0  # groups with reward variance got updates
        assert all(r["frac_invalid"] == 0 for r in history)
    finally:
        env.close()
