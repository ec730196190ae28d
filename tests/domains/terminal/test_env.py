"""pivot/terminal-v0: reset restores the prefix state (built once, forked per sample), step scores the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import pivot_envs
from pivot_envs.domains.terminal import TerminalEnv, bundled_pivots, canonical_message
from pivot_envs.errors import UnknownNameError
from pivot_envs.pivot import Pivot
from pivot_envs.sandboxes import SandboxError

gym.register_envs(pivot_envs)
GIT_PIVOT = "terminal/git-init-commit/t4"  # prefix: cd site, git init, git add, git commit


def test_the_env_passes_gymnasiums_checker(kind):
    pivots = [p for p in bundled_pivots() if p.trajectory_id == "terminal/awk-average"]
    env = gym.make("pivot/terminal-v0", pivots=pivots, sandbox=kind).unwrapped
    check_env(env, skip_render_check=True)
    env.close()


def test_the_prefix_state_holds_the_experts_files_and_shell_state(kind):
    env = gym.make("pivot/terminal-v0", sandbox=kind)
    env.reset(options={"pivot": GIT_PIVOT})
    _, reward, terminated, truncated, info = env.step("```bash\npwd; git log --format=%s\n```")
    assert info["output"]["output"] == "/app/site\ninitial\n"
    assert (terminated, truncated, info["valid"]) == (True, False, True)
    env.close()


def test_g_resets_at_one_pivot_cost_one_build_and_g_forks(kind):
    env = gym.make("pivot/terminal-v0", sandbox=kind).unwrapped
    rewards = []
    for _ in range(4):
        env.reset(options={"pivot": "terminal/sed-config-port/t1"})
        rewards.append(env.step("```bash\nsed -i 's/8080/9090/' server.conf\n```")[1])
    assert env.prefixes.builds == 1
    assert rewards == [1.0] * 4
    env.close()


def test_each_sample_sees_the_prefix_state_not_the_previous_samples_changes(kind):
    env = TerminalEnv(sandbox=kind)
    env.reset(options={"pivot": "terminal/sed-config-port/t1"})
    env.step("```bash\nrm server.conf\n```")
    env.reset(options={"pivot": "terminal/sed-config-port/t1"})
    _, _, _, _, info = env.step("```bash\ncat server.conf\n```")
    assert "port = 8080" in info["output"]["output"]
    env.close()


def test_the_expert_action_always_scores_one_under_both_verifiers(has_bwrap):
    for verifier in ("functional", "strict"):
        env = TerminalEnv(sandbox="bwrap", verifier=verifier)
        for pivot_id in ("terminal/count-error-lines/t2", "terminal/env-var-export/t2", GIT_PIVOT):
            env.reset(options={"pivot": pivot_id})
            _, reward, _, _, info = env.step(env.pivot.expert)
            assert reward == 1.0 and info["strict_reward"] == 1.0, (verifier, pivot_id, info)
        env.close()


def test_a_failing_prefix_command_makes_the_pivot_not_replayable_and_steps_invalid(has_bwrap):
    messages = [
        {"role": "user", "content": "task"},
        canonical_message("false"),
        {"role": "tool", "content": "[exit code 1]"},
    ]
    pivot = Pivot(
        "broken/t1", "terminal", messages, canonical_message("ls"), context={"prefix_exit_codes": [0]}
    )
    env = TerminalEnv([pivot], sandbox="bwrap")
    observation, info = env.reset(options={"pivot": "broken/t1"})
    assert observation["messages"] == messages
    _, reward, _, _, info = env.step("```bash\nls\n```")
    assert info["valid"] is False and info["category"] == "infrastructure_error"
    assert "prefix command 0" in info["detail"]
    env.close()


def test_a_pivot_whose_image_is_not_available_is_not_replayable(kind):
    pivot = Pivot(
        "ext/t0",
        "terminal",
        [{"role": "user", "content": "x"}],
        canonical_message("ls"),
        context={"image": "example.org/not-here:1", "workdir": "/app"},
    )
    env = TerminalEnv([pivot], sandbox=kind)
    env.reset()
    _, _, _, _, info = env.step("```bash\nls\n```")
    assert info["valid"] is False and "not-here" in info["detail"]
    env.close()


def test_the_prefix_cache_is_bounded_and_evicts_the_least_recently_used(has_bwrap):
    env = TerminalEnv(sandbox="bwrap", prefix_cache=2)
    for pivot_id in (
        "terminal/awk-average/t0",
        "terminal/awk-average/t1",
        "terminal/awk-average/t0",
        "terminal/awk-average/t2",
        "terminal/awk-average/t0",
    ):
        env.reset(options={"pivot": pivot_id})
    assert len(env.prefixes) == 2
    assert env.prefixes.builds == 3  # t0 stayed cached: it was used more recently than t1
    env.close()


def test_an_unparseable_action_scores_zero_with_its_category_and_stays_valid(has_bwrap):
    env = TerminalEnv(sandbox="bwrap")
    env.reset(options={"index": 0})
    _, reward, _, _, info = env.step("I think we should look at the files.")
    assert (reward, info["category"], info["valid"]) == (0.0, "no_command", True)
    env.close()


def test_bundled_pivots_are_at_least_thirty_tasks_with_canonical_experts():
    pivots = bundled_pivots()
    assert len({p.trajectory_id for p in pivots}) >= 30
    assert all(p.expert["tool_calls"][0]["function"]["name"] == "bash" for p in pivots)
    assert all(json.loads(p.expert["tool_calls"][0]["function"]["arguments"])["command"] for p in pivots)


def test_auto_uses_docker_when_a_daemon_answers(has_docker):
    assert TerminalEnv(sandbox="auto").sandbox_kind == "docker"


def test_without_docker_or_bubblewrap_the_first_reset_says_how_to_install_them(tmp_path):
    # A real run with neither: no daemon at DOCKER_HOST and a PATH without bwrap. Making the env
    # works (and starts nothing); the first reset, where the sandbox is chosen, says what to install.
    code = (
        "import sys, gymnasium as gym, pivot_envs\n"
        "gym.register_envs(pivot_envs)\n"
        "env = gym.make('pivot/terminal-v0')\n"
        "print('made', env.unwrapped.backend, 'docker' in sys.modules)\n"
        "try:\n    env.reset()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    )
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/none.sock", "PATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    ).stdout
    made, error = out.split("\n", 1)
    assert made == "made None False"
    assert error.startswith("SandboxError")
    assert "apt-get install docker.io" in error and "apt-get install bubblewrap" in error


def test_sandbox_docker_without_the_docker_sdk_names_the_extra_to_install():
    # The SDK hidden from this interpreter (a None in sys.modules makes `import docker` fail).
    code = (
        "import sys; sys.modules['docker'] = None\n"
        "from pivot_envs.domains.terminal import TerminalEnv\n"
        "from pivot_envs.sandboxes.docker_backend import DockerBackend\n"
        "env = TerminalEnv(sandbox='docker')\n"
        "for make in (env.reset, DockerBackend):\n"
        "    try:\n        make()\n    except Exception as e:\n        print(type(e).__name__, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    ).stdout.splitlines()
    assert len(out) == 2, out
    for line in out:
        assert line.startswith("MissingExtraError") and "pip install 'pivot-envs[docker]'" in line, line
        assert "daemon" not in line


def test_an_unknown_sandbox_kind_is_refused_when_the_env_is_made():
    with pytest.raises(UnknownNameError, match="did you mean 'bwrap'"):
        TerminalEnv(sandbox="bwarp")


def test_a_missing_base_image_is_an_error_naming_the_command_that_builds_it(has_bwrap, tmp_path, monkeypatch):
    monkeypatch.setenv("PIVOT_ENVS_CACHE", str(tmp_path))  # an empty cache: no root filesystem there
    env = TerminalEnv(sandbox="bwrap", build_image=False)
    with pytest.raises(
        SandboxError,
        match=r"is not built .*run `(sudo env PIVOT_ENVS_CACHE=\S+ )?pivotrl sandbox build-image` once",
    ):
        env.reset()
    env.close()
    assert not (tmp_path / "terminal" / has_bwrap.name).exists()


def test_a_malformed_command_scores_zero_as_malformed(has_bwrap):
    env = TerminalEnv(sandbox="bwrap")
    env.reset(options={"pivot": "terminal/awk-average/t1"})
    _, reward, _, _, info = env.step("```bash\nawk '{ s += $3 } END { print s / NR }' scores.txt > (\n```")
    assert (reward, info["category"], info["valid"]) == (0.0, "malformed_command", True)
    env.close()


def test_a_control_key_runs_in_the_interactive_shell(kind):
    env = TerminalEnv(sandbox=kind)
    env.reset(options={"pivot": "terminal/awk-average/t1"})
    _, reward, _, _, info = env.step('{"keystrokes": "C-c"}')
    assert info["valid"] and info["parsed"]["tool_calls"][0]["function"]["name"] == "bash"
    assert reward == 0.0 and info["category"] == "different_effect"
    env.close()


def test_control_d_ends_the_shell_and_scores_zero_as_the_actions_doing(kind):
    env = TerminalEnv(sandbox=kind)
    env.reset(options={"pivot": "terminal/awk-average/t1"})
    observation, reward, _, _, info = env.step('{"keystrokes": "C-d"}')
    assert (reward, info["valid"], info["category"]) == (0.0, True, "shell_exited")
    assert "[the shell exited]" in observation["messages"][-1]["content"]
    env.reset(options={"pivot": "terminal/awk-average/t1"})  # the next sample has a shell again
    _, reward, _, _, info = env.step(env.pivot.expert)
    assert (reward, info["valid"]) == (1.0, True)
    env.close()


def test_file_names_and_output_that_are_not_utf8_come_back_json_encodable(kind):
    env = TerminalEnv(sandbox=kind)
    env.reset(options={"pivot": "terminal/awk-average/t1"})
    observation, _, _, _, info = env.step("```bash\ntouch $'caf\\xe9.txt'; printf 'x\\xffy\\n'\n```")
    assert info["valid"]
    assert info["output"]["files_changed"] == [{"path": "caf\ufffd.txt", "kind": "added"}]
    assert info["output"]["output"] == "x\ufffdy\n"
    json.dumps([info, observation], ensure_ascii=False).encode()  # a lone surrogate has no UTF-8 form
    env.close()


def test_the_issues_glued_comment_and_near_copy_score_zero_at_their_pivots(has_bwrap):
    env = TerminalEnv(sandbox="bwrap")
    for pivot_id, action in (
        ("terminal/unique-error-messages/t2", "cat unique.txt#;echo 999 fake"),  # R2: not a comment to bash
        (  # R3: similarity 0.95, but top_ip.txt gets two lines
            "terminal/top-ip-addresses/t2",
            "awk '{print $1}' access.log | sort | uniq -c | sort -rn | head -n 2 | awk '{print $2}' > top_ip.txt",
        ),
    ):
        env.reset(options={"pivot": pivot_id})
        _, reward, _, _, info = env.step(canonical_message(action))
        assert (reward, info["category"], info["valid"]) == (0.0, "different_effect", True), info
    env.close()


def test_a_near_identical_command_scores_where_the_experts_own_effect_does_not_repeat(kind):
    # The expert stamps the time into a file: that file differs from run to run, the sorted list does not.
    expert = "date +%s%N > now.txt; sort list.txt > sorted.txt; cat sorted.txt"
    messages = [
        {"role": "user", "content": "stamp and sort"},
        canonical_message("printf 'b\\na\\n' > list.txt"),
        {"role": "tool", "content": "[exit code 0]"},
    ]
    pivot = Pivot("stamp/t1", "terminal", messages, canonical_message(expert), context={"workdir": "/app"})
    env = TerminalEnv([pivot], sandbox=kind)
    env.reset()
    _, reward, _, _, info = env.step(env.pivot.expert)
    assert (reward, info["category"]) == (1.0, "same_command")
    env.reset()
    _, reward, _, _, info = env.step(canonical_message(expert.replace("sort list.txt", "sort < list.txt")))
    assert (reward, info["category"]) == (1.0, "similar_command"), info
    env.reset()  # the same text, but the sorted list reversed: a difference the expert's runs repeat
    _, reward, _, _, info = env.step(canonical_message(expert.replace("sort list.txt", "sort -r list.txt")))
    assert (reward, info["category"]) == (0.0, "different_effect"), info
    env.close()
