"""Every registered env honours the gymnasium contract and the pivot contract (check_pivot_env, which
runs check_env), make_vec (sync and async), seeding, a spec that round-trips through JSON."""

from __future__ import annotations

import socket

import gymnasium as gym
import pytest
from gymnasium.envs.registration import EnvSpec
from python_process import run_python

import pivot_envs
from pivot_envs import PivotEnv, check_pivot_env

BUNDLED = ["pivot/tool-use-v0", "pivot/terminal-v0", "pivot/search-v0"]


def needs_parts(env_id: str) -> None:
    """Skip (a failure under CI) when the env's sandbox is missing on this machine."""
    if env_id == "pivot/terminal-v0":
        from pivot_envs.domains.terminal import image
        from pivot_envs.sandboxes.available import bwrap_available, docker_available

        if not image.rootfs_ready(image.rootfs_path()):
            pytest.skip(
                "the terminal base root filesystem is not built: run `sudo pivotrl sandbox build-image`"
            )
        if not (bwrap_available() or docker_available()):
            pytest.skip("no sandbox: install bubblewrap or start a Docker daemon")


def test_the_bundled_domains_are_registered() -> None:
    assert set(BUNDLED) <= set(pivot_envs.ENV_IDS)


def break_tool_use(env: PivotEnv) -> bool | None:
    """Point the tool backend at a port nothing listens on (the connection is refused); a message
    turn calls no tool, so there is nothing to break."""
    from pivot_envs.domains.tool_use.backends import HttpBackend

    if not env.pivot.expert.get("tool_calls"):
        return False
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env.backend = HttpBackend(url=f"http://127.0.0.1:{port}/tools", retries=0)
    return None


def break_terminal(env: PivotEnv) -> None:
    env.sandbox.close()  # the fork the step would run in is gone


def break_search(env: PivotEnv) -> bool | None:
    """Point the search engine at a port nothing listens on; an answer runs no call, so there is nothing to break."""
    from pivot_envs.domains.search.http_engine import HttpEngine

    if not env.pivot.expert.get("tool_calls"):
        return False
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env.engine = HttpEngine(f"http://127.0.0.1:{port}/search", retries=0, timeout_s=2)
    return None


BREAKERS = {
    "pivot/tool-use-v0": break_tool_use,
    "pivot/terminal-v0": break_terminal,
    "pivot/search-v0": break_search,
}


def quick_kwargs(env_id: str) -> dict:
    """The terminal env on bubblewrap where it works (a third of Docker's time here)."""
    if env_id == "pivot/terminal-v0":
        from pivot_envs.sandboxes.available import bwrap_available

        return {"sandbox": "bwrap"} if bwrap_available() else {}
    return {}


@pytest.mark.parametrize("env_id", BUNDLED)
def test_every_registered_env_passes_check_pivot_env(env_id: str) -> None:
    needs_parts(env_id)
    env = gym.make(env_id, **quick_kwargs(env_id))
    try:
        report = check_pivot_env(env, pivots=3, break_infrastructure=BREAKERS[env_id])
    finally:
        env.close()
    assert "gymnasium_check_env" in report.passed and "infrastructure_failure_invalid" in report.passed, (
        report
    )


@pytest.mark.parametrize("env_id", BUNDLED)
def test_two_envs_reset_with_the_same_seed_pick_the_same_pivots(env_id: str) -> None:
    needs_parts(env_id)
    first, second = gym.make(env_id), gym.make(env_id)
    try:
        picks = [
            [env.reset(seed=11)[1]["pivot_id"]] + [env.reset()[1]["pivot_id"] for _ in range(5)]
            for env in (first, second)
        ]
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
        scored = infos["final_info"]  # same-step autoreset: the step's info; infos itself is the next reset's
        assert rewards[0] == 1.0 and rewards[1] == 0.0, scored["category"]
        assert list(terminated) == [True, True] and not any(truncated)
        assert all(scored["valid"]) and all(infos["_final_info"])
        assert infos["final_obs"][1]["messages"][-1]["role"] in ("assistant", "tool")
        assert [o["messages"] for o in observations] == [
            single.unwrapped.pivots[i].messages for i in infos["index"]
        ]  # the returned observations are the next pivots' prefixes, ready for the next actions
    finally:
        envs.close()


def spec_kwargs(env_id: str) -> dict:
    """Keyword arguments that change the env, so a rebuilt env that dropped them would differ."""
    return (
        {"verifier": "strict", "sandbox": "bwrap"}
        if env_id == "pivot/terminal-v0"
        else {"verifier": "strict"}
    )


@pytest.mark.parametrize("env_id", BUNDLED)
def test_every_registered_env_spec_round_trips_through_json(env_id: str) -> None:
    needs_parts(env_id)
    env = gym.make(env_id, **spec_kwargs(env_id))
    text = env.spec.to_json()
    rebuilt = gym.make(EnvSpec.from_json(text))
    try:
        assert rebuilt.spec.to_json() == text
        assert type(rebuilt.unwrapped) is type(env.unwrapped)
        assert rebuilt.unwrapped.verifier.name == "strict" != gym.make(env_id).unwrapped.verifier.name
        pivot = env.unwrapped.pivots[0]
        for built in (env, rebuilt):
            built.reset(options={"pivot": pivot.id})
            assert built.step(pivot.expert)[4]["category"] == "exact_match"
    finally:
        env.close()
        rebuilt.close()


def test_a_spec_from_json_builds_the_env_in_a_fresh_process_importing_the_domain_lazily(tmp_path) -> None:
    text = gym.make("pivot/tool-use-v0", verifier="strict").spec.to_json()
    code = f"""
        import sys
        import gymnasium as gym
        from gymnasium.envs.registration import EnvSpec
        import pivot_envs
        print("IMPORTED", "pivot_envs.domains.tool_use" in sys.modules)
        env = gym.make(EnvSpec.from_json({text!r}))
        print("BUILT", type(env.unwrapped).__name__, env.unwrapped.verifier.name, "pivot_envs.domains.tool_use" in sys.modules)
        """
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "IMPORTED False" in result.stdout and "BUILT ToolUseEnv strict True" in result.stdout
