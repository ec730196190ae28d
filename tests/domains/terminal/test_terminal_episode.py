"""pivot/terminal-episode-v0: a whole task per episode, one command per step, reward 1 iff the task's check passes."""

from __future__ import annotations

import dataclasses
import time

import gymnasium as gym
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env

import pivot_envs
from pivot_envs.domains.terminal import bundled_pivots
from pivot_envs.domains.terminal.episode import STOP_TIMEOUT, TerminalEpisodeEnv
from pivot_envs.domains.terminal.tasks import load_tasks
from pivot_envs.errors import UnknownNameError

gym.register_envs(pivot_envs)
TASKS = {task.id: task for task in load_tasks()}


def bash(command: str) -> str:
    return f"```bash\n{command}\n```"


def play(env: TerminalEpisodeEnv, task_id: str, actions: list[str]) -> list[tuple]:
    """Reset at `task_id` and step `actions` until the episode ends; returns every step's result."""
    env.reset(options={"task": task_id})
    steps = []
    for action in actions:
        steps.append(env.step(action))
        if steps[-1][2] or steps[-1][3]:
            break
    return steps


@pytest.mark.parametrize(
    "task_id", ["env-var-export", "git-init-commit", "rename-extensions", "python-fix-bug"]
)
def test_the_experts_commands_solve_the_task_with_reward_one_at_the_last_step(has_bwrap, task_id):
    env = TerminalEpisodeEnv(sandbox="bwrap")
    steps = play(env, task_id, [bash(command) for command in TASKS[task_id].expert] + ["Done."])
    rewards = [reward for _, reward, _, _, _ in steps]
    assert rewards == [0.0] * len(TASKS[task_id].expert) + [1.0]
    _, _, terminated, truncated, info = steps[-1]
    assert (terminated, truncated, info["category"], info["valid"]) == (True, False, "done", True)
    assert info["turns"] == len(TASKS[task_id].expert) + 1
    env.close()


def test_the_experts_commands_solve_a_task_in_each_sandbox_kind(kind):
    env = gym.make("pivot/terminal-episode-v0", sandbox=kind)
    steps = play(
        env, "sed-config-port", [bash(c) for c in TASKS["sed-config-port"].expert] + ["I changed the port."]
    )
    assert steps[-1][1] == 1.0 and steps[-1][4]["check"]["exit_code"] == 0
    env.close()


def test_a_wrong_sequence_does_not_solve_the_task(has_bwrap):
    env = TerminalEpisodeEnv(sandbox="bwrap")
    # the expert's commands but the last one, which writes the answer
    steps = play(
        env, "count-error-lines", [bash("ls"), bash("grep -c ERROR app.log"), "The answer is above."]
    )
    assert [reward for _, reward, _, _, _ in steps] == [0.0, 0.0, 0.0]
    assert steps[-1][2] is True and steps[-1][4]["check"]["exit_code"] != 0
    # answering at once, with nothing done, fails too
    _, reward, terminated, _, info = play(env, "count-error-lines", ["Nothing to do."])[0]
    assert (reward, terminated, info["turns"]) == (0.0, True, 1)
    env.close()


def test_the_chat_after_each_command_is_the_terminal_pivots_prefix(has_bwrap):
    env = TerminalEpisodeEnv(sandbox="bwrap")
    env.reset(options={"task": "awk-average"})
    pivots = {pivot.id: pivot for pivot in bundled_pivots()}
    for turn, command in enumerate(TASKS["awk-average"].expert[:-1]):
        observation, *_ = env.step(bash(command))
        assert observation["messages"] == pivots[f"terminal/awk-average/t{turn + 1}"].messages
    env.close()


def test_max_turns_truncates_the_episode_and_still_runs_the_check(has_bwrap):
    env = TerminalEpisodeEnv(sandbox="bwrap", max_turns=2)
    # the second of the expert's three commands already solves the task
    steps = play(env, "symlink-current-release", [bash(c) for c in TASKS["symlink-current-release"].expert])
    assert len(steps) == 2
    _, reward, terminated, truncated, info = steps[-1]
    assert (reward, terminated, truncated, info["category"], info["turns"]) == (
        1.0,
        False,
        True,
        "max_turns",
        2,
    )
    with pytest.raises(ResetNeeded):
        env.step(bash("ls"))
    env.close()


