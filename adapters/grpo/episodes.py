"""End-to-end RL: GRPO on whole episodes, the baseline PivotRL is compared with per rollout turn.

The paper's E2E RL (its Sec. 2 objective, Sec. 4.3 comparison) with the pivot trainer's own parts
(its set-up `prepare_run`, its lines 11-13 `learn`, its `RunLog`): per step, sample B tasks, play G
episodes of each with the policy turn by turn (`rollout`, batched across the episodes still
running), take each episode's final reward as its outcome, then `learn`: normalise the rewards over
the G episodes of a task (Eq. 1) and apply the clipped objective (Eq. 7, with its KL to the frozen
reference when beta > 0) to the tokens of every assistant turn of every episode, each turn with its
episode's advantage. Each turn trains on the exact tokens it was sampled after and sampled
(`build_group`), so a turn is a group of one action (`task_groups`).

It counts the **rollout turns** as the paper does (the assistant turns generated, summed over the
training episodes; a PivotRL training sample is one turn) and logs them per step, cumulatively,
beside the pivot trainer's metrics. The episodes come from an episode env such as
`pivot/terminal-episode-v0` (reset with `options={"task": id}`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pivot_envs.adapters.grpo.config import GRPOConfig
from pivot_envs.adapters.grpo.groups import Group, build_group
from pivot_envs.adapters.grpo.policy import TrainablePolicy
from pivot_envs.adapters.grpo.run import RunLog, prepare_run
from pivot_envs.adapters.grpo.trainer import learn
from pivot_envs.config import option
from pivot_envs.errors import PivotEnvsError
from pivot_envs.policy import Completion, SamplingParams

logger = logging.getLogger(__name__)

EPISODE_ENV = "pivot/terminal-episode-v0"


class NoTasksError(PivotEnvsError, ValueError):
    """An episode run given no task to train on."""


@dataclass
class EpisodeConfig:
    """E2E RL's settings: the GRPO hyperparameters as the pivot trainer's (`train`: batch_pivots is B, the
    tasks per step; group_size is G, the episodes per task; max_new_tokens bounds each turn; num_envs is
    unused, an episode holds its env) and the episodes' own."""

    train: GRPOConfig = field(default_factory=GRPOConfig, metadata={"help": "the GRPO update (Eq. 1 and 7)"})
    env: str = option(EPISODE_ENV, "gymnasium id of the episode env (reset with options={'task': id})")
    max_turns: int = option(
        8, "assistant turns before an episode is truncated (the paper's SWE runs: 12-25 turns)"
    )
    sandbox: str = option("bwrap", "sandbox of the episode env: bwrap, docker or auto")
    env_kwargs: dict[str, Any] = option(
        factory=dict, help="further keyword arguments of gym.make (JSON data: e.g. tasks, a tasks TOML file)"
    )


@dataclass
class Episode:
    """One episode as played: its task, every assistant turn as sampled, its final reward and validity."""

    task_id: str
    completions: list[Completion] = field(default_factory=list)
    reward: float = 0.0
    valid: bool = True
    category: str = ""

    @property
    def turns(self) -> int:
        """Rollout turns: the assistant turns generated in this episode."""
        return len(self.completions)


@dataclass
class EpisodeTrainResult:
    """What `train_episodes` leaves behind: where, how far, the rollout turns spent and every step's metrics."""

    out: Path
    steps: int
    final: Path
    metrics_path: Path
    rollout_turns: int
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def episode_envs(config: EpisodeConfig, count: int) -> list[Any]:
    """`count` episode envs of `config.env` (each plays one episode at a time, in its own sandbox)."""
    import gymnasium as gym

    import pivot_envs

    gym.register_envs(pivot_envs)
    # The passive checker re-validates every step; check_env is part of the env's own tests.
    return [
        gym.make(
            config.env,
            disable_env_checker=True,
            max_turns=config.max_turns,
            sandbox=config.sandbox,
            **config.env_kwargs,
        )
        for _ in range(count)
    ]


def rollout(
    policy: Any, envs: Sequence[Any], task_ids: Sequence[str], sampling: SamplingParams
) -> list[Episode]:
    """Play one episode of `task_ids[i]` in `envs[i]` each, turn by turn: one generate call per turn for the
    episodes still running (`sampling.seed`, when set, advances by one per turn). Returns the episodes in order."""
    if len(envs) < len(task_ids):
        raise ValueError(f"{len(task_ids)} episodes need as many envs, got {len(envs)}")
    episodes = [Episode(task_id) for task_id in task_ids]
    observations = [env.reset(options={"task": task_id})[0] for env, task_id in zip(envs, task_ids)]
    running, turn = list(range(len(task_ids))), 0
    while running:
        seed = None if sampling.seed is None else sampling.seed + turn
        completions = policy.generate([observations[i] for i in running], 1, replace(sampling, seed=seed))
        still = []
        for i, (completion,) in zip(running, completions):
            episodes[i].completions.append(completion)
            observations[i], reward, terminated, truncated, info = envs[i].step(completion.action)
            if terminated or truncated:
                episodes[i].reward, episodes[i].valid, episodes[i].category = (
                    reward,
                    info["valid"],
                    info["category"],
                )
            else:
                still.append(i)
        running, turn = still, turn + 1
    return episodes


