"""TerminalEpisodeEnv: `pivot/terminal-episode-v0`, a whole bundled terminal task as one multi-turn episode.

The environment of the paper's end-to-end RL baseline (E2E RL), which PivotRL is compared with
per rollout turn. reset() starts a task from its start state (its setup done, no expert command
run) in one sandbox kept for the whole episode; each step runs the policy's next bash command
there and appends the command and its output to the chat, in the message format of the terminal
pivots (the same prompt works for both). The episode terminates when the policy answers without a
command (it is done) and is truncated after `max_turns` steps; at its end the task's `check` runs
in the sandbox and the reward is 1.0 iff it exits 0. Every command is bounded by the sandbox
limits, as in pivot/terminal-v0; a sandbox that fails is `info["valid"] = False`, never reward 0.

The start state is the terminal env's prefix state of the task's first turn (built once per task,
snapshotted, forked per episode), so this env is a TerminalEnv whose pivots are the tasks' starts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from gymnasium.error import ResetNeeded

from pivot_envs.config import ConfigError
from pivot_envs.env import ParsedAction, json_safe
from pivot_envs.errors import UnknownNameError
from pivot_envs.pivot import Pivot
from pivot_envs.registry import DomainSpec
from pivot_envs.sandboxes import CommandResult, SandboxError, SandboxLimits

from .env import TerminalEnv
from .parse import BASH_TOOL, canonical_message, parse_action, parse_command
from .tasks import SYSTEM_PROMPT, Task, TaskFileError, load_tasks, run_check

DONE = "done"  # the category of an episode the policy ended by answering without a command
TAMPERED = "system_tampered"  # the category of an episode whose commands wrote outside the writable roots
UNSTOPPED = "processes_not_stopped"  # the category of an episode whose processes outlived the stop
STOP_TIMEOUT = 5.0  # seconds the processes an episode left running get to be stopped before its check


def start_pivot(task: Task) -> Pivot:
    """The state an episode of `task` starts in, as the pivot of its first turn: the system prompt and the
    instruction, the task's setup, no expert command (the expert's first command is the pivot's expert)."""
    expert = canonical_message(task.expert[0])
    return Pivot(
        id=f"terminal/{task.id}/t0",
        domain="terminal",
        messages=[
            {"role": "system", "content": SYSTEM_PROMPT.format(workdir=task.workdir)},
            {"role": "user", "content": task.instruction},
        ],
        expert=expert,
        tools=[BASH_TOOL],
        context=task.context,
        source={"trajectory": f"terminal/{task.id}", "turn": 0, "format": "pivot-envs terminal tasks"},
    )


def tool_reply(result: CommandResult) -> str:
    """A command's result as the tool message shows it (as in the terminal pivots)."""
    return result.output + ("\n[timed out]" if result.timed_out else "") + f"\n[exit code {result.exit_code}]"


