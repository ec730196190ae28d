"""Terminal pivots that cannot run here (NVIDIA's Terminal-Pivot-v1 rows: no task image ships) are
scored without a sandbox, and those whose prefix replays in our base image are executed."""

from __future__ import annotations

import json
from functools import partial

import gymnasium as gym
import pytest

import pivot_envs
from pivot_envs.domains.terminal.env import bundled_pivots
from pivot_envs.domains.terminal.pivot_v1 import mark_replayable, replay_terminal_prefix
from pivot_envs.formats.nemotron_pivot_v1 import extract_pivot_v1, pivot_v1_row_to_pivot
from pivot_envs.pivot import read_pivots
from pivot_envs.sandboxes import SandboxLimits
from pivot_envs.sandboxes.bwrap_backend import BwrapBackend

gym.register_envs(pivot_envs)


def terminus(*keystrokes: str) -> str:
    return json.dumps(
        {
            "analysis": "Work on the task.",
            "plan": "Run the next commands.",
            "commands": [{"keystrokes": keys, "duration": 0.1} for keys in keystrokes],
        }
    )


def terminal_row(trajectory: str, prefix: list[str], expert: str) -> dict:
    """A Terminal-Pivot-v1 row: each prefix command an earlier Terminus-2 turn, with its screen."""
    turns: list[dict] = [{"role": "user", "content": "Solve the task. Current terminal: root@modal:/app#"}]
    for command in prefix:
        turns += [{"role": "assistant", "content": terminus(command + "\n")}, {"role": "user", "content": ""}]
    return {
        "responses_create_params": {"input": turns},
        "expected_answer": terminus(expert + "\n"),
        "metadata": {"source_trajectory_uid": trajectory, "task_name": "t", "harness": "terminus_2"},
        "agent_ref": {"type": "responses_api_agents", "name": "terminus_judge_string_only_simple_agent"},
    }


REPLAYS = terminal_row("ok", ["mkdir -p data", "printf 'a\\nb\\n' > data/x.txt"], "wc -l data/x.txt")
MISSING = terminal_row("missing", ["mkdir -p data", "frobnicate --all data"], "ls data")
HANGS = terminal_row("hangs", ["sleep 60"], "ls")


def test_an_unexecuted_row_is_scored_by_its_command_without_a_sandbox():
    env = gym.make("pivot/terminal-v0", pivots=[pivot_v1_row_to_pivot(REPLAYS)], build_image=False)
    try:
        env.reset(seed=0)
        *_, info = env.step(env.unwrapped.pivot.expert)
        assert (info["executed"], info["valid"], info["category"]) == (False, True, "same_command")
        assert "no task image" in info["output"]["reason"] and "scored without running" in info["detail"]
        env.reset(seed=0)
        _, reward, *_, info = env.step("```bash\nwc  -l   'data/x.txt'\n```")  # bash reads it as the expert's
        assert reward == 1.0 and info["executed"] is False
        env.reset(seed=0)
        _, reward, *_, info = env.step("```bash\ncat data/x.txt | wc -l\n```")
        assert (reward, info["category"], info["executed"]) == (0.0, "different_command", False)
        env.reset(seed=0)
        _, reward, *_, info = env.step("```bash\nif then fi\n```")
        assert (reward, info["category"]) == (0.0, "malformed_command")
        assert env.unwrapped.backend is None  # nothing was built or replayed
    finally:
        env.close()


def test_an_executed_terminal_step_says_so(has_bwrap):
    pivot = bundled_pivots()[0]
    env = gym.make("pivot/terminal-v0", pivots=[pivot], sandbox="bwrap", build_image=False)
    try:
        env.reset(seed=0)
        *_, info = env.step(env.unwrapped.pivot.expert)
        assert info["executed"] is True and info["output"]["executed"] is True and info["valid"] is True
    finally:
        env.close()


@pytest.fixture
def bwrap(has_bwrap):
    made = BwrapBackend(has_bwrap, SandboxLimits(timeout=3.0), warm_pool=0)
    yield made
    made.close()


def test_rows_whose_prefix_replays_in_the_base_image_become_executable_and_the_rest_say_why(bwrap):
    rows = [pivot_v1_row_to_pivot(row) for row in (REPLAYS, MISSING, HANGS)]
    marked = list(mark_replayable(rows, bwrap, row_timeout=2.0, progress=False))
    assert [p.context["executable"] for p in marked] == [True, False, False]
    assert marked[0].context["replayed"] == "base image" and "not_executable_reason" not in marked[0].context
    assert "prefix command 1 'frobnicate --all data' exited 127" in marked[1].context["not_executable_reason"]
    assert "no task image" in marked[1].context["not_executable_reason"]  # the first reason is kept
    assert "timed out" in marked[2].context["replay_failed"]

    env = gym.make("pivot/terminal-v0", pivots=[marked[0]], sandbox="bwrap", build_image=False)
    try:
        env.reset(seed=0)
        _, reward, *_, info = env.step("```bash\nwc -l < data/x.txt | sed 's/$/ data\\/x.txt/'\n```")
        assert (reward, info["category"], info["executed"]) == (1.0, "equivalent_effect", True)
        env.reset(seed=0)
        _, reward, *_, info = env.step("```bash\nwc -l data/missing.txt\n```")
        assert (reward, info["executed"]) == (0.0, True) and info["category"] == "different_effect"
    finally:
        env.close()


def test_an_expert_command_the_base_image_has_no_program_for_is_not_replayable(bwrap):
    row = terminal_row("no-program", ["mkdir -p data"], "frobnicate data")
    assert "needs a program the base image lacks" in replay_terminal_prefix(pivot_v1_row_to_pivot(row), bwrap)


def test_extract_with_replay_states_the_share_executed_and_bounds_the_rows_replayed(bwrap, tmp_path):
    source = tmp_path / "terminal.jsonl"
    rows = [REPLAYS, MISSING, terminal_row("ok2", ["echo hi > a.txt"], "cat a.txt"), HANGS]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    replay = partial(mark_replayable, backend=bwrap, max_rows=3, progress=False)
    summary = extract_pivot_v1([source], tmp_path / "out.jsonl", replay=replay)
    assert (summary.replayed, summary.replayed_executable, summary.executable) == (3, 2, 2)
    assert "terminal rows replayed in the base image: 3, executed 2 (66.7%)" in summary.lines()
    assert "executed: 2 of 4 (50.0%)" in summary.lines()[3]
    written = read_pivots(tmp_path / "out.jsonl")
    assert [p.context["executable"] for p in written] == [True, False, True, False]
    assert "replay_failed" not in written[3].context  # past max_replay_rows: not replayed


def test_pivotrl_sandbox_replay_pivot_v1_executes_the_rows_that_replay_and_states_the_share(
    has_bwrap, tmp_path, capsys
):
    from pivot_envs.cli import main

    source = tmp_path / "terminal.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in (REPLAYS, MISSING, HANGS)))
    extracted, out = str(tmp_path / "p.jsonl"), str(tmp_path / "replayed.jsonl")
    assert main(["extract", str(source), "--format", "pivot-v1", "--out", extracted]) == 0
    capsys.readouterr()
    argv = ["sandbox", "replay-pivot-v1", extracted, "--max-rows", "2", "--row-timeout", "2", "--out", out]
    assert main(argv) == 0
    assert "terminal rows replayed in the base image: 2, executed 1 (50.0%)" in capsys.readouterr().out
    assert [p.context["executable"] for p in read_pivots(out)] == [True, False, False]