def test_a_fork_bomb_is_contained_in_its_episode(has_bwrap):
    # The bomb outlives its command (background jobs stay, as a server would) until the episode ends. There
    # the processes are stopped before the check; a bomb that forks faster than it is killed, or leaves no
    # process to start the stop with (bash retries a failed fork for about 15 s), ends the episode at 0 as
    # processes_not_stopped, bounded by the stop's own limit. Each step is bounded by its limit.
    task = dataclasses.replace(TASKS["count-error-lines"], check_timeout=5.0)
    env = TerminalEpisodeEnv(tasks=[task], sandbox="bwrap", limits={"timeout": 3.0})
    env.reset(options={"task": task.id})
    steps, took = [], []
    # The end runs the stop, then the check: each bounded by its own limit.
    for action, limit in ((bash(":(){ :|:& };:"), 3.0), ("Done.", STOP_TIMEOUT + task.check_timeout)):
        began = time.perf_counter()
        steps.append(env.step(action))
        took.append(time.perf_counter() - began)
        assert took[-1] < limit + 10, (action, took)  # the limit, and the kill and teardown after it
    assert [(reward, info["valid"]) for _, reward, _, _, info in steps] == [(0.0, True)] * 2
    # the next episode starts from the task's start state, with nothing of the bomb left
    steps = play(env, "count-error-lines", [bash(c) for c in TASKS["count-error-lines"].expert] + ["Done."])
    assert steps[-1][1] == 1.0 and steps[0][4]["output"]["output"] == "app.log\n"
    env.close()


def test_a_megabyte_of_output_is_cut_and_the_episode_goes_on(has_bwrap):
    env = TerminalEpisodeEnv(sandbox="bwrap")
    env.reset(options={"task": "count-error-lines"})
    observation, _, _, _, info = env.step(bash("head -c 1000000 /dev/zero | tr '\\0' a"))
    assert info["output"]["truncated"] > 900_000 and len(str(observation["messages"])) < 40_000
    _, _, _, _, info = env.step(bash("pwd"))
    assert info["output"]["output"] == "/app\n"
    env.close()


def test_the_env_passes_gymnasiums_checker(kind):
    env = gym.make(
        "pivot/terminal-episode-v0", sandbox=kind, tasks=[TASKS["awk-average"], TASKS["dedupe-lines"]]
    )
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_gym_make_with_no_arguments_draws_from_every_bundled_task(has_bwrap):
    env = gym.make("pivot/terminal-episode-v0").unwrapped
    assert len(env.tasks) == len(TASKS) and env.sandbox_kind == "bwrap"
    _, info = env.reset(seed=3)
    assert info["task_id"] in TASKS and info["turns"] == 0
    env.close()


def test_editing_an_observation_leaves_the_episodes_chat_alone(has_bwrap):
    env = TerminalEpisodeEnv(sandbox="bwrap")
    observation, _ = env.reset(options={"task": "awk-average"})
    observation["messages"].clear()
    observation, *_ = env.step(bash("cat scores.txt"))
    assert [m["role"] for m in observation["messages"]] == ["system", "user", "assistant", "tool"]
    env.close()


def test_an_unknown_task_is_named_with_the_close_match():
    env = TerminalEpisodeEnv()
    with pytest.raises(UnknownNameError, match="awk-average"):
        env.reset(options={"task": "awk-averag"})
    with pytest.raises(ResetNeeded):
        env.step(bash("ls"))


def test_max_turns_below_one_and_an_empty_task_set_are_refused_as_typed_errors():
    from pivot_envs.config import ConfigError
    from pivot_envs.domains.terminal.tasks import TaskFileError

    with pytest.raises(ConfigError, match="max_turns must be >= 1, got 0"):
        TerminalEpisodeEnv(max_turns=0)
    with pytest.raises(TaskFileError, match="task set is empty"):
        TerminalEpisodeEnv(tasks=[])


def test_the_episodes_check_is_bounded_by_the_tasks_check_timeout_not_the_command_limit(has_bwrap):
    from dataclasses import replace

    # a check that takes 2 s: longer than a command may run here (1 s), within the task's own limit (10 s)
    slow = replace(
        TASKS["env-var-export"],
        id="slow-check",
        check=f"sleep 2 && {TASKS['env-var-export'].check}",
        check_timeout=10.0,
    )
    env = TerminalEpisodeEnv(tasks=[slow], sandbox="bwrap", limits={"timeout": 1.0})
    steps = play(env, "slow-check", [bash(command) for command in slow.expert] + ["Done."])
    assert steps[-1][1] == 1.0 and steps[-1][4]["check"]["exit_code"] == 0, steps[-1][4]
    env.close()