class TerminalEpisodeEnv(TerminalEnv):
    """A bundled terminal task from its start to the policy's last command (see the module docstring).

    tasks:     the tasks to draw from (`Task`s or a tasks TOML file; default: the bundled data/tasks.toml).
    max_turns: steps before the episode is truncated (each step is one assistant turn).
    sandbox:   "bwrap" (the default: an episode keeps its sandbox for many commands, and a batch runs many
               episodes at once, where bubblewrap's 7-11 ms start beats Docker's 250 ms), "docker" or "auto".

    reset(seed, options) starts a task (`options={"task": id}` or `{"index": i}`, else a seeded draw) and
    returns the chat {"messages": [system, instruction], "tools": [bash]} and info {"task_id", "pivot_id",
    "index", "turns": 0}. step(action) takes the completion text or an assistant message, as
    pivot/terminal-v0 parses it; an action with a command runs it and appends the canonical bash call and its
    output (reward 0, not terminated); an action without one ends the episode (category "done", or the
    parser's category such as "multiple_commands"). Reward 1.0 at the episode's end iff the task's check
    exits 0. info: "task_id", "turns" (assistant turns so far), "category", "detail", "valid", "output"
    (the command's result) and at the end "check" (the check's exit code and output).
    """

    def __init__(
        self,
        tasks: Sequence[Task] | str | os.PathLike | None = None,
        max_turns: int = 8,
        render_mode: str | None = None,
        sandbox: str = "bwrap",
        limits: SandboxLimits | dict[str, Any] | None = None,
        prefix_cache: int = 64,
        warm_pool: int = 1,
        build_image: bool = True,
    ) -> None:
        if max_turns < 1:
            raise ConfigError(f"TerminalEpisodeEnv max_turns must be >= 1, got {max_turns}")
        self.tasks = (
            load_tasks(tasks) if tasks is None or isinstance(tasks, (str, os.PathLike)) else list(tasks)
        )
        if not self.tasks:
            raise TaskFileError("TerminalEpisodeEnv: the task set is empty")
        self._task_index = {task.id: index for index, task in enumerate(self.tasks)}
        super().__init__(
            [start_pivot(task) for task in self.tasks],
            render_mode=render_mode,
            sandbox=sandbox,
            limits=limits,
            prefix_cache=prefix_cache,
            warm_pool=warm_pool,
            build_image=build_image,
        )
        self.max_turns = max_turns
        self.task: Task | None = None
        self.messages: list[dict[str, Any]] = []
        self.turns = 0
        self._ended = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        options = dict(options or {})
        if "task" in options:
            task_id = options.pop("task")
            if task_id not in self._task_index:
                raise UnknownNameError("task", task_id, list(self._task_index))
            options["index"] = self._task_index[task_id]
        observation, info = super().reset(seed=seed, options=options)
        self.task = self.tasks[info["index"]]
        self.messages = observation["messages"]
        self.turns = 0
        self._ended = False
        return self._observation(), {**info, "task_id": self.task.id, "turns": 0}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self.task is None or self._ended:
            raise ResetNeeded("call reset() before step(): the episode has ended")
        self.turns += 1
        info: dict[str, Any] = {
            "task_id": self.task.id,
            "turns": self.turns,
            "category": "ok",
            "detail": "",
            "valid": True,
            "output": None,
        }
        try:
            parsed = parse_action(action, check_syntax=False)
        except RecursionError:
            parsed = ParsedAction(None, "unparseable", "the action is nested too deeply to parse")
        found = parse_command(parsed.message) if parsed.message is not None else None
        if found is None or found.keys:
            # No command to run: the policy's answer ends the episode (keystrokes have no shell to go to).
            said = (
                action
                if isinstance(action, str)
                else action.get("content")
                if isinstance(action, dict)
                else None
            )
            self.messages.append({"role": "assistant", "content": json_safe(said)})
            if parsed.category == "no_command":
                info.update(category=DONE, detail="the policy answered without a command")
            else:
                info.update(category="keystrokes" if found else parsed.category, detail=parsed.detail)
            return self._end(info, truncated=False)
        if self.sandbox is None:
            return self._end(info, truncated=False)
        command = found.command.strip("\n")
        try:
            result = self.sandbox.run(command)
        except SandboxError as error:
            info.update(category="infrastructure_error", detail=f"task {self.task.id}: {error}", valid=False)
            return self._end(info, truncated=False)
        except Exception as error:  # a bug of the env, not the action's doing: the contract's env_error
            detail = f"task {self.task.id}: {type(error).__name__}: {error}"[:2000]
            info.update(category="env_error", detail=detail, valid=False)
            return self._end(info, truncated=False)
        call_id = f"call_{self.turns - 1}"
        message = canonical_message(command)
        message["tool_calls"][0]["id"] = call_id
        self.messages += [message, {"role": "tool", "tool_call_id": call_id, "content": tool_reply(result)}]
        info["output"] = json_safe(result.to_dict())
        if self.turns >= self.max_turns:
            info.update(category="max_turns", detail=f"the episode reached max_turns={self.max_turns}")
            return self._end(info, truncated=True)
        return self._observation(), 0.0, False, False, info

    def _end(self, info: dict[str, Any], truncated: bool) -> tuple[dict, float, bool, bool, dict]:
        """End the episode: run the task's check in its sandbox (reward 1.0 iff it exits 0), then drop the sandbox."""
        self._ended = True
        reward = 0.0
        if self.sandbox is None:  # the start state could not be built: the prefix state says why
            info.update(category="infrastructure_error", detail=self._state.reason, valid=False)
        if info["valid"]:
            try:
                # Nothing of the policy's may run beside the check, nor have changed what it runs.
                if not self.sandbox.stop_processes(STOP_TIMEOUT):
                    # Processes that fork faster than they are killed, or that leave the stop no process
                    # to start: the policy's doing, and the check could not run alone.
                    info.update(
                        category=UNSTOPPED,
                        detail="the processes the episode's commands left running could not all be stopped "
                        "before the check",
                    )
                elif tampered := self.sandbox.system_writes():
                    info.update(
                        category=TAMPERED,
                        detail=f"the episode's commands wrote outside the workdir, /root and /tmp: "
                        f"{', '.join(tampered[:5])}{' ...' if len(tampered) > 5 else ''}",
                        system_writes=tampered,
                    )
                else:
                    check = run_check(self.sandbox, self.task)  # bounded by the task's own check_timeout
                    reward = 1.0 if check.ok else 0.0
                    info["check"] = {"exit_code": check.exit_code, "output": json_safe(check.output[-2000:])}
            except SandboxError as error:
                info.update(
                    category="infrastructure_error",
                    detail=f"task {self.task.id}: check: {error}",
                    valid=False,
                )
        self._close_fork()
        return self._observation(), reward, not truncated, truncated, info

    def _observation(self) -> dict[str, Any]:
        # A fresh copy: the caller may edit it without changing the episode's chat.
        return {"messages": json_safe(self.messages), "tools": json_safe(self.pivot.tools)}

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.task is None:
            return None
        lines = [f"task {self.task.id} (terminal episode), turn {self.turns}/{self.max_turns}"]
        lines += [
            f"[{m.get('role')}] {str(m.get('content') or m.get('tool_calls'))[:200]}"
            for m in self.messages[-2:]
        ]
        return "\n".join(lines)


DOMAIN = DomainSpec(
    name="terminal-episode",
    env_class=TerminalEpisodeEnv,
    description="a whole bundled terminal task, one command per step, reward 1 iff the task's check passes "
    "(the end-to-end RL baseline)",
    verifiers=("check",),
)