def success_rate(
    policy: Any, envs: Sequence[Any], task_ids: Sequence[str], max_new_tokens: int
) -> dict[str, Any]:
    """Greedy task success on `task_ids` (one episode each, `len(envs)` at a time): {"success" (mean reward
    over the valid episodes), "rewards" by task id (None where the env failed), "turns", "invalid"}."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, seed=0)
    episodes: list[Episode] = []
    for start in range(0, len(task_ids), len(envs)):
        episodes += rollout(policy, envs, task_ids[start : start + len(envs)], greedy)
    valid = [e for e in episodes if e.valid]
    return {
        "success": sum(e.reward for e in valid) / len(valid) if valid else 0.0,
        "rewards": {e.task_id: e.reward if e.valid else None for e in episodes},
        "turns": sum(e.turns for e in episodes),
        "invalid": len(episodes) - len(valid),
    }


def episode_groups(task_id: str, episodes: Sequence[Episode], advantages: Sequence[float]) -> list[Group]:
    """Every assistant turn of the valid episodes as a group of one action with its episode's advantage."""
    groups = []
    for index, (episode, advantage) in enumerate(zip(episodes, advantages)):
        if not episode.valid:
            continue
        for turn, completion in enumerate(episode.completions):
            group = build_group(f"{task_id}/episode-{index}/turn-{turn}", [completion], [advantage], [True])
            if group.actions:
                groups.append(group)
    return groups


def train_episodes(
    config: EpisodeConfig,
    tasks: Sequence[str],
    policy: TrainablePolicy | None = None,
    heldout: Sequence[str] | None = None,
    model: Any = None,
) -> EpisodeTrainResult:
    """E2E RL: train `policy` with GRPO on whole episodes of `tasks` (task ids of `config.env`).

    policy:  a TrainablePolicy (hf; vllm with `model`), loaded from `config.train.policy` when None.
    heldout: task ids whose greedy success is logged every `config.train.eval_every` steps (eval_success).
    Writes metrics.jsonl (with rollout_turns and rollout_turns_total per step), checkpoints/ and final/
    into `config.train.out`, and resumes from its latest checkpoint with `config.train.resume`.
    """
    import numpy as np

    grpo, tasks, heldout = config.train, list(tasks), list(heldout or [])
    if not tasks:
        raise NoTasksError(f"no tasks to train on: the task list given for {config.env} is empty")
    # the pivot trainer's set-up: policy, trainable module, frozen reference, optimizer, sampler, resume
    run = prepare_run(grpo, policy, model)
    batch_tasks = min(grpo.batch_pivots, len(tasks))
    envs = episode_envs(config, batch_tasks * grpo.group_size)

    def held_out_success() -> dict[str, float]:
        evaluated = heldout[: grpo.eval_pivots]
        return {"eval_success": success_rate(run.policy, envs, evaluated, grpo.max_new_tokens)["success"]}

    try:
        with RunLog(run, asdict(config), "E2E RL", held_out_success if heldout else None) as log:
            total_turns = log.resumed[-1]["rollout_turns_total"] if log.resumed else 0
            for step in range(run.start + 1, grpo.steps + 1):
                began = time.perf_counter()
                # B tasks, G episodes of each, played turn by turn with pi_theta_old (seeded per step and turn)
                chosen = run.sampler.choice(len(tasks), size=batch_tasks, replace=False)
                batch = [tasks[int(i)] for i in chosen]
                seed = (grpo.seed * 1_000_003 + step) * 1_000
                sampling = SamplingParams(grpo.temperature, grpo.top_p, grpo.max_new_tokens, seed=seed)
                episodes = rollout(
                    run.policy, envs, [task for task in batch for _ in range(grpo.group_size)], sampling
                )
                played = time.perf_counter()

                # the pivot trainer's lines 11-13: Eq. 1 over the G episodes of each task, Eq. 7 on every
                # assistant turn's tokens with its episode's advantage, then the weights to the generator
                outcomes = []
                for index, task in enumerate(batch):
                    mine = episodes[index * grpo.group_size : (index + 1) * grpo.group_size]
                    outcomes.append((task, mine, [e.reward for e in mine], [e.valid for e in mine]))
                groups, _, zero_variance, stats = learn(run, outcomes, task_groups)
                updated = time.perf_counter()

                turns = sum(e.turns for e in episodes)
                total_turns += turns
                valid = [e for e in episodes if e.valid]
                rewards = [e.reward for e in valid]
                sampled_tokens = sum(len(c.token_ids) for e in episodes for c in e.completions)
                record: dict[str, Any] = {
                    "step": step,
                    "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
                    "reward_std": float(np.std(rewards)) if rewards else 0.0,
                    "frac_zero_variance": zero_variance / len(batch),
                    "frac_invalid": 1.0 - len(valid) / len(episodes),
                    "episodes_trained": len({g.pivot_id.rsplit("/turn-", 1)[0] for g in groups}),
                    "turns_trained": len(groups),
                    "rollout_turns": turns,
                    "rollout_turns_total": total_turns,
                    "episode_turns_mean": turns / len(episodes),
                    "action_tokens": sampled_tokens,
                    "tokens_per_s": sampled_tokens / (updated - began),
                    "time_rollout_s": played - began,
                    "time_update_s": updated - played,
                    **stats,
                }
                log.step(record, note=f"{turns} rollout turns ({total_turns} in all)")
    finally:
        for env in envs:
            env.close()
    return EpisodeTrainResult(**vars(log.finish()), rollout_turns=total_turns)


def task_groups(
    task_id: str, episodes: Sequence[Episode], advantages: list[float], valid: Any
) -> list[Group]:
    """`learn`'s groups of a task: every turn of its valid episodes, each with its episode's advantage."""
    return episode_groups(task_id, episodes, advantages)
