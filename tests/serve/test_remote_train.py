"""The GRPO trainer scores its groups on pivot/remote-v0 named by id, with the servers' URLs as env
keyword arguments (what `pivotrl train` passes): every sampled action is stepped on the server."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the train extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")

import httpx  # noqa: E402
from tiny_model import tiny_policy  # noqa: E402

from pivot_envs.adapters.grpo import GRPOConfig, train  # noqa: E402
from pivot_envs.serve.config import ServeConfig  # noqa: E402
from pivot_envs.serve.server import start_server  # noqa: E402

ENV_ID = "pivot/tool-use-v0"


def steps_served(url: str) -> int:
    """The env steps a server took, from its /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return int(re.search(r"^pivot_serve_step_seconds_count (\d+)$", text, re.M)[1])


def test_grpo_scores_every_sampled_action_on_the_remote_env(tmp_path: Path) -> None:
    env = gym.make(ENV_ID)
    # The trainer prompts with these (a user turn, no tool schemas: a random model's prefill of the whole
    # airline prefix takes most of a minute); the server scores at its own copy of each pivot.
    pivots = [
        replace(pivot, messages=[next(m for m in pivot.messages if m["role"] == "user")], tools=[])
        for pivot in env.unwrapped.pivots[:4]
    ]
    env.close()
    config = GRPOConfig(
        batch_pivots=2, group_size=4, max_new_tokens=6, learning_rate=1e-3, steps=2, checkpoint_every=0,
        eval_every=0, num_envs=2, out=str(tmp_path / "run"), seed=3,
    )  # fmt: skip
    with start_server(ServeConfig(env=ENV_ID, port=0, max_sessions=4)) as server:
        result = train(config, pivots, policy=tiny_policy(), env_id="pivot/remote-v0", urls=[server.url])
        served = steps_served(server.url)
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2]
    assert served == config.steps * config.batch_pivots * config.group_size
