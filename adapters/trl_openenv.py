"""TRL's asynchronous OpenEnv harness over pivot envs: an OpenEnv `ResourceSessionFactory` of pivot sessions.

TRL's `trl.experimental.async_grpo` harness (`HarnessRolloutWorker`) does not reset and step an env:
it asks a `ResourceSessionFactory` for one session per rollout (`create(row["prompt"], seed=group_id)`),
lets a harness adapter (OpenEnv's `MCPHarnessAdapter`) sample turns against the session's
`initial_messages()` and `list_tools()`, runs each tool call through `call_tool`, and scores the
transcript with `verify`. Here:

    from functools import partial
    from openenv.core.harness import MCPHarnessAdapter
    from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker
    from pivot_envs.adapters.trl_openenv import PivotSessionFactory, harness_dataset

    dataset = harness_dataset(pivots)                          # prompt = the pivot's id, one row per pivot
    worker = HarnessRolloutWorker(..., harness_session_factory=partial(PivotSessionFactory,
                                  "pivot/tool-use-v0", pivots=pivots), harness_adapter=MCPHarnessAdapter())

A pivot is one assistant turn: the first tool call ends the rollout (`ToolResult.done`), and
`verify` steps that whole turn (parallel calls included) in the env, returning the verifier's
reward, or None when the infrastructure failed (TRL leaves None out of the group's baseline).
The members of a group (the same row and seed) share one env restored at the pivot; each
member's turn is stepped from the pivot state in its own fork (see docs/openenv.md).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pivot_envs.env import InfrastructureError, json_safe
from pivot_envs.errors import MissingExtraError, PivotEnvsError, did_you_mean
from pivot_envs.pivot import Pivot
from pivot_envs.scoring import resolve_env

try:
    from openenv.core.env_server.mcp_types import Tool
    from openenv.core.harness import ResourceSession, ResourceSessionFactory, ToolResult, VerifyResult
except ImportError as error:
    raise MissingExtraError("pivot_envs.adapters.trl_openenv", error.name or "openenv", "openenv") from None

logger = logging.getLogger(__name__)

NOT_EXECUTED = "recorded: a pivot is one assistant turn; verify executes and scores the whole turn"


class HarnessTaskError(PivotEnvsError, ValueError):
    """A task (TRL passes a dataset row's `prompt`) that names no pivot the factory's env holds,
    or a transcript with no assistant turn to score."""


def harness_dataset(pivots: Sequence[Pivot]) -> Any:
    """A `datasets.Dataset` for TRL's harness: `prompt` (the pivot's id, what `create` receives),
    `pivot_id` and `domain`, one row per pivot."""
    from datasets import Dataset

    if not pivots:
        raise HarnessTaskError("harness_dataset: no pivots")
    return Dataset.from_list([{"prompt": p.id, "pivot_id": p.id, "domain": p.domain} for p in pivots])


def task_pivot_id(task: Any) -> str:
    """The pivot id a task names: the id itself, or a mapping's `pivot_id` (or `pivot`)."""
    if isinstance(task, Mapping):
        task = task.get("pivot_id", task.get("pivot"))
    if isinstance(task, str) and task:
        return task
    raise HarnessTaskError(
        f"pivot session: a task must be a pivot id (dataset rows from harness_dataset), got {type(task).__name__}"
    )


def mcp_tools(tools: Sequence[dict[str, Any]]) -> list[Tool]:
    """OpenAI function schemas as OpenEnv's MCP `Tool`s (name, description, input schema)."""
    out = []
    for tool in tools:
        function = tool.get("function", tool)
        out.append(
            Tool(
                name=str(function.get("name", "")),
                description=str(function.get("description") or ""),
                input_schema=dict(function.get("parameters") or {"type": "object", "properties": {}}),
            )
        )
    return out


