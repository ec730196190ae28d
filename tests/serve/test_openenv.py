"""OpenEnv's protocol on the serve app: a real uvicorn on 127.0.0.1 (in a thread) driven by the
installed `openenv` package's own clients (GenericEnvClient over its WebSocket), the real tool-use
env, and the real terminal env in bubblewrap for a group's forks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from sandbox_fixtures import has_bwrap, rootfs

pytest.importorskip(
    "openenv", reason="OpenEnv's protocol needs the openenv extra: pip install 'pivot-envs[openenv]'"
)

from openenv.core import GenericEnvClient  # noqa: E402

from pivot_envs.serve.config import ServeConfig  # noqa: E402
from pivot_envs.serve.openenv import PivotAction, PivotEnvClient  # noqa: E402
from pivot_envs.serve.server import RunningServer, start_server  # noqa: E402

__all__ = ["has_bwrap", "rootfs"]  # the fixtures this module uses

TOOL_PIVOT = "tau-airline/task6/trial0/t1"  # the expert calls get_user_details(aarav_garcia_1177)
WRONG_CALL = '<tool_call>{"name": "get_user_details", "arguments": {"user_id": "nobody_1"}}</tool_call>'
TERMINAL_PIVOT = "terminal/sed-config-port/t1"
SED = "```bash\nsed -i 's/8080/9090/' server.conf\n```"
RM = "```bash\nrm server.conf\n```"


def serving(config: ServeConfig) -> Iterator[RunningServer]:
    """`pivotrl serve --openenv`'s app, listening on 127.0.0.1 in a thread."""
    running = start_server(replace(config, openenv=True))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def tool_server() -> Iterator[RunningServer]:
    yield from serving(ServeConfig(env="pivot/tool-use-v0", port=0, max_sessions=4, queue_timeout=5.0))


def client(server: RunningServer) -> GenericEnvClient:
    return GenericEnvClient(base_url=server.url, message_timeout_s=120).sync()


def test_openenv_client_resets_to_a_named_pivot_and_gets_its_record(tool_server):
    with client(tool_server) as env:
        result = env.reset(pivot=TOOL_PIVOT)
        assert result.done is False and result.reward is None
        observation = result.observation
        assert observation["info"]["pivot_id"] == TOOL_PIVOT
        assert observation["pivot"]["id"] == TOOL_PIVOT
        assert observation["messages"] == observation["pivot"]["messages"]
        assert {tool["function"]["name"] for tool in observation["tools"]} >= {"get_user_details"}


def test_the_expert_scores_one_and_a_wrong_call_zero_each_ending_its_episode(tool_server):
    with client(tool_server) as env:
        expert = env.reset(pivot=TOOL_PIVOT).observation["pivot"]["expert"]
        right = env.step({"action": expert})
        assert (right.reward, right.done, right.observation["info"]["category"]) == (1.0, True, "correct")
        env.reset(pivot=TOOL_PIVOT)
        wrong = env.step({"action": WRONG_CALL})
        assert wrong.reward == 0.0 and wrong.done is True
        assert wrong.observation["info"]["category"] not in ("", "correct")
        assert wrong.observation["info"]["valid"] is True


def test_unparseable_text_scores_zero_with_its_category(tool_server):
    with client(tool_server) as env:
        env.reset(pivot=TOOL_PIVOT)
        result = env.step({"action": "<tool_call>{not json"})
        assert result.reward == 0.0
        assert result.observation["info"]["category"] == "unparseable"


def test_the_typed_client_carries_pivot_actions_and_observations(tool_server):
    with PivotEnvClient(base_url=tool_server.url, message_timeout_s=120).sync() as env:
        reset = env.reset(index=0, episode_id="e-1")
        expert = reset.observation.pivot["expert"]
        stepped = env.step(PivotAction(action=expert))
        assert stepped.reward == 1.0 and stepped.observation.info["category"] == "correct"
        state = env.state()
        assert (state.episode_id, state.pivot_id, state.step_count) == (
            "e-1",
            reset.observation.info["pivot_id"],
            1,
        )


def test_an_unknown_pivot_id_is_a_clear_error_and_the_session_goes_on(tool_server):
    with client(tool_server) as env:
        with pytest.raises(
            RuntimeError, match=r"unknown pivot id 'tau-airline/task6/trial0/t99'.*did you mean"
        ):
            env.reset(pivot="tau-airline/task6/trial0/t99")
        assert env.reset(pivot=TOOL_PIVOT).observation["info"]["pivot_id"] == TOOL_PIVOT


