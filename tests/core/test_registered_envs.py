"""Every registered env honours the gymnasium contract: check_env, make_vec (sync and async), seeding."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import pivot_envs

BUNDLED = ["pivot/tool-use-v0", "pivot/terminal-v0"]


def needs_parts(env_id: str) -> None:
    """Skip (a failure under CI) when the env's sandbox is missing on this machine."""
    if env_id == "pivot/terminal-v0":
        from pivot_envs.domains.terminal import image
        from pivot_envs.domains.terminal.backends import bwrap_available, docker_available

        if not image.rootfs_ready(image.rootfs_path()):
            pytest.skip("the terminal base root filesystem is not built: run `sudo pivotrl sandbox build-image`")
        if not (bwrap_available() or docker_available()):
            pytest.skip("no sandbox: install bubblewrap or start a Docker daemon")


def test_the_bundled_domains_are_registered() -> None:
    assert set(BUNDLED) <= set(pivot_envs.ENV_IDS)


@pytest.mark.parametrize("env_id", BUNDLED)
def test_every_registered_env_passes_check_env(env_id: str) -> None:
    needs_parts(env_id)
    env = gym.make(env_id)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", BUNDLED)
def test_two_envs_reset_with_the_same_seed_pick_the_same_pivots(env_id: str) -> None:
    needs_parts(env_id)
    first, second = gym.make(env_id), gym.make(env_id)
    try:
        picks = [[env.reset(seed=11)[1]["pivot_id"]] + [env.reset()[1]["pivot_id"] for _ in range(5)] for env in (first, second)]
        assert picks[0] == picks[1] and len(set(picks[0])) > 1
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("env_id", BUNDLED)
def test_every_registered_env_scores_experts_under_make_vec(env_id: str, mode: str) -> None:
    needs_parts(env_id)
    single = gym.make(env_id)
    experts = {pivot.id: pivot.expert for pivot in single.unwrapped.pivots}
    single.close()
    envs = gym.make_vec(env_id, num_envs=2, vectorization_mode=mode)
    try:
        _, infos = envs.reset(seed=5)
        actions = [experts[infos["pivot_id"][0]], "this is not the expert's action"]
        observations, rewards, terminated, truncated, infos = envs.step(actions)
        assert rewards[0] == 1.0 and rewards[1] == 0.0, infos["category"]
        assert list(terminated) == [True, True] and not any(truncated)
        assert all(infos["valid"])
        assert observations[1]["messages"][-1]["role"] in ("assistant", "tool")
    finally:
        envs.close()