@dataclass
class _Group:
    """One env restored at one pivot, shared by the sessions of a group (the same task and seed)."""

    key: tuple[str, Any]
    pivot_id: str
    env: Any = None
    observation: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # why the restore failed (its infrastructure), "" when it did not
    restored: bool = False
    fresh: bool = True  # the env is at the pivot state, not stepped since its restore
    members: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class PivotSessionFactory(ResourceSessionFactory["PivotSession"]):
    """OpenEnv sessions over pivot envs, one per rollout; `create(task, seed)` restores the pivot `task` names.

    `env_id` is an env id (built with `env_kwargs`; `pivots=` the pivots the dataset names, else
    the domain's bundled ones) or a factory of envs. `sampling` is accepted because TRL passes its
    sampling settings to a loop-owning factory; a pivot session samples nothing itself.
    `plain_messages=True` gives `prompt_messages`' plain turns (tools described in the system
    prompt) for chat templates that do not render tool calls.
    """

    def __init__(
        self,
        env_id: str | Callable[[], Any],
        *,
        plain_messages: bool = False,
        sampling: Any = None,
        **env_kwargs: Any,
    ) -> None:
        pivots = list(env_kwargs.pop("pivots", None) or [])
        self._make_env = resolve_env(env_id, pivots, **env_kwargs)
        self.plain_messages = plain_messages
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, Any], _Group] = {}
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._envs: list[Any] = []
        self._pivots: dict[str, Pivot] | None = None

    # -- the factory -------------------------------------------------------------------------------

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> PivotSession:
        """A session at the pivot `task` names; sessions with the same task and seed share one restored env."""
        pivot_id = task_pivot_id(task)
        pivot = self._pivot(pivot_id)
        key = (pivot_id, seed)
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group(key, pivot_id)
            group.members += 1
        try:
            with group.lock:
                if not group.restored:
                    self._restore(group)
        except BaseException:
            self._leave(group)
            raise
        return PivotSession(self, group, pivot, episode_id)

    def close(self) -> None:
        """Close every env the factory made (the harness's sessions must be closed first)."""
        with self._lock:
            envs, self._envs, self._groups = self._envs, [], {}
        for env in envs:
            env.close()

    # -- helpers -----------------------------------------------------------------------------------

    def _lease(self) -> Any:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            env = self._make_env()
            with self._lock:
                self._envs.append(env)
            return env

    def _pivot(self, pivot_id: str) -> Pivot:
        if self._pivots is None:
            env = self._lease()
            self._pivots = {p.id: p for p in env.unwrapped.pivots}
            self._idle.put(env)
        pivot = self._pivots.get(pivot_id)
        if pivot is None:
            raise HarnessTaskError(
                f"pivot session: unknown pivot {pivot_id!r}{did_you_mean(pivot_id, self._pivots)}"
            )
        return pivot

    def _restore(self, group: _Group) -> None:
        """Restore the group's pivot on a leased env; an infrastructure failure is kept, not raised."""
        group.env = self._lease()
        try:
            observation, _ = group.env.reset(options={"pivot": group.pivot_id})
            group.observation = observation if isinstance(observation, dict) else {}
        except InfrastructureError as error:
            group.error = str(error)
        group.restored, group.fresh = True, True

    def _leave(self, group: _Group) -> None:
        """One member fewer; the last one gives the env back for other groups."""
        with self._lock:
            group.members -= 1
            if group.members > 0:
                return
            if self._groups.get(group.key) is group:
                del self._groups[group.key]
            env, group.env = group.env, None
        if env is not None:
            self._idle.put(env)

    def _step(self, group: _Group, action: Any) -> tuple[float, dict[str, Any]]:
        """Step `action` at the group's pivot, from the pivot state: a fork for every step but the first."""
        with group.lock:
            if group.error:
                raise InfrastructureError(group.error)
            if not group.fresh:
                # the cached snapshot restores the pivot state (copy-on-write, a sandbox fork)
                group.env.reset(options={"pivot": group.pivot_id})
            group.fresh = False
            _, reward, _, _, info = group.env.step(action)
        return float(reward), info


