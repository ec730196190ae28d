"""pivot/tool-use-v0 as a gymnasium env: the contract, the bundled sample, pivot files, HTTP tools."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from pivot_envs.domains.tool_use import DOMAIN, ToolUseEnv
from pivot_envs.domains.tool_use.backends import UNAVAILABLE, HttpBackend
from tool_use_helpers import hermes, step

import pivot_envs  # noqa: F401


def test_the_env_passes_gymnasiums_checker():
    check_env(gym.make("pivot/tool-use-v0").unwrapped, skip_render_check=True)


def test_the_domain_spec_names_the_env_and_its_verifiers():
    assert DOMAIN.name == "tool-use" and DOMAIN.env_class is ToolUseEnv
    assert set(DOMAIN.verifiers) == set(ToolUseEnv.verifiers) == {"functional", "strict"}


def test_the_bundled_sample_is_tau_bench_airline_with_recorded_outputs(pivots):
    assert len(pivots) > 300
    assert all(p.context["backend"] == "tau-airline" and p.domain == "tool-use" for p in pivots)
    assert all(p.source["reward"] == 1.0 for p in pivots)
    calls = [p for p in pivots if p.expert.get("tool_calls")]
    assert calls and all(len(p.context["expert_tool_outputs"]) == len(p.expert["tool_calls"]) for p in calls)
    assert {t["function"]["name"] for t in pivots[0].tools} >= {"book_reservation", "think"}


@pytest.mark.parametrize("verifier", ["functional", "strict"])
def test_the_expert_action_scores_one_on_every_bundled_pivot(pivots, verifier):
    env = gym.make("pivot/tool-use-v0", verifier=verifier)
    for index in range(len(pivots)):
        env.reset(options={"index": index})
        _, reward, terminated, _, info = env.step(pivots[index].expert)
        assert (reward, terminated, info["valid"]) == (1.0, True, True), (pivots[index].id, info)


def test_raw_completion_text_and_server_message_dicts_both_work(recorded_env, call_pivots):
    pivot = call_pivots[0]
    function = pivot.expert["tool_calls"][0]["function"]
    text = f"<think>let me see</think>{hermes(function['name'], json.loads(function['arguments']))}"
    served = {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function", "function": dict(function)}]}
    for action in (text, served):
        reward, info, observation = step(recorded_env, pivot, action)
        assert reward == 1.0 and info["output"] == pivot.context["expert_tool_outputs"][0]
        assert observation["messages"][: len(pivot.messages)] == pivot.messages
        assert observation["messages"][-1]["role"] == "tool"


def test_unparseable_output_scores_zero_and_does_not_raise(recorded_env, pivots):
    reward, info, observation = step(recorded_env, pivots[0], '<tool_call>{"name": </tool_call>')
    assert (reward, info["category"], info["valid"], info["parsed"]) == (0.0, "unparseable", True, None)
    assert observation["messages"][-1] == {"role": "assistant", "content": '<tool_call>{"name": </tool_call>'}


def test_the_recorded_backend_reports_unavailable_for_a_call_it_has_no_recording_of(recorded_env, call_pivots):
    reward, info, observation = step(recorded_env, call_pivots[0], hermes("list_all_airports", {}))
    assert (reward, info["valid"], info["output"]) == (0.0, True, UNAVAILABLE)


def test_nemo_gym_pivot_rows_load_and_run_on_the_recorded_backend(shared_data):
    path = shared_data / "nemo_gym" / "single_step_tool_use_pivots.jsonl"
    env = gym.make("pivot/tool-use-v0", pivots=str(path)).unwrapped
    assert len(env.pivots) == 5
    for index, pivot in enumerate(env.pivots):
        env.reset(options={"index": index})
        _, reward, _, _, info = env.step(pivot.expert)
        assert reward == 1.0 and info["valid"]
        if pivot.expert.get("tool_calls"):
            assert info["output"] == UNAVAILABLE


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown tool backend 'sql'"):
        gym.make("pivot/tool-use-v0", backend="sql")


class _ToolServer(BaseHTTPRequestHandler):
    calls: list = []
    fail_next = 0

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append(body)
        if type(self).fail_next:
            type(self).fail_next -= 1
            self.send_response(503)
            self.end_headers()
            return
        if body["name"] == "nope":
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b"no such tool")
            return
        reply = json.dumps({"output": {"echo": body["arguments"], "pivot": body["pivot_id"]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture
def tool_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ToolServer)
    _ToolServer.calls, _ToolServer.fail_next = [], 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/call"
    server.shutdown()
    server.server_close()


def test_the_http_backend_posts_each_call_and_returns_the_servers_output(tool_server, call_pivots):
    env = gym.make("pivot/tool-use-v0", backend="http", backend_config={"url": tool_server}).unwrapped
    pivot = call_pivots[0]
    reward, info, observation = step(env, pivot, pivot.expert)
    arguments = json.loads(pivot.expert["tool_calls"][0]["function"]["arguments"])
    assert reward == 1.0 and json.loads(info["output"]) == {"echo": arguments, "pivot": pivot.id}
    assert _ToolServer.calls[-1]["name"] == pivot.expert["tool_calls"][0]["function"]["name"]
    assert observation["messages"][-1]["content"] == info["output"]
    # A refusal (4xx) is the tool's answer, not an infrastructure failure.
    _, info, _ = step(env, pivot, hermes("nope", {}))
    assert info["valid"] and info["output"].startswith("Error: HTTP 404")


def test_the_http_backend_retries_5xx_then_marks_the_sample_invalid(tool_server, call_pivots):
    env = gym.make(
        "pivot/tool-use-v0", backend="http", backend_config={"url": tool_server, "retries": 2, "backoff_s": 0.01}
    ).unwrapped
    _ToolServer.fail_next = 2
    reward, info, _ = step(env, call_pivots[0], call_pivots[0].expert)
    assert reward == 1.0 and info["valid"] and len(_ToolServer.calls) == 3
    _ToolServer.fail_next = 10
    reward, info, _ = step(env, call_pivots[0], call_pivots[0].expert)
    assert (info["valid"], info["category"]) == (False, "infrastructure_error")
    assert tool_server in info["detail"] and "503" in info["detail"]


def test_an_unreachable_tool_server_is_an_infrastructure_error_naming_the_url(call_pivots):
    url = "http://127.0.0.1:9/call"  # the discard port: nothing listens there
    env = gym.make("pivot/tool-use-v0", backend="http", backend_config={"url": url, "retries": 0, "timeout_s": 2}).unwrapped
    reward, info, _ = step(env, call_pivots[0], call_pivots[0].expert)
    assert (reward, info["valid"], info["category"]) == (0.0, False, "infrastructure_error")
    assert url in info["detail"]


def test_the_http_backend_needs_a_url():
    with pytest.raises(ValueError, match="needs a url"):
        HttpBackend()


def test_the_env_works_under_make_vec(pivots):
    envs = gym.make_vec("pivot/tool-use-v0", num_envs=2, vectorization_mode="sync")
    _, infos = envs.reset(options={"index": 0})
    assert list(infos["pivot_id"]) == [pivots[0].id] * 2
    _, rewards, terminated, _, infos = envs.step((pivots[0].expert, "I like turtles."))
    assert list(rewards) == [1.0, 0.0] and all(terminated)
    assert list(infos["category"]) == ["correct", "message_content_different"]
    envs.close()


def test_the_verifier_and_http_options_become_cli_flags():
    import argparse

    from pivot_envs.domains.tool_use.backends import HttpBackendConfig
    from pivot_envs.domains.tool_use.verifier import FunctionalConfig

    from pivot_envs.config import add_options, from_args

    parser = argparse.ArgumentParser()
    add_options(parser, FunctionalConfig)
    add_options(parser, HttpBackendConfig)
    args = parser.parse_args(["--mode", "f1", "--text-threshold", "0.7", "--unordered-arrays", "flights", "--url", "http://h/x"])
    config = from_args(FunctionalConfig, args)
    assert (config.mode, config.text_threshold, config.unordered_arrays) == ("f1", 0.7, ("flights",))
    assert from_args(HttpBackendConfig, args).url == "http://h/x"


class _WeatherBackend:
    """A user's own backend: any object with name, prepare, run and equivalence."""

    name = "weather"

    def prepare(self, pivot):
        return None

    def run(self, pivot, calls):
        return [json.dumps({"city": arguments.get("city"), "celsius": 21}) for _, arguments in calls]

    def equivalence(self, pivot):
        # Two calls are equivalent when they ask about the same city, whatever its spelling.
        return lambda index, name, arguments: str(arguments.get("city", "")).strip().lower() == "paris"


def test_a_backend_object_executes_calls_and_can_decide_equivalence(shared_data):
    path = shared_data / "nemo_gym" / "single_step_tool_use_parallel_pivots.jsonl"
    env = gym.make("pivot/tool-use-v0", pivots=str(path), backend=_WeatherBackend()).unwrapped
    pivot = next(p for p in env.pivots if len(p.expert.get("tool_calls") or []) == 1)
    reward, info, observation = step(env, pivot, hermes("get_weather", {"city": "PARIS "}))
    assert reward == 1.0 and "execution equivalence" in info["detail"]
    assert json.loads(observation["messages"][-1]["content"]) == {"city": "PARIS ", "celsius": 21}
