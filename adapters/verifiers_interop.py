"""Pivot envs for PrimeIntellect's verifiers (checked against verifiers 0.4.0, its `verifiers.v1` API).

verifiers 0.4.0 has no gymnasium wrapper: an environment there is a `Taskset` (data) whose
`Task`s score a rollout's `Trace` in `@vf.reward` methods, run by an `Env` with a harness and a
model. A pivot env goes in as a taskset: one task per pivot (its prompt the pivot's messages, with
the tools described Hermes-style in the system prompt), and one reward that steps the pivot env
at the task's pivot with the rollout's first model turn.

    from pivot_envs.adapters.verifiers_interop import pivot_taskset

    taskset = pivot_taskset("pivot/tool-use-v0", pivots=pivots)   # or pivots_path="pivots.jsonl"
    for task in taskset.take(8):
        ...  # vf.SingleAgentEnv runs them; `await task.score(trace)` records trace.rewards["pivot_reward"]
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pivot_envs.adapters.chat_template import prompt_messages
from pivot_envs.errors import MissingExtraError, PivotEnvsError
from pivot_envs.pivot import Pivot, read_pivots
from pivot_envs.scoring import EnvPool, resolve_env

try:
    import verifiers.v1 as vf
except ImportError:
    raise MissingExtraError("pivot envs in verifiers", "verifiers", "verifiers") from None


class PivotTaskData(vf.TaskData):
    """A pivot as verifiers task data: `id` is the pivot's id, `prompt` its messages."""

    domain: str = ""


class PivotTasksetConfig(vf.TasksetConfig):
    """What a pivot taskset loads: the env that scores, and the pivots (a JSONL file) it holds."""

    env_id: str = "pivot/tool-use-v0"
    pivots_path: str | None = None
    """A pivots JSONL file; None for the domain's bundled pivots."""
    num_envs: int = 4
    """How many envs score rollouts at once (each steps one rollout at a time)."""


class PivotTask(vf.Task[PivotTaskData, vf.State, vf.TaskConfig]):
    """One pivot; its reward is the pivot env's functional verifier on the rollout's first turn."""

    def __init__(
        self, data: PivotTaskData, config: vf.TaskConfig | None = None, *, pool: EnvPool | None = None
    ) -> None:
        super().__init__(data, config)
        self.pool = pool

    @vf.reward
    async def pivot_reward(self, trace: vf.Trace) -> float:
        """The env's reward for the first assistant turn the model sampled (the pivot is that one turn).

        An infrastructure failure (`valid=False`) raises `vf.SandboxError`: verifiers records it on
        the trace as a `sandbox_error` rollout, not as a 0 reward.
        """
        if self.pool is None:
            raise PivotEnvsError(
                f"pivot {self.data.id}: this task was built without its env (use pivot_taskset)"
            )
        turns = trace.assistant_messages
        action = _chat_message(turns[0]) if turns else ""
        score = await asyncio.wrap_future(self.pool.submit(str(self.data.id), action))
        if not score.valid:
            raise vf.SandboxError(f"pivot {self.data.id}: the env's infrastructure failed: {score.detail}")
        return score.reward


def _chat_message(message: Any) -> dict[str, Any]:
    """A verifiers assistant message as the chat dict pivot envs step (OpenAI `tool_calls` shape)."""
    calls = [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        for call in message.tool_calls or []
    ]
    return {"role": "assistant", "content": message.content, **({"tool_calls": calls} if calls else {})}


class PivotTaskset(vf.Taskset[PivotTask, PivotTasksetConfig]):
    """A verifiers taskset over pivots; every task shares one pool of envs that score rollouts."""

    def __init__(
        self,
        config: PivotTasksetConfig,
        pivots: Sequence[Pivot] | None = None,
        make_env: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(config)
        if pivots is None and config.pivots_path is not None:
            pivots = read_pivots(config.pivots_path)
        env_factory = make_env or resolve_env(config.env_id, list(pivots or []))
        if pivots is None:  # the domain's bundled pivots: ask an env which it holds
            probe = env_factory()
            pivots = probe.unwrapped.pivots
            probe.close()
        self.pivots = list(pivots)
        self.pool = EnvPool(env_factory, config.num_envs)

    def load(self) -> Iterator[PivotTask]:
        for pivot in self.pivots:
            data = PivotTaskData(
                id=pivot.id,
                name=pivot.id,
                domain=pivot.domain,
                prompt=prompt_messages(pivot.messages, pivot.tools),
            )
            yield PivotTask(data, self.config.task, pool=self.pool)

    def close(self) -> None:
        """Close the envs that scored rollouts."""
        self.pool.close()


def pivot_taskset(
    env_id: str | Callable[[], Any] = "pivot/tool-use-v0",
    pivots: Sequence[Pivot] | None = None,
    pivots_path: str | None = None,
    num_envs: int = 4,
    **env_kwargs: Any,
) -> PivotTaskset:
    """A verifiers taskset of `pivots` (or the pivots in `pivots_path`, or the domain's bundled ones).

    `env_id` is a registered env id, built with `env_kwargs`, or a factory of envs that hold the
    pivots. Each task's reward steps the env at its pivot; see the module docstring.
    """
    config = PivotTasksetConfig(
        env_id=env_id if isinstance(env_id, str) else "", pivots_path=pivots_path, num_envs=num_envs
    )
    if pivots is None and pivots_path is not None:
        pivots = read_pivots(pivots_path)
    return PivotTaskset(config, pivots, resolve_env(env_id, list(pivots or []), **env_kwargs))
