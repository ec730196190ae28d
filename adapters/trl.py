"""TRL adapter: pivots as a `datasets.Dataset`, pivot envs as `reward_funcs` or as an `environment_factory`.

    from trl import GRPOConfig, GRPOTrainer
    from pivot_envs.adapters.trl import to_dataset, reward_function

    dataset = to_dataset(pivots)                                  # prompt, tools, pivot_id
    reward = reward_function("pivot/tool-use-v0", pivots=pivots)  # steps the env at each row's pivot
    GRPOTrainer(model, reward_funcs=reward, train_dataset=dataset, args=GRPOConfig(...)).train()

TRL's environment API (`environment_factory`, TRL >= 1.16) gives each rollout its own env instance:

    factory = pivot_environment_factory("pivot/tool-use-v0", pivots=pivots)  # each instance resets to its row's pivot
    GRPOTrainer(model, reward_funcs=environment_reward, environment_factory=factory, train_dataset=dataset, ...)

Users who outgrow one machine train with TRL + accelerate (DeepSpeed, FSDP) on the same envs.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from pivot_envs.env import InfrastructureError
from pivot_envs.errors import PivotEnvsError
from pivot_envs.pivot import Pivot
from pivot_envs.scoring import EnvPool, Score, resolve_env


class TRLInputError(PivotEnvsError, ValueError):
    """What TRL handed the adapter (or the adapter was handed for TRL) is not what it can use."""


def to_dataset(pivots: Sequence[Pivot], tokenizer: Any = None) -> Any:
    """A `datasets.Dataset` with one row per pivot: `prompt`, `tools` (JSON), `pivot_id`, `domain`.

    Without a tokenizer `prompt` is conversational: the pivot's messages normalised to plain
    {role, content} turns with the tools described Hermes-style in the system prompt
    (`chat_template.prompt_messages`), because TRL renders one trainer-wide tool list, not one per
    row. With a tokenizer `prompt` is the rendered prompt text (`chat_template.render_prompt`),
    the exact prompt the bundled trainer and the hf policy use.
    """
    from datasets import Dataset

    from pivot_envs.adapters.chat_template import prompt_messages, render_prompt

    if not pivots:
        raise TRLInputError("to_dataset: no pivots")
    rows = []
    for pivot in pivots:
        if tokenizer is not None:
            prompt: Any = render_prompt(tokenizer, pivot.messages, pivot.tools)
        else:
            prompt = prompt_messages(pivot.messages, pivot.tools)
        rows.append(
            {"prompt": prompt, "tools": json.dumps(pivot.tools), "pivot_id": pivot.id, "domain": pivot.domain}
        )
    return Dataset.from_list(rows)


def _completion_action(completion: Any) -> str | dict[str, Any]:
    """The action a TRL completion holds: its text, or its assistant message when that carries tool calls.

    Conversational completions are lists of messages. When the tokenizer parses responses (a
    `response_template`, transformers >= 5), TRL moves a tool call out of the text into the
    message's `tool_calls` and leaves the content empty: such a message is the action, as an
    OpenAI-compatible server's would be. Only the first assistant message is the pivot's turn.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        turns = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        if not turns:
            return ""
        if turns[0].get("tool_calls"):
            return {**turns[0], "role": "assistant"}
        return str(turns[0].get("content") or "")
    raise TRLInputError(
        f"pivot reward: a completion must be text or a list of messages, got {type(completion).__name__}"
    )


def reward_function(
    env_id: str | Callable[[], Any], num_envs: int = 4, **env_kwargs: Any
) -> Callable[..., list[float | None]]:
    """A TRL reward function that steps the env at each row's pivot with each completion.

    TRL calls it as `f(prompts=..., completions=..., completion_ids=..., pivot_id=[...], ...)`
    (dataset columns arrive as keyword lists). A completion is stepped as its text, or as its
    assistant message when TRL parsed tool calls into it. It returns the env's reward (the functional
    verifier), or None for a sample whose infrastructure failed (`info["valid"] == False`): TRL
    leaves such samples out of the group's baseline instead of scoring them 0.
    `env_id` is an env id built with `env_kwargs` (which must hold the pivots unless the domain's
    bundled ones are meant), or a factory of envs.
    """
    pivots = list(env_kwargs.pop("pivots", None) or [])
    make_env = resolve_env(env_id, pivots, **env_kwargs)
    pool: EnvPool | None = None

    def pivot_reward(completions: Sequence[Any], pivot_id: Sequence[str], **_: Any) -> list[float | None]:
        nonlocal pool
        if len(completions) != len(pivot_id):
            raise TRLInputError(f"pivot reward: {len(completions)} completions but {len(pivot_id)} pivot ids")
        if pool is None:
            pool = EnvPool(make_env, num_envs)
        scores = pool.score([(pid, _completion_action(c)) for pid, c in zip(pivot_id, completions)])
        return [score.reward if score.valid else None for score in scores]

    return pivot_reward