@pytest.mark.parametrize(
    ("reset", "message"),
    [
        ({"pivot_id": TOOL_PIVOT}, r"unknown argument\(s\) \['pivot_id'\]"),
        ({"pivot": TOOL_PIVOT, "index": 0}, "at most one of 'pivot' and 'index'"),
        ({"index": 10_000}, r"index: 10000 is out of range"),
        ({"seed": -1}, "seed -1 must be an integer >= 0"),
    ],
)
def test_a_bad_reset_argument_is_named_in_the_error(tool_server, reset, message):
    with client(tool_server) as env, pytest.raises(RuntimeError, match=message):
        env.reset(**reset)


def test_a_malformed_action_is_refused_and_a_second_step_asks_for_a_reset(tool_server):
    with client(tool_server) as env:
        env.reset(pivot=TOOL_PIVOT)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"action": 42})
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"completion": "ls"})
        assert env.step({"action": WRONG_CALL}).reward == 0.0
        with pytest.raises(RuntimeError, match="episode ended.*reset first"):
            env.step({"action": WRONG_CALL})
    with client(tool_server) as fresh, pytest.raises(RuntimeError, match="reset first"):
        fresh.step({"action": WRONG_CALL})


def test_http_routes_answer_errors_as_json_never_a_500(tool_server):
    with httpx.Client(base_url=tool_server.url, timeout=60) as http:
        reset = http.post("/reset", json={"pivot": TOOL_PIVOT})
        assert reset.status_code == 200 and reset.json()["observation"]["info"]["pivot_id"] == TOOL_PIVOT
        unknown = http.post("/reset", json={"pivot": "nope"})
        assert unknown.status_code == 422 and "unknown pivot id 'nope'" in unknown.json()["detail"]
        step = http.post("/step", json={"action": {"action": WRONG_CALL}})
        assert step.status_code == 409 and "/ws" in step.json()["detail"]
        malformed = http.post("/step", json={"action": {"action": 42}})
        assert malformed.status_code == 422
        schema = http.get("/schema").json()
        assert "action" in schema["action"]["properties"]
        assert http.get("/health").json()["status"] == "ok"  # the serve app's own /health answers


def test_group_members_share_the_pivot_drawn_for_the_first(tool_server):
    with client(tool_server) as first, client(tool_server) as second:
        drawn = first.reset(seed=7, group="g-draw").observation["info"]["pivot_id"]
        assert second.reset(group="g-draw").observation["info"]["pivot_id"] == drawn
        with client(tool_server) as third, pytest.raises(RuntimeError, match="group 'g-draw' is at pivot"):
            third.reset(
                pivot="tau-airline/task1/trial1/t0" if drawn != "tau-airline/task1/trial1/t0" else TOOL_PIVOT,
                group="g-draw",
            )


def test_group_members_step_their_own_forks_of_one_terminal_pivot(has_bwrap):
    config = ServeConfig(
        env="pivot/terminal-v0",
        port=0,
        max_sessions=2,
        env_kwargs={"sandbox": "bwrap", "warm_pool": 0, "limits": {"timeout": 3.0}},
    )
    for running in serving(config):
        members = [client(running) for _ in range(3)]
        try:
            for member in members:
                assert (
                    member.reset(pivot=TERMINAL_PIVOT, group="G").observation["info"]["pivot_id"]
                    == TERMINAL_PIVOT
                )
            # the first deletes the file the expert edits; the others still find it in their forks
            rewards = [
                member.step({"action": action}).reward for member, action in zip(members, (RM, SED, SED))
            ]
            assert rewards == [0.0, 1.0, 1.0]
            assert running.server.config.app.state.serve.pool.alive == 1  # one env served the group
        finally:
            for member in members:
                member.close()


def test_a_closed_session_gives_its_env_back_to_the_pool(tool_server):
    with httpx.Client(base_url=tool_server.url, timeout=30) as http:
        with client(tool_server) as env:
            env.reset(pivot=TOOL_PIVOT)
            assert http.get("/health").json()["sessions"] >= 1
        deadline = time.monotonic() + 10
        while http.get("/health").json()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http.get("/health").json()["sessions"] == 0


def test_with_a_token_a_websocket_must_carry_it():
    config = ServeConfig(env="pivot/tool-use-v0", port=0, max_sessions=1, token="s3cret")
    for running in serving(config):
        for headers in (None, {"Authorization": "Bearer wrong"}):
            refused = GenericEnvClient(base_url=running.url, headers=headers).sync()
            with pytest.raises(ConnectionError):
                refused.reset(pivot=TOOL_PIVOT)
            refused.close()
        allowed = GenericEnvClient(base_url=running.url, headers={"Authorization": "Bearer s3cret"}).sync()
        with allowed:
            assert allowed.reset(pivot=TOOL_PIVOT).observation["info"]["pivot_id"] == TOOL_PIVOT