class PivotSession(ResourceSession):
    """One rollout at one pivot: its messages and tools, tool calls recorded, `verify` stepping the turn."""

    def __init__(
        self, factory: PivotSessionFactory, group: _Group, pivot: Pivot, episode_id: str | None
    ) -> None:
        self._factory = factory
        self._group = group
        self.pivot = pivot
        self.episode_id = episode_id
        observation = group.observation
        self._messages = list(observation.get("messages") or pivot.messages)
        self._tools = list(observation.get("tools") or pivot.tools or [])
        self._verified: VerifyResult | None = None
        self._closed = False

    @property
    def pivot_id(self) -> str:
        return self.pivot.id

    def initial_messages(self) -> list[dict[str, Any]]:
        """The pivot's chat s_t (tool-call arguments as objects), or plain turns with `plain_messages`."""
        from pivot_envs.adapters.chat_template import _native_messages, prompt_messages

        if self._factory.plain_messages:
            return prompt_messages(self._messages, self._tools)
        return _native_messages(self._messages)

    def list_tools(self) -> list[Tool]:
        """The pivot's tools as MCP tools (none for a domain whose action is text, such as terminal)."""
        return mcp_tools(self._tools)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Record a call of the pivot's turn and end the rollout (done): `verify` executes the whole turn.

        An unknown tool is not raised (TRL would score the rollout None, an infrastructure
        failure): the verifier scores it as the policy's error.
        """
        known = {tool.name for tool in self.list_tools()}
        error = None if name in known else f"unknown tool {name!r}"
        return ToolResult(data=NOT_EXECUTED, done=True, metadata={"pivot_id": self.pivot_id}, error=error)

    def verify(self, transcript: list[dict[str, Any]], final_state: Any | None = None) -> VerifyResult:
        """The verifier's reward for the transcript's first assistant turn after the initial messages.

        `env_reward` is None when the infrastructure (the restore, a sandbox, a tool backend)
        failed: `metrics["valid"]` is False and `artifacts["detail"]` says why. Verifying again
        returns the first result (an episode is one step).
        """
        if self._verified is not None:
            return self._verified
        if self._closed:
            raise HarnessTaskError(f"pivot session {self.pivot_id}: verify after close")
        action = _turn_action(transcript, len(self._messages))
        try:
            reward, info = self._factory._step(self._group, action)
        except InfrastructureError as error:
            logger.warning(
                "pivot %s: infrastructure failed, the rollout is unscored: %s", self.pivot_id, error
            )
            reward, info = None, {"valid": False, "category": "infrastructure_error", "detail": str(error)}
        valid = bool(info.get("valid", True))
        self._verified = VerifyResult(
            env_reward=reward if valid else None,
            done=True,
            metrics={
                "valid": valid,
                "category": str(info.get("category", "")),
                "strict_reward": float(info.get("strict_reward", 0.0)) if valid else None,
            },
            artifacts=json_safe(
                {
                    "pivot_id": self.pivot_id,
                    "episode_id": self.episode_id,
                    "parsed": info.get("parsed"),
                    "output": info.get("output"),
                    "detail": info.get("detail", ""),
                }
            ),
        )
        return self._verified

    def close(self) -> None:
        """Leave the group (its env goes back to the factory with its last member); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._factory._leave(self._group)


def _turn_action(transcript: Sequence[Any], start: int) -> str | dict[str, Any]:
    """The pivot's turn in a transcript: the first assistant message from `start`, as the env's action.

    A message with tool calls is stepped as the message (arguments decoded from JSON text);
    otherwise its text, which the domain parses (a bash command, Hermes blocks TRL did not parse).
    """
    for message in list(transcript)[start:]:
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            if not message.get("tool_calls"):
                return str(message.get("content") or "")
            calls = []
            for call in message["tool_calls"]:
                function = dict(call.get("function", call))
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    try:
                        function["arguments"] = json.loads(arguments)
                    except json.JSONDecodeError:
                        pass  # kept as text: the verifier scores malformed arguments
                calls.append({**call, "type": "function", "function": function})
            return {**message, "role": "assistant", "tool_calls": calls}
    raise HarnessTaskError(
        f"pivot session: the transcript has no assistant turn after its {start} initial messages"
    )