class PivotEnvironment:
    """One rollout's pivot env for TRL's `environment_factory`: `reset(**row)` puts it at the row's pivot.

    TRL builds one instance per rollout (pooled and reset between batches) and calls
    `reset(**row)` with the dataset row, so every completion in a group (the same row repeated
    `num_generations` times) starts from exactly the row's pivot state: the env restores that pivot
    (`reset(options={"pivot": pivot_id})`), not a seeded or sampled start. The class has no public
    tool methods on purpose: TRL would expose them as one trainer-wide tool list and keep generating
    after each call, while a pivot is the one assistant turn its prompt lists the tools for;
    `environment_reward` steps that turn. All other members are private because TRL turns every
    public method into a tool.
    """

    def __init__(self, make_env: Callable[[], Any]) -> None:
        self._make_env = make_env
        self._env: Any = None
        self._pivot_id: str | None = None
        self._reset_error: str = ""

    def reset(self, **row: Any) -> None:
        """Restore the pivot the dataset row names (`pivot_id`); returns None (the prompt already holds it).

        An infrastructure failure of the restore does not raise into TRL's loop: the rollout is
        scored None (no reward) by `environment_reward`.
        """
        pivot_id = row.get("pivot_id")
        if not isinstance(pivot_id, str) or not pivot_id:
            raise TRLInputError(
                f"pivot environment: a dataset row must carry a pivot_id (see to_dataset), got keys {sorted(row)}"
            )
        if self._env is None:
            self._env = self._make_env()
            # TRL has no close hook for its environments: the env (its sandboxes, its tool backend) is
            # closed when this instance is collected, or at interpreter exit
            weakref.finalize(self, _close_quietly, self._env)
        self._pivot_id, self._reset_error = pivot_id, ""
        try:
            self._env.reset(options={"pivot": pivot_id})
        except InfrastructureError as error:
            self._reset_error = str(error)
        return None

    def _step(self, completion: Any) -> Score:
        """Step the completion's pivot turn at the restored pivot; a failed restore is an invalid Score."""
        if self._pivot_id is None:
            raise TRLInputError(
                "pivot environment: scored before reset (TRL resets each rollout's env first)"
            )
        if self._reset_error:
            return Score(0.0, 0.0, False, "infrastructure_error", self._reset_error)
        _, reward, _, _, info = self._env.step(_completion_action(completion))
        return Score.from_step(reward, info)

    @property
    def pivot_id(self) -> str | None:
        """The pivot the last reset restored (None before the first)."""
        return self._pivot_id


def _close_quietly(env: Any) -> None:
    """Close a collected PivotEnvironment's env; a failing close must not raise in a finalizer."""
    try:
        env.close()
    except Exception:  # noqa: BLE001  (a finalizer has no caller to tell)
        pass


def pivot_environment_factory(
    env_id: str | Callable[[], Any], **env_kwargs: Any
) -> Callable[[], PivotEnvironment]:
    """TRL's `environment_factory` over a pivot env: each call returns a fresh `PivotEnvironment`.

    `env_id` and `env_kwargs` are as in `reward_function` (`pivots=` the pivots the dataset rows
    name). Each instance builds its own env on first reset, so rollouts never share env state.
    Pass `environment_reward` as the trainer's `reward_funcs`.
    """
    pivots = list(env_kwargs.pop("pivots", None) or [])
    make_env = resolve_env(env_id, pivots, **env_kwargs)
    return lambda: PivotEnvironment(make_env)


def environment_reward(
    completions: Sequence[Any], environments: Sequence[Any] | None = None, **_: Any
) -> list[float | None]:
    """The reward function for `pivot_environment_factory`: each rollout's env steps its own completion.

    TRL passes the per-rollout instances as `environments`. Returns the env's reward (its
    functional verifier) for each completion, or None where the infrastructure failed
    (`info["valid"] == False` or a failed restore): TRL leaves those out of the group's baseline.
    """
    if environments is None:
        raise TRLInputError(
            "environment_reward: TRL passed no environments (give the trainer environment_factory=...)"
        )
    if len(environments) != len(completions):
        raise TRLInputError(
            f"environment_reward: {len(completions)} completions but {len(environments)} environments"
        )
    rewards: list[float | None] = []
    for completion, environment in zip(completions, environments):
        if not isinstance(environment, PivotEnvironment):
            raise TRLInputError(
                f"environment_reward: an environment is a {type(environment).__name__}, "
                "not a PivotEnvironment (build it with pivot_environment_factory)"
            )
        score = environment._step(completion)
        rewards.append(score.reward if score.valid else None)
    return rewards
