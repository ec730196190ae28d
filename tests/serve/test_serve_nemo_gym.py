"""NeMo-Gym's resource-server protocol on `pivotrl serve`: `/verify` with NeMo-Gym's request
shape (a pivot row of ../shared/data/nemo_gym/ plus the model's Responses API `response`) gets
the row back with `reward` added, and the reward is what the local env gives for that action."""

from __future__ import annotations

import json

import gymnasium as gym
import httpx
import pytest

import pivot_envs
from pivot_envs.serve.config import ServeConfig
from pivot_envs.serve.nemo_gym import response_action
from pivot_envs.serve.server import start_server

gym.register_envs(pivot_envs)
ENV = "pivot/tool-use-v0"


def rows(shared_data, name: str) -> list[dict]:
    path = shared_data / "nemo_gym" / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def response_of(action: dict) -> dict:
    """A Responses API response object (as NeMo-Gym's model servers return it) making `action`,
    a NeMo-Gym expected action (function_call, function_call_batch or message)."""
    calls = action["calls"] if action["type"] == "function_call_batch" else [action]
    if action["type"] == "message":
        output = [
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": action["content"], "annotations": []}],
            }
        ]
    else:
        output = [
            {
                "id": f"fc_{i}",
                "type": "function_call",
                "call_id": f"call_{i}",
                "name": call["name"],
                "arguments": call["arguments"],
                "status": "completed",
            }
            for i, call in enumerate(calls)
        ]
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": "policy",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def chat_action(action: dict) -> dict:
    """The same action as a chat-form assistant message (what a local env is stepped with)."""
    if action["type"] == "message":
        return {"role": "assistant", "content": action["content"]}
    calls = action["calls"] if action["type"] == "function_call_batch" else [action]
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for i, c in enumerate(calls)
        ],
    }


WRONG = {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Atlantis"}'}


@pytest.fixture(scope="module")
def pivots_file(shared_data):
    return shared_data / "nemo_gym" / "single_step_tool_use_pivots.jsonl"


@pytest.fixture(scope="module")
def client(pivots_file):
    with start_server(ServeConfig(env=ENV, port=0, max_sessions=2, pivots=str(pivots_file))) as running:
        with httpx.Client(base_url=running.url, timeout=60) as made:
            yield made


def local_reward(pivots, index: int, action: dict) -> tuple[float, str]:
    env = gym.make(ENV, pivots=str(pivots)).unwrapped
    env.reset(options={"index": index})
    _, reward, _, _, info = env.step(action)
    env.close()
    return reward, info["category"]


def test_verify_rewards_each_row_as_the_local_env_scores_the_same_action(client, shared_data, pivots_file):
    seen = set()
    for index, row in enumerate(rows(shared_data, "single_step_tool_use_pivots")):
        for action in (row["expected_action"], WRONG):
            answer = client.post("/verify", json={**row, "response": response_of(action)})
            assert answer.status_code == 200, answer.text
            reward, category = local_reward(pivots_file, index, chat_action(action))
            verdict = answer.json()["verdict"]
            assert (answer.json()["reward"], verdict["category"]) == (reward, category)
            # the row was found among the server's pivots by its content (NeMo-Gym rows carry no id)
            assert verdict["pivot_id"] == f"single_step_tool_use_pivots/{index + 1}"
            seen.add(reward)
    assert seen == {0.0, 1.0}


def test_verify_answers_with_the_request_itself_and_reward_added(client, shared_data):
    row = rows(shared_data, "single_step_tool_use_pivots")[0]
    request = {
        **row,
        "uuid": None,
        "response": response_of(row["expected_action"]),
        "agent_ref": {"name": "x"},
    }
    answer = client.post("/verify", json=request).json()
    assert {key: answer[key] for key in request} == request
    assert set(answer) - set(request) == {"reward", "verdict"} and answer["reward"] == 1.0
    assert set(answer["verdict"]) == {"category", "valid", "strict_reward", "detail", "pivot_id"}


def test_a_row_the_server_does_not_hold_is_scored_as_a_pivot_built_from_the_request(shared_data):
    # The server holds the bundled airline pivots; the parallel-call rows come whole in each request.
    path = shared_data / "nemo_gym" / "single_step_tool_use_parallel_pivots.jsonl"
    with start_server(ServeConfig(env=ENV, port=0, max_sessions=1)) as running:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            for index, row in enumerate(rows(shared_data, "single_step_tool_use_parallel_pivots")):
                for action in (row["expected_action"], WRONG):
                    answer = client.post("/verify", json={**row, "response": response_of(action)})
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["verdict"]["pivot_id"] == "request"
                    assert answer.json()["reward"] == local_reward(path, index, chat_action(action))[0]
            # With one env allowed, the idle pooled env made room for each request's own, which was closed after.
            assert client.get("/health").json()["envs_alive"] == 0


def test_seed_session_and_the_rollout_prefixed_paths_answer_as_nemo_gym_expects(client, shared_data):
    row = rows(shared_data, "single_step_tool_use_pivots")[4]
    assert client.post("/seed_session", json=row).json() == {}
    assert client.post("/ng-rollout/r-1/seed_session", json=row).json() == {}
    answer = client.post(
        "/ng-rollout/r-1/verify", json={**row, "response": response_of(row["expected_action"])}
    )
    assert answer.json()["reward"] == 1.0


@pytest.mark.parametrize(
    ("change", "status", "named"),
    [
        ({"response": None}, 422, "response: must be a Responses API object"),
        ({"response": {"output": "text"}}, 422, "response.output: must be a list"),
        ({"response": {"output": [{"type": "web_search_call"}]}}, 422, "response.output: item 0"),
        ({"responses_create_params": None}, 422, "responses_create_params: required"),
        ({"expected_action": {"type": "dance"}}, 422, "expected_action type 'dance'"),
    ],
)
def test_a_malformed_verify_request_is_refused_naming_the_field(client, shared_data, change, status, named):
    row = rows(shared_data, "single_step_tool_use_pivots")[0]
    answer = client.post("/verify", json={**row, "response": response_of(row["expected_action"]), **change})
    assert answer.status_code == status and named in answer.json()["detail"], answer.text


def test_a_request_without_a_response_or_a_known_pivot_is_refused(client):
    assert (
        "response: required" in client.post("/verify", json={"responses_create_params": {}}).json()["detail"]
    )
    answer = client.post(
        "/verify", json={"responses_create_params": {"input": []}, "response": {"output": []}}
    )
    assert answer.status_code == 422 and "expected_action" in answer.json()["detail"]
    assert client.post("/verify", content=b"{not json").status_code == 400


def test_a_response_with_text_and_several_calls_is_one_assistant_turn():
    response = {
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "b", "arguments": '{"x": 1}'},
        ]
    }
    action = response_action(response)
    assert action["role"] == "assistant" and action["content"] == "Checking."
    assert [(c["id"], c["function"]["name"]) for c in action["tool_calls"]] == [("c1", "a"), ("c2", "b")]
    assert response_action({"output": []}) == {"role": "assistant", "content": ""}
