"""pivot/remote-v0 against real `pivotrl serve` servers on 127.0.0.1 hosting pivot/tool-use-v0:
gymnasium's check_env passes through it, it picks and scores what the local env does, a profile
over two servers survives one of them killed mid-run with nothing lost or doubled, and
`pivotrl profile` takes it by --env and --env-kwargs."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("httpx", reason="the serve extra is not installed")

import httpx  # noqa: E402
from chat_completions_stub import ChatCompletionsStub  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402

import pivot_envs  # noqa: E402
from pivot_envs.cli import main  # noqa: E402
from pivot_envs.pivot import Pivot, read_pivots, write_pivots  # noqa: E402
from pivot_envs.policy import Completion, SamplingParams  # noqa: E402
from pivot_envs.profile import ProfileConfig, profile  # noqa: E402
from pivot_envs.serve.config import TOKEN_VARIABLE, ServeConfig  # noqa: E402
from pivot_envs.serve.pool import RemoteRequestError  # noqa: E402
from pivot_envs.serve.server import start_server  # noqa: E402

gym.register_envs(pivot_envs)
ENV_ID = "pivot/tool-use-v0"
K = 4
WRONG = "I am sorry, I cannot help with that."


@pytest.fixture(scope="module")
def servers() -> Iterator[list[str]]:
    """Two servers of pivot/tool-use-v0 in threads of this process; their URLs."""
    running = [start_server(ServeConfig(env=ENV_ID, port=0, max_sessions=8)) for _ in range(2)]
    yield [server.url for server in running]
    for server in running:
        server.stop()


@pytest.fixture(scope="module")
def tool_use_pivots() -> list[Pivot]:
    env = gym.make(ENV_ID)
    pivots = list(env.unwrapped.pivots[:24])
    env.close()
    return pivots


def remote(urls: Sequence[str], **kwargs: Any) -> gym.Env:
    return gym.make("pivot/remote-v0", urls=list(urls), env_id=ENV_ID, **{"retries": 2, **kwargs})


def test_check_env_passes_through_the_remote_env(servers: list[str]) -> None:
    env = remote(servers)
    check_env(env.unwrapped)
    env.close()


def test_a_seed_picks_the_pivot_and_the_verdict_the_local_env_gives(servers: list[str]) -> None:
    local, far = gym.make(ENV_ID), remote(servers)
    for seed in (0, 7, 123):
        local_observation, local_info = local.reset(seed=seed)
        far_observation, far_info = far.reset(seed=seed)
        assert far_observation == local_observation and far_info == local_info
        expert = local.unwrapped.pivot.expert
        for action in (expert, WRONG):
            far_result, local_result = far.step(action), local.step(action)
            assert far_result == local_result
            far.reset(seed=seed)
            local.reset(seed=seed)
    local.close()
    far.close()


def test_the_remote_pivot_is_the_pivot_record_the_local_env_holds_expert_included(servers: list[str]) -> None:
    local, far = gym.make(ENV_ID), remote(servers)
    for seed in (0, 7, 0):  # the second visit of a pivot reads it from the pool, not the server
        local.reset(seed=seed)
        far.reset(seed=seed)
        assert isinstance(far.unwrapped.pivot, Pivot) and far.unwrapped.pivot == local.unwrapped.pivot
        _, reward, _, _, info = far.step(far.unwrapped.pivot.expert)
        assert (reward, info["pivot_id"]) == (1.0, far.unwrapped.pivot.id)
    local.close()
    far.close()


def test_step_group_scores_each_action_from_the_pivot_state(servers: list[str]) -> None:
    env = remote(servers)
    _, info = env.reset(options={"index": 3})
    expert = gym.make(ENV_ID).unwrapped.pivots[3].expert
    group = env.unwrapped.step_group([expert, WRONG, expert])
    _, reward, _, _, step_info = env.step(WRONG)
    env.close()
    assert [result[1] for result in group] == [1.0, 0.0, 1.0]
    assert [result[4]["valid"] for result in group] == [True, True, True]
    assert (reward, step_info["pivot_id"]) == (0.0, info["pivot_id"])


def test_a_vector_env_spreads_its_sessions_over_the_servers(servers: list[str]) -> None:
    envs = gym.make_vec(
        "pivot/remote-v0", num_envs=2, vectorization_mode="sync", urls=servers, env_id=ENV_ID, retries=2
    )
    envs.reset(seed=5)
    held = sorted(env.unwrapped.server for env in envs.envs)
    _, rewards, terminated, _, infos = envs.step([WRONG, WRONG])
    envs.close()
    assert held == sorted(servers)
    assert list(rewards) == [0.0, 0.0] and all(terminated) and all(infos["final_info"]["valid"])


def test_a_server_token_is_sent_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with start_server(ServeConfig(env=ENV_ID, port=0, token="s3cret", max_sessions=2)) as guarded:
        with pytest.raises(RemoteRequestError, match=f"GET {guarded.url}/v1/info: HTTP 401"):
            remote([guarded.url])
        monkeypatch.setenv(TOKEN_VARIABLE, "s3cret")
        env = remote([guarded.url])
        env.reset(options={"index": 0})
        _, _, _, _, info = env.step(WRONG)
        env.close()
    assert info["valid"] is True


# -- profiling through two servers, one killed mid-run -------------------------------------------


def chat_key(messages: list[dict]) -> str:
    return json.dumps(messages, sort_keys=True)


@dataclass
class ExpertOrNot:
    """A deterministic reference policy: sample j of a chat is its pivot's expert turn when j is
    even, a wrong message when odd. `before_call(n)` runs before the n-th generate call."""

    experts: dict[str, dict]
    before_call: Callable[[int], None] | None = None
    name: str = "expert-or-not"
    calls: int = 0

    def generate(self, chats: Sequence[dict], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        self.calls += 1
        if self.before_call is not None:
            self.before_call(self.calls)
        return [
            [
                Completion(text="", message=self.experts[chat_key(chat["messages"])])
                if j % 2 == 0
                else Completion(WRONG)
                for j in range(n)
            ]
            for chat in chats
        ]


def serve_processes(logs: list[Path]) -> list[tuple[subprocess.Popen, str]]:
    """`pivotrl serve --env pivot/tool-use-v0 --port 0` in a process of its own per log file
    (started together), each with the URL it prints once it listens."""
    command = [
        sys.executable,
        "-m",
        "pivot_envs",
        "serve",
        "--env",
        ENV_ID,
        "--port",
        "0",
        "--max-sessions",
        "8",
    ]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log.open("w"), text=True) for log in logs
    ]
    started = []
    deadline = time.monotonic() + 60
    for process, log in zip(processes, logs):
        while time.monotonic() < deadline and process.poll() is None:
            ready, _, _ = select.select([process.stdout], [], [], 0.5)
            line = process.stdout.readline() if ready else ""
            if "listening on " in line:
                started.append((process, line.split("listening on ", 1)[1].split()[0]))
                break
        else:
            for other in processes:
                other.kill()
            raise AssertionError(f"pivotrl serve did not start: {log.read_text()[-2000:]}")
    return started


def profiled_rows(path: Path) -> list[tuple[str, list[float], list[float], list[str], list[bool]]]:
    return [
        (p.id, p.profile.rewards, p.profile.strict_rewards, p.profile.categories, p.profile.valid)
        for p in read_pivots(path)
    ]


def test_a_profile_over_two_servers_survives_one_killed_mid_run(
    tool_use_pivots: list[Pivot], tmp_path: Path
) -> None:
    experts = {chat_key(pivot.messages): pivot.expert for pivot in tool_use_pivots}
    config = ProfileConfig(k=K, batch_pivots=4, env_workers=4, progress=False)
    local_out = tmp_path / "local.jsonl"
    profile(tool_use_pivots, ExpertOrNot(experts), local_out, config)

    started = serve_processes([tmp_path / f"serve{index}.log" for index in range(2)])
    (victim, victim_url), (_, survivor_url) = started
    held_when_killed: list[int] = []

    def kill_the_first_server(call: int) -> None:
        if call == 3:  # two batches are scored or being scored: its sessions are open
            held_when_killed.append(httpx.get(f"{victim_url}/health", timeout=5).json()["sessions"])
            victim.kill()
            victim.wait(timeout=10)

    remote_config = ProfileConfig(
        k=K,
        batch_pivots=4,
        env_workers=4,
        progress=False,
        env="pivot/remote-v0",
        env_kwargs={"urls": [victim_url, survivor_url], "env_id": ENV_ID, "retries": 2, "cooldown": 60},
    )
    remote_out = tmp_path / "remote.jsonl"
    try:
        run = profile(tool_use_pivots, ExpertOrNot(experts, kill_the_first_server), remote_out, remote_config)
    finally:
        for process, _ in started:
            process.kill()
            process.wait(timeout=10)
    assert held_when_killed and held_when_killed[0] > 0, (
        "the killed server held no session: nothing failed over"
    )
    assert (run.profiled, run.samples, run.invalid) == (len(tool_use_pivots), K * len(tool_use_pivots), 0)
    rows = profiled_rows(remote_out)
    assert [row[0] for row in rows] == [pivot.id for pivot in tool_use_pivots]
    assert all(len(row[1]) == K and all(row[4]) for row in rows)
    assert rows == profiled_rows(local_out)
    assert any(1.0 in row[1] for row in rows) and any(0.0 in row[1] for row in rows)


def test_pivotrl_profile_takes_the_remote_env_by_env_and_env_kwargs(
    servers: list[str], tool_use_pivots: list[Pivot], tmp_path: Path
) -> None:
    pivots = tool_use_pivots[:6]
    experts = {chat_key(pivot.messages): pivot.expert for pivot in pivots}
    model = ChatCompletionsStub(
        lambda body, j: (
            experts[chat_key(body["messages"])] if j % 2 == 0 else {"role": "assistant", "content": WRONG}
        )
    )
    candidates, out = tmp_path / "candidates.jsonl", tmp_path / "profiled.jsonl"
    write_pivots(pivots, candidates)
    kwargs = json.dumps({"urls": servers, "env_id": ENV_ID})
    try:
        code = main(
            [
                "profile",
                str(candidates),
                "--policy",
                f"openai:{model.url}#scripted",
                "--out",
                str(out),
                "--k",
                str(K),
                "--env",
                "pivot/remote-v0",
                "--env-kwargs",
                kwargs,
                "--progress",
                "false",
            ]
        )
    finally:
        model.close()
    assert code == 0
    assert [(p.id, p.profile.rewards) for p in read_pivots(out)] == [
        (p.id, [1.0, 0.0, 1.0, 0.0]) for p in pivots
    ]
    assert os.path.getsize(out) > 0
