"""External trajectories: the NeMo-Gym Terminal-Bench rollouts extract into terminal pivots whose
commands the env understands; their images cannot be had here, so they are not replayable."""

from __future__ import annotations

import json

import pytest

from pivot_envs.domains.terminal import TerminalEnv
from pivot_envs.domains.terminal.parse import parse_command


@pytest.fixture(scope="module")
def rollout_pivots(shared_data):
    from pivot_envs.extract import ExtractConfig, extract_pivots
    from pivot_envs.formats import read_trajectories

    path = shared_data / "nemo_gym" / "terminal_bench_rollouts.jsonl"
    return list(extract_pivots(read_trajectories(path), ExtractConfig(domain="terminal")))


def test_the_rollouts_terminal_calls_parse_into_commands(rollout_pivots):
    terminal = [
        p
        for p in rollout_pivots
        if p.expert.get("tool_calls") and p.expert["tool_calls"][0]["function"]["name"] == "terminal"
    ]
    assert len(terminal) >= 100
    for pivot in terminal:
        arguments = json.loads(pivot.expert["tool_calls"][0]["function"]["arguments"])
        assert parse_command(pivot.expert).command == arguments["command"]


def test_rollout_pivots_are_not_replayable_without_their_image(has_bwrap, rollout_pivots):
    pivots = [p for p in rollout_pivots if p.context.get("docker_image")][:3]
    env = TerminalEnv(pivots, sandbox="bwrap")
    for index in range(len(pivots)):
        env.reset(options={"index": index})
        _, reward, _, _, info = env.step("```bash\nls\n```")
        assert info["valid"] is False and reward == 0.0
        assert pivots[index].context["docker_image"] in info["detail"]
    env.close()


def test_the_env_gives_rollout_experts_the_canonical_bash_form(has_bwrap, rollout_pivots):
    pivot = next(
        p
        for p in rollout_pivots
        if p.expert.get("tool_calls") and p.expert["tool_calls"][0]["function"]["name"] == "terminal"
    )
    env = TerminalEnv([pivot], sandbox="bwrap")
    assert env.pivots[0].expert["tool_calls"][0]["function"]["name"] == "bash"
    env.close()