def test_every_bundled_tasks_expert_solves_it_under_the_clean_check(kind):
    env = TerminalEpisodeEnv(sandbox=kind, warm_pool=0)
    unsolved = {}
    for task_id, task in TASKS.items():
        _, reward, _, _, info = play(env, task_id, [bash(command) for command in task.expert] + ["Done."])[-1]
        if reward != 1.0:
            unsolved[task_id] = (info["category"], info.get("check"), info.get("system_writes"))
    env.close()
    assert unsolved == {}


# One command each, then the episode ends; every one passed the check before it ran in a fresh shell.
STUBS = "mkdir -p /tmp/s && printf '#!/bin/sh\\nexit 0\\n' > /tmp/s/cmp && chmod +x /tmp/s/cmp"
SITE = "import os; print(6, flush=True); os._exit(0)"
TAMPERINGS = {
    "stubs first on an exported PATH": f"{STUBS} && export PATH=/tmp/s:$PATH",
    "the saved shell state rewritten": "trap - EXIT; printf 'exit 0\\n' > /.pivot/env.sh",
    "a sitecustomize on an exported PYTHONPATH": (
        f"mkdir -p /tmp/py && echo {SITE!r} > /tmp/py/sitecustomize.py && export PYTHONPATH=/tmp/py"
    ),
}


@pytest.mark.parametrize("tampering", TAMPERINGS)
def test_one_command_that_tampers_with_what_the_check_runs_does_not_pass_it(has_bwrap, tampering):
    # dedupe-lines's check ends in cmp; python-fix-bug's runs `python3 calc.py` and wants 6
    task_id = "python-fix-bug" if "sitecustomize" in tampering else "dedupe-lines"
    env = TerminalEpisodeEnv(sandbox="bwrap", max_turns=1)
    _, reward, _, _, info = play(env, task_id, [bash(TAMPERINGS[tampering])])[-1]
    env.close()
    assert (reward, info["valid"]) == (0.0, True), info
    assert info["check"]["exit_code"] != 0


def test_a_write_outside_the_writable_roots_scores_zero_as_system_tampered(has_docker):
    env = TerminalEpisodeEnv(sandbox="docker", max_turns=2)
    # the expert's answer, and a stub of cmp where every PATH looks first
    steps = play(
        env,
        "dedupe-lines",
        [bash(c) for c in TASKS["dedupe-lines"].expert[1:2]]
        + [bash(f"{STUBS} && cp /tmp/s/cmp /usr/local/bin/cmp")],
    )
    env.close()
    _, reward, _, _, info = steps[-1]
    assert (reward, info["valid"], info["category"]) == (0.0, True, "system_tampered")
    assert info["system_writes"] == ["/usr/local/bin/cmp"] and "check" not in info


def test_processes_an_episode_left_running_are_stopped_before_its_check(kind):
    # processes that would write the answer while the check runs (one starts a session of its own)
    check = TASKS["count-error-lines"].check
    task = dataclasses.replace(TASKS["count-error-lines"], check=f"sleep 5 && {check}")
    env = TerminalEpisodeEnv(tasks=[task], sandbox=kind, max_turns=1)
    late = "(sleep 3; echo 3 > errors.txt) >/dev/null 2>&1 & setsid sh -c 'sleep 3; echo 3 > errors.txt' &"
    _, reward, _, _, info = play(env, task.id, [bash(late)])[-1]
    env.close()
    assert (reward, info["valid"]) == (0.0, True), info
    assert "No such file" in info["check"]["output"]


def test_an_exception_of_the_envs_own_code_ends_the_episode_as_env_error_not_out_of_step(
    has_bwrap, monkeypatch
):
    """`step` never raises on an action (docs/env-contract.md): a RecursionError once came out of a sandbox's
    run, and out of the episode's step with it."""
    env = TerminalEpisodeEnv(sandbox="bwrap")
    env.reset(options={"task": "count-error-lines"})

    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(env.sandbox, "run", broken)
    _, reward, terminated, truncated, info = env.step(bash("ls"))
    assert (reward, terminated, truncated, info["category"], info["valid"]) == (
        0.0,
        True,
        False,
        "env_error",
        False,
    )
    assert "RecursionError" in info["detail"]
    monkeypatch.undo()
    steps = play(env, "count-error-lines", [bash(c) for c in TASKS["count-error-lines"].expert] + ["Done."])
    assert steps[-1][1] == 1.0
    env.close()
