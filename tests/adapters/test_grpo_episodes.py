"""E2E RL (adapters/grpo/episodes.py): GRPO on whole terminal episodes, with its rollout turns counted."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
from sandbox_fixtures import has_bwrap, rootfs  # noqa: F401 (fixtures: a real bubblewrap sandbox)

torch = pytest.importorskip("torch")

from tiny_model import tiny_config  # noqa: E402

from pivot_envs.adapters.grpo.episodes import (  # noqa: E402
    Episode,
    EpisodeConfig,
    episode_envs,
    episode_groups,
    rollout,
    train_episodes,
)
from pivot_envs.errors import UnknownNameError  # noqa: E402
from pivot_envs.policy import Completion, SamplingParams, load_policy  # noqa: E402

# Two tasks whose instruction spells out the command: the 135M model copies it in some samples, not in others.
TASKS = """
[[task]]
id = "touch-done"
instruction = "Create an empty file named done in /app. Answer with this bash block:\\n```bash\\ntouch done\\n```"
setup = "true"
expert = ["touch done"]
check = "test -f done"

[[task]]
id = "echo-hello"
instruction = "Write hello into hello.txt. Answer with this bash block:\\n```bash\\necho hello > hello.txt\\n```"
setup = "true"
expert = ["echo hello > hello.txt"]
check = "grep -qx hello hello.txt"
"""


class CountingPolicy:
    """The real policy, counting the completions it generates (each is one assistant turn of an episode)."""

    def __init__(self, policy) -> None:
        self.policy, self.model, self.tokenizer, self.name = (
            policy,
            policy.model,
            policy.tokenizer,
            policy.name,
        )
        self.generated = 0

    def generate(self, chats, n, sampling):
        self.generated += len(chats) * n
        return self.policy.generate(chats, n, sampling)


@pytest.fixture(scope="module")
def smollm2_policy():
    return load_policy("hf:smollm2")


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.toml"
    path.write_text(TASKS)
    return str(path)


def test_every_turn_of_an_episode_trains_with_its_episodes_advantage():
    def turn(prompt: list[int], tokens: list[int]) -> Completion:
        return Completion("", token_ids=tokens, prompt_token_ids=prompt)

    episodes = [
        Episode("t", [turn([1, 2], [3]), turn([1, 2, 3, 9], [4, 5])], reward=1.0),
        Episode("t", [turn([1, 2], [6])], reward=0.0),
        Episode("t", [turn([1, 2], [7])], reward=0.0, valid=False),  # the sandbox failed: not trained
    ]
    groups = episode_groups("t", episodes, [1.0, -1.0, 0.0])
    assert [(g.prefix, g.actions, g.advantages) for g in groups] == [
        ([1, 2], [[3]], [1.0]),
        ([1, 2, 3, 9], [[4, 5]], [1.0]),
        ([1, 2], [[6]], [-1.0]),
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("has_bwrap")
def test_a_rollout_counts_one_turn_per_generated_completion(smollm2_policy, tasks_file):
    policy = CountingPolicy(smollm2_policy)
    envs = episode_envs(EpisodeConfig(max_turns=2, env_kwargs={"tasks": tasks_file}), 4)
    try:
        episodes = rollout(
            policy,
            envs,
            ["touch-done", "touch-done", "echo-hello", "echo-hello"],
            SamplingParams(1.0, 1.0, 16, seed=0),
        )
        assert [e.task_id for e in episodes] == ["touch-done", "touch-done", "echo-hello", "echo-hello"]
        assert sum(e.turns for e in episodes) == policy.generated == sum(env.unwrapped.turns for env in envs)
        # every episode ended (by an answer without a command, or at max_turns), none by a sandbox failure
        assert all(1 <= e.turns <= 2 and e.valid and e.category not in ("", "ok") for e in episodes)
    finally:
        for env in envs:
            env.close()


@pytest.mark.slow
@pytest.mark.usefixtures("has_bwrap")
def test_two_steps_on_two_tasks_count_their_turns_and_update_only_on_mixed_rewards(
    smollm2_policy, tasks_file, tmp_path
):
    policy = CountingPolicy(smollm2_policy)
    before = [p.detach().clone() for p in policy.model.parameters()]
    grpo = tiny_config(
        tmp_path / "run",
        group_size=2,
        max_new_tokens=12,
        steps=2,
        learning_rate=1e-4,
        seed=0,
        checkpoint_every=0,
        num_envs=4,
    )
    # one turn per episode keeps the update to 4 turns a step: the model's backward passes are the test's cost
    config = EpisodeConfig(train=grpo, max_turns=1, env_kwargs={"tasks": tasks_file})
    try:
        result = train_episodes(config, ["touch-done", "echo-hello"], policy=policy)
        history = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
        assert [r["step"] for r in history] == [1, 2]
        assert [r["rollout_turns"] for r in history] == [4, 4]  # 2 tasks x 2 episodes x 1 turn
        assert result.rollout_turns == policy.generated == history[-1]["rollout_turns_total"] == 8
        changed = any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
        mixed = any(r["frac_zero_variance"] < 1.0 for r in history)
        assert changed == mixed and changed == any(r["turns_trained"] > 0 for r in history)
    finally:
        with torch.no_grad():
            for parameter, saved in zip(policy.model.parameters(), before):
                parameter.copy_(saved)


@pytest.mark.slow
@pytest.mark.usefixtures("has_bwrap")
def test_the_quick_e2e_experiment_reports_both_arms_at_the_same_rollout_turns(tmp_path):
    from pivot_envs.adapters.reproduce import e2e

    claim = e2e.run("quick", tmp_path, [0])
    assert set(claim) == {
        "claim",
        "title",
        "paper_section",
        "paper",
        "ours",
        "verdict",
        "interval",
        "detail",
        "figures",
    }
    assert claim["claim"] == "e2e" and claim["verdict"] in ("reproduced", "not reproduced", "inconclusive")
    # E2E RL's turns are the sum of its episodes' turns, step by step
    steps = [
        json.loads(line) for line in (tmp_path / "seed-0" / "e2e" / "metrics.jsonl").read_text().splitlines()
    ]
    e2e_turns, pivot_turns = (
        claim["ours"]["rollout_turns"]["e2e"][0],
        claim["ours"]["rollout_turns"]["pivotrl"][0],
    )
    assert (
        e2e_turns == sum(r["rollout_turns"] for r in steps) and 4 <= e2e_turns <= 8
    )  # 2 tasks x 2 episodes x 1-2
    # PivotRL spends one turn per training sample, B x G = 4 a step, as many as E2E RL spent (to a step's rounding)
    pivot_steps = (tmp_path / "seed-0" / "pivotrl" / "train" / "metrics.jsonl").read_text().splitlines()
    assert pivot_turns == 4 * len(pivot_steps) and abs(pivot_turns - e2e_turns) <= 2
    assert all(Path(figure).is_file() for figure in claim["figures"]) and claim["figures"]
    # a rerun reuses the seed's result
    assert e2e.run("quick", tmp_path, [0])["ours"] == claim["ours"]
    # one made with another start policy or device (reproduce's --policy, --device) runs the seed again, from an
    # empty folder (an interrupted seed's checkpoints would make its trainer refuse the folder)
    stored = tmp_path / "seed-0.json"
    result = json.loads(stored.read_text())
    stored.write_text(json.dumps({**result, "scale": {**result["scale"], "device": "cuda"}}))
    (tmp_path / "seed-0" / "stale").write_text("from the other run")
    again = e2e.run("quick", tmp_path, [0], device="cpu")
    assert json.loads(stored.read_text())["scale"] == e2e.sizes_of("quick").to_dict()
    assert not (tmp_path / "seed-0" / "stale").exists() and again["verdict"] in (
        "reproduced",
        "not reproduced",
        "inconclusive",
    )


def test_the_e2e_comparison_starts_from_the_policy_and_device_the_run_was_given(tmp_path):
    from pivot_envs.adapters.reproduce import e2e
    from pivot_envs.adapters.reproduce.experiments import Experiments
    from pivot_envs.adapters.reproduce.scales import get_scale
    from pivot_envs.adapters.reproduce.stages import Stages

    assert e2e.sizes_of("cpu") == e2e.SCALES["cpu"]
    sizes = e2e.sizes_of("gpu", policy="hf:/models/qwen", device="cuda:1")
    assert (sizes.policy, sizes.device, sizes.e2e_rl) == (
        "hf:/models/qwen",
        "cuda:1",
        e2e.SCALES["gpu"].e2e_rl,
    )
    with pytest.raises(UnknownNameError, match="scale 'gpux'"):
        e2e.sizes_of("gpux")

    def settings(**options):
        runs = Experiments(get_scale("cpu", **options), tmp_path, Stages(tmp_path))
        return runs._e2e_settings(e2e, [0, 1])

    # at the scale's own policy and device the settings are what they were, so finished E2E stages stay valid
    assert set(settings()) == {"scale", "seeds", "module"}
    assert settings(policy="hf:/models/qwen")["policy"] == "hf:/models/qwen"
    assert settings(device="cuda")["device"] == "cuda" and "policy" not in settings(device="cuda")


@pytest.mark.usefixtures("has_bwrap")
def test_the_reproduce_run_hands_its_policy_and_device_to_the_e2e_comparison(tmp_path):
    """Experiments.e2e passes --policy on: a policy that cannot load stops the comparison with its own error
    (the quick E2E scale's random model would have run)."""
    from dataclasses import replace

    from pivot_envs.adapters.reproduce.experiments import Experiments
    from pivot_envs.adapters.reproduce.scales import get_scale
    from pivot_envs.adapters.reproduce.stages import Stages
    from pivot_envs.cli._checks import PolicyLoadError

    scale = replace(get_scale("quick"), policy="hf:/nonexistent/model")
    runs = Experiments(scale, tmp_path, Stages(tmp_path))
    with pytest.raises(PolicyLoadError, match="hf:/nonexistent/model"):
        runs.e2e([0])
    assert not (tmp_path / "stages" / "e2e").exists()


class LetterEpisodes(gym.Env):
    """A toy episode env without a sandbox: `max_turns` assistant turns, rewarded 1 when the last one holds an 'a'
    (a random model's turns do about half the time, so the groups of episodes are mixed)."""

    observation_space = action_space = gym.spaces.Text(16)

    def __init__(self, max_turns: int = 2, sandbox: str = "bwrap") -> None:
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.turns, self.messages = 0, [{"role": "user", "content": f"Tell me about {options['task']}."}]
        return {"messages": list(self.messages), "tools": []}, {}

    def step(self, action):
        self.turns += 1
        self.messages += [
            {"role": "assistant", "content": str(action)},
            {"role": "user", "content": "Go on."},
        ]
        done = self.turns >= self.max_turns
        reward = 1.0 if done and "a" in str(action).lower() else 0.0
        return (
            {"messages": list(self.messages), "tools": []},
            reward,
            done,
            False,
            {"valid": True, "category": "x"},
        )


def test_a_resumed_e2e_run_continues_as_if_it_had_not_stopped_its_rollout_turns_included(tmp_path):
    from test_grpo import tiny_policy
    from transformers import AutoTokenizer

    from pivot_envs.adapters import smollm2

    name = "test/letter-episodes-v0"
    if name not in gym.registry:
        gym.register(name, entry_point=LetterEpisodes)
    tokenizer = AutoTokenizer.from_pretrained(smollm2.checkpoint())

    def run(out, steps, resume=False, seed=0):
        grpo = tiny_config(out, max_new_tokens=4, steps=steps, checkpoint_every=1, resume=resume, num_envs=4)
        policy = tiny_policy(tokenizer, seed=seed)
        result = train_episodes(
            EpisodeConfig(train=grpo, env=name, max_turns=2), ["one", "two", "three"], policy
        )
        records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
        return (
            result,
            policy,
            [{k: v for k, v in r.items() if not k.startswith(("time_", "tokens_per"))} for r in records],
        )

    straight, straight_policy, straight_records = run(tmp_path / "straight", 3)
    run(tmp_path / "split", 2)
    resumed, resumed_policy, resumed_records = run(tmp_path / "split", 3, resume=True, seed=7)

    assert sum(r["turns_trained"] for r in straight_records) > 0
    assert (
        resumed_records == straight_records
    )  # steps 1-2 kept from the checkpointed run, step 3 as the straight
    assert (
        resumed.rollout_turns == straight.rollout_turns == straight_records[-1]["rollout_turns_total"] == 48
    )
    for key, value in straight_policy.model.state_dict().items():
        assert torch.equal(value, resumed_policy.model.state_dict()[key])
